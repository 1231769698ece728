#!/usr/bin/env bash
# dpmf (seed 004) against epsilon, its three modes beside plain, the global, item and user means and the other
# protocols at the same epsilon (docs/results.md, "dpmf"). Each configuration is one `dprec-fleet --in-process` run
# (the relay modes run an in-process relay beside the in-process aggregator); rows are appended to OUT (CSV, the
# columns of scripts/results_all.sh plus the test MAE), and rows already there are skipped, so an interrupted run
# resumes where it stopped.
#
#   bash scripts/results_dpmf.sh [--data ml100k|synthetic] [--eps "1 5 10"] [--protocols "..."] [--out FILE]
#   bash scripts/results_dpmf.sh --table [--out FILE]      the markdown tables of OUT
#
# --data ml100k: MovieLens 100K (../shared/data/ml-100k/u.data, 943 users); synthetic: 100,000 devices, 300 items,
# 1,000,000 ratings, true rank 5 (the shape of the other 100,000-device tables). Protocols (default all of):
# dpmf-trusted dpmf-relay dpmf-dynamic bias dpals gauss-gd, each with its own defaults; dpmf's budget is pure
# (delta 0), the others' delta is 1e-6. The MAE column gives seed 004's metric: the increase of the mean absolute
# prediction error over the non-private model (plain). OUT defaults to docs/results-dpmf.csv.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
fleet="${DPREC_FLEET:-$here/build/examples/fleet/dprec-fleet}"
. "$here/scripts/fleet_job.sh"
data=ml100k epss="1 5 10" protocols="dpmf-trusted dpmf-relay dpmf-dynamic bias dpals gauss-gd" out="" table=0
while [ $# -gt 0 ]; do
  case "$1" in
    --data) data=$2; shift 2;;
    --eps) epss=$2; shift 2;;
    --protocols) protocols=$2; shift 2;;
    --out) out=$2; shift 2;;
    --table) table=1; shift;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0;;
    *) echo "results_dpmf.sh: unknown option $1 (see --help)" >&2; exit 2;;
  esac
done
out=${out:-"$here/docs/results-dpmf.csv"}

if [ "$table" = 1 ]; then
  [ -f "$out" ] || { echo "results_dpmf.sh: no results in $out" >&2; exit 1; }
  python3 - "$out" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
order = ["dpmf-trusted", "dpmf-relay", "dpmf-dynamic", "bias", "dpals", "gauss-gd"]
for d in dict.fromkeys(r["data"] for r in rows):
    sel = [r for r in rows if r["data"] == d]
    base = sel[0]
    plain = [r for r in sel if r["protocol"] == "plain"]
    pm = float(plain[-1]["mae"]) if plain and plain[-1]["mae"] else None
    eps = sorted({float(r["eps"]) for r in sel if r["protocol"] != "plain"})
    print(f"\n**{d}** ({base['users']} users, {base['items']} items, {base['ratings']} ratings; test RMSE, user level; "
          "in parentheses the increase of the test MAE over plain's, seed 004's metric)\n")
    print("| protocol | model | " + " | ".join(f"ε = {e:g}" for e in eps) + " |")
    print("|---|---|" + "---|" * len(eps))
    for p in [p for p in order if any(r["protocol"] == p for r in sel)]:
        cells, model = [], ""
        for e in eps:
            m = [r for r in sel if r["protocol"] == p and float(r["eps"]) == e]
            if m and m[-1]["rmse"]:
                inc = f" (+{float(m[-1]['mae']) - pm:.4f})" if pm is not None and m[-1]["mae"] else ""
                cells.append(f"{float(m[-1]['rmse']):.4f}{inc}")
                model = m[-1]["model"] + (", δ = 0" if p.startswith("dpmf") else ", δ = 1e-6")
            else:
                cells.append("—")
        print(f"| {p} | {model} | " + " | ".join(cells) + " |")
    if plain:
        print("| plain (no privacy) | none | " + " | ".join(f"{float(plain[-1]['rmse']):.4f} (MAE {pm:.4f})" for _ in eps) + " |")
    for label, k in (("item mean (no privacy)", "item"), ("user mean (each device's own, free)", "user"),
                     ("global mean (no privacy)", "global")):
        print(f"| {label} | — | " + " | ".join(f"{float(base[k]):.4f}" for _ in eps) + " |")
PY
  exit 0
fi

case "$data" in
  ml100k) src=(--data "$here/../shared/data/ml-100k/u.data");;
  synthetic) src=(--synthetic 100000,300,1000000,5);;
  *) echo "results_dpmf.sh: --data ml100k or synthetic (see --help)" >&2; exit 2;;
esac
[ -f "$out" ] || echo "data,protocol,eps,rmse,eps_published,delta,model,rounds,seconds,users,items,ratings,global,item,user,mae" > "$out"

run() { # protocol eps
  local p=$1 e=$2 args=()
  if grep -q "^$data,$p,$e," "$out"; then return; fi
  case "$p" in
    plain) args=(--protocol plain);;
    dpmf-*) args=(--protocol dpmf --dpmf-mode "${p#dpmf-}" --epsilon "$e");;
    *) args=(--protocol "$p" --epsilon "$e" --delta 1e-6);;
  esac
  local t0=$SECONDS
  fleet_job "$data $p eps=$e" "${src[@]}" "${args[@]}" --in-process --eval-every 0 --compare none || return 1
  local log=$job_log last rmse pub model rounds users items ratings glob item user mae delta
  last=$(printf '%s\n' "$log" | grep '^final: ' | tail -1) # not tail -1: a progress line on stderr may land after it
  rmse=$(printf '%s\n' "$last" | sed -n 's/.*test_rmse=\([^ ]*\).*/\1/p')
  pub=$(printf '%s\n' "$last" | sed -n 's/.*epsilon=\([^ ]*\).*/\1/p')
  delta=$(printf '%s\n' "$last" | sed -n 's/.*delta=\([^ ]*\).*/\1/p')
  rounds=$(printf '%s\n' "$last" | sed -n 's/.*rounds=\([^ ]*\).*/\1/p')
  model=$(printf '%s\n' "$log" | sed -n 's/^guarantee: job [0-9]* ([^)]*): user-level \([a-z]*\) DP.*/\1/p' | head -1)
  [ -n "$model" ] || model=none
  mae=$(printf '%s\n' "$log" | sed -n 's/^mae: test MAE \([0-9.]*\) .*/\1/p')
  read -r users items ratings < <(printf '%s\n' "$log" | sed -n 's/^data: [^:]*: \([0-9]*\) users, \([0-9]*\) items, \([0-9]*\) ratings.*/\1 \2 \3/p')
  glob=$(printf '%s\n' "$log" | sed -n 's/^baselines: global mean [0-9.]* -> test RMSE \([0-9.]*\);.*/\1/p')
  item=$(printf '%s\n' "$log" | sed -n 's/^baselines: .*item mean test RMSE \([0-9.]*\);.*/\1/p')
  user=$(printf '%s\n' "$log" | sed -n 's/^baselines: .*user mean test RMSE \([0-9.]*\) .*/\1/p')
  echo "$data,$p,$e,$rmse,$pub,$delta,$model,$rounds,$((SECONDS - t0)),$users,$items,$ratings,$glob,$item,$user,$mae" >> "$out"
  echo "$data $p eps=$e ($((SECONDS - t0)) s): $last"
}

run plain inf
for p in $protocols; do
  for e in $epss; do run "$p" "$e"; done
done
