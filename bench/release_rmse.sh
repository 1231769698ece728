#!/usr/bin/env bash
# What a compact release costs in accuracy: the same dprec-fleet job (same seed, same data, same devices) run with
# the releases as float32 (format 1) and as compact q16 and q8 (format 2, docs/release-format.md), side by side
# with the bytes of a release row. The devices fit and predict from the release they received, so the test RMSE
# difference is the encoding's whole cost. Each cell is one `dprec-fleet --in-process` run (about a minute on ml-100k
# on 2 shared cores).
#
#   bash bench/release_rmse.sh [--rank D] [--cases "ml100k:plain ml100k:gauss-gd synthetic:plain"]
#
# Cases: DATA:PROTOCOL, DATA one of ml100k (../shared/data/ml-100k/u.data) or synthetic (--synthetic ml10m:0.03:
# 2,100 users, 300 items, about 301,500 ratings); PROTOCOL any of dprec-fleet's, at its defaults (gauss-gd: epsilon
# 1, user level). Default rank 10 (dprec-fleet's). Needs a native build (bash scripts/test.sh, or
# cmake --build build --target dprec-fleet); DPREC_FLEET names another build's fleet.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
fleet="${DPREC_FLEET:-$here/build/examples/fleet/dprec-fleet}"
rank=10 cases="ml100k:plain ml100k:gauss-gd synthetic:plain"
while [ $# -gt 0 ]; do
  case "$1" in
    --rank) rank=$2; shift 2 ;;
    --cases) cases=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "release_rmse.sh: unknown option $1 (try --help)" >&2; exit 2 ;;
  esac
done
[ -x "$fleet" ] || { echo "release_rmse.sh: no fleet at $fleet (build it first, see --help)" >&2; exit 1; }
ml100k="$here/../shared/data/ml-100k/u.data"

# Bytes of one item's row with biases (docs/release-format.md): float32 4 (d + 1); q16 4 + 4 + 2 d; q8 4 + 4 + d.
row_bytes() { case $1 in f32) echo $((4 * (rank + 1))) ;; q16) echo $((8 + 2 * rank)) ;; q8) echo $((8 + rank)) ;; esac; }

echo "| data | protocol | d | encoding | row bytes | of float32 | test RMSE | minus float32's |"
echo "|---|---|---|---|---|---|---|---|"
for c in $cases; do
  data=${c%%:*} proto=${c#*:}
  case $data in
    ml100k) [ -r "$ml100k" ] || { echo "release_rmse.sh: cannot read $ml100k" >&2; exit 1; }
            src=(--data "$ml100k") ;;
    synthetic) src=(--synthetic ml10m:0.03) ;;
    *) echo "release_rmse.sh: unknown data '$data' in case '$c' (ml100k or synthetic)" >&2; exit 2 ;;
  esac
  base=""
  for enc in f32 q16 q8; do
    out=$("$fleet" --in-process "${src[@]}" --protocol "$proto" --rank "$rank" --compare none --eval-every 0 \
                   --release-encoding "$enc" 2> /dev/null) || { echo "release_rmse.sh: the fleet failed on $c $enc" >&2; exit 1; }
    rmse=$(sed -n 's/^final: .*test_rmse=\([0-9.]*\).*/\1/p' <<< "$out")
    [ -n "$rmse" ] || { echo "release_rmse.sh: no final line from the fleet on $c $enc" >&2; exit 1; }
    [ -n "$base" ] || base=$rmse
    printf '| %s | %s | %s | %s | %s | %.2f | %s | %+.4f |\n' "$data" "$proto" "$rank" "$enc" "$(row_bytes $enc)" \
           "$(python3 -c "print($(row_bytes $enc) / $(row_bytes f32))")" "$rmse" \
           "$(python3 -c "print($rmse - $base)")"
  done
done
