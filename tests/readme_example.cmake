# The README's C example as it is written there (tests/CMakeLists.txt extracts it between its markers and compiles it),
# run against signed releases: the top 5 of a release of the app's m and d, and, for a release of another d (larger
# than the 200,000 bytes the example once read every release into), DPREC_ERR_RELEASE_MISMATCH with both d's in its
# message, not a "truncated" release.
#
#   cmake -DEXAMPLE=<readme_example> -DMKREL=<dprec-mkrelease> -DWORK=<scratch dir> -P tests/readme_example.cmake
cmake_minimum_required(VERSION 3.16)

if(NOT DEFINED EXAMPLE OR NOT EXISTS "${EXAMPLE}" OR NOT DEFINED MKREL OR NOT DEFINED WORK)
  message(FATAL_ERROR "readme_example.cmake: pass -DEXAMPLE=<readme_example> -DMKREL=<dprec-mkrelease> -DWORK=<dir>")
endif()
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

function(must)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "readme_example: ${ARGN} failed (${rc}): ${out}${err}")
  endif()
endfunction()

must("${MKREL}" --new-key "${WORK}/demo.key" "${WORK}/demo.pub")
must("${MKREL}" --random 1682 16 --seed 7 --sign "${WORK}/demo.key" --out "${WORK}/d16.rel")
must("${MKREL}" --random 1682 32 --seed 7 --sign "${WORK}/demo.key" --out "${WORK}/d32.rel")
file(SIZE "${WORK}/d32.rel" big)
if(big LESS_EQUAL 200000)
  message(FATAL_ERROR "readme_example: the d = 32 release has ${big} bytes; the test needs one above 200,000")
endif()

execute_process(COMMAND "${EXAMPLE}" "${WORK}/d16.rel" "${WORK}/demo.pub" RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err)
string(REGEX MATCHALL "item [0-9]+ score [0-9.]+" items "${out}")
list(LENGTH items n)
if(NOT rc EQUAL 0 OR NOT n EQUAL 5)
  message(FATAL_ERROR "readme_example: a release of the app's d: exit ${rc}, ${n} items (want 0 and 5):\n${out}${err}")
endif()

execute_process(COMMAND "${EXAMPLE}" "${WORK}/d32.rel" "${WORK}/demo.pub" RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err)
message(STATUS "a release of d = 32: exit ${rc}: ${err}")
if(NOT rc EQUAL 1 OR NOT err MATCHES "d = 32" OR NOT err MATCHES "d = 16" OR err MATCHES "[Tt]runcated|shorter")
  message(FATAL_ERROR "readme_example: a release of another d must be refused as a mismatch naming both d's; got "
                      "exit ${rc}: ${out}${err}")
endif()
message(STATUS "readme_example: ok")
