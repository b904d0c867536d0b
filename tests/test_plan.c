/* SPDX-License-Identifier: MIT */

/*
 * Tests of kernels/plan.c (ALGORITHM.md, "Policies"): parameter validation and names; every
 * policy on small inputs whose keep lists are worked out by hand in the comments; the
 * policies' structural properties on random data against references computed here in double
 * precision; degenerate inputs; NaN and Inf rejected with the output untouched; the same plan
 * for every storage dtype, for the paged arena layout with a shuffled block table and a query
 * ring, for any thread count and for any range of heads; and the keying of the random draws.
 *
 * Candidate data past row n (the recent window) is NaN throughout: a plan that read it would
 * fail, so every successful plan here also shows that only the candidates are read.
 */

#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif
#endif
#ifndef RUNNING_ON_VALGRIND
#define RUNNING_ON_VALGRIND 0
#endif

#include "vase_kernels.h"

#define SENTINEL 0xdeadbeefu

static uint64_t rng_state = 1;

static uint32_t rand_u32(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32);
}

/* A random multiple of 1/64 in [-255/64, 255/64]: 8 significant bits at most, so exact in
 * float16 and bfloat16 as well as float32. */
static float qrand(void) {
    return (float)((int)(rand_u32() % 511) - 255) / 64.0f;
}

static void fill_sentinel(uint32_t *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        x[i] = SENTINEL;
}

static void assert_all_sentinel(const uint32_t *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        assert_int_equal(x[i], SENTINEL);
}

static void assert_list(const uint32_t *got, const uint32_t *want, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i]) {
            print_error("keep[%zu] = %u, want %u\n", i, got[i], want[i]);
            for (size_t j = 0; j < n; j++)
                print_error("  %zu: got %u want %u\n", j, got[j], want[j]);
            fail();
        }
}

static const enum vase_policy all_policies[] = {
    VASE_POLICY_VASE_ATTNV,
    VASE_POLICY_VASE_DKV,
    VASE_POLICY_CURDKV,
    VASE_POLICY_SNAPKV,
    VASE_POLICY_RKV,
    VASE_POLICY_STREAMING,
    VASE_POLICY_RANDOM,
    VASE_POLICY_H2O,
    VASE_POLICY_ATTN_SAMPLE,
    VASE_POLICY_RANGE_ATTN,
    VASE_POLICY_RANGE_SAMPLE_ATTN,
    VASE_POLICY_EVICT_LARGE_RANGE,
};
#define N_POLICIES (sizeof(all_policies) / sizeof(all_policies[0]))

/* ---- parameters and names ---- */

static void test_params_default(void **state) {
    (void)state;
    struct vase_params p = vase_params_default(4096);
    /* ALGORITHM.md, "Terms". */
    assert_int_equal(p.budget, 4096);
    assert_int_equal(p.window, 64);
    assert_int_equal(p.n_sink, 4);
    assert_int_equal(p.n_large, 1024);
    assert_true(p.temperature == 1.0f);
    assert_int_equal(p.rank, 20);
    assert_true(p.lambda == 0.5f);
    assert_int_equal(p.smooth, 5);
    assert_int_equal(p.metric, VASE_METRIC_RANGE);
    assert_int_equal(vase_plan_keep_count(&p), 4096 - 64);

    static const uint32_t budgets[] = {128, 192, 4096, 8192};
    for (size_t b = 0; b < sizeof(budgets) / sizeof(budgets[0]); b++) {
        p = vase_params_default(budgets[b]);
        assert_int_equal(p.n_large, budgets[b] / 4);
        for (size_t i = 0; i < N_POLICIES; i++)
            assert_int_equal(vase_params_check(&p, all_policies[i]), 0);
    }
}

static void test_params_check(void **state) {
    (void)state;
    const struct vase_params ok = vase_params_default(256);
    struct vase_params p;
    assert_int_equal(vase_params_check(&ok, VASE_POLICY_VASE_ATTNV), 0);
    assert_int_equal(vase_params_check(NULL, VASE_POLICY_VASE_ATTNV), -EINVAL);
    assert_int_equal(vase_params_check(&ok, _VASE_POLICY_MAX), -EINVAL);

#define EXPECT_CHECK(field, value, want)                                                           \
    do {                                                                                           \
        p = ok;                                                                                    \
        p.field = (value);                                                                         \
        for (size_t i_ = 0; i_ < N_POLICIES; i_++)                                                 \
            assert_int_equal(vase_params_check(&p, all_policies[i_]), (want));                     \
    } while (0)

    /* The budget must be a multiple of the window and larger than it. */
    EXPECT_CHECK(budget, 100, -EINVAL);
    EXPECT_CHECK(budget, 64, -EINVAL); /* == window */
    EXPECT_CHECK(budget, 32, -EINVAL);
    EXPECT_CHECK(budget, 0, -EINVAL);
    EXPECT_CHECK(budget, 128, 0); /* 2 W, the smallest valid */
    EXPECT_CHECK(budget, VASE_MAX_BUDGET + 64, -EINVAL);
    EXPECT_CHECK(window, 0, -EINVAL);
    EXPECT_CHECK(window, 48, -EINVAL); /* 256 % 48 != 0 */
    EXPECT_CHECK(window, 128, 0);
    EXPECT_CHECK(window, 256, -EINVAL);
    /* Odd box filter widths only; 1 is off. */
    EXPECT_CHECK(smooth, 4, -EINVAL);
    EXPECT_CHECK(smooth, 2, -EINVAL);
    EXPECT_CHECK(smooth, 0, -EINVAL);
    EXPECT_CHECK(smooth, 1, 0);
    EXPECT_CHECK(smooth, 3, 0);
    EXPECT_CHECK(smooth, VASE_MAX_SMOOTH, 0);
    EXPECT_CHECK(smooth, VASE_MAX_SMOOTH + 2, -EINVAL);
    /* T > 0 and finite. */
    EXPECT_CHECK(temperature, 0.0f, -EINVAL);
    EXPECT_CHECK(temperature, -0.0f, -EINVAL);
    EXPECT_CHECK(temperature, -1.0f, -EINVAL);
    EXPECT_CHECK(temperature, NAN, -EINVAL);
    EXPECT_CHECK(temperature, INFINITY, -EINVAL);
    EXPECT_CHECK(temperature, 1e-3f, 0);
    EXPECT_CHECK(temperature, 10.0f, 0);
    /* lambda in [0, 1], the ends included. */
    EXPECT_CHECK(lambda, -0.1f, -EINVAL);
    EXPECT_CHECK(lambda, 1.1f, -EINVAL);
    EXPECT_CHECK(lambda, NAN, -EINVAL);
    EXPECT_CHECK(lambda, 0.0f, 0);
    EXPECT_CHECK(lambda, 1.0f, 0);
    /* r >= 1 and at most VASE_MAX_RANK. */
    EXPECT_CHECK(rank, 0, -EINVAL);
    EXPECT_CHECK(rank, 1, 0);
    EXPECT_CHECK(rank, VASE_MAX_RANK, 0);
    EXPECT_CHECK(rank, VASE_MAX_RANK + 1, -EINVAL);
    EXPECT_CHECK(metric, _VASE_METRIC_MAX, -EINVAL);
    EXPECT_CHECK(metric, VASE_METRIC_ABSMAX, 0);
#undef EXPECT_CHECK
}

static void test_policy_names(void **state) {
    (void)state;
    /* The names of ALGORITHM.md's table. */
    static const struct {
        const char *name;
        enum vase_policy p;
    } names[] = {
        {"vase-attnv", VASE_POLICY_VASE_ATTNV},
        {"vase-dkv", VASE_POLICY_VASE_DKV},
        {"curdkv", VASE_POLICY_CURDKV},
        {"snapkv", VASE_POLICY_SNAPKV},
        {"rkv", VASE_POLICY_RKV},
        {"streaming", VASE_POLICY_STREAMING},
        {"random", VASE_POLICY_RANDOM},
        {"h2o", VASE_POLICY_H2O},
        {"attn-sample", VASE_POLICY_ATTN_SAMPLE},
        {"range-attn", VASE_POLICY_RANGE_ATTN},
        {"range-sample-attn", VASE_POLICY_RANGE_SAMPLE_ATTN},
        {"evict-large-range", VASE_POLICY_EVICT_LARGE_RANGE},
    };
    assert_int_equal(sizeof(names) / sizeof(names[0]), _VASE_POLICY_MAX);
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        enum vase_policy p = (enum vase_policy)99;
        assert_string_equal(vase_policy_to_string(names[i].p), names[i].name);
        assert_int_equal(vase_policy_from_string(names[i].name, &p), 0);
        assert_int_equal(p, names[i].p);
    }
    /* Round trip of every value. */
    for (int i = 0; i < _VASE_POLICY_MAX; i++) {
        enum vase_policy p = (enum vase_policy)99;
        const char *s = vase_policy_to_string((enum vase_policy)i);
        assert_non_null(s);
        assert_int_equal(vase_policy_from_string(s, &p), 0);
        assert_int_equal(p, i);
    }
    assert_null(vase_policy_to_string(_VASE_POLICY_MAX));
    static const char *const bad[] = {"",     "VASE-ATTNV", "vase_attnv",
                                      "snap", "snapkv ",    "range_sink_sample_attn"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        enum vase_policy p = (enum vase_policy)99;
        assert_int_equal(vase_policy_from_string(bad[i], &p), -EINVAL);
        assert_int_equal(p, 99);
    }
    enum vase_policy p = (enum vase_policy)99;
    assert_int_equal(vase_policy_from_string(NULL, &p), -EINVAL);
    assert_int_equal(vase_policy_from_string("h2o", NULL), -EINVAL);

    /* Metrics. */
    static const char *const metrics[_VASE_METRIC_MAX] = {
        [VASE_METRIC_RANGE] = "range",
        [VASE_METRIC_L2] = "l2",
        [VASE_METRIC_VAR] = "var",
        [VASE_METRIC_ABSMAX] = "absmax",
    };
    for (int i = 0; i < _VASE_METRIC_MAX; i++) {
        enum vase_metric m = (enum vase_metric)99;
        assert_string_equal(vase_metric_to_string((enum vase_metric)i), metrics[i]);
        assert_int_equal(vase_metric_from_string(metrics[i], &m), 0);
        assert_int_equal(m, i);
    }
    assert_null(vase_metric_to_string(_VASE_METRIC_MAX));
    enum vase_metric m = (enum vase_metric)99;
    assert_int_equal(vase_metric_from_string("L2", &m), -EINVAL);
    assert_int_equal(vase_metric_from_string(NULL, &m), -EINVAL);
    assert_int_equal(m, 99);
}

/* Every reference mode name of ALGORITHM.md and the policy and metric it implies. */
static void test_policy_from_mode(void **state) {
    (void)state;
    static const struct {
        const char *mode;
        enum vase_policy p;
        enum vase_metric m;
    } modes[] = {
        {"range_sink_sample_attn", VASE_POLICY_VASE_ATTNV, VASE_METRIC_RANGE},
        {"l2_sink_sample_attn", VASE_POLICY_VASE_ATTNV, VASE_METRIC_L2},
        {"var_sink_sample_attn", VASE_POLICY_VASE_ATTNV, VASE_METRIC_VAR},
        {"cur_resample_gauss", VASE_POLICY_VASE_DKV, VASE_METRIC_RANGE},
        {"cur_fixed_gauss", VASE_POLICY_CURDKV, VASE_METRIC_RANGE},
        {"attn", VASE_POLICY_SNAPKV, VASE_METRIC_RANGE},
        {"attn_rkv", VASE_POLICY_RKV, VASE_METRIC_RANGE},
        {"attn_sample", VASE_POLICY_ATTN_SAMPLE, VASE_METRIC_RANGE},
        {"range_attn", VASE_POLICY_RANGE_ATTN, VASE_METRIC_RANGE},
        {"range_sample_attn", VASE_POLICY_RANGE_SAMPLE_ATTN, VASE_METRIC_RANGE},
        {"evict_large_range", VASE_POLICY_EVICT_LARGE_RANGE, VASE_METRIC_RANGE},
    };
    for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
        enum vase_policy p = (enum vase_policy)99;
        enum vase_metric m = (enum vase_metric)99;
        assert_int_equal(vase_policy_from_mode(modes[i].mode, &p, &m), 0);
        assert_int_equal(p, modes[i].p);
        assert_int_equal(m, modes[i].m);
    }
    static const char *const bad[] = {"",
                                      "RANGE_SINK_SAMPLE_ATTN",
                                      "range-sink-sample-attn",
                                      "l1_sink_sample_attn",
                                      "vase-attnv",
                                      "attn_"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        enum vase_policy p = (enum vase_policy)99;
        enum vase_metric m = (enum vase_metric)99;
        assert_int_equal(vase_policy_from_mode(bad[i], &p, &m), -EINVAL);
        assert_int_equal(p, 99);
        assert_int_equal(m, 99);
    }
    enum vase_policy p;
    enum vase_metric m;
    assert_int_equal(vase_policy_from_mode(NULL, &p, &m), -EINVAL);
    assert_int_equal(vase_policy_from_mode("attn", NULL, &m), -EINVAL);
    assert_int_equal(vase_policy_from_mode("attn", &p, NULL), -EINVAL);
}

/* What each policy reads, from its definition in ALGORITHM.md. */
static void test_policy_needs(void **state) {
    (void)state;
    assert_int_equal(vase_policy_needs(VASE_POLICY_STREAMING), 0);
    assert_int_equal(vase_policy_needs(VASE_POLICY_H2O), VASE_NEEDS_ACC);
    assert_int_equal(vase_policy_needs(VASE_POLICY_RANDOM), VASE_NEEDS_EXP);
    assert_int_equal(vase_policy_needs(VASE_POLICY_SNAPKV), VASE_NEEDS_K | VASE_NEEDS_Q);
    assert_int_equal(vase_policy_needs(VASE_POLICY_EVICT_LARGE_RANGE), VASE_NEEDS_V);
    assert_int_equal(vase_policy_needs(VASE_POLICY_VASE_ATTNV),
                     VASE_NEEDS_K | VASE_NEEDS_V | VASE_NEEDS_Q | VASE_NEEDS_EXP);
    unsigned dkv = vase_policy_needs(VASE_POLICY_VASE_DKV);
    assert_int_equal(dkv, VASE_NEEDS_K | VASE_NEEDS_V | VASE_NEEDS_GAUSS);
    assert_int_equal(vase_policy_needs(VASE_POLICY_CURDKV), dkv);
    unsigned rkv = vase_policy_needs(VASE_POLICY_RKV);
    assert_true((rkv & (VASE_NEEDS_K | VASE_NEEDS_Q)) == (VASE_NEEDS_K | VASE_NEEDS_Q));
    assert_int_equal(rkv & (VASE_NEEDS_EXP | VASE_NEEDS_GAUSS | VASE_NEEDS_ACC), 0);
    assert_int_equal(vase_policy_needs(VASE_POLICY_ATTN_SAMPLE),
                     VASE_NEEDS_K | VASE_NEEDS_Q | VASE_NEEDS_EXP);
    assert_int_equal(vase_policy_needs(VASE_POLICY_RANGE_ATTN) & VASE_NEEDS_EXP, 0);
}

/* ---- hand-checked plans ---- */

/*
 * The eight-candidate case of most hand checks: one KV head, W = 2, budget 8, so K = 6 and
 * N = 8; n_sink 1, n_large 3. V rows are (m_j, 0), so the range of row j is m_j:
 *
 *   j      0      1      2      3      4      5      6      7
 *   m    0.125    5      1      5     0.25    3     0.5     2
 *   s    0.5    0.875  0.125  0.75   0.25  0.375   0.5    0.75    (pushed window scores)
 *   E    1      1      0.5    1      0.25   2      1      2       (injected Exp draws)
 *   s/E  0.5    0.875  0.25   0.75   1     0.1875  0.5    0.375
 *   1/E  1      1      2      1      4     0.5     1      0.5
 *
 * All values are binary fractions, so every key is exact and the ties below are real ties.
 */
enum { H8_N = 8, H8_W = 2, H8_D = 2, H8_K = 6 };
static const float h8_m[H8_N] = {0.125f, 5, 1, 5, 0.25f, 3, 0.5f, 2};
static const float h8_s[H8_N] = {0.5f, 0.875f, 0.125f, 0.75f, 0.25f, 0.375f, 0.5f, 0.75f};
static const float h8_e[H8_N] = {1, 1, 0.5f, 1, 0.25f, 2, 1, 2};

struct h8 {
    float k[(H8_N + H8_W) * H8_D], v[(H8_N + H8_W) * H8_D], q[H8_W * H8_D];
};

static struct vase_plan_input h8_input(struct h8 *d, enum vase_policy policy) {
    for (int j = 0; j < H8_N + H8_W; j++) {
        /* Keys are never read with pushed scores; the window rows are NaN. */
        d->k[j * 2] = j < H8_N ? (float)j : NAN;
        d->k[j * 2 + 1] = j < H8_N ? 1.0f : NAN;
        d->v[j * 2] = j < H8_N ? h8_m[j] : NAN;
        d->v[j * 2 + 1] = j < H8_N ? 0.0f : NAN;
    }
    for (int i = 0; i < H8_W * H8_D; i++)
        d->q[i] = 1.0f;
    struct vase_params p = vase_params_default(8);
    p.window = H8_W;
    p.n_sink = 1;
    p.n_large = 3;
    p.smooth = 5; /* pushed scores are used as they are, never smoothed */
    return (struct vase_plan_input){
        .policy = policy,
        .params = p,
        .n = H8_N,
        .hq = 1,
        .k = vase_view_contiguous(d->k, VASE_DTYPE_F32, 1, H8_N + H8_W, H8_D),
        .v = vase_view_contiguous(d->v, VASE_DTYPE_F32, 1, H8_N + H8_W, H8_D),
        .q = vase_view_contiguous(d->q, VASE_DTYPE_F32, 1, H8_W, H8_D),
        .acc = h8_s,
        .scores = h8_s,
        .exp_draws = h8_e,
    };
}

static void expect_plan(const struct vase_plan_input *in, const uint32_t *want, uint32_t K) {
    uint32_t keep[64];
    fill_sentinel(keep, K + 1);
    int r = vase_plan(in, 1, NULL, keep);
    if (r != 0)
        fail_msg("%s: %d", vase_policy_to_string(in->policy), r);
    assert_list(keep, want, K);
    assert_int_equal(keep[K], SENTINEL); /* exactly Hkv * K entries written */
}

static void test_plan_hand_value_aware(void **state) {
    (void)state;
    struct h8 d;
    struct vase_plan_input in;

    /* vase-attnv: m' = m with m'[0] = +inf; P = topk(m', 3) = 0 (inf), 1 (5), 3 (5, the tie in
     * ascending index). The rest race among 2 4 5 6 7 with keys 0.25 1 0.1875 0.5 0.375:
     * 4, 6, 7. keep = 0 1 3 4 6 7. Candidates 1 and 3 have high s too, but P excludes them. */
    in = h8_input(&d, VASE_POLICY_VASE_ATTNV);
    expect_plan(&in, (const uint32_t[]){0, 1, 3, 4, 6, 7}, H8_K);

    /* The sink is +inf, above any finite range: with m_5 = 3e38, P = 0, 5, 1; the race among
     * 2 3 4 6 7 (keys 0.25 0.75 1 0.5 0.375): 4, 3, 6. */
    d.v[5 * 2] = 3e38f;
    expect_plan(&in, (const uint32_t[]){0, 5, 1, 4, 3, 6}, H8_K);
    d.v[5 * 2] = h8_m[5];

    /* Three sinks: P = 0 1 2 (all +inf); the race among 3..7 (keys 0.75 1 0.1875 0.5 0.375):
     * 4, 3, 6. */
    in.params.n_sink = 3;
    expect_plan(&in, (const uint32_t[]){0, 1, 2, 4, 3, 6}, H8_K);

    /* n_large >= K: keep = topk(m', K) = 0 (inf), 1, 3 (5), 5 (3), 7 (2), 2 (1). */
    in.params.n_sink = 1;
    in.params.n_large = H8_K;
    expect_plan(&in, (const uint32_t[]){0, 1, 3, 5, 7, 2}, H8_K);
    in.params.n_large = 8; /* = budget, beyond K */
    expect_plan(&in, (const uint32_t[]){0, 1, 3, 5, 7, 2}, H8_K);

    /* n_large = 0: no protected slots, not even the sink; keep = sample(s, K): keys in
     * descending order 4 (1), 1 (0.875), 3 (0.75), 0 and 6 (0.5), 7 (0.375). */
    in.params.n_large = 0;
    expect_plan(&in, (const uint32_t[]){4, 1, 3, 0, 6, 7}, H8_K);

    /* range-sample-attn (no sink rule): P = topk(m, 3) = 1, 3 (5), 5 (3); the race among
     * 0 2 4 6 7 (keys 0.5 0.25 1 0.5 0.375): 4, then 0 and 6 tie at 0.5: 0, 6. */
    in = h8_input(&d, VASE_POLICY_RANGE_SAMPLE_ATTN);
    expect_plan(&in, (const uint32_t[]){1, 3, 5, 4, 0, 6}, H8_K);

    /* range-attn: P = 1 3 5, then topk of s among 0 2 4 6 7 (0.5 0.125 0.25 0.5 0.75):
     * 7, 0, 6. */
    in = h8_input(&d, VASE_POLICY_RANGE_ATTN);
    expect_plan(&in, (const uint32_t[]){1, 3, 5, 7, 0, 6}, H8_K);

    /* evict-large-range: topk(-m, 6), the smallest ranges first: 0 (0.125), 4 (0.25),
     * 6 (0.5), 2 (1), 7 (2), 5 (3); the two largest, 1 and 3, are evicted. */
    in = h8_input(&d, VASE_POLICY_EVICT_LARGE_RANGE);
    expect_plan(&in, (const uint32_t[]){0, 4, 6, 2, 7, 5}, H8_K);
}

static void test_plan_hand_attention_policies(void **state) {
    (void)state;
    struct h8 d;
    struct vase_plan_input in;

    /* snapkv: topk(s, 6): 1 (0.875), 3 and 7 (0.75), 0 and 6 (0.5), 5 (0.375). */
    in = h8_input(&d, VASE_POLICY_SNAPKV);
    expect_plan(&in, (const uint32_t[]){1, 3, 7, 0, 6, 5}, H8_K);

    /* attn-sample: sample(s, 6) = top 6 of s/E: 4, 1, 3, 0, 6, 7. */
    in = h8_input(&d, VASE_POLICY_ATTN_SAMPLE);
    expect_plan(&in, (const uint32_t[]){4, 1, 3, 0, 6, 7}, H8_K);

    /* random: sample(1, 6) = top 6 of 1/E: 4 (4), 2 (2), then the 1s in ascending index:
     * 0, 1, 3, 6. */
    in = h8_input(&d, VASE_POLICY_RANDOM);
    expect_plan(&in, (const uint32_t[]){4, 2, 0, 1, 3, 6}, H8_K);

    /* h2o with acc = s: topk(acc, 6), as snapkv above. */
    in = h8_input(&d, VASE_POLICY_H2O);
    expect_plan(&in, (const uint32_t[]){1, 3, 7, 0, 6, 5}, H8_K);

    /* streaming, n_sink 1: slot 0, then the K - 1 = 5 most recent candidates 3..7. */
    in = h8_input(&d, VASE_POLICY_STREAMING);
    expect_plan(&in, (const uint32_t[]){0, 3, 4, 5, 6, 7}, H8_K);
    in.params.n_sink = 0;
    expect_plan(&in, (const uint32_t[]){2, 3, 4, 5, 6, 7}, H8_K);
    in.params.n_sink = 4;
    expect_plan(&in, (const uint32_t[]){0, 1, 2, 3, 6, 7}, H8_K);
}

/* The value metric parameter changes what counts as large. D = 3, N = 5, W = 1, budget 3
 * (K = 2), evict-large-range keeps the two smallest:
 *   row               range   l2     var (D-1)  absmax
 *   ( 3,  3,  3)        0     5.196    0          3
 *   ( 1, -1,  0)        2     1.414    1          1
 *   ( 0,  0, 2.5)       2.5   2.5      2.083      2.5
 *   (-4, -3, -3.5)      1     6.103    0.25       4
 *   ( 2, -2,  2)        4     3.464    5.333      2
 * range: 0, 3. l2: 1, 2. var: 0, 3. absmax: 1, 4 (2 < 2.5). */
static void test_plan_hand_metrics(void **state) {
    (void)state;
    float v[6 * 3] = {3, 3, 3, 1, -1, 0, 0, 0, 2.5f, -4, -3, -3.5f, 2, -2, 2, NAN, NAN, NAN};
    struct vase_params p = vase_params_default(3);
    p.window = 1;
    p.n_sink = 0;
    struct vase_plan_input in = {
        .policy = VASE_POLICY_EVICT_LARGE_RANGE,
        .params = p,
        .n = 5,
        .k = vase_view_contiguous(v, VASE_DTYPE_F32, 1, 6, 3),
        .v = vase_view_contiguous(v, VASE_DTYPE_F32, 1, 6, 3),
    };
    static const uint32_t want[_VASE_METRIC_MAX][2] = {
        [VASE_METRIC_RANGE] = {0, 3},
        [VASE_METRIC_L2] = {1, 2},
        [VASE_METRIC_VAR] = {0, 3},
        [VASE_METRIC_ABSMAX] = {1, 4},
    };
    for (int m = 0; m < _VASE_METRIC_MAX; m++) {
        in.params.metric = (enum vase_metric)m;
        expect_plan(&in, want[m], 2);
    }
    /* The same metric through vase-attnv, n_large >= K: keep = topk(m', 2) with sink 0 forced
     * in: l2 gives 0 (inf), then 3 (6.103); range gives 0, then 4 (4). The policy declares that
     * it reads queries, so it gets a valid (never read) query view. */
    float q[3] = {1, 1, 1};
    in.q = vase_view_contiguous(q, VASE_DTYPE_F32, 1, 1, 3);
    in.hq = 1;
    in.policy = VASE_POLICY_VASE_ATTNV;
    in.params.n_sink = 1;
    in.params.n_large = 2;
    in.params.metric = VASE_METRIC_L2;
    expect_plan(&in, (const uint32_t[]){0, 3}, 2);
    in.params.metric = VASE_METRIC_RANGE;
    expect_plan(&in, (const uint32_t[]){0, 4}, 2);
}

/*
 * The box filter decides. D = 1, W = 1, q = 1, T = 1, so p_j is proportional to e^{k_j}:
 *   k   = 0  3  0  0  0  2.5  2.5  2.4  0
 *   e^k = 1 20.09 1 1 1 12.18 12.18 11.02 1
 * Unsmoothed, K = 3 keeps the spike 1 (20.09), then 5 and 6 (12.18, a tie: ascending).
 * With smooth 3 the spike averages with its neighbours: 3 * s_1 ~ 1 + 20.09 + 1 = 22.09, while
 * 3 * s_6 ~ 12.18 + 12.18 + 11.02 = 35.38, 3 * s_5 ~ 1 + 12.18 + 12.18 = 25.36,
 * 3 * s_7 ~ 12.18 + 11.02 + 1 = 24.20: the cluster 6, 5, 7 wins and the spike is dropped.
 */
static void test_plan_box_filter_decides(void **state) {
    (void)state;
    enum { N = 9 };
    float k[N + 1] = {0, 3, 0, 0, 0, 2.5f, 2.5f, 2.4f, 0, NAN}, q[1] = {1};
    struct vase_params p = vase_params_default(4);
    p.window = 1;
    p.smooth = 1;
    struct vase_plan_input in = {
        .policy = VASE_POLICY_SNAPKV,
        .params = p,
        .n = N,
        .hq = 1,
        .k = vase_view_contiguous(k, VASE_DTYPE_F32, 1, N + 1, 1),
        .v = vase_view_contiguous(k, VASE_DTYPE_F32, 1, N + 1, 1),
        .q = vase_view_contiguous(q, VASE_DTYPE_F32, 1, 1, 1),
    };
    expect_plan(&in, (const uint32_t[]){1, 5, 6}, 3);
    in.params.smooth = 3;
    expect_plan(&in, (const uint32_t[]){6, 5, 7}, 3);
}

/*
 * The temperature decides. D = 4 (sqrt D = 2), two queries q1 = (1,0,0,0), q2 = (0,1,0,0), and
 * keys 2 (a_j, b_j, 0, 0), so the logits before T are a_j for q1 and b_j for q2:
 *   a = 3 2 0,  b = 0 2 3.5.
 * T = 1: p1 = softmax(3, 2, 0) = .7054 .2595 .0351, p2 = softmax(0, 2, 3.5) = .0241 .1780 .7979,
 *        s = .3647 .2188 .4165: K = 2 keeps 2, 0.
 * T = 4: p1 = softmax(.75, .5, 0) = .4442 .3460 .2098, p2 = softmax(0, .5, .875) = .1981 .3266
 *        .4753, s = .3212 .3363 .3425: K = 2 keeps 2, 1 — the key both queries rank second
 *        gains once the softmax flattens.
 */
static void test_plan_temperature_decides(void **state) {
    (void)state;
    enum { N = 3, D = 4, W = 2 };
    float k[(N + W) * D] = {6, 0, 0, 0, 4, 4, 0, 0, 0, 7, 0, 0};
    for (int i = N * D; i < (N + W) * D; i++)
        k[i] = NAN;
    float q[W * D] = {1, 0, 0, 0, 0, 1, 0, 0};
    struct vase_params p = vase_params_default(4);
    p.window = W;
    p.smooth = 1;
    struct vase_plan_input in = {
        .policy = VASE_POLICY_SNAPKV,
        .params = p,
        .n = N,
        .hq = 1,
        .k = vase_view_contiguous(k, VASE_DTYPE_F32, 1, N + W, D),
        .v = vase_view_contiguous(k, VASE_DTYPE_F32, 1, N + W, D),
        .q = vase_view_contiguous(q, VASE_DTYPE_F32, 1, W, D),
    };
    expect_plan(&in, (const uint32_t[]){2, 0}, 2);
    in.params.temperature = 4.0f;
    expect_plan(&in, (const uint32_t[]){2, 1}, 2);
}

/*
 * R-KV by hand. Keys (D = 2): (1,0), (2,0), (0,1), (-3,0), (0,0). As in test_score: red =
 * (a, a, a, b, a) with a = 1 / (4 + e^-0.4) = .21412, b = e^-0.4 a = .14353. Pushed
 * s = .3 .25 .2 .15 .1, K = 3 (W = 1, budget 4).
 *   lambda 1:   topk(s) = 0 1 2 (snapkv).
 *   lambda .5:  .5 s - .5 red = .04294 .01794 -.00706 .00323 -.05706: 0 1 3 — the
 *               antiparallel, least redundant key 3 displaces 2.
 *   lambda 0:   topk(-red): 3 (-.14353), then the exact ties -a in ascending index: 0 1.
 */
static void test_plan_hand_rkv(void **state) {
    (void)state;
    enum { N = 5 };
    float k[(N + 1) * 2] = {1, 0, 2, 0, 0, 1, -3, 0, 0, 0, NAN, NAN};
    const float s[N] = {0.3f, 0.25f, 0.2f, 0.15f, 0.1f};
    struct vase_params p = vase_params_default(4);
    p.window = 1;
    p.lambda = 1.0f;
    struct vase_plan_input in = {
        .policy = VASE_POLICY_RKV,
        .params = p,
        .n = N,
        .hq = 1,
        .k = vase_view_contiguous(k, VASE_DTYPE_F32, 1, N + 1, 2),
        .v = vase_view_contiguous(k, VASE_DTYPE_F32, 1, N + 1, 2),
        .scores = s,
    };
    expect_plan(&in, (const uint32_t[]){0, 1, 2}, 3);
    in.params.lambda = 0.5f;
    expect_plan(&in, (const uint32_t[]){0, 1, 3}, 3);
    in.params.lambda = 0.0f;
    expect_plan(&in, (const uint32_t[]){3, 0, 1}, 3);
    in.policy = VASE_POLICY_SNAPKV;
    in.params.lambda = 0.5f;
    expect_plan(&in, (const uint32_t[]){0, 1, 2}, 3);
}

/*
 * DKV by hand with an injected sketch: D = 2, r = 4, normals [[2,0,0,0],[0,2,0,0]], so
 * Gm = [[1,0,0,0],[0,1,0,0]] and c_j is proportional to ||k_j||^2 ||v_j||^2:
 *   k = (1,0) (1,1) (0,2) (2,0): k2 = 1 2 4 4;  v = (2,0) (3,0) (0,1) (1,1): v2 = 4 9 1 2;
 *   products 4 18 4 8, so c = 4/34 18/34 4/34 8/34.
 * K = 3 (W = 1, budget 4). n_sink 0: topk(c) = 1, 3, then 0 and 2 tie: 0. n_sink 1: c_0 = 1,
 * the largest: 0, 1, 3. curdkv is the same computation with the same injected sketch.
 */
static void test_plan_hand_dkv(void **state) {
    (void)state;
    enum { N = 4 };
    float k[(N + 1) * 2] = {1, 0, 1, 1, 0, 2, 2, 0, NAN, NAN};
    float v[(N + 1) * 2] = {2, 0, 3, 0, 0, 1, 1, 1, NAN, NAN};
    const float gauss[2 * 4] = {2, 0, 0, 0, 0, 2, 0, 0};
    struct vase_params p = vase_params_default(4);
    p.window = 1;
    p.rank = 4;
    p.n_sink = 0;
    struct vase_plan_input in = {
        .policy = VASE_POLICY_VASE_DKV,
        .params = p,
        .n = N,
        .k = vase_view_contiguous(k, VASE_DTYPE_F32, 1, N + 1, 2),
        .v = vase_view_contiguous(v, VASE_DTYPE_F32, 1, N + 1, 2),
        .gauss = gauss,
    };
    expect_plan(&in, (const uint32_t[]){1, 3, 0}, 3);
    in.params.n_sink = 1;
    expect_plan(&in, (const uint32_t[]){0, 1, 3}, 3);
    in.policy = VASE_POLICY_CURDKV;
    expect_plan(&in, (const uint32_t[]){0, 1, 3}, 3);
    in.params.n_sink = 0;
    expect_plan(&in, (const uint32_t[]){1, 3, 0}, 3);
}

/* h2o over two KV heads, ties in ascending index per head:
 *   head 0: acc = 0.5 2 2 0 1 -> topk 3 = 1, 2, 4
 *   head 1: acc = 3 0 3 3 0.25 -> topk 3 = 0, 2, 3 */
static void test_plan_hand_h2o(void **state) {
    (void)state;
    float acc[2 * 5] = {0.5f, 2, 2, 0, 1, 3, 0, 3, 3, 0.25f};
    float k[2 * 6] = {0};
    struct vase_params p = vase_params_default(4);
    p.window = 1;
    struct vase_plan_input in = {
        .policy = VASE_POLICY_H2O,
        .params = p,
        .n = 5,
        .k = vase_view_contiguous(k, VASE_DTYPE_F32, 2, 6, 1),
        .acc = acc,
    };
    uint32_t keep[7];
    fill_sentinel(keep, 7);
    assert_int_equal(vase_plan(&in, 2, NULL, keep), 0);
    assert_list(keep, (const uint32_t[]){1, 2, 4, 0, 2, 3}, 6);
    assert_int_equal(keep[6], SENTINEL);

    /* NaN or Inf in the accumulated attention: -EINVAL, nothing written. */
    for (int i = 0; i < 2; i++) {
        acc[7] = i ? INFINITY : NAN;
        fill_sentinel(keep, 7);
        assert_int_equal(vase_plan(&in, 1, NULL, keep), -EINVAL);
        assert_all_sentinel(keep, 7);
    }
    in.acc = NULL;
    assert_int_equal(vase_plan(&in, 1, NULL, keep), -EINVAL);
    assert_all_sentinel(keep, 7);
}

/* ---- random layers: structural properties against references ---- */

struct layer {
    uint32_t hkv, hq, n, w, dim, len;
    float *k, *v; /* [hkv][len][dim]; rows >= n are the recent window, NaN */
    float *q;     /* [hq][w][dim] */
    float *acc;   /* [hkv][n] */
    float *gauss; /* [dim][rank] */
    uint32_t rank;
};

static void layer_new(struct layer *L, uint32_t hkv, uint32_t hq, uint32_t n, uint32_t w,
                      uint32_t dim, uint32_t rank, uint64_t seed) {
    *L = (struct layer){
        .hkv = hkv, .hq = hq, .n = n, .w = w, .dim = dim, .len = n + w, .rank = rank};
    size_t kv = (size_t)hkv * L->len * dim;
    L->k = malloc(kv * sizeof(float));
    L->v = malloc(kv * sizeof(float));
    L->q = malloc((size_t)hq * w * dim * sizeof(float));
    L->acc = malloc((size_t)hkv * n * sizeof(float));
    L->gauss = malloc((size_t)dim * rank * sizeof(float));
    assert_true(L->k && L->v && L->q && L->acc && L->gauss);
    rng_state = seed;
    for (size_t i = 0; i < kv; i++) {
        bool cand = (i / dim) % L->len < n;
        L->k[i] = cand ? qrand() : NAN;
        L->v[i] = cand ? qrand() : NAN;
    }
    for (size_t i = 0; i < (size_t)hq * w * dim; i++)
        L->q[i] = qrand();
    for (size_t i = 0; i < (size_t)hkv * n; i++)
        L->acc[i] = (float)(rand_u32() % 64) / 16.0f; /* ties likely */
    for (size_t i = 0; i < (size_t)dim * rank; i++)
        L->gauss[i] = qrand();
}

static void layer_free(struct layer *L) {
    free(L->k);
    free(L->v);
    free(L->q);
    free(L->acc);
    free(L->gauss);
}

/* Budget 16, W 4 (K = 12), 2 sinks, 5 large, smooth 3, rank 4. */
static struct vase_params small_params(void) {
    struct vase_params p = vase_params_default(16);
    p.window = 4;
    p.n_sink = 2;
    p.n_large = 5;
    p.smooth = 3;
    p.rank = 4;
    p.temperature = 1.5f;
    return p;
}

static const struct vase_rng test_rng = {.seed = 0x5eed, .sequence = 3, .layer = 2, .round = 5};

static struct vase_plan_input layer_input(const struct layer *L, enum vase_policy policy) {
    return (struct vase_plan_input){
        .policy = policy,
        .params = small_params(),
        .n = L->n,
        .hq = L->hq,
        .k = vase_view_contiguous(L->k, VASE_DTYPE_F32, L->hkv, L->len, L->dim),
        .v = vase_view_contiguous(L->v, VASE_DTYPE_F32, L->hkv, L->len, L->dim),
        .q = vase_view_contiguous(L->q, VASE_DTYPE_F32, L->hq, L->w, L->dim),
        .acc = L->acc,
        .rng = test_rng,
    };
}

static const float *kv_row(const struct layer *L, const float *x, uint32_t h, uint32_t j) {
    return x + ((size_t)h * L->len + j) * L->dim;
}

/* Windowed attention of ALGORITHM.md, step by step, in double. */
static void ref_attention(const struct layer *L, const struct vase_params *p, uint32_t g,
                          double *s) {
    uint32_t n = L->n, G = L->hq / L->hkv;
    double *a = calloc(n, sizeof(double)), *logit = malloc(n * sizeof(double));
    assert_true(a && logit);
    for (uint32_t j = 0; j < n; j++)
        s[j] = 0.0;
    for (uint32_t h = g * G; h < (g + 1) * G; h++) {
        for (uint32_t j = 0; j < n; j++)
            a[j] = 0.0;
        for (uint32_t i = 0; i < p->window; i++) {
            const float *qi = L->q + ((size_t)h * L->w + i) * L->dim;
            double mx = -INFINITY, sum = 0.0;
            for (uint32_t j = 0; j < n; j++) {
                const float *kj = kv_row(L, L->k, g, j);
                double dot = 0.0;
                for (uint32_t d = 0; d < L->dim; d++)
                    dot += (double)qi[d] * kj[d];
                logit[j] = dot / (sqrt((double)L->dim) * p->temperature);
                mx = fmax(mx, logit[j]);
            }
            for (uint32_t j = 0; j < n; j++)
                sum += exp(logit[j] - mx);
            for (uint32_t j = 0; j < n; j++)
                a[j] += exp(logit[j] - mx) / sum / p->window;
        }
        int half = (int)p->smooth / 2;
        for (uint32_t j = 0; j < n; j++) {
            double f = 0.0;
            for (int d = -half; d <= half; d++)
                if ((int)j + d >= 0 && (int)j + d < (int)n)
                    f += a[(int)j + d];
            s[j] += f / p->smooth / G;
        }
    }
    free(logit);
    free(a);
}

static void ref_range(const struct layer *L, uint32_t g, float *m) {
    for (uint32_t j = 0; j < L->n; j++) {
        const float *v = kv_row(L, L->v, g, j);
        float lo = v[0], hi = v[0];
        for (uint32_t d = 1; d < L->dim; d++) {
            lo = fminf(lo, v[d]);
            hi = fmaxf(hi, v[d]);
        }
        m[j] = hi - lo; /* exact: multiples of 1/64 */
    }
}

static void ref_redundancy(const struct layer *L, uint32_t g, double *red) {
    uint32_t n = L->n, D = L->dim;
    double *kn = malloc((size_t)n * D * sizeof(double)), mx = -INFINITY, z = 0.0;
    assert_non_null(kn);
    for (uint32_t j = 0; j < n; j++) {
        const float *kj = kv_row(L, L->k, g, j);
        double ss = 0.0;
        for (uint32_t d = 0; d < D; d++)
            ss += (double)kj[d] * kj[d];
        for (uint32_t d = 0; d < D; d++)
            kn[j * D + d] = kj[d] / (sqrt(ss) + 1e-8);
    }
    for (uint32_t j = 0; j < n; j++) {
        double c = 0.0;
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t d = 0; i != j && d < D; d++)
                c += kn[i * D + d] * kn[j * D + d];
        red[j] = c / n;
        mx = fmax(mx, red[j]);
    }
    for (uint32_t j = 0; j < n; j++)
        z += exp(red[j] - mx);
    for (uint32_t j = 0; j < n; j++)
        red[j] = exp(red[j] - mx) / z;
    free(kn);
}

/* c_j = k2_j v2_j / sum, with Gm = gauss / sqrt(r). */
static void ref_leverage(const struct layer *L, uint32_t g, const float *gauss, double *c) {
    uint32_t n = L->n, D = L->dim, r = L->rank;
    double total = 0.0;
    for (uint32_t j = 0; j < n; j++) {
        double k2 = 0.0, v2 = 0.0;
        for (uint32_t col = 0; col < r; col++) {
            double kp = 0.0, vp = 0.0;
            for (uint32_t d = 0; d < D; d++) {
                double gm = gauss[d * r + col] / sqrt((double)r);
                kp += kv_row(L, L->k, g, j)[d] * gm;
                vp += kv_row(L, L->v, g, j)[d] * gm;
            }
            k2 += kp * kp;
            v2 += vp * vp;
        }
        c[j] = k2 * v2;
        total += c[j];
    }
    for (uint32_t j = 0; j < n; j++)
        c[j] /= total;
}

static const float *order_keys;

static int cmp_order(const void *a, const void *b) {
    uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
    float x = order_keys[i], y = order_keys[j];
    if (x != y)
        return x > y ? -1 : 1;
    return (i > j) - (i < j);
}

/* topk by a plain sort written here: descending, ties in ascending index, skipping excluded. */
static uint32_t ref_topk(const float *x, const uint8_t *exclude, uint32_t len, uint32_t *out) {
    uint32_t m = 0;
    for (uint32_t i = 0; i < len; i++)
        if (!exclude || !exclude[i])
            out[m++] = i;
    order_keys = x;
    qsort(out, m, sizeof(*out), cmp_order);
    return m;
}

static void assert_distinct_below(const uint32_t *keep, uint32_t K, uint32_t n) {
    uint8_t *seen = calloc(n, 1);
    assert_non_null(seen);
    for (uint32_t i = 0; i < K; i++) {
        assert_true(keep[i] < n);
        assert_false(seen[keep[i]]);
        seen[keep[i]] = 1;
    }
    free(seen);
}

/* y is not above x beyond a relative tolerance, with an absolute floor of 1e-8 for scores near
 * zero (R-KV's differences): float32 in the kernel, double here. The scores compared are
 * attention-sized (about 1 / N) or larger. */
static bool not_above(double y, double x, double rel) {
    return y <= x + rel * fmax(fabs(x), fabs(y)) + 1e-8;
}

/*
 * keep[0..cnt) is topk(score, cnt) over the eligible candidates up to float rounding: in
 * descending order of the reference score, and no eligible candidate left out scores more than
 * the smallest kept one (both within a relative tolerance rel, for scores computed in float32
 * by the kernel and in double here).
 */
static void assert_top_by(const uint32_t *keep, uint32_t cnt, const double *score,
                          const uint8_t *eligible, uint32_t n, double rel) {
    uint8_t *kept = calloc(n, 1);
    assert_non_null(kept);
    double lo = INFINITY;
    for (uint32_t i = 0; i < cnt; i++) {
        assert_true(eligible[keep[i]]);
        kept[keep[i]] = 1;
        if (i > 0 && !not_above(score[keep[i]], score[keep[i - 1]], rel))
            fail_msg("keep[%u] = %u scores %.9g above keep[%u] = %u at %.9g", i, keep[i],
                     score[keep[i]], i - 1, keep[i - 1], score[keep[i - 1]]);
        lo = fmin(lo, score[keep[i]]);
    }
    for (uint32_t j = 0; j < n; j++)
        if (eligible[j] && !kept[j] && !not_above(score[j], lo, rel))
            fail_msg("candidate %u (%.9g) left out for one scoring %.9g", j, score[j], lo);
    free(kept);
}

/* Every policy on a random layer of 3 KV heads, G = 2, D = 8, N = 30, K = 12. */
static void test_plan_structure_random(void **state) {
    (void)state;
    struct layer L;
    layer_new(&L, 3, 6, 30, 4, 8, 4, 777);
    const struct vase_params p = small_params();
    const uint32_t K = vase_plan_keep_count(&p), n = L.n;
    assert_int_equal(K, 12);
    uint32_t *keep = malloc((size_t)L.hkv * K * sizeof(uint32_t));
    uint32_t *order = malloc(n * sizeof(uint32_t));
    double *s = malloc(n * sizeof(double)), *x = malloc(n * sizeof(double));
    float *m = malloc(n * sizeof(float)), *e = malloc(n * sizeof(float));
    uint8_t *elig = malloc(n), *excl = malloc(n);
    assert_true(keep && order && s && x && m && e && elig && excl);

    for (size_t pi = 0; pi < N_POLICIES; pi++) {
        enum vase_policy pol = all_policies[pi];
        struct vase_plan_input in = layer_input(&L, pol);
        if (pol == VASE_POLICY_VASE_DKV || pol == VASE_POLICY_CURDKV)
            in.gauss = L.gauss;
        assert_int_equal(vase_plan(&in, 1, NULL, keep), 0);

        for (uint32_t g = 0; g < L.hkv; g++) {
            const uint32_t *kp = keep + (size_t)g * K;
            assert_distinct_below(kp, K, n);
            vase_rng_exp(&test_rng, g, e, n); /* the draws the plan keys to this head */
            memset(elig, 1, n);
            switch (pol) {
            case VASE_POLICY_VASE_ATTNV:
            case VASE_POLICY_RANGE_SAMPLE_ATTN:
            case VASE_POLICY_RANGE_ATTN: {
                /* P: with the sink rule, the sinks 0, 1 first (m' = +inf, ascending), then the
                 * n_large - n_sink largest ranges of the non-sinks; without it, topk(m). */
                bool sinks = pol == VASE_POLICY_VASE_ATTNV;
                ref_range(&L, g, m);
                memset(excl, 0, n);
                uint32_t first = 0;
                if (sinks) {
                    for (uint32_t j = 0; j < p.n_sink; j++) {
                        assert_int_equal(kp[j], j);
                        excl[j] = 1;
                    }
                    first = p.n_sink;
                }
                ref_topk(m, excl, n, order);
                assert_list(kp + first, order, p.n_large - first);
                for (uint32_t i = 0; i < p.n_large; i++)
                    elig[kp[i]] = 0;
                /* The rest: topk of s (range-attn) or of s / E (the race), P excluded. */
                ref_attention(&L, &p, g, s);
                for (uint32_t j = 0; j < n; j++)
                    x[j] = pol == VASE_POLICY_RANGE_ATTN ? s[j] : s[j] / e[j];
                assert_top_by(kp + p.n_large, K - p.n_large, x, elig, n, 1e-5);
                break;
            }
            case VASE_POLICY_SNAPKV:
                ref_attention(&L, &p, g, s);
                assert_top_by(kp, K, s, elig, n, 1e-5);
                break;
            case VASE_POLICY_ATTN_SAMPLE:
                ref_attention(&L, &p, g, s);
                for (uint32_t j = 0; j < n; j++)
                    x[j] = s[j] / e[j];
                assert_top_by(kp, K, x, elig, n, 1e-5);
                break;
            case VASE_POLICY_RKV:
                ref_attention(&L, &p, g, s);
                ref_redundancy(&L, g, x);
                for (uint32_t j = 0; j < n; j++)
                    x[j] = p.lambda * s[j] - (1.0 - p.lambda) * x[j];
                assert_top_by(kp, K, x, elig, n, 1e-5);
                break;
            case VASE_POLICY_VASE_DKV:
            case VASE_POLICY_CURDKV:
                /* Sinks first (c = 1 beats any normalised leverage), then topk(c). */
                ref_leverage(&L, g, L.gauss, x);
                for (uint32_t j = 0; j < p.n_sink; j++) {
                    assert_int_equal(kp[j], j);
                    elig[j] = 0;
                }
                assert_top_by(kp + p.n_sink, K - p.n_sink, x, elig, n, 1e-5);
                break;
            case VASE_POLICY_STREAMING:
                /* 0, 1, then the K - 2 = 10 most recent candidates 20..29. */
                for (uint32_t i = 0; i < K; i++)
                    assert_int_equal(kp[i], i < 2 ? i : n - K + i);
                break;
            case VASE_POLICY_RANDOM:
                /* sample(1, K): keys 1 / E, computed as the race defines them. */
                for (uint32_t j = 0; j < n; j++)
                    m[j] = 1.0f / e[j];
                ref_topk(m, NULL, n, order);
                assert_list(kp, order, K);
                break;
            case VASE_POLICY_H2O:
                ref_topk(L.acc + (size_t)g * n, NULL, n, order);
                assert_list(kp, order, K);
                break;
            case VASE_POLICY_EVICT_LARGE_RANGE:
                ref_range(&L, g, m);
                for (uint32_t j = 0; j < n; j++)
                    m[j] = -m[j];
                ref_topk(m, NULL, n, order);
                assert_list(kp, order, K);
                break;
            default:
                fail();
            }
        }
    }
    free(excl);
    free(elig);
    free(e);
    free(m);
    free(x);
    free(s);
    free(order);
    free(keep);
    layer_free(&L);
}

/* Runs a policy with nthreads, without and with workspaces; returns the plan in keep. */
static int plan_with(const struct vase_plan_input *in, unsigned nthreads, bool with_ws,
                     uint32_t *keep) {
    struct vase_workspace *ws[16] = {NULL};
    assert_true(nthreads <= 16);
    if (with_ws)
        for (unsigned t = 0; t < nthreads; t++)
            assert_int_equal(vase_workspace_new(&ws[t]), 0);
    int r = vase_plan(in, nthreads, with_ws ? ws : NULL, keep);
    for (unsigned t = 0; t < nthreads; t++)
        vase_workspace_free(ws[t]);
    return r;
}

/* nthreads > 1 (also more threads than heads) gives the plan of nthreads = 1, and so does any
 * split of the heads with vase_plan_heads(). */
static void test_plan_threads_and_head_ranges(void **state) {
    (void)state;
    struct layer L;
    layer_new(&L, 5, 10, 28, 4, 4, 4, 31);
    const uint32_t K = 12, H = 5;
    uint32_t ref[5 * 12], got[5 * 12 + 1];
    struct vase_workspace *ws = NULL;
    assert_int_equal(vase_workspace_new(&ws), 0);
    for (size_t pi = 0; pi < N_POLICIES; pi++) {
        struct vase_plan_input in = layer_input(&L, all_policies[pi]);
        assert_int_equal(vase_plan(&in, 1, NULL, ref), 0);
        static const unsigned threads[] = {1, 2, 3, 5, 8};
        for (size_t t = 0; t < sizeof(threads) / sizeof(threads[0]); t++)
            for (int w = 0; w < 2; w++) {
                fill_sentinel(got, H * K + 1);
                assert_int_equal(plan_with(&in, threads[t], w, got), 0);
                assert_list(got, ref, H * K);
                assert_int_equal(got[H * K], SENTINEL);
            }
        /* Subranges: rows h0 .. h1 - 1 of the full plan; a reused workspace and none. */
        static const uint32_t ranges[][2] = {{0, 1}, {1, 3}, {2, 5}, {4, 5}, {0, 5}};
        for (size_t r = 0; r < sizeof(ranges) / sizeof(ranges[0]); r++) {
            uint32_t h0 = ranges[r][0], h1 = ranges[r][1];
            fill_sentinel(got, H * K + 1);
            assert_int_equal(vase_plan_heads(&in, h0, h1, ws, got), 0);
            assert_list(got, ref + h0 * K, (h1 - h0) * K);
            assert_all_sentinel(got + (h1 - h0) * K, (H - (h1 - h0)) * K + 1);
            assert_int_equal(vase_plan_heads(&in, h0, h1, NULL, got), 0);
            assert_list(got, ref + h0 * K, (h1 - h0) * K);
        }
        fill_sentinel(got, H * K + 1);
        assert_int_equal(vase_plan_heads(&in, 2, 2, ws, got), -EINVAL);
        assert_int_equal(vase_plan_heads(&in, 3, 2, ws, got), -EINVAL);
        assert_int_equal(vase_plan_heads(&in, 0, 6, ws, got), -EINVAL);
        assert_int_equal(vase_plan(&in, 0, NULL, got), -EINVAL);
        assert_all_sentinel(got, H * K + 1);
    }
    vase_workspace_free(ws);
    layer_free(&L);
}

/*
 * The same plan on every run, whatever the thread count: the heads are independent, so any
 * difference is shared state between the planning threads (a race). A race shows only now and
 * then, so this repeats the multi-threaded plan of the attention policies (G = 2, two products
 * per head) many times; fewer under valgrind, which runs one thread at a time and is slow.
 */
static void test_plan_threads_repeatable(void **state) {
    (void)state;
    struct layer L;
    layer_new(&L, 5, 10, 28, 4, 4, 4, 31); /* 5 KV heads, K = 12 */
    const int iters = RUNNING_ON_VALGRIND ? 50 : 1500;
    uint32_t ref[5 * 12], got[5 * 12];
    static const enum vase_policy pols[] = {VASE_POLICY_SNAPKV, VASE_POLICY_VASE_ATTNV};
    int differ = 0, first = -1;
    unsigned first_threads = 0;
    for (size_t pi = 0; pi < 2; pi++) {
        struct vase_plan_input in = layer_input(&L, pols[pi]);
        assert_int_equal(vase_plan(&in, 1, NULL, ref), 0);
        for (int it = 0; it < iters; it++) {
            unsigned t = 2 + (unsigned)it % 4;
            assert_int_equal(vase_plan(&in, t, NULL, got), 0);
            if (memcmp(got, ref, sizeof(ref)) != 0) {
                if (differ++ == 0) {
                    first = it;
                    first_threads = t;
                }
            }
        }
    }
    layer_free(&L);
    if (differ)
        fail_msg("%d of %d multi-threaded plans differ from the single-threaded one (first: run "
                 "%d, %u threads)",
                 differ, 2 * iters, first, first_threads);
}

/* A workspace reused across layers of different sizes gives the plans of fresh ones. */
static void test_plan_workspace_reuse(void **state) {
    (void)state;
    struct layer small, big;
    layer_new(&small, 2, 2, 13, 4, 4, 4, 5);
    layer_new(&big, 2, 4, 90, 4, 16, 4, 6);
    struct vase_workspace *ws = NULL;
    assert_int_equal(vase_workspace_new(&ws), 0);
    uint32_t a[2 * 12], b[2 * 12];
    for (int rep = 0; rep < 2; rep++)
        for (size_t pi = 0; pi < N_POLICIES; pi++) {
            const struct layer *L = rep ? &small : &big;
            struct vase_plan_input in = layer_input(L, all_policies[pi]);
            in.gauss = L->gauss;
            assert_int_equal(vase_plan(&in, 1, &ws, a), 0);
            assert_int_equal(vase_plan(&in, 1, NULL, b), 0);
            assert_list(a, b, 2 * 12);
        }
    vase_workspace_free(ws);
    layer_free(&small);
    layer_free(&big);
}

/* ---- draws ---- */

/* A plan's draws are those of its key: (seed, sequence, layer, KV head, round). Injecting
 * vase_rng_exp()'s draws for each head reproduces the plan; any other key changes it. */
static void test_plan_draw_keying(void **state) {
    (void)state;
    struct layer L;
    layer_new(&L, 3, 3, 40, 4, 4, 4, 99);
    const uint32_t K = 12, H = 3, n = L.n;
    uint32_t a[3 * 12], b[3 * 12];
    float *draws = malloc((size_t)H * n * sizeof(float));
    assert_non_null(draws);
    static const enum vase_policy sampled[] = {VASE_POLICY_VASE_ATTNV, VASE_POLICY_RANDOM,
                                               VASE_POLICY_ATTN_SAMPLE,
                                               VASE_POLICY_RANGE_SAMPLE_ATTN};
    for (size_t pi = 0; pi < sizeof(sampled) / sizeof(sampled[0]); pi++) {
        struct vase_plan_input in = layer_input(&L, sampled[pi]);
        assert_int_equal(vase_plan(&in, 1, NULL, a), 0);
        assert_int_equal(vase_plan(&in, 2, NULL, b), 0);
        assert_list(a, b, H * K); /* deterministic */
        for (uint32_t h = 0; h < H; h++)
            vase_rng_exp(&in.rng, h, draws + (size_t)h * n, n);
        in.exp_draws = draws;
        in.rng.seed ^= 1; /* ignored when draws are injected */
        assert_int_equal(vase_plan(&in, 1, NULL, b), 0);
        assert_list(a, b, H * K);
        in.exp_draws = NULL;

        /* Each part of the key changes the random policy's plan (the others sample only a
         * few slots, which could coincide). */
        if (sampled[pi] != VASE_POLICY_RANDOM)
            continue;
        struct vase_rng keys[5];
        for (int i = 0; i < 5; i++)
            keys[i] = test_rng;
        keys[0].seed++;
        keys[1].sequence++;
        keys[2].layer++;
        keys[3].round++;
        keys[4].seed += 1ull << 32;
        for (int i = 0; i < 5; i++) {
            in.rng = keys[i];
            assert_int_equal(vase_plan(&in, 1, NULL, b), 0);
            for (uint32_t h = 0; h < H; h++)
                assert_memory_not_equal(a + h * K, b + h * K, K * sizeof(uint32_t));
        }
        /* Heads draw from their own streams: the three heads' random plans differ. */
        assert_memory_not_equal(a, a + K, K * sizeof(uint32_t));
        assert_memory_not_equal(a + K, a + 2 * K, K * sizeof(uint32_t));
    }
    free(draws);
    layer_free(&L);
}

/*
 * The sketch: vase-dkv draws a fresh Gm each eviction (the normals of its round, on the shared
 * head); curdkv draws it once, at the sequence's first eviction (round 0), and reuses it.
 */
static void test_plan_sketch_keying(void **state) {
    (void)state;
    struct layer L;
    layer_new(&L, 2, 2, 40, 4, 8, 4, 4242);
    const uint32_t K = 12, H = 2;
    uint32_t a[2 * 12], b[2 * 12];
    float gauss[8 * 4];

    struct vase_plan_input in = layer_input(&L, VASE_POLICY_VASE_DKV);
    assert_int_equal(vase_plan(&in, 1, NULL, a), 0);
    vase_rng_normal(&in.rng, VASE_RNG_HEAD_SHARED, gauss, 8 * 4);
    in.gauss = gauss;
    assert_int_equal(vase_plan(&in, 1, NULL, b), 0);
    assert_list(a, b, H * K);
    in.gauss = NULL;
    in.rng.round++;
    assert_int_equal(vase_plan(&in, 1, NULL, b), 0);
    assert_memory_not_equal(a, b, sizeof(a)); /* a fresh sketch */

    /* curdkv at rounds 0, 1 and 7: one sketch, the normals of round 0. */
    in = layer_input(&L, VASE_POLICY_CURDKV);
    struct vase_rng r0 = in.rng;
    r0.round = 0;
    vase_rng_normal(&r0, VASE_RNG_HEAD_SHARED, gauss, 8 * 4);
    in.gauss = gauss;
    assert_int_equal(vase_plan(&in, 1, NULL, a), 0);
    in.gauss = NULL;
    static const uint32_t rounds[] = {0, 1, 7};
    for (size_t i = 0; i < 3; i++) {
        in.rng.round = rounds[i];
        assert_int_equal(vase_plan(&in, 1, NULL, b), 0);
        assert_list(a, b, H * K);
    }
    layer_free(&L);
}

/* ---- invalid inputs and non-finite data ---- */

/* NaN or Inf in what a policy reads: -EINVAL, nothing written, for 1 and 2 threads. The bad
 * value sits in the last KV head only, so the other heads alone would succeed. */
static void test_plan_nonfinite_rejected(void **state) {
    (void)state;
    static const struct {
        enum vase_policy p;
        char where; /* 'k', 'v' or 'q' */
    } cases[] = {
        {VASE_POLICY_VASE_ATTNV, 'k'},
        {VASE_POLICY_VASE_ATTNV, 'v'},
        {VASE_POLICY_VASE_ATTNV, 'q'},
        {VASE_POLICY_VASE_DKV, 'k'},
        {VASE_POLICY_VASE_DKV, 'v'},
        {VASE_POLICY_CURDKV, 'k'},
        {VASE_POLICY_CURDKV, 'v'},
        {VASE_POLICY_SNAPKV, 'k'},
        {VASE_POLICY_SNAPKV, 'q'},
        {VASE_POLICY_RKV, 'k'},
        {VASE_POLICY_RKV, 'q'},
        {VASE_POLICY_ATTN_SAMPLE, 'k'},
        {VASE_POLICY_ATTN_SAMPLE, 'q'},
        {VASE_POLICY_RANGE_ATTN, 'v'},
        {VASE_POLICY_RANGE_ATTN, 'q'},
        {VASE_POLICY_RANGE_SAMPLE_ATTN, 'k'},
        {VASE_POLICY_RANGE_SAMPLE_ATTN, 'v'},
        {VASE_POLICY_EVICT_LARGE_RANGE, 'v'},
    };
    static const float bad[] = {NAN, INFINITY, -INFINITY};
    const uint32_t K = 12, H = 2;
    uint32_t keep[2 * 12 + 1];
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++)
        for (size_t b = 0; b < 3; b++) {
            struct layer L;
            layer_new(&L, H, 4, 20, 4, 4, 4, 1000 + c);
            uint32_t row = (uint32_t)(c * 7 + b) % L.n; /* some candidate */
            if (cases[c].where == 'k')
                L.k[((size_t)1 * L.len + row) * L.dim + 2] = bad[b];
            else if (cases[c].where == 'v')
                L.v[((size_t)1 * L.len + row) * L.dim + 1] = bad[b];
            else
                L.q[((size_t)3 * L.w + row % L.w) * L.dim + 3] = bad[b]; /* query head 3 */
            struct vase_plan_input in = layer_input(&L, cases[c].p);
            for (unsigned t = 1; t <= 2; t++) {
                fill_sentinel(keep, H * K + 1);
                int r = vase_plan(&in, t, NULL, keep);
                if (r != -EINVAL)
                    fail_msg("%s with %g in %c: %d", vase_policy_to_string(cases[c].p),
                             (double)bad[b], cases[c].where, r);
                assert_all_sentinel(keep, H * K + 1);
            }
            fill_sentinel(keep, H * K + 1);
            assert_int_equal(vase_plan_heads(&in, 1, 2, NULL, keep), -EINVAL);
            assert_all_sentinel(keep, H * K + 1);
            /* Head 0 alone does not read the bad value (query head 3 is in group 1). */
            assert_int_equal(vase_plan_heads(&in, 0, 1, NULL, keep), 0);
            layer_free(&L);
        }
}

/*
 * Non-finite data in float16 and bfloat16 storage is caught the same way: Inf and NaN in each
 * array each policy reads, in both half formats. All combinations run; the failures are listed
 * together.
 */
static void test_plan_nonfinite_half(void **state) {
    (void)state;
    enum { N = 10, W = 2, D = 2 };
    static const struct {
        enum vase_policy p;
        const char *reads;
    } cases[] = {
        {VASE_POLICY_VASE_ATTNV, "kvq"}, {VASE_POLICY_SNAPKV, "kq"},
        {VASE_POLICY_RKV, "kq"},         {VASE_POLICY_ATTN_SAMPLE, "kq"},
        {VASE_POLICY_VASE_DKV, "kv"},    {VASE_POLICY_EVICT_LARGE_RANGE, "v"},
    };
    uint16_t k[(N + W) * D], v[(N + W) * D], q[W * D];
    const float gauss[D * 2] = {1, -1, 0.5f, 2};
    struct vase_params p = vase_params_default(6);
    p.window = W;
    p.n_large = 1;
    p.n_sink = 1;
    p.smooth = 1;
    p.rank = 2;
    uint32_t keep[5];
    char failures[2048] = "";
    size_t used = 0;
    for (int dt = 0; dt < 2; dt++) {
        enum vase_dtype dtype = dt ? VASE_DTYPE_BF16 : VASE_DTYPE_F16;
        uint16_t (*enc)(float) = dt ? vase_f32_to_bf16 : vase_f32_to_f16;
        for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++)
            for (const char *w = cases[c].reads; *w; w++)
                for (int b = 0; b < 2; b++) {
                    for (int i = 0; i < (N + W) * D; i++) {
                        k[i] = enc((float)(i % 5 + 1) * 0.25f);
                        v[i] = enc((float)(i % 7) * 0.5f);
                    }
                    for (int i = 0; i < W * D; i++)
                        q[i] = enc(1.0f);
                    uint16_t *arr = *w == 'k' ? k : *w == 'v' ? v : q;
                    arr[3] = enc(b ? NAN : INFINITY); /* row 1, element 1 */
                    struct vase_plan_input in = {
                        .policy = cases[c].p,
                        .params = p,
                        .n = N,
                        .hq = 1,
                        .k = vase_view_contiguous(k, dtype, 1, N + W, D),
                        .v = vase_view_contiguous(v, dtype, 1, N + W, D),
                        .q = vase_view_contiguous(q, dtype, 1, W, D),
                        .rng = test_rng,
                        .gauss = gauss,
                    };
                    fill_sentinel(keep, 5);
                    int r = vase_plan(&in, 1, NULL, keep);
                    bool untouched = true;
                    for (int i = 0; i < 5; i++)
                        untouched &= keep[i] == SENTINEL;
                    if ((r != -EINVAL || !untouched) && used < sizeof(failures) - 100)
                        used += (size_t)snprintf(failures + used, sizeof(failures) - used,
                                                 "  %s, %s %s in %c: returned %d%s\n",
                                                 vase_policy_to_string(cases[c].p),
                                                 vase_dtype_to_string(dtype), b ? "NaN" : "Inf", *w,
                                                 r, untouched ? "" : ", plan written");
                }
    }
    if (used)
        fail_msg("non-finite half-precision data accepted:\n%s", failures);
}

static void test_plan_invalid_inputs(void **state) {
    (void)state;
    struct layer L;
    layer_new(&L, 2, 4, 20, 4, 4, 4, 8);
    uint32_t keep[2 * 12 + 1];
    struct vase_plan_input in;

#define EXPECT_EINVAL(policy, mutation)                                                            \
    do {                                                                                           \
        in = layer_input(&L, (policy));                                                            \
        mutation;                                                                                  \
        fill_sentinel(keep, 2 * 12 + 1);                                                           \
        assert_int_equal(vase_plan(&in, 1, NULL, keep), -EINVAL);                                  \
        assert_int_equal(vase_plan(&in, 2, NULL, keep), -EINVAL);                                  \
        assert_int_equal(vase_plan_heads(&in, 0, 2, NULL, keep), -EINVAL);                         \
        assert_all_sentinel(keep, 2 * 12 + 1);                                                     \
    } while (0)

    /* Sanity: the unmodified input plans. */
    in = layer_input(&L, VASE_POLICY_VASE_ATTNV);
    assert_int_equal(vase_plan(&in, 1, NULL, keep), 0);

    EXPECT_EINVAL(VASE_POLICY_VASE_ATTNV, in.params.budget = 18); /* not a multiple of W */
    EXPECT_EINVAL(VASE_POLICY_VASE_ATTNV, in.params.smooth = 2);
    EXPECT_EINVAL(VASE_POLICY_SNAPKV, in.params.temperature = 0.0f);
    EXPECT_EINVAL(VASE_POLICY_RKV, in.params.lambda = 2.0f);
    EXPECT_EINVAL(VASE_POLICY_VASE_DKV, in.params.rank = 0);
    EXPECT_EINVAL(_VASE_POLICY_MAX, (void)0);
    EXPECT_EINVAL(VASE_POLICY_STREAMING, in.n = 11); /* fewer candidates than K = 12 */
    EXPECT_EINVAL(VASE_POLICY_SNAPKV, in.n = 11);
    EXPECT_EINVAL(VASE_POLICY_STREAMING, in.k.heads = 0);
    EXPECT_EINVAL(VASE_POLICY_SNAPKV, in.hq = 3);      /* not a multiple of Hkv */
    EXPECT_EINVAL(VASE_POLICY_SNAPKV, in.q.heads = 2); /* != hq */
    EXPECT_EINVAL(VASE_POLICY_SNAPKV, in.q.dim = 2);   /* != k.dim */
    EXPECT_EINVAL(VASE_POLICY_SNAPKV, in.q.base = NULL);
    EXPECT_EINVAL(VASE_POLICY_SNAPKV, in.k.dim = 0);
    EXPECT_EINVAL(VASE_POLICY_SNAPKV, in.k.dtype = _VASE_DTYPE_MAX);
    EXPECT_EINVAL(VASE_POLICY_VASE_ATTNV, in.v.heads = 1); /* != k.heads */
    EXPECT_EINVAL(VASE_POLICY_VASE_ATTNV, in.v.dim = 2);   /* != k.dim */
    EXPECT_EINVAL(VASE_POLICY_VASE_DKV, in.v.base = NULL);
    EXPECT_EINVAL(VASE_POLICY_EVICT_LARGE_RANGE, in.v.dim = 0);
    EXPECT_EINVAL(VASE_POLICY_H2O, in.acc = NULL);
    /* A query ring smaller than the window, and a ring offset without a ring. */
    EXPECT_EINVAL(VASE_POLICY_SNAPKV, (in.q.ring = 3, in.q.first = 1));
    EXPECT_EINVAL(VASE_POLICY_SNAPKV, in.k.first = 2);
    /* A block table without pages. */
    static const uint32_t table[1] = {0};
    EXPECT_EINVAL(VASE_POLICY_VASE_ATTNV, in.v.pages = table);
    /* An injected sketch with NaN; injected draws that are negative or NaN. */
    float gauss[4 * 4];
    for (int i = 0; i < 16; i++)
        gauss[i] = 1.0f;
    gauss[9] = NAN;
    EXPECT_EINVAL(VASE_POLICY_VASE_DKV, in.gauss = gauss);
    EXPECT_EINVAL(VASE_POLICY_CURDKV, in.gauss = gauss);
    float draws[2 * 20];
    for (int i = 0; i < 40; i++)
        draws[i] = 1.0f;
    draws[27] = -1.0f;
    EXPECT_EINVAL(VASE_POLICY_RANDOM, in.exp_draws = draws);
    EXPECT_EINVAL(VASE_POLICY_ATTN_SAMPLE, in.exp_draws = draws);
    draws[27] = NAN;
    EXPECT_EINVAL(VASE_POLICY_RANDOM, in.exp_draws = draws);
    /* Pushed scores that are negative or NaN. */
    float scores[2 * 20];
    for (int i = 0; i < 40; i++)
        scores[i] = 0.5f;
    scores[33] = -0.5f;
    EXPECT_EINVAL(VASE_POLICY_SNAPKV, in.scores = scores);
    scores[33] = NAN;
    EXPECT_EINVAL(VASE_POLICY_VASE_ATTNV, (in.scores = scores, in.params.n_large = 0));
#undef EXPECT_EINVAL

    in = layer_input(&L, VASE_POLICY_SNAPKV);
    assert_int_equal(vase_plan(NULL, 1, NULL, keep), -EINVAL);
    assert_int_equal(vase_plan(&in, 1, NULL, NULL), -EINVAL);
    assert_int_equal(vase_plan_heads(NULL, 0, 1, NULL, keep), -EINVAL);
    assert_int_equal(vase_plan_heads(&in, 0, 1, NULL, NULL), -EINVAL);
    layer_free(&L);
}

/*
 * Degenerate but valid: attention that underflows to zero for most candidates leaves fewer
 * positive weights than slots to sample; zeros fill in ascending index and P is never drawn.
 * D = 2, one query (1, 0), T = 0.01, keys (0, 0) except k_3 = k_6 = (10, 0): their logits are
 * 10 / (sqrt 2 * 0.01) = 707 above the others, so every other p is exactly 0 in float32 and
 * p_3 = p_6 = 1/2. vase-attnv with 1 sink and n_large 2; V ranges are 1 except 4 for row 5, so
 * P = 0 (the sink), 5. K - n_large = 4 slots race: 3 and 6 (equal keys 0.5: ascending), then
 * the zero weights in ascending index, skipping P: 1, 2. keep = 0 5 3 6 1 2.
 */
static void test_plan_zero_weights_fill(void **state) {
    (void)state;
    enum { N = 8, K = 6 };
    float k[(N + 1) * 2], v[(N + 1) * 2], q[2] = {1, 0};
    for (int j = 0; j <= N; j++) {
        k[j * 2] = j == N ? NAN : (j == 3 || j == 6) ? 10.0f : 0.0f;
        k[j * 2 + 1] = j == N ? NAN : 0.0f;
        v[j * 2] = j == N ? NAN : j == 5 ? 4.0f : 1.0f;
        v[j * 2 + 1] = j == N ? NAN : 0.0f;
    }
    const float ones[N] = {1, 1, 1, 1, 1, 1, 1, 1};
    struct vase_params p = vase_params_default(7);
    p.window = 1;
    p.n_sink = 1;
    p.n_large = 2;
    p.smooth = 1;
    p.temperature = 0.01f;
    struct vase_plan_input in = {
        .policy = VASE_POLICY_VASE_ATTNV,
        .params = p,
        .n = N,
        .hq = 1,
        .k = vase_view_contiguous(k, VASE_DTYPE_F32, 1, N + 1, 2),
        .v = vase_view_contiguous(v, VASE_DTYPE_F32, 1, N + 1, 2),
        .q = vase_view_contiguous(q, VASE_DTYPE_F32, 1, 1, 2),
        .exp_draws = ones,
    };
    expect_plan(&in, (const uint32_t[]){0, 5, 3, 6, 1, 2}, K);
    /* attn-sample: 3, 6, then the zeros 0, 1, 2, 4. */
    in.policy = VASE_POLICY_ATTN_SAMPLE;
    expect_plan(&in, (const uint32_t[]){3, 6, 0, 1, 2, 4}, K);
    /* With generated draws the two positives still come first; the zeros fill in order. */
    in.exp_draws = NULL;
    in.rng = test_rng;
    uint32_t keep[K];
    assert_int_equal(vase_plan(&in, 1, NULL, keep), 0);
    assert_true((keep[0] == 3 && keep[1] == 6) || (keep[0] == 6 && keep[1] == 3));
    assert_list(keep + 2, (const uint32_t[]){0, 1, 2, 4}, 4);
}

/* ---- storage dtypes and layouts ---- */

static void store(void *base, enum vase_dtype dt, size_t i, float f) {
    if (dt == VASE_DTYPE_F32)
        ((float *)base)[i] = f;
    else if (dt == VASE_DTYPE_F16)
        ((uint16_t *)base)[i] = vase_f32_to_f16(f);
    else
        ((uint16_t *)base)[i] = vase_f32_to_bf16(f);
}

/* The same values (exact in every dtype) stored as float16 and bfloat16 give the float32 plan,
 * for every policy. */
static void test_plan_dtypes_equal(void **state) {
    (void)state;
    struct layer L;
    layer_new(&L, 2, 4, 24, 4, 8, 4, 2718);
    const uint32_t K = 12;
    size_t kv = (size_t)L.hkv * L.len * L.dim, qn = (size_t)L.hq * L.w * L.dim;
    uint16_t *k16 = malloc(kv * 2), *v16 = malloc(kv * 2), *q16 = malloc(qn * 2);
    assert_true(k16 && v16 && q16);
    uint32_t ref[2 * 12], got[2 * 12];
    for (int dt = VASE_DTYPE_F16; dt <= VASE_DTYPE_BF16; dt++) {
        enum vase_dtype dtype = (enum vase_dtype)dt;
        for (size_t i = 0; i < kv; i++) {
            store(k16, dtype, i, L.k[i]);
            store(v16, dtype, i, L.v[i]);
        }
        for (size_t i = 0; i < qn; i++)
            store(q16, dtype, i, L.q[i]);
        for (size_t pi = 0; pi < N_POLICIES; pi++) {
            struct vase_plan_input in = layer_input(&L, all_policies[pi]);
            in.gauss = L.gauss;
            assert_int_equal(vase_plan(&in, 1, NULL, ref), 0);
            in.k = vase_view_contiguous(k16, dtype, L.hkv, L.len, L.dim);
            in.v = vase_view_contiguous(v16, dtype, L.hkv, L.len, L.dim);
            in.q = vase_view_contiguous(q16, dtype, L.hq, L.w, L.dim);
            assert_int_equal(vase_plan(&in, 1, NULL, got), 0);
            assert_list(got, ref, 2 * K);
        }
    }
    free(k16);
    free(v16);
    free(q16);
    layer_free(&L);
}

/*
 * The paged arena: pages of [layer][K,V][token][kv_head][dim], the sequence's logical pages
 * scattered by a shuffled block table; the layer planned is layer 1 of 3. Queries in a ring of
 * 7 slots whose oldest is slot 5, stored [slot][q_head][dim]. Everything the plan must not read
 * (other layers, unused pages and ring slots, the recent window) is NaN. The plan through these
 * views must equal the plan on the same values laid out contiguously, in each dtype.
 */
enum { A_LAYERS = 3, A_TPP = 4, A_PAGES = 10, A_RING = 7, A_FIRST = 5 };

static void test_plan_paged_views_equal(void **state) {
    (void)state;
    struct layer L;
    layer_new(&L, 2, 4, 22, 4, 4, 4, 1618); /* len 26: 7 logical pages of 4 tokens */
    static const uint32_t table[7] = {8, 2, 5, 0, 9, 3, 6};
    const uint32_t layer = 1, H = L.hkv, D = L.dim, K = 12;
    const size_t page_elems = (size_t)A_LAYERS * 2 * A_TPP * H * D;
    uint32_t ref[2 * 12], got[2 * 12 + 1];

    for (int dt = 0; dt < _VASE_DTYPE_MAX; dt++) {
        enum vase_dtype dtype = (enum vase_dtype)dt;
        size_t es = vase_dtype_size(dtype);
        void *arena = malloc(A_PAGES * page_elems * es);
        void *ring = malloc((size_t)A_RING * L.hq * D * es);
        assert_true(arena && ring);
        for (size_t i = 0; i < A_PAGES * page_elems; i++)
            store(arena, dtype, i, NAN);
        for (size_t i = 0; i < (size_t)A_RING * L.hq * D; i++)
            store(ring, dtype, i, NAN);
        /* Token t of the sequence: logical page t / tpp, token t % tpp of that page. */
        for (uint32_t t = 0; t < L.len; t++)
            for (uint32_t h = 0; h < H; h++)
                for (uint32_t d = 0; d < D; d++)
                    for (uint32_t kv = 0; kv < 2; kv++) {
                        size_t off = table[t / A_TPP] * page_elems +
                                     (((size_t)(layer * 2 + kv) * A_TPP + t % A_TPP) * H + h) * D +
                                     d;
                        store(arena, dtype, off, (kv ? L.v : L.k)[((size_t)h * L.len + t) * D + d]);
                    }
        /* Query row i in ring slot (5 + i) % 7. */
        for (uint32_t i = 0; i < L.w; i++)
            for (uint32_t h = 0; h < L.hq; h++)
                for (uint32_t d = 0; d < D; d++)
                    store(ring, dtype, ((size_t)((A_FIRST + i) % A_RING) * L.hq + h) * D + d,
                          L.q[((size_t)h * L.w + i) * D + d]);

        struct vase_view kview = {
            .base = (char *)arena + (size_t)layer * 2 * A_TPP * H * D * es,
            .pages = table,
            .tokens_per_page = A_TPP,
            .heads = H,
            .dim = D,
            .dtype = dtype,
            .page_stride = (int64_t)(page_elems * es),
            .token_stride = (int64_t)(H * D * es),
            .head_stride = (int64_t)(D * es),
        };
        struct vase_view vview = kview;
        vview.base = (char *)kview.base + (size_t)A_TPP * H * D * es;
        struct vase_view qview = {
            .base = ring,
            .ring = A_RING,
            .first = A_FIRST,
            .heads = L.hq,
            .dim = D,
            .dtype = dtype,
            .token_stride = (int64_t)(L.hq * D * es),
            .head_stride = (int64_t)(D * es),
        };
        for (size_t pi = 0; pi < N_POLICIES; pi++) {
            struct vase_plan_input in = layer_input(&L, all_policies[pi]);
            assert_int_equal(vase_plan(&in, 1, NULL, ref), 0);
            in.k = kview;
            in.v = vview;
            in.q = qview;
            for (unsigned t = 1; t <= 2; t++) {
                fill_sentinel(got, 2 * K + 1);
                assert_int_equal(vase_plan(&in, t, NULL, got), 0);
                assert_list(got, ref, 2 * K);
                assert_int_equal(got[2 * K], SENTINEL);
            }
        }
        free(ring);
        free(arena);
    }
    layer_free(&L);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_params_default),
        cmocka_unit_test(test_params_check),
        cmocka_unit_test(test_policy_names),
        cmocka_unit_test(test_policy_from_mode),
        cmocka_unit_test(test_policy_needs),
        cmocka_unit_test(test_plan_hand_value_aware),
        cmocka_unit_test(test_plan_hand_attention_policies),
        cmocka_unit_test(test_plan_hand_metrics),
        cmocka_unit_test(test_plan_box_filter_decides),
        cmocka_unit_test(test_plan_temperature_decides),
        cmocka_unit_test(test_plan_hand_rkv),
        cmocka_unit_test(test_plan_hand_dkv),
        cmocka_unit_test(test_plan_hand_h2o),
        cmocka_unit_test(test_plan_structure_random),
        cmocka_unit_test(test_plan_threads_and_head_ranges),
        cmocka_unit_test(test_plan_threads_repeatable),
        cmocka_unit_test(test_plan_workspace_reuse),
        cmocka_unit_test(test_plan_draw_keying),
        cmocka_unit_test(test_plan_sketch_keying),
        cmocka_unit_test(test_plan_nonfinite_rejected),
        cmocka_unit_test(test_plan_nonfinite_half),
        cmocka_unit_test(test_plan_invalid_inputs),
        cmocka_unit_test(test_plan_zero_weights_fill),
        cmocka_unit_test(test_plan_dtypes_equal),
        cmocka_unit_test(test_plan_paged_views_equal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
