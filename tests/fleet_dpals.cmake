# Runs dprec-fleet's dpals on a small synthetic fleet in-process and checks its contract: the final line, a
# user-level joint-DP guarantee at the budget asked for, no device's ledger above the aggregator's figure, and
# a private model that beats the item mean (and so the global mean) on data large enough for it, and the
# comparison with the private bias model (--compare bias, the default) with its verdict.
#   cmake -DBIN=path/to/dprec-fleet -P fleet_dpals.cmake
if(NOT BIN)
  message(FATAL_ERROR "usage: -DBIN=... -P fleet_dpals.cmake")
endif()
execute_process(COMMAND ${BIN} --synthetic 3000,100,60000,3 --protocol dpals --epsilon 8 --delta 1e-6 --rank 4
                        --rounds 4 --max-items 20 --in-process --threads 2 --seed 7 --quiet
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 600)
include(${CMAKE_CURRENT_LIST_DIR}/fleet_contract.cmake)
fleet_run_ok()
fleet_final(dpals 4 8 rmse)
if(NOT out MATCHES "guarantee: [^\n]*dpals[^\n]*user-level joint DP")
  message(FATAL_ERROR "no user-level joint-DP guarantee summary")
endif()
fleet_ledgers_within()
fleet_baseline("item mean" item)
if(NOT rmse LESS item)
  message(FATAL_ERROR "dpals (${rmse}) does not beat the item mean (${item})")
endif()
# the comparison with the private bias model at the same budget, on a fresh copy of the fleet, and its verdict
if(NOT out MATCHES "compare: bias test_rmse=([0-9.]+) epsilon=([0-9.]+) \\(joint\\)")
  message(FATAL_ERROR "no comparison with the private bias model")
endif()
if(CMAKE_MATCH_2 GREATER 8)
  message(FATAL_ERROR "the bias model's epsilon ${CMAKE_MATCH_2} is above the budget 8")
endif()
if(NOT out MATCHES "verdict: dpals \\(${rmse}\\) (beats|does NOT beat) bias \\([0-9.]+\\) at the same budget")
  message(FATAL_ERROR "no verdict line")
endif()
