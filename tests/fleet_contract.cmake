# Shared checks of a dprec-fleet run's output (included by the fleet_*.cmake scripts).
#
# fleet_run_ok(): the exit status was 0 (rc), with the output printed for the test log (out, err).
# fleet_final(PROTOCOL ROUNDS BUDGET RMSE_VAR [DELTA]): the last line is the contract
#   `final: protocol=P rounds=N test_rmse=X epsilon=E delta=D`, with E at most BUDGET; RMSE_VAR gets X. DELTA is a
#   regular expression for D and what follows it (default 1e-06).
# fleet_ledgers_within([DEVICES]): every device's ledger is at most the aggregator's accountant's figure (and, given
#   DEVICES, the line covers that many devices).
# fleet_baseline(WHAT VAR): VAR gets the baseline WHAT ("global mean" or "item mean") of the first baselines line.
macro(fleet_run_ok)
  message(STATUS "dprec-fleet output:\n${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "dprec-fleet exited with ${rc}")
  endif()
endmacro()

function(fleet_final protocol rounds budget rmse_var)
  set(delta "1e-06")
  if(ARGC GREATER 4)
    set(delta "${ARGV4}")
  endif()
  string(STRIP "${out}" stripped)
  string(REGEX MATCH "[^\n]*$" last "${stripped}")
  if(NOT last MATCHES "^final: protocol=${protocol} rounds=${rounds} test_rmse=([0-9]+\\.[0-9]+) epsilon=([0-9.]+) delta=${delta}$")
    message(FATAL_ERROR "the last line is not the contract: '${last}'")
  endif()
  if(CMAKE_MATCH_2 GREATER budget)
    message(FATAL_ERROR "the job's epsilon ${CMAKE_MATCH_2} is above its budget ${budget}")
  endif()
  set(${rmse_var} ${CMAKE_MATCH_1} PARENT_SCOPE)
endfunction()

function(fleet_ledgers_within)
  set(devices "[0-9]+")
  if(ARGC GREATER 0)
    set(devices "${ARGV0}")
  endif()
  if(NOT out MATCHES "ledgers: ${devices} devices charged this job, at most epsilon = ([0-9.e+-]+) each [^\n]*the aggregator's accountant for the rounds run: ([0-9.e+-]+)")
    message(FATAL_ERROR "no ledger check line covering ${devices} devices")
  endif()
  if(CMAKE_MATCH_1 GREATER CMAKE_MATCH_2)
    message(FATAL_ERROR "a device charged more (${CMAKE_MATCH_1}) than the aggregator's figure (${CMAKE_MATCH_2})")
  endif()
endfunction()

function(fleet_baseline what var)
  if(what STREQUAL "global mean")
    set(re "baselines: global mean [0-9.]+ -> test RMSE ([0-9]+\\.[0-9]+)")
  else()
    set(re "baselines: [^\n]*${what} test RMSE ([0-9]+\\.[0-9]+)")
  endif()
  if(NOT out MATCHES "${re}")
    message(FATAL_ERROR "no ${what} baseline")
  endif()
  set(${var} ${CMAKE_MATCH_1} PARENT_SCOPE)
endfunction()
