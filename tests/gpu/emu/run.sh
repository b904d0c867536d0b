#!/usr/bin/env bash
# The CUDA kernels on the CPU, for machines without a GPU: kernels/cuda/*.cu are rewritten by
# cu2cpp.py and compiled as C++ against the emulated CUDA of include/ and emu_runtime.cpp (CUDA
# threads as fibers, barriers checked for divergence, AddressSanitizer and UBSan on), then
# compare_kernels (small geometries) and run_vectors_cuda --cuda run against the CPU reference,
# bench_plan_gpu at a toy size (for its code paths only), and bench_decode_gpu --quick: its
# decode-attention kernel (tests/gpu/decode_attn.cu) against a float64 CPU reference at small
# geometries, then its code paths at a toy size.
#
# What this checks: indexing, synchronisation structure, selection order, NaN handling and the
# host-side logic, on real inputs. What it cannot: the GPU's arithmetic (its double log, sin,
# cos, exp are glibc's here), memory-model and timing effects, the real CUB sort, alignment
# faults, launch limits beyond the checks in emu_runtime.cpp, performance. tests/gpu/run.sh on a
# GPU is the real test.
#
# Usage: tests/gpu/emu/run.sh [compare_kernels options]   (default: --quick --max-budget 400)
# Environment: BUILD (default build), VECTORS (tests/vectors/reference), PYTHON, SAN (sanitizer
# flags).
set -euo pipefail
cd "$(dirname "$0")/../../.." || exit 1

BUILD=${BUILD:-build}
OUT=$BUILD/gpu-emu
VECTORS=${VECTORS:-tests/vectors/reference}
PYTHON=${PYTHON:-/usr/bin/python3}
read -r -a SAN <<<"${SAN:--fsanitize=address,undefined -fno-omit-frame-pointer}"
EMU=tests/gpu/emu
make --no-print-directory BUILD="$BUILD" "$BUILD/libvasekernels.a" >/dev/null
mkdir -p "$OUT"
# The pthread OpenBLAS the Makefile found (and checked) for this build.
BLAS_INC=$(sed -n 's/^BLAS_INC := //p' "$BUILD/config.mk")
BLAS=$(sed -n 's/^BLAS_LIB := //p' "$BUILD/config.mk")

CXXFLAGS=(-std=c++20 -O1 -g -ffp-contract=off "${SAN[@]}" -I"$EMU/include" -Ikernels -Wall
          -Wno-unknown-pragmas)
CFLAGS=(-std=c11 -O1 -g "${SAN[@]}" -D_GNU_SOURCE -I"$EMU/include" -Ikernels -Itests
        -I"$BLAS_INC")
LIBS=("$BUILD/libvasekernels.a" -L"$BLAS" -lopenblas -lm -lpthread)
pids=()
cuda_objs=()
for cu in kernels/cuda/*.cu; do
    name=$(basename "$cu" .cu)
    "$PYTHON" "$EMU/cu2cpp.py" "$cu" >"$OUT/$name.cpp"
    g++ "${CXXFLAGS[@]}" -iquote kernels -iquote kernels/cuda -c "$OUT/$name.cpp" -o "$OUT/$name.o" &
    pids+=($!)
    cuda_objs+=("$OUT/$name.o")
done
# The benchmark's own kernel, linked into bench_decode_gpu only.
"$PYTHON" "$EMU/cu2cpp.py" tests/gpu/decode_attn.cu >"$OUT/decode_attn.cpp"
g++ "${CXXFLAGS[@]}" -iquote kernels -iquote kernels/cuda -iquote tests/gpu -c "$OUT/decode_attn.cpp" \
    -o "$OUT/decode_attn.o" &
pids+=($!)
# The CUDA error mapping the kernels report through, host C against the emulated headers.
gcc "${CFLAGS[@]}" -c kernels/cuda/errno_cuda.c -o "$OUT/errno_cuda.c.o" &
pids+=($!)
cuda_objs+=("$OUT/errno_cuda.c.o")
g++ "${CXXFLAGS[@]}" -c "$EMU/emu_runtime.cpp" -o "$OUT/emu_runtime.o" &
pids+=($!)
for c in tests/gpu/compare_kernels.c tests/gpu/bench_plan_gpu.c tests/gpu/vectors_cuda.c \
         tests/gpu/bench_gpu.c tests/gpu/bench_decode_gpu.c tests/run_vectors.c tests/vcase.c \
         tests/npy.c tests/argnum.c; do
    gcc "${CFLAGS[@]}" -c "$c" -o "$OUT/$(basename "$c" .c).o" &
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
g++ "${SAN[@]}" -o "$OUT/compare_kernels" "$OUT/compare_kernels.o" "${cuda_objs[@]}" \
    "$OUT/emu_runtime.o" "${LIBS[@]}"
g++ "${SAN[@]}" -o "$OUT/bench_plan_gpu" "$OUT/bench_plan_gpu.o" "$OUT/bench_gpu.o" "$OUT/argnum.o" \
    "${cuda_objs[@]}" "$OUT/emu_runtime.o" "${LIBS[@]}"
g++ "${SAN[@]}" -o "$OUT/bench_decode_gpu" "$OUT/bench_decode_gpu.o" "$OUT/decode_attn.o" \
    "$OUT/bench_gpu.o" "$OUT/argnum.o" "${cuda_objs[@]}" "$OUT/emu_runtime.o" "${LIBS[@]}"
g++ "${SAN[@]}" -o "$OUT/run_vectors_cuda" "$OUT/run_vectors.o" "$OUT/vectors_cuda.o" \
    "$OUT/vcase.o" "$OUT/npy.o" "$OUT/argnum.o" "${cuda_objs[@]}" "$OUT/emu_runtime.o" "${LIBS[@]}"

# ASan warns once that it does not fully support swapcontext; the fibers' stacks are plain heap.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_stack_use_after_return=0}
status=0
if [ -d "$VECTORS" ]; then
    mapfile -t dirs < <(ls -d "$VECTORS"/*/)
    "$OUT/run_vectors_cuda" --cuda "${dirs[@]}" 2>&1 | grep -v 'swapcontext' || status=1
    "$OUT/run_vectors_cuda" --cuda --block=1,16,256 "${dirs[@]}" 2>&1 | grep -v 'swapcontext' ||
        status=1
else
    echo "NOT RUN: no vectors at $VECTORS"
fi
if "$PYTHON" -c "import numpy" >/dev/null 2>&1; then
    rm -rf "$OUT/vectors-gen"
    "$PYTHON" tests/vectors/gen_vectors.py "$OUT/vectors-gen" >/dev/null
    mapfile -t dirs < <(ls -d "$OUT/vectors-gen"/*/)
    "$OUT/run_vectors_cuda" --cuda "${dirs[@]}" 2>&1 | grep -v 'swapcontext' || status=1
    "$OUT/run_vectors_cuda" --cuda --block=1,16,256 "${dirs[@]}" 2>&1 | grep -v 'swapcontext' ||
        status=1
fi
# The benchmark's code paths, at a toy size (its times mean nothing here).
"$OUT/bench_plan_gpu" --model Qwen3-4B --budget 128 --layers 2 --reps 1 2>&1 |
    grep -v 'swapcontext' || status=1
# The decode-attention kernel against the CPU reference, then the benchmark's code paths.
"$OUT/bench_decode_gpu" --quick 2>&1 | grep -v 'swapcontext' || status=1
[ $# -gt 0 ] || set -- --quick --max-budget 400
"$OUT/compare_kernels" "$@" 2>&1 | grep -v 'swapcontext' || status=1
exit $status
