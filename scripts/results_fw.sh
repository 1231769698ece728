#!/usr/bin/env bash
# Seed 002's experiment for dprec's private-fw: test RMSE on the n most-rated items at each total epsilon,
# dense and Oja, beside plain on the same item subset, item mean and global mean. Each configuration is one
# `dprec-fleet --in-process` run; rows are appended to OUT (CSV) as they finish (rows already there are
# skipped). `--table` prints the markdown table of OUT.
#
#   bash scripts/results_fw.sh [--data ml100k|synthetic|PATH] [--eps "0.1 0.5 1 2 5"] [--iterations T]
#                              [--items-top N] [--max-ratings XI] [--out FILE]
#   bash scripts/results_fw.sh --table [--out FILE]
#
# Defaults: ml-100k, n = 400, xi = 80, delta = 1e-6 (seed 002's experiments), T = 10; about 7 s a run on a
# 2-core x86_64 VM. synthetic = 100,000 devices, 300 items, 1,000,000 ratings, rank 5, with n = all 300
# items; 3 to 6 min a run there. PATH = another file in ml-100k's u.data format.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
fleet="${DPREC_FLEET:-$here/build/examples/fleet/dprec-fleet}"  # DPREC_FLEET: another build's fleet
data=ml100k epss="0.1 0.5 1 2 5" iters=10 top="" xi=80 out="" table=0
while [ $# -gt 0 ]; do
  case "$1" in
    --data) data=$2; shift 2;;
    --eps) epss=$2; shift 2;;
    --iterations) iters=$2; shift 2;;
    --items-top) top=$2; shift 2;;
    --max-ratings) xi=$2; shift 2;;
    --out) out=$2; shift 2;;
    --table) table=1; shift;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 0;; # the comment block above
    *) echo "results_fw.sh: unknown option $1 (see --help)" >&2; exit 2;;
  esac
done
out=${out:-"$here/build/results-fw.csv"}

if [ "$table" = 1 ]; then
  [ -f "$out" ] || { echo "results_fw.sh: no results in $out" >&2; exit 1; }
  python3 - "$out" <<'PY'
import csv, sys
allrows = list(csv.DictReader(open(sys.argv[1])))
for data in dict.fromkeys(r["data"] for r in allrows):
  rows = [r for r in allrows if r["data"] == data]
  eps = sorted({float(r["eps"]) for r in rows if r["variant"] not in ("plain",)})
  fmt = lambda e: ("%g" % e)
  print(f"\n**{data}** (n = {rows[0]['items_top']} items, xi = {rows[0]['xi']}, T = {rows[0]['iterations']})\n")
  print("| method | " + " | ".join(f"ε = {fmt(e)}" for e in eps) + " |")
  print("|---|" + "---|" * len(eps))
  for v in ("dense", "oja"):
      got = {float(r["eps"]): r for r in rows if r["variant"] == v}
      print(f"| private-fw {v} (ε published) | " + " | ".join(
          f'{got[e]["rmse"]} ({got[e]["eps_published"]})' if e in got else "—" for e in eps) + " |")
  base = rows[0]
  for r in rows:
      if r["variant"] == "plain":
          print(f'| plain (no privacy), same subset | ' + " | ".join(r["rmse"] for _ in eps) + " |")
  print("| item mean | " + " | ".join(base["item"] for _ in eps) + " |")
  print("| global mean | " + " | ".join(base["global"] for _ in eps) + " |")
PY
  exit 0
fi

[ -x "$fleet" ] || { echo "results_fw.sh: build first (cmake --build build)" >&2; exit 1; }
case "$data" in
  ml100k) src=(--data "$here/../shared/data/ml-100k/u.data"); top=${top:-400};;
  synthetic) src=(--synthetic 100000,300,1000000,5); top=${top:-300};;
  *) [ -f "$data" ] || { echo "results_fw.sh: --data ml100k, synthetic or a u.data file" >&2; exit 2; }
     src=(--data "$data"); top=${top:-400};;
esac
[ -f "$out" ] || echo "data,variant,eps,iterations,items_top,xi,rmse,eps_published,item,global" > "$out"
run() { # variant eps
  local v=$1 e=$2
  if grep -q "^$data,$v,$e,$iters,$top,$xi," "$out"; then return; fi
  local log
  if [ "$v" = plain ]; then
    log=$(nice "$fleet" "${src[@]}" --protocol plain --items-top "$top" --rounds 12 --in-process --threads 2 --eval-every 0)
  else
    log=$(nice "$fleet" "${src[@]}" --protocol private-fw --variant "$v" --items-top "$top" --max-ratings "$xi" \
          --delta 1e-6 --epsilon "$e" --iterations "$iters" --in-process --threads 2 --eval-every 0)
  fi
  local last rmse pub item glob
  last=$(printf '%s\n' "$log" | tail -1)
  rmse=$(printf '%s\n' "$last" | sed -n 's/.*test_rmse=\([^ ]*\).*/\1/p')
  pub=$(printf '%s\n' "$last" | sed -n 's/.*epsilon=\([^ ]*\).*/\1/p')
  glob=$(printf '%s\n' "$log" | sed -n 's/^baselines: global mean [0-9.]* -> test RMSE \([0-9.]*\);.*/\1/p')
  item=$(printf '%s\n' "$log" | sed -n 's/^baselines: .*item mean test RMSE \([0-9.]*\);.*/\1/p')
  echo "$data,$v,$e,$iters,$top,$xi,$rmse,$pub,$item,$glob" >> "$out"
  echo "$data $v eps=$e: $last"
}
run plain 0
for v in dense oja; do for e in $epss; do run "$v" "$e"; done; done
