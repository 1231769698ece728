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
include(${CMAKE_CURRENT_LIST_DIR}/fleet_contract.cmake)
fleet_run_ok()
fleet_final(sgld 1 1000 rmse "0 \\(posterior-sampling heuristic: .*")
if(NOT out MATCHES "\nfinal: [^\n]* epsilon=1000 delta=0 ")
  message(FATAL_ERROR "the job's epsilon is not its 1000")
endif()
if(NOT out MATCHES "guarantee: [^\n]*sgld[^\n]*user-level posterior-sampling heuristic DP, epsilon = 1000[^\n]*caveat: holds only for an exact posterior sample")
  message(FATAL_ERROR "no posterior-sampling guarantee summary with its caveat")
endif()
if(NOT out MATCHES "300 devices from --personal-eps-file")
  message(FATAL_ERROR "the personal epsilons were not read")
endif()
fleet_ledgers_within(3000)
if(NOT out MATCHES "ledgers: 3000 devices [^\n]*posterior-sampling heuristic")
  message(FATAL_ERROR "the ledger check line does not name the posterior-sampling heuristic")
endif()
fleet_baseline("item mean" item)
if(NOT rmse LESS item)
  message(FATAL_ERROR "sgld (${rmse}) does not beat the item mean (${item})")
endif()
file(REMOVE_RECURSE "${WORK}")
