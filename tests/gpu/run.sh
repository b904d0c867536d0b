#!/usr/bin/env bash
# The GPU checks, on a machine with an NVIDIA GPU: builds with USE_CUDA=1, then
#   (a) the test vectors through the CUDA kernels (run_vectors_cuda --cuda; shipped vectors in
#       $VECTORS or tests/vectors/reference, and those tests/vectors/gen_vectors.py generates when
#       NumPy is there; contiguous, then in pages of 1, 16 and 256 tokens with --block), compare_kernels (CUDA against the CPU reference), and compare_kernels
#       on small geometries under compute-sanitizer (memcheck, racecheck, synccheck, initcheck)
#       where the toolkit has it;
#   (b) the daemon's CUDA arena (tests/gpu/check_daemon.sh): vased on cuda:0 and two engine
#       processes through eviction cycles, over both sharing paths (legacy IPC and VMM), with an
#       engine killed mid-run;
#   (c) the plan-time benchmark table (bench_plan_gpu);
#   (d) the whole-model plan against one decode step's attention, and the stall per eviction
#       (bench_decode_gpu; table in OUTDIR/bench_decode.md).
# The compute-sanitizer runs of (a) come last, being the most expendable when time is short.
# Logs and the table go to OUTDIR (default build/gpu-report); summary.txt ends with one
# "gpu: N passed, N failed, N not run" line. Exit status 1 if anything failed, else 0. The
# whole run is kept under 8 minutes: each step's timeout is cut to what is left of that.
#
# Usage: tests/gpu/run.sh [OUTDIR]     (environment: VECTORS, PYTHON, MAKE_JOBS, COMPARE_FLAGS,
#                                       BENCH_FLAGS, BENCH_DECODE_FLAGS)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1

OUT=${1:-build/gpu-report}
VECTORS=${VECTORS:-tests/vectors/reference}
PYTHON=${PYTHON:-/usr/bin/python3}
MAKE_JOBS=${MAKE_JOBS:-$(nproc)}
TOTAL_S=470
BUILD=build
GPU_DIR=$BUILD/tests/gpu

mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
start=$(date +%s)
passed=0 failed=0 notrun=0

say() { echo "$*" | tee -a "$SUMMARY"; }
pass() { passed=$((passed + 1)); say "PASS    $1"; }
fail() { failed=$((failed + 1)); say "FAIL    $1${2:+: $2}"; }
not_run() { notrun=$((notrun + 1)); say "NOT RUN $1${2:+: $2}"; }

# step NAME LOG TIMEOUT CMD...: runs CMD with its output in LOG, within TIMEOUT seconds and what
# is left of the total; 0 if it passed.
step() {
    local name=$1 log=$2 limit=$3
    shift 3
    local left=$((TOTAL_S - ($(date +%s) - start)))
    if [ "$left" -lt 10 ]; then
        not_run "$name" "out of time"
        return 2
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    local t0 rc
    t0=$(date +%s)
    timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
    rc=$?
    local took=$(($(date +%s) - t0))
    if [ "$rc" = 0 ]; then
        pass "$name (${took}s, $log)"
    elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        fail "$name" "timed out after ${limit}s ($log)"
    else
        fail "$name" "exit status $rc ($log)"
        tail -n 20 "$log" | sed 's/^/        /'
    fi
    return "$rc"
}

say "gpu checks: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 |
        sed 's/^/device: /' | tee -a "$SUMMARY"
fi

# ---- build ----
if ! step "build (make USE_CUDA=1 all gpu)" "$OUT/build.log" 300 \
    make -j"$MAKE_JOBS" USE_CUDA=1 all gpu; then
    say "gpu: $passed passed, $failed failed, $notrun not run (the build failed)"
    exit 1
fi

# ---- (a) vectors and compare_kernels ----
section_vectors() {
    local dirs
    if [ -d "$VECTORS" ] && dirs=$(ls -d "$VECTORS"/*/ 2>/dev/null) && [ -n "$dirs" ]; then
        # shellcheck disable=SC2086
        step "vectors $VECTORS (CUDA)" "$OUT/vectors.log" 120 \
            "$GPU_DIR/run_vectors_cuda" --cuda $dirs
        # shellcheck disable=SC2086
        step "vectors $VECTORS in pages of 1, 16, 256 tokens (CUDA)" "$OUT/vectors-block.log" 120 \
            "$GPU_DIR/run_vectors_cuda" --cuda --block=1,16,256 $dirs
    else
        not_run "vectors $VECTORS (CUDA)" "no vectors there (set VECTORS=DIR)"
    fi
    local gen=$OUT/vectors-gen
    if "$PYTHON" -c "import numpy" >/dev/null 2>&1; then
        rm -rf "$gen"
        if "$PYTHON" tests/vectors/gen_vectors.py "$gen" >"$OUT/gen_vectors.log" 2>&1; then
            # shellcheck disable=SC2046
            step "generated vectors (CUDA)" "$OUT/vectors-gen.log" 120 \
                "$GPU_DIR/run_vectors_cuda" --cuda $(ls -d "$gen"/*/)
            # shellcheck disable=SC2046
            step "generated vectors in pages of 1, 16, 256 tokens (CUDA)" \
                "$OUT/vectors-gen-block.log" 120 \
                "$GPU_DIR/run_vectors_cuda" --cuda --block=1,16,256 $(ls -d "$gen"/*/)
        else
            fail "generated vectors (CUDA)" "gen_vectors.py failed ($OUT/gen_vectors.log)"
        fi
    else
        not_run "generated vectors (CUDA)" "python3 with NumPy not available"
    fi
}

section_compare() {
    # shellcheck disable=SC2086
    step "compare_kernels" "$OUT/compare_kernels.log" 300 \
        "$GPU_DIR/compare_kernels" ${COMPARE_FLAGS:-}
    grep -E '^(PASS|FAIL) |^plans |^compare_kernels:' "$OUT/compare_kernels.log" | head -n 60 |
        sed 's/^/        /' | tee -a "$SUMMARY"
}

section_sanitizer() {
    local cs
    cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    if [ ! -x "$cs" ]; then
        not_run "compute-sanitizer" "not found"
        return
    fi
    local small=(--quick --max-budget 100) one=(--quick --geom odd-a --policy snapkv)
    step "compute-sanitizer memcheck" "$OUT/memcheck.log" 150 \
        "$cs" --tool memcheck --error-exitcode 99 "$GPU_DIR/compare_kernels" "${small[@]}"
    step "compute-sanitizer racecheck" "$OUT/racecheck.log" 90 \
        "$cs" --tool racecheck --error-exitcode 99 "$GPU_DIR/compare_kernels" "${one[@]}"
    step "compute-sanitizer synccheck" "$OUT/synccheck.log" 90 \
        "$cs" --tool synccheck --error-exitcode 99 "$GPU_DIR/compare_kernels" "${one[@]}"
    step "compute-sanitizer initcheck" "$OUT/initcheck.log" 90 \
        "$cs" --tool initcheck --error-exitcode 99 "$GPU_DIR/compare_kernels" "${one[@]}"
}

# ---- (b) the daemon's CUDA arena ----
section_daemon() {
    step "daemon CUDA arena (ipc + vmm, engine killed mid-run)" "$OUT/check_daemon.out" 240 \
        tests/gpu/check_daemon.sh "$OUT/daemon"
    if [ -f "$OUT/daemon/check_daemon.log" ]; then
        tail -n 30 "$OUT/daemon/check_daemon.log" | sed 's/^/        /' | tee -a "$SUMMARY"
    fi
}

# ---- (c) the benchmark ----
section_bench() {
    # shellcheck disable=SC2086
    if step "bench_plan_gpu" "$OUT/bench.md" 180 "$GPU_DIR/bench_plan_gpu" ${BENCH_FLAGS:-}; then
        tee -a "$SUMMARY" <"$OUT/bench.md"
    fi
}

# ---- (d) whole-model plan against decode attention ----
section_bench_decode() {
    # shellcheck disable=SC2086
    if step "bench_decode_gpu" "$OUT/bench_decode.md" 150 "$GPU_DIR/bench_decode_gpu" \
        ${BENCH_DECODE_FLAGS:-}; then
        sed -n '/^| model/,$p' "$OUT/bench_decode.md" | tee -a "$SUMMARY"
    fi
}

# The sanitizer runs come last: they are the slowest and the most expendable when time is short.
section_vectors
section_compare
section_daemon
section_bench
section_bench_decode
section_sanitizer

say "elapsed: $(($(date +%s) - start))s"
say "gpu: $passed passed, $failed failed, $notrun not run"
[ "$failed" = 0 ]
