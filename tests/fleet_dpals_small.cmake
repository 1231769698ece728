# dpals's defaults on a fleet of light devices: 120 devices of at most 13 training ratings each (synthetic, d = 10,
# epsilon 8, user level, 5 rounds), nothing set but the budget. Its defaults must fit such a fleet: k no larger than
# the largest device's count (the sensitivity is sqrt(k (1 + alpha^2)) whatever the devices hold) and a device ridge of at least
# 3, so that a device does not fit its d coordinates to a dozen ratings. Before those two rules this run gave
# 1.17-1.37 (global mean 1.12, item mean 1.02: worse than predicting the mean); with them 0.79-0.87 in six runs.
# Checks the job line and the reports' size the rules give, and a test RMSE below the item mean.
#   cmake -DBIN=path/to/dprec-fleet -P fleet_dpals_small.cmake
if(NOT BIN)
  message(FATAL_ERROR "usage: -DBIN=... -P fleet_dpals_small.cmake")
endif()
# --rank 10: the population rule (aggregator/protocols/dpals_rule.c) would choose the bias model for 120 devices and
# 30 items (the first factor's signal over its noise 2.0, below 4; this fleet's interaction, sd 1 on a 1..5 scale, is
# stronger than the rule's prior W / 10, and the bias model gives 1.05 here, above the item mean): this test is of
# the k and ridge rules at d = 10, and of the rule's line saying it was not applied (the job asks no
# population_rule).
execute_process(COMMAND ${BIN} --synthetic 120,30,3000,3 --protocol dpals --epsilon 8 --in-process --threads 2 --seed 4
                        --compare none --rank 10
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 600)
include(${CMAKE_CURRENT_LIST_DIR}/fleet_contract.cmake)
fleet_run_ok()
if(NOT out MATCHES "largest ([0-9]+) ratings")
  message(FATAL_ERROR "no device line")
endif()
set(largest ${CMAKE_MATCH_1})
if(NOT out MATCHES "rule: not applied: --rank given \\(d = 10, 5 rounds; the job asks no population_rule\\)")
  message(FATAL_ERROR "no rule line, or the rule applied over --rank")
endif()
if(NOT out MATCHES "job [0-9]+: protocol dpals, d = 10, [^\n]*devices: 0.02 x ratings, at least 3\\), 5 rounds")
  message(FATAL_ERROR "the job line does not show the epsilon >= 5 ridge with its floor of 3")
endif()
if(NOT out MATCHES "each device reports up to ${largest} ratings a round")
  message(FATAL_ERROR "k is not the largest device's count (${largest})")
endif()
fleet_final(dpals 5 8 rmse)
fleet_ledgers_within()
fleet_baseline("item mean" item)
if(NOT rmse LESS item)
  message(FATAL_ERROR "dpals's default run (${rmse}) does not beat the item mean (${item})")
endif()
