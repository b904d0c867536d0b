/* SPDX-License-Identifier: MIT */

/*
 * The Philox draws of philox.c on the GPU, exposed for tests: the plans draw inline
 * (exp_draw(), normal_draw() of internal_cuda.cuh), and these kernels call the same functions,
 * so that comparing them with vase_rng_exp() and vase_rng_normal() checks the plans' draws.
 */

#include <errno.h>

#include "internal_cuda.cuh"

#define DRAW_THREADS 256
#define DRAW_MAX_BLOCKS 65535u /* grid-stride beyond */

/* Grid min(ceil(n / 256), 65535), 256 threads, grid-stride: out [n] = Exp(1) draws (normal
 * false) or standard normal draws (normal true) of (rng, kv_head). */
static __global__ void draws_kernel(struct vase_rng rng, uint32_t kv_head, uint64_t n, bool normal,
                                    float *out) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x)
        out[i] = normal ? normal_draw(rng, kv_head, i) : exp_draw(rng, kv_head, i);
}

static int draws(const struct vase_rng *rng, uint32_t kv_head, float *out, size_t n, bool normal,
                 void *stream) {
    cudaStream_t st = (cudaStream_t)stream;
    if (!rng || (!out && n > 0))
        return -EINVAL;
    if (n == 0)
        return 0;
    (void)cudaGetLastError();
    uint64_t blocks = ((uint64_t)n + DRAW_THREADS - 1) / DRAW_THREADS;
    unsigned grid = blocks < DRAW_MAX_BLOCKS ? (unsigned)blocks : DRAW_MAX_BLOCKS;
    draws_kernel<<<grid, DRAW_THREADS, 0, st>>>(*rng, kv_head, n, normal, out);
    CUDA_LAUNCHED();
    CUDA_TRY(cudaStreamSynchronize(st));
    return 0;
}

extern "C" int vase_rng_exp_cuda(const struct vase_rng *rng, uint32_t kv_head, float *out, size_t n,
                                 void *stream) {
    return draws(rng, kv_head, out, n, false, stream);
}

extern "C" int vase_rng_normal_cuda(const struct vase_rng *rng, uint32_t kv_head, float *out,
                                    size_t n, void *stream) {
    return draws(rng, kv_head, out, n, true, stream);
}
