/* SPDX-License-Identifier: MIT */

/*
 * Tests of kernels/philox.c: the Philox4x32-10 block against the published known-answer values,
 * the keying of draw streams (seed, sequence, layer, KV head, round, stream), prefix stability,
 * and the distributions of the uniform, exponential and normal draws with a fixed seed.
 *
 * The distribution tests use fixed seeds, so they are deterministic; their thresholds are the
 * critical values at significance p = 0.001, so a correct generator passes them for all but
 * one seed in a thousand, while a biased or badly keyed one fails.
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

/* Random123's kat_vectors, philox4x32_10 lines: counter, key, expected output. */
static void test_philox_known_answers(void **state) {
    (void)state;
    static const struct {
        uint32_t ctr[4], key[2], out[4];
    } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
         {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
         {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (size_t i = 0; i < sizeof(kat) / sizeof(kat[0]); i++) {
        uint32_t out[4] = {0};
        vase_philox4x32_10(kat[i].ctr, kat[i].key, out);
        for (int j = 0; j < 4; j++)
            assert_int_equal(out[j], kat[i].out[j]);
    }
}

/* The block is a pure function of its inputs and does not modify them. */
static void test_philox_inputs_const(void **state) {
    (void)state;
    uint32_t ctr[4] = {1, 2, 3, 4}, key[2] = {5, 6}, a[4], b[4];
    vase_philox4x32_10(ctr, key, a);
    vase_philox4x32_10(ctr, key, b);
    assert_memory_equal(a, b, sizeof(a));
    assert_int_equal(ctr[0], 1);
    assert_int_equal(ctr[3], 4);
    assert_int_equal(key[0], 5);
    assert_int_equal(key[1], 6);
    /* One bit of counter or key changes the block. */
    ctr[0] ^= 1;
    vase_philox4x32_10(ctr, key, b);
    assert_memory_not_equal(a, b, sizeof(a));
    ctr[0] ^= 1;
    key[1] ^= 0x80000000u;
    vase_philox4x32_10(ctr, key, b);
    assert_memory_not_equal(a, b, sizeof(a));
}

/*
 * The uniform draws are the Philox blocks of the counter layout philox.c documents:
 * key {seed low, seed high}, counter {block, round, layer << 16 | kv_head << 4 | stream,
 * sequence}, 4 words per block, u = ((word >> 8) + 1) * 2^-24. The CUDA kernels must draw the
 * same numbers, so the layout is pinned here.
 */
static void test_uniform_counter_layout(void **state) {
    (void)state;
    const struct vase_rng rng = {
        .seed = 0x0123456789abcdefull, .sequence = 77, .layer = 5, .round = 3};
    enum { N = 41 };
    float u[N];
    vase_rng_uniform(&rng, 9, 6, u, N);
    uint32_t key[2] = {0x89abcdefu, 0x01234567u};
    for (uint32_t i = 0; i < N; i++) {
        uint32_t ctr[4] = {i / 4, 3, 5u << 16 | 9u << 4 | 6u, 77}, out[4];
        vase_philox4x32_10(ctr, key, out);
        float want = (float)(((out[i % 4] >> 8) + 1) * 0x1p-24);
        assert_true(u[i] == want);
    }
}

static bool same(const float *a, const float *b, size_t n) {
    return memcmp(a, b, n * sizeof(float)) == 0;
}

/* Same key, same draws; any part of the key changed, different draws. */
static void test_stream_keying(void **state) {
    (void)state;
    enum { N = 64 };
    const struct vase_rng base = {.seed = 42, .sequence = 7, .layer = 3, .round = 2};
    float a[N], b[N];

    vase_rng_exp(&base, 1, a, N);
    vase_rng_exp(&base, 1, b, N);
    assert_true(same(a, b, N));
    vase_rng_normal(&base, 1, a, N);
    vase_rng_normal(&base, 1, b, N);
    assert_true(same(a, b, N));
    vase_rng_uniform(&base, 1, 3, a, N);
    vase_rng_uniform(&base, 1, 3, b, N);
    assert_true(same(a, b, N));

    struct vase_rng variants[] = {base, base, base, base, base};
    variants[0].seed = 43;
    variants[1].seed = 42 | 1ull << 32; /* the seed's high word is part of the key */
    variants[2].sequence = 8;
    variants[3].layer = 4;
    variants[4].round = 3;
    vase_rng_exp(&base, 1, a, N);
    for (size_t i = 0; i < sizeof(variants) / sizeof(variants[0]); i++) {
        vase_rng_exp(&variants[i], 1, b, N);
        assert_false(same(a, b, N));
        vase_rng_normal(&variants[i], 1, b, N);
        float c[N];
        vase_rng_normal(&base, 1, c, N);
        assert_false(same(c, b, N));
    }
    /* Heads: each head its own stream, the shared sketch head too. */
    static const uint32_t heads[] = {0, 2, 4094, VASE_RNG_HEAD_SHARED};
    for (size_t i = 0; i < sizeof(heads) / sizeof(heads[0]); i++) {
        vase_rng_exp(&base, heads[i], b, N);
        assert_false(same(a, b, N));
    }
    /* Uniform streams differ from one another. */
    vase_rng_uniform(&base, 1, 3, a, N);
    vase_rng_uniform(&base, 1, 4, b, N);
    assert_false(same(a, b, N));
    /* The exponential and normal draws of one key are not the same numbers. */
    vase_rng_exp(&base, 1, a, N);
    vase_rng_normal(&base, 1, b, N);
    assert_false(same(a, b, N));
}

/* The first n draws of a request for m > n equal a request for n, across chunk boundaries and
 * odd counts (the normal draws come in Box-Muller pairs). */
static void test_prefix_stability(void **state) {
    (void)state;
    enum { M = 1100 };
    const struct vase_rng rng = {.seed = 0xdeadbeefcafeull, .sequence = 1, .layer = 2, .round = 9};
    static const size_t ns[] = {0, 1, 2, 3, 4, 5, 7, 255, 256, 257, 511, 513, 1023, 1099};
    float *full = malloc(M * sizeof(float));
    float *part = malloc((M + 1) * sizeof(float));
    assert_non_null(full);
    assert_non_null(part);

    for (int kind = 0; kind < 3; kind++) {
        if (kind == 0)
            vase_rng_exp(&rng, 5, full, M);
        else if (kind == 1)
            vase_rng_normal(&rng, 5, full, M);
        else
            vase_rng_uniform(&rng, 5, 2, full, M);
        for (size_t i = 0; i < sizeof(ns) / sizeof(ns[0]); i++) {
            /* A guard after the n requested: nothing is written past them. */
            part[ns[i]] = -12345.0f;
            if (kind == 0)
                vase_rng_exp(&rng, 5, part, ns[i]);
            else if (kind == 1)
                vase_rng_normal(&rng, 5, part, ns[i]);
            else
                vase_rng_uniform(&rng, 5, 2, part, ns[i]);
            assert_true(same(full, part, ns[i]));
            assert_true(part[ns[i]] == -12345.0f);
        }
    }
    free(part);
    free(full);
}

/* Uniform draws lie in (0, 1] and exponentials are -log of such a u: >= 0 and finite. */
static void test_ranges(void **state) {
    (void)state;
    enum { N = 20000 };
    float *x = malloc(N * sizeof(float));
    assert_non_null(x);
    const struct vase_rng rng = {.seed = 5};
    vase_rng_uniform(&rng, 0, 0, x, N);
    for (int i = 0; i < N; i++)
        assert_true(x[i] > 0.0f && x[i] <= 1.0f);
    vase_rng_exp(&rng, 0, x, N);
    for (int i = 0; i < N; i++) {
        assert_true(x[i] >= 0.0f && isfinite(x[i]));
        assert_false(signbit(x[i])); /* never -0: w / E must not be -Inf */
    }
    vase_rng_normal(&rng, 0, x, N);
    for (int i = 0; i < N; i++)
        assert_true(isfinite(x[i]));
    free(x);
}

/*
 * Chi-square of 102400 uniform draws over 64 equal bins of (0, 1]: 63 degrees of freedom, the
 * critical value at p = 0.001 is 103.44. Draw u falls in bin ceil(64 u) - 1.
 */
static void test_uniform_chi_square(void **state) {
    (void)state;
    enum { N = 102400, BINS = 64 };
    float *u = malloc(N * sizeof(float));
    assert_non_null(u);
    static const struct vase_rng rngs[] = {
        {.seed = 1234, .sequence = 0, .layer = 0, .round = 0},
        {.seed = 0xfeedface12345678ull, .sequence = 99, .layer = 31, .round = 1000},
    };
    for (size_t k = 0; k < sizeof(rngs) / sizeof(rngs[0]); k++) {
        vase_rng_uniform(&rngs[k], 3, 0, u, N);
        unsigned count[BINS] = {0};
        for (int i = 0; i < N; i++) {
            int b = (int)ceil((double)u[i] * BINS) - 1;
            assert_true(b >= 0 && b < BINS);
            count[b]++;
        }
        double expect = (double)N / BINS, chi = 0.0;
        for (int b = 0; b < BINS; b++)
            chi += (count[b] - expect) * (count[b] - expect) / expect;
        assert_true(chi < 103.44);

        /* Consecutive pairs on an 8 x 8 grid: 63 degrees of freedom again, 103.44. Catches
         * draws that are uniform one by one but correlated with their neighbour. */
        unsigned grid[64] = {0};
        for (int i = 0; i + 1 < N; i += 2) {
            int a = (int)ceil((double)u[i] * 8) - 1, b = (int)ceil((double)u[i + 1] * 8) - 1;
            grid[a * 8 + b]++;
        }
        expect = (double)(N / 2) / 64;
        chi = 0.0;
        for (int c = 0; c < 64; c++)
            chi += (grid[c] - expect) * (grid[c] - expect) / expect;
        assert_true(chi < 103.44);
    }
    free(u);
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* The Kolmogorov-Smirnov statistic of n samples against a continuous CDF. */
static double ks_statistic(float *x, size_t n, double (*cdf)(double)) {
    qsort(x, n, sizeof(float), cmp_float);
    double d = 0.0;
    for (size_t i = 0; i < n; i++) {
        double f = cdf(x[i]);
        double lo = f - (double)i / n, hi = (double)(i + 1) / n - f;
        d = fmax(d, fmax(lo, hi));
    }
    return d;
}

static double exp_cdf(double x) {
    return x <= 0.0 ? 0.0 : 1.0 - exp(-x);
}

static double normal_cdf(double x) {
    return 0.5 * (1.0 + erf(x / sqrt(2.0)));
}

/*
 * KS critical value at p = 0.001 for large n: 1.9495 / sqrt(n) (the 0.999 quantile of the
 * Kolmogorov distribution); with n = 40000 that is 0.009747. A mean check rides along: Exp(1)
 * has mean 1 and variance 1, so the mean of 40000 draws is within 4 standard errors
 * (4 / 200 = 0.02) of 1 except with probability 6e-5.
 */
enum { KS_N = 40000 };
#define KS_CRIT (1.9495 / 200.0)

static void test_exp_ks(void **state) {
    (void)state;
    float *x = malloc(KS_N * sizeof(float));
    assert_non_null(x);
    static const struct vase_rng rngs[] = {
        {.seed = 77, .sequence = 1, .layer = 2, .round = 3},
        {.seed = 0xffffffffffffffffull, .sequence = 0xffffffffu, .layer = 65535, .round = 5},
    };
    for (size_t k = 0; k < sizeof(rngs) / sizeof(rngs[0]); k++) {
        vase_rng_exp(&rngs[k], 4, x, KS_N);
        double mean = 0.0;
        for (int i = 0; i < KS_N; i++)
            mean += x[i];
        mean /= KS_N;
        assert_true(fabs(mean - 1.0) < 0.02);
        assert_true(ks_statistic(x, KS_N, exp_cdf) < KS_CRIT);
    }
    free(x);
}

/* As above for the normal draws, against Phi(x) = (1 + erf(x / sqrt 2)) / 2; an odd count so the
 * unpaired last draw is included. Mean within 4 standard errors of 0, variance near 1. */
static void test_normal_ks(void **state) {
    (void)state;
    float *x = malloc((KS_N + 1) * sizeof(float));
    assert_non_null(x);
    static const struct vase_rng rngs[] = {
        {.seed = 2024, .sequence = 3, .layer = 0, .round = 0},
        {.seed = 1ull << 63, .sequence = 12, .layer = 100, .round = 77},
    };
    for (size_t k = 0; k < sizeof(rngs) / sizeof(rngs[0]); k++) {
        vase_rng_normal(&rngs[k], VASE_RNG_HEAD_SHARED, x, KS_N + 1);
        double mean = 0.0, sq = 0.0;
        for (int i = 0; i < KS_N + 1; i++) {
            mean += x[i];
            sq += (double)x[i] * x[i];
        }
        mean /= KS_N + 1;
        sq /= KS_N + 1;
        assert_true(fabs(mean) < 0.02);
        /* The variance estimate has standard error sqrt(2 / n) = 0.007: 4 of them. */
        assert_true(fabs(sq - mean * mean - 1.0) < 0.028);
        assert_true(ks_statistic(x, KS_N + 1, normal_cdf) < 1.9495 / sqrt(KS_N + 1.0));
    }
    /* Box-Muller pairs: the two members of a pair are uncorrelated (their sample correlation
     * is within 4 / sqrt(n_pairs) = 0.028 of 0). */
    vase_rng_normal(&rngs[0], 0, x, KS_N);
    double c = 0.0;
    for (int i = 0; i < KS_N; i += 2)
        c += (double)x[i] * x[i + 1];
    c /= KS_N / 2;
    assert_true(fabs(c) < 4.0 / sqrt(KS_N / 2.0));
    free(x);
}

/*
 * The streams of different heads, layers and rounds are independent: the uniform draws of two
 * neighbouring heads, paired, fill an 8 x 8 grid evenly (chi-square, 63 degrees of freedom,
 * 103.44 at p = 0.001).
 */
static void test_streams_independent(void **state) {
    (void)state;
    enum { N = 32000 };
    float *a = malloc(N * sizeof(float)), *b = malloc(N * sizeof(float));
    assert_non_null(a);
    assert_non_null(b);
    const struct vase_rng r0 = {.seed = 9, .sequence = 1, .layer = 1, .round = 1};
    struct vase_rng r1 = r0;
    r1.round = 2;
    for (int variant = 0; variant < 2; variant++) {
        vase_rng_uniform(&r0, 0, 0, a, N);
        if (variant == 0)
            vase_rng_uniform(&r0, 1, 0, b, N);
        else
            vase_rng_uniform(&r1, 0, 0, b, N);
        unsigned grid[64] = {0};
        for (int i = 0; i < N; i++) {
            int x = (int)ceil((double)a[i] * 8) - 1, y = (int)ceil((double)b[i] * 8) - 1;
            grid[x * 8 + y]++;
        }
        double expect = (double)N / 64, chi = 0.0;
        for (int c = 0; c < 64; c++)
            chi += (grid[c] - expect) * (grid[c] - expect) / expect;
        assert_true(chi < 103.44);
    }
    free(a);
    free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_philox_known_answers),
        cmocka_unit_test(test_philox_inputs_const),
        cmocka_unit_test(test_uniform_counter_layout),
        cmocka_unit_test(test_stream_keying),
        cmocka_unit_test(test_prefix_stability),
        cmocka_unit_test(test_ranges),
        cmocka_unit_test(test_uniform_chi_square),
        cmocka_unit_test(test_exp_ks),
        cmocka_unit_test(test_normal_ks),
        cmocka_unit_test(test_streams_independent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
