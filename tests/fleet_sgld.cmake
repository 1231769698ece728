# Runs dprec-fleet's sgld (seed 003) on a small synthetic fleet in-process and checks its contract: the final line
# with the posterior-sampling caveat, the guarantee summary as a posterior-sampling heuristic at user level, no
# device's ledger above the aggregator's figure (with a tenth of the devices at their own, lower epsilon_i from
# --personal-eps-file), and at a large epsilon a released V that beats the item mean (the sampler learns; the priors
# are widened for this fleet, whose factors are large: the defaults are for the leaderboard's epsilons).
#   cmake -DBIN=path/to/dprec-fleet -DWORK=dir -P fleet_sgld.cmake
if(NOT BIN OR NOT WORK)
  message(FATAL_ERROR "usage: -DBIN=... -DWORK=... -P fleet_sgld.cmake")
endif()
file(MAKE_DIRECTORY "${WORK}")
set(personal "# device epsilon_i\n")
foreach(d RANGE 0 299)
  string(APPEND personal "${d} 10\n")
endforeach()
file(WRITE "${WORK}/personal.txt" "${personal}")
execute_process(COMMAND ${BIN} --synthetic 3000,100,60000,3 --protocol sgld --epsilon 1000 --rank 4 --tau 20
                        --prior-sd 0.5 --bias-prior-sd 0.5 --personal-eps-file "${WORK}/personal.txt" --in-process
                        --threads 2 --seed 7 --quiet --compare none
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 600)
message(STATUS "dprec-fleet output:\n${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "dprec-fleet exited with ${rc}")
endif()
string(STRIP "${out}" out_stripped)
string(REGEX MATCH "[^\n]*$" last "${out_stripped}")
if(NOT last MATCHES "^final: protocol=sgld rounds=1 test_rmse=([0-9]+\\.[0-9]+) epsilon=1000 delta=0 \\(posterior-sampling heuristic: ")
  message(FATAL_ERROR "the last line is not the contract: '${last}'")
endif()
set(rmse ${CMAKE_MATCH_1})
if(NOT out MATCHES "guarantee: [^\n]*sgld[^\n]*user-level posterior-sampling heuristic DP, epsilon = 1000[^\n]*caveat: holds only for an exact posterior sample")
  message(FATAL_ERROR "no posterior-sampling guarantee summary with its caveat")
endif()
if(NOT out MATCHES "300 devices from --personal-eps-file")
  message(FATAL_ERROR "the personal epsilons were not read")
endif()
if(NOT out MATCHES "ledgers: 3000 devices charged this job, at most epsilon = ([0-9.e+-]+) each [^\n]*posterior-sampling heuristic[^\n]*the aggregator's accountant for the rounds run: ([0-9.e+-]+)")
  message(FATAL_ERROR "no ledger check line")
endif()
if(CMAKE_MATCH_1 GREATER CMAKE_MATCH_2)
  message(FATAL_ERROR "a device charged more (${CMAKE_MATCH_1}) than the aggregator's figure (${CMAKE_MATCH_2})")
endif()
if(NOT out MATCHES "item mean test RMSE ([0-9.]+)")
  message(FATAL_ERROR "no baseline line")
endif()
if(NOT rmse LESS CMAKE_MATCH_1)
  message(FATAL_ERROR "sgld (${rmse}) does not beat the item mean (${CMAKE_MATCH_1})")
endif()
file(REMOVE_RECURSE "${WORK}")
