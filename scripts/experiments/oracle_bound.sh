#!/usr/bin/env bash
# What dpals could reach at a given epsilon with a perfect start: an EXPERIMENT, not a private run.
#
# docs/results.md ("Targets") cites it for the MovieLens-10M shape at epsilon = 1. It copies the committed tree
# (git archive HEAD) into a temporary directory, applies scripts/experiments/oracle_start.patch there (the plain
# job writes its release to a file; a dpals job's release 1 is read from that file instead of its public random
# draw), builds it, then runs on the same fleet and split:
#   1. plain (exact, non-private ALS at d = 10), whose final V, item biases and mean are kept;
#   2. dpals for ONE round from that release with centred targets (--residual off), so that the devices' u_i are
#      the exact model's (the best a private run's earlier rounds could give them), the item statistics get the
#      whole budget in that one round, and the aggregator solves from zero: only the start is an oracle;
#   3. for reference the private bias model (`bias`) at the same epsilon, as the leaderboard runs it.
# For fixed u_i, R rounds at noise multiplier z sqrt(R) carry what one round at z does (the Gaussians' precisions
# and RDP costs both add), so step 2 is what every number of ALS rounds could reach with a perfect initialization.
# The 60% target is the item mean minus 0.6 (item mean - plain), from the baselines of the same run.
#
# Usage: scripts/experiments/oracle_bound.sh [--data SPEC] [--seed S] [--epsilon E] [-- dpals flags...]
#   --data SPEC   dprec-fleet's --synthetic spec (default ml10m:0.1; ml10m is the full 70,000-device shape)
#   --seed S      the fleet's seed (default 2: not the leaderboard's seed 1, as for the defaults' tuning)
#   --epsilon E   user-level epsilon, delta = 1e-6 (default 1)
#   dpals flags   replace the oracle run's own (default: --rating-clip 1 --bias-scale 1
#                 --device-lambda-per-rating 0.02, the best of a sweep at ml10m:0.1 seed 2, docs/results.md)
# Needs what scripts/setup.sh installs. Time here (2 cores): ml10m:0.1 about 1 minute, ml10m about 25.
set -euo pipefail

data=ml10m:0.1 seed=2 eps=1
extra=(--rating-clip 1 --bias-scale 1 --device-lambda-per-rating 0.02)
while [ $# -gt 0 ]; do
    case "$1" in
    --data) data="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --epsilon) eps="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,/^[^#]/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "oracle_bound.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
tmp=$(mktemp -d /tmp/dprec-oracle.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
echo "oracle_bound: building the committed tree ($(git -C "$root" rev-parse --short HEAD)) with the experiment patch in $tmp"
git -C "$root" archive HEAD | tar -x -C "$tmp" --one-top-level=src
(cd "$tmp/src" && git apply "$root/scripts/experiments/oracle_start.patch")
cmake -S "$tmp/src" -B "$tmp/build" -DCMAKE_BUILD_TYPE=Release -DDPREC_BUILD_TESTS=OFF >"$tmp/cmake.log" 2>&1 ||
    { cat "$tmp/cmake.log" >&2; exit 1; }
cmake --build "$tmp/build" -j2 --target dprec-fleet >"$tmp/build.log" 2>&1 || { tail -40 "$tmp/build.log" >&2; exit 1; }
F="$tmp/build/examples/fleet/dprec-fleet"
common=(--synthetic "$data" --in-process --threads 2 --compare none --seed "$seed")

final() { sed -n 's/^final: .*test_rmse=\([0-9.]*\).*/\1/p' "$1"; }

echo "oracle_bound: 1/3 plain on $data, seed $seed"
DPREC_EXPERIMENT_DUMP_MODEL="$tmp/plain.bin" "$F" "${common[@]}" --protocol plain >"$tmp/plain.log" 2>&1 ||
    { tail -20 "$tmp/plain.log" >&2; exit 1; }
echo "oracle_bound: 2/3 dpals, one round at epsilon $eps from plain's release (${extra[*]})"
DPREC_EXPERIMENT_START_MODEL="$tmp/plain.bin" "$F" "${common[@]}" --protocol dpals --epsilon "$eps" --rounds 1 \
    --residual off "${extra[@]}" >"$tmp/oracle.log" 2>&1 || { tail -20 "$tmp/oracle.log" >&2; exit 1; }
echo "oracle_bound: 3/3 bias at epsilon $eps"
"$F" "${common[@]}" --protocol bias --epsilon "$eps" >"$tmp/bias.log" 2>&1 || { tail -20 "$tmp/bias.log" >&2; exit 1; }

im=$(sed -n 's/^baselines: .*item mean test RMSE \([0-9.]*\).*/\1/p' "$tmp/plain.log" | head -1)
gm=$(sed -n 's/^baselines: global mean [0-9.]* -> test RMSE \([0-9.]*\).*/\1/p' "$tmp/plain.log" | head -1)
pl=$(final "$tmp/plain.log") orc=$(final "$tmp/oracle.log") bi=$(final "$tmp/bias.log")
grep -q '^experiment: release 1 is' "$tmp/oracle.log" || { echo "oracle_bound: the dpals job did not start from plain's release" >&2; exit 1; }
python3 - "$data" "$seed" "$eps" "$gm" "$im" "$pl" "$orc" "$bi" <<'EOF'
import sys
data, seed, eps, gm, im, pl, orc, bi = sys.argv[1:]
gm, im, pl, orc, bi = map(float, (gm, im, pl, orc, bi))
gap = lambda r: 100.0 * (im - r) / (im - pl)
print(f"{data}, seed {seed}, epsilon {eps} (user level, delta 1e-6):")
print(f"  global mean {gm:.4f}, item mean {im:.4f}, plain {pl:.4f}; the 60% target {im - 0.6 * (im - pl):.4f}")
print(f"  dpals, one round from plain's exact release (NOT private: an oracle start): {orc:.4f} ({gap(orc):.1f}% of the gap)")
print(f"  bias (the private bias model, its defaults):                               {bi:.4f} ({gap(bi):.1f}% of the gap)")
EOF
