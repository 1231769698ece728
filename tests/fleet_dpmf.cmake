# Runs dprec-fleet's dpmf (seed 004) in one mode on a small synthetic fleet and checks its contract: the final line,
# a user-level pure-epsilon guarantee at the budget asked for in the mode's model (central for trusted, distributed
# for the relay modes, with its caveat), and no device's ledger above the aggregator's figure. MODE=relay runs over
# real HTTPS against a `dprec-aggregator serve` and a `dprec-relay serve` the fleet starts itself; the others run
# in-process (with an in-process relay for dynamic).
#   cmake -DBIN=path/to/dprec-fleet -DMODE=trusted|relay|dynamic -P fleet_dpmf.cmake
if(NOT BIN OR NOT MODE)
  message(FATAL_ERROR "usage: -DBIN=... -DMODE=... -P fleet_dpmf.cmake")
endif()
set(where --in-process)
if(MODE STREQUAL "relay")
  set(where "")
endif()
execute_process(COMMAND ${BIN} --synthetic 300,60,6000,3 --protocol dpmf --dpmf-mode ${MODE} --epsilon 6 --rounds 2
                        ${where} --threads 2 --seed 3 --quiet --compare none
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 600)
include(${CMAKE_CURRENT_LIST_DIR}/fleet_contract.cmake)
fleet_run_ok()
fleet_final(dpmf 2 6 rmse "0")
if(MODE STREQUAL "trusted")
  set(model "central DP")
else()
  set(model "distributed DP[^\n]*caveat: holds against the recommender while the relay does not collude")
endif()
if(NOT out MATCHES "guarantee: [^\n]*dpmf[^\n]*user-level ${model}")
  message(FATAL_ERROR "no user-level ${model} guarantee summary")
endif()
fleet_ledgers_within(300)
if(NOT MODE STREQUAL "trusted" AND NOT out MATCHES "relay \\(")
  message(FATAL_ERROR "the fleet did not describe the relay it started")
endif()
