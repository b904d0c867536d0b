/* SPDX-License-Identifier: MIT */

/*
 * The benchmark's decode attention (decode_attn.h), split-K in two kernels on one stream:
 *
 *   split: one block per (split of the keys, query head, sequence). The query, scaled by
 *          1 / sqrt(dim), sits in shared memory; each warp takes every fourth key of the split,
 *          its lanes holding dims lane, lane + 32, ...: a dot product reduced by shuffles, then
 *          an online softmax (running max m, sum l, unnormalised sum acc of the V rows). The
 *          four warps merge in shared memory into one (m, l, acc) per block in the scratch.
 *   combine: one block per (query head, sequence) merges the splits and divides by the sum.
 *
 * K and V rows are found as the plan kernels find them (dview_row of internal_cuda.cuh), so the
 * attention reads the cache exactly where the plans and the compaction do.
 */

#include <errno.h>
#include <math.h>

#include "decode_attn.h"
#include "cuda/internal_cuda.cuh"

#define DA_THREADS 128
#define DA_WARPS (DA_THREADS / 32)
#define DA_PER_LANE (DECODE_ATTN_MAX_DIM / 32)

static __device__ __forceinline__ float warp_sum(float x) {
    for (int off = 16; off > 0; off /= 2)
        x += __shfl_xor_sync(0xffffffffu, x, off);
    return x;
}

/* exp(a - m) for a running maximum m that may still be -inf (then a is -inf too: 0). */
static __device__ __forceinline__ float exp_from(float a, float m) {
    return a == -INFINITY ? 0.0f : expf(a - m);
}

/*
 * Grid (splits, hq, seqs), DA_THREADS threads. q [seqs][hq][dim] (rows of q_row_bytes); part_ml
 * [seqs][hq][splits] (m, l); part_acc [seqs][hq][splits][dim].
 */
static __global__ void __launch_bounds__(DA_THREADS)
    decode_split_kernel(struct dview k, struct dview v, uint32_t table_stride, uint32_t len,
                        uint32_t split_keys, const char *q, uint32_t q_row_bytes, float2 *part_ml,
                        float *part_acc) {
    __shared__ float qs[DECODE_ATTN_MAX_DIM];
    __shared__ float wm[DA_WARPS], wl[DA_WARPS];
    __shared__ float wacc[DA_WARPS][DECODE_ATTN_MAX_DIM];
    const uint32_t split = blockIdx.x, qh = blockIdx.y, seq = blockIdx.z;
    const uint32_t splits = gridDim.x, hq = gridDim.y, dim = k.dim;
    const uint32_t kh = qh / (hq / k.heads), lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const uint32_t t0 = split * split_keys, t1 = min(len, t0 + split_keys);
    const float scale = 1.0f / sqrtf((float)dim);
    uint32_t bad = 0;

    k.pages += (size_t)seq * table_stride;
    v.pages += (size_t)seq * table_stride;
    const char *qrow = q + ((size_t)seq * hq + qh) * q_row_bytes;
    for (uint32_t d = threadIdx.x; d < dim; d += DA_THREADS)
        qs[d] = load_elem(qrow, k.dtype, d, bad) * scale;
    __syncthreads();

    /* Every lane of a warp runs the same keys: the shuffles see the whole warp. */
    float m = -INFINITY, l = 0.0f, acc[DA_PER_LANE];
    for (uint32_t i = 0; i < DA_PER_LANE; i++)
        acc[i] = 0.0f;
    for (uint32_t t = t0 + warp; t < t1; t += DA_WARPS) {
        const char *krow = dview_row(k, t, kh), *vrow = dview_row(v, t, kh);
        float s = 0.0f;
        for (uint32_t i = 0; i < DA_PER_LANE; i++) {
            uint32_t d = lane + 32 * i;
            if (d < dim)
                s = __fmaf_rn(qs[d], load_elem(krow, k.dtype, d, bad), s);
        }
        s = warp_sum(s);
        float m_new = fmaxf(m, s), c = exp_from(m, m_new), p = expf(s - m_new);
        l = l * c + p;
        for (uint32_t i = 0; i < DA_PER_LANE; i++) {
            uint32_t d = lane + 32 * i;
            if (d < dim)
                acc[i] = __fmaf_rn(p, load_elem(vrow, v.dtype, d, bad), acc[i] * c);
        }
        m = m_new;
    }
    if (lane == 0) {
        wm[warp] = m;
        wl[warp] = l;
    }
    for (uint32_t i = 0; i < DA_PER_LANE; i++)
        if (lane + 32 * i < dim)
            wacc[warp][lane + 32 * i] = acc[i];
    __syncthreads();

    float bm = -INFINITY, bl = 0.0f;
    for (int w = 0; w < DA_WARPS; w++)
        bm = fmaxf(bm, wm[w]);
    for (int w = 0; w < DA_WARPS; w++)
        bl += wl[w] * exp_from(wm[w], bm);
    const size_t part = ((size_t)seq * hq + qh) * splits + split;
    if (threadIdx.x == 0)
        part_ml[part] = make_float2(bm, bl);
    for (uint32_t d = threadIdx.x; d < dim; d += DA_THREADS) {
        float a = 0.0f;
        for (int w = 0; w < DA_WARPS; w++)
            a += wacc[w][d] * exp_from(wm[w], bm);
        part_acc[part * dim + d] = a;
    }
}

/* Grid (hq, seqs), DA_THREADS threads: out [seqs][hq][dim] from the splits' partial sums. */
static __global__ void __launch_bounds__(DA_THREADS)
    decode_combine_kernel(uint32_t splits, uint32_t dim, const float2 *part_ml,
                          const float *part_acc, float *out) {
    const size_t row = (size_t)blockIdx.y * gridDim.x + blockIdx.x;
    const float2 *ml = part_ml + row * splits;
    float m = -INFINITY, l = 0.0f;
    for (uint32_t s = 0; s < splits; s++)
        m = fmaxf(m, ml[s].x);
    for (uint32_t s = 0; s < splits; s++)
        l += ml[s].y * exp_from(ml[s].x, m);
    for (uint32_t d = threadIdx.x; d < dim; d += DA_THREADS) {
        float a = 0.0f;
        for (uint32_t s = 0; s < splits; s++)
            a += part_acc[(row * splits + s) * dim + d] * exp_from(ml[s].x, m);
        out[row * dim + d] = a / l;
    }
}

static uint32_t split_keys_of(const struct decode_attn *a) {
    return a->split_keys ? a->split_keys : DECODE_ATTN_SPLIT_KEYS;
}

static uint32_t splits_of(const struct decode_attn *a) {
    return (a->len + split_keys_of(a) - 1) / split_keys_of(a);
}

extern "C" size_t decode_attn_scratch_bytes(const struct decode_attn *a) {
    size_t rows = (size_t)a->seqs * a->hq * splits_of(a);
    return rows * sizeof(float2) + rows * a->k.dim * sizeof(float);
}

extern "C" int decode_attn_cuda(const struct decode_attn *a, void *stream) {
    if (!a || !a->q || !a->out || !a->scratch || a->seqs == 0 || a->seqs > 65535 || a->len == 0 ||
        a->hq == 0 || a->hq > 65535 || a->k.heads == 0 || a->hq % a->k.heads != 0 ||
        a->k.dim == 0 || a->k.dim > DECODE_ATTN_MAX_DIM || a->v.dim != a->k.dim ||
        a->v.heads != a->k.heads || a->v.dtype != a->k.dtype || a->k.ring || a->v.ring ||
        (a->seqs > 1 && !a->k.pages) || vase__view_check(&a->k, a->len) < 0 ||
        vase__view_check(&a->v, a->len) < 0 || !dview_aligned(&a->k) || !dview_aligned(&a->v))
        return -EINVAL;
    uint32_t splits = splits_of(a);
    size_t rows = (size_t)a->seqs * a->hq * splits;
    float2 *part_ml = (float2 *)a->scratch;
    float *part_acc = (float *)(part_ml + rows);

    (void)cudaGetLastError();
    /* Grid (splits, hq, seqs). */
    decode_split_kernel<<<dim3(splits, a->hq, a->seqs), DA_THREADS, 0, (cudaStream_t)stream>>>(
        dview_of(&a->k), dview_of(&a->v), a->table_stride, a->len, split_keys_of(a),
        (const char *)a->q, (uint32_t)(a->k.dim * vase_dtype_size(a->k.dtype)), part_ml, part_acc);
    CUDA_LAUNCHED();
    /* Grid (hq, seqs). */
    decode_combine_kernel<<<dim3(a->hq, a->seqs), DA_THREADS, 0, (cudaStream_t)stream>>>(
        splits, a->k.dim, part_ml, part_acc, a->out);
    CUDA_LAUNCHED();
    return 0;
}
