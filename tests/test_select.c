/* SPDX-License-Identifier: MIT */

/*
 * Tests of kernels/select.c: top-k with the canonical order (descending value, ties in
 * ascending index) and sampling without replacement by the exponential race (ALGORITHM.md,
 * "Selection primitives"), including the degenerate inputs: zero weights, exclusions, zero or
 * infinite draws, NaN and negative weights. The expected lists are worked out by hand in the
 * comments; the random tests compare against a plain sort written here.
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

#define SENTINEL 0xdeadbeefu

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static uint32_t rand_u32(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32);
}

static void fill_sentinel(uint32_t *out, size_t n) {
    for (size_t i = 0; i < n; i++)
        out[i] = SENTINEL;
}

static void assert_all_sentinel(const uint32_t *out, size_t n) {
    for (size_t i = 0; i < n; i++)
        assert_int_equal(out[i], SENTINEL);
}

static void assert_list(const uint32_t *got, const uint32_t *want, size_t n) {
    for (size_t i = 0; i < n; i++)
        assert_int_equal(got[i], want[i]);
}

/* ---- top-k ---- */

static void test_topk_hand(void **state) {
    (void)state;
    /* x = 3 1 4 1 5 9 2 6: the 4 largest are 9 (index 5), 6 (7), 5 (4), 4 (2). */
    const float x[8] = {3, 1, 4, 1, 5, 9, 2, 6};
    uint32_t out[9];
    fill_sentinel(out, 9);
    assert_int_equal(vase_topk(x, 8, 4, out), 0);
    assert_list(out, (const uint32_t[]){5, 7, 4, 2}, 4);
    assert_all_sentinel(out + 4, 5); /* exactly n written */

    /* All of them: then 3 (0), and the two 1s tie: ascending index, 1 then 3. */
    assert_int_equal(vase_topk(x, 8, 8, out), 0);
    assert_list(out, (const uint32_t[]){5, 7, 4, 2, 0, 6, 1, 3}, 8);
    assert_int_equal(out[8], SENTINEL);

    /* n = 0 writes nothing and succeeds. */
    fill_sentinel(out, 9);
    assert_int_equal(vase_topk(x, 8, 0, out), 0);
    assert_all_sentinel(out, 9);
}

static void test_topk_ties(void **state) {
    (void)state;
    uint32_t out[6];
    /* 2 5 2 5 2: the 5s first in ascending index (1, 3), then the 2s (0, 2, 4). */
    const float a[5] = {2, 5, 2, 5, 2};
    assert_int_equal(vase_topk(a, 5, 5, out), 0);
    assert_list(out, (const uint32_t[]){1, 3, 0, 2, 4}, 5);
    assert_int_equal(vase_topk(a, 5, 3, out), 0);
    assert_list(out, (const uint32_t[]){1, 3, 0}, 3);

    /* All equal: the identity. */
    const float c[6] = {7, 7, 7, 7, 7, 7};
    assert_int_equal(vase_topk(c, 6, 6, out), 0);
    assert_list(out, (const uint32_t[]){0, 1, 2, 3, 4, 5}, 6);

    /* -0 and +0 are equal values, so they tie in ascending index whatever their signs. */
    const float z[4] = {-0.0f, 0.0f, -0.0f, -1.0f};
    assert_int_equal(vase_topk(z, 4, 4, out), 0);
    assert_list(out, (const uint32_t[]){0, 1, 2, 3}, 4);
    const float z2[3] = {0.0f, -0.0f, 0x1p-149f};
    assert_int_equal(vase_topk(z2, 3, 3, out), 0);
    assert_list(out, (const uint32_t[]){2, 0, 1}, 3); /* the subnormal is above both zeros */
}

static void test_topk_signs_and_infinities(void **state) {
    (void)state;
    uint32_t out[7];
    /* -1 Inf -Inf 0 -2 1e-30 -1e30: Inf (1), 1e-30 (5), 0 (3), -1 (0), -2 (4), -1e30 (6),
     * -Inf (2). */
    const float x[7] = {-1.0f, INFINITY, -INFINITY, 0.0f, -2.0f, 1e-30f, -1e30f};
    assert_int_equal(vase_topk(x, 7, 7, out), 0);
    assert_list(out, (const uint32_t[]){1, 5, 3, 0, 4, 6, 2}, 7);

    /* Values one ulp apart, in the low bits a radix sort looks at first. */
    const float one = 1.0f;
    const float y[4] = {one, nextafterf(one, 2.0f), nextafterf(one, 0.0f),
                        nextafterf(nextafterf(one, 2.0f), 2.0f)};
    assert_int_equal(vase_topk(y, 4, 4, out), 0);
    assert_list(out, (const uint32_t[]){3, 1, 0, 2}, 4);
    /* Negative values one ulp apart. */
    const float m[3] = {-1.0f, nextafterf(-1.0f, 0.0f), nextafterf(-1.0f, -2.0f)};
    assert_int_equal(vase_topk(m, 3, 3, out), 0);
    assert_list(out, (const uint32_t[]){1, 0, 2}, 3);
}

static void test_topk_invalid(void **state) {
    (void)state;
    uint32_t out[4];
    const float x[3] = {1, 2, 3};
    assert_int_equal(vase_topk(x, 3, 4, out), -EINVAL); /* n > len */
    const float nan[3] = {1, NAN, 3};
    assert_int_equal(vase_topk(nan, 3, 1, out), -EINVAL);
    assert_int_equal(vase_topk(NULL, 3, 1, out), -EINVAL);
    assert_int_equal(vase_topk(x, 3, 1, NULL), -EINVAL);
    /* An empty input with n = 0 is valid and writes nothing. */
    fill_sentinel(out, 4);
    assert_int_equal(vase_topk(x, 0, 0, out), 0);
    assert_all_sentinel(out, 4);
}

/* The reference order for the random tests: value descending, then index ascending. */
static const float *cmp_keys;

static int cmp_desc_then_index(const void *a, const void *b) {
    uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
    float x = cmp_keys[i], y = cmp_keys[j];
    if (x != y)
        return x > y ? -1 : 1;
    return (i > j) - (i < j);
}

static void ref_topk(const float *x, uint32_t len, uint32_t *order) {
    for (uint32_t i = 0; i < len; i++)
        order[i] = i;
    cmp_keys = x;
    qsort(order, len, sizeof(*order), cmp_desc_then_index);
}

/* Random inputs with many ties and both signs, sizes through the radix sort's digit widths,
 * against the reference order. */
static void test_topk_random(void **state) {
    (void)state;
    static const uint32_t lens[] = {1, 2, 17, 100, 2049, 5000};
    rng_state = 99;
    for (size_t t = 0; t < sizeof(lens) / sizeof(lens[0]); t++) {
        uint32_t len = lens[t];
        float *x = malloc(len * sizeof(float));
        uint32_t *want = malloc(len * sizeof(uint32_t)), *got = malloc(len * sizeof(uint32_t));
        assert_non_null(x);
        assert_non_null(want);
        assert_non_null(got);
        for (int mode = 0; mode < 3; mode++) {
            for (uint32_t i = 0; i < len; i++) {
                uint32_t r = rand_u32();
                if (mode == 0) /* few distinct values: lots of ties */
                    x[i] = (float)((int)(r % 7) - 3);
                else if (mode == 1) /* any finite float, subnormals included */
                    do {
                        memcpy(&x[i], &r, sizeof(r));
                        r = rand_u32();
                    } while (!isfinite(x[i]));
                else /* values differing only in their low mantissa bits */
                    x[i] = 1.0f + (float)(r % 4096) * 0x1p-23f;
            }
            ref_topk(x, len, want);
            uint32_t n = len / 2 + 1;
            assert_int_equal(vase_topk(x, len, n, got), 0);
            assert_list(got, want, n);
        }
        free(got);
        free(want);
        free(x);
    }
}

/* ---- sampling ---- */

static void test_sample_hand(void **state) {
    (void)state;
    uint32_t out[6];
    /* w = 1 2 0 4, all draws 1: keys w / E = 1 2 0 4; descending 3, 1, 0, then the zero 2. */
    const float w[4] = {1, 2, 0, 4}, ones[6] = {1, 1, 1, 1, 1, 1};
    fill_sentinel(out, 6);
    assert_int_equal(vase_sample(w, ones, NULL, 4, 3, out), 0);
    assert_list(out, (const uint32_t[]){3, 1, 0}, 3);
    assert_all_sentinel(out + 3, 3);
    assert_int_equal(vase_sample(w, ones, NULL, 4, 4, out), 0);
    assert_list(out, (const uint32_t[]){3, 1, 0, 2}, 4);

    /* Equal weights, draws 0.5 2 0.25 1: keys 2 0.5 4 1 -> 2, 0, 3, 1. */
    const float eq[4] = {1, 1, 1, 1}, e[4] = {0.5f, 2.0f, 0.25f, 1.0f};
    assert_int_equal(vase_sample(eq, e, NULL, 4, 4, out), 0);
    assert_list(out, (const uint32_t[]){2, 0, 3, 1}, 4);

    /* Keys that tie (2/2 = 1/1 = 4/4 = 1): ascending index. */
    const float wt[3] = {2, 1, 4}, et[3] = {2, 1, 4};
    assert_int_equal(vase_sample(wt, et, NULL, 3, 3, out), 0);
    assert_list(out, (const uint32_t[]){0, 1, 2}, 3);

    /* A zero draw with a positive weight arrives first (key +Inf); a zero draw with a zero
     * weight still has key 0 (not 0/0), so it comes last. */
    const float wz[4] = {1, 1, 0, 1}, ez[4] = {1, 0, 0, 0.5f};
    assert_int_equal(vase_sample(wz, ez, NULL, 4, 4, out), 0);
    assert_list(out, (const uint32_t[]){1, 3, 0, 2}, 4);
}

/* Fewer positive weights than n: the zeros fill, in ascending index, after the positives. */
static void test_sample_zero_weights(void **state) {
    (void)state;
    uint32_t out[6];
    const float w[5] = {0, 3, 0, 1, 0}, e[5] = {0.1f, 1, 0.2f, 1, 0.3f};
    assert_int_equal(vase_sample(w, e, NULL, 5, 4, out), 0);
    assert_list(out, (const uint32_t[]){1, 3, 0, 2}, 4);

    /* All weights zero: ascending index whatever the draws. */
    const float zero[6] = {0, 0, 0, 0, 0, 0}, d[6] = {3, 0.1f, 2, 0.5f, 9, 1};
    assert_int_equal(vase_sample(zero, d, NULL, 6, 6, out), 0);
    assert_list(out, (const uint32_t[]){0, 1, 2, 3, 4, 5}, 6);
    assert_int_equal(vase_sample(zero, d, NULL, 6, 2, out), 0);
    assert_list(out, (const uint32_t[]){0, 1}, 2);

    /* All zero with exclusions: the first non-excluded indices. */
    const uint8_t ex[6] = {1, 0, 1, 1, 0, 0};
    assert_int_equal(vase_sample(zero, d, ex, 6, 3, out), 0);
    assert_list(out, (const uint32_t[]){1, 4, 5}, 3);
}

static void test_sample_exclude(void **state) {
    (void)state;
    uint32_t out[5];
    /* w = 5 1 0 2 0 with 0 and 4 excluded, draws 1: eligible 1 (key 1), 2 (0), 3 (2): 3, 1, 2.
     * The largest weight, index 0, is never drawn. */
    const float w[5] = {5, 1, 0, 2, 0}, e[5] = {1, 1, 1, 1, 1};
    const uint8_t ex[5] = {1, 0, 0, 0, 1};
    assert_int_equal(vase_sample(w, e, ex, 5, 3, out), 0);
    assert_list(out, (const uint32_t[]){3, 1, 2}, 3);

    /* Only 3 eligible: asking for 4 is -EINVAL. */
    assert_int_equal(vase_sample(w, e, ex, 5, 4, out), -EINVAL);
}

/* Randomised: positive and zero weights, exclusions, draws from the generator. The result must
 * be distinct, never excluded, the positive weights first by key w/E descending (ties in
 * ascending index), then the zero weights in ascending index. */
static void test_sample_random_properties(void **state) {
    (void)state;
    enum { LEN = 50 };
    float w[LEN], e[LEN], key[LEN];
    uint8_t ex[LEN];
    uint32_t out[LEN], order[LEN];
    rng_state = 4242;
    for (uint32_t round = 0; round < 200; round++) {
        const struct vase_rng rng = {.seed = 17, .round = round};
        vase_rng_exp(&rng, 0, e, LEN);
        uint32_t eligible = 0;
        for (uint32_t i = 0; i < LEN; i++) {
            uint32_t r = rand_u32();
            w[i] = r % 3 == 0 ? 0.0f : (float)(r % 1000) / 100.0f;
            ex[i] = rand_u32() % 4 == 0;
            eligible += !ex[i];
        }
        /* The reference: keys as ALGORITHM.md defines them, excluded indices removed. */
        uint32_t m = 0;
        for (uint32_t i = 0; i < LEN; i++)
            key[i] = w[i] == 0.0f ? 0.0f : w[i] / e[i];
        ref_topk(key, LEN, order);
        for (uint32_t i = 0; i < LEN; i++)
            if (!ex[order[i]])
                order[m++] = order[i];
        assert_int_equal(m, eligible);

        assert_int_equal(vase_sample(w, e, ex, LEN, eligible, out), 0);
        assert_list(out, order, eligible);
        bool seen_zero = false;
        for (uint32_t i = 0; i < eligible; i++) {
            assert_false(ex[out[i]]);
            if (w[out[i]] == 0.0f) {
                if (seen_zero)
                    assert_true(out[i] > out[i - 1]);
                seen_zero = true;
            } else {
                assert_false(seen_zero);
            }
        }
        assert_int_equal(vase_sample(w, e, ex, LEN, eligible + 1, out), -EINVAL);
    }
}

static void test_sample_invalid(void **state) {
    (void)state;
    uint32_t out[3];
    const float e[3] = {1, 1, 1};
    static const float bad_w[][3] = {
        {1, -1, 1},       /* negative weight */
        {1, NAN, 1},      /* NaN weight */
        {1, INFINITY, 1}, /* infinite weight */
        {1, -0.5f, 0},
    };
    for (size_t i = 0; i < sizeof(bad_w) / sizeof(bad_w[0]); i++)
        assert_int_equal(vase_sample(bad_w[i], e, NULL, 3, 1, out), -EINVAL);
    const float w[3] = {1, 1, 1};
    static const float bad_e[][3] = {{1, -1, 1}, {NAN, 1, 1}, {1, 1, -INFINITY}};
    for (size_t i = 0; i < sizeof(bad_e) / sizeof(bad_e[0]); i++)
        assert_int_equal(vase_sample(w, bad_e[i], NULL, 3, 1, out), -EINVAL);
    assert_int_equal(vase_sample(w, e, NULL, 3, 4, out), -EINVAL);
    assert_int_equal(vase_sample(NULL, e, NULL, 3, 1, out), -EINVAL);
    assert_int_equal(vase_sample(w, NULL, NULL, 3, 1, out), -EINVAL);
    assert_int_equal(vase_sample(w, e, NULL, 3, 1, NULL), -EINVAL);
    /* -0 is a valid, zero weight. */
    const float negzero[3] = {-0.0f, 2, 1};
    assert_int_equal(vase_sample(negzero, e, NULL, 3, 3, out), 0);
    assert_list(out, (const uint32_t[]){1, 2, 0}, 3);
}

/*
 * The race samples in proportion to the weights. With w = 1:2:3:4 (sum 10) and 40000 rounds of
 * generated Exp(1) draws, the first pick is i with probability w_i / 10: chi-square with 3
 * degrees of freedom, critical value 16.27 at p = 0.001. The ordered pair (first, second) is
 * (i, j) with probability w_i / 10 * w_j / (10 - w_i), the law of drawing without replacement:
 * 12 cells, 11 degrees of freedom, critical value 31.26 at p = 0.001.
 */
static void test_sample_frequencies(void **state) {
    (void)state;
    enum { ROUNDS = 40000 };
    const float w[4] = {1, 2, 3, 4};
    unsigned first[4] = {0}, pair[4][4] = {{0}};
    float e[4];
    uint32_t out[2];
    for (uint32_t r = 0; r < ROUNDS; r++) {
        const struct vase_rng rng = {.seed = 31337, .sequence = 5, .layer = 1, .round = r};
        vase_rng_exp(&rng, 2, e, 4);
        assert_int_equal(vase_sample(w, e, NULL, 4, 2, out), 0);
        assert_int_not_equal(out[0], out[1]);
        first[out[0]]++;
        pair[out[0]][out[1]]++;
    }
    double chi = 0.0;
    for (int i = 0; i < 4; i++) {
        double expect = ROUNDS * w[i] / 10.0;
        chi += (first[i] - expect) * (first[i] - expect) / expect;
    }
    assert_true(chi < 16.27);

    chi = 0.0;
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            if (i == j) {
                assert_int_equal(pair[i][j], 0);
                continue;
            }
            double expect = ROUNDS * (w[i] / 10.0) * (w[j] / (10.0 - w[i]));
            chi += (pair[i][j] - expect) * (pair[i][j] - expect) / expect;
        }
    assert_true(chi < 31.26);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_topk_hand),
        cmocka_unit_test(test_topk_ties),
        cmocka_unit_test(test_topk_signs_and_infinities),
        cmocka_unit_test(test_topk_invalid),
        cmocka_unit_test(test_topk_random),
        cmocka_unit_test(test_sample_hand),
        cmocka_unit_test(test_sample_zero_weights),
        cmocka_unit_test(test_sample_exclude),
        cmocka_unit_test(test_sample_random_properties),
        cmocka_unit_test(test_sample_invalid),
        cmocka_unit_test(test_sample_frequencies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
