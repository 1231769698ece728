# --bias-base: a protocol that learns no item biases of its own (ldp-gd) run on the private bias model's release. The
# fleet first runs the bias model at the protocol's d (a dpals job with params.factors false) on the same devices at
# half the budget, then ldp-gd from its item biases (base_job) at the other half. Checks the base job's line, the
# composed guarantee (the two jobs' sum, within the budget asked for: the devices' caps are the whole), the final line
# (its epsilon and delta are the sum), and that the biases are what ldp-gd predicts with: on this fleet ldp-gd alone
# is above the global mean, on the private biases below it, and the first release of the ldp-gd job already predicts
# as the base did.
#   cmake -DBIN=path/to/dprec-fleet -P fleet_bias_base.cmake
if(NOT BIN)
  message(FATAL_ERROR "usage: -DBIN=... -P fleet_bias_base.cmake")
endif()
set(args --synthetic 3000,100,60000,3 --protocol ldp-gd --epsilon 4 --in-process --threads 2 --seed 7 --quiet --compare none)
execute_process(COMMAND ${BIN} ${args} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 600)
include(${CMAKE_CURRENT_LIST_DIR}/fleet_contract.cmake)
fleet_run_ok()
fleet_final(ldp-gd 1 4 alone "0")
execute_process(COMMAND ${BIN} ${args} --bias-base 0.5 OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 600)
fleet_run_ok()
if(NOT out MATCHES "base: job ([0-9]+), the private bias model at d = 10 \\(bias\\), 2 rounds, test RMSE ([0-9.]+), epsilon = ([0-9.]+), delta = 5e-07 \\(user level, joint\\)")
  message(FATAL_ERROR "no base job line at d = 10 with half the budget")
endif()
set(base_rmse ${CMAKE_MATCH_2})
if(CMAKE_MATCH_3 GREATER 2)
  message(FATAL_ERROR "the base job spent ${CMAKE_MATCH_3}, more than its half of the budget")
endif()
if(NOT out MATCHES "guarantee with the base job: epsilon = ([0-9.]+), delta = 5e-07 at user level \\(the two jobs' sum")
  message(FATAL_ERROR "no composed guarantee")
endif()
if(CMAKE_MATCH_1 GREATER 4)
  message(FATAL_ERROR "the composed epsilon ${CMAKE_MATCH_1} is above the budget 4")
endif()
fleet_final(ldp-gd 1 4 rmse "5e-07")
fleet_ledgers_within(3000)
fleet_baseline("global mean" global)
if(NOT alone GREATER global)
  message(FATAL_ERROR "ldp-gd alone (${alone}) is below the global mean (${global}) here: the check below lost its teeth")
endif()
if(NOT rmse LESS global)
  message(FATAL_ERROR "ldp-gd on the private biases (${rmse}) does not beat the global mean (${global})")
endif()
# release 1 of the ldp-gd job carries the base's biases: round 0 predicts within 0.01 of the base job's last release
if(NOT out MATCHES "\n +0 +0 +([0-9.]+) ")
  message(FATAL_ERROR "no round 0 line")
endif()
set(r0 ${CMAKE_MATCH_1})
if(r0 GREATER base_rmse)
  set(hi ${r0})
  set(lo ${base_rmse})
else()
  set(hi ${base_rmse})
  set(lo ${r0})
endif()
string(REPLACE "." "" hi_i "${hi}")
string(REPLACE "." "" lo_i "${lo}")
math(EXPR diff "${hi_i} - ${lo_i}")
if(diff GREATER 100)
  message(FATAL_ERROR "round 0 of the ldp-gd job (${r0}) does not predict as the base (${base_rmse}): not its biases")
endif()

# gauss-gd on the private bias model: gauss-gd's own job asks the aggregator's population rule, the base job (a dpals
# job at gauss-gd's d with params.factors false) must not (the rule chooses d; the base's d is the main job's): the
# base job is created and the run composes the two guarantees
execute_process(COMMAND ${BIN} --synthetic 1000,100,20000,3 --protocol gauss-gd --epsilon 4 --delta 1e-6 --in-process
                        --threads 2 --seed 7 --quiet --compare none --bias-base 0.5
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 600)
fleet_run_ok()
if(NOT out MATCHES "base: job [0-9]+, the private bias model at d = 10 \\(bias\\), 2 rounds")
  message(FATAL_ERROR "gauss-gd --bias-base: no base job line")
endif()
if(NOT out MATCHES "guarantee with the base job: epsilon = ([0-9.]+), delta = 1e-06 at user level")
  message(FATAL_ERROR "gauss-gd --bias-base: no composed guarantee")
endif()
