/* SPDX-License-Identifier: MIT */

/*
 * Scores: windowed attention, value magnitude, sketched leverage and R-KV redundancy, per KV
 * head, in float32 (ALGORITHM.md, "Scores").
 *
 * The windowed attention is the expensive one: G * W queries against N candidates. It runs
 * one query head at a time: a BLAS product writes that head's [W x N] logits into a reused
 * buffer, and one fused pass per row takes the max, the exponentials, the sum and adds the
 * normalised row into the head's running mean. No [G*W x N] matrix exists at any time, and the
 * box filter and group mean work on vectors of length N.
 */

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>

#include "internal.h"

/*
 * The kernels run their own threads (vase_plan(), the daemon's evictors), each calling the BLAS
 * on small products; the BLAS must therefore be safe to call from several threads at once (the
 * Debian "pthread" build of OpenBLAS is; its "serial" build is not) and must not start threads
 * of its own on top of ours. Every BLAS call goes through blas_ready() first.
 */
static pthread_once_t blas_once = PTHREAD_ONCE_INIT;

static void blas_single_thread(void) {
    openblas_set_num_threads(1);
}

void vase__blas_init(void) {
    pthread_once(&blas_once, blas_single_thread);
}

/* Reductions run in LANES independent accumulators: without them the compiler must keep the
 * sequential order of a float sum or max and cannot vectorise the loop. */
#define LANES 16

/* exp((x - max) * scale) over a row, in place; returns the row's sum, or NaN if the row holds
 * a NaN or Inf (a non-finite key or query makes every logit it touches non-finite, so this is
 * where the attention path rejects them). */
VASE_HOT static float exp_row(float *row, uint32_t n, float scale) {
    float mxl[LANES], chk[LANES], sml[LANES];
    uint32_t j, full = n - n % LANES;

    for (int l = 0; l < LANES; l++) {
        mxl[l] = row[0];
        chk[l] = 0.0f;
        sml[l] = 0.0f;
    }
    /* x * 0 is NaN exactly when x is NaN or Inf, and NaN survives the sum. */
    for (j = 0; j < full; j += LANES)
        for (int l = 0; l < LANES; l++) {
            float x = row[j + l];
            mxl[l] = x > mxl[l] ? x : mxl[l];
            chk[l] += x * 0.0f;
        }
    for (; j < n; j++) {
        mxl[0] = row[j] > mxl[0] ? row[j] : mxl[0];
        chk[0] += row[j] * 0.0f;
    }
    float mx = mxl[0], bad = 0.0f;
    for (int l = 0; l < LANES; l++) {
        mx = mxl[l] > mx ? mxl[l] : mx;
        bad += chk[l];
    }
    if (bad != 0.0f)
        return NAN;

    /* Element-wise, so it vectorises on its own. */
    for (j = 0; j < n; j++)
        row[j] = vase__exp_neg((row[j] - mx) * scale);

    for (j = 0; j < full; j += LANES)
        for (int l = 0; l < LANES; l++)
            sml[l] += row[j + l];
    for (; j < n; j++)
        sml[0] += row[j];
    float sum = 0.0f;
    for (int l = 0; l < LANES; l++)
        sum += sml[l];
    return sum;
}

VASE_HOT static void axpy_row(float *acc, const float *row, uint32_t n, float a) {
    for (uint32_t j = 0; j < n; j++)
        acc[j] += row[j] * a;
}

/* Box filter of odd width w along slot order: zero outside [0, n), always divided by w. */
static void box_filter(const float *in, float *out, uint32_t n, uint32_t w) {
    int64_t half = w / 2;
    for (int64_t j = 0; j < (int64_t)n; j++) {
        float s = 0.0f;
        for (int64_t d = -half; d <= half; d++) {
            int64_t t = j + d;
            if (t >= 0 && t < (int64_t)n)
                s += in[t];
        }
        out[j] = s / (float)w;
    }
}

int vase_score_attention(const struct vase_plan_input *in, uint32_t head, struct vase_workspace *ws,
                         float *out) {
    uint32_t n = in->n, dim = in->k.dim, w = in->params.window;
    uint32_t group = in->hq / in->k.heads;

    if (in->scores) {
        const float *s = in->scores + (size_t)head * n;
        for (uint32_t j = 0; j < n; j++)
            if (!(s[j] >= 0.0f) || s[j] == INFINITY)
                return -EINVAL;
        memcpy(out, s, (size_t)n * sizeof(float));
        return 0;
    }

    float *kbuf = vase__ws_get(ws, WS_K, (size_t)n * dim * sizeof(float));
    float *qbuf = vase__ws_get(ws, WS_Q, (size_t)w * dim * sizeof(float));
    float *logits = vase__ws_get(ws, WS_LOGITS, (size_t)w * n * sizeof(float));
    float *mean = vase__ws_get(ws, WS_HEAD, (size_t)n * sizeof(float));
    float *filt = vase__ws_get(ws, WS_AUX, (size_t)n * sizeof(float));
    if (!kbuf || !qbuf || !logits || !mean || !filt)
        return -ENOMEM;

    /* NaN and Inf in K and Q surface as non-finite logits, checked by exp_row(), so the
     * gathers here skip their own check. */
    vase__gather(&in->k, head, n, kbuf);

    vase__blas_init();
    const float scale = 1.0f / (sqrtf((float)dim) * in->params.temperature);
    memset(out, 0, (size_t)n * sizeof(float));
    for (uint32_t g = 0; g < group; g++) {
        uint32_t h = head * group + g;
        vase__gather(&in->q, h, w, qbuf);
        /* logits [W][n] = Q [W][D] . K^T */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)w, (int)n, (int)dim, 1.0f, qbuf,
                    (int)dim, kbuf, (int)dim, 0.0f, logits, (int)n);
        memset(mean, 0, (size_t)n * sizeof(float));
        for (uint32_t i = 0; i < w; i++) {
            float *row = logits + (size_t)i * n;
            float sum = exp_row(row, n, scale);
            if (!isfinite(sum))
                return -EINVAL;
            axpy_row(mean, row, n, 1.0f / sum);
        }
        for (uint32_t j = 0; j < n; j++)
            mean[j] /= (float)w;
        if (in->params.smooth > 1) {
            box_filter(mean, filt, n, in->params.smooth);
            axpy_row(out, filt, n, 1.0f);
        } else {
            axpy_row(out, mean, n, 1.0f);
        }
    }
    for (uint32_t j = 0; j < n; j++)
        out[j] /= (float)group;
    return 0;
}

int vase_value_metric(const struct vase_view *v, uint32_t head, uint32_t n, enum vase_metric m,
                      float *out) {
    if (!v || !out || (unsigned)m >= _VASE_METRIC_MAX || vase__view_check(v, n) < 0 ||
        head >= v->heads || (m == VASE_METRIC_VAR && v->dim < 2))
        return -EINVAL;
    uint32_t dim = v->dim;
    float row[dim];
    for (uint32_t j = 0; j < n; j++) {
        if (j + VASE_PREFETCH_AHEAD < n)
            vase__prefetch_row(v, j + VASE_PREFETCH_AHEAD, head);
        if (vase_view_read_row(v, j, head, row) < 0)
            return -EINVAL;
        switch (m) {
        case VASE_METRIC_RANGE: {
            float lo = row[0], hi = row[0];
            for (uint32_t d = 1; d < dim; d++) {
                lo = row[d] < lo ? row[d] : lo;
                hi = row[d] > hi ? row[d] : hi;
            }
            out[j] = hi - lo;
            break;
        }
        case VASE_METRIC_L2: {
            float s = 0.0f;
            for (uint32_t d = 0; d < dim; d++)
                s += row[d] * row[d];
            out[j] = sqrtf(s);
            break;
        }
        case VASE_METRIC_VAR: {
            float s = 0.0f;
            for (uint32_t d = 0; d < dim; d++)
                s += row[d];
            float mean = s / (float)dim, ss = 0.0f;
            for (uint32_t d = 0; d < dim; d++)
                ss += (row[d] - mean) * (row[d] - mean);
            out[j] = ss / (float)(dim - 1);
            break;
        }
        default: {
            float a = 0.0f;
            for (uint32_t d = 0; d < dim; d++)
                a = fabsf(row[d]) > a ? fabsf(row[d]) : a;
            out[j] = a;
            break;
        }
        }
        if (!isfinite(out[j])) /* a sum of squares of huge values can still overflow */
            return -EINVAL;
    }
    return 0;
}

void vase_sketch(const struct vase_rng *rng, const float *gauss, uint32_t dim, uint32_t r,
                 float *gm) {
    size_t count = (size_t)dim * r;
    if (gauss)
        memcpy(gm, gauss, count * sizeof(float));
    else
        vase_rng_normal(rng, VASE_RNG_HEAD_SHARED, gm, count);
    const float root = sqrtf((float)r);
    for (size_t i = 0; i < count; i++)
        gm[i] /= root;
}

#define TILE 16

typedef float vf_tile __attribute__((vector_size(TILE * sizeof(float))));

/*
 * ||X_j Gm||^2 for the TILE rows of one transposed tile [D][TILE]: one vector multiply-add per
 * (d, c) across the tile's rows. Eight, then four sketch columns at a time: independent
 * accumulator chains keep the floating-point units busy instead of waiting on one add's
 * latency. For the thin Gm (r around 20) this beats a general GEMM.
 */
VASE_HOT static void tile_sketch(const vf_tile *tile, uint32_t dim, const float *gm, uint32_t r,
                                 float *out) {
    vf_tile acc2 = {0};
    uint32_t c = 0;
    for (; c + 8 <= r; c += 8) {
        vf_tile a[8] = {{0}};
        for (uint32_t d = 0; d < dim; d++) {
            const float *g = gm + (size_t)d * r + c;
            for (int i = 0; i < 8; i++)
                a[i] += tile[d] * g[i];
        }
        for (int i = 0; i < 8; i++)
            acc2 += a[i] * a[i];
    }
    for (; c + 4 <= r; c += 4) {
        vf_tile a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        for (uint32_t d = 0; d < dim; d++) {
            const float *g = gm + (size_t)d * r + c;
            a0 += tile[d] * g[0];
            a1 += tile[d] * g[1];
            a2 += tile[d] * g[2];
            a3 += tile[d] * g[3];
        }
        acc2 += a0 * a0 + a1 * a1 + a2 * a2 + a3 * a3;
    }
    for (; c < r; c++) {
        vf_tile acc = {0};
        for (uint32_t d = 0; d < dim; d++)
            acc += tile[d] * gm[(size_t)d * r + c];
        acc2 += acc * acc;
    }
    for (int t = 0; t < TILE; t++)
        out[t] = acc2[t];
}

/*
 * sq[j] = ||X_j Gm||^2 for rows [0, n) of one head: a tile of TILE rows at a time, each row
 * converted to float32 (the row after next requested ahead: one head's rows are a whole memory
 * page apart) and transposed to [D][TILE]. A NaN or Inf in a row makes its sq non-finite (every
 * product it enters is NaN or Inf).
 */
VASE_HOT static void sketch_norms(const struct vase_view *x, uint32_t head, uint32_t n,
                                  const float *gm, uint32_t r, vf_tile *tile, float *row,
                                  float *sq) {
    uint32_t dim = x->dim;
    for (uint32_t j0 = 0; j0 < n; j0 += TILE) {
        uint32_t m = n - j0 < TILE ? n - j0 : TILE;
        if (m < TILE)
            memset(tile, 0, (size_t)dim * sizeof(vf_tile));
        for (uint32_t t = 0; t < m; t++) {
            if (j0 + t + VASE_PREFETCH_AHEAD < n)
                vase__prefetch_row(x, j0 + t + VASE_PREFETCH_AHEAD, head);
            vase__convert(vase__row(x, j0 + t, head), x->dtype, dim, row);
            for (uint32_t d = 0; d < dim; d++)
                tile[d][t] = row[d];
        }
        float acc2[TILE];
        tile_sketch(tile, dim, gm, r, acc2);
        for (uint32_t t = 0; t < m; t++)
            sq[j0 + t] = acc2[t];
    }
}

int vase__leverage_heads(const struct vase_view *k, const struct vase_view *v, uint32_t h0,
                         uint32_t h1, uint32_t n, const float *gm, uint32_t r,
                         struct vase_workspace *ws, float *out) {
    uint32_t dim = k->dim, heads = h1 - h0;
    vf_tile *tile = vase__ws_get(ws, WS_K, (size_t)dim * sizeof(vf_tile));
    float *row = vase__ws_get(ws, WS_Q, (size_t)dim * sizeof(float));
    float *v2 = vase__ws_get(ws, WS_V, (size_t)heads * n * sizeof(float));
    if (!tile || !row || !v2)
        return -ENOMEM;

    /* One head at a time: its tile ([D][TILE], 8 KiB at D = 128) stays in L1 between the
     * transposition and the products, where all heads of a token together spill to L2
     * (measured at the Qwen3-4B shape: 9.0 ms against 10.2 ms for vase-dkv). */
    for (uint32_t h = h0; h < h1; h++) {
        sketch_norms(k, h, n, gm, r, tile, row, out + (size_t)(h - h0) * n);
        sketch_norms(v, h, n, gm, r, tile, row, v2 + (size_t)(h - h0) * n);
    }
    for (uint32_t h = 0; h < heads; h++) {
        float *c = out + (size_t)h * n;
        const float *vv = v2 + (size_t)h * n;
        double total = 0.0;
        for (uint32_t j = 0; j < n; j++) {
            c[j] *= vv[j];
            total += c[j];
        }
        /* NaN or Inf in K or V, or products that overflowed, leave nothing to rank. */
        if (!isfinite(total) || !vase__all_finite(c, n))
            return -EINVAL;
        float t = (float)total;
        if (t > 0.0f)
            for (uint32_t j = 0; j < n; j++)
                c[j] /= t;
    }
    return 0;
}

int vase_score_leverage(const struct vase_view *k, const struct vase_view *v, uint32_t head,
                        uint32_t n, const float *gm, uint32_t r, struct vase_workspace *ws,
                        float *out) {
    return vase__leverage_heads(k, v, head, head + 1, n, gm, r, ws, out);
}

/*
 * mean_i C[i,j] over the N x N cosine matrix with a zero diagonal equals
 * (S . kn_j - kn_j . kn_j) / N with S = sum_i kn_i, so the redundancy costs O(N D), not
 * O(N^2 D). S is accumulated in double to keep the cancellation harmless.
 */
int vase_score_redundancy(const struct vase_view *k, uint32_t head, uint32_t n,
                          struct vase_workspace *ws, float *out) {
    uint32_t dim = k->dim;
    float *kbuf = vase__ws_get(ws, WS_K, (size_t)n * dim * sizeof(float));
    if (!kbuf)
        return -ENOMEM;
    if (vase__gather(k, head, n, kbuf) < 0)
        return -EINVAL;

    double sum[dim];
    memset(sum, 0, sizeof(sum));
    for (uint32_t j = 0; j < n; j++) {
        float *row = kbuf + (size_t)j * dim;
        float ss = 0.0f;
        for (uint32_t d = 0; d < dim; d++)
            ss += row[d] * row[d];
        float inv = 1.0f / (sqrtf(ss) + 1e-8f);
        for (uint32_t d = 0; d < dim; d++) {
            row[d] *= inv;
            sum[d] += row[d];
        }
    }
    float mx = -INFINITY;
    for (uint32_t j = 0; j < n; j++) {
        const float *row = kbuf + (size_t)j * dim;
        double dot = 0.0, self = 0.0;
        for (uint32_t d = 0; d < dim; d++) {
            dot += sum[d] * row[d];
            self += (double)row[d] * row[d];
        }
        out[j] = (float)((dot - self) / n);
        mx = out[j] > mx ? out[j] : mx;
    }
    float total = 0.0f;
    for (uint32_t j = 0; j < n; j++) {
        out[j] = expf(out[j] - mx);
        total += out[j];
    }
    for (uint32_t j = 0; j < n; j++)
        out[j] /= total;
    return 0;
}
