/* SPDX-License-Identifier: MIT */

/*
 * The windowed attention score on the GPU for all KV heads of a layer at once (ALGORITHM.md,
 * "Scores"), reading K and the query ring in place through struct vase_view (device base,
 * device block table); the other scores are score_cuda.cu's.
 *
 * Windowed attention never materialises the [G*W x N] probability matrix. Pass 1
 * (attn_stats_kernel) computes, per tile of 64 candidates and per query row, the tile's logit
 * max and the sum of exp((l - max) * scale) over the tile, from a 64 x 64 logit tile held in
 * registers; attn_merge_kernel folds the tiles of each row into its max and 1 / sum (online
 * softmax). Pass 2 (attn_mass_kernel) recomputes the same logit tiles (same threads, same
 * order, so bit for bit the same logits) and adds exp((l - max) * scale) / sum over the window's
 * queries of each query head into per-candidate registers, reduced through shared memory:
 * only the [Hkv][G][N] window means reach global memory, as the CPU's per-head vectors do.
 * attn_finalize_kernel then applies the box filter and the mean over the group in the CPU's
 * order. Only the Q.K^T sums differ in order from the CPU (OpenBLAS), so the attention scores
 * agree with the CPU's to float rounding, not bit for bit.
 *
 * Every kernel that reads data checks it: a NaN or Inf, or a non-finite logit (or pushed score)
 * where the CPU would reject one, raises the workspace flag.
 */

#include <errno.h>
#include <math.h>

#include "internal_cuda.cuh"

/* ---- Windowed attention ---- */

#define ATT_TN 64       /* candidates per block */
#define ATT_TQ 64       /* query rows per chunk (all of one query head) */
#define ATT_BD 32       /* head dims per shared-memory stage */
#define ATT_THREADS 256 /* 16 x 16 threads, each a 4 x 4 block of the 64 x 64 logit tile */

struct att_args {
    struct dview k; /* candidate keys, heads Hkv */
    struct dview q; /* the window's queries, heads Hq = Hkv * group */
    uint32_t n, window, group, tiles;
    float scale; /* 1 / (sqrt(D) T), as the CPU computes it */
};

/* One stage of the logit tile: BD dims of TQ query rows and of TN candidates, dim-major, one
 * column of padding so that the transposing stores hit 32 distinct banks. */
struct att_smem {
    float q[ATT_BD][ATT_TQ + 1];
    float k[ATT_BD][ATT_TN + 1];
};

/*
 * acc[i][j] = q_(r0 + ty + 16 i) . k_(j0 + tx + 16 j) for query head g of KV head h (rows past
 * `rows` and candidates past n come out 0). Thread t = 16 ty + tx. For the loads, thread t
 * owns tile row t / 4 (of Q and of K) and dims (t % 4) * 8 .. + 7 of each stage. Every thread
 * of the block must call it (it synchronises the block).
 */
static __device__ __forceinline__ void logits_tile(const struct att_args &a, uint32_t h, uint32_t g,
                                                   uint32_t r0, uint32_t rows, uint32_t j0,
                                                   struct att_smem &sm, float (&acc)[4][4],
                                                   uint32_t &bad) {
    const uint32_t t = threadIdx.x, tx = t % 16, ty = t / 16;
    const uint32_t lr = t / 4, part = (t % 4) * 8, dim = a.k.dim;
    const bool kvalid = j0 + lr < a.n, qvalid = lr < rows;
    const char *krow = kvalid ? dview_row(a.k, j0 + lr, h) : nullptr;
    const char *qrow = qvalid ? dview_row(a.q, r0 + lr, h * a.group + g) : nullptr;

#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
            acc[i][j] = 0.0f;

    for (uint32_t d0 = 0; d0 < dim; d0 += ATT_BD) {
#pragma unroll
        for (uint32_t e = 0; e < 8; e++) {
            uint32_t d = d0 + part + e;
            float kv = 0.0f, qv = 0.0f;
            if (kvalid && d < dim)
                kv = load_elem(krow, a.k.dtype, d, bad);
            if (qvalid && d < dim)
                qv = load_elem(qrow, a.q.dtype, d, bad);
            sm.k[part + e][lr] = kv;
            sm.q[part + e][lr] = qv;
        }
        __syncthreads();
#pragma unroll 8
        for (int dd = 0; dd < ATT_BD; dd++) {
            float qa[4], kb[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                qa[i] = sm.q[dd][ty + 16 * i];
                kb[i] = sm.k[dd][tx + 16 * i];
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    acc[i][j] = __fmaf_rn(qa[i], kb[j], acc[i][j]);
        }
        __syncthreads();
    }
}

/* Pass 1. Grid (tiles, Hkv), ATT_THREADS threads. part: [Hkv][G][W][tiles] (max, sum) of each
 * query row over the block's tile. Checks every K and Q element and every logit. */
static __global__ void __launch_bounds__(ATT_THREADS)
    attn_stats_kernel(struct att_args a, float2 *part, int *flag) {
    __shared__ struct att_smem sm;
    const uint32_t tile = blockIdx.x, h = blockIdx.y, j0 = tile * ATT_TN;
    const uint32_t tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    uint32_t bad = 0;

    for (uint32_t g = 0; g < a.group; g++)
        for (uint32_t r0 = 0; r0 < a.window; r0 += ATT_TQ) {
            uint32_t rows = min((uint32_t)ATT_TQ, a.window - r0);
            float acc[4][4];
            logits_tile(a, h, g, r0, rows, j0, sm, acc, bad);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                uint32_t row = ty + 16 * i;
                float m = -INFINITY;
#pragma unroll
                for (int j = 0; j < 4; j++)
                    if (j0 + tx + 16 * j < a.n) {
                        if (row < rows && !finite_f(acc[i][j]))
                            bad = 1;
                        m = fmaxf(m, acc[i][j]);
                    }
                /* The 16 threads of a row are the lanes tx of one half-warp. */
                for (int off = 8; off > 0; off >>= 1)
                    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
                float s = 0.0f;
#pragma unroll
                for (int j = 0; j < 4; j++)
                    if (j0 + tx + 16 * j < a.n)
                        s += vase__exp_neg((acc[i][j] - m) * a.scale);
                for (int off = 8; off > 0; off >>= 1)
                    s += __shfl_xor_sync(0xffffffffu, s, off);
                if (tx == 0 && row < rows)
                    part[(((size_t)h * a.group + g) * a.window + r0 + row) * a.tiles + tile] =
                        make_float2(m, s);
            }
        }
    if (bad)
        raise_flag(flag);
}

/* Grid ceil(rows / 256), 256 threads, one query row each (rows = Hq * W): folds the row's
 * tiles, in tile order, into stats = (max, 1 / sum). */
static __global__ void attn_merge_kernel(const float2 *part, uint64_t nrows, uint32_t tiles,
                                         float scale, float2 *stats) {
    uint64_t r = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
    if (r >= nrows)
        return;
    const float2 *p = part + r * tiles;
    float m = -INFINITY, s = 0.0f;
    for (uint32_t t = 0; t < tiles; t++)
        m = fmaxf(m, p[t].x);
    for (uint32_t t = 0; t < tiles; t++)
        s += p[t].y * vase__exp_neg((p[t].x - m) * scale);
    stats[r] = make_float2(m, 1.0f / s);
}

/* Pass 2. Grid (tiles, Hkv), ATT_THREADS threads. stats: [Hkv][G][W] (max, 1 / sum);
 * ag: [Hkv][G][n], the mean over the window of each query head's probabilities.
 *
 * With the thread count alone as a bound, ptxas for sm_90 chose 40 registers and spilled 84
 * bytes of the tile's accumulators to local memory. A minimum of 5 blocks per SM caps it at 48
 * registers (what ptxas takes for sm_80 unbounded), which it fits without spilling on every
 * target, and lets 5 blocks share an SM where its 21 KiB of shared memory allows (sm_80, sm_90;
 * sm_86 and sm_89 hold 4). */
static __global__ void __launch_bounds__(ATT_THREADS, 5)
    attn_mass_kernel(struct att_args a, const float2 *stats, float *ag) {
    __shared__ struct att_smem sm;
    __shared__ float2 rs[ATT_TQ];
    __shared__ float colsum[16][ATT_TN];
    const uint32_t tile = blockIdx.x, h = blockIdx.y, j0 = tile * ATT_TN;
    const uint32_t tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    uint32_t bad = 0; /* pass 1 has checked everything */

    for (uint32_t g = 0; g < a.group; g++) {
        float col[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (uint32_t r0 = 0; r0 < a.window; r0 += ATT_TQ) {
            uint32_t rows = min((uint32_t)ATT_TQ, a.window - r0);
            /* Visible after the first barrier inside logits_tile(). */
            if (threadIdx.x < rows)
                rs[threadIdx.x] = stats[((size_t)h * a.group + g) * a.window + r0 + threadIdx.x];
            float acc[4][4];
            logits_tile(a, h, g, r0, rows, j0, sm, acc, bad);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                uint32_t row = ty + 16 * i;
                if (row >= rows)
                    continue;
                float2 st = rs[row];
#pragma unroll
                for (int j = 0; j < 4; j++)
                    if (j0 + tx + 16 * j < a.n)
                        col[j] += vase__exp_neg((acc[i][j] - st.x) * a.scale) * st.y;
            }
            __syncthreads(); /* rs is rewritten by the next chunk */
        }
#pragma unroll
        for (int j = 0; j < 4; j++)
            colsum[ty][tx + 16 * j] = col[j];
        __syncthreads();
        if (threadIdx.x < ATT_TN) {
            float s = 0.0f;
            for (int y = 0; y < 16; y++)
                s += colsum[y][threadIdx.x];
            uint32_t j = j0 + threadIdx.x;
            if (j < a.n)
                ag[((size_t)h * a.group + g) * a.n + j] = s / (float)a.window;
        }
        __syncthreads(); /* colsum is rewritten by the next group */
    }
}

/* Grid (ceil(n / 256), Hkv), 256 threads, one candidate each: box filter of each query head's
 * mean along slot order (zero outside [0, n), divided by the width), then the mean over the
 * group, in the CPU's order. out: [Hkv][n]. */
static __global__ void attn_finalize_kernel(const float *ag, uint32_t n, uint32_t group,
                                            uint32_t smooth, float *out) {
    uint32_t j = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y;
    if (j >= n)
        return;
    int64_t half = smooth / 2;
    float o = 0.0f;
    for (uint32_t g = 0; g < group; g++) {
        const float *m = ag + ((size_t)h * group + g) * n;
        float f;
        if (smooth > 1) {
            float s = 0.0f;
            for (int64_t d = -half; d <= half; d++) {
                int64_t t = (int64_t)j + d;
                if (t >= 0 && t < (int64_t)n)
                    s += m[t];
            }
            f = s / (float)smooth;
        } else {
            f = m[j];
        }
        o += f;
    }
    out[(size_t)h * n + j] = o / (float)group;
}

/* Grid ceil(count / 256), 256 threads: pushed scores, each >= 0 and finite, copied. */
static __global__ void scores_copy_kernel(const float *in, uint64_t count, float *out, int *flag) {
    uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
    if (i >= count)
        return;
    float s = in[i];
    if (!(s >= 0.0f) || s == INFINITY)
        raise_flag(flag);
    out[i] = s;
}

static uint32_t attn_tiles(uint32_t n) {
    return (n + ATT_TN - 1) / ATT_TN;
}

int vase__cuda_scores_reserve(const struct vase_plan_input *in, struct vase_cuda_workspace *ws) {
    if (in->scores)
        return 0;
    uint32_t n = in->n, w = in->params.window, tiles = attn_tiles(n);
    size_t rows = (size_t)in->hq * w;
    void *p;
    int r;
    if ((r = vase__cws_get(ws, CWS_PART, rows * tiles * sizeof(float2), &p)) < 0 ||
        (r = vase__cws_get(ws, CWS_STATS, rows * sizeof(float2), &p)) < 0 ||
        (r = vase__cws_get(ws, CWS_AG, (size_t)in->hq * n * sizeof(float), &p)) < 0)
        return r;
    return 0;
}

/* Launches the attention score of every KV head into out [Hkv][n]; the buffers come from
 * vase__cuda_scores_reserve(). */
int vase__cuda_scores(const struct vase_plan_input *in, struct vase_cuda_workspace *ws,
                      cudaStream_t stream, float *out, int *flag) {
    uint32_t heads = in->k.heads, n = in->n;
    if (in->scores) {
        uint64_t count = (uint64_t)heads * n;
        scores_copy_kernel<<<blocks_for(count, 256), 256, 0, stream>>>(in->scores, count, out,
                                                                       flag);
        CUDA_LAUNCHED();
        return 0;
    }

    struct att_args a;
    a.k = dview_of(&in->k);
    a.q = dview_of(&in->q);
    a.n = n;
    a.window = in->params.window;
    a.group = in->hq / heads;
    a.tiles = attn_tiles(n);
    a.scale = 1.0f / (sqrtf((float)in->k.dim) * in->params.temperature);

    float2 *part = (float2 *)ws->buf[CWS_PART], *stats = (float2 *)ws->buf[CWS_STATS];
    float *ag = (float *)ws->buf[CWS_AG];
    uint64_t rows = (uint64_t)in->hq * a.window;

    /* Grid (tiles, Hkv): tiles <= 2^16 for n <= VASE_MAX_TOKENS, Hkv <= 1024. */
    dim3 grid(a.tiles, heads);
    attn_stats_kernel<<<grid, ATT_THREADS, 0, stream>>>(a, part, flag);
    CUDA_LAUNCHED();
    /* Grid ceil(Hq * W / 256). */
    attn_merge_kernel<<<blocks_for(rows, 256), 256, 0, stream>>>(part, rows, a.tiles, a.scale,
                                                                 stats);
    CUDA_LAUNCHED();
    attn_mass_kernel<<<grid, ATT_THREADS, 0, stream>>>(a, stats, ag);
    CUDA_LAUNCHED();
    /* Grid (ceil(n / 256), Hkv). */
    attn_finalize_kernel<<<dim3(blocks_for(n, 256), heads), 256, 0, stream>>>(
        ag, n, a.group, in->params.smooth, out);
    CUDA_LAUNCHED();
    return 0;
}

/* ---- The attention score alone (tests compare it with the CPU's) ---- */

extern "C" int vase_score_attention_cuda(const struct vase_plan_input *in,
                                         struct vase_cuda_workspace *ws, void *stream, float *out) {
    struct vase_cuda_workspace *own = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    int r;

    if (!in || !out || vase_params_check(&in->params, in->policy) < 0 || in->n == 0 ||
        in->n > VASE_MAX_TOKENS || in->k.heads == 0 || in->k.heads > VASE_MAX_HEADS)
        return -EINVAL;
    if (!in->scores) {
        const struct vase_view *k = &in->k, *q = &in->q;
        if (vase__view_check(k, in->n) < 0 || !dview_aligned(k) || in->hq == 0 ||
            in->hq % k->heads != 0 || in->hq > VASE_MAX_HEADS ||
            vase__view_check(q, in->params.window) < 0 || q->heads != in->hq || q->dim != k->dim ||
            !dview_aligned(q))
            return -EINVAL;
    }

    r = vase__cuda_enter(&ws, &own);
    if (r < 0)
        goto out;
    r = vase__cuda_scores_reserve(in, ws);
    if (r < 0)
        goto out;
    r = vase__cuda_errno(cudaMemsetAsync(ws->buf[CWS_FLAG], 0, sizeof(int), st));
    if (r == 0)
        r = vase__cuda_scores(in, ws, st, out, (int *)ws->buf[CWS_FLAG]);
    r = vase__cuda_finish(ws, st, r);
out:
    vase_cuda_workspace_free(own);
    return r;
}
