# Bounded poisoning end to end (issue 36; docs/privacy.md "Poisoning"): 1% of a 300-device fleet (3 devices, chosen
# by the seed) send the worst report the protocol's aggregator accepts (every value up to FLT_MAX, aligned), each
# round is replayed with and without them, and every movement the fleet measures must be within the bound the
# protocol states for k = 3:
#   plain:    every item bias of every published release within beta = params.residual_clip (2 (5 - 1) = 8);
#   gauss-gd: the round's clipped sum within k C, the release's [V | b] within lr (k C + the grid's allowance) / q.
# A protocol without a worst report refuses the flag (sgld), and so does --secure-agg.
#   cmake -DBIN=path/to/dprec-fleet -P fleet_poison.cmake
if(NOT BIN)
  message(FATAL_ERROR "usage: -DBIN=... -P fleet_poison.cmake")
endif()
include(${CMAKE_CURRENT_LIST_DIR}/fleet_contract.cmake)

# One run: the checks it must print (each "within"), and the contract line of --malicious.
function(poison_run protocol checks)
  execute_process(COMMAND ${BIN} --protocol ${protocol} --synthetic 300,80,6000 --rank 4 --rounds 2 --in-process
                          --threads 2 --seed 3 --compare none --quiet --malicious 0.01
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 300)
  fleet_run_ok()
  if(NOT out MATCHES "poisoning: 3 of 300 devices \\(--malicious 0.01, chosen by the seed\\) sent ${protocol}'s worst report in job [0-9]+: 6 reports over 2 rounds")
    message(FATAL_ERROR "${protocol}: 3 malicious devices did not report in both rounds")
  endif()
  foreach(what ${checks})
    if(NOT out MATCHES "poisoning: ${what}[^\n]*: largest ([0-9.e+-]+) \\(round [0-9]+\\), bound ([0-9.e+-]+): within\n")
      message(FATAL_ERROR "${protocol}: no check of '${what}' within its bound")
    endif()
  endforeach()
  if(out MATCHES "EXCEEDED")
    message(FATAL_ERROR "${protocol}: a bound was exceeded")
  endif()
  list(LENGTH checks n)
  if(NOT out MATCHES "\npoisoning: malicious=3 checks=${n} within=yes\n")
    message(FATAL_ERROR "${protocol}: no 'poisoning: malicious=3 checks=${n} within=yes' line")
  endif()
  message(STATUS "ok: ${protocol} with 3 malicious devices stayed within its ${n} stated bounds")
endfunction()

poison_run(plain "the largest \\|item bias\\| of a published release")
poison_run(gauss-gd "the round's clipped statistic;the release's change")

foreach(bad "--protocol;sgld" "--protocol;gauss-gd;--secure-agg")
  execute_process(COMMAND ${BIN} ${bad} --synthetic 300,80,6000 --in-process --malicious 0.01
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 60)
  if(NOT rc EQUAL 2 OR NOT err MATCHES "--malicious")
    message(FATAL_ERROR "'${bad} --malicious' was not refused with a message (${rc}): ${err}")
  endif()
endforeach()
message(STATUS "ok: --malicious refused where no bound can be checked")
