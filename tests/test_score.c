/* SPDX-License-Identifier: MIT */

/*
 * Tests of kernels/score.c (ALGORITHM.md, "Scores"): windowed attention with its temperature,
 * box filter and group mean on inputs small enough to work out by hand; the value metrics; the
 * sketched leverage with an injected sketch; the R-KV redundancy of parallel, antiparallel and
 * orthogonal keys. Expected values are computed here in double precision from the formulas, and
 * compared with a relative tolerance of 1e-6 (float32 arithmetic, a few roundings).
 */

#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "vase_kernels.h"

/* Written past the n outputs a call may write, to check it writes no further. */
#define SENTINEL_F (-12345.0f)

static void assert_close(double got, double want, double rel) {
    double tol = rel * fabs(want);
    if (!(fabs(got - want) <= tol)) {
        fail_msg("got %.9g, want %.9g (relative tolerance %g)", got, want, rel);
    }
}

/* Each test that needs scratch memory gets a workspace in *state from this fixture, so it is
 * freed even when an assertion ends the test early. */
static int ws_setup(void **state) {
    struct vase_workspace *ws = NULL;
    if (vase_workspace_new(&ws) < 0)
        return -1;
    *state = ws;
    return 0;
}

static int ws_teardown(void **state) {
    vase_workspace_free(*state);
    return 0;
}

/*
 * A plan input over contiguous float32 arrays: k [hkv][n][dim], q [hq][w][dim]. Only what
 * vase_score_attention() reads is set: the window, temperature and smoothing.
 */
static struct vase_plan_input attn_input(float *k, float *q, uint32_t hkv, uint32_t hq, uint32_t n,
                                         uint32_t w, uint32_t dim, float temperature,
                                         uint32_t smooth) {
    struct vase_params p = vase_params_default(2 * w);
    p.window = w;
    p.temperature = temperature;
    p.smooth = smooth;
    p.n_sink = 0;
    p.n_large = 0;
    return (struct vase_plan_input){
        .policy = VASE_POLICY_SNAPKV,
        .params = p,
        .n = n,
        .hq = hq,
        .k = vase_view_contiguous(k, VASE_DTYPE_F32, hkv, n, dim),
        .v = vase_view_contiguous(k, VASE_DTYPE_F32, hkv, n, dim),
        .q = vase_view_contiguous(q, VASE_DTYPE_F32, hq, w, dim),
    };
}

/* Box filter of odd width w, zero outside [0, n), always divided by w (ALGORITHM.md step 3). */
static void ref_box(const double *in, double *out, int n, int w) {
    for (int j = 0; j < n; j++) {
        double s = 0.0;
        for (int d = -w / 2; d <= w / 2; d++)
            if (j + d >= 0 && j + d < n)
                s += in[j + d];
        out[j] = s / w;
    }
}

/*
 * D = 1, W = 1, one query head, q = 1, T = 1: the logits are the keys themselves, so
 * p_j = e^{k_j} / sum_i e^{k_i}. With k = 0 1 2 -1 0.5:
 *   e^k = 1, 2.71828, 7.38906, 0.36788, 1.64872; sum 13.12394;
 *   p   = 0.07620, 0.20713, 0.56302, 0.02803, 0.12563.
 * smooth 1: s = p. smooth 3: s_0 = (p_0 + p_1) / 3 = 0.09444 (the edge is still divided by 3),
 * s_2 = (p_1 + p_2 + p_3) / 3 = 0.26606, ... smooth 5: s_0 = (p_0 + p_1 + p_2) / 5 = 0.16927.
 */
static void test_attention_single_query(void **state) {
    enum { N = 5 };
    float k[N] = {0.0f, 1.0f, 2.0f, -1.0f, 0.5f}, q[1] = {1.0f};
    double e[N], sum = 0.0, p[N], want[N];
    for (int j = 0; j < N; j++) {
        e[j] = exp((double)k[j]);
        sum += e[j];
    }
    for (int j = 0; j < N; j++)
        p[j] = e[j] / sum;
    /* The hand values of the comment, to 4 digits. */
    assert_true(fabs(p[2] - 0.56302) < 1e-4);
    assert_true(fabs((p[0] + p[1]) / 3 - 0.09444) < 1e-4);

    struct vase_workspace *ws = *state;
    static const uint32_t smooths[] = {1, 3, 5};
    for (size_t t = 0; t < 3; t++) {
        struct vase_plan_input in = attn_input(k, q, 1, 1, N, 1, 1, 1.0f, smooths[t]);
        float out[N + 1];
        out[N] = SENTINEL_F;
        assert_int_equal(vase_score_attention(&in, 0, ws, out), 0);
        if (smooths[t] == 1)
            memcpy(want, p, sizeof(p));
        else
            ref_box(p, want, N, (int)smooths[t]);
        for (int j = 0; j < N; j++)
            assert_close(out[j], want[j], 1e-6);
        assert_true(out[N] == SENTINEL_F);
    }
}

/*
 * Temperature and the sqrt(D) scale: D = 4, q = (2, 0, 0, 0), so q . k_j / sqrt(D) = k_j0 and
 * with T = 2 the logits are k_j0 / 2. Keys (0,...), (2,...), (4,...): logits 0, 1, 2, the same
 * p as above for those logits: e^0, e^1, e^2 over 11.10734 = 0.09003, 0.24473, 0.66524.
 * T = 0.5 sharpens: logits 0, 4, 8: 0.00033, 0.01798, 0.98169.
 */
static void test_attention_temperature(void **state) {
    enum { N = 3, D = 4 };
    float k[N * D] = {0, 1, 1, 1, 2, -1, 3, 0, 4, 5, -5, 2};
    float q[D] = {2, 0, 0, 0};
    struct vase_workspace *ws = *state;
    static const float temps[] = {2.0f, 0.5f, 1.0f};
    for (size_t t = 0; t < 3; t++) {
        struct vase_plan_input in = attn_input(k, q, 1, 1, N, 1, D, temps[t], 1);
        float out[N];
        assert_int_equal(vase_score_attention(&in, 0, ws, out), 0);
        double logit[N], sum = 0.0;
        for (int j = 0; j < N; j++) {
            logit[j] = (double)k[j * D] * 2.0 / (2.0 * temps[t]);
            sum += exp(logit[j]);
        }
        for (int j = 0; j < N; j++)
            assert_close(out[j], exp(logit[j]) / sum, 1e-6);
        if (temps[t] == 2.0f)
            assert_true(fabs(out[2] - 0.66524) < 1e-4);
        if (temps[t] == 0.5f)
            assert_true(fabs(out[2] - 0.98169) < 1e-4);
    }
}

/*
 * The whole pipeline: two KV heads, G = 2 query heads each, W = 3 queries, D = 2, N = 6,
 * T = 1.5, smooth 3. For KV head g, query head h = 2g + i: softmax over the candidates per
 * query, mean over the window, box filter, mean over the two query heads of the group. The
 * expected values follow these four steps literally, in double precision.
 */
static void test_attention_groups_and_window(void **state) {
    enum { HKV = 2, HQ = 4, W = 3, D = 2, N = 6 };
    float k[HKV * N * D], q[HQ * W * D];
    for (int i = 0; i < HKV * N * D; i++)
        k[i] = (float)((i * 7) % 11 - 5) * 0.25f;
    for (int i = 0; i < HQ * W * D; i++)
        q[i] = (float)((i * 5) % 9 - 4) * 0.5f;
    const double T = 1.5;
    struct vase_workspace *ws = *state;
    for (uint32_t smooth = 1; smooth <= 5; smooth += 2) {
        struct vase_plan_input in = attn_input(k, q, HKV, HQ, N, W, D, (float)T, smooth);
        for (uint32_t g = 0; g < HKV; g++) {
            double s[N] = {0};
            for (uint32_t h = g * 2; h < g * 2 + 2; h++) {
                double a[N] = {0}, f[N];
                for (int i = 0; i < W; i++) {
                    double logit[N], mx = -INFINITY, sum = 0.0;
                    for (int j = 0; j < N; j++) {
                        const float *qi = q + (h * W + i) * D, *kj = k + (g * N + j) * D;
                        logit[j] =
                            ((double)qi[0] * kj[0] + (double)qi[1] * kj[1]) / (sqrt((double)D) * T);
                        mx = fmax(mx, logit[j]);
                    }
                    for (int j = 0; j < N; j++)
                        sum += exp(logit[j] - mx);
                    for (int j = 0; j < N; j++)
                        a[j] += exp(logit[j] - mx) / sum / W;
                }
                if (smooth > 1)
                    ref_box(a, f, N, (int)smooth);
                else
                    memcpy(f, a, sizeof(a));
                for (int j = 0; j < N; j++)
                    s[j] += f[j] / 2;
            }
            float out[N];
            assert_int_equal(vase_score_attention(&in, g, ws, out), 0);
            for (int j = 0; j < N; j++)
                assert_close(out[j], s[j], 1e-6);
        }
    }
}

/* Softmax with max subtraction: logits far outside exp's range still give finite scores.
 * Keys 1000, 999, -1000 with q = 1: p = 1 / (1 + e^-1), e^-1 / (1 + e^-1), ~0. */
static void test_attention_large_logits(void **state) {
    float k[3] = {1000.0f, 999.0f, -1000.0f}, q[1] = {1.0f};
    struct vase_workspace *ws = *state;
    struct vase_plan_input in = attn_input(k, q, 1, 1, 3, 1, 1, 1.0f, 1);
    float out[3];
    assert_int_equal(vase_score_attention(&in, 0, ws, out), 0);
    assert_close(out[0], 1.0 / (1.0 + exp(-1.0)), 1e-6);
    assert_close(out[1], exp(-1.0) / (1.0 + exp(-1.0)), 1e-6);
    assert_true(out[2] >= 0.0f && out[2] < 1e-30f);
}

/* Pushed scores replace the computed ones as they are; negative, NaN or infinite pushed
 * scores are -EINVAL. */
static void test_attention_pushed_scores(void **state) {
    float k[4] = {1, 2, 3, 4}, q[1] = {1};
    float scores[2 * 4] = {0.5f, 0.25f, 0.0f, 0.125f, 9.0f, 8.0f, 7.0f, 6.0f};
    struct vase_workspace *ws = *state;
    struct vase_plan_input in = attn_input(k, q, 1, 1, 4, 1, 1, 1.0f, 5);
    in.scores = scores;
    float out[4];
    assert_int_equal(vase_score_attention(&in, 0, ws, out), 0);
    assert_memory_equal(out, scores, sizeof(out)); /* not smoothed */
    static const float bad[] = {-1.0f, NAN, INFINITY};
    for (size_t i = 0; i < 3; i++) {
        scores[2] = bad[i];
        assert_int_equal(vase_score_attention(&in, 0, ws, out), -EINVAL);
    }
}

/* NaN or Inf in the candidates' keys or the window's queries: -EINVAL. (The output of a score
 * function is undefined on failure; only plans promise to write nothing.) */
static void test_attention_nonfinite(void **state) {
    struct vase_workspace *ws = *state;
    enum { N = 4, W = 2, D = 2 };
    for (int where = 0; where < 4; where++) {
        float k[N * D] = {1, 0, 0, 1, 1, 1, -1, 0}, q[W * D] = {1, 2, 3, 4};
        if (where == 0)
            k[5] = NAN;
        else if (where == 1)
            k[7] = -INFINITY;
        else if (where == 2)
            q[3] = NAN; /* the last query only */
        else
            q[0] = INFINITY;
        struct vase_plan_input in = attn_input(k, q, 1, 1, N, W, D, 1.0f, 1);
        float out[N];
        assert_int_equal(vase_score_attention(&in, 0, ws, out), -EINVAL);
    }
}

/*
 * Value metrics of D = 4 rows, by hand:
 *   ( 1, -3, 2, 0): range 2 - (-3) = 5; l2 sqrt(1 + 9 + 4) = sqrt 14; mean 0, so the variance
 *                   (divisor D - 1 = 3) is 14 / 3; absmax 3.
 *   ( 2,  2, 2, 2): range 0; l2 4; var 0; absmax 2.
 *   (-1, -5, -2, -4): range 4; l2 sqrt 46; mean -3, squares 4 + 4 + 1 + 1 = 10, var 10 / 3;
 *                   absmax 5.
 */
static void test_value_metrics(void **state) {
    (void)state;
    enum { N = 3, D = 4 };
    /* Two heads; head 1 holds the rows above, head 0 something else. */
    float v[2 * N * D] = {9, 9,  9, 9, 9, 9, 9, 9, 9,  9,  9,  9,
                          1, -3, 2, 0, 2, 2, 2, 2, -1, -5, -2, -4};
    struct vase_view view = vase_view_contiguous(v, VASE_DTYPE_F32, 2, N, D);
    static const double want[_VASE_METRIC_MAX][N] = {
        [VASE_METRIC_RANGE] = {5, 0, 4},
        [VASE_METRIC_L2] = {3.7416573867739413, 4, 6.782329983125268},
        [VASE_METRIC_VAR] = {14.0 / 3, 0, 10.0 / 3},
        [VASE_METRIC_ABSMAX] = {3, 2, 5},
    };
    for (int m = 0; m < _VASE_METRIC_MAX; m++) {
        float out[N + 1];
        out[N] = SENTINEL_F;
        assert_int_equal(vase_value_metric(&view, 1, N, (enum vase_metric)m, out), 0);
        for (int j = 0; j < N; j++) {
            if (want[m][j] == 0)
                assert_true(out[j] == 0.0f);
            else
                assert_close(out[j], want[m][j], 1e-6);
        }
        assert_true(out[N] == SENTINEL_F);
    }
    /* The same values in bfloat16 (all exact) give the same metrics. */
    uint16_t vb[2 * N * D];
    for (int i = 0; i < 2 * N * D; i++)
        vb[i] = vase_f32_to_bf16(v[i]);
    struct vase_view bview = vase_view_contiguous(vb, VASE_DTYPE_BF16, 2, N, D);
    for (int m = 0; m < _VASE_METRIC_MAX; m++) {
        float a[N], b[N];
        assert_int_equal(vase_value_metric(&view, 1, N, (enum vase_metric)m, a), 0);
        assert_int_equal(vase_value_metric(&bview, 1, N, (enum vase_metric)m, b), 0);
        assert_memory_equal(a, b, sizeof(a));
    }
}

static void test_value_metric_invalid(void **state) {
    (void)state;
    enum { N = 3, D = 2 };
    float v[N * D] = {1, 2, 3, 4, 5, 6}, out[N];
    struct vase_view view = vase_view_contiguous(v, VASE_DTYPE_F32, 1, N, D);
    assert_int_equal(vase_value_metric(&view, 1, N, VASE_METRIC_RANGE, out), -EINVAL); /* head */
    assert_int_equal(vase_value_metric(&view, 0, N, _VASE_METRIC_MAX, out), -EINVAL);
    assert_int_equal(vase_value_metric(NULL, 0, N, VASE_METRIC_RANGE, out), -EINVAL);
    assert_int_equal(vase_value_metric(&view, 0, N, VASE_METRIC_RANGE, NULL), -EINVAL);
    /* The variance needs D >= 2 (divisor D - 1). */
    struct vase_view one = vase_view_contiguous(v, VASE_DTYPE_F32, 1, N * D, 1);
    assert_int_equal(vase_value_metric(&one, 0, 2, VASE_METRIC_VAR, out), -EINVAL);
    assert_int_equal(vase_value_metric(&one, 0, 2, VASE_METRIC_RANGE, out), 0);
    assert_true(out[0] == 0.0f && out[1] == 0.0f);
    /* A malformed view. */
    struct vase_view bad = view;
    bad.dim = 0;
    assert_int_equal(vase_value_metric(&bad, 0, N, VASE_METRIC_RANGE, out), -EINVAL);
}

/* NaN or Inf in any row, the last one included: -EINVAL for every metric. */
static void test_value_metric_nonfinite(void **state) {
    (void)state;
    enum { N = 3, D = 2 };
    float v[N * D] = {1, 2, 3, 4, 5, 6}, out[N];
    struct vase_view view = vase_view_contiguous(v, VASE_DTYPE_F32, 1, N, D);
    for (int i = 0; i < N * D; i++) {
        float saved = v[i];
        v[i] = i % 2 ? NAN : -INFINITY;
        for (int m = 0; m < _VASE_METRIC_MAX; m++)
            assert_int_equal(vase_value_metric(&view, 0, N, (enum vase_metric)m, out), -EINVAL);
        v[i] = saved;
    }
    /* Finite values whose sum of squares overflows: the l2 norm is not finite either. */
    float big[2] = {3e38f, 3e38f};
    struct vase_view bv = vase_view_contiguous(big, VASE_DTYPE_F32, 1, 1, 2);
    assert_int_equal(vase_value_metric(&bv, 0, 1, VASE_METRIC_L2, out), -EINVAL);
    assert_int_equal(vase_value_metric(&bv, 0, 1, VASE_METRIC_ABSMAX, out), 0);
    assert_true(out[0] == 3e38f);
}

/* vase_sketch divides the injected normals by sqrt(r): with r = 4, by 2. Without injected
 * normals it uses the generator's normals of the shared head, divided the same way. */
static void test_sketch(void **state) {
    (void)state;
    enum { D = 3, R = 4 };
    float gauss[D * R], gm[D * R];
    for (int i = 0; i < D * R; i++)
        gauss[i] = (float)(i - 5);
    vase_sketch(NULL, gauss, D, R, gm);
    for (int i = 0; i < D * R; i++)
        assert_true(gm[i] == (float)(i - 5) / 2.0f);

    const struct vase_rng rng = {.seed = 11, .sequence = 2, .layer = 7, .round = 4};
    float normals[D * R];
    vase_rng_normal(&rng, VASE_RNG_HEAD_SHARED, normals, D * R);
    vase_sketch(&rng, NULL, D, R, gm);
    for (int i = 0; i < D * R; i++)
        assert_true(gm[i] == normals[i] / 2.0f);

    /* r = 3: divided by sqrt 3. */
    vase_sketch(NULL, gauss, D, 3, gm);
    for (int i = 0; i < D * 3; i++)
        assert_close(gm[i], (i - 5) / sqrt(3.0), 1e-6);
}

/*
 * Leverage with an injected sketch. D = 2, r = 4, normals [[2,0,0,0],[0,2,0,0]] give
 * Gm = [[1,0,0,0],[0,1,0,0]], so K_j Gm = (k_j0, k_j1, 0, 0) and k2 = ||k_j||^2:
 *   k = (1,0) (1,1) (0,2)  ->  k2 = 1 2 4
 *   v = (2,0) (3,0) (0,1)  ->  v2 = 4 9 1
 *   k2 v2 = 4 18 4, sum 26  ->  c = 4/26 18/26 4/26.
 * A second sketch, r = 1 and normals (1, 1): K_j Gm = k_j0 + k_j1 = 1, 2, 2 -> k2 = 1 4 4;
 * V_j Gm = 2 3 1 -> v2 = 4 9 1; products 4 36 4, sum 44.
 */
static void test_leverage_injected(void **state) {
    enum { N = 3, D = 2 };
    /* Head 1 holds the rows above; head 0 differs so a wrong head shows. */
    float k[2 * N * D] = {5, 5, 5, 5, 5, 5, 1, 0, 1, 1, 0, 2};
    float v[2 * N * D] = {1, 1, 1, 1, 1, 1, 2, 0, 3, 0, 0, 1};
    struct vase_view kv = vase_view_contiguous(k, VASE_DTYPE_F32, 2, N, D);
    struct vase_view vv = vase_view_contiguous(v, VASE_DTYPE_F32, 2, N, D);
    struct vase_workspace *ws = *state;

    const float gauss4[D * 4] = {2, 0, 0, 0, 0, 2, 0, 0};
    float gm[D * 4], out[N + 1];
    vase_sketch(NULL, gauss4, D, 4, gm);
    out[N] = SENTINEL_F;
    assert_int_equal(vase_score_leverage(&kv, &vv, 1, N, gm, 4, ws, out), 0);
    assert_close(out[0], 4.0 / 26, 1e-6);
    assert_close(out[1], 18.0 / 26, 1e-6);
    assert_close(out[2], 4.0 / 26, 1e-6);
    assert_true(out[N] == SENTINEL_F);

    const float gauss1[D] = {1, 1};
    vase_sketch(NULL, gauss1, D, 1, gm);
    assert_int_equal(vase_score_leverage(&kv, &vv, 1, N, gm, 1, ws, out), 0);
    assert_close(out[0], 4.0 / 44, 1e-6);
    assert_close(out[1], 36.0 / 44, 1e-6);
    assert_close(out[2], 4.0 / 44, 1e-6);

    /* Head 0: all rows equal, so each gets a third. */
    assert_int_equal(vase_score_leverage(&kv, &vv, 0, N, gm, 1, ws, out), 0);
    for (int j = 0; j < N; j++)
        assert_close(out[j], 1.0 / 3, 1e-6);
}

/* NaN or Inf anywhere in K or V of the head read: -EINVAL. */
static void test_leverage_nonfinite(void **state) {
    struct vase_workspace *ws = *state;
    enum { N = 3, D = 2 };
    const float gauss[D] = {1, 1};
    float gm[D], out[N];
    vase_sketch(NULL, gauss, D, 1, gm);
    for (int where = 0; where < 2 * N * D; where++) {
        float k[N * D] = {1, 0, 1, 1, 0, 2}, v[N * D] = {2, 0, 3, 0, 0, 1};
        if (where < N * D)
            k[where] = where % 2 ? NAN : INFINITY;
        else
            v[where - N * D] = where % 2 ? -INFINITY : NAN;
        struct vase_view kv = vase_view_contiguous(k, VASE_DTYPE_F32, 1, N, D);
        struct vase_view vv = vase_view_contiguous(v, VASE_DTYPE_F32, 1, N, D);
        assert_int_equal(vase_score_leverage(&kv, &vv, 0, N, gm, 1, ws, out), -EINVAL);
    }
}

/*
 * R-KV redundancy by hand, D = 2, N = 5 keys:
 *   k0 = (1,0), k1 = (2,0) parallel to k0, k2 = (0,1) orthogonal to both, k3 = (-3,0)
 *   antiparallel to k0 and k1, k4 = (0,0) (normalises to the zero vector).
 * Cosines with a zero diagonal: C[0,1] = C[1,0] = 1, C[0,3] = C[3,0] = C[1,3] = C[3,1] = -1,
 * everything else 0. Column means over the N = 5 rows: 0, 0, 0, -2/5, 0. Softmax:
 * red = (1, 1, 1, e^-0.4, 1) / (4 + e^-0.4).
 */
static void test_redundancy_hand(void **state) {
    enum { N = 5, D = 2 };
    float k[N * D] = {1, 0, 2, 0, 0, 1, -3, 0, 0, 0};
    struct vase_view kv = vase_view_contiguous(k, VASE_DTYPE_F32, 1, N, D);
    struct vase_workspace *ws = *state;
    float out[N + 1];
    out[N] = SENTINEL_F;
    assert_int_equal(vase_score_redundancy(&kv, 0, N, ws, out), 0);
    double z = 4.0 + exp(-0.4);
    for (int j = 0; j < N; j++)
        assert_close(out[j], (j == 3 ? exp(-0.4) : 1.0) / z, 1e-6);
    assert_true(out[N] == SENTINEL_F);

    /*
     * Three mutually orthogonal keys and one duplicate: k = e0, e1, e2, e0 (D = 3, N = 4).
     * C[0,3] = C[3,0] = 1, the rest 0; column means 1/4, 0, 0, 1/4:
     * red = (e^0.25, 1, 1, e^0.25) / (2 e^0.25 + 2). Scaling a key does not change it.
     */
    float k3[4 * 3] = {1, 0, 0, 0, 5, 0, 0, 0, 0.5f, 7, 0, 0};
    struct vase_view kv3 = vase_view_contiguous(k3, VASE_DTYPE_F32, 1, 4, 3);
    assert_int_equal(vase_score_redundancy(&kv3, 0, 4, ws, out), 0);
    z = 2.0 * exp(0.25) + 2.0;
    assert_close(out[0], exp(0.25) / z, 1e-6);
    assert_close(out[1], 1.0 / z, 1e-6);
    assert_close(out[2], 1.0 / z, 1e-6);
    assert_close(out[3], exp(0.25) / z, 1e-6);

    /* NaN or Inf in a key: -EINVAL. */
    k3[4] = NAN;
    assert_int_equal(vase_score_redundancy(&kv3, 0, 4, ws, out), -EINVAL);
    k3[4] = -INFINITY;
    assert_int_equal(vase_score_redundancy(&kv3, 0, 4, ws, out), -EINVAL);
}

/* The redundancy of random keys against the O(N^2) definition, in double. */
static void test_redundancy_random(void **state) {
    enum { N = 37, D = 5 };
    float k[N * D];
    uint32_t x = 12345;
    for (int i = 0; i < N * D; i++) {
        x = x * 1664525u + 1013904223u;
        k[i] = (float)((int)(x >> 20) - 2048) / 512.0f;
    }
    double kn[N][D], mean[N], mx = -INFINITY, z = 0.0;
    for (int j = 0; j < N; j++) {
        double ss = 0.0;
        for (int d = 0; d < D; d++)
            ss += (double)k[j * D + d] * k[j * D + d];
        for (int d = 0; d < D; d++)
            kn[j][d] = k[j * D + d] / (sqrt(ss) + 1e-8);
    }
    for (int j = 0; j < N; j++) {
        double s = 0.0;
        for (int i = 0; i < N; i++) {
            if (i == j)
                continue;
            for (int d = 0; d < D; d++)
                s += kn[i][d] * kn[j][d];
        }
        mean[j] = s / N;
        mx = fmax(mx, mean[j]);
    }
    for (int j = 0; j < N; j++)
        z += exp(mean[j] - mx);
    struct vase_view kv = vase_view_contiguous(k, VASE_DTYPE_F32, 1, N, D);
    struct vase_workspace *ws = *state;
    float out[N];
    assert_int_equal(vase_score_redundancy(&kv, 0, N, ws, out), 0);
    for (int j = 0; j < N; j++)
        assert_close(out[j], exp(mean[j] - mx) / z, 1e-5);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_attention_single_query, ws_setup, ws_teardown),
        cmocka_unit_test_setup_teardown(test_attention_temperature, ws_setup, ws_teardown),
        cmocka_unit_test_setup_teardown(test_attention_groups_and_window, ws_setup, ws_teardown),
        cmocka_unit_test_setup_teardown(test_attention_large_logits, ws_setup, ws_teardown),
        cmocka_unit_test_setup_teardown(test_attention_pushed_scores, ws_setup, ws_teardown),
        cmocka_unit_test_setup_teardown(test_attention_nonfinite, ws_setup, ws_teardown),
        cmocka_unit_test(test_value_metrics),
        cmocka_unit_test(test_value_metric_invalid),
        cmocka_unit_test(test_value_metric_nonfinite),
        cmocka_unit_test(test_sketch),
        cmocka_unit_test_setup_teardown(test_leverage_injected, ws_setup, ws_teardown),
        cmocka_unit_test_setup_teardown(test_leverage_nonfinite, ws_setup, ws_teardown),
        cmocka_unit_test_setup_teardown(test_redundancy_hand, ws_setup, ws_teardown),
        cmocka_unit_test_setup_teardown(test_redundancy_random, ws_setup, ws_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
