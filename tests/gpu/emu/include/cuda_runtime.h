/* SPDX-License-Identifier: MIT */
/*
 * The device side of CUDA that kernels/ *.cu use, emulated on the CPU for tests/gpu/emu: each
 * CUDA thread is a fiber (emu_runtime.cpp), the blocks of a grid run one after another,
 * __shared__ variables are statics (one block at a time), __syncthreads() and the warp shuffles
 * are barriers; a barrier that not every live thread of the block (or warp) reaches aborts with
 * "deadlock", a shuffle with exited lanes aborts too. Launches are rewritten by cu2cpp.py into
 * emu::launch(). Float arithmetic is the host's, compiled with -ffp-contract=off like nvcc's
 * --fmad=false; the double transcendentals are glibc's, not the GPU's.
 */
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <functional>
#include <tuple>
#include <utility>
#include "cuda_runtime_api.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
#define __restrict__ __restrict

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct float2 {
    float x, y;
};
struct uint2 {
    unsigned x, y;
};
struct uint4 {
    unsigned x, y, z, w;
};
static inline float2 make_float2(float a, float b) {
    return float2{a, b};
}

namespace emu {
extern uint3 cur_tid, cur_bid;
extern dim3 cur_bdim, cur_gdim;
void syncthreads();
uint64_t shfl_raw(uint64_t v, int src, int mode); /* mode 0: absolute lane, 1: xor */
void run_grid(dim3 g, dim3 b, const std::function<void()> &body);
template <typename... P, typename... A> void launch(dim3 g, dim3 b, void (*k)(P...), A &&...a) {
    std::tuple<P...> args(std::forward<A>(a)...);
    run_grid(g, b, [&] { std::apply(k, args); });
}
} // namespace emu

#define threadIdx (emu::cur_tid)
#define blockIdx (emu::cur_bid)
#define blockDim (emu::cur_bdim)
#define gridDim (emu::cur_gdim)

static inline void __syncthreads() {
    emu::syncthreads();
}
template <typename T> static inline T __shfl_xor_sync(unsigned mask, T v, int off) {
    (void)mask;
    uint64_t b = 0;
    memcpy(&b, &v, sizeof(T));
    b = emu::shfl_raw(b, off, 1);
    T r;
    memcpy(&r, &b, sizeof(T));
    return r;
}
template <typename T> static inline T __shfl_sync(unsigned mask, T v, int src) {
    (void)mask;
    uint64_t b = 0;
    memcpy(&b, &v, sizeof(T));
    b = emu::shfl_raw(b, src, 0);
    T r;
    memcpy(&r, &b, sizeof(T));
    return r;
}
template <typename T> static inline T atomicOr(T *p, T v) {
    T o = *p;
    *p = o | v;
    return o;
}
static inline unsigned __umulhi(unsigned a, unsigned b) {
    return (unsigned)(((uint64_t)a * b) >> 32);
}
static inline float __fmaf_rn(float a, float b, float c) {
    return fmaf(a, b, c);
}
static inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
template <typename T> static inline T min(T a, T b) {
    return a < b ? a : b;
}
