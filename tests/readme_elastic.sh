#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Runs the elastic budgets example of docs/engines.md ("Try it with two engines") as written, from the
# repository root, and checks that it ends well: both engines decode all their steps and every
# command succeeds. Whether the second engine found the arena full (and the first one's budgets
# went down) depends on timing the example leaves to sleeps, so it is shown, not checked; the
# mechanism itself is tested by tests/test_integration_elastic.c.
set -u
cd "$(dirname "$0")/.."
block=$(awk '/^Try it with two engines/ {f = 1} f && /^```sh$/ {g = 1; next} g && /^```$/ {exit} g {print}' docs/engines.md)
if [ -z "$block" ]; then
    echo "readme_elastic: no elastic example in docs/engines.md" >&2
    exit 1
fi
out=$(mktemp)
trap 'rm -f "$out"; rm -rf ./run-elastic' EXIT
rm -rf ./run-elastic
# A session of its own: whatever the example leaves running is killed with it.
setsid bash -e -c "$block" >"$out" 2>&1 &
pid=$!
for _ in $(seq 1200); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
done
kill -0 "$pid" 2>/dev/null && echo "readme_elastic: the example did not end in 120 s" >&2
kill -KILL -- "-$pid" 2>/dev/null
wait "$pid"
rc=$?
grep -E "decode steps in|elastic budgets:|FAILED|error" "$out"
if [ "$rc" != 0 ] || ! grep -q "^A: 3000 decode steps" "$out" || ! grep -q "^B: 500 decode steps" "$out"; then
    echo "readme_elastic: the example failed (exit $rc):" >&2
    cat "$out" >&2
    exit 1
fi
