#!/usr/bin/env bash
# Sustained ingest (docs/benchmarks.md "Sustained ingest"): 200,000 durable reports after 1,000,000 already stored, at
# 16 and then 128 client threads (HTTPS keep-alive, each report after its device registered), load generator on the
# same machine, for
#   sqlite      one `dprec-aggregator serve` on its SQLite state;
#   postgresql  the same, on one PostgreSQL database (a throw-away cluster, tests/pg_cluster.py), behind haproxy
#               (deploy/run-local.sh): first one instance, then three on the same database (the state already holds
#               what the one-instance rows stored).
# Each row is one dprec-bench-load run (bench/load_https.c): reports/s, report latency p50/p99, the server's CPU per
# durable report (every instance's together, and each instance's own; PostgreSQL's own processes apart), reports per
# group commit (fsync).
#
#   bash bench/ingest.sh [--engine sqlite|postgresql|all] [--prefill N] [--reports N] [--build DIR] [--shuffle SEED]
#
# Defaults: all, 1000000, 200000, build, 0 (--shuffle SEED: each client thread reports for its devices in a random
# order, dprec-bench-load --shuffle, instead of in their registration order). The prefill is not measured (progress
# on stderr); on this project's 2-core machines it takes about 5 minutes on SQLite and longer on PostgreSQL. Ports:
# SQLite ephemeral; PostgreSQL run-local.sh's fixed ports (8443, 8444, 8451-8453, 8461-8463), which must be free.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
engine=all; prefill=1000000; reports=200000; build="$here/build"; shuffle=0
usage() { sed -n '13,18p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --engine) engine="$2"; shift 2 ;;
    --prefill) prefill="$2"; shift 2 ;;
    --reports) reports="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --shuffle) shuffle="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
  esac
done
case "$engine" in sqlite|postgresql|all) ;; *) usage >&2; exit 2 ;; esac
agg="$build/aggregator/dprec-aggregator"; load="$build/dprec-bench-load"
[ -x "$agg" ] && [ -x "$load" ] || { echo "ingest.sh: build dprec-aggregator and dprec-bench-load first ($build)" >&2; exit 1; }

tmp="$(mktemp -d /tmp/dprec-ingest-XXXXXX)"
pids=()
cleanup() {
  for p in "${pids[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  [ -d "$tmp/run" ] && bash "$here/deploy/run-local.sh" --stop "$tmp/run" || true
  [ -f "$tmp/pg/host" ] && python3 "$here/tests/pg_cluster.py" stop "$tmp/pg" >/dev/null 2>&1 || true
  sleep 1
  rm -rf "$tmp"
}
trap cleanup EXIT

machine() {
  echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load average $(cut -d' ' -f1-3 /proc/loadavg)"
}

# wait_gone PIDFILE...: until the processes have exited (the next start reuses their ports)
wait_gone() {
  for f in "$@"; do
    [ -f "$f" ] || continue
    for _ in $(seq 300); do kill -0 "$(cat "$f")" 2>/dev/null || break; sleep 0.1; done
  done
}

if [ "$engine" != postgresql ]; then
  echo "## SQLite: one instance, $prefill reports stored first"
  machine
  "$agg" serve --state-dir "$tmp/sqlite" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --threads 4 \
    --connections-per-address 0 --register-per-minute 0 2>"$tmp/sqlite.log" &
  pids+=($!)
  "$load" --state-dir "$tmp/sqlite" --threads 16 --reports "$reports" --prefill "$prefill" --preregister 1 \
    --shuffle "$shuffle" --seconds 600
  machine
  "$load" --state-dir "$tmp/sqlite" --threads 128 --reports "$reports" --preregister 1 --shuffle "$shuffle" \
    --seconds 600
  kill "${pids[0]}"; wait "${pids[0]}" 2>/dev/null || true; pids=()
fi

if [ "$engine" != sqlite ]; then
  python3 "$here/tests/pg_cluster.py" start "$tmp/pg" >/dev/null
  uri="postgresql://$(cat "$tmp/pg/user")@/postgres?host=$(cat "$tmp/pg/host")"
  # every client is 127.0.0.1: haproxy's per-address limits (deploy/haproxy.cfg) are for the internet, not this run
  export DPREC_PER_SOURCE=100000 DPREC_PER_SOURCE_RATE=100000000
  for n in 1 3; do
    echo "## PostgreSQL: $n instance(s) behind haproxy$([ $n = 1 ] && echo ", $prefill reports stored first" || echo ", on the same database")"
    DPREC_INSTANCES=$n bash "$here/deploy/run-local.sh" "$tmp/run" "$uri" "$agg" >/dev/null
    dirs=(--state-dir "$tmp/run/a")
    [ $n = 3 ] && dirs+=(--state-dir "$tmp/run/b" --state-dir "$tmp/run/c")
    for _ in $(seq 100); do curl -sk -o /dev/null https://127.0.0.1:8443/healthz && break; sleep 0.1; done
    sleep 3 # haproxy's health checks mark the servers up (rise 2, inter 1 s)
    first=$([ $n = 1 ] && echo "$prefill" || echo 0)
    machine
    "$load" "${dirs[@]}" --device-url https://127.0.0.1:8443 --db-cpu postgres --threads 16 --reports "$reports" --prefill "$first" \
      --preregister 1 --shuffle "$shuffle" --seconds 600
    machine
    "$load" "${dirs[@]}" --device-url https://127.0.0.1:8443 --db-cpu postgres --threads 128 --reports "$reports" --preregister 1 \
      --shuffle "$shuffle" --seconds 600
    bash "$here/deploy/run-local.sh" --stop "$tmp/run"
    wait_gone "$tmp"/run/*.pid
  done
fi
