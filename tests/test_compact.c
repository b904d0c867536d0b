/* SPDX-License-Identifier: MIT */

/*
 * Tests of kernels/compact.c (ALGORITHM.md, "Compaction"): slot i < K receives candidate
 * keep[i], the tokens appended after the plan (old slots n .. len-1) follow in order, and the
 * new length K + len - n is returned. Checked slot by slot on contiguous views, on the paged
 * arena layout with a shuffled block table (where nothing outside the compacted layer's K or V
 * may change), on a ring, and for the per-slot float arrays; invalid plans move nothing.
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

/* Row j of head h holds (1000 h + 10 j + d) for d < dim: every element names its origin. */
static float tag(uint32_t h, uint32_t j, uint32_t d) {
    return (float)(1000 * h + 10 * j + d);
}

static void fill_tagged(float *x, uint32_t heads, uint32_t rows, uint32_t dim) {
    for (uint32_t h = 0; h < heads; h++)
        for (uint32_t j = 0; j < rows; j++)
            for (uint32_t d = 0; d < dim; d++)
                x[((size_t)h * rows + j) * dim + d] = tag(h, j, d);
}

/* Slot s of head h must hold old row src[s] of that head. */
static void assert_rows(const float *x, uint32_t h, uint32_t rows, uint32_t dim,
                        const uint32_t *src, uint32_t count) {
    for (uint32_t s = 0; s < count; s++)
        for (uint32_t d = 0; d < dim; d++) {
            float got = x[((size_t)h * rows + s) * dim + d];
            if (got != tag(h, src[s], d))
                fail_msg("head %u slot %u dim %u: %g, want old row %u (%g)", h, s, d, (double)got,
                         src[s], (double)tag(h, src[s], d));
        }
}

/*
 * Nothing appended: n = len = 6, K = 3, keep = 4 0 2. Slots 0 1 2 receive old rows 4 0 2;
 * the new length is K + len - n = 3.
 */
static void test_compact_no_append(void **state) {
    (void)state;
    enum { H = 1, ROWS = 6, D = 2 };
    float x[H * ROWS * D];
    fill_tagged(x, H, ROWS, D);
    struct vase_view v = vase_view_contiguous(x, VASE_DTYPE_F32, H, ROWS, D);
    const uint32_t keep[3] = {4, 0, 2};
    assert_int_equal(vase_compact(&v, keep, 3, 6, 6), 3);
    assert_rows(x, 0, ROWS, D, (const uint32_t[]){4, 0, 2}, 3);
}

/*
 * Three tokens appended while the plan was computed: n = 6, len = 9, K = 3, keep = 5 1 3.
 * Slots 0 1 2 <- 5 1 3 (the plan's order), slots 3 4 5 <- old 6 7 8 (in order); new length
 * 3 + 9 - 6 = 6. The keep list names slots 3 and 5, which the tail overwrites: they must be
 * read before.
 */
static void test_compact_with_append(void **state) {
    (void)state;
    enum { H = 2, ROWS = 9, D = 3 };
    float x[H * ROWS * D];
    fill_tagged(x, H, ROWS, D);
    struct vase_view v = vase_view_contiguous(x, VASE_DTYPE_F32, H, ROWS, D);
    /* Head 1 keeps 2 0 4: slots 0 1 2 <- 2 0 4. */
    const uint32_t keep[2 * 3] = {5, 1, 3, 2, 0, 4};
    assert_int_equal(vase_compact(&v, keep, 3, 6, 9), 6);
    assert_rows(x, 0, ROWS, D, (const uint32_t[]){5, 1, 3, 6, 7, 8}, 6);
    assert_rows(x, 1, ROWS, D, (const uint32_t[]){2, 0, 4, 6, 7, 8}, 6);
}

/*
 * Overlaps: K = 3, n = 5, len = 8, keep = 4 3 0. The tail (old 5 6 7) goes to slots 3 4 5,
 * over candidates 3 and 4 that the plan keeps. Result: 4 3 0 5 6 7, length 6.
 * Identity prefix: keep = 0 1 2 leaves slots 0..2 as they are; the tail follows.
 * K = n: a permutation of all candidates, keep = 2 0 1, n = 3, len = 5: 2 0 1 3 4, length 5.
 */
static void test_compact_overlaps(void **state) {
    (void)state;
    enum { ROWS = 8, D = 2 };
    float x[ROWS * D];
    struct vase_view v = vase_view_contiguous(x, VASE_DTYPE_F32, 1, ROWS, D);

    fill_tagged(x, 1, ROWS, D);
    assert_int_equal(vase_compact(&v, (const uint32_t[]){4, 3, 0}, 3, 5, 8), 6);
    assert_rows(x, 0, ROWS, D, (const uint32_t[]){4, 3, 0, 5, 6, 7}, 6);

    fill_tagged(x, 1, ROWS, D);
    assert_int_equal(vase_compact(&v, (const uint32_t[]){0, 1, 2}, 3, 5, 8), 6);
    assert_rows(x, 0, ROWS, D, (const uint32_t[]){0, 1, 2, 5, 6, 7}, 6);

    fill_tagged(x, 1, ROWS, D);
    assert_int_equal(vase_compact(&v, (const uint32_t[]){2, 0, 1}, 3, 3, 5), 5);
    assert_rows(x, 0, ROWS, D, (const uint32_t[]){2, 0, 1, 3, 4}, 5);

    /* K = 0: only the tail survives. n = 4, len = 6: old 4 5 to slots 0 1, length 2. */
    fill_tagged(x, 1, ROWS, D);
    const uint32_t none[1] = {0};
    assert_int_equal(vase_compact(&v, none, 0, 4, 6), 2);
    assert_rows(x, 0, ROWS, D, (const uint32_t[]){4, 5}, 2);

    /* Reversed: keep = 7 6 5 4 3 2 1 of n = 8 (K = 7). */
    fill_tagged(x, 1, ROWS, D);
    assert_int_equal(vase_compact(&v, (const uint32_t[]){7, 6, 5, 4, 3, 2, 1}, 7, 8, 8), 7);
    assert_rows(x, 0, ROWS, D, (const uint32_t[]){7, 6, 5, 4, 3, 2, 1}, 7);
}

/* Random plans against a copy made here: every kept row and the tail, for every head. */
static void test_compact_random(void **state) {
    (void)state;
    enum { H = 3, ROWS = 40, D = 5 };
    float *x = malloc(H * ROWS * D * sizeof(float));
    uint32_t *keep = malloc(H * ROWS * sizeof(uint32_t)), perm[ROWS], src[ROWS];
    assert_true(x && keep);
    uint32_t seed = 7;
    for (int trial = 0; trial < 50; trial++) {
        seed = seed * 1664525u + 1013904223u;
        uint32_t len = 10 + (seed >> 8) % 31; /* 10 .. 40 */
        uint32_t n = 1 + (seed >> 16) % len;  /* 1 .. len */
        uint32_t K = (seed >> 4) % (n + 1);   /* 0 .. n */
        for (uint32_t h = 0; h < H; h++) {
            for (uint32_t i = 0; i < n; i++)
                perm[i] = i;
            for (uint32_t i = n; i > 1; i--) { /* Fisher-Yates */
                seed = seed * 1664525u + 1013904223u;
                uint32_t j = (seed >> 8) % i, t = perm[i - 1];
                perm[i - 1] = perm[j];
                perm[j] = t;
            }
            memcpy(keep + h * K, perm, K * sizeof(uint32_t));
        }
        fill_tagged(x, H, ROWS, D);
        struct vase_view v = vase_view_contiguous(x, VASE_DTYPE_F32, H, ROWS, D);
        assert_int_equal(vase_compact(&v, keep, K, n, len), (int)(K + len - n));
        for (uint32_t h = 0; h < H; h++) {
            for (uint32_t i = 0; i < K; i++)
                src[i] = keep[h * K + i];
            for (uint32_t t = 0; t < len - n; t++)
                src[K + t] = n + t;
            assert_rows(x, h, ROWS, D, src, K + len - n);
        }
    }
    free(keep);
    free(x);
}

/*
 * The paged arena: pages of [layer][K,V][token][kv_head][dim] in float16, logical pages mapped
 * by a shuffled block table, layer 1 of 2 compacted (its K and its V, separately, as the engine
 * does). Every element of the arena is compared afterwards: the compacted slots of layer 1 hold
 * exactly the rows the plan names, and every other byte (layer 0, the slots past the new
 * length, the pages the sequence does not own) is unchanged.
 */
enum { A_LAYERS = 2, A_H = 2, A_D = 3, A_TPP = 4, A_PAGES = 6 };

static size_t arena_off(const uint32_t *table, uint32_t layer, uint32_t kv, uint32_t slot,
                        uint32_t h, uint32_t d) {
    size_t page_elems = (size_t)A_LAYERS * 2 * A_TPP * A_H * A_D;
    return table[slot / A_TPP] * page_elems +
           ((((size_t)layer * 2 + kv) * A_TPP + slot % A_TPP) * A_H + h) * A_D + d;
}

static void paged_case(uint32_t n, uint32_t len, uint32_t K, const uint32_t *keep) {
    static const uint32_t table[4] = {3, 0, 5, 2}; /* 16 slots; pages 1 and 4 are not ours */
    const size_t total = (size_t)A_PAGES * A_LAYERS * 2 * A_TPP * A_H * A_D;
    uint16_t *arena = malloc(total * sizeof(uint16_t)), *before = malloc(total * sizeof(uint16_t));
    assert_true(arena && before);
    /* Every element distinct: its index, exact in float16 below 2048. */
    for (size_t i = 0; i < total; i++)
        arena[i] = vase_f32_to_f16((float)i);
    memcpy(before, arena, total * sizeof(uint16_t));

    const uint32_t layer = 1;
    for (uint32_t kv = 0; kv < 2; kv++) {
        struct vase_view v = {
            /* Page 0 plus the offset of this layer's K or V inside a page. */
            .base = arena + ((size_t)layer * 2 + kv) * A_TPP * A_H * A_D,
            .pages = table,
            .tokens_per_page = A_TPP,
            .heads = A_H,
            .dim = A_D,
            .dtype = VASE_DTYPE_F16,
            .page_stride = (int64_t)(A_LAYERS * 2 * A_TPP * A_H * A_D * sizeof(uint16_t)),
            .token_stride = (int64_t)(A_H * A_D * sizeof(uint16_t)),
            .head_stride = (int64_t)(A_D * sizeof(uint16_t)),
        };
        assert_int_equal(vase_compact(&v, keep, K, n, len), (int)(K + len - n));
    }

    /* The expected arena, built from the snapshot by the rule of ALGORITHM.md. */
    uint16_t *want = malloc(total * sizeof(uint16_t));
    assert_non_null(want);
    memcpy(want, before, total * sizeof(uint16_t));
    for (uint32_t kv = 0; kv < 2; kv++)
        for (uint32_t h = 0; h < A_H; h++)
            for (uint32_t s = 0; s < K + len - n; s++) {
                uint32_t from = s < K ? keep[h * K + s] : n + (s - K);
                for (uint32_t d = 0; d < A_D; d++)
                    want[arena_off(table, layer, kv, s, h, d)] =
                        before[arena_off(table, layer, kv, from, h, d)];
            }
    for (size_t i = 0; i < total; i++)
        if (arena[i] != want[i])
            fail_msg("arena element %zu: %g, want %g (n %u len %u K %u)", i,
                     (double)vase_f16_to_f32(arena[i]), (double)vase_f16_to_f32(want[i]), n, len,
                     K);
    free(want);
    free(before);
    free(arena);
}

static void test_compact_paged(void **state) {
    (void)state;
    /* n = 12 candidates, nothing appended (len 12), K = 8: slots 0..7 <- keep, new length 8.
     * Head 1 keeps a different list. Candidates cross all three pages. */
    const uint32_t keep_a[2 * 8] = {11, 0, 5, 3, 8, 1, 10, 6, /* head 1: */
                                    0,  1, 2, 3, 4, 9, 7,  11};
    paged_case(12, 12, 8, keep_a);
    /* The same plan with 4 tokens appended meanwhile (len 16, a fourth page): slots 8..11
     * receive old slots 12..15; new length 12. */
    paged_case(12, 16, 8, keep_a);
    /* n = 16, len = 16, K = 12 (the steady state: W = 4 evicted). */
    const uint32_t keep_b[2 * 12] = {15, 14, 0,  1,  2,  3,  7,  6,  5, 4, 13, 12,
                                     8,  9,  10, 11, 12, 13, 14, 15, 0, 2, 4,  6};
    paged_case(16, 16, 12, keep_b);
}

/* A ring view: row r is slot (first + r) % ring. Compaction works on rows. */
static void test_compact_ring(void **state) {
    (void)state;
    enum { RING = 8, D = 2, FIRST = 5 };
    float x[RING * D], before[RING * D];
    for (int i = 0; i < RING * D; i++)
        x[i] = (float)i;
    memcpy(before, x, sizeof(x));
    struct vase_view v = {
        .base = x,
        .ring = RING,
        .first = FIRST,
        .heads = 1,
        .dim = D,
        .dtype = VASE_DTYPE_F32,
        .token_stride = D * sizeof(float),
    };
    /* n = 5, len = 7, K = 3, keep = 4 2 0: rows 0 1 2 <- old rows 4 2 0, rows 3 4 <- old rows
     * 5 6; length 5. Row r lives in slot (5 + r) % 8. */
    assert_int_equal(vase_compact(&v, (const uint32_t[]){4, 2, 0}, 3, 5, 7), 5);
    static const uint32_t from_row[5] = {4, 2, 0, 5, 6};
    for (uint32_t r = 0; r < 5; r++) {
        uint32_t slot = (FIRST + r) % RING, src = (FIRST + from_row[r]) % RING;
        assert_true(x[slot * D] == before[src * D]);
        assert_true(x[slot * D + 1] == before[src * D + 1]);
    }
    /* Slot of row 7 (slot 4), never part of the sequence's rows 0..6, is unchanged. */
    assert_true(x[4 * D] == before[4 * D]);
    /* len beyond the ring's capacity: -EINVAL. */
    assert_int_equal(vase_compact(&v, (const uint32_t[]){0, 1, 2}, 3, 5, 9), -EINVAL);
}

/* Invalid plans or arguments: -EINVAL and not one byte moved. */
static void test_compact_invalid(void **state) {
    (void)state;
    enum { H = 2, ROWS = 8, D = 2 };
    float x[H * ROWS * D], before[H * ROWS * D];
    fill_tagged(x, H, ROWS, D);
    memcpy(before, x, sizeof(x));
    struct vase_view v = vase_view_contiguous(x, VASE_DTYPE_F32, H, ROWS, D);

    static const struct {
        uint32_t keep[2 * 3];
        uint32_t K, n, len;
    } bad[] = {
        {{0, 1, 1, 0, 1, 2}, 3, 5, 7}, /* duplicate in head 0 */
        {{0, 1, 2, 4, 3, 4}, 3, 5, 7}, /* duplicate in head 1 only: head 0 must not move */
        {{0, 1, 5, 0, 1, 2}, 3, 5, 7}, /* 5 is not a candidate (>= n) */
        {{0, 1, 2, 0, 1, 7}, 3, 5, 7}, {{0, 1, 2, 0, 1, 2}, 3, 2, 7}, /* K > n */
        {{0, 1, 2, 0, 1, 2}, 3, 6, 5},                                /* n > len */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(vase_compact(&v, bad[i].keep, bad[i].K, bad[i].n, bad[i].len), -EINVAL);
        assert_memory_equal(x, before, sizeof(x));
    }
    const uint32_t keep[2 * 3] = {0, 1, 2, 0, 1, 2};
    assert_int_equal(vase_compact(NULL, keep, 3, 5, 7), -EINVAL);
    assert_int_equal(vase_compact(&v, NULL, 3, 5, 7), -EINVAL);
    struct vase_view broken = v;
    broken.dim = 0;
    assert_int_equal(vase_compact(&broken, keep, 3, 5, 7), -EINVAL);
    broken = v;
    broken.base = NULL;
    assert_int_equal(vase_compact(&broken, keep, 3, 5, 7), -EINVAL);
    broken = v;
    broken.dtype = _VASE_DTYPE_MAX;
    assert_int_equal(vase_compact(&broken, keep, 3, 5, 7), -EINVAL);
    broken = v;
    broken.first = 3; /* an offset without a ring */
    assert_int_equal(vase_compact(&broken, keep, 3, 5, 7), -EINVAL);
    assert_memory_equal(x, before, sizeof(x));
}

static void test_plan_validate(void **state) {
    (void)state;
    /* Per head distinct and below n; different heads may keep the same slots. */
    assert_int_equal(vase_plan_validate((const uint32_t[]){2, 0, 1, 2, 0, 1}, 2, 3, 3), 0);
    assert_int_equal(vase_plan_validate((const uint32_t[]){4, 0, 1, 0, 1, 2}, 2, 3, 5), 0);
    assert_int_equal(vase_plan_validate((const uint32_t[]){0, 0, 1}, 1, 3, 5), -EINVAL);
    assert_int_equal(vase_plan_validate((const uint32_t[]){0, 1, 2, 3, 1, 3}, 2, 3, 5), -EINVAL);
    assert_int_equal(vase_plan_validate((const uint32_t[]){0, 1, 5}, 1, 3, 5), -EINVAL);
    assert_int_equal(vase_plan_validate((const uint32_t[]){0, 1, 0xffffffffu}, 1, 3, 5), -EINVAL);
    assert_int_equal(vase_plan_validate((const uint32_t[]){0, 1, 2}, 1, 3, 2), -EINVAL); /* K>n */
    assert_int_equal(vase_plan_validate(NULL, 1, 3, 5), -EINVAL);
    /* An empty plan is valid. */
    assert_int_equal(vase_plan_validate((const uint32_t[]){0}, 1, 0, 0), 0);
}

/*
 * The per-slot float arrays (h2o's accumulated attention): the same move on [heads][stride],
 * and the entries between the new and the old length are zeroed. heads 2, stride 10, n = 6,
 * len = 8, K = 3: head 0 keep 5 1 3 -> slots 0..2 = a5 a1 a3, slots 3 4 = a6 a7, slots 5..7 = 0;
 * head 1 keep 0 2 4.
 */
static void test_compact_f32(void **state) {
    (void)state;
    enum { H = 2, STRIDE = 10 };
    float a[H * STRIDE];
    for (int i = 0; i < H * STRIDE; i++)
        a[i] = (float)(i + 1);
    const uint32_t keep[2 * 3] = {5, 1, 3, 0, 2, 4};
    assert_int_equal(vase_compact_f32(a, H, STRIDE, keep, 3, 6, 8), 5);
    static const float want0[8] = {6, 2, 4, 7, 8, 0, 0, 0};
    static const float want1[8] = {11, 13, 15, 17, 18, 0, 0, 0};
    for (int i = 0; i < 8; i++) {
        assert_true(a[i] == want0[i]);
        assert_true(a[STRIDE + i] == want1[i]);
    }

    /* Nothing appended: n = len = 8, K = 6, keep = 7 6 5 4 3 2: slots 0..5 reversed tail of
     * the candidates, slots 6 7 zeroed; length 6. */
    for (int i = 0; i < H * STRIDE; i++)
        a[i] = (float)(i + 1);
    const uint32_t keep2[2 * 6] = {7, 6, 5, 4, 3, 2, 0, 1, 2, 3, 4, 5};
    assert_int_equal(vase_compact_f32(a, H, STRIDE, keep2, 6, 8, 8), 6);
    static const float w0[8] = {8, 7, 6, 5, 4, 3, 0, 0};
    static const float w1[8] = {11, 12, 13, 14, 15, 16, 0, 0};
    for (int i = 0; i < 8; i++) {
        assert_true(a[i] == w0[i]);
        assert_true(a[STRIDE + i] == w1[i]);
    }

    /* Invalid: nothing changes. */
    float before[H * STRIDE];
    memcpy(before, a, sizeof(a));
    assert_int_equal(vase_compact_f32(a, H, STRIDE, (const uint32_t[]){0, 1, 2, 2, 1, 2}, 3, 6, 8),
                     -EINVAL); /* head 1 repeats 2 */
    assert_int_equal(vase_compact_f32(a, H, STRIDE, (const uint32_t[]){0, 1, 6, 0, 1, 2}, 3, 6, 8),
                     -EINVAL);                                                 /* 6 >= n */
    assert_int_equal(vase_compact_f32(a, H, STRIDE, keep, 3, 6, 11), -EINVAL); /* len > stride */
    assert_int_equal(vase_compact_f32(a, H, STRIDE, keep, 3, 9, 8), -EINVAL);  /* n > len */
    assert_int_equal(vase_compact_f32(a, H, STRIDE, keep, 3, 2, 8), -EINVAL);  /* K > n */
    assert_int_equal(vase_compact_f32(NULL, H, STRIDE, keep, 3, 6, 8), -EINVAL);
    assert_int_equal(vase_compact_f32(a, H, STRIDE, NULL, 3, 6, 8), -EINVAL);
    assert_memory_equal(a, before, sizeof(a));
}

/*
 * A plan and its compaction together, as the engine runs them: a streaming plan on a paged K
 * cache, n = 12, K = 8 (budget 12, W = 4) with 4 tokens appended: slots 0, 1 (sinks), then old
 * 6..11, then old 12..15; length 12.
 */
static void test_plan_then_compact(void **state) {
    (void)state;
    enum { ROWS = 16, D = 2 };
    float k[ROWS * D];
    fill_tagged(k, 1, ROWS, D);
    struct vase_params p = vase_params_default(12);
    p.window = 4;
    p.n_sink = 2;
    struct vase_plan_input in = {
        .policy = VASE_POLICY_STREAMING,
        .params = p,
        .n = 12,
        .k = vase_view_contiguous(k, VASE_DTYPE_F32, 1, ROWS, D),
    };
    uint32_t keep[8];
    assert_int_equal(vase_plan(&in, 1, NULL, keep), 0);
    assert_int_equal(vase_compact(&in.k, keep, 8, 12, 16), 12);
    assert_rows(k, 0, ROWS, D, (const uint32_t[]){0, 1, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, 12);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compact_no_append), cmocka_unit_test(test_compact_with_append),
        cmocka_unit_test(test_compact_overlaps),  cmocka_unit_test(test_compact_random),
        cmocka_unit_test(test_compact_paged),     cmocka_unit_test(test_compact_ring),
        cmocka_unit_test(test_compact_invalid),   cmocka_unit_test(test_plan_validate),
        cmocka_unit_test(test_compact_f32),       cmocka_unit_test(test_plan_then_compact),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
