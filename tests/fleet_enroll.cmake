# Enrollment end to end (docs/protocol.md "Enrollment"): a fleet over HTTPS against a `dprec-aggregator serve
# --registration token` it starts, playing the app's backend (every device, and the fleet's evaluator, enrolled with a
# token of the run's enrollment key for its identity key). The job runs to its end like an open one. Then the flag's
# refusal: --registration token cannot enroll with an aggregator the fleet did not start (it does not hold the key).
#   cmake -DBIN=path/to/dprec-fleet -P fleet_enroll.cmake
if(NOT BIN)
  message(FATAL_ERROR "usage: -DBIN=... -P fleet_enroll.cmake")
endif()
execute_process(COMMAND ${BIN} --synthetic 300,40,6000,4 --protocol bias --epsilon 4 --threads 2 --seed 3
                        --compare none --registration token
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 600)
include(${CMAKE_CURRENT_LIST_DIR}/fleet_contract.cmake)
fleet_run_ok()
if(NOT out MATCHES "aggregator: https://")
  message(FATAL_ERROR "the fleet did not run over HTTPS against an aggregator it started")
endif()
fleet_final(bias 2 4 rmse)
fleet_ledgers_within(300)
execute_process(COMMAND ${BIN} --aggregator https://127.0.0.1:1 --registration token
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 60)
if(NOT rc EQUAL 2 OR NOT err MATCHES "not with --aggregator")
  message(FATAL_ERROR "--registration token with --aggregator was not refused as a usage error: ${rc} ${err}")
endif()
