#!/usr/bin/env bash
# Runs the README's quick start, compiles and runs its C example exactly as written there, and runs the
# README's main fleet command, so that the README stays true. Expects build/ from `bash scripts/test.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/dprec-device ] || { echo "quickstart.sh: run 'bash scripts/test.sh' first (build/ is missing)" >&2; exit 1; }
between() { awk -v a="<!-- $1 -->" -v b="<!-- /$1 -->" '$0==a{on=1;next} $0==b{on=0} on' README.md | sed '/^```/d'; }

rm -rf /tmp/me /tmp/dprec-app /tmp/demo.rel /tmp/demo.key /tmp/demo.pub
echo "== README quick start"
between quickstart | grep -v '^\s*$' > build/quickstart-commands.sh
bash -euxo pipefail build/quickstart-commands.sh

echo "== README C example"
between example-c > build/readme_example.c
cc -std=c11 -Wall -Wextra -Werror -Iinclude build/readme_example.c -o build/readme_example \
   -Lbuild -ldprec_port_posix -ldprec -lmbedcrypto -lm
out=$(build/readme_example /tmp/demo.rel /tmp/demo.pub)
echo "$out"
[ "$(printf '%s\n' "$out" | grep -c '^item ')" -eq 5 ] || { echo "quickstart.sh: the C example did not print 5 items" >&2; exit 1; }
echo "== README main command: the default fleet over HTTPS"
fleet_out=$(build/examples/fleet/dprec-fleet --quiet)
printf '%s\n' "$fleet_out" | tail -16
printf '%s\n' "$fleet_out" | tail -1 | grep -Eq '^final: protocol=bias rounds=2 test_rmse=[0-9.]+ epsilon=1 delta=1e-06$' \
  || { echo "quickstart.sh: the fleet's last line is not the documented final line" >&2; exit 1; }
for want in '^guarantee: job 1 \(bias\): user-level joint DP, epsilon = 1, delta = 1e-06' '^compare: gauss-gd test_rmse=' \
            '^compare: plain test_rmse=[0-9.]+ epsilon=inf' '^verdict: bias '; do
  printf '%s\n' "$fleet_out" | grep -Eq "$want" || { echo "quickstart.sh: no line matching $want" >&2; exit 1; }
done
echo "quickstart: ok"
