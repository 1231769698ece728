# The empirical privacy audit end to end (issue 40; docs/privacy.md "Empirical audit"): dprec-fleet --audit-canaries on a
# small fleet, in one run, against the claimed epsilon.
#   cmake -DBIN=path/to/dprec-fleet -P fleet_audit.cmake                 (the product: every bound at most its claim)
#   cmake -DBIN=path/to/dprec-fleet -DWEAKENED=1 -P fleet_audit.cmake    (a DPREC_AUDIT_WEAKEN build: the audit must
#                                                                        find the defect, every bound above its claim)
#
# The product (its false-failure probability, each check at a fixed seed):
#   - plain (no privacy, exact releases): the bound is at least 2.5, the audit's ceiling at 200 canaries being about 3.1
#     (all guesses right): the canaries, the guesses and the bound can see a leak. Deterministic (no noise anywhere).
#   - ldp-gd at epsilon 4: the bound is at most 4 and at least 1.5 (observed 2.36): the local canaries' two data sets
#     and the reports' scores reach the randomizer. Deterministic: the devices' entropy is seeded and the aggregator adds
#     no noise.
#   - gauss-gd and dpals at epsilon 1, each with 400 canaries at --audit-confidence 0.999: the bound is at most 1. The
#     aggregator's noise comes from its own CSPRNG (not seeded), so each run differs; if the mechanism is 1-DP the
#     theorem bounds the chance of a bound above 1 by 1e-3 per run (observed bounds: 0 to 0.03).
#   - the two-world audit on plain (20 runs a world): 0 errors of 10 in each world counted, the Clopper-Pearson bound
#     log((1 - 0.3085) / 0.3085) = 0.8071. Deterministic.
#   - the flags it cannot run with are refused.
# The weakened build (central Gaussian noise / 10, local sign randomizer at 10 epsilon), every bound above the claimed 1:
#   - gauss-gd, 400 canaries: 84 right of 100 guesses at k = 50 suffice, about 97 expected (95 to 100 over four
#     seeds), a 7-sigma margin: false failure below 1e-9;
#   - ldp-gd, 200 canaries: deterministic (198 of 200 right);
#   - dpals, 2000 canaries: 200 right of 250 at k = 125 suffice, 218 to 226 over five runs (its score passes through
#     the release's posterior filter, which the claimed noise sets): false failure below 1e-4 (a 3.5-sigma margin at
#     that k alone; the best of six k is taken).
if(NOT BIN)
  message(FATAL_ERROR "usage: -DBIN=... [-DWEAKENED=1] -P fleet_audit.cmake")
endif()

set(FLEET --synthetic 300,80,6000 --rank 4 --in-process --threads 2 --quiet)

# One audit: OUT gets the claim and the bound of its contract line (the last line printed); RC its exit status.
function(audit_run protocol eps canaries seed extra)
  execute_process(COMMAND ${BIN} --protocol ${protocol} ${FLEET} --seed ${seed} --epsilon ${eps}
                          --audit-canaries ${canaries} ${extra}
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 600)
  message(STATUS "dprec-fleet --protocol ${protocol} --epsilon ${eps} --audit-canaries ${canaries}:\n${out}${err}")
  string(STRIP "${out}" stripped)
  string(REGEX MATCH "[^\n]*$" last "${stripped}")
  if(NOT last MATCHES "^audit: protocol=${protocol} claimed_epsilon=([0-9.]+|inf) lower_bound=([0-9]+\\.[0-9]+) canaries=${canaries} guesses=([0-9]+) correct=([0-9]+)$")
    message(FATAL_ERROR "${protocol}: the last line is not the audit's contract: '${last}'")
  endif()
  set(claimed ${CMAKE_MATCH_1} PARENT_SCOPE)
  set(bound ${CMAKE_MATCH_2} PARENT_SCOPE)
  set(status ${rc} PARENT_SCOPE)
  set(text "${out}" PARENT_SCOPE)
endfunction()

if(WEAKENED)
  foreach(run "gauss-gd;400;3" "ldp-gd;200;3" "dpals;2000;4")
    list(GET run 0 p)
    list(GET run 1 n)
    list(GET run 2 seed)
    audit_run(${p} 1 ${n} ${seed} "")
    if(NOT text MATCHES "WEAKENED TEST BUILD")
      message(FATAL_ERROR "${p}: a weakened build does not say so")
    endif()
    if(NOT bound GREATER claimed OR NOT text MATCHES "THE LOWER BOUND EXCEEDS THE CLAIMED EPSILON" OR NOT status EQUAL 1)
      message(FATAL_ERROR "${p}: the weakened mechanism was not caught: lower bound ${bound}, claimed ${claimed}, exit ${status}")
    endif()
    message(STATUS "ok: ${p}'s weakened mechanism caught: lower bound ${bound} above the claimed ${claimed}")
  endforeach()
  return()
endif()

audit_run(plain 1 200 3 "--rounds;2")
if(NOT claimed STREQUAL "inf" OR bound LESS 2.5 OR NOT status EQUAL 0)
  message(FATAL_ERROR "plain: the audit did not see the exact releases leak: bound ${bound} (claimed ${claimed}, exit ${status})")
endif()
message(STATUS "ok: plain's exact releases give the bound ${bound}")

audit_run(ldp-gd 4 200 3 "")
if(bound GREATER claimed OR bound LESS 1.5 OR NOT status EQUAL 0)
  message(FATAL_ERROR "ldp-gd: bound ${bound} against the claimed ${claimed} (exit ${status}): outside [1.5, ${claimed}]")
endif()
message(STATUS "ok: ldp-gd at epsilon 4: bound ${bound}")

foreach(p gauss-gd dpals)
  audit_run(${p} 1 400 3 "--audit-confidence;0.999")
  if(bound GREATER claimed OR NOT status EQUAL 0)
    message(FATAL_ERROR "${p}: THE LOWER BOUND ${bound} EXCEEDS THE CLAIMED EPSILON ${claimed} (exit ${status})")
  endif()
  message(STATUS "ok: ${p} at epsilon 1: bound ${bound} (99.9%)")
endforeach()

execute_process(COMMAND ${BIN} --protocol plain --synthetic 20,20,200 --rank 2 --rounds 1 --in-process --threads 2 --seed 3
                        --quiet --audit-two-world 20
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 600)
message(STATUS "dprec-fleet --audit-two-world 20:\n${out}${err}")
if(NOT rc EQUAL 0 OR NOT out MATCHES "\naudit-two-world: protocol=plain claimed_epsilon=inf lower_bound=0\\.8071 runs=40 fp=0/10 fn=0/10\n")
  message(FATAL_ERROR "plain's two-world audit: no 'lower_bound=0.8071 runs=40 fp=0/10 fn=0/10' line (exit ${rc})")
endif()
message(STATUS "ok: the two-world audit of plain")

foreach(bad "--protocol;plain;--malicious;0.1" "--protocol;gauss-gd;--secure-agg" "--protocol;dpmf;--dpmf-mode;relay"
            "--protocol;gauss-gd;--unit;rating;--eps-i;0.5")
  execute_process(COMMAND ${BIN} ${bad} --synthetic 300,80,6000 --in-process --audit-canaries 10
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 60)
  if(NOT rc EQUAL 2 OR NOT err MATCHES "audit")
    message(FATAL_ERROR "'${bad} --audit-canaries' was not refused with a message (${rc}): ${err}")
  endif()
endforeach()
message(STATUS "ok: --audit-canaries refused where it cannot audit the job as it runs")
