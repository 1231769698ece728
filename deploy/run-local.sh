#!/usr/bin/env bash
# Three `dprec-aggregator serve` instances on one PostgreSQL database behind haproxy, on this machine: a way to try
# "Scaling out" (docs/operations.md) before spreading the instances over hosts. Each process starts from one config:
# DIR/a.json, DIR/b.json, DIR/c.json (written here) and deploy/haproxy.cfg (its addresses from the environment).
#
#   deploy/run-local.sh DIR POSTGRESQL_URI [AGGREGATOR]    start; devices: https://127.0.0.1:8443, admin: :8444
#   deploy/run-local.sh --stop DIR                         SIGTERM to the four processes
#
# DPREC_INSTANCES=1 starts instance a alone behind the same haproxy (its three server lines all name a): the
# one-instance row of the ingest benchmark (bench/ingest.sh). haproxy's other settings come from the environment
# too (DPREC_PER_SOURCE, DPREC_PER_SOURCE_RATE: deploy/haproxy.cfg).
#
# Instance a starts first: it creates the release-signing key, the TLS certificate and key and the admin token in
# DIR/a; b and c use a's certificate, key and token (their configs name a's files) and a copy of its signing key (the
# database refuses another). Ports: instances 8451-8453 (devices) and 8461-8463 (admin), loopback only. Logs: DIR/*.log.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
usage() { sed -n '6,11p' "$0" | sed 's/^# \{0,1\}//'; }
case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  --stop)
    [ $# -eq 2 ] || { usage >&2; exit 2; }
    for p in "$2"/*.pid; do [ -f "$p" ] && kill "$(cat "$p")" 2>/dev/null || true; done
    exit 0 ;;
esac
[ $# -ge 2 ] || { usage >&2; exit 2; }
dir="$(mkdir -p "$1" && cd "$1" && pwd)"; uri="$2"
agg="${3:-$(command -v dprec-aggregator || echo "$here/../build/aggregator/dprec-aggregator")}"
[ -x "$agg" ] || { echo "run-local.sh: no dprec-aggregator at $agg (build it, or pass its path)" >&2; exit 1; }
command -v haproxy >/dev/null || { echo "run-local.sh: haproxy is not installed (Debian package haproxy)" >&2; exit 1; }

config() { # name, device port, admin port, extra JSON
  cat > "$dir/$1.json" <<JSON
{"state_dir": "$dir/$1", "state": "$uri", "listen": "127.0.0.1:$2", "admin_listen": "127.0.0.1:$3",
 "connections_per_address": 0, "register_per_minute": 0$4}
JSON
}
start() { # name
  "$agg" serve --config "$dir/$1.json" >>"$dir/$1.log" 2>&1 &
  echo $! > "$dir/$1.pid"
  for _ in $(seq 300); do
    [ -f "$dir/$1/ports.json" ] && grep -q "\"pid\": *$(cat "$dir/$1.pid")" "$dir/$1/ports.json" && return 0
    kill -0 "$(cat "$dir/$1.pid")" 2>/dev/null || { echo "run-local.sh: instance $1 exited; see $dir/$1.log" >&2; exit 1; }
    sleep 0.1
  done
  echo "run-local.sh: instance $1 did not start in 30 s; see $dir/$1.log" >&2; exit 1
}

instances="${DPREC_INSTANCES:-3}"
case "$instances" in 1|3) ;; *) echo "run-local.sh: DPREC_INSTANCES is 1 or 3, not $instances" >&2; exit 2 ;; esac
config a 8451 8461 ""
start a
back_b=8452; back_c=8453; admin_b=8462; admin_c=8463
if [ "$instances" = 3 ]; then
  shared=", \"cert\": \"$dir/a/tls-cert.pem\", \"key\": \"$dir/a/tls-key.pem\", \"admin_token_file\": \"$dir/a/admin-token\""
  for n in b c; do
    mkdir -p -m 0700 "$dir/$n"
    cp -p "$dir/a/signing-key.pem" "$dir/$n/signing-key.pem"
  done
  config b 8452 8462 "$shared"; start b
  config c 8453 8463 "$shared"; start c
else
  back_b=8451; back_c=8451; admin_b=8461; admin_c=8461
fi

# haproxy needs two descriptors a connection and cannot pass the hard limit (ulimit -Hn): maxconn stays under it
limit="$(ulimit -Hn)"; maxconn=40000
if [ "$limit" != unlimited ] && [ $(( (limit - 200) / 2 )) -lt $maxconn ]; then
  maxconn=$(( (limit - 200) / 2 ))
fi
DPREC_MAXCONN="${DPREC_MAXCONN:-$maxconn}" DPREC_FRONT=0.0.0.0:8443 DPREC_ADMIN_FRONT=127.0.0.1:8444 \
DPREC_A=127.0.0.1:8451 DPREC_B=127.0.0.1:$back_b DPREC_C=127.0.0.1:$back_c \
DPREC_A_ADMIN=127.0.0.1:8461 DPREC_B_ADMIN=127.0.0.1:$admin_b DPREC_C_ADMIN=127.0.0.1:$admin_c \
DPREC_CA="$dir/a/tls-cert.pem" DPREC_CHECK_HOST=localhost \
  haproxy -f "$here/haproxy.cfg" -db >>"$dir/haproxy.log" 2>&1 &
echo $! > "$dir/haproxy.pid"
echo "devices: https://127.0.0.1:8443 (pin: $(cat "$dir/a/tls-pin.txt"); CA file $dir/a/tls-cert.pem)"
echo "admin:   https://127.0.0.1:8444 (token: $dir/a/admin-token); release key: $dir/a/release-key.der"
echo "stop:    $0 --stop $dir"
