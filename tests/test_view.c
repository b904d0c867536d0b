/* SPDX-License-Identifier: MIT */

/*
 * Tests of kernels/view.c: dtype names and sizes, the scalar float16/bfloat16 conversions
 * (exact for representable values, round to nearest even, subnormals, Inf and NaN), and the
 * strided views over the paged arena layout and a ring. Expected values come from the IEEE
 * formats themselves (decoded with ldexp here), never from the code under test.
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

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* A small deterministic generator for test data (xorshift64*). */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rand_u32(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32);
}

/* The value of a binary16 pattern, decoded from the format's definition: 1 sign bit, 5
 * exponent bits with bias 15, 10 mantissa bits; exponent 0 is subnormal (mantissa * 2^-24). */
static double f16_value(uint16_t h) {
    int e = (h >> 10) & 0x1f;
    int m = h & 0x3ff;
    double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return (h & 0x8000) ? -v : v;
}

/* bfloat16: 1 sign, 8 exponent bits (bias 127), 7 mantissa bits; subnormal step 2^-133. */
static double bf16_value(uint16_t h) {
    int e = (h >> 7) & 0xff;
    int m = h & 0x7f;
    double v = e == 0 ? ldexp(m, -133) : ldexp(128 + m, e - 134);
    return (h & 0x8000) ? -v : v;
}

/*
 * Reference rounding of a finite non-negative x to a 16-bit format: positive patterns are
 * ordered like their values, so find the largest pattern lo <= x by bisection, then pick lo or
 * lo + 1 by distance, ties to the even pattern. max_finite is the largest finite pattern; the
 * pattern after it (Inf) stands for the value one ulp further, as rounding defines it.
 */
static uint16_t ref_round(double x, uint16_t max_finite, double (*value)(uint16_t), double beyond) {
    uint32_t lo = 0, hi = max_finite;
    if (x >= value(max_finite)) {
        lo = max_finite;
    } else {
        while (lo < hi) {
            uint32_t mid = (lo + hi + 1) / 2;
            if (value((uint16_t)mid) <= x)
                lo = mid;
            else
                hi = mid - 1;
        }
    }
    double vlo = value((uint16_t)lo);
    double vhi = lo == max_finite ? beyond : value((uint16_t)(lo + 1));
    double dlo = x - vlo, dhi = vhi - x;
    if (dlo < dhi || (dlo == dhi && (lo & 1) == 0))
        return (uint16_t)lo;
    return (uint16_t)(lo + 1); /* max_finite + 1 is the Inf pattern */
}

static void test_dtype_sizes_and_names(void **state) {
    (void)state;
    assert_int_equal(vase_dtype_size(VASE_DTYPE_F32), 4);
    assert_int_equal(vase_dtype_size(VASE_DTYPE_F16), 2);
    assert_int_equal(vase_dtype_size(VASE_DTYPE_BF16), 2);
    assert_int_equal(vase_dtype_size(_VASE_DTYPE_MAX), 0);
    assert_int_equal(vase_dtype_size((enum vase_dtype) - 1), 0);

    assert_string_equal(vase_dtype_to_string(VASE_DTYPE_F32), "f32");
    assert_string_equal(vase_dtype_to_string(VASE_DTYPE_F16), "f16");
    assert_string_equal(vase_dtype_to_string(VASE_DTYPE_BF16), "bf16");
    assert_null(vase_dtype_to_string(_VASE_DTYPE_MAX));

    static const struct {
        const char *name;
        enum vase_dtype dtype;
    } good[] = {
        {"f32", VASE_DTYPE_F32},     {"float32", VASE_DTYPE_F32}, {"f16", VASE_DTYPE_F16},
        {"float16", VASE_DTYPE_F16}, {"bf16", VASE_DTYPE_BF16},   {"bfloat16", VASE_DTYPE_BF16},
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        enum vase_dtype d = (enum vase_dtype)77;
        assert_int_equal(vase_dtype_from_string(good[i].name, &d), 0);
        assert_int_equal(d, good[i].dtype);
    }
    /* Round trip of every valid dtype through its short name. */
    for (int i = 0; i < _VASE_DTYPE_MAX; i++) {
        enum vase_dtype d = (enum vase_dtype)77;
        assert_int_equal(vase_dtype_from_string(vase_dtype_to_string((enum vase_dtype)i), &d), 0);
        assert_int_equal(d, i);
    }

    static const char *const bad[] = {"", "f64", "F32", "float", "bf", "f16 ", "bfloat"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        enum vase_dtype d = (enum vase_dtype)77;
        assert_int_equal(vase_dtype_from_string(bad[i], &d), -EINVAL);
        assert_int_equal(d, 77); /* ret_* untouched on failure */
    }
    enum vase_dtype d = (enum vase_dtype)77;
    assert_int_equal(vase_dtype_from_string(NULL, &d), -EINVAL);
    assert_int_equal(vase_dtype_from_string("f32", NULL), -EINVAL);
    assert_int_equal(d, 77);
}

/* Hand-picked float16 encodings: each pattern is checked both ways. */
static void test_f16_known_values(void **state) {
    (void)state;
    static const struct {
        float f;
        uint16_t h;
    } cases[] = {
        {0.0f, 0x0000},
        {1.0f, 0x3c00},            /* exponent 15, mantissa 0 */
        {-2.0f, 0xc000},           /* sign, exponent 16 */
        {0.5f, 0x3800},            /* exponent 14 */
        {1.0f + 0x1p-10f, 0x3c01}, /* one ulp above 1 */
        {65504.0f, 0x7bff},        /* largest finite: (2 - 2^-10) * 2^15 */
        {0x1p-14f, 0x0400},        /* smallest normal */
        {0x1p-24f, 0x0001},        /* smallest subnormal */
        {0x1p-15f, 0x0200},        /* a subnormal: 512 * 2^-24 */
        {3 * 0x1p-24f, 0x0003},
        {1023 * 0x1p-24f, 0x03ff}, /* largest subnormal */
        {-1023 * 0x1p-24f, 0x83ff},
        {0.333251953125f, 0x3555}, /* 1365 * 2^-12: 1.0101010101b * 2^-2 */
        {INFINITY, 0x7c00},
        {-INFINITY, 0xfc00},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        assert_int_equal(vase_f32_to_f16(cases[i].f), cases[i].h);
        float back = vase_f16_to_f32(cases[i].h);
        assert_int_equal(f32_bits(back), f32_bits(cases[i].f));
    }
    /* -0 keeps its sign both ways. */
    assert_int_equal(vase_f32_to_f16(-0.0f), 0x8000);
    assert_int_equal(f32_bits(vase_f16_to_f32(0x8000)), 0x80000000u);
}

static void test_f16_all_patterns(void **state) {
    (void)state;
    for (uint32_t i = 0; i <= 0xffff; i++) {
        uint16_t h = (uint16_t)i;
        float f = vase_f16_to_f32(h);
        bool is_nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
        bool is_inf = (h & 0x7fff) == 0x7c00;
        if (is_nan) {
            assert_true(isnan(f));
            uint16_t back = vase_f32_to_f16(f);
            assert_int_equal(back & 0x7c00, 0x7c00); /* still a NaN, never Inf */
            assert_int_not_equal(back & 0x3ff, 0);
            continue;
        }
        if (is_inf)
            assert_true(isinf(f) && (signbit(f) != 0) == ((h & 0x8000) != 0));
        else
            assert_true((double)f == f16_value(h));
        /* Every float16 value is a float32: the round trip is exact, -0 included. */
        assert_int_equal(vase_f32_to_f16(f), h);
    }
}

static void test_f16_round_to_nearest_even(void **state) {
    (void)state;
    static const struct {
        float f;
        uint16_t h;
    } cases[] = {
        /* Halfway between 1 (0x3c00) and 1 + 2^-10 (0x3c01): to the even one, 1. */
        {1.0f + 0x1p-11f, 0x3c00},
        /* Halfway between 0x3c01 and 0x3c02: to the even one, 0x3c02. */
        {1.0f + 3 * 0x1p-11f, 0x3c02},
        /* Just above halfway: up. Just below: down. */
        {1.0f + 0x1p-11f + 0x1p-20f, 0x3c01},
        {1.0f + 0x1p-11f - 0x1p-20f, 0x3c00},
        /* 65519 is below the halfway point 65520 between 65504 and 2^16: stays finite;
         * 65520 is halfway, and the even neighbour is Inf (0x7bff is odd). */
        {65519.0f, 0x7bff},
        {65520.0f, 0x7c00},
        {-65520.0f, 0xfc00},
        {1e6f, 0x7c00},
        {3.4e38f, 0x7c00},
        /* Subnormals: 2^-25 is halfway between 0 and 2^-24: to even, 0. 3 * 2^-25 is halfway
         * between 1 and 2 subnormal steps: to 2. Slightly above 2^-25: 1 step. */
        {0x1p-25f, 0x0000},
        {-0x1p-25f, 0x8000},
        {3 * 0x1p-25f, 0x0002},
        {5 * 0x1p-25f, 0x0002}, /* between 2 and 3 steps: to even 2 */
        {0x1p-25f + 0x1p-35f, 0x0001},
        {0x1p-26f, 0x0000},
        {1e-30f, 0x0000},
        {-1e-30f, 0x8000},
        {0x1p-149f, 0x0000}, /* a float32 subnormal */
        /* Halfway between the largest subnormal (0x3ff) and the smallest normal (0x400):
         * to the even pattern, 0x400. */
        {1023.5f * 0x1p-24f, 0x0400},
        /* Halfway between 0x400 and 0x401: to 0x400. */
        {0x1p-14f * (1.0f + 0x1p-11f), 0x0400},
        /* A carry into the exponent: 2 - 2^-11 is halfway between 0x3fff and 2.0 (0x4000). */
        {2.0f - 0x1p-11f, 0x4000},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        assert_int_equal(vase_f32_to_f16(cases[i].f), cases[i].h);
}

/* Random float32 values across the float16 range against the reference rounding above. */
static void test_f16_rounding_random(void **state) {
    (void)state;
    rng_state = 0x1234567ull;
    for (int i = 0; i < 100000; i++) {
        /* Exponents from 2^-30 to 2^17: through the subnormals, the normals and overflow. */
        uint32_t exp = 127 - 30 + rand_u32() % 48;
        uint32_t bits = (rand_u32() & 0x80000000u) | exp << 23 | (rand_u32() & 0x7fffffu);
        float f = bits_f32(bits);
        double a = fabs((double)f);
        uint16_t want = ref_round(a, 0x7bff, f16_value, 65536.0);
        if (signbit(f))
            want |= 0x8000;
        assert_int_equal(vase_f32_to_f16(f), want);
    }
}

static void test_f16_nan_inf(void **state) {
    (void)state;
    /* A quiet and a signalling NaN, both signs: the result is a float16 NaN (exponent all ones,
     * mantissa nonzero) and never Inf, which a plain truncation of a signalling NaN would give. */
    static const uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0xffc00000u, 0xff800001u,
                                    0x7fffffffu};
    for (size_t i = 0; i < sizeof(nans) / sizeof(nans[0]); i++) {
        uint16_t h = vase_f32_to_f16(bits_f32(nans[i]));
        assert_int_equal(h & 0x7c00, 0x7c00);
        assert_int_not_equal(h & 0x3ff, 0);
        h = vase_f32_to_bf16(bits_f32(nans[i]));
        assert_int_equal(h & 0x7f80, 0x7f80);
        assert_int_not_equal(h & 0x7f, 0);
    }
    assert_true(isnan(vase_f16_to_f32(0x7e00)));
    assert_true(isnan(vase_f16_to_f32(0x7c01)));
    assert_true(isnan(vase_f16_to_f32(0xfe00)));
    assert_true(isinf(vase_f16_to_f32(0x7c00)) && vase_f16_to_f32(0x7c00) > 0);
    assert_true(isinf(vase_f16_to_f32(0xfc00)) && vase_f16_to_f32(0xfc00) < 0);
    assert_true(isnan(vase_bf16_to_f32(0x7fc0)));
    assert_true(isnan(vase_bf16_to_f32(0x7f81)));
    assert_true(isinf(vase_bf16_to_f32(0x7f80)) && vase_bf16_to_f32(0x7f80) > 0);
    assert_true(isinf(vase_bf16_to_f32(0xff80)) && vase_bf16_to_f32(0xff80) < 0);
}

static void test_bf16_known_values(void **state) {
    (void)state;
    static const struct {
        float f;
        uint16_t h;
    } cases[] = {
        {0.0f, 0x0000},
        {1.0f, 0x3f80},
        {-2.0f, 0xc000},
        {1.0f + 0x1p-7f, 0x3f81},  /* one bfloat16 ulp above 1 */
        {0x1p-126f, 0x0080},       /* smallest normal */
        {0x1p-133f, 0x0001},       /* smallest subnormal */
        {127 * 0x1p-133f, 0x007f}, /* largest subnormal */
        {0x1.fep127f, 0x7f7f},     /* largest finite */
        {INFINITY, 0x7f80},
        {-INFINITY, 0xff80},
        /* Rounding, to nearest even: halfway between 1 and 1 + 2^-7 goes to 1; halfway
         * between 1 + 2^-7 and 1 + 2^-6 goes to 1 + 2^-6 (0x3f82); above halfway goes up. */
        {1.0f + 0x1p-8f, 0x3f80},
        {1.0f + 3 * 0x1p-8f, 0x3f82},
        {1.0f + 0x1p-8f + 0x1p-20f, 0x3f81},
        {-(1.0f + 0x1p-8f + 0x1p-20f), 0xbf81},
        /* Subnormal halfway cases: 2^-134 is halfway between 0 and 2^-133 (to 0); 3 * 2^-134
         * is halfway between 1 and 2 steps (to 2). */
        {0x1p-134f, 0x0000},
        {3 * 0x1p-134f, 0x0002},
        {0x1p-149f, 0x0000},
        /* The largest float32 is above the halfway point to 2^128: rounds to Inf. */
        {3.4028234663852886e38f, 0x7f80},
        /* Halfway between the largest finite bfloat16 and 2^128: the even neighbour is Inf. */
        {0x1.ffp127f, 0x7f80},
        {0x1.fefffep127f, 0x7f7f},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        assert_int_equal(vase_f32_to_bf16(cases[i].f), cases[i].h);
    assert_int_equal(vase_f32_to_bf16(-0.0f), 0x8000);
    assert_true(vase_bf16_to_f32(0x3f80) == 1.0f);
    assert_true(vase_bf16_to_f32(0x0001) == 0x1p-133f);
    assert_true(vase_bf16_to_f32(0xc000) == -2.0f);
}

static void test_bf16_all_patterns(void **state) {
    (void)state;
    for (uint32_t i = 0; i <= 0xffff; i++) {
        uint16_t h = (uint16_t)i;
        float f = vase_bf16_to_f32(h);
        if ((h & 0x7f80) == 0x7f80) {
            if (h & 0x7f)
                assert_true(isnan(f));
            else
                assert_true(isinf(f));
            continue;
        }
        assert_true((double)f == bf16_value(h));
        assert_int_equal(vase_f32_to_bf16(f), h);
    }
}

static void test_bf16_rounding_random(void **state) {
    (void)state;
    rng_state = 0xabcdefull;
    for (int i = 0; i < 100000; i++) {
        /* Any finite float32, subnormals included. */
        uint32_t bits = rand_u32();
        if ((bits & 0x7f800000u) == 0x7f800000u)
            continue;
        float f = bits_f32(bits);
        uint16_t want = ref_round(fabs((double)f), 0x7f7f, bf16_value, ldexp(1.0, 128));
        if (signbit(f))
            want |= 0x8000;
        assert_int_equal(vase_f32_to_bf16(f), want);
    }
}

/* A contiguous [heads][rows][dim] view: row r of head h starts at (h * rows + r) * dim. */
static void test_view_contiguous(void **state) {
    (void)state;
    float data[2 * 3 * 4];
    for (int i = 0; i < 24; i++)
        data[i] = (float)i;
    struct vase_view v = vase_view_contiguous(data, VASE_DTYPE_F32, 2, 3, 4);
    assert_ptr_equal(v.base, data);
    assert_int_equal(v.heads, 2);
    assert_int_equal(v.dim, 4);
    assert_int_equal(v.dtype, VASE_DTYPE_F32);
    assert_int_equal(v.ring, 0);
    assert_int_equal(v.tokens_per_page, 0);
    assert_null(v.pages);
    for (uint32_t h = 0; h < 2; h++)
        for (uint32_t r = 0; r < 3; r++) {
            assert_ptr_equal(vase_view_row(&v, r, h), data + (h * 3 + r) * 4);
            float out[4];
            assert_int_equal(vase_view_read_row(&v, r, h, out), 0);
            for (int d = 0; d < 4; d++)
                assert_true(out[d] == (float)((h * 3 + r) * 4 + d));
        }

    uint16_t half[2 * 3 * 4];
    v = vase_view_contiguous(half, VASE_DTYPE_BF16, 2, 3, 4);
    assert_int_equal(v.token_stride, 8);
    assert_int_equal(v.head_stride, 24);
    assert_ptr_equal(vase_view_row(&v, 2, 1), half + (3 + 2) * 4);
}

/* Reading a row converts each dtype to float32 and flags NaN and Inf. */
static void test_view_read_row_dtypes(void **state) {
    (void)state;
    /* Values exactly representable in both float16 and bfloat16. */
    const float vals[4] = {1.5f, -0.25f, 96.0f, 0x1p-14f};
    uint16_t h16[4], b16[4];
    for (int d = 0; d < 4; d++) {
        h16[d] = vase_f32_to_f16(vals[d]);
        b16[d] = vase_f32_to_bf16(vals[d]);
    }
    float out[4];
    struct vase_view v = vase_view_contiguous(h16, VASE_DTYPE_F16, 1, 1, 4);
    assert_int_equal(vase_view_read_row(&v, 0, 0, out), 0);
    assert_memory_equal(out, vals, sizeof(vals));
    v = vase_view_contiguous(b16, VASE_DTYPE_BF16, 1, 1, 4);
    assert_int_equal(vase_view_read_row(&v, 0, 0, out), 0);
    assert_memory_equal(out, vals, sizeof(vals));

    /* f16 subnormals through the view: 0x0001 and 0x03ff. */
    uint16_t sub[2] = {0x0001, 0x83ff};
    v = vase_view_contiguous(sub, VASE_DTYPE_F16, 1, 1, 2);
    assert_int_equal(vase_view_read_row(&v, 0, 0, out), 0);
    assert_true(out[0] == 0x1p-24f);
    assert_true(out[1] == -1023 * 0x1p-24f);

    /* Inf or NaN anywhere in the row: -EINVAL, for each dtype. */
    uint16_t h_bad[3] = {0x3c00, 0x7c00, 0x3c00};
    v = vase_view_contiguous(h_bad, VASE_DTYPE_F16, 1, 1, 3);
    assert_int_equal(vase_view_read_row(&v, 0, 0, out), -EINVAL);
    h_bad[1] = 0x7e00;
    assert_int_equal(vase_view_read_row(&v, 0, 0, out), -EINVAL);
    h_bad[1] = 0x7bff; /* 65504 is finite */
    assert_int_equal(vase_view_read_row(&v, 0, 0, out), 0);
    assert_true(out[1] == 65504.0f);

    uint16_t b_bad[3] = {0x3f80, 0x3f80, 0xff80};
    v = vase_view_contiguous(b_bad, VASE_DTYPE_BF16, 1, 1, 3);
    assert_int_equal(vase_view_read_row(&v, 0, 0, out), -EINVAL);
    b_bad[2] = 0x7fc1;
    assert_int_equal(vase_view_read_row(&v, 0, 0, out), -EINVAL);

    float f_bad[3] = {1.0f, NAN, 2.0f};
    v = vase_view_contiguous(f_bad, VASE_DTYPE_F32, 1, 1, 3);
    assert_int_equal(vase_view_read_row(&v, 0, 0, out), -EINVAL);
    f_bad[1] = -INFINITY;
    assert_int_equal(vase_view_read_row(&v, 0, 0, out), -EINVAL);
    f_bad[1] = 3.4e38f;
    assert_int_equal(vase_view_read_row(&v, 0, 0, out), 0);
}

/*
 * The paged arena layout [page][layer][K,V][token][kv_head][dim] with a shuffled block table:
 * every (row, head) of layer 1's K and V must land at the address the layout defines, computed
 * here from the layout, and read back the value stored there.
 */
enum { P_LAYERS = 3, P_HKV = 2, P_DIM = 3, P_TPP = 4, P_PAGES = 6, P_ROWS = 14 };

static void test_view_paged_arena(void **state) {
    (void)state;
    const size_t es = sizeof(uint16_t);
    const size_t page_elems = (size_t)P_LAYERS * 2 * P_TPP * P_HKV * P_DIM;
    uint16_t *arena = calloc(P_PAGES * page_elems, es);
    assert_non_null(arena);
    /* Logical page i of the sequence lives in physical page table[i]. */
    static const uint32_t table[4] = {4, 1, 5, 2};
    const uint32_t layer = 1;

    for (int kv = 0; kv < 2; kv++) {
        struct vase_view v = {
            .base = (char *)arena + (layer * 2 + (uint32_t)kv) * P_TPP * P_HKV * P_DIM * es,
            .pages = table,
            .tokens_per_page = P_TPP,
            .heads = P_HKV,
            .dim = P_DIM,
            .dtype = VASE_DTYPE_BF16,
            .page_stride = (int64_t)(page_elems * es),
            .token_stride = (int64_t)(P_HKV * P_DIM * es),
            .head_stride = (int64_t)(P_DIM * es),
        };
        for (uint32_t r = 0; r < P_ROWS; r++)
            for (uint32_t h = 0; h < P_HKV; h++) {
                size_t page = table[r / P_TPP], tok = r % P_TPP;
                size_t off = page * page_elems +
                             (((layer * 2 + (size_t)kv) * P_TPP + tok) * P_HKV + h) * P_DIM;
                assert_ptr_equal(vase_view_row(&v, r, h), arena + off);
                /* Distinct small integers: exact in bfloat16. */
                for (uint32_t d = 0; d < P_DIM; d++)
                    arena[off + d] =
                        vase_f32_to_bf16((float)(kv * 100 + (int)r * 7 + (int)h * 3 + (int)d));
            }
        for (uint32_t r = 0; r < P_ROWS; r++)
            for (uint32_t h = 0; h < P_HKV; h++) {
                float out[P_DIM];
                assert_int_equal(vase_view_read_row(&v, r, h, out), 0);
                for (uint32_t d = 0; d < P_DIM; d++)
                    assert_true(out[d] == (float)(kv * 100 + (int)r * 7 + (int)h * 3 + (int)d));
            }
    }

    /* Without a block table, logical page i is physical page i. */
    struct vase_view v = {
        .base = arena,
        .tokens_per_page = P_TPP,
        .heads = P_HKV,
        .dim = P_DIM,
        .dtype = VASE_DTYPE_BF16,
        .page_stride = (int64_t)(page_elems * es),
        .token_stride = (int64_t)(P_HKV * P_DIM * es),
        .head_stride = (int64_t)(P_DIM * es),
    };
    assert_ptr_equal(vase_view_row(&v, 9, 1), arena + 2 * page_elems + (1 * P_HKV + 1) * P_DIM);
    free(arena);
}

/* A ring: row r lives in slot (first + r) % ring, e.g. the window's queries. */
static void test_view_ring(void **state) {
    (void)state;
    enum { RING = 5, HQ = 2, D = 2 };
    float q[RING][HQ][D];
    for (int s = 0; s < RING; s++)
        for (int h = 0; h < HQ; h++)
            for (int d = 0; d < D; d++)
                q[s][h][d] = (float)(s * 10 + h * 2 + d);
    struct vase_view v = {
        .base = q,
        .ring = RING,
        .first = 3,
        .heads = HQ,
        .dim = D,
        .dtype = VASE_DTYPE_F32,
        .token_stride = HQ * D * sizeof(float),
        .head_stride = D * sizeof(float),
    };
    /* Rows 0, 1 are slots 3, 4; rows 2, 3, 4 wrap to slots 0, 1, 2. */
    static const int slot_of_row[RING] = {3, 4, 0, 1, 2};
    for (uint32_t r = 0; r < RING; r++)
        for (uint32_t h = 0; h < HQ; h++) {
            assert_ptr_equal(vase_view_row(&v, r, h), &q[slot_of_row[r]][h][0]);
            float out[D];
            assert_int_equal(vase_view_read_row(&v, r, h, out), 0);
            assert_true(out[0] == (float)(slot_of_row[r] * 10 + (int)h * 2));
            assert_true(out[1] == (float)(slot_of_row[r] * 10 + (int)h * 2 + 1));
        }
    /* A ring over pages: slot (first + r) % ring, then page and token from the slot. */
    static const uint32_t table[3] = {2, 0, 1};
    float paged[3][2][D]; /* [page][token][dim], 2 tokens per page, one head */
    struct vase_view pv = {
        .base = paged,
        .pages = table,
        .tokens_per_page = 2,
        .ring = 6,
        .first = 5,
        .heads = 1,
        .dim = D,
        .dtype = VASE_DTYPE_F32,
        .page_stride = 2 * D * sizeof(float),
        .token_stride = D * sizeof(float),
    };
    /* Row 0 is slot 5: logical page 2 -> physical 1, token 1. Row 1 is slot 0: page 2, token 0.
     * Row 4 is slot 3: logical page 1 -> physical 0, token 1. */
    assert_ptr_equal(vase_view_row(&pv, 0, 0), &paged[1][1][0]);
    assert_ptr_equal(vase_view_row(&pv, 1, 0), &paged[2][0][0]);
    assert_ptr_equal(vase_view_row(&pv, 4, 0), &paged[0][1][0]);
}

static void test_workspace_lifecycle(void **state) {
    (void)state;
    struct vase_workspace *ws = NULL;
    assert_int_equal(vase_workspace_new(NULL), -EINVAL);
    assert_int_equal(vase_workspace_new(&ws), 0);
    assert_non_null(ws);
    assert_null(vase_workspace_free(ws));
    assert_null(vase_workspace_free(NULL));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtype_sizes_and_names),
        cmocka_unit_test(test_f16_known_values),
        cmocka_unit_test(test_f16_all_patterns),
        cmocka_unit_test(test_f16_round_to_nearest_even),
        cmocka_unit_test(test_f16_rounding_random),
        cmocka_unit_test(test_f16_nan_inf),
        cmocka_unit_test(test_bf16_known_values),
        cmocka_unit_test(test_bf16_all_patterns),
        cmocka_unit_test(test_bf16_rounding_random),
        cmocka_unit_test(test_view_contiguous),
        cmocka_unit_test(test_view_read_row_dtypes),
        cmocka_unit_test(test_view_paged_arena),
        cmocka_unit_test(test_view_ring),
        cmocka_unit_test(test_workspace_lifecycle),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
