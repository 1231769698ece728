#!/usr/bin/env bash
# Builds dprec and runs every test through ctest.
#   bash scripts/test.sh             native build (build/) and its tests
#   bash scripts/test.sh --asan      the same under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/)
#   bash scripts/test.sh --device    the device-only build (-DDPREC_BUILD_AGGREGATOR=OFF, build-device/): it must
#                                    compile nothing under aggregator/ or relay/; and the SDK-only build
#                                    (-DDPREC_SDK_ONLY=ON, build-sdk/), installed and used by tests/consumer/
#   bash scripts/test.sh --cross     cross builds for aarch64 and armhf, tests run under qemu-user; the device CLI
#                                    syncs with the native build's dprec-aggregator (built in build/ if missing)
#   bash scripts/test.sh --fuzz      the libFuzzer targets (clang), 30 s each (scripts/fuzz.sh)
#   bash scripts/test.sh --weakened  the test-only DPREC_AUDIT_WEAKEN build (build-weakened/): the empirical privacy
#                                    audit must catch its weakened mechanisms; a Release build with it is refused
#   bash scripts/test.sh --all       all of the above (what CI runs)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
[ "$jobs" -gt 2 ] && jobs=2  # shared 2-core machines (DEVELOPERS.md)
# The end-to-end syncs (tests/device_sync.py) fail here instead of skipping when they have no aggregator: CI runs them.
export DPREC_REQUIRE_AGGREGATOR=1

run() { # name, build dir, cmake args...
  local name=$1 dir=$2; shift 2
  echo "== $name: configure ($dir)"
  mkdir -p "$dir"
  cmake -S . -B "$dir" "$@" > "$dir/configure.log" 2>&1 || { cat "$dir/configure.log"; exit 1; }
  echo "== $name: build"
  cmake --build "$dir" -j"$jobs"
  echo "== $name: test"
  (cd "$dir" && ctest --output-on-failure -j"$jobs")
}

# The SDK as apps take it (issue 20): the installed-tree consumer and the JVM binding must be among the native tests,
# so that a missing JDK or JUnit fails CI instead of skipping them; and so must the state's tests on PostgreSQL.
native_tests_ran() { # build dir
  local listed
  listed=$(cd "$1" && ctest -N)
  for t in sdk_consumer_installed jvm_binding device_sync_https test_transport_https test_agg_store_postgresql \
           test_agg_core_postgresql aggregator_serve_postgresql test_sync_agg_postgresql aggregator_serve_https_postgresql \
           aggregator_metrics_postgresql test_sync_agg_secure_postgresql test_secagg_malicious_postgresql; do
    grep -q " $t\$" <<< "$listed" || { echo "test.sh: $t is not among $1's tests (bash scripts/setup.sh installs the JDK and JUnit)" >&2; exit 1; }
  done
}
native()  { run native build -DCMAKE_BUILD_TYPE=RelWithDebInfo; native_tests_ran build; }
asan()    { run asan+ubsan build-asan -DCMAKE_BUILD_TYPE=Debug -DDPREC_SANITIZE=ON; }
# The device side of sync, JSON and ECDSA must run on ARM too (issue 19): their tests are part of every cross run.
device_tests_ran() { # build dir
  local listed
  listed=$(cd "$1" && ctest -N)  # captured first: grep -q closing a pipe early would fail the pipeline
  for t in test_sync test_sync_json test_sync_malicious test_verify fuzz_sync_corpus test_http1 test_transport_https \
           fuzz_http1_corpus device_sync_https; do
    grep -q " $t\$" <<< "$listed" || { echo "test.sh: $t is not among $1's tests" >&2; exit 1; }
  done
}
# The native dprec-aggregator that the cross builds' device CLI and the SDK-only consumer sync with: build/'s, built
# (that target alone) if it is not there yet. Prints its path.
native_aggregator() {
  local agg=build/aggregator/dprec-aggregator
  if [ ! -x "$agg" ]; then
    echo "== native dprec-aggregator for the end-to-end syncs (build/)" >&2
    [ -f build/CMakeCache.txt ] || cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo > /dev/null
    cmake --build build -j"$jobs" --target dprec-aggregator >&2
  fi
  echo "$PWD/$agg"
}
cross()   {
  local agg
  agg=$(native_aggregator)
  run aarch64 build-aarch64 -DCMAKE_TOOLCHAIN_FILE=toolchains/aarch64-linux-gnu.cmake -DDPREC_BUILD_EXAMPLES=ON \
      -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DDPREC_NATIVE_AGGREGATOR="$agg"
  device_tests_ran build-aarch64
  server_free build-aarch64
  run armhf build-armhf -DCMAKE_TOOLCHAIN_FILE=toolchains/arm-linux-gnueabihf.cmake -DDPREC_BUILD_EXAMPLES=ON \
      -DDPREC_NATIVE_AGGREGATOR="$agg"
  device_tests_ran build-armhf
}
# A device-only build compiles the SDK, common/ and the device tools, never server code.
server_free() { # build dir
  local hits
  hits=$(grep -oE '"file": *"[^"]*/(aggregator|relay)/[^"]*"' "$1/compile_commands.json" || true)
  [ -z "$hits" ] || { echo "test.sh: $1 compiles server code:"; echo "$hits"; exit 1; } >&2
  echo "== $1 compiles nothing under aggregator/ or relay/"
}
device()  {
  echo "== device-only: configure and build (build-device)"
  mkdir -p build-device
  cmake -S . -B build-device -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDPREC_BUILD_AGGREGATOR=OFF \
        -DCMAKE_EXPORT_COMPILE_COMMANDS=ON > build-device/configure.log 2>&1 || { cat build-device/configure.log; exit 1; }
  cmake --build build-device -j"$jobs"
  server_free build-device
  sdk_only
}
# The SDK alone, as an app takes it (docs/sdk.md, "Installing the SDK"): built with -DDPREC_SDK_ONLY=ON, installed, and
# tests/consumer/ built against the install both ways and synced with the native aggregator through each transport.
sdk_only() {
  local agg syncs=2
  agg=$(native_aggregator)
  echo "== SDK only: configure, build and install (build-sdk)"
  mkdir -p build-sdk
  cmake -S . -B build-sdk -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDPREC_SDK_ONLY=ON > build-sdk/configure.log 2>&1 \
    || { cat build-sdk/configure.log; exit 1; }
  cmake --build build-sdk -j"$jobs"
  [ -f build-sdk/platform/curl/libdprec_transport_curl.a ] && syncs=4
  python3 tests/device_sync.py consumer "$agg" --expect-reports "$syncs" -- \
    cmake -DBUILD="$PWD/build-sdk" -DSRC="$PWD/tests/consumer" -DWORK="$PWD/build-sdk/consumer" -DCC=cc \
    -P tests/consumer.cmake
}
fuzz()    { bash scripts/fuzz.sh "${DPREC_FUZZ_SECONDS:-30}"; }
# The audit's power (issue 40; docs/privacy.md "Empirical audit"): a build whose central Gaussian noise is a tenth of
# its claim's and whose local randomizer runs at ten times its epsilon, never installed, never a release; only
# dprec-fleet is built, and only the test that the audit exceeds every claim of it runs.
weakened() {
  echo "== weakened (DPREC_AUDIT_WEAKEN, test only): refused in a release configuration"
  local refused=build-weakened/release-refused
  mkdir -p "$refused"
  if cmake -S . -B "$refused" -DCMAKE_BUILD_TYPE=Release -DDPREC_AUDIT_WEAKEN=ON > "$refused.log" 2>&1; then
    echo "test.sh: DPREC_AUDIT_WEAKEN was accepted with CMAKE_BUILD_TYPE=Release" >&2; exit 1
  fi
  grep -q "DPREC_AUDIT_WEAKEN weakens the privacy mechanisms" "$refused.log" || { cat "$refused.log"; exit 1; }
  rm -rf "$refused" "$refused.log"
  echo "== weakened: configure (build-weakened)"
  cmake -S . -B build-weakened -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDPREC_AUDIT_WEAKEN=ON > build-weakened/configure.log 2>&1 \
    || { cat build-weakened/configure.log; exit 1; }
  echo "== weakened: build dprec-fleet"
  cmake --build build-weakened -j"$jobs" --target dprec-fleet
  echo "== weakened: the audit must find every weakened mechanism"
  (cd build-weakened && ctest --output-on-failure -R '^fleet_audit_weakened$' | tee ctest.log && grep -q "100% tests passed, 0 tests failed out of 1$" ctest.log)
}

case "${1:-}" in
  "") native ;;
  --asan) asan ;;
  --device) device ;;
  --cross) cross ;;
  --fuzz) fuzz ;;
  --weakened) weakened ;;
  --all) native; asan; device; cross; fuzz; weakened ;;
  -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' ;;
  *) echo "test.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
esac
