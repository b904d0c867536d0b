#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# demo.sh SYNTHETIC_ENGINE VASECTL
#
# The `make demo` scenario, run by examples/with_vased.sh against a private vased
# (VASE_RUNTIME_DIR set): two engines of different models decode at once from the daemon's one
# arena, with pages of 16 and of 256 tokens, a `vasectl status/clients/seqs` snapshot is taken while they run, then both must finish
# with status 0. An engine still running when the script ends, for whatever reason, is stopped.

set -u

if [ $# -ne 2 ]; then
    echo "usage: $0 SYNTHETIC_ENGINE VASECTL (run by: make demo)" >&2
    exit 2
fi
engine=$1
vasectl=$2
if [ -z "${VASE_RUNTIME_DIR:-}" ]; then
    echo "$0: VASE_RUNTIME_DIR is not set; run it through examples/with_vased.sh" >&2
    exit 2
fi

log=$(mktemp -d "${TMPDIR:-/tmp}/vase-demo-XXXXXX") || exit 1
pids=()
cleanup() {
    local status=$?
    trap - EXIT INT TERM
    for p in "${pids[@]}"; do
        kill -TERM "$p" 2>/dev/null
    done
    for p in "${pids[@]}"; do
        wait "$p" 2>/dev/null
    done
    rm -rf "$log"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# A small bf16 model with VaSE-AttnV, pages of 16 tokens (vLLM's FlashAttention block), decoding
# ahead of its plans (async)...
"$engine" --name=engine-a --layers=4 --q-heads=8 --kv-heads=2 --head-dim=64 --dtype=bf16 --block=16 \
    --seqs=3 --budget=512 --window=64 --prompt=300 --policy=vase-attnv --mode=async \
    --steps=1500 --step-ms=2 --seed=1 >"$log/a.out" 2>&1 &
pids+=($!)
# ...and a larger f16 one with VaSE-DKV, pages of 256 tokens (FlashAttention-2's paged KV),
# waiting for each plan (sync).
"$engine" --name=engine-b --layers=8 --q-heads=16 --kv-heads=4 --head-dim=128 --dtype=f16 --block=256 \
    --seqs=2 --budget=1024 --window=64 --prompt=1100 --policy=vase-dkv --mode=sync \
    --steps=1200 --step-ms=2 --seed=2 >"$log/b.out" 2>&1 &
pids+=($!)

# Let both connect, open their sequences and go through a few evictions. (A background sleep
# and wait, so that a signal is acted on at once.)
sleep 1.5 &
wait $!
running=0
for p in "${pids[@]}"; do
    kill -0 "$p" 2>/dev/null && running=$((running + 1))
done
echo "==== snapshot while $running of ${#pids[@]} engines run ===="
snapshot=0
for what in status clients seqs; do
    echo "---- vasectl $what"
    "$vasectl" "$what" || { echo "$0: vasectl $what failed" >&2; snapshot=1; }
done
[ "$running" = "${#pids[@]}" ] || echo "$0: warning: an engine ended before the snapshot" >&2

status=$snapshot
for i in "${!pids[@]}"; do
    name=$([ "$i" = 0 ] && echo a || echo b)
    wait "${pids[$i]}"
    rc=$?
    echo "==== engine-$name (exit status $rc) ===="
    cat "$log/$name.out"
    [ "$rc" = 0 ] || { echo "$0: engine-$name failed with status $rc" >&2; status=1; }
done
pids=()
exit "$status"
