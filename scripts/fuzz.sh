#!/usr/bin/env bash
# Builds the fuzz targets (tests/fuzz/) with clang, libFuzzer, ASan and UBSan in build-fuzz/, writes their seed
# corpora (fuzz_seeds), and runs each target for a bounded time. A crash or a broken invariant fails the script
# and names the input: copy it into tests/fuzz/regressions/<target>/ with the fix, and every build replays it.
#   bash scripts/fuzz.sh [SECONDS]      seconds per target (default 30)
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
secs=${1:-30}
[[ "$secs" =~ ^[0-9]+$ ]] || { echo "fuzz.sh: SECONDS must be a number (try --help)" >&2; exit 2; }
dir=build-fuzz
targets=(fuzz_release fuzz_store fuzz_json fuzz_sync fuzz_http1 fuzz_agg_report fuzz_agg_job)
echo "== fuzz: configure ($dir, clang)"
mkdir -p "$dir"
cmake -S . -B "$dir" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDPREC_FUZZ=ON \
      -DDPREC_BUILD_EXAMPLES=OFF > "$dir/configure.log" 2>&1 || { cat "$dir/configure.log"; exit 1; }
echo "== fuzz: build"
cmake --build "$dir" -j2 --target fuzz_seeds "${targets[@]}"
rm -rf "$dir/corpus" "$dir/work" "$dir/crashes"
mkdir -p "$dir/crashes"
"$dir/tests/fuzz/fuzz_seeds" "$dir/corpus"
for t in "${targets[@]}"; do
  echo "== fuzz: $t for ${secs} s"
  mkdir -p "$dir/work/$t"
  corpora=("$dir/work/$t" "$dir/corpus/$t")
  [ -d "tests/fuzz/regressions/$t" ] && corpora+=("tests/fuzz/regressions/$t")
  if ! "$dir/tests/fuzz/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
       -print_final_stats=1 -artifact_prefix="$dir/crashes/$t-" "${corpora[@]}" > "$dir/$t.log" 2>&1; then
    tail -40 "$dir/$t.log"
    echo "fuzz.sh: $t failed; the input is in $dir/crashes/ (add it to tests/fuzz/regressions/$t/ with the fix)" >&2
    exit 1
  fi
  grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb" "$dir/$t.log" | tr '\n' ' '
  echo
done
echo "== fuzz: all targets ran ${secs} s without a crash"
