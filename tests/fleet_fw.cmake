# Runs dprec-fleet's private-fw (seed 002) on a tiny synthetic fleet in-process, for one variant, and checks
# the final line (rounds, an epsilon within the budget), the joint-DP guarantee line and that devices reported.
#   cmake -DBIN=path/to/dprec-fleet -DVARIANT=dense|oja -P fleet_fw.cmake
if(NOT BIN OR NOT VARIANT)
  message(FATAL_ERROR "usage: -DBIN=... -DVARIANT=dense|oja -P fleet_fw.cmake")
endif()
execute_process(COMMAND ${BIN} --synthetic 300,60,6000 --in-process --protocol private-fw --variant ${VARIANT}
                        --items-top 40 --max-ratings 20 --iterations 3 --epsilon 1 --delta 1e-6 --threads 2
                        --seed 7 --quiet
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 600)
message(STATUS "dprec-fleet output:\n${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "dprec-fleet exited with ${rc}")
endif()
string(STRIP "${out}" out_stripped)
string(REGEX MATCH "[^\n]*$" last "${out_stripped}")
if(NOT last MATCHES "^final: protocol=private-fw rounds=3 test_rmse=[0-9]+\\.[0-9]+ epsilon=0\\.[0-9]+ delta=1e-06$")
  message(FATAL_ERROR "the last line is not the contract (epsilon within the budget of 1): '${last}'")
endif()
if(NOT out MATCHES "guarantee: [^\n]*private-fw[^\n]*user-level joint DP")
  message(FATAL_ERROR "no joint-DP guarantee summary")
endif()
# --items-top picks the subset from the users' own ratings: the guarantee line must say it does not cover that
if(NOT out MATCHES "guarantee: [^\n]*NOT covered: the item subset \\(--items-top\\)")
  message(FATAL_ERROR "the guarantee line does not say that --items-top is outside the guarantee")
endif()
# every device's own ledger charged at most the aggregator's figure (the published guarantee does not understate)
include(${CMAKE_CURRENT_LIST_DIR}/fleet_contract.cmake)
fleet_ledgers_within()
if(out MATCHES "failed")
  message(FATAL_ERROR "some devices failed")
endif()
