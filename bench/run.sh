#!/usr/bin/env bash
# Builds the SDK in Release mode and prints the benchmark tables, and the code size per target, which it also writes
# into docs/benchmarks.md.
#   bash bench/run.sh [--no-load] [--cpu-time] [BUILD_DIR]     (default build-release)
#   --no-load: skip the aggregator's HTTPS load benchmark (minutes of both cores); --cpu-time: time the SDK by the
#   thread's CPU time (a shared machine)
set -euo pipefail
cd "$(dirname "$0")/.."
load=1
cpu=()
build=build-release
for a in "$@"; do
  case $a in
    --no-load) load=0 ;;
    --cpu-time) cpu=(--cpu-time) ;;
    -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "bench/run.sh: unknown option $a (try --help)" >&2; exit 2 ;;
    *) build=$a ;;
  esac
done
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDPREC_BUILD_TESTS=OFF > /dev/null
cmake --build "$build" -j2 --target dprec dprec-bench-sdk dprec-bench-heap > /dev/null
echo "machine: $(uname -m), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
"$build/dprec-bench-sdk" "${cpu[@]}" "$(mktemp -d)"
echo
"$build/dprec-bench-heap" "$(mktemp -d)"
echo
# Code size per target, refreshed in docs/benchmarks.md at every run (between its code-size markers): libdprec.a,
# libdprec_port_posix.a and the mbedTLS transport's libdprec_transport_mbedtls.a alone (mbedTLS is the app's; what its
# TLS adds: bench/transport_size.sh), Release (-O3) and MinSizeRel (-Os), for this machine and the cross targets whose
# compilers are installed (scripts/setup.sh).
echo "## code size per target (size(1) totals of the static libraries, without mbedTLS)"
table=$(mktemp)
{
  echo "| target | compiler | build | libdprec.a text | data + bss | libdprec_port_posix.a text | libdprec_transport_mbedtls.a text |"
  echo "|---|---|---|---|---|---|---|"
  for target in native aarch64 armhf; do
    case $target in
      native)  tc=(); sz=size; cc=${CC:-cc}; arch=$(uname -m) ;;
      aarch64) tc=(-DCMAKE_TOOLCHAIN_FILE=toolchains/aarch64-linux-gnu.cmake); sz=aarch64-linux-gnu-size
               cc=aarch64-linux-gnu-gcc; arch=aarch64 ;;
      armhf)   tc=(-DCMAKE_TOOLCHAIN_FILE=toolchains/arm-linux-gnueabihf.cmake); sz=arm-linux-gnueabihf-size
               cc=arm-linux-gnueabihf-gcc; arch="armhf (Thumb-2)" ;;
    esac
    command -v "$sz" > /dev/null && command -v "$cc" > /dev/null || continue
    for type in Release MinSizeRel; do
      d="$build-size-$target-$type"
      cmake -S . -B "$d" "${tc[@]}" -DCMAKE_BUILD_TYPE=$type -DDPREC_BUILD_TESTS=OFF -DDPREC_BUILD_EXAMPLES=OFF \
            -DDPREC_BUILD_AGGREGATOR=OFF -DDPREC_BUILD_JNI=OFF > /dev/null
      cmake --build "$d" -j2 --target dprec dprec_port_posix dprec_transport_mbedtls > /dev/null
      read -r text data bss _ < <("$sz" -t "$d/libdprec.a" | tail -1)
      read -r ptext _ < <("$sz" -t "$d/libdprec_port_posix.a" | tail -1)
      read -r ttext _ < <("$sz" -t "$d/platform/mbedtls/libdprec_transport_mbedtls.a" | tail -1)
      flag=$([ $type = Release ] && echo -O3 || echo -Os)
      printf '| %s | %s | %s (%s) | %s | %s | %s | %s |\n' "$arch" "$("$cc" -dumpfullversion 2>/dev/null || "$cc" -dumpversion)" \
             "$type" "$flag" "$text" "$((data + bss))" "$ptext" "$ttext"
    done
  done
} > "$table"
cat "$table"
echo
python3 - docs/benchmarks.md "$table" "$(date -u +%Y-%m-%d)" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" <<'PY'
import sys
doc, table, day, commit = sys.argv[1:5]
begin, end = "<!-- code-size: written by bench/run.sh -->", "<!-- /code-size -->"
s = open(doc).read()
if begin not in s or end not in s:
    sys.exit("bench/run.sh: docs/benchmarks.md has no code-size markers")
rows = open(table).read().rstrip("\n")
block = f"{begin}\n{day}, commit {commit}:\n\n{rows}\n{end}"
s = s[:s.index(begin)] + block + s[s.index(end) + len(end):]
open(doc, "w").write(s)
print("bench/run.sh: docs/benchmarks.md's code-size table refreshed")
PY
echo
echo "## aggregator over HTTPS on loopback (dprec-bench-load, docs/operations.md)"
if [ "$load" -eq 0 ]; then
  echo "(skipped: --no-load)"
elif cmake --build "$build" -j2 --target dprec-aggregator dprec-bench-load > /dev/null 2>&1; then
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
