#!/usr/bin/env bash
# A secure-aggregation job's rounds on each state (docs/benchmarks.md "Secure rounds on each state"): the same fleet job
# (dprec-fleet --secure-agg, gauss-gd, synthetic data, HTTPS) against
#   sqlite       the fleet's own `dprec-aggregator serve` on SQLite (the round in that instance's memory);
#   postgresql   `serve` on a throw-away PostgreSQL database (tests/pg_cluster.py) behind haproxy
#                (deploy/run-local.sh): one instance, then three (a round's log in the database, which every instance
#                applies; each step message one commit under the job's row).
# Each row is the fleet's own figures: seconds per round (its per-round lines; the devices' SecAgg+ crypto runs on the
# same machine and is most of it) and the job's wall time. Accuracy is not this benchmark's (docs/results.md).
#
#   bash bench/secure_state.sh [--devices N] [--rounds R] [--build DIR]
#
# Defaults: 200 devices, 2 rounds, build. Ports: PostgreSQL rows use run-local.sh's fixed ports (8443, 8444,
# 8451-8453, 8461-8463), which must be free.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
devices=200; rounds=2; build="$here/build"
usage() { sed -n '11,14p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --devices) devices="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
  esac
done
agg="$build/aggregator/dprec-aggregator"; fleet="$build/examples/fleet/dprec-fleet"
[ -x "$agg" ] && [ -x "$fleet" ] || { echo "secure_state.sh: build dprec-aggregator and dprec-fleet first ($build)" >&2; exit 1; }

tmp="$(mktemp -d /tmp/dprec-secure-state-XXXXXX)"
cleanup() {
  [ -d "$tmp/run" ] && bash "$here/deploy/run-local.sh" --stop "$tmp/run" || true
  [ -f "$tmp/pg/host" ] && python3 "$here/tests/pg_cluster.py" stop "$tmp/pg" >/dev/null 2>&1 || true
  sleep 1
  rm -rf "$tmp"
}
trap cleanup EXIT

job=(--synthetic "$devices,100,$((devices * 20))" --protocol gauss-gd --secure-agg --rounds "$rounds" --compare none
     --threads 4 --seed 1)
# the fleet's per-round lines ("  round  devices  rmse  ...  seconds") and its final line, as one row
row() { # label, fleet output file
  local secs
  secs=$(awk '$1 ~ /^[0-9]+$/ && $1 >= 1 && NF == 5 {printf "%s%s", sep, $5; sep=", "}' "$2")
  printf '| %s | %s | %s |\n' "$1" "$secs" "$(sed -n 's/.*wall time \([0-9.]* s\).*/\1/p' "$2")"
}
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| state | seconds per round | wall time |"
echo "|---|---|---|"
"$fleet" "${job[@]}" >"$tmp/sqlite.out" 2>"$tmp/sqlite.err" || { cat "$tmp/sqlite.err" >&2; exit 1; }
row "SQLite, one instance" "$tmp/sqlite.out"

python3 "$here/tests/pg_cluster.py" start "$tmp/pg" >/dev/null
uri="postgresql://$(cat "$tmp/pg/user")@/postgres?host=$(cat "$tmp/pg/host")"
export DPREC_PER_SOURCE=100000 DPREC_PER_SOURCE_RATE=100000000 # every client is 127.0.0.1
for n in 1 3; do
  DPREC_INSTANCES=$n bash "$here/deploy/run-local.sh" "$tmp/run" "$uri" "$agg" >/dev/null
  for _ in $(seq 100); do curl -sk -o /dev/null https://127.0.0.1:8443/healthz && break; sleep 0.1; done
  sleep 3 # haproxy's health checks mark the servers up (rise 2, inter 1 s)
  a="$tmp/run/a"
  "$fleet" "${job[@]}" --aggregator https://127.0.0.1:8443 --admin-url https://127.0.0.1:8444 \
    --admin-token "$a/admin-token" --release-key "$a/release-key.der" --cacert "$a/tls-cert.pem" \
    >"$tmp/pg$n.out" 2>"$tmp/pg$n.err" || { cat "$tmp/pg$n.err" >&2; exit 1; }
  row "PostgreSQL, $n instance(s) behind haproxy" "$tmp/pg$n.out"
  bash "$here/deploy/run-local.sh" --stop "$tmp/run"
  for p in "$tmp"/run/*.pid; do for _ in $(seq 300); do kill -0 "$(cat "$p")" 2>/dev/null || break; sleep 0.1; done; done

done
