/* SPDX-License-Identifier: MIT */

/*
 * Scores on the GPU: windowed attention, value magnitude, sketched leverage and R-KV
 * redundancy for all KV heads of a layer at once (ALGORITHM.md, "Scores"), reading K, V and
 * the query ring in place through struct vase_view (device base, device block table).
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
 * The value metric, the leverage and the redundancy are computed one candidate row per thread
 * in the CPU's exact summation order (and with no FMA contraction, see internal_cuda.cuh), and
 * their per-head sums (in double, or float where the CPU sums in float) by one warp per head
 * in slot order, so they match the CPU bit for bit; the only exceptions are the double
 * transcendentals (log, sin, cos of the draws, exp of the redundancy), which agree after
 * rounding to float except when a result lies within a double ulp of a float rounding boundary.
 *
 * Every kernel that reads data a policy reads checks it: a NaN or Inf, or a non-finite logit or
 * result where the CPU would reject one, raises the workspace flag.
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

/* ---- Value magnitude ---- */

#define ROW_THREADS 128 /* one candidate row per thread */

/* Grid (ceil(n / 128), Hkv), 128 threads, one row each: the metric of vase_value_metric(), in
 * its order. out: [Hkv][n]. */
static __global__ void __launch_bounds__(ROW_THREADS)
    metric_kernel(struct dview v, uint32_t n, int metric, float *out, int *flag) {
    uint32_t j = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y;
    if (j >= n)
        return;
    const char *row = dview_row(v, j, h);
    uint32_t dim = v.dim, bad = 0;
    float res;

    switch (metric) {
    case VASE_METRIC_RANGE: {
        float lo = load_elem(row, v.dtype, 0, bad), hi = lo;
        for (uint32_t d = 1; d < dim; d++) {
            float x = load_elem(row, v.dtype, d, bad);
            lo = x < lo ? x : lo;
            hi = x > hi ? x : hi;
        }
        res = hi - lo;
        break;
    }
    case VASE_METRIC_L2: {
        float s = 0.0f;
        for (uint32_t d = 0; d < dim; d++) {
            float x = load_elem(row, v.dtype, d, bad);
            s += x * x;
        }
        res = sqrtf(s);
        break;
    }
    case VASE_METRIC_VAR: {
        float s = 0.0f;
        for (uint32_t d = 0; d < dim; d++)
            s += load_elem(row, v.dtype, d, bad);
        float mean = s / (float)dim, ss = 0.0f;
        for (uint32_t d = 0; d < dim; d++) {
            float x = load_elem(row, v.dtype, d, bad);
            ss += (x - mean) * (x - mean);
        }
        res = ss / (float)(dim - 1);
        break;
    }
    default: {
        float m = 0.0f;
        for (uint32_t d = 0; d < dim; d++) {
            float x = fabsf(load_elem(row, v.dtype, d, bad));
            m = x > m ? x : m;
        }
        res = m;
        break;
    }
    }
    if (bad || !finite_f(res))
        raise_flag(flag);
    out[(size_t)h * n + j] = res;
}

int vase__cuda_metric(const struct vase_view *v, uint32_t heads, uint32_t n, enum vase_metric m,
                      cudaStream_t stream, float *out, int *flag) {
    /* Grid (ceil(n / 128), Hkv). */
    metric_kernel<<<dim3(blocks_for(n, ROW_THREADS), heads), ROW_THREADS, 0, stream>>>(
        dview_of(v), n, (int)m, out, flag);
    CUDA_LAUNCHED();
    return 0;
}

/* ---- Per-head sums in slot order ---- */

/*
 * Grid heads, 32 threads (one warp per head): tot[h] = sum_j x[h][j] in ascending j, in double
 * (rounded to float at the end) or in float, exactly as the CPU's loops sum. The warp loads 32
 * values at a time and every lane adds all of them in order, so all lanes hold the same sum.
 * With check set, a non-finite total raises the flag.
 */
static __global__ void __launch_bounds__(32)
    head_sum_kernel(const float *x, uint32_t n, int in_double, int check, float *tot, int *flag) {
    const uint32_t h = blockIdx.x, lane = threadIdx.x;
    const float *p = x + (size_t)h * n;
    double sd = 0.0;
    float sf = 0.0f;
    float next = lane < n ? p[lane] : 0.0f;

    for (uint32_t base = 0; base < n; base += 32) {
        float cur = next;
        uint32_t m = min(32u, n - base);
        if (base + 32 < n)
            next = base + 32 + lane < n ? p[base + 32 + lane] : 0.0f;
        if (in_double)
            for (uint32_t i = 0; i < m; i++)
                sd += (double)__shfl_sync(0xffffffffu, cur, (int)i);
        else
            for (uint32_t i = 0; i < m; i++)
                sf += __shfl_sync(0xffffffffu, cur, (int)i);
    }
    if (lane == 0) {
        if (in_double) {
            if (check && !isfinite(sd))
                raise_flag(flag);
            tot[h] = (float)sd;
        } else {
            tot[h] = sf;
        }
    }
}

/* ---- Sketched leverage ---- */

/* Grid ceil(D r / 256), 256 threads: gm [D][r] = (injected normals, checked, or the draws of
 * VASE_RNG_HEAD_SHARED) / sqrt(r), as vase_sketch() makes it. */
static __global__ void sketch_kernel(const float *gauss, struct vase_rng rng, uint32_t count,
                                     uint32_t r, float *gm, int *flag) {
    uint32_t e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= count)
        return;
    float g;
    if (gauss) {
        g = gauss[e];
        if (!finite_f(g))
            raise_flag(flag);
    } else {
        g = normal_draw(rng, VASE_RNG_HEAD_SHARED, e);
    }
    gm[e] = g / sqrtf((float)r);
}

/* ||x Gm||^2 of one row in the order of tile_sketch() in score.c: sketch columns eight at a
 * time, then four, then one; each column's dot product in ascending d; the squares added to
 * the total one by one for the groups of eight and the singles, as (((a0^2 + a1^2) + a2^2) +
 * a3^2) for a group of four. */
static __device__ __forceinline__ float sketch_sq(const char *row, int dtype, uint32_t dim,
                                                  const float *__restrict__ gm, uint32_t r) {
    uint32_t bad = 0; /* a NaN or Inf shows in the result */
    float acc2 = 0.0f;
    uint32_t c = 0;
    for (; c + 8 <= r; c += 8) {
        float a[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        for (uint32_t d = 0; d < dim; d++) {
            float x = load_elem(row, dtype, d, bad);
            const float *g = gm + (size_t)d * r + c;
#pragma unroll
            for (int i = 0; i < 8; i++)
                a[i] += x * g[i];
        }
#pragma unroll
        for (int i = 0; i < 8; i++)
            acc2 += a[i] * a[i];
    }
    for (; c + 4 <= r; c += 4) {
        float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
        for (uint32_t d = 0; d < dim; d++) {
            float x = load_elem(row, dtype, d, bad);
            const float *g = gm + (size_t)d * r + c;
            a0 += x * g[0];
            a1 += x * g[1];
            a2 += x * g[2];
            a3 += x * g[3];
        }
        acc2 += a0 * a0 + a1 * a1 + a2 * a2 + a3 * a3;
    }
    for (; c < r; c++) {
        float a = 0.0f;
        for (uint32_t d = 0; d < dim; d++)
            a += load_elem(row, dtype, d, bad) * gm[(size_t)d * r + c];
        acc2 += a * a;
    }
    return acc2;
}

/* Grid (ceil(n / 128), Hkv), 128 threads, one candidate each: c [Hkv][n] = k2 v2, raising the
 * flag where it is not finite (any NaN or Inf in the row's K or V makes it so). */
static __global__ void __launch_bounds__(ROW_THREADS)
    leverage_kernel(struct dview k, struct dview v, uint32_t n, const float *gm, uint32_t r,
                    float *c, int *flag) {
    uint32_t j = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y;
    if (j >= n)
        return;
    float k2 = sketch_sq(dview_row(k, j, h), k.dtype, k.dim, gm, r);
    float v2 = sketch_sq(dview_row(v, j, h), v.dtype, v.dim, gm, r);
    float cj = k2 * v2;
    if (!finite_f(cj))
        raise_flag(flag);
    c[(size_t)h * n + j] = cj;
}

int vase__cuda_sketch(const float *gauss, const struct vase_rng *rng, uint32_t dim, uint32_t r,
                      cudaStream_t stream, float *gm, int *flag) {
    uint32_t count = dim * r; /* <= 1024 * 256 */
    /* Grid ceil(D r / 256). */
    sketch_kernel<<<blocks_for(count, 256), 256, 0, stream>>>(gauss, *rng, count, r, gm, flag);
    CUDA_LAUNCHED();
    return 0;
}

int vase__cuda_leverage(const struct vase_view *k, const struct vase_view *v, uint32_t heads,
                        uint32_t n, const float *gm, uint32_t r, cudaStream_t stream, float *c,
                        float *tot, int *flag) {
    /* Grid (ceil(n / 128), Hkv). */
    leverage_kernel<<<dim3(blocks_for(n, ROW_THREADS), heads), ROW_THREADS, 0, stream>>>(
        dview_of(k), dview_of(v), n, gm, r, c, flag);
    CUDA_LAUNCHED();
    /* Grid Hkv, one warp each: the total in double, rejected if not finite. */
    head_sum_kernel<<<heads, 32, 0, stream>>>(c, n, 1, 1, tot, flag);
    CUDA_LAUNCHED();
    return 0;
}

/* ---- R-KV redundancy ---- */

/* Grid (ceil(n / 128), Hkv), 128 threads, one key each: kn [Hkv][n][D] = k / (||k|| + 1e-8). */
static __global__ void __launch_bounds__(ROW_THREADS)
    rkv_norm_kernel(struct dview k, uint32_t n, float *kn, int *flag) {
    uint32_t j = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y;
    if (j >= n)
        return;
    const char *row = dview_row(k, j, h);
    uint32_t dim = k.dim, bad = 0;
    float ss = 0.0f;
    for (uint32_t d = 0; d < dim; d++) {
        float x = load_elem(row, k.dtype, d, bad);
        ss += x * x;
    }
    float inv = 1.0f / (sqrtf(ss) + 1e-8f);
    float *out = kn + ((size_t)h * n + j) * dim;
    for (uint32_t d = 0; d < dim; d++)
        out[d] = load_elem(row, k.dtype, d, bad) * inv;
    if (bad)
        raise_flag(flag);
}

/* Grid (ceil(D / 64), Hkv), 64 threads, one dim each: dsum [Hkv][D] = sum_j kn[j][d] in double,
 * in ascending j. */
static __global__ void rkv_colsum_kernel(const float *kn, uint32_t n, uint32_t dim, double *dsum) {
    uint32_t d = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y;
    if (d >= dim)
        return;
    const float *p = kn + (size_t)h * n * dim + d;
    double s = 0.0;
    for (uint32_t j = 0; j < n; j++)
        s += p[(size_t)j * dim];
    dsum[(size_t)h * dim + d] = s;
}

/* Grid (ceil(n / 128), Hkv), 128 threads, one key each: raw [Hkv][n] = (S . kn_j - kn_j . kn_j)
 * / n, the mean cosine similarity with a zero diagonal, in double as the CPU computes it. */
static __global__ void __launch_bounds__(ROW_THREADS)
    rkv_rowdot_kernel(const float *kn, const double *dsum, uint32_t n, uint32_t dim, float *raw) {
    uint32_t j = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y;
    if (j >= n)
        return;
    const float *row = kn + ((size_t)h * n + j) * dim;
    const double *s = dsum + (size_t)h * dim;
    double dot = 0.0, self = 0.0;
    for (uint32_t d = 0; d < dim; d++) {
        dot += s[d] * row[d];
        self += (double)row[d] * row[d];
    }
    raw[(size_t)h * n + j] = (float)((dot - self) / n);
}

#define EXP_THREADS 256

/* Grid Hkv, 256 threads: e [Hkv][n] = exp(raw - max_j raw), the max being exact whatever the
 * order, the exponential in double rounded once (the CPU's expf is correctly rounded but for
 * rare last-bit cases). */
static __global__ void __launch_bounds__(EXP_THREADS)
    rkv_exp_kernel(const float *raw, uint32_t n, float *e) {
    __shared__ float wmax[EXP_THREADS / 32];
    const uint32_t h = blockIdx.x;
    const float *x = raw + (size_t)h * n;
    float m = -INFINITY;
    for (uint32_t j = threadIdx.x; j < n; j += EXP_THREADS)
        m = fmaxf(m, x[j]);
    for (int off = 16; off > 0; off >>= 1)
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    if (threadIdx.x % 32 == 0)
        wmax[threadIdx.x / 32] = m;
    __syncthreads();
    m = wmax[0];
    for (int w = 1; w < EXP_THREADS / 32; w++)
        m = fmaxf(m, wmax[w]);
    for (uint32_t j = threadIdx.x; j < n; j += EXP_THREADS)
        e[(size_t)h * n + j] = (float)exp((double)(x[j] - m));
}

int vase__cuda_redundancy(const struct vase_view *k, uint32_t heads, uint32_t n, float *kn,
                          double *dsum, float *raw, cudaStream_t stream, float *red_exp, float *tot,
                          int *flag) {
    uint32_t dim = k->dim;
    dim3 rows(blocks_for(n, ROW_THREADS), heads);

    /* Grid (ceil(n / 128), Hkv). */
    rkv_norm_kernel<<<rows, ROW_THREADS, 0, stream>>>(dview_of(k), n, kn, flag);
    CUDA_LAUNCHED();
    /* Grid (ceil(D / 64), Hkv). */
    rkv_colsum_kernel<<<dim3(blocks_for(dim, 64), heads), 64, 0, stream>>>(kn, n, dim, dsum);
    CUDA_LAUNCHED();
    rkv_rowdot_kernel<<<rows, ROW_THREADS, 0, stream>>>(kn, dsum, n, dim, raw);
    CUDA_LAUNCHED();
    /* Grid Hkv. */
    rkv_exp_kernel<<<heads, EXP_THREADS, 0, stream>>>(raw, n, red_exp);
    CUDA_LAUNCHED();
    /* Grid Hkv, one warp each: the softmax denominator in float, in slot order. */
    head_sum_kernel<<<heads, 32, 0, stream>>>(red_exp, n, 0, 0, tot, flag);
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

/* ---- The other scores alone, for tests: the CPU's test exports, all heads at once ---- */

/* Grid (ceil(n / 256), heads), 256 threads: out [heads][n] = x / tot[h], or x where tot[h] <= 0
 * when positive_only is set (the leverage's rule). out may be x. */
static __global__ void div_kernel(const float *x, const float *tot, uint32_t n, int positive_only,
                                  float *out) {
    uint32_t j = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y;
    if (j >= n)
        return;
    size_t i = (size_t)h * n + j;
    float t = tot[h];
    out[i] = positive_only && !(t > 0.0f) ? x[i] : x[i] / t;
}

static int div_launch(const float *x, const float *tot, uint32_t heads, uint32_t n,
                      int positive_only, cudaStream_t stream, float *out) {
    /* Grid (ceil(n / 256), heads). */
    div_kernel<<<dim3(blocks_for(n, 256), heads), 256, 0, stream>>>(x, tot, n, positive_only, out);
    CUDA_LAUNCHED();
    return 0;
}

static bool view_ok(const struct vase_view *v, uint32_t n) {
    return v && vase__view_check(v, n) == 0 && dview_aligned(v) && n > 0 && n <= VASE_MAX_TOKENS;
}

extern "C" int vase_value_metric_cuda(const struct vase_view *v, uint32_t n, enum vase_metric m,
                                      struct vase_cuda_workspace *ws, void *stream, float *out) {
    struct vase_cuda_workspace *own = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    int r;

    if (!out || !view_ok(v, n) || (unsigned)m >= _VASE_METRIC_MAX ||
        (m == VASE_METRIC_VAR && v->dim < 2))
        return -EINVAL;
    r = vase__cuda_enter(&ws, &own);
    if (r < 0)
        goto out;
    r = vase__cuda_errno(cudaMemsetAsync(ws->buf[CWS_FLAG], 0, sizeof(int), st));
    if (r == 0)
        r = vase__cuda_metric(v, v->heads, n, m, st, out, (int *)ws->buf[CWS_FLAG]);
    r = vase__cuda_finish(ws, st, r);
out:
    vase_cuda_workspace_free(own);
    return r;
}

extern "C" int vase_score_leverage_cuda(const struct vase_view *k, const struct vase_view *v,
                                        uint32_t n, const float *gm, uint32_t rank,
                                        struct vase_cuda_workspace *ws, void *stream, float *out) {
    struct vase_cuda_workspace *own = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    void *tot;
    int r;

    if (!out || !gm || !view_ok(k, n) || !view_ok(v, n) || k->heads != v->heads ||
        k->dim != v->dim || rank == 0 || rank > VASE_MAX_RANK)
        return -EINVAL;
    r = vase__cuda_enter(&ws, &own);
    if (r < 0)
        goto out;
    r = vase__cws_get(ws, CWS_TOT, k->heads * sizeof(float), &tot);
    if (r < 0)
        goto out;
    r = vase__cuda_errno(cudaMemsetAsync(ws->buf[CWS_FLAG], 0, sizeof(int), st));
    if (r == 0)
        r = vase__cuda_leverage(k, v, k->heads, n, gm, rank, st, out, (float *)tot,
                                (int *)ws->buf[CWS_FLAG]);
    if (r == 0)
        r = div_launch(out, (float *)tot, k->heads, n, 1, st, out);
    r = vase__cuda_finish(ws, st, r);
out:
    vase_cuda_workspace_free(own);
    return r;
}

extern "C" int vase_score_redundancy_cuda(const struct vase_view *k, uint32_t n,
                                          struct vase_cuda_workspace *ws, void *stream,
                                          float *out) {
    struct vase_cuda_workspace *own = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    size_t hn;
    void *kn, *dsum, *raw, *tot;
    int r;

    if (!out || !view_ok(k, n))
        return -EINVAL;
    hn = (size_t)k->heads * n;
    r = vase__cuda_enter(&ws, &own);
    if (r < 0)
        goto out;
    if ((r = vase__cws_get(ws, CWS_KN, hn * k->dim * sizeof(float), &kn)) < 0 ||
        (r = vase__cws_get(ws, CWS_DSUM, (size_t)k->heads * k->dim * sizeof(double), &dsum)) < 0 ||
        (r = vase__cws_get(ws, CWS_M, hn * sizeof(float), &raw)) < 0 ||
        (r = vase__cws_get(ws, CWS_TOT, k->heads * sizeof(float), &tot)) < 0)
        goto out;
    r = vase__cuda_errno(cudaMemsetAsync(ws->buf[CWS_FLAG], 0, sizeof(int), st));
    if (r == 0)
        r = vase__cuda_redundancy(k, k->heads, n, (float *)kn, (double *)dsum, (float *)raw, st,
                                  out, (float *)tot, (int *)ws->buf[CWS_FLAG]);
    if (r == 0)
        r = div_launch(out, (float *)tot, k->heads, n, 0, st, out);
    r = vase__cuda_finish(ws, st, r);
out:
    vase_cuda_workspace_free(own);
    return r;
}
