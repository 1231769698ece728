#!/usr/bin/env bash
# Seed 000's table for dprec's local-DP protocols: test RMSE after k rounds (each k its own job, epsilon / k per
# round) at the given total epsilons, beside plain, item mean and global mean. Each configuration is one
# `dprec-fleet --in-process` run; its rounds are shown on stderr as they finish, and rows are appended to OUT
# (CSV) as they finish, so a long sweep can be stopped and resumed (rows already in OUT are skipped).
# `--table` prints the markdown table of OUT.
#
#   bash scripts/results_ldp.sh --data ml100k [--protocols "ldp-gd ldp-gddr ldp-rr"] [--ks "1 3 5 10 20 50"]
#                               [--eps "0.1 1.6"] [--lr G] [--plain-rounds N] [--out FILE]
#   bash scripts/results_ldp.sh --data synthetic ...   (100,000 devices, 300 items, 1,000,000 ratings, rank 5)
#   bash scripts/results_ldp.sh --table [--out FILE]
#
# Defaults: d = 15 (seed 000), lambda = 1e-8, q = min(2700, m), gamma_t = lr / t with lr = 0.001.
# Cost (2-core x86_64 VM): ml-100k about 2 s a round for ldp-gd / ldp-gddr and 3 s for ldp-rr; the
# 100,000-device fleet about 16 s (ldp-gddr), 30 s (ldp-gd) and 60 to 90 s (ldp-rr) a round (docs/results.md);
# an ldp-rr fleet of that size needs about 13 GB of memory (/dev/shm included): run one at a time.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
fleet="${DPREC_FLEET:-$here/build/examples/fleet/dprec-fleet}"  # DPREC_FLEET: another build's fleet
data=ml100k protocols="ldp-gd ldp-gddr ldp-rr" ks="1 3 5 10 20 50" epss="0.1 1.6" lr=0.001 out="" table=0
plain_rounds=12
while [ $# -gt 0 ]; do
  case "$1" in
    --data) data=$2; shift 2;;
    --protocols) protocols=$2; shift 2;;
    --ks) ks=$2; shift 2;;
    --eps) epss=$2; shift 2;;
    --lr) lr=$2; shift 2;;
    --out) out=$2; shift 2;;
    --plain-rounds) plain_rounds=$2; shift 2;;
    --table) table=1; shift;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 0;; # the comment block above
    *) echo "results_ldp.sh: unknown option $1 (see --help)" >&2; exit 2;;
  esac
done
out=${out:-"$here/build/results-ldp.csv"}

if [ "$table" = 1 ]; then
  [ -f "$out" ] || { echo "results_ldp.sh: no results in $out" >&2; exit 1; }
  python3 - "$out" <<'PY'
import csv, sys, collections
rows = list(csv.DictReader(open(sys.argv[1])))
ks = sorted({int(r["k"]) for r in rows if r["k"] != "-"})
groups = collections.OrderedDict()
base = {}
for r in rows:
    if r["protocol"] in ("plain",):
        base[(r["data"], "plain")] = r["rmse"]; continue
    base[(r["data"], "item mean")] = r["item"]; base[(r["data"], "global mean")] = r["global"]
    groups.setdefault((r["data"], r["protocol"], r["eps"]), {})[int(r["k"])] = r["rmse"]
order = {p: i for i, p in enumerate(dict.fromkeys(g[1] for g in groups))}  # first-seen protocol order
for data in sorted({g[0] for g in groups}):
    print(f"\n**{data}** (test RMSE after k rounds; each k is its own job at the total epsilon)\n")
    print("| protocol | epsilon | " + " | ".join(f"k = {k}" for k in ks) + " |")
    print("|---|---|" + "---|" * len(ks))
    for (d, p, e) in sorted(groups, key=lambda g: (order[g[1]], float(g[2]))):  # then epsilon, ascending
        if d != data: continue
        v = groups[(d, p, e)]
        print(f"| {p} | {e} | " + " | ".join(v.get(k, "—") for k in ks) + " |")
    for b in ("plain", "item mean", "global mean"):
        if (data, b) in base:
            print(f"| {b} | — | " + " | ".join(base[(data, b)] for _ in ks) + " |")
PY
  exit 0
fi

[ -x "$fleet" ] || { echo "results_ldp.sh: build first (bash scripts/test.sh)" >&2; exit 1; }
. "$here/scripts/fleet_job.sh"
case "$data" in
  ml100k) src=(--data "$here/../shared/data/ml-100k/u.data");;
  synthetic) src=(--synthetic 100000,300,1000000,5);;
  *) echo "results_ldp.sh: --data ml100k or synthetic" >&2; exit 2;;
esac
[ -f "$out" ] || echo "data,protocol,eps,k,rmse,item,global,seconds" > "$out"
run() { # protocol eps k extra...
  local p=$1 e=$2 k=$3; shift 3
  if grep -q "^$data,$p,$e,$k," "$out"; then echo "  skip $data $p eps=$e k=$k (in $out)"; return; fi
  local t0=$SECONDS log
  fleet_job "$p eps=$e k=$k" --in-process "${src[@]}" --protocol "$p" --epsilon "$e" --rounds "$k" --rank 15 \
    --eval-every 0 "$@" || { echo "results_ldp.sh: run failed: $p eps=$e k=$k" >&2; exit 1; }
  log=$job_log
  local rmse item global
  rmse=$(echo "$log" | sed -n 's/^final: .* test_rmse=\([0-9.]*\) .*/\1/p')
  item=$(echo "$log" | sed -n 's/^baselines: global mean [0-9.]*, item mean \([0-9.]*\);.*/\1/p')
  global=$(echo "$log" | sed -n 's/^baselines: global mean \([0-9.]*\), item mean.*/\1/p')
  echo "$data,$p,$e,$k,$rmse,$item,$global,$((SECONDS - t0))" >> "$out"
  echo "  $data $p eps=$e k=$k: test RMSE $rmse ($((SECONDS - t0)) s)"
}
if ! grep -q "^$data,plain," "$out"; then
  t0=$SECONDS
  fleet_job "plain" --in-process "${src[@]}" --protocol plain --rounds "$plain_rounds" --rank 15 ||
    { echo "results_ldp.sh: run failed: plain" >&2; exit 1; }
  log=$job_log
  rmse=$(echo "$log" | sed -n 's/^final: .* test_rmse=\([0-9.]*\) .*/\1/p')
  echo "$data,plain,-,-,$rmse,-,-,$((SECONDS - t0))" >> "$out"
  echo "  $data plain ($plain_rounds rounds): test RMSE $rmse"
fi
for p in $protocols; do
  for e in $epss; do
    for k in $ks; do run "$p" "$e" "$k" --lr "$lr"; done
  done
done
