# Sourced by the results scripts (not run on its own): one dprec-fleet job with its progress shown.
#   fleet_job LABEL ARGS...   runs "$fleet" ARGS... (the caller sets $fleet); its "round N" progress lines go to
#                             stderr as "    LABEL: round N: ...", and its whole output (stdout and stderr) is
#                             left in $job_log. If the fleet fails (exit status non-zero, e.g. a device failed),
#                             its output goes to stderr and fleet_job returns 1.
fleet_job() {
  local label=$1 tmp rc=0
  shift
  tmp=$(mktemp "${TMPDIR:-/tmp}/dprec-results.XXXXXX")
  "$fleet" "$@" >>"$tmp" \
    2> >(tee -a "$tmp" | grep --line-buffered '^  round ' | sed -u "s|^  |    $label: |" >&2) || rc=$?
  wait || true # and for the progress filter (bash waits for a process substitution too) to see the last line
  job_log=$(cat "$tmp")
  rm -f "$tmp"
  if [ "$rc" -ne 0 ]; then
    printf '%s\n' "$job_log" >&2
    return 1
  fi
}
