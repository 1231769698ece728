# dprec-fleet's dpals with its defaults asks the aggregator's population rule for d, the rounds and the devices' ridge
# (the job spec's population_rule, docs/protocol.md "The population rule"; aggregator/protocols/dpals_rule.c) and runs
# the job the aggregator created. On 1,000 devices of 100 items (at most 45 training ratings each) the rule's signal
# over noise is about 5.9 at epsilon 5 (factors: d = 10, 5 rounds, 0.02 per rating, at least 3) and about 1.2 at
# epsilon 1 (the bias model: d = 1, 2 rounds, the devices' fixed ridge 1). Checks the rule's line from the job's
# answer, the job line that follows it (the devices set up again for d = 10), the contract of the final line and the
# ledgers.
#   cmake -DBIN=path/to/dprec-fleet -P fleet_dpals_rule.cmake
if(NOT BIN)
  message(FATAL_ERROR "usage: -DBIN=... -P fleet_dpals_rule.cmake")
endif()
include(${CMAKE_CURRENT_LIST_DIR}/fleet_contract.cmake)
foreach(eps 5 1)
  execute_process(COMMAND ${BIN} --synthetic 1000,100,50000,5 --protocol dpals --epsilon ${eps} --delta 1e-6 --in-process
                          --threads 2 --seed 3 --compare none
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 600)
  fleet_run_ok()
  set(head "rule: 1000 devices, 100 items, k = 45, [0-9.]+ ratings a device \\(declared: the data's mean\\), epsilon ${eps} \\(user level, joint DP\\), delta 1e-06: [^\n]*")
  if(eps EQUAL 5)
    if(NOT out MATCHES "${head}factors pay \\(4 or more\\): d = 10, 5 rounds \\(epsilon >= 5\\)\ndevices: [^\n]*\njob [0-9]+: protocol dpals, d = 10, [^\n]*devices: 0.02 x ratings, at least 3\\), 5 rounds")
      message(FATAL_ERROR "epsilon 5: no rule line choosing factors, or a job line that is not its choice:\n${out}")
    endif()
    fleet_final(dpals 5 5 rmse)
  else()
    if(NOT out MATCHES "${head}factors cannot pay at this population and budget \\(below 4\\): d = 1, the bias model, the devices' fixed ridge 1\ndevices: [^\n]*\njob [0-9]+: protocol dpals, d = 1, lambda = 1 \\(devices: 1\\), 2 rounds")
      message(FATAL_ERROR "epsilon 1: no rule line choosing the bias model, or a job line that is not its choice:\n${out}")
    endif()
    fleet_final(dpals 2 1 rmse)
  endif()
  fleet_ledgers_within()
endforeach()
