#!/usr/bin/env bash
# The leaderboard: every protocol at user level, each with its default settings (docs/results.md, "Defaults"),
# at each total epsilon with delta = 1e-6, beside `plain` (no privacy), the global mean, the item mean and the
# user mean. Each configuration is one `dprec-fleet --in-process` run; rows are appended to OUT (CSV) as they
# finish, and rows already there are skipped, so an interrupted run resumes where it stopped.
#
#   bash scripts/results_all.sh [--data ml100k|ml10m[:F]|small|app2000|synthetic] [--eps "0.5 1 2 5 10"] [--protocols "..."] [--out FILE]
#   bash scripts/results_all.sh --table [--out FILE]          the markdown tables of OUT
#   bash scripts/results_all.sh --plot FILE.png [--out FILE]  RMSE against epsilon, one panel per data set
#   bash scripts/results_all.sh --publish [--out FILE]        both into docs/ (the block between the
#                                                             results-all markers of docs/results.md,
#                                                             docs/leaderboard.png, docs/results-all.csv)
#
# --data ml100k: MovieLens 100K (../shared/data/ml-100k/u.data, 943 users); ml10m: the MovieLens-10M-shaped fleet
# of `dprec-fleet --synthetic ml10m` (70,000 devices, 10,000 items, 10,050,000 ratings; ml10m:F scales all three);
# small and app2000: the small apps of `dprec-fleet --synthetic small` (600 devices, 9,700 items, 100,000 half-star
# ratings, like the small MovieLens set) and `--synthetic app2000` (2,000 devices, 2,500 items, 50,000 ratings);
# synthetic: the 100,000-device fleet of the per-protocol sections (`--synthetic 100000,300,1000000,5`).
# Protocols (default all of): bias dpals gauss-gd private-fw sgld ldp-gd ldp-gddr ldp-rr. sgld's epsilon is a
# posterior-sampling heuristic (its model column says so; docs/privacy.md "sgld"). private-fw runs on every
# item (--items-top = the number of items: no data-dependent subset), dense where n <= 4096, else Oja. ldp-rr is
# left out of ml10m by default: its report is m d floats per device and round (400 KB at m = 10,000, d = 10: 28 GB
# a round for the fleet) and its debiased gradient cannot learn V at any size we can run (docs/results.md).
# P+bias (gauss-gd+bias, ldp-gd+bias, ldp-gddr+bias, ldp-rr+bias; not run by default) is protocol P on the private
# bias model (`dprec-fleet --bias-base F`): a bias job at P's d spends the share F of the budget first, on the same
# devices, and P's job starts from its item biases with the rest; the epsilon is the two jobs' sum. F = 0.5 for
# gauss-gd, 0.8 for the local protocols, which learn next to nothing of their own here (docs/results.md "Defaults").
# Its model column is "joint + P's": the bias job trusts the aggregator.
# OUT defaults to build/results-all.csv. DPREC_FLEET picks another build's dprec-fleet.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
fleet="${DPREC_FLEET:-$here/build/examples/fleet/dprec-fleet}"
. "$here/scripts/fleet_job.sh"
data=ml100k epss="0.5 1 2 5 10" protocols="" out="" table=0 plot="" publish=0
while [ $# -gt 0 ]; do
  case "$1" in
    --data) data=$2; shift 2;;
    --eps) epss=$2; shift 2;;
    --protocols) protocols=$2; shift 2;;
    --out) out=$2; shift 2;;
    --table) table=1; shift;;
    --plot) plot=$2; shift 2;;
    --publish) publish=1; shift;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0;;
    *) echo "results_all.sh: unknown option $1 (see --help)" >&2; exit 2;;
  esac
done
out=${out:-"$here/build/results-all.csv"}

if [ "$table" = 1 ] || [ -n "$plot" ] || [ "$publish" = 1 ]; then
  [ -f "$out" ] || { echo "results_all.sh: no results in $out" >&2; exit 1; }
  if [ "$publish" = 1 ]; then plot="$here/docs/leaderboard.png"; fi
  md=$(python3 - "$out" "$plot" <<'PY'
import csv, subprocess, sys, tempfile
path, plot = sys.argv[1], sys.argv[2]
rows = list(csv.DictReader(open(path)))
order = ["bias", "dpals", "gauss-gd", "gauss-gd+bias", "private-fw", "sgld", "ldp-gd", "ldp-gd+bias", "ldp-gddr",
         "ldp-gddr+bias", "ldp-rr", "ldp-rr+bias"]
def key(p): return order.index(p) if p in order else len(order)
sets = list(dict.fromkeys(r["data"] for r in rows))
if plot:
    cmds = ["set terminal pngcairo size 1400,%d noenhanced" % (520 * len(sets)), f"set output '{plot}'",
            f"set multiplot layout {len(sets)},1", "set logscale x", "set xrange [0.4:12]", "set xtics (0.5, 1, 2, 5, 10)",
            "set xlabel 'epsilon (user level)'", "set ylabel 'test RMSE'", "set grid", "set key outside right"]
    for d in sets:
        sel = [r for r in rows if r["data"] == d]
        base, plain = sel[0], [r for r in sel if r["protocol"] == "plain"]
        protos = sorted({r["protocol"] for r in sel if r["protocol"] != "plain"}, key=key)
        f = tempfile.NamedTemporaryFile("w", suffix=".dat", delete=False)
        for p in protos:
            pts = sorted((float(r["eps"]), float(r["rmse"])) for r in sel if r["protocol"] == p and r["rmse"])
            f.write("".join(f"{e} {v}\n" for e, v in pts) + "\n\n")
        f.close()
        # the colour and point of a protocol are its place in `order`, the same in every panel; P+bias is drawn
        # dashed in P's colour, with open points
        bases = [q for q in order if not q.endswith("+bias")]
        colours = ["#9400d3", "#009e73", "#56b4e9", "#e69f00", "#0072b2", "#e51e10", "#000000", "#8b4513"]
        def style(p):
            b = p[:-len("+bias")] if p.endswith("+bias") else p
            i = bases.index(b) if b in bases else len(bases)
            return (f"lc rgb '{colours[i % len(colours)]}' pt {i + 5}" + (" dt 2 pointsize 1.3" if b != p else ""))
        lines = [f"'{f.name}' index {i} using 1:2 with linespoints lw 2 {style(p)} title '{p}'"
                 for i, p in enumerate(protos)]
        for label, val, dt in (("plain (no privacy)", plain[-1]["rmse"] if plain else "", 1), ("item mean", base["item"], 2),
                               ("user mean (free)", base["user"], 4), ("global mean", base["global"], 3)):
            if val: lines.append(f"{float(val)} with lines dt {dt} lw 1.5 lc rgb 'gray30' title '{label}'")
        cmds.append(f"set title '{d} ({base['users']} users, {base['items']} items): test RMSE against user-level epsilon,"
                    " delta = 1e-6 (lower is better)'")
        cmds.append("plot " + ", ".join(lines))
    cmds.append("unset multiplot")
    subprocess.run(["gnuplot"], input=("\n".join(cmds) + "\n").encode(), check=True)
for d in sets:
    sel = [r for r in rows if r["data"] == d]
    base = sel[0]
    eps = sorted({float(r["eps"]) for r in sel if r["protocol"] != "plain"})
    plain = [r for r in sel if r["protocol"] == "plain"]
    dnote = " (sgld: 0 published, its caveat below)" if any(r["protocol"] == "sgld" for r in sel) else ""
    print(f"\n**{d}** ({base['users']} users, {base['items']} items, {base['ratings']} ratings; test RMSE, user level,"
          f" delta = 1e-6{dnote}; in parentheses the epsilon the job's accountant published, rounded up)\n")
    print("| protocol | model | " + " | ".join(f"ε = {e:g}" for e in eps) + " |")
    print("|---|---|" + "---|" * len(eps))
    for p in sorted({r["protocol"] for r in sel if r["protocol"] != "plain"}, key=key):
        cells, model = [], ""
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
    if any(r["protocol"] == "sgld" for r in sel):
        print("\nsgld's epsilon is a posterior-sampling heuristic: it holds for an exact posterior sample (delta = 0); the"
              " SGLD chain's sample gives (epsilon, (1 + e^epsilon) delta') with delta' its unknown distance to the target"
              " (docs/privacy.md, \"sgld\").")
PY
)
  if [ "$publish" = 1 ]; then # the block between the markers of docs/results.md, and the raw rows beside it
    MD="$md" python3 - "$here/docs/results.md" <<'PY'
import os, sys
p = sys.argv[1]
s = open(p).read()
a, b = "<!-- results-all -->\n", "<!-- /results-all -->"
i, j = s.index(a) + len(a), s.index(b)
open(p, "w").write(s[:i] + os.environ["MD"].strip("\n") + "\n" + s[j:])
PY
    cp "$out" "$here/docs/results-all.csv"
    echo "results_all.sh: docs/results.md, docs/leaderboard.png and docs/results-all.csv written"
  else
    [ "$table" = 1 ] && printf '%s\n' "$md"
    [ -n "$plot" ] && echo "plot: $plot"
  fi
  exit 0
fi

case "$data" in
  ml100k) src=(--data "$here/../shared/data/ml-100k/u.data"); default_protocols="bias dpals gauss-gd private-fw sgld ldp-gd ldp-gddr ldp-rr";;
  ml10m|ml10m:*) src=(--synthetic "$data"); default_protocols="bias dpals gauss-gd private-fw sgld ldp-gd ldp-gddr";;
  small|app2000) src=(--synthetic "$data"); default_protocols="bias dpals gauss-gd";;
  synthetic) src=(--synthetic 100000,300,1000000,5); default_protocols="bias dpals gauss-gd private-fw sgld ldp-gd ldp-gddr";;
  *) echo "results_all.sh: --data ml100k, ml10m[:F], small, app2000 or synthetic (see --help)" >&2; exit 2;;
esac
protocols=${protocols:-$default_protocols}
[ -f "$out" ] || echo "data,protocol,eps,rmse,eps_published,delta,model,rounds,seconds,users,items,ratings,global,item,user" > "$out"

run() { # protocol eps
  local p=$1 e=$2 extra=() proto=$1
  if grep -q "^$data,$p,$e," "$out"; then return; fi
  case "$p" in # P+bias: P on the private bias model, at the share of the budget chosen for it (the head of this file)
    gauss-gd+bias) proto=gauss-gd; extra=(--bias-base 0.5);;
    ldp-*+bias) proto=${p%+bias}; extra=(--bias-base 0.8);;
    *+bias) echo "results_all.sh: $p: only gauss-gd and the local protocols take the private bias model as a base" >&2
            return 1;;
  esac
  case "$p" in
    plain) extra=(--compare none);;
    private-fw) extra=(--compare none --items-top 16777216) # every item (the fleet caps it to m: no subset)
                case "$data" in ml10m*) extra+=(--variant oja);; esac;; # dense takes n <= 4096 items
    *) extra+=(--compare none);;
  esac
  local t0=$SECONDS
  if [ "$p" = plain ]; then
    fleet_job "$data plain" "${src[@]}" --protocol plain --in-process --eval-every 0 "${extra[@]}" || return 1
  else
    fleet_job "$data $p eps=$e" "${src[@]}" --protocol "$proto" --epsilon "$e" --delta 1e-6 --in-process --eval-every 0 \
      "${extra[@]}" || return 1
  fi
  local log=$job_log last rmse pub model rounds users items ratings glob item user
  last=$(printf '%s\n' "$log" | grep '^final: ' | tail -1) # not tail -1: a progress line on stderr may land after it
  rmse=$(printf '%s\n' "$last" | sed -n 's/.*test_rmse=\([^ ]*\).*/\1/p')
  pub=$(printf '%s\n' "$last" | sed -n 's/.*epsilon=\([^ ]*\).*/\1/p')
  rounds=$(printf '%s\n' "$last" | sed -n 's/.*rounds=\([^ ]*\).*/\1/p')
  delta=$(printf '%s\n' "$last" | sed -n 's/.* delta=\([^ ]*\).*/\1/p') # the job's (sgld: 0, its delta' unknown)
  model=$(printf '%s\n' "$log" | sed -n 's/^guarantee: job [0-9]* ([^)]*): user-level \([a-z -]*\) DP.*/\1/p' | head -1)
  [ -n "$model" ] || model=none
  if printf '%s\n' "$log" | grep -q '^guarantee with the base job: '; then model="joint + $model"; fi
  read -r users items ratings < <(printf '%s\n' "$log" | sed -n 's/^data: .*: \([0-9]*\) users, \([0-9]*\) items, \([0-9]*\) ratings.*/\1 \2 \3/p')
  glob=$(printf '%s\n' "$log" | sed -n 's/^baselines: global mean [0-9.]* -> test RMSE \([0-9.]*\);.*/\1/p')
  item=$(printf '%s\n' "$log" | sed -n 's/^baselines: .*item mean test RMSE \([0-9.]*\);.*/\1/p')
  user=$(printf '%s\n' "$log" | sed -n 's/^baselines: .*user mean test RMSE \([0-9.]*\) .*/\1/p')
  echo "$data,$p,$e,$rmse,$pub,${delta:-1e-06},$model,$rounds,$((SECONDS - t0)),$users,$items,$ratings,$glob,$item,$user" >> "$out"
  echo "$data $p eps=$e ($((SECONDS - t0)) s): $last"
}

for p in $protocols; do
  for e in $epss; do run "$p" "$e"; done
done
run plain inf # last: the costliest baseline (12 rounds of every device's ratings) waits for the private rows
