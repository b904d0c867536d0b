/* SPDX-License-Identifier: MIT */

/*
 * Tests of kernels/attend.c (vase_attend.h): the paged attention against a direct double
 * precision computation over the same slots, in float32, float16 and bfloat16 arenas laid out as
 * vased's (a layer's K and V strided by the page, blocks in shuffled order); a query that sees
 * nothing gets zeros; slots, blocks and table entries past what a query sees are never read (they
 * hold NaN); and every refusal leaves out untouched.
 */

#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "internal.h"
#include "vase_kernels.h"

enum { BLOCKS = 9, BT = 4, KV = 2, D = 48, LAYERS = 2, LAYER = 1, B = 3, N = 2, QH = 4 };

/* Pages [BLOCKS][LAYERS][K, V][BT][KV][D] of float32, or of 16-bit patterns. */
struct arena {
    float f[BLOCKS][LAYERS][2][BT][KV][D];
    uint16_t h[BLOCKS][LAYERS][2][BT][KV][D];
};

static uint32_t rng = 12345;
static float uniform(void) { /* in [-1, 1) */
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / (float)(1u << 23) - 1.0f;
}

static uint16_t to_bf16(float x) { /* exact for the values used: their low bits are zero */
    uint32_t u;
    memcpy(&u, &x, sizeof(u));
    return (uint16_t)(u >> 16);
}

static float of_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof(x));
    return x;
}

static float of_f16(uint16_t h) {
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    float x = e ? ldexpf((float)(m | 0x400), e - 25) : ldexpf((float)m, -24);
    return h & 0x8000 ? -x : x;
}

static uint16_t to_f16(float x) { /* for |x| < 2 in steps of 2^-8: exact */
    uint16_t sign = x < 0 ? 0x8000 : 0;
    float a = fabsf(x);
    if (a == 0)
        return sign;
    int e;
    frexpf(a, &e); /* a = f 2^e, f in [0.5, 1) */
    uint32_t m = (uint32_t)ldexpf(a, 11 - e);
    return (uint16_t)(sign | ((uint32_t)(e + 14) << 10) | (m & 0x3ff));
}

/* Values on a 2^-8 grid in [-1, 1): exact in all three types. */
static void fill(struct arena *a, enum vase_attend_dtype t, float poison) {
    float *f = &a->f[0][0][0][0][0][0];
    uint16_t *h = &a->h[0][0][0][0][0][0];
    for (size_t i = 0; i < sizeof(a->f) / sizeof(float); i++) {
        float x = isnan(poison) ? poison : roundf(uniform() * 256.0f) / 256.0f;
        f[i] = x;
        h[i] = t == VASE_ATTEND_BF16 ? to_bf16(x) : to_f16(x);
        if (isnan(x))
            h[i] = t == VASE_ATTEND_BF16 ? 0x7fc0 : 0x7e00;
    }
}

static struct vase_attend_cache cache_of(struct arena *a, enum vase_attend_dtype t) {
    struct vase_attend_cache c = {
        .dtype = t, .blocks = BLOCKS, .block_tokens = BT, .kv_heads = KV, .head_dim = D};
    int64_t page = LAYERS * 2 * BT * KV * D;
    for (int i = 0; i < 2; i++) {
        int64_t *s = i ? c.v_stride : c.k_stride;
        s[0] = page, s[1] = KV * D, s[2] = D;
    }
    if (t == VASE_ATTEND_F32)
        c.k = a->f[0][LAYER][0], c.v = a->f[0][LAYER][1];
    else
        c.k = a->h[0][LAYER][0], c.v = a->h[0][LAYER][1];
    return c;
}

static double value(const struct arena *a, enum vase_attend_dtype t, int blk, int kv, int tok,
                    int head, int d) {
    if (t == VASE_ATTEND_F32)
        return a->f[blk][LAYER][kv][tok][head][d];
    uint16_t h = a->h[blk][LAYER][kv][tok][head][d];
    return t == VASE_ATTEND_BF16 ? of_bf16(h) : of_f16(h);
}

/* Double precision attention of one query head over its visible slots. */
static void expect(const struct arena *a, enum vase_attend_dtype t, const int32_t *table,
                   const float *q, int head, int vis, float scale, double *out) {
    double s[BT * 3], top = -INFINITY, sum = 0;
    for (int x = 0; x < vis; x++) {
        double dot = 0;
        for (int d = 0; d < D; d++)
            dot += (double)q[d] * value(a, t, table[x / BT], 0, x % BT, head, d);
        s[x] = dot * scale;
        top = s[x] > top ? s[x] : top;
    }
    for (int x = 0; x < vis; x++)
        sum += s[x] = exp(s[x] - top);
    for (int d = 0; d < D; d++) {
        out[d] = 0;
        for (int x = 0; x < vis; x++)
            out[d] += s[x] / sum * value(a, t, table[x / BT], 1, x % BT, head, d);
    }
}

static const int32_t TABLE[B][3] = {{7, 2, 5}, {0, 4, -1}, {8, -1, -1}};
static const int32_t VISIBLE[B][N] = {{11, 12}, {7, 8}, {0, 3}};

static void run_dtype(enum vase_attend_dtype t) {
    static struct arena a;
    fill(&a, t, 0);
    struct vase_attend_cache c = cache_of(&a, t);
    float q[B][N][QH][D], out[B][N][QH][D];
    for (size_t i = 0; i < sizeof(q) / sizeof(float); i++)
        (&q[0][0][0][0])[i] = uniform();
    memset(out, 0x7f, sizeof(out));
    struct vase_attend_batch bt = {.q = &q[0][0][0][0],
                                   .table = &TABLE[0][0],
                                   .visible = &VISIBLE[0][0],
                                   .b = B,
                                   .n = N,
                                   .q_heads = QH,
                                   .width = 3,
                                   .scale = 0.3f};
    char why[128];
    assert_int_equal(vase_paged_attention(&c, &bt, &out[0][0][0][0], why, sizeof(why)), 0);
    double worst = 0;
    for (int i = 0; i < B; i++)
        for (int j = 0; j < N; j++)
            for (int h = 0; h < QH; h++) {
                double want[D];
                if (!VISIBLE[i][j]) {
                    for (int d = 0; d < D; d++)
                        assert_true(out[i][j][h][d] == 0.0f);
                    continue;
                }
                expect(&a, t, TABLE[i], q[i][j][h], h / (QH / KV), VISIBLE[i][j], 0.3f, want);
                for (int d = 0; d < D; d++)
                    worst = fmax(worst, fabs(out[i][j][h][d] - want[d]));
            }
    assert_true(worst < 2e-6);

    /* The same over an arena of NaN but for the slots the queries see. */
    static struct arena p;
    fill(&p, t, NAN);
    for (int i = 0; i < B; i++)
        for (int x = 0; x < VISIBLE[i][N - 1]; x++)
            for (int kv = 0; kv < 2; kv++) {
                int blk = TABLE[i][x / BT], tok = x % BT;
                memcpy(p.f[blk][LAYER][kv][tok], a.f[blk][LAYER][kv][tok], sizeof(p.f[0][0][0][0]));
                memcpy(p.h[blk][LAYER][kv][tok], a.h[blk][LAYER][kv][tok], sizeof(p.h[0][0][0][0]));
            }
    struct vase_attend_cache pc = cache_of(&p, t);
    float again[B][N][QH][D];
    assert_int_equal(vase_paged_attention(&pc, &bt, &again[0][0][0][0], why, sizeof(why)), 0);
    assert_memory_equal(again, out, sizeof(out));
}

static void test_attend_f32(void **state) {
    (void)state;
    run_dtype(VASE_ATTEND_F32); /* the AVX-512 path where the CPU has it */
    vase__attend_portable = 1;
    run_dtype(VASE_ATTEND_F32);
    vase__attend_portable = 0;
}

static void test_attend_f16(void **state) {
    (void)state;
    run_dtype(VASE_ATTEND_F16);
}

static void test_attend_bf16(void **state) {
    (void)state;
    run_dtype(VASE_ATTEND_BF16);
}

static void test_attend_refusals(void **state) {
    (void)state;
    static struct arena a;
    fill(&a, VASE_ATTEND_F32, 0);
    struct vase_attend_cache c = cache_of(&a, VASE_ATTEND_F32);
    float q[B][N][QH][D] = {{{{0}}}}, out[B][N][QH][D];
    int32_t table[B][3], visible[B][N];
    struct vase_attend_batch bt = {.q = &q[0][0][0][0],
                                   .table = &table[0][0],
                                   .visible = &visible[0][0],
                                   .b = B,
                                   .n = N,
                                   .q_heads = QH,
                                   .width = 3,
                                   .scale = 1};
    struct {
        int i, j, table, visible;
        const char *why;
    } bad[] = {
        {0, 1, 9, 12, "table[0][1] = 9: not one of the 9 blocks"},
        {0, 1, -1, 12, "table[0][1] = -1: not one of the 9 blocks"},
        {1, 1, 4, 13, "visible[1][1] = 13: want 0 to 12"},
        {1, 1, 4, -1, "visible[1][1] = -1: want 0 to 12"},
    };
    for (size_t x = 0; x < sizeof(bad) / sizeof(bad[0]); x++) {
        memcpy(table, TABLE, sizeof(table));
        memcpy(visible, VISIBLE, sizeof(visible));
        table[bad[x].i][bad[x].j] = bad[x].table;
        visible[bad[x].i][bad[x].j] = bad[x].visible;
        memset(out, 0x5a, sizeof(out));
        char why[160] = "", why_check[160] = "";
        assert_int_equal(vase_paged_attention(&c, &bt, &out[0][0][0][0], why, sizeof(why)),
                         -EINVAL);
        assert_non_null(strstr(why, bad[x].why));
        /* The check alone refuses the same, with the same words. */
        assert_int_equal(vase_paged_attention_check(&c, &bt, why_check, sizeof(why_check)),
                         -EINVAL);
        assert_string_equal(why_check, why);
        for (size_t e = 0; e < sizeof(out); e++)
            assert_int_equal(((unsigned char *)out)[e], 0x5a);
    }
    /* A row whose queries see nothing needs no table entry; 5 query heads over 2 KV heads are
     * refused. */
    memcpy(table, TABLE, sizeof(table));
    memcpy(visible, VISIBLE, sizeof(visible));
    table[2][0] = -7, visible[2][1] = 0;
    char why[160];
    assert_int_equal(vase_paged_attention_check(&c, &bt, why, sizeof(why)), 0);
    assert_int_equal(vase_paged_attention(&c, &bt, &out[0][0][0][0], why, sizeof(why)), 0);
    assert_int_equal(vase_paged_attention(&c, &bt, NULL, why, sizeof(why)), -EINVAL);
    bt.q_heads = 5;
    assert_int_equal(vase_paged_attention_check(&c, &bt, why, sizeof(why)), -EINVAL);
    assert_int_equal(vase_paged_attention(&c, &bt, &out[0][0][0][0], why, sizeof(why)), -EINVAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attend_f32),
        cmocka_unit_test(test_attend_f16),
        cmocka_unit_test(test_attend_bf16),
        cmocka_unit_test(test_attend_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
