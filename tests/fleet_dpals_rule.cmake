# dprec-fleet's dpals with its defaults asks the aggregator's population rule for d, the rounds and the devices' ridge
# (the job spec's population_rule, docs/protocol.md "The population rule"; aggregator/protocols/dpals_rule.c) and runs
# the job the aggregator created. On 1,000 devices of 100 items (at most 45 training ratings each) the rule's signal
# over noise is about 5.9 at epsilon 5 (factors: d = 10, 5 rounds, 0.02 per rating, at least 3) and about 1.2 at
# epsilon 1 (the bias model: d = 1, 2 rounds, the devices' fixed ridge 1; an average item's bias over its noise about 4,
# so the default clip). Checks the rule's line from the job's
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
    if(NOT out MATCHES "${head}factors cannot pay at this population and budget \\(below 4\\): d = 1, the bias model, the devices' fixed ridge 1; an average item's bias over its noise [0-9.]+ at 2 rounds: 1 or more, the default clip\ndevices: [^\n]*\njob [0-9]+: protocol dpals, d = 1, lambda = 1 \\(devices: 1\\), 2 rounds")
      message(FATAL_ERROR "epsilon 1: no rule line choosing the bias model, or a job line that is not its choice:\n${out}")
    endif()
    fleet_final(dpals 2 1 rmse)
  endif()
  fleet_ledgers_within()
endforeach()

# bias (the bias model at d = 1, no population_rule in its spec) takes the rule's clip for the bias model: at epsilon
# 0.1 the same fleet's average item's bias over its noise is about 0.4, below 1, so its targets are clipped at half the
# default (0.5, params.rating_clip); --rating-clip given, the rule is not applied and the line says so.
execute_process(COMMAND ${BIN} --synthetic 1000,100,50000,5 --protocol bias --epsilon 0.1 --delta 1e-6 --in-process
                        --threads 2 --seed 3 --compare none
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 600)
fleet_run_ok()
if(NOT out MATCHES "rule: 1000 devices, 100 items, k = 45, [0-9.]+ ratings a device \\(declared: the data's mean\\), epsilon 0.1, delta 1e-06: an average item's weighted reports [0-9.]+, its bias over its noise 0\\.[0-9]+ at 2 rounds \\(z = [0-9.]+\\): below 1, the targets clipped at half the default\n")
  message(FATAL_ERROR "bias at epsilon 0.1: no rule line halving the bias model's clip:\n${out}")
endif()
if(NOT out MATCHES "residual targets, clipped to 0.5\\)")
  message(FATAL_ERROR "bias at epsilon 0.1: the job's targets are not clipped at 0.5:\n${out}")
endif()
fleet_final(bias 2 0.1 rmse)
fleet_ledgers_within()
execute_process(COMMAND ${BIN} --synthetic 1000,100,50000,5 --protocol bias --epsilon 0.1 --delta 1e-6 --in-process
                        --threads 2 --seed 3 --compare none --rating-clip 1
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 600)
fleet_run_ok()
if(NOT out MATCHES "rule: the bias model's clip not applied: --rating-clip given\n" OR NOT out MATCHES "residual targets, clipped to 1\\)")
  message(FATAL_ERROR "bias with --rating-clip 1: the rule's clip applied over it, or no line saying it was not:\n${out}")
endif()
