#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# tests/gpu/check_daemon.sh OUTDIR
#
# The daemon's CUDA arena on a real GPU, over both sharing paths: for cuda_share=ipc (arena
# cuda:0) and cuda_share=vmm (the same GPU named by the UUID vased reported), it starts
# build/vased on a private runtime directory and runs three synthetic engines on the GPU arena
# at once: two of different geometries, policies and modes through many full eviction cycles
# (plans on the GPU, compaction on the engines' streams), and a third that is killed with
# SIGKILL in the middle of its run. It checks that the daemon shares the arena as asked, that the
# two engines keep going after the kill and finish cleanly with evictions done, that the killed
# engine's client and pages are gone at once (vasectl --json status), that every page is free
# once all engines are gone, and that vased stops cleanly on SIGTERM.
#
# Needs a CUDA build (make USE_CUDA=1) and an NVIDIA GPU in compute mode Default. Without a GPU
# it FAILS (never skips). Logs go to OUTDIR; the last line of OUTDIR/check_daemon.log is
# "check_daemon: N passed, N failed"; exit status 1 if anything failed.
#
# Environment: BUILD (default build), PYTHON (default python3), ENGINE_SECONDS (default 20).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1

[ $# -eq 1 ] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
OUT=$1
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-python3}
ENGINE_SECONDS=${ENGINE_SECONDS:-20}
VASED=$BUILD/vased
VASECTL=$BUILD/vasectl
ENGINE=$BUILD/examples/synthetic_engine

mkdir -p "$OUT" || exit 1
LOG=$OUT/check_daemon.log
: >"$LOG"
passed=0 failed=0

say() { echo "$*" | tee -a "$LOG"; }
pass() { passed=$((passed + 1)); say "PASS    $1"; }
fail() { failed=$((failed + 1)); say "FAIL    $1${2:+: $2}"; }
finish() {
    say "check_daemon: $passed passed, $failed failed"
    [ "$failed" = 0 ]
    exit $?
}

# ---- what the check needs: no GPU is a failure, not a skip ----

for prog in "$VASED" "$VASECTL" "$ENGINE"; do
    [ -x "$prog" ] || { fail "prerequisites" "$prog missing (make USE_CUDA=1 first)"; finish; }
done
# Not `ldd | grep -q`: under pipefail, grep leaving at its first match can kill ldd with SIGPIPE
# and fail the pipeline, now and then.
if ! grep -q libcudart <<<"$(ldd "$VASED" 2>&1)"; then
    fail "prerequisites" "$VASED was built without CUDA (make USE_CUDA=1)"
    finish
fi
if ! nvidia-smi -L >"$OUT/gpus.txt" 2>&1 || ! grep -q '^GPU 0' "$OUT/gpus.txt"; then
    fail "prerequisites" "no NVIDIA GPU found (nvidia-smi -L: $(head -c 200 "$OUT/gpus.txt"))"
    finish
fi
nvidia-smi --query-gpu=index,uuid,name,compute_mode,memory.total --format=csv \
    >>"$OUT/gpus.txt" 2>&1
say "GPUs: $(tr '\n' ' ' <"$OUT/gpus.txt")"

# ---- helpers ----

# status_field DIR EXPR: evaluates EXPR (Python, over s = vasectl --json status) or fails.
status_field() {
    VASE_RUNTIME_DIR=$1 "$VASECTL" --json status 2>>"$LOG" |
        "$PYTHON" -c "import json,sys; s=json.load(sys.stdin); print($2)"
}

# wait_for DIR EXPR SECONDS: waits until status_field gives "True"; 0 if it did.
wait_for() {
    for _ in $(seq $(($3 * 10))); do
        [ "$(status_field "$1" "$2" 2>/dev/null)" = True ] && return 0
        sleep 0.1
    done
    return 1
}

daemon_pid=
engine_pids=()
# shellcheck disable=SC2317 # called by the trap
cleanup() {
    local p
    for p in "${engine_pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
    [ -n "$daemon_pid" ] && kill -KILL "$daemon_pid" 2>/dev/null
    wait 2>/dev/null
}
trap cleanup EXIT

# run_share SHARE SPEC: the whole scenario on one arena; sets $reported_uuid.
run_share() {
    local share=$1 spec=$2 name="cuda_share=$1 arena=$2"
    local dir vlog a b victim total status
    dir=$(mktemp -d "${TMPDIR:-/tmp}/vase-gpu-XXXXXX") || { fail "$name" "mktemp"; return; }
    vlog=$OUT/vased-$share.log

    "$VASED" --config=/dev/null --runtime-dir="$dir" --arena="$spec" --cuda-share="$share" \
        --arena-bytes=2G --granule-bytes=2M --evictor-threads=4 --metrics-address=off >"$vlog" 2>&1 &
    daemon_pid=$!
    local up=0
    for _ in $(seq 300); do
        if ! kill -0 "$daemon_pid" 2>/dev/null; then break; fi
        if [ -S "$dir/session.sock" ] && status_field "$dir" "s['clients']" >/dev/null 2>&1; then
            up=1
            break
        fi
        sleep 0.1
    done
    if [ "$up" != 1 ]; then
        fail "$name: vased starts" "see $vlog: $(tail -n 3 "$vlog" | tr '\n' ' ')"
        wait "$daemon_pid" 2>/dev/null
        daemon_pid=
        rm -rf "$dir"
        return
    fi
    pass "$name: vased starts"
    if grep -q "shared as cuda-$share" "$vlog"; then
        pass "$name: arena shared as cuda-$share"
    else
        fail "$name: arena shared as cuda-$share" "not in $vlog"
    fi
    reported_uuid=$(grep -o 'GPU-[0-9a-f-]\{36\}' "$vlog" | head -n 1)
    if [ -n "$reported_uuid" ]; then
        pass "$name: device UUID reported ($reported_uuid)"
    else
        fail "$name: device UUID reported" "no GPU-<uuid> in $vlog"
    fi
    total=$(status_field "$dir" "s['arenas'][0]['pages_total']")

    # Two engines of different geometries, policies and modes, and the victim.
    VASE_RUNTIME_DIR=$dir "$ENGINE" --name=engine-a --layers=4 --q-heads=8 --kv-heads=2 \
        --head-dim=64 --dtype=bf16 --policy=vase-attnv --mode=async --seqs=3 --budget=256 \
        --window=32 --prompt=300 --duration="$ENGINE_SECONDS" --step-ms=0.5 --seed=1 \
        >"$OUT/engine-a-$share.log" 2>&1 &
    a=$!
    VASE_RUNTIME_DIR=$dir "$ENGINE" --name=engine-b --layers=6 --q-heads=16 --kv-heads=4 \
        --head-dim=128 --dtype=f16 --policy=h2o --push-stats --mode=sync --seqs=2 \
        --budget=512 --window=64 --prompt=128 --duration="$ENGINE_SECONDS" --step-ms=0.5 \
        --seed=2 >"$OUT/engine-b-$share.log" 2>&1 &
    b=$!
    VASE_RUNTIME_DIR=$dir "$ENGINE" --name=victim --layers=2 --q-heads=4 --kv-heads=1 \
        --head-dim=64 --dtype=f32 --policy=snapkv --seqs=4 --budget=128 --window=32 \
        --prompt=64 --duration=600 --step-ms=0.2 --seed=3 >"$OUT/victim-$share.log" 2>&1 &
    victim=$!
    engine_pids=("$a" "$b" "$victim")

    # All three in flight, evicting; then the victim dies mid-run.
    if wait_for "$dir" "s['clients'] == 3 and s['evictions_total'] > 20" 60; then
        pass "$name: three engines evicting"
    else
        fail "$name: three engines evicting" "status: $(status_field "$dir" s)"
    fi
    local used_before
    used_before=$(status_field "$dir" "s['arenas'][0]['pages_total'] - s['arenas'][0]['pages_free']")
    kill -KILL "$victim" 2>/dev/null
    wait "$victim" 2>/dev/null
    if wait_for "$dir" "s['clients'] == 2 and s['arenas'][0]['pages_total'] - s['arenas'][0]['pages_free'] < $used_before" 10; then
        pass "$name: killed engine's client and pages gone"
    else
        fail "$name: killed engine's client and pages gone" "status: $(status_field "$dir" s)"
    fi
    local ev_kill
    ev_kill=$(status_field "$dir" "s['evictions_total']")
    # The others keep going: more evictions after the kill.
    if wait_for "$dir" "s['evictions_total'] > $ev_kill + 10" 30; then
        pass "$name: the other engines keep evicting"
    else
        fail "$name: the other engines keep evicting" "status: $(status_field "$dir" s)"
    fi

    for e in a b; do
        local pid log
        [ "$e" = a ] && pid=$a || pid=$b
        log=$OUT/engine-$e-$share.log
        wait "$pid"
        status=$?
        if [ "$status" = 0 ] && grep -q '^seq ' "$log" && ! grep -qi 'failed' "$log"; then
            pass "$name: engine-$e finishes cleanly"
        else
            fail "$name: engine-$e finishes cleanly" "exit $status, see $log: $(tail -n 2 "$log" | tr '\n' ' ')"
        fi
        # Every sequence evicted (column 6 of the per-sequence table).
        if awk '/^seq /{t=1; next} t && $1 ~ /^[0-9]+$/ {n++; if ($6 < 2) bad=1} END {exit !(n > 0 && !bad)}' "$log"; then
            pass "$name: engine-$e evicted in every sequence"
        else
            fail "$name: engine-$e evicted in every sequence" "see $log"
        fi
    done
    engine_pids=()

    if wait_for "$dir" "s['clients'] == 0 and s['seqs'] == 0 and s['arenas'][0]['pages_free'] == $total and s['evictions_in_flight'] == 0" 10; then
        pass "$name: every page free again"
    else
        fail "$name: every page free again" "status: $(status_field "$dir" s)"
    fi
    status_field "$dir" s >"$OUT/status-$share.json" 2>&1
    if [ "$(status_field "$dir" "s['errors_total']")" != 0 ]; then
        say "note: $name: vased counted errors (see $vlog)"
    fi

    kill -TERM "$daemon_pid"
    local stopped=0
    for _ in $(seq 100); do
        kill -0 "$daemon_pid" 2>/dev/null || { stopped=1; break; }
        sleep 0.1
    done
    [ "$stopped" = 1 ] || kill -KILL "$daemon_pid" 2>/dev/null
    wait "$daemon_pid"
    status=$?
    daemon_pid=
    if [ "$stopped" = 1 ] && [ "$status" = 0 ]; then
        pass "$name: vased stops cleanly"
    else
        fail "$name: vased stops cleanly" "exit $status, see $vlog"
    fi
    rm -rf "$dir"
}

reported_uuid=
run_share ipc cuda:0
uuid=$reported_uuid
if [ -n "$uuid" ]; then
    run_share vmm "cuda:$uuid"
else
    run_share vmm cuda:0
fi
finish
