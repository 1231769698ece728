#!/usr/bin/env bash
# The table of docs/privacy.md "Empirical audit": every protocol at claimed epsilon 1, 4 and 10 (user level), audited in
# one run by dprec-fleet --audit-canaries on one synthetic fleet, and the same at epsilon 1 on a DPREC_AUDIT_WEAKEN build.
#   bash scripts/audit_table.sh                       the product (build/), then the weakened build (build-weakened/)
#   BIN=path/to/dprec-fleet bash scripts/audit_table.sh --product    one table only (--weakened: the other one)
# Environment: CANARIES (default 2000), FLEET (default "--synthetic 1000,200,20000"), SEED (default 1), EPSILONS
# (default "1 4 10"), PROTOCOLS (default every protocol with audit hooks). Each run's whole output goes to
# $AUDIT_LOGS/<protocol>-<epsilon>[-weakened].log (default build/audit-runs/); the table is printed on stdout as markdown. Needs about 20 minutes
# on 2 cores with the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
CANARIES=${CANARIES:-2000}
FLEET=${FLEET:---synthetic 1000,200,20000}
SEED=${SEED:-1}
EPSILONS=${EPSILONS:-1 4 10}
PROTOCOLS=${PROTOCOLS:-plain ldp-gd ldp-gddr ldp-rr gauss-gd private-fw dpals bias dpmf sgld}
LOGS=${AUDIT_LOGS:-build/audit-runs}
mkdir -p "$LOGS"

# A protocol's own flags for this fleet: its rank (bias is d = 1; private-fw's d is its rounds; dpmf's default is 3) and
# private-fw's public item subset.
flags_of() {
  case "$1" in
    bias) echo "--rank 1" ;;
    private-fw) echo "--items-top 100" ;;
    dpmf) echo "" ;;
    *) echo "--rank 4" ;;
  esac
}

table() { # bin, suffix, epsilons
  local bin=$1 suffix=$2 eps_list=$3
  echo "| protocol | --epsilon | claimed epsilon (unit, model, delta) | lower bound (95%) | canaries | guesses | correct |"
  echo "|---|---|---|---|---|---|---|"
  for p in $PROTOCOLS; do
    local eps_p=$eps_list
    [ "$p" = plain ] && eps_p=${eps_list%% *} # no privacy: one run, whatever the budget
    for e in $eps_p; do
      local log=$LOGS/$p-$e$suffix.log
      # shellcheck disable=SC2046
      "$bin" --protocol "$p" $FLEET $(flags_of "$p") --in-process --threads 2 --seed "$SEED" --quiet --epsilon "$e" \
        --audit-canaries "$CANARIES" > "$log" 2>&1 || true
      local line model
      line=$(grep '^audit: protocol=' "$log" | tail -1 || true)
      model=$(grep -o 'claimed epsilon = [^;]*(\([a-z]* level, [^,]*, delta [^)]*\))' "$log" | sed 's/.*(\(.*\))/\1/' | tail -1 || true)
      if [ -z "$line" ]; then
        echo "| \`$p\` | $e | (no bound: see $log) | | | | |"
        continue
      fi
      local claimed lb n g c
      claimed=$(sed 's/.*claimed_epsilon=\([^ ]*\).*/\1/' <<< "$line")
      lb=$(sed 's/.*lower_bound=\([^ ]*\).*/\1/' <<< "$line")
      n=$(sed 's/.*canaries=\([^ ]*\).*/\1/' <<< "$line")
      g=$(sed 's/.*guesses=\([^ ]*\).*/\1/' <<< "$line")
      c=$(sed 's/.*correct=\([^ ]*\).*/\1/' <<< "$line")
      echo "| \`$p\` | $e | $claimed ($model) | $lb | $n | $g | $c |"
    done
  done
}

case "${1:-}" in
  --product) table "${BIN:-build/examples/fleet/dprec-fleet}" "" "$EPSILONS" ;;
  --weakened) table "${BIN:-build-weakened/examples/fleet/dprec-fleet}" -weakened 1 ;;
  "")
    table build/examples/fleet/dprec-fleet "" "$EPSILONS"
    echo
    table build-weakened/examples/fleet/dprec-fleet -weakened 1
    ;;
  *) echo "audit_table.sh: unknown option '$1' (--product or --weakened)" >&2; exit 2 ;;
esac
