/* SPDX-License-Identifier: MIT */

/*
 * Scores on the GPU: value magnitude, sketched leverage and R-KV redundancy for all KV heads of
 * a layer at once (ALGORITHM.md, "Scores"), reading K and V in place through struct vase_view
 * (device base, device block table); the windowed attention score is score_attn_cuda.cu's.
 *
 * Each is computed one candidate row per thread in the CPU's exact summation order (and with
 * no FMA contraction, see internal_cuda.cuh), and its per-head sums (in double, or float where
 * the CPU sums in float) by one warp per head in slot order, so they match the CPU bit for bit;
 * the only exceptions are the double transcendentals (log, sin, cos of the draws, exp of the
 * redundancy), which agree after rounding to float except when a result lies within a double
 * ulp of a float rounding boundary.
 *
 * Every kernel that reads data a policy reads checks it: a NaN or Inf, or a non-finite result
 * where the CPU would reject one, raises the workspace flag.
 */

#include <errno.h>
#include <math.h>

#include "internal_cuda.cuh"

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
