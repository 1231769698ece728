# The bias model's and gauss-gd's default runs with their releases' uncertainty (release format 3, docs/privacy.md "Release
# uncertainty") on a fleet whose budget leaves the release pure noise: 300 devices, 200 items, epsilon 0.1. The fleet
# asks for the column by default for bias, says so, and every device predicts about its own level: about the user mean,
# what each device has for free (1.1323 here). The bias model's solve integrates each item's count out (docs/privacy.md
# "The count posterior"), shrinking each item by its own posterior, and the column keeps that whole: five runs gave
# 1.1078-1.1322. With the counts plugged in (--count-posterior off) the column's spread estimate does the shrinking,
# a one-sided test at two standard errors that a release of noise passes now and then (1.1197-1.1298 in 64 runs of 65,
# one 1.1385). The tolerance is stated, not zero: a run is held within 0.015 of the user mean.
#   cmake -DBIN=path/to/dprec-fleet -P fleet_uncertainty.cmake
if(NOT BIN)
  message(FATAL_ERROR "usage: -DBIN=... -P fleet_uncertainty.cmake")
endif()
execute_process(COMMAND ${BIN} --synthetic 300,200,6000,3 --protocol bias --epsilon 0.1 --in-process --threads 2 --seed 4
                        --compare none
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 600)
include(${CMAKE_CURRENT_LIST_DIR}/fleet_contract.cmake)
fleet_run_ok()
if(NOT out MATCHES "releases: with each item's uncertainty \\(release format 3\\)")
  message(FATAL_ERROR "the bias job's releases do not carry their items' uncertainty by default")
endif()
fleet_final(bias 2 0.1 rmse)
fleet_ledgers_within()
fleet_baseline("user mean" user)
string(REPLACE "." "" rmse_i "${rmse}")
string(REPLACE "." "" user_i "${user}")
math(EXPR over "${rmse_i} - ${user_i}")
if(over GREATER 150)
  message(FATAL_ERROR "the bias model on a release of noise (${rmse}) is more than 0.015 above the user mean (${user})")
endif()

# gauss-gd's default run on the same fleet: its releases carry the column too, and the step rule
# (aggregator/protocols/gauss_rule.c) finds an average item's bias mostly noise, so it takes the Wiener step and the devices'
# fixed ridge 1; every device then predicts about its own level, at or below the user mean (1.1233 against 1.1323 here).
execute_process(COMMAND ${BIN} --synthetic 300,200,6000,3 --protocol gauss-gd --epsilon 0.1 --in-process --threads 2
                        --seed 4 --compare none
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 600)
fleet_run_ok()
if(NOT out MATCHES "releases: with each item's uncertainty \\(release format 3\\)")
  message(FATAL_ERROR "the gauss-gd job's releases do not carry their items' uncertainty by default")
endif()
if(NOT out MATCHES "rule: [^\n]*mostly noise: the Wiener step, and the devices' fixed ridge 1 \\(below 0.202\\)")
  message(FATAL_ERROR "the gauss-gd step rule did not find this fleet's items mostly noise")
endif()
fleet_final(gauss-gd 10 0.1 rmse)
fleet_ledgers_within()
fleet_baseline("user mean" user)
if(rmse GREATER user)
  message(FATAL_ERROR "gauss-gd on a release of noise (${rmse}) is worse than the user mean (${user})")
endif()
