#!/bin/bash
# Every experiment behind a figure in docs/results.md (scripts/experiments/*.patch, each applied to a scratch copy of
# the tree) still applies to the tree: checked, not applied, so that a change to a file a patch touches cannot rot it
# unseen. optin_start.patch applies on top of oracle_start.patch (scripts/experiments/optin_start.sh).
#   bash tests/experiment_patches.sh SOURCE_DIR
set -u
cd "${1:?usage: experiment_patches.sh SOURCE_DIR}" || exit 2
fail=0
n=0
for p in scripts/experiments/*.patch; do
    n=$((n + 1))
    [ "$(basename "$p")" = optin_start.patch ] && continue
    git apply --check "$p" || { echo "experiment_patches: $p no longer applies to the tree" >&2; fail=1; }
done
cat scripts/experiments/oracle_start.patch scripts/experiments/optin_start.patch | git apply --check - ||
    { echo "experiment_patches: optin_start.patch no longer applies after oracle_start.patch" >&2; fail=1; }
[ "$n" -gt 0 ] || { echo "experiment_patches: no patch found" >&2; exit 1; }
[ "$fail" -eq 0 ] && echo "experiment_patches: all $n apply"
exit $fail
