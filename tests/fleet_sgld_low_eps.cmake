# sgld's default run at a low epsilon must predict better than the global mean (DEVELOPERS.md: a private model worse
# than the global mean is a defect). A fleet with thousands of raters per item (20,000 devices, 20 items, about 200,000
# ratings, no user effects), epsilon = 0.5: 0.93-0.94 against a global mean of 1.0183 here. With the defaults before
# issue 16's fix (the same command with --mu-prior-sd 0 --bias-prior-sd 0.1 --max-weight 1
# --device-lambda-per-rating 0.1) it gave 1.0814: the release's mu was the scale's midpoint, its item biases were held
# near 0, and each device's ridge of 0.1 per rating made its user bias its own noisy mean (docs/results.md, "sgld").
#   cmake -DBIN=path/to/dprec-fleet -P fleet_sgld_low_eps.cmake
if(NOT BIN)
  message(FATAL_ERROR "usage: -DBIN=... -P fleet_sgld_low_eps.cmake")
endif()
execute_process(COMMAND ${BIN} --synthetic 20000,20,200000,3 --seed 7 --protocol sgld --epsilon 0.5 --in-process
                        --threads 2 --quiet --compare none
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 1200)
message(STATUS "dprec-fleet output:\n${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "dprec-fleet exited with ${rc}")
endif()
if(NOT out MATCHES "final: protocol=sgld rounds=1 test_rmse=([0-9]+\\.[0-9]+) epsilon=0.5 ")
  message(FATAL_ERROR "no final line")
endif()
set(rmse ${CMAKE_MATCH_1})
if(NOT out MATCHES "global mean [0-9.]+ -> test RMSE ([0-9.]+)")
  message(FATAL_ERROR "no global-mean baseline")
endif()
set(global ${CMAKE_MATCH_1})
if(NOT rmse LESS global)
  message(FATAL_ERROR "sgld at epsilon 0.5 (${rmse}) is not below the global mean (${global})")
endif()
message(STATUS "sgld at epsilon 0.5: ${rmse}, global mean ${global}")
