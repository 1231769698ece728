#!/usr/bin/env bash
# Builds the SDK in Release mode and prints the benchmark tables plus the static library's code size.
#   bash bench/run.sh [BUILD_DIR]     (default build-release)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-release}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDPREC_BUILD_TESTS=OFF > /dev/null
cmake --build "$build" -j2 --target dprec dprec-bench-sdk dprec-bench-heap > /dev/null
echo "machine: $(uname -m), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
"$build/dprec-bench-sdk" "$(mktemp -d)"
echo
"$build/dprec-bench-heap" "$(mktemp -d)"
echo
echo "## code size of libdprec.a (Release, without mbedTLS), from size(1)"
echo '```'
size -t "$build/libdprec.a" | sed 's/(ex [^)]*)//'
echo '```'
echo
echo "## aggregator over HTTPS on loopback (dprec-bench-load, docs/operations.md)"
if cmake --build "$build" -j2 --target dprec-aggregator dprec-bench-load > /dev/null 2>&1; then
  echo '```'
  # the same HTTPS stack answering from memory first (--baseline 1), then the aggregator, in the same run
  for t in 16 128; do
    "$build/dprec-bench-load" --spawn "$build/aggregator/dprec-aggregator" --threads "$t" --reports 30000 \
      --seconds 60 --preregister 1 --baseline 1 || echo "(load benchmark failed)"
  done
  echo '```'
else
  echo "(dprec-aggregator or dprec-bench-load did not build; skipped)"
fi
