#!/usr/bin/env bash
# The leaderboard: every protocol at user level, each with its default settings (docs/results.md, "Defaults"),
# at each total epsilon with delta = 1e-6, beside `plain` (no privacy), the global mean, the item mean and the
# user mean. Each configuration is one `dprec-fleet --in-process` run; rows are appended to OUT (CSV) as they
# finish, and rows already there are skipped, so an interrupted run resumes where it stopped.
#
#   bash scripts/results_all.sh [--data ml100k|ml10m[:F]] [--eps "0.5 1 2 5 10"] [--protocols "..."] [--out FILE]
#   bash scripts/results_all.sh --table [--out FILE]              the markdown tables of OUT
#   bash scripts/results_all.sh --plot FILE.png --data D [--out FILE]   RMSE against epsilon for data set D
#
# --data ml100k: MovieLens 100K (../shared/data/ml-100k/u.data, 943 users); ml10m: the MovieLens-10M-shaped fleet
# of `dprec-fleet --synthetic ml10m` (70,000 devices, 10,000 items, 10,050,000 ratings; ml10m:F scales all three).
# Protocols (default all of): bias dpals gauss-gd private-fw ldp-gd ldp-gddr ldp-rr. private-fw runs on every
# item (--items-top = the number of items: no data-dependent subset), dense where n <= 4096, else Oja. ldp-rr is
# left out of ml10m by default: its report is m d floats per device and round (400 KB at m = 10,000, d = 10: 28 GB
# a round for the fleet) and its debiased gradient cannot learn V at any size we can run (docs/results.md).
# OUT defaults to build/results-all.csv. DPREC_FLEET picks another build's dprec-fleet.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
fleet="${DPREC_FLEET:-$here/build/examples/fleet/dprec-fleet}"
. "$here/scripts/fleet_job.sh"
data=ml100k epss="0.5 1 2 5 10" protocols="" out="" table=0 plot=""
while [ $# -gt 0 ]; do
  case "$1" in
    --data) data=$2; shift 2;;
    --eps) epss=$2; shift 2;;
    --protocols) protocols=$2; shift 2;;
    --out) out=$2; shift 2;;
    --table) table=1; shift;;
    --plot) plot=$2; shift 2;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0;;
    *) echo "results_all.sh: unknown option $1 (see --help)" >&2; exit 2;;
  esac
done
out=${out:-"$here/build/results-all.csv"}

if [ "$table" = 1 ] || [ -n "$plot" ]; then
  [ -f "$out" ] || { echo "results_all.sh: no results in $out" >&2; exit 1; }
  python3 - "$out" "$data" "$plot" <<'PY'
import csv, math, subprocess, sys, tempfile
path, only, plot = sys.argv[1], sys.argv[2], sys.argv[3]
rows = list(csv.DictReader(open(path)))
order = ["bias", "dpals", "gauss-gd", "private-fw", "ldp-gd", "ldp-gddr", "ldp-rr"]
def key(p): return order.index(p) if p in order else len(order)
def sets():
    return list(dict.fromkeys(r["data"] for r in rows))
if plot:
    sel = [r for r in rows if r["data"] == only]
    if not sel: sys.exit(f"results_all.sh: no rows for {only} in {path}")
    base = sel[0]
    plain = [r for r in sel if r["protocol"] == "plain"]
    protos = sorted({r["protocol"] for r in sel if r["protocol"] != "plain"}, key=key)
    with tempfile.NamedTemporaryFile("w", suffix=".dat", delete=False) as f:
        for p in protos:
            pts = sorted((float(r["eps"]), float(r["rmse"])) for r in sel if r["protocol"] == p and r["rmse"])
            f.write(f'"{p}"\n' + "".join(f"{e} {v}\n" for e, v in pts) + "\n\n")
        dat = f.name
    lines = [f"'{dat}' index {i} using 1:2 with linespoints lw 2 pt {i + 5} title '{p}'" for i, p in enumerate(protos)]
    for label, val, dt in (("plain (no privacy)", plain[0]["rmse"] if plain else "", 1), ("item mean", base["item"], 2),
                           ("user mean (free)", base["user"], 4), ("global mean", base["global"], 3)):
        if val: lines.append(f"{float(val)} with lines dt {dt} lw 1.5 lc rgb 'gray30' title '{label}'")
    gp = ("set terminal pngcairo size 960,600 noenhanced\n"
          f"set output '{plot}'\nset logscale x\nset xtics (0.5, 1, 2, 5, 10)\n"
          f"set title 'dprec leaderboard: {only}, user-level epsilon, delta = 1e-6 (test RMSE, lower is better)'\n"
          "set xlabel 'epsilon (user level)'\nset ylabel 'test RMSE'\nset grid\nset key outside right\n"
          "plot " + ", ".join(lines) + "\n")
    subprocess.run(["gnuplot"], input=gp.encode(), check=True)
    print(f"plot: {plot}")
    sys.exit(0)
for d in sets():
    sel = [r for r in rows if r["data"] == d]
    base = sel[0]
    eps = sorted({float(r["eps"]) for r in sel if r["protocol"] != "plain"})
    plain = [r for r in sel if r["protocol"] == "plain"]
    print(f"\n**{d}** ({base['users']} users, {base['items']} items, {base['ratings']} ratings; test RMSE, user level,"
          " delta = 1e-6; in parentheses the epsilon the job's accountant published, rounded up)\n")
    print("| protocol | model | " + " | ".join(f"ε = {e:g}" for e in eps) + " |")
    print("|---|---|" + "---|" * len(eps))
    for p in sorted({r["protocol"] for r in sel if r["protocol"] != "plain"}, key=key):
        cells = []
        model = ""
        for e in eps:
            m = [r for r in sel if r["protocol"] == p and float(r["eps"]) == e]
            if m and m[-1]["rmse"]:
                cells.append(f"{float(m[-1]['rmse']):.4f} ({m[-1]['eps_published']})")
                model = m[-1]["model"]
            else:
                cells.append("—")
        print(f"| {p} | {model} | " + " | ".join(cells) + " |")
    if plain: print(f"| plain (no privacy) | none | " + " | ".join(f"{float(plain[-1]['rmse']):.4f}" for _ in eps) + " |")
    for label, k in (("item mean (no privacy)", "item"), ("user mean (each device's own, free)", "user"),
                     ("global mean (no privacy)", "global")):
        print(f"| {label} | — | " + " | ".join(f"{float(base[k]):.4f}" for _ in eps) + " |")
PY
  exit 0
fi

case "$data" in
  ml100k) src=(--data "$here/../shared/data/ml-100k/u.data"); default_protocols="bias dpals gauss-gd private-fw ldp-gd ldp-gddr ldp-rr";;
  ml10m|ml10m:*) src=(--synthetic "$data"); default_protocols="bias dpals gauss-gd private-fw ldp-gd ldp-gddr";;
  *) echo "results_all.sh: --data ml100k or ml10m[:F] (see --help)" >&2; exit 2;;
esac
protocols=${protocols:-$default_protocols}
[ -f "$out" ] || echo "data,protocol,eps,rmse,eps_published,delta,model,rounds,seconds,users,items,ratings,global,item,user" > "$out"

run() { # protocol eps
  local p=$1 e=$2 extra=()
  if grep -q "^$data,$p,$e," "$out"; then return; fi
  case "$p" in
    plain) extra=(--compare none);;
    private-fw) extra=(--compare none --items-top 16777216) # every item (the fleet caps it to m: no subset)
                case "$data" in ml10m*) extra+=(--variant oja);; esac;; # dense takes n <= 4096 items
    *) extra=(--compare none);;
  esac
  local t0=$SECONDS
  if [ "$p" = plain ]; then
    fleet_job "$data plain" "${src[@]}" --protocol plain --in-process --eval-every 0 "${extra[@]}" || return 1
  else
    fleet_job "$data $p eps=$e" "${src[@]}" --protocol "$p" --epsilon "$e" --delta 1e-6 --in-process --eval-every 0 \
      "${extra[@]}" || return 1
  fi
  local log=$job_log last rmse pub model rounds users items ratings glob item user
  last=$(printf '%s\n' "$log" | tail -1)
  rmse=$(printf '%s\n' "$last" | sed -n 's/.*test_rmse=\([^ ]*\).*/\1/p')
  pub=$(printf '%s\n' "$last" | sed -n 's/.*epsilon=\([^ ]*\).*/\1/p')
  rounds=$(printf '%s\n' "$last" | sed -n 's/.*rounds=\([^ ]*\).*/\1/p')
  model=$(printf '%s\n' "$log" | sed -n 's/^guarantee: job [0-9]* ([^)]*): user-level \([a-z]*\) DP.*/\1/p' | head -1)
  [ -n "$model" ] || model=none
  read -r users items ratings < <(printf '%s\n' "$log" | sed -n 's/^data: [^:]*: \([0-9]*\) users, \([0-9]*\) items, \([0-9]*\) ratings.*/\1 \2 \3/p')
  glob=$(printf '%s\n' "$log" | sed -n 's/^baselines: global mean [0-9.]* -> test RMSE \([0-9.]*\);.*/\1/p')
  item=$(printf '%s\n' "$log" | sed -n 's/^baselines: .*item mean test RMSE \([0-9.]*\);.*/\1/p')
  user=$(printf '%s\n' "$log" | sed -n 's/^baselines: .*user mean test RMSE \([0-9.]*\) .*/\1/p')
  echo "$data,$p,$e,$rmse,$pub,1e-06,$model,$rounds,$((SECONDS - t0)),$users,$items,$ratings,$glob,$item,$user" >> "$out"
  echo "$data $p eps=$e ($((SECONDS - t0)) s): $last"
}

run plain inf
for p in $protocols; do
  for e in $epss; do run "$p" "$e"; done
done
