#!/usr/bin/env bash
# The GPU checks, on a machine with an NVIDIA GPU: builds with USE_CUDA=1 (warnings not fatal:
# that machine's compilers are not the ones the tree is kept warning-free with, so its warnings
# are reported, not failed on), then
#   (a) the test vectors through the CUDA kernels (run_vectors_cuda --cuda; contiguous, then in
#       pages of 1, 16 and 256 tokens with --block), compare_kernels (CUDA against the CPU
#       reference), and compare_kernels on small geometries under compute-sanitizer (memcheck,
#       racecheck, synccheck, initcheck) where the toolkit has it;
#   (b) the daemon's CUDA arena (tests/gpu/check_daemon.sh): vased on cuda:0 and two engine
#       processes through eviction cycles, over both sharing paths (legacy IPC and VMM), with an
#       engine killed mid-run;
#   (c) the plan-time benchmark table (bench_plan_gpu);
#   (d) the whole-model plan against one decode step's attention, and the stall per eviction
#       (bench_decode_gpu; its table in bench_decode.md of the report and in summary.txt).
# The compute-sanitizer runs of (a) come last, being the most expendable when time is short.
#
# Vectors: $VECTORS when set and not empty (one set); else the reference set (.gpu/vectors/shipped when carried,
# else tests/vectors/reference) and the generated set made on the development machine
# (.gpu/vectors/gen, carried there by gpu-prep.sh). Only when no generated set is carried and
# $PYTHON has NumPy are they generated here, after gen_vectors.py --verify on the reference set
# (the machine's NumPy may be another major version), and run through the CPU runner too, so that
# a failure can be put on the generator or on the GPU. The summary says which sets ran.
#
# Dependencies: with --debs DIR the Debian packages in DIR (*.deb, as gpu-prep.sh carries them in
# .gpu/debs) are unpacked into $TMPDIR/vase-deps and the build uses them (DEPS_PREFIX); with DEPS_PREFIX
# set (or --deps-prefix DIR) the build uses that unpacked prefix; otherwise make finds or installs
# them itself. GNU make is taken from the prefix when the machine has none.
#
# Output: OUTDIR (default build/gpu-report) receives exactly two files: summary.txt, ending with
# one "gpu: N passed, N failed, N not run" line, and gpu-report.tgz, every log of the run (the
# build, each step, the daemon's). Exit status 1 if anything failed, else 0. The whole run is
# kept within TOTAL_S seconds (default below, or TOTAL_S from the environment): each step's
# timeout is cut to what is left of that.
#
# Usage: tests/gpu/run.sh [--debs DIR | --deps-prefix DIR] [OUTDIR]
#        (environment: VECTORS, PYTHON, MAKE_JOBS, TOTAL_S, DEPS_PREFIX, COMPARE_FLAGS,
#         BENCH_FLAGS, BENCH_DECODE_FLAGS)
set -uo pipefail
TOTAL_S_ENV=${TOTAL_S:-}
cd "$(dirname "$0")/../.." || exit 1

TOTAL_S=470
[ -n "$TOTAL_S_ENV" ] && TOTAL_S=$TOTAL_S_ENV
PYTHON=${PYTHON:-/usr/bin/python3}
MAKE_JOBS=${MAKE_JOBS:-$(nproc)}
DEPS_PREFIX=${DEPS_PREFIX:-}
DEBS=
BUILD=build
GPU_DIR=$BUILD/tests/gpu

usage() { echo "usage: $0 [--debs DIR | --deps-prefix DIR] [OUTDIR]" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case $1 in
    --debs) [ $# -ge 2 ] || usage; DEBS=$2; shift 2 ;;
    --deps-prefix) [ $# -ge 2 ] || usage; DEPS_PREFIX=$2; shift 2 ;;
    -*) usage ;;
    *) break ;;
    esac
done
[ $# -le 1 ] || usage
OUT=${1:-build/gpu-report}

mkdir -p "$OUT" || exit 1
OUT=$(cd "$OUT" && pwd)
# The logs are written to LOGS and packed into OUT/gpu-report.tgz at the end; the vectors this
# run generates go to WORK, outside the tarball.
WORK=$(mktemp -d "${TMPDIR:-/tmp}/vase-gpu-XXXXXX") || exit 1
LOGS=$WORK/gpu-report
mkdir -p "$LOGS"
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
rm -f "$OUT/gpu-report.tgz"
start=$(date +%s)
passed=0 failed=0 notrun=0 findings=0

say() { echo "$*" | tee -a "$SUMMARY"; }
pass() { passed=$((passed + 1)); say "PASS    $1"; }
fail() { failed=$((failed + 1)); say "FAIL    $1${2:+: $2}"; }
not_run() { notrun=$((notrun + 1)); say "NOT RUN $1${2:+: $2}"; }
finding() { findings=$((findings + 1)); say "FINDING $1"; }

# finish [NOTE]: the closing lines, the tarball, the exit status.
finish() {
    say "elapsed: $(($(date +%s) - start))s${1:+ ($1)}"
    cp "$SUMMARY" "$LOGS/summary.txt"
    tar czf "$OUT/gpu-report.tgz" -C "$WORK" gpu-report ||
        say "error: could not write $OUT/gpu-report.tgz"
    say "logs: $OUT/gpu-report.tgz"
    [ "$findings" = 0 ] || say "findings: $findings (not failures; see FINDING above)"
    say "gpu: $passed passed, $failed failed, $notrun not run"
    rm -rf "$WORK"
    [ "$failed" = 0 ]
    exit $?
}
trap 'say "interrupted"; failed=$((failed + 1)); finish' INT TERM

# step NAME LOG TIMEOUT CMD...: runs CMD with its output in LOGS/LOG, within TIMEOUT seconds and
# what is left of the total; 0 if it passed.
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
    timeout --kill-after=10 "$limit" "$@" >"$LOGS/$log" 2>&1
    rc=$?
    local took=$(($(date +%s) - t0))
    if [ "$rc" = 0 ]; then
        pass "$name (${took}s, $log)"
    elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        fail "$name" "timed out after ${limit}s ($log)"
    else
        fail "$name" "exit status $rc ($log)"
        tail -n 20 "$LOGS/$log" | sed 's/^/        /' | tee -a "$SUMMARY"
    fi
    return "$rc"
}

say "gpu checks: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(git rev-parse --short HEAD 2>/dev/null || echo '?'), budget ${TOTAL_S}s"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 |
        sed 's/^/device: /' | tee -a "$SUMMARY"
fi
say "host: $(gcc --version 2>/dev/null | head -n 1), $(nvcc --version 2>/dev/null | tail -n 1)"

# ---- dependencies ----
if [ -n "$DEBS" ]; then
    DEPS_PREFIX=${TMPDIR:-/tmp}/vase-deps
    rm -rf "$DEPS_PREFIX" && mkdir -p "$DEPS_PREFIX" || finish "cannot create $DEPS_PREFIX"
    n=0
    for f in "$DEBS"/*.deb; do
        [ -e "$f" ] || { fail "dependencies" "no .deb files in $DEBS"; finish; }
        if command -v dpkg-deb >/dev/null 2>&1; then
            dpkg-deb -x "$f" "$DEPS_PREFIX"
        else # the data member of the ar archive
            ar p "$f" "$(ar t "$f" | grep '^data\.tar')" | tar -x -C "$DEPS_PREFIX" --auto-compress -f - 2>/dev/null ||
                ar p "$f" "$(ar t "$f" | grep '^data\.tar')" | xz -dc | tar -x -C "$DEPS_PREFIX" -f -
        fi || { fail "dependencies" "cannot unpack $f"; finish; }
        n=$((n + 1))
    done
    say "dependencies: $n packages of $DEBS unpacked into $DEPS_PREFIX"
elif [ -n "$DEPS_PREFIX" ]; then
    DEPS_PREFIX=$(cd "$DEPS_PREFIX" && pwd) || { fail "dependencies" "no folder $DEPS_PREFIX"; finish; }
    say "dependencies: unpacked in $DEPS_PREFIX"
fi
MAKE=make
m=$(type -P make || true)
if ! { [ -n "$m" ] && [ -f "$m" ] && [ -x "$m" ]; } && [ -n "$DEPS_PREFIX" ] &&
    [ -x "$DEPS_PREFIX/usr/bin/make" ]; then
    MAKE=$DEPS_PREFIX/usr/bin/make
    say "no make on this machine: using $MAKE"
fi
make_args=(-j"$MAKE_JOBS" USE_CUDA=1 WERROR=0 ${DEPS_PREFIX:+DEPS_PREFIX="$DEPS_PREFIX"})
# Device code for this machine's GPU only (unless CUDA_ARCH says otherwise): a quarter of the
# default build's nvcc time.
if [ -z "${CUDA_ARCH:-}" ] && cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null |
    head -n 1 | tr -d ' .') && [ -n "$cc" ]; then
    make_args+=(CUDA_ARCH="$cc" CUDA_PTX_ARCH="$cc")
fi

# ---- build ----
if ! step "build ($MAKE USE_CUDA=1 WERROR=0${DEPS_PREFIX:+ DEPS_PREFIX=$DEPS_PREFIX} all gpu)" \
    build.log 300 "$MAKE" "${make_args[@]}" all gpu; then
    finish "the build failed"
fi
grep -E '^  SKIP ' "$LOGS/build.log" | sed 's/^ */build: /' | tee -a "$SUMMARY"
nwarn=$(grep -c -E '(warning|Warning)[: ]' "$LOGS/build.log")
if [ "$nwarn" -gt 0 ]; then
    finding "build: $nwarn warning lines on this machine's compilers (build.log); the first:"
    grep -E '(warning|Warning)[: ]' "$LOGS/build.log" | head -n 8 | sed 's/^/        /' |
        tee -a "$SUMMARY"
fi

# ---- (a) vectors and compare_kernels ----

# vector_set NAME DIR: the set's case directories through the CUDA kernels, contiguous and paged.
vector_set() {
    local name=$1 dir=$2 dirs
    if ! dirs=$(ls -d "$dir"/*/ 2>/dev/null) || [ -z "$dirs" ]; then
        not_run "vectors $name (CUDA)" "no cases in $dir"
        return
    fi
    say "vectors $name: $(echo "$dirs" | wc -l) cases from $dir"
    # shellcheck disable=SC2086
    step "vectors $name (CUDA)" "vectors-$name.log" 120 "$GPU_DIR/run_vectors_cuda" --cuda $dirs
    # shellcheck disable=SC2086
    step "vectors $name in pages of 1, 16, 256 tokens (CUDA)" "vectors-$name-block.log" 120 \
        "$GPU_DIR/run_vectors_cuda" --cuda --block=1,16,256 $dirs
}

section_vectors() {
    if [ -n "${VECTORS:-}" ]; then
        if ls -d "$VECTORS"/*/ >/dev/null 2>&1; then
            vector_set given "$VECTORS"
            return
        fi
        say "vectors: no cases in VECTORS=$VECTORS; taking those of the tree"
    fi
    local ref=tests/vectors/reference
    [ -d .gpu/vectors/shipped ] && ref=.gpu/vectors/shipped
    vector_set reference "$ref"
    if [ -d .gpu/vectors/gen ]; then
        vector_set generated .gpu/vectors/gen
        return
    fi
    local gen=$WORK/vectors-gen np
    if ! np=$("$PYTHON" -c 'import numpy; print(numpy.__version__)' 2>/dev/null); then
        not_run "vectors generated" "none carried (.gpu/vectors/gen) and $PYTHON has no NumPy"
        return
    fi
    say "vectors generated: none carried; generating here with NumPy $np"
    step "gen_vectors.py --verify $ref (NumPy $np)" gen-verify.log 60 \
        "$PYTHON" tests/vectors/gen_vectors.py --verify "$ref" || return
    step "gen_vectors.py (NumPy $np)" gen.log 60 "$PYTHON" tests/vectors/gen_vectors.py "$gen" ||
        return
    # shellcheck disable=SC2046
    step "vectors generated here (CPU runner)" vectors-generated-cpu.log 60 \
        "$BUILD/tests/run_vectors" $(ls -d "$gen"/*/)
    vector_set generated "$gen"
}

section_compare() {
    # shellcheck disable=SC2086
    step "compare_kernels" compare_kernels.log 300 "$GPU_DIR/compare_kernels" ${COMPARE_FLAGS:-}
    grep -E '^(PASS|FAIL) |^plans |^compare_kernels:' "$LOGS/compare_kernels.log" | head -n 60 |
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
    step "compute-sanitizer memcheck" memcheck.log 150 \
        "$cs" --tool memcheck --error-exitcode 99 "$GPU_DIR/compare_kernels" "${small[@]}"
    step "compute-sanitizer racecheck" racecheck.log 90 \
        "$cs" --tool racecheck --error-exitcode 99 "$GPU_DIR/compare_kernels" "${one[@]}"
    step "compute-sanitizer synccheck" synccheck.log 90 \
        "$cs" --tool synccheck --error-exitcode 99 "$GPU_DIR/compare_kernels" "${one[@]}"
    step "compute-sanitizer initcheck" initcheck.log 90 \
        "$cs" --tool initcheck --error-exitcode 99 "$GPU_DIR/compare_kernels" "${one[@]}"
}

# ---- (b) the daemon's CUDA arena ----
section_daemon() {
    step "daemon CUDA arena (ipc + vmm, engine killed mid-run)" check_daemon.out 240 \
        tests/gpu/check_daemon.sh "$LOGS/daemon"
    if [ -f "$LOGS/daemon/check_daemon.log" ]; then
        tail -n 30 "$LOGS/daemon/check_daemon.log" | sed 's/^/        /' | tee -a "$SUMMARY"
    fi
}

# ---- (c) the benchmark ----
section_bench() {
    # shellcheck disable=SC2086
    if step "bench_plan_gpu" bench.md 180 "$GPU_DIR/bench_plan_gpu" ${BENCH_FLAGS:-}; then
        tee -a "$SUMMARY" <"$LOGS/bench.md"
    fi
}

# ---- (d) whole-model plan against decode attention ----
section_bench_decode() {
    # shellcheck disable=SC2086
    if step "bench_decode_gpu" bench_decode.md 150 "$GPU_DIR/bench_decode_gpu" \
        ${BENCH_DECODE_FLAGS:-}; then
        sed -n '/^| model/,$p' "$LOGS/bench_decode.md" | tee -a "$SUMMARY"
    fi
}

# The sanitizer runs come last: they are the slowest and the most expendable when time is short.
section_vectors
section_compare
section_daemon
section_bench
section_bench_decode
section_sanitizer

finish
