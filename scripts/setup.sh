#!/usr/bin/env bash
# Installs everything dprec needs on a fresh Debian 12 machine (run as root, or with sudo available).
#   bash scripts/setup.sh            native build + tests + cross toolchains (arm64, armhf) and qemu-user
#   bash scripts/setup.sh --native   native build + tests only
set -euo pipefail

native_only=0
case "${1:-}" in
  --native) native_only=1 ;;
  -h|--help) sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "setup.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
esac

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive

native_pkgs=(build-essential cmake pkg-config ca-certificates python3 prometheus
             libmbedtls-dev libcjson-dev libcurl4-openssl-dev libcmocka-dev
             libmicrohttpd-dev libsqlite3-dev libgnutls28-dev liblapacke-dev binutils gnuplot-nox
             libpq-dev postgresql  # the aggregator's PostgreSQL engine (libpq) and the server its tests start (initdb, pg_ctl)
             haproxy  # deploy/haproxy.cfg in front of several instances, and the test that runs it (tests/agg_multi_haproxy.py)
             clang libclang-rt-dev python3  # clang + libclang-rt-dev: the libFuzzer targets (scripts/fuzz.sh)
             openjdk-17-jdk-headless junit4)  # the Java/Kotlin binding (bindings/jvm) and its JUnit 4 test
# The cross gcc packages bring their own libc sysroots; only the libraries we link come from multiarch.
# Cross compilers plus their libc sysroots (only Recommends of gcc-*-linux-gnu*); the libraries we link
# come from Debian multiarch (:arm64/:armhf), whose libc6 also gives qemu-user its dynamic loader.
# The device's HTTPS transport on the targets is mbedTLS's own (platform/mbedtls), in libmbedtls-dev: libcurl's
# :arm64/:armhf packages are not installed (they need every OpenSSL, Kerberos and SASL package in lockstep with the
# native ones, which a security update out of step breaks; docs/sdk.md, "Transports").
cross_pkgs=(gcc-aarch64-linux-gnu gcc-arm-linux-gnueabihf qemu-user libc6-dev-arm64-cross libc6-dev-armhf-cross
            libmbedtls-dev:arm64 libcmocka-dev:arm64
            libmbedtls-dev:armhf libcmocka-dev:armhf)

if [ "$native_only" -eq 0 ]; then
  for arch in arm64 armhf; do
    dpkg --print-foreign-architectures | grep -qx "$arch" || $SUDO dpkg --add-architecture "$arch"
  done
fi

# A mirror that is mid-sync can fail one index (seen for bookworm-security armhf); the install below
# still fails loudly if a package we need cannot be found, so a partial update is not fatal here.
update_ok=0
for attempt in 1 2 3; do
  if $SUDO apt-get update -q; then update_ok=1; break; fi
  echo "setup.sh: apt-get update failed (attempt $attempt); retrying" >&2
  sleep 5
done
[ "$update_ok" -eq 1 ] || echo "setup.sh: apt-get update reported errors; trying the install anyway" >&2

pkgs=("${native_pkgs[@]}")
[ "$native_only" -eq 1 ] || pkgs+=("${cross_pkgs[@]}")
$SUDO apt-get install -y -q --no-install-recommends "${pkgs[@]}"
echo "setup.sh: all dependencies installed"
