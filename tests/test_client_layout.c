/* SPDX-License-Identifier: MIT */

/*
 * Tests of the layout module (kernels/layout.c, vase_layout.h), the one set of formulas the
 * daemon and libvase both compile. Every expected number is written out here, by hand or by
 * the formulas of PROTOCOL.md "Memory" spelled out in this file, never by calling the module:
 *
 *     page_bytes   = B * layers * 2 * kv_heads * head_dim * es
 *     K of (layer, slot, head) = table[slot / B] * page_bytes + layer * 2 * B * kvh * D * es
 *                                + (slot % B) * kvh * D * es + head * D * es;  V + B * kvh * D * es
 *
 * The hand-worked model: 3 layers, 4 query heads, 2 KV heads, head dim 8, float16, B = 4, in an
 * arena of 64 KiB:
 *
 *   token_stride = 2 * 8 * 2 = 32, head_stride = 16, kv_stride = 4 * 32 = 128,
 *   layer_stride = 256, page_bytes = 3 * 256 = 768, num_blocks = floor(65536 / 768) = 85
 *   ring row = 4 * 8 * 2 = 64, one entry of every layer = 192, ring_rows_per_page = 768 / 192
 *   = 4, ring_layer_stride = 256, ring_page_bytes = 768
 */

#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "vase_layout.h"

#define MIB (UINT64_C(1) << 20)
/* arena_bytes of `make run`: daemon/config/config.c's default. */
#define DEFAULT_ARENA (1024 * MIB)

static const struct vase_layout_geometry made_up = {
    .layers = 3,
    .q_heads = 4,
    .kv_heads = 2,
    .head_dim = 8,
    .dtype = VASE_DTYPE_F16,
    .block_tokens = 4,
};

struct model {
    const char *name;
    uint32_t layers, q_heads, kv_heads, head_dim;
};

static const struct model models[] = {
    {"Qwen3-4B", 36, 32, 8, 128}, {"Qwen3-14B", 40, 40, 8, 128}, {"Llama-3-8B", 32, 32, 8, 128},
    {"small", 2, 4, 2, 32},       {"tiny", 1, 1, 1, 8},
};
static const uint32_t block_sizes[] = {1, 16, 64, 256};
static const enum vase_dtype dtypes[] = {VASE_DTYPE_F32, VASE_DTYPE_F16, VASE_DTYPE_BF16};
static const uint64_t dtype_bytes[] = {4, 2, 2};

static struct vase_layout compute_ok(const struct vase_layout_geometry *g, uint64_t arena) {
    struct vase_layout l;
    char msg[256] = "";
    int r = vase_layout_compute(g, arena, &l, msg, sizeof(msg));
    if (r != 0)
        fail_msg("layout refused: %s", msg);
    return l;
}

/* The byte offset of K or V of (layer, slot, head), spelled out from the geometry alone. */
static uint64_t page_formula(const struct vase_layout_geometry *g) {
    return (uint64_t)g->block_tokens * g->layers * 2 * g->kv_heads * g->head_dim *
           vase_dtype_size(g->dtype);
}

static uint64_t kv_formula(const struct vase_layout_geometry *g, const uint32_t *table,
                           uint32_t layer, int kv, uint32_t slot, uint32_t head) {
    uint64_t es = vase_dtype_size(g->dtype), B = g->block_tokens;
    uint64_t row = (uint64_t)g->kv_heads * g->head_dim * es;
    return table[slot / B] * page_formula(g) + layer * 2 * B * row + (uint64_t)kv * B * row +
           (slot % B) * row + (uint64_t)head * g->head_dim * es;
}

/* ---- block sizes of real models ---- */

/*
 * For every model, dtype and block size, in the default arena (where everything fits) and in
 * a 1 MiB arena (where the big pages do not): a page holds exactly block_tokens tokens, or the
 * refusal names block_tokens, the two sizes, and what to change.
 */
static void test_block_sizes_of_real_models(void **state) {
    (void)state;
    const uint64_t arenas[] = {DEFAULT_ARENA, MIB};
    unsigned fitted[2] = {0}, refused[2] = {0};

    for (size_t a = 0; a < 2; a++)
        for (size_t m = 0; m < sizeof(models) / sizeof(models[0]); m++)
            for (size_t d = 0; d < 3; d++)
                for (size_t b = 0; b < 4; b++) {
                    const struct model *mo = &models[m];
                    struct vase_layout_geometry g = {
                        .layers = mo->layers,
                        .q_heads = mo->q_heads,
                        .kv_heads = mo->kv_heads,
                        .head_dim = mo->head_dim,
                        .dtype = dtypes[d],
                        .block_tokens = block_sizes[b],
                    };
                    uint64_t page = (uint64_t)block_sizes[b] * mo->layers * 2 * mo->kv_heads *
                                    mo->head_dim * dtype_bytes[d];
                    struct vase_layout l;
                    memset(&l, 0x5a, sizeof(l));
                    char msg[256] = "";
                    int r = vase_layout_compute(&g, arenas[a], &l, msg, sizeof(msg));
                    if (page <= arenas[a]) {
                        if (r != 0)
                            fail_msg("%s B=%u dtype %d refused: %s", mo->name, block_sizes[b],
                                     (int)dtypes[d], msg);
                        assert_int_equal(l.block_tokens, block_sizes[b]);
                        assert_int_equal(l.page_bytes, page);
                        assert_int_equal(l.num_blocks, arenas[a] / page);
                        assert_int_equal(l.token_stride,
                                         (uint64_t)mo->kv_heads * mo->head_dim * dtype_bytes[d]);
                        assert_int_equal(l.layer_stride * mo->layers, page);
                        assert_int_equal(l.arena_bytes, arenas[a]);
                        fitted[a]++;
                    } else {
                        assert_int_equal(r, -EINVAL);
                        char want[64];
                        assert_non_null(strstr(msg, "block_tokens"));
                        snprintf(want, sizeof(want), "%u tokens", block_sizes[b]);
                        assert_non_null(strstr(msg, want));
                        snprintf(want, sizeof(want), "%" PRIu64 " bytes", page);
                        assert_non_null(strstr(msg, want));
                        snprintf(want, sizeof(want), "%" PRIu64 " bytes", arenas[a]);
                        assert_non_null(strstr(msg, want));
                        assert_non_null(strstr(msg, "smaller block_tokens or a larger arena"));
                        refused[a]++;
                    }
                }
    /* Every page of these models fits 1 GiB (the largest, Qwen3-14B in f32 with 256
     * tokens, is 80 MiB); in 1 MiB the 64- and 256-token pages of the real models do not. */
    assert_int_equal(fitted[0], 5 * 3 * 4);
    assert_int_equal(refused[0], 0);
    assert_true(refused[1] > 0 && fitted[1] > 0);

    /* Qwen3-14B, f32, 256 tokens: 256 * 40 * 2 * 8 * 128 * 4 = 83886080 bytes, 12 blocks. */
    struct vase_layout l = compute_ok(
        &(struct vase_layout_geometry){40, 40, 8, 128, VASE_DTYPE_F32, 256}, DEFAULT_ARENA);
    assert_int_equal(l.page_bytes, 83886080);
    assert_int_equal(l.num_blocks, 12);
    /* Qwen3-4B, bf16, 16 tokens: 16 * 36 * 2 * 8 * 128 * 2 = 2359296 bytes, 455 blocks. */
    l = compute_ok(&(struct vase_layout_geometry){36, 32, 8, 128, VASE_DTYPE_BF16, 16},
                   DEFAULT_ARENA);
    assert_int_equal(l.page_bytes, 2359296);
    assert_int_equal(l.num_blocks, 455);
    /* block_tokens 0 is the default, 16. */
    l = compute_ok(&(struct vase_layout_geometry){36, 32, 8, 128, VASE_DTYPE_BF16, 0},
                   DEFAULT_ARENA);
    assert_int_equal(l.block_tokens, 16);
    assert_int_equal(l.page_bytes, 2359296);
}

/* ---- hand-computed layouts ---- */

static void test_compute(void **state) {
    (void)state;
    struct vase_layout l = compute_ok(&made_up, 65536);

    assert_int_equal(l.layers, 3);
    assert_int_equal(l.q_heads, 4);
    assert_int_equal(l.kv_heads, 2);
    assert_int_equal(l.head_dim, 8);
    assert_int_equal(l.dtype, VASE_DTYPE_F16);
    assert_int_equal(l.block_tokens, 4);
    assert_int_equal(l.arena_bytes, 65536);
    assert_int_equal(l.token_stride, 32);
    assert_int_equal(l.head_stride, 16);
    assert_int_equal(l.kv_stride, 128);
    assert_int_equal(l.layer_stride, 256);
    assert_int_equal(l.page_bytes, 768);
    assert_int_equal(l.num_blocks, 85);
    assert_int_equal(l.ring_rows_per_page, 4);
    assert_int_equal(l.ring_row_stride, 64);
    assert_int_equal(l.ring_layer_stride, 256);
    assert_int_equal(l.ring_page_bytes, 768);

    /* B = 16: page 3072, 21 blocks (64512 bytes), 16 ring rows a page. */
    struct vase_layout_geometry g = made_up;
    g.block_tokens = 16;
    l = compute_ok(&g, 65536);
    assert_int_equal(l.page_bytes, 3072);
    assert_int_equal(l.kv_stride, 512);
    assert_int_equal(l.layer_stride, 1024);
    assert_int_equal(l.num_blocks, 21);
    assert_int_equal(l.ring_rows_per_page, 16);
    assert_int_equal(l.ring_layer_stride, 1024);
    assert_int_equal(l.ring_page_bytes, 3072);

    /* B = 1: a page of 192 bytes is exactly one ring entry of every layer. */
    g.block_tokens = 1;
    l = compute_ok(&g, 65536);
    assert_int_equal(l.page_bytes, 192);
    assert_int_equal(l.num_blocks, 341);
    assert_int_equal(l.ring_rows_per_page, 1);
    assert_int_equal(l.ring_page_bytes, 192);

    /* float32 doubles every stride. */
    g = made_up;
    g.dtype = VASE_DTYPE_F32;
    l = compute_ok(&g, 65536);
    assert_int_equal(l.token_stride, 64);
    assert_int_equal(l.head_stride, 32);
    assert_int_equal(l.page_bytes, 1536);
    assert_int_equal(l.num_blocks, 42);
    assert_int_equal(l.ring_rows_per_page, 4);
    assert_int_equal(l.ring_page_bytes, 1536);

    /* A page smaller than one query entry of every layer (1 layer, 8 query heads, 1 KV head,
     * dim 8, f32, B = 1: 64-byte pages, 256-byte entries): still one entry a ring page. */
    l = compute_ok(&(struct vase_layout_geometry){1, 8, 1, 8, VASE_DTYPE_F32, 1}, 65536);
    assert_int_equal(l.page_bytes, 64);
    assert_int_equal(l.num_blocks, 1024);
    assert_int_equal(l.ring_rows_per_page, 1);
    assert_int_equal(l.ring_row_stride, 256);
    assert_int_equal(l.ring_layer_stride, 256);
    assert_int_equal(l.ring_page_bytes, 256);

    /* A page exactly the arena: one block. */
    l = compute_ok(&made_up, 768);
    assert_int_equal(l.num_blocks, 1);
}

static void test_blocks_and_slots(void **state) {
    (void)state;
    struct vase_layout l = compute_ok(&made_up, 65536);

    assert_int_equal(vase_layout_blocks_for(&l, 0), 0);
    assert_int_equal(vase_layout_blocks_for(&l, 1), 1);
    assert_int_equal(vase_layout_blocks_for(&l, 4), 1);
    assert_int_equal(vase_layout_blocks_for(&l, 5), 2);
    assert_int_equal(vase_layout_blocks_for(&l, 96), 24);
    assert_int_equal(vase_layout_blocks_for(&l, UINT64_C(1) << 40), UINT32_MAX);
    /* max(prompt, budget) + window + slack. */
    assert_int_equal(vase_layout_open_slots(100, 64, 16, 16), 132);
    assert_int_equal(vase_layout_open_slots(10, 64, 16, 0), 80);
    assert_int_equal(vase_layout_open_slots(UINT32_MAX, 1, UINT32_MAX, UINT32_MAX),
                     3 * (uint64_t)UINT32_MAX);
    assert_int_equal(vase_layout_steady_slots(64, 16, 16), 96);
    assert_int_equal(vase_layout_steady_slots(UINT32_MAX, UINT32_MAX, 1),
                     2 * (uint64_t)UINT32_MAX + 1);
}

static void test_ring_pages(void **state) {
    (void)state;
    struct vase_layout l = compute_ok(&made_up, 65536);
    bool fits = false;

    /* Window 16: 32 entries, 4 a page: 8 pages; window 5: 10 entries, 3 pages. */
    assert_int_equal(vase_layout_ring_pages(&l, 16, &fits), 8);
    assert_true(fits);
    assert_int_equal(vase_layout_ring_pages(&l, 5, NULL), 3);
    assert_int_equal(vase_layout_ring_pages(&l, 2, NULL), 1);
    fits = false;
    assert_int_equal(vase_layout_ring_pages(&l, 0, &fits), 0);
    assert_true(fits);

    /* A ring page larger than the arena (1024 query heads of dim 1024 in f32: 4 MiB an entry)
     * while a KV page fits (8 KiB): no ring at all. */
    l = compute_ok(&(struct vase_layout_geometry){1, 1024, 1, 1024, VASE_DTYPE_F32, 1}, MIB);
    assert_int_equal(l.page_bytes, 8192);
    assert_int_equal(l.ring_page_bytes, 4 * MIB);
    fits = true;
    assert_int_equal(vase_layout_ring_pages(&l, 16, &fits), 0);
    assert_false(fits);
}

static void test_plans(void **state) {
    (void)state;
    struct vase_layout l = compute_ok(&made_up, 65536);
    struct vase_plan_layout p;
    char msg[256];

    /* One plan page of every list, the smallest power of two of at least 4096 bytes. keep 48:
     * 6 lists of 192 bytes = 1152 bytes: a 4096-byte page. */
    assert_int_equal(vase_layout_plans(&l, 48, &p, NULL, 0), 0);
    assert_int_equal(p.keep, 48);
    assert_int_equal(p.lists, 6);
    assert_int_equal(p.plans_per_page, 6);
    assert_int_equal(p.plan_page_bytes, 4096);
    assert_int_equal(p.plan_pages, 1);
    /* keep 1000: 6 lists of 4000 bytes = 24000: 32768. */
    assert_int_equal(vase_layout_plans(&l, 1000, &p, NULL, 0), 0);
    assert_int_equal(p.plans_per_page, 6);
    assert_int_equal(p.plan_page_bytes, 32768);
    assert_int_equal(p.plan_pages, 1);
    /* keep 1024: exactly 24576 bytes, still 32768; keep 2730: 65520 bytes, 65536. */
    assert_int_equal(vase_layout_plans(&l, 1024, &p, NULL, 0), 0);
    assert_int_equal(p.plan_page_bytes, 32768);
    assert_int_equal(vase_layout_plans(&l, 2730, &p, NULL, 0), 0);
    assert_int_equal(p.plan_page_bytes, 65536);
    /* A large arena raises the smallest plan page: at most 2^26 pages of it. Qwen3-4B in 1 TiB,
     * keep 1: 288 lists of 4 bytes, in a page of 2^40 / 2^26 = 16384 bytes. */
    struct vase_layout big_arena = compute_ok(
        &(struct vase_layout_geometry){36, 32, 8, 128, VASE_DTYPE_BF16, 16}, UINT64_C(1) << 40);
    assert_int_equal(vase_layout_plans(&big_arena, 1, &p, NULL, 0), 0);
    assert_int_equal(p.plan_page_bytes, 16384);

    /* Refused: no slot kept; one list larger than the arena. p is untouched. */
    memset(&p, 0x5a, sizeof(p));
    struct vase_plan_layout before = p;
    msg[0] = '\0';
    assert_int_equal(vase_layout_plans(&l, 0, &p, msg, sizeof(msg)), -EINVAL);
    assert_true(msg[0] != '\0');
    msg[0] = '\0';
    assert_int_equal(vase_layout_plans(&l, 2731, &p, msg, sizeof(msg)), -EINVAL);
    assert_non_null(strstr(msg, "2731 slots"));
    assert_non_null(strstr(msg, "65544 bytes"));
    assert_int_equal(vase_layout_plans(&l, 2731, &p, NULL, 0), -EINVAL);
    assert_memory_equal(&p, &before, sizeof(p));
}

/* ---- bounds ---- */

static void expect_refused(const struct vase_layout_geometry *g, uint64_t arena) {
    struct vase_layout l;
    memset(&l, 0x5a, sizeof(l));
    struct vase_layout before = l;
    char msg[256] = "";
    assert_int_equal(vase_layout_compute(g, arena, &l, msg, sizeof(msg)), -EINVAL);
    assert_true(msg[0] != '\0');
    assert_memory_equal(&l, &before, sizeof(l));
    /* No message buffer is fine too. */
    assert_int_equal(vase_layout_compute(g, arena, &l, NULL, 0), -EINVAL);
    assert_memory_equal(&l, &before, sizeof(l));
}

static void test_bounds(void **state) {
    (void)state;
    const uint64_t big = UINT64_C(1) << 40;
    struct vase_layout_geometry g;
    struct vase_layout l;

#define REFUSED_WITH(field, value)                                                                 \
    do {                                                                                           \
        g = made_up;                                                                               \
        g.field = value;                                                                           \
        expect_refused(&g, big);                                                                   \
    } while (0)
    REFUSED_WITH(layers, 0);
    REFUSED_WITH(layers, VASE_LAYOUT_MAX_LAYERS + 1);
    REFUSED_WITH(kv_heads, 0);
    REFUSED_WITH(kv_heads, VASE_MAX_HEADS + 1);
    REFUSED_WITH(q_heads, 0);
    REFUSED_WITH(q_heads, VASE_MAX_HEADS + 2);
    REFUSED_WITH(q_heads, 3); /* not a multiple of 2 KV heads */
    REFUSED_WITH(q_heads, 5);
    REFUSED_WITH(head_dim, 0);
    REFUSED_WITH(head_dim, VASE_MAX_DIM + 1);
    REFUSED_WITH(block_tokens, VASE_LAYOUT_MAX_BLOCK_TOKENS + 1);
    REFUSED_WITH(block_tokens, UINT32_MAX);
    REFUSED_WITH(dtype, _VASE_DTYPE_MAX);
    REFUSED_WITH(dtype, (enum vase_dtype) - 1);
#undef REFUSED_WITH
    /* No geometry, no result. */
    char msg[64] = "";
    assert_int_equal(vase_layout_compute(NULL, big, &l, msg, sizeof(msg)), -EINVAL);
    assert_true(msg[0] != '\0');
    assert_int_equal(vase_layout_compute(&made_up, big, NULL, NULL, 0), -EINVAL);
    /* An empty arena holds no page. */
    expect_refused(&made_up, 0);
    expect_refused(&made_up, 767);

    /* The limits themselves are accepted. */
    g = made_up;
    g.layers = VASE_LAYOUT_MAX_LAYERS;
    assert_int_equal(vase_layout_compute(&g, big, &l, NULL, 0), 0);
    assert_int_equal(l.page_bytes, 4 * 1024 * 2 * 32);
    g = made_up;
    g.block_tokens = VASE_LAYOUT_MAX_BLOCK_TOKENS;
    assert_int_equal(vase_layout_compute(&g, big, &l, NULL, 0), 0);
    assert_int_equal(l.block_tokens, 65536);
    g = (struct vase_layout_geometry){
        1, VASE_MAX_HEADS, VASE_MAX_HEADS, VASE_MAX_DIM, VASE_DTYPE_F32, 1};
    assert_int_equal(vase_layout_compute(&g, big, &l, NULL, 0), 0);
    assert_int_equal(l.page_bytes, 2 * 1024 * 1024 * 4);

    /* At most 2^26 blocks: the tiny model in f16 with B = 1 has 32-byte pages. */
    g = (struct vase_layout_geometry){1, 1, 1, 8, VASE_DTYPE_F16, 1};
    const uint64_t most = UINT64_C(1) << 26;
    assert_int_equal(vase_layout_compute(&g, 32 * most, &l, NULL, 0), 0);
    assert_int_equal(l.num_blocks, most);
    assert_int_equal(vase_layout_compute(&g, 32 * most + 31, &l, NULL, 0), 0);
    assert_int_equal(l.num_blocks, most);
    expect_refused(&g, 32 * (most + 1));
    char longer[256] = "";
    assert_int_equal(vase_layout_compute(&g, UINT64_C(1) << 37, &l, longer, sizeof(longer)),
                     -EINVAL);
    assert_non_null(strstr(longer, "larger block_tokens"));
    /* The same arena with B = 2 halves the blocks: accepted. */
    g.block_tokens = 2;
    assert_int_equal(vase_layout_compute(&g, 32 * (most + 1), &l, NULL, 0), 0);
    assert_int_equal(l.num_blocks, (most + 1) / 2);

    /* A message buffer too small is cut, never overrun. */
    char small[8];
    memset(small, 'x', sizeof(small));
    g = made_up;
    g.layers = 0;
    assert_int_equal(vase_layout_compute(&g, big, &l, small, 4), -EINVAL);
    assert_int_equal(strlen(small), 3);
    assert_int_equal(small[4], 'x');
}

static void test_units(void **state) {
    (void)state;
    assert_int_equal(vase_layout_units(65536, 768), 85);
    assert_int_equal(vase_layout_units(65536, 65536), 1);
    assert_int_equal(vase_layout_units(65535, 65536), 0);
    assert_int_equal(vase_layout_units(65536, 0), 0);
}

/* ---- offsets ---- */

/* A block table of n distinct blocks below num_blocks, in no particular order. */
static void make_table(uint32_t *table, uint32_t n, uint32_t num_blocks) {
    assert_true(n <= num_blocks);
    /* 7919 is prime: i -> (i * 7919 + 3) % num_blocks is one-to-one unless num_blocks is a
     * multiple of it. */
    assert_true(num_blocks % 7919 != 0);
    for (uint32_t i = 0; i < n; i++)
        table[i] = (uint32_t)(((uint64_t)i * 7919 + 3) % num_blocks);
}

static void check_kv(const struct vase_layout_geometry *g, uint64_t arena, uint32_t n_blocks) {
    struct vase_layout l = compute_ok(g, arena);
    uint32_t table[64];
    uint64_t es = vase_dtype_size(g->dtype);
    uint32_t B = g->block_tokens;

    assert_true(n_blocks <= 64);
    uint64_t page = page_formula(g);
    assert_int_equal(l.page_bytes, page);
    assert_int_equal(l.num_blocks, arena / page);
    make_table(table, n_blocks, l.num_blocks);
    uint32_t slots = n_blocks * B;
    uint32_t step = slots > 4096 ? slots / 4096 : 1;
    /* The first, second, middle and last layers (fewer where the model has fewer). */
    const uint32_t picks[4] = {0, 1, g->layers / 2, g->layers - 1};
    /* The first and last head, and the first and last element of a row. */
    uint32_t head_step = g->kv_heads > 1 ? g->kv_heads - 1 : 1;
    uint64_t dim_step = g->head_dim > 1 ? g->head_dim - 1 : 1;
    const int64_t shape[4] = {(int64_t)(arena / page), B, g->kv_heads, g->head_dim};
    const int64_t bytes[4] = {(int64_t)page, (int64_t)(g->kv_heads * g->head_dim * es),
                              (int64_t)(g->head_dim * es), (int64_t)es};
    for (int li = 0; li < 4; li++) {
        uint32_t layer = picks[li];
        if (layer >= g->layers || (li > 0 && layer <= picks[li - 1]))
            continue;
        for (int kv = VASE_K; kv <= VASE_V; kv++) {
            struct vase_layout_tensor t;
            vase_layout_kv_tensor(&l, layer, (enum vase_kv)kv, &t);
            for (int i = 0; i < 4; i++) {
                assert_int_equal(t.shape[i], shape[i]);
                assert_int_equal(t.byte_strides[i], bytes[i]);
                assert_int_equal(t.strides[i] * (int64_t)es, bytes[i]);
            }
            assert_int_equal(t.offset, layer * 2 * B * g->kv_heads * g->head_dim * es +
                                           (uint64_t)kv * B * g->kv_heads * g->head_dim * es);
            for (uint32_t slot = 0; slot < slots; slot += step)
                for (uint32_t h = 0; h < g->kv_heads; h += head_step) {
                    uint64_t want = kv_formula(g, table, layer, kv, slot, h);
                    assert_int_equal(
                        vase_layout_kv_offset(&l, table, layer, (enum vase_kv)kv, slot, h), want);
                    /* Element [b][t][h][d] of the tensor is the same byte, for d = 0 and the
                     * last d, by the byte strides and by the element strides. */
                    uint64_t b = table[slot / B], tok = slot % B;
                    for (uint64_t d = 0; d < g->head_dim; d += dim_step) {
                        uint64_t by = t.offset + b * (uint64_t)t.byte_strides[0] +
                                      tok * (uint64_t)t.byte_strides[1] +
                                      h * (uint64_t)t.byte_strides[2] +
                                      d * (uint64_t)t.byte_strides[3];
                        uint64_t el = b * (uint64_t)t.strides[0] + tok * (uint64_t)t.strides[1] +
                                      h * (uint64_t)t.strides[2] + d * (uint64_t)t.strides[3];
                        assert_int_equal(by, want + d * es);
                        assert_int_equal(t.offset + el * es, want + d * es);
                    }
                }
        }
    }
}

static void test_kv_offsets(void **state) {
    (void)state;
    /* The hand-worked model. Slot 45 through table {7, 3, 9, ...}: block index 45 / 4 = 11,
     * token 1. */
    struct vase_layout l = compute_ok(&made_up, 65536);
    uint32_t table[16] = {7, 3, 9, 0, 1, 2, 4, 5, 6, 8, 10, 84};
    /* K(layer 2, slot 45, head 1) = 84 * 768 + 2 * 256 + 1 * 32 + 1 * 16 = 65072; V 128
     * further. */
    assert_int_equal(vase_layout_kv_offset(&l, table, 2, VASE_K, 45, 1), 65072);
    assert_int_equal(vase_layout_kv_offset(&l, table, 2, VASE_V, 45, 1), 65200);
    /* The last byte of the last block's V is the last of the arena before its 256-byte
     * tail: 84 * 768 + 2 * 256 + 128 + 3 * 32 + 16 + 16 = 65280. */
    assert_int_equal(vase_layout_kv_offset(&l, table, 2, VASE_V, 47, 1) + 16, 65280);
    assert_int_equal(vase_layout_kv_offset(&l, table, 0, VASE_K, 0, 0), 7 * 768);
    assert_int_equal(vase_layout_kv_offset(&l, table, 0, VASE_K, 3, 0), 7 * 768 + 3 * 32);
    assert_int_equal(vase_layout_kv_offset(&l, table, 0, VASE_K, 4, 0), 3 * 768);
    assert_int_equal(vase_layout_kv_offset(&l, table, 1, VASE_V, 9, 1),
                     9 * 768 + 256 + 128 + 32 + 16);

    struct vase_layout_tensor t;
    vase_layout_kv_tensor(&l, 2, VASE_V, &t);
    assert_int_equal(t.offset, 2 * 256 + 128);
    assert_int_equal(t.shape[0], 85);
    assert_int_equal(t.shape[1], 4);
    assert_int_equal(t.shape[2], 2);
    assert_int_equal(t.shape[3], 8);
    assert_int_equal(t.byte_strides[0], 768);
    assert_int_equal(t.byte_strides[1], 32);
    assert_int_equal(t.byte_strides[2], 16);
    assert_int_equal(t.byte_strides[3], 2);
    assert_int_equal(t.strides[0], 384);
    assert_int_equal(t.strides[1], 16);
    assert_int_equal(t.strides[2], 8);
    assert_int_equal(t.strides[3], 1);
    /* Its last element ends inside the arena: offset + (shape - 1) . strides + 1 element. */
    uint64_t end = t.offset + 84 * 768 + 3 * 32 + 16 + 7 * 2 + 2;
    assert_true(end <= 65536);

    /* The real models, every dtype and block size, and the small ones, slot by slot. */
    for (size_t m = 0; m < sizeof(models) / sizeof(models[0]); m++)
        for (size_t d = 0; d < 3; d++)
            for (size_t b = 0; b < 4; b++) {
                struct vase_layout_geometry g = {models[m].layers,   models[m].q_heads,
                                                 models[m].kv_heads, models[m].head_dim,
                                                 dtypes[d],          block_sizes[b]};
                struct vase_layout lm = compute_ok(&g, DEFAULT_ARENA);
                uint32_t n = lm.num_blocks < 24 ? lm.num_blocks : 24;
                /* 7919 is no divisor of any of these num_blocks (checked in make_table). */
                check_kv(&g, DEFAULT_ARENA, n);
            }
    check_kv(&made_up, 65536, 21);

    /* Offsets beyond 4 GiB: Qwen3-14B in bf16 with 16-token pages in a 1 TiB arena. */
    struct vase_layout_geometry q14 = {40, 40, 8, 128, VASE_DTYPE_BF16, 16};
    l = compute_ok(&q14, UINT64_C(1) << 40);
    assert_int_equal(l.page_bytes, 2621440);
    assert_int_equal(l.num_blocks, 419430);
    uint32_t far[2] = {419429, 400000};
    assert_int_equal(vase_layout_kv_offset(&l, far, 39, VASE_V, 17, 7),
                     UINT64_C(400000) * 2621440 + 39 * 65536 + 32768 + 2048 + 7 * 256);
    assert_int_equal(vase_layout_kv_offset(&l, far, 39, VASE_V, 15, 7) + 256,
                     UINT64_C(419430) * 2621440);
    vase_layout_kv_tensor(&l, 39, VASE_V, &t);
    assert_int_equal(t.shape[0], 419430);
    assert_int_equal(t.strides[0], 1310720);
    check_kv(&q14, UINT64_C(1) << 40, 8);
}

/* The view the kernels read agrees with kv_offset for every slot and head. */
static void test_kv_view(void **state) {
    (void)state;
    static char arena[65536];
    struct vase_layout l = compute_ok(&made_up, sizeof(arena));
    const uint32_t table[] = {7, 3, 9, 84, 0};

    struct vase_view v = vase_layout_kv_view(&l, arena, table, 2, VASE_V);
    assert_ptr_equal(v.base, arena + 2 * 256 + 128);
    assert_ptr_equal(v.pages, table);
    assert_int_equal(v.tokens_per_page, 4);
    assert_int_equal(v.ring, 0);
    assert_int_equal(v.first, 0);
    assert_int_equal(v.heads, 2);
    assert_int_equal(v.dim, 8);
    assert_int_equal(v.dtype, VASE_DTYPE_F16);
    assert_int_equal(v.page_stride, 768);
    assert_int_equal(v.token_stride, 32);
    assert_int_equal(v.head_stride, 16);
    for (uint32_t layer = 0; layer < 3; layer++)
        for (int kv = VASE_K; kv <= VASE_V; kv++) {
            struct vase_view w = vase_layout_kv_view(&l, arena, table, layer, (enum vase_kv)kv);
            for (uint32_t slot = 0; slot < 20; slot++)
                for (uint32_t h = 0; h < 2; h++)
                    assert_ptr_equal(vase_view_row(&w, slot, h),
                                     arena + kv_formula(&made_up, table, layer, kv, slot, h));
        }
}

static void test_query_offsets(void **state) {
    (void)state;
    static char arena[65536];
    struct vase_layout l = compute_ok(&made_up, sizeof(arena));
    const uint32_t ring[] = {5, 11, 2, 80, 17, 40, 41, 0};

    /* Window 16: 32 entries, 4 a ring page. pos 100: entry 4, ring page 1 (11), row 0;
     * layer 1, q_head 3: 11 * 768 + 1 * 256 + 0 * 64 + 3 * 16 = 8752. */
    assert_int_equal(vase_layout_query_offset(&l, ring, 16, 1, 100, 3), 8752);
    /* pos 57: entry 25, ring page 6 (41), row 1; layer 2, q_head 0:
     * 41 * 768 + 2 * 256 + 64 = 32064. */
    assert_int_equal(vase_layout_query_offset(&l, ring, 16, 2, 57, 0), 32064);

    /* Against the formula, for many positions (beyond 2^32 too), and the view of the window's
     * queries row by row. */
    for (uint32_t window = 1; window <= 16; window += 5) {
        for (uint64_t pos = 0; pos < 300; pos++)
            for (uint32_t layer = 0; layer < 3; layer++)
                for (uint32_t q = 0; q < 4; q++) {
                    uint64_t e = pos % (2 * window);
                    uint64_t want =
                        ring[e / 4] * UINT64_C(768) + layer * UINT64_C(256) + (e % 4) * 64 + q * 16;
                    assert_int_equal(vase_layout_query_offset(&l, ring, window, layer, pos, q),
                                     want);
                    uint64_t far = pos + (UINT64_C(1) << 40) * 2 * window;
                    assert_int_equal(vase_layout_query_offset(&l, ring, window, layer, far, q),
                                     want);
                }
        for (uint64_t pos_after = window; pos_after < 200; pos_after += 7)
            for (uint32_t layer = 0; layer < 3; layer++) {
                uint32_t first = vase_layout_ring_first(pos_after, window);
                struct vase_view v = vase_layout_query_view(&l, arena, ring, window, first, layer);
                assert_int_equal(v.ring, 2 * window);
                assert_int_equal(v.first, first);
                assert_int_equal(v.tokens_per_page, 4);
                assert_int_equal(v.heads, 4);
                assert_int_equal(v.page_stride, 768);
                assert_int_equal(v.token_stride, 64);
                assert_int_equal(v.head_stride, 16);
                for (uint32_t r = 0; r < window; r++)
                    for (uint32_t q = 0; q < 4; q++)
                        assert_ptr_equal(vase_view_row(&v, r, q),
                                         arena + vase_layout_query_offset(&l, ring, window, layer,
                                                                          pos_after - window + r,
                                                                          q));
            }
    }
}

static void test_plan_offsets(void **state) {
    (void)state;
    /* Qwen3-4B in bf16, 16-token pages in 1 GiB, keep 448 (budget 512, window 64): 288 lists
     * of 1792 bytes = 516096 bytes: one plan page of 2^19. */
    struct vase_layout l = compute_ok(
        &(struct vase_layout_geometry){36, 32, 8, 128, VASE_DTYPE_BF16, 16}, DEFAULT_ARENA);
    struct vase_plan_layout p;
    assert_int_equal(vase_layout_plans(&l, 448, &p, NULL, 0), 0);
    assert_int_equal(p.lists, 288);
    assert_int_equal(p.plans_per_page, 288);
    assert_int_equal(p.plan_page_bytes, 524288);
    assert_int_equal(p.plan_pages, 1);
    uint32_t one[] = {3};
    assert_int_equal(vase_layout_plan_offset(&p, one, 0), 3 * UINT64_C(524288));
    assert_int_equal(vase_layout_plan_offset(&p, one, 287), 3 * UINT64_C(524288) + 287 * 1792);

    /* The hand-worked model, keep 48: 6 lists of 192 bytes in a 4096-byte page. */
    l = compute_ok(&made_up, 65536);
    const uint32_t *pages = (const uint32_t[]){2, 8, 1, 15, 0, 7};
    assert_int_equal(vase_layout_plans(&l, 48, &p, NULL, 0), 0);
    assert_int_equal(vase_layout_plan_offset(&p, pages, 0), 2 * 4096);
    assert_int_equal(vase_layout_plan_offset(&p, pages, 3), 2 * 4096 + 3 * 192);
    /* List 5 = layer 2, head 1: the last of the page. */
    assert_int_equal(vase_layout_plan_offset(&p, pages, 5), 2 * 4096 + 5 * 192);

    /* Every keep: page 1 of its size, inside the 64 KiB arena for all of them. */
    const uint32_t keeps[] = {1, 8, 48, 100, 192, 1000};
    const uint32_t second[] = {1};
    pages = second;
    for (size_t k = 0; k < sizeof(keeps) / sizeof(keeps[0]); k++) {
        assert_int_equal(vase_layout_plans(&l, keeps[k], &p, NULL, 0), 0);
        assert_int_equal(p.plan_pages, 1);
        uint64_t list = 4 * (uint64_t)keeps[k];
        uint64_t units = vase_layout_units(65536, p.plan_page_bytes);
        for (uint32_t i = 0; i < p.lists; i++) {
            uint64_t off = vase_layout_plan_offset(&p, pages, i);
            uint64_t want =
                pages[i / p.plans_per_page] * p.plan_page_bytes + (i % p.plans_per_page) * list;
            assert_int_equal(off, want);
            /* Inside its plan page, which is inside the arena. */
            assert_true(pages[i / p.plans_per_page] < units);
            assert_true(off % p.plan_page_bytes + list <= p.plan_page_bytes);
            assert_true(off + list <= 65536);
            /* Disjoint from every other list. */
            for (uint32_t j = 0; j < i; j++) {
                uint64_t o = vase_layout_plan_offset(&p, pages, j);
                assert_true(o + list <= off || off + list <= o);
            }
        }
    }
}

/* ---- the query ring and the trigger rule ---- */

static void test_ring_entry_and_first(void **state) {
    (void)state;
    assert_int_equal(vase_layout_ring_entry(0, 16), 0);
    assert_int_equal(vase_layout_ring_entry(31, 16), 31);
    assert_int_equal(vase_layout_ring_entry(32, 16), 0);
    assert_int_equal(vase_layout_ring_entry(100, 16), 4);
    assert_int_equal(vase_layout_ring_entry((UINT64_C(1) << 40) + 3, 16), 3);
    /* After 128 tokens the window's queries are those of positions 112 .. 127: entries
     * 112 % 32 = 16 .. 31. */
    assert_int_equal(vase_layout_ring_first(128, 16), 16);
    assert_int_equal(vase_layout_ring_first(16, 16), 0);
    assert_int_equal(vase_layout_ring_first(40, 16), 24);
    /* Each query of the window is at ring_first + i (mod 2W), i < W, and equals its entry. */
    for (uint64_t pos_after = 16; pos_after < 200; pos_after++) {
        uint32_t first = vase_layout_ring_first(pos_after, 16);
        for (uint32_t i = 0; i < 16; i++)
            assert_int_equal((first + i) % 32, vase_layout_ring_entry(pos_after - 16 + i, 16));
    }
}

static void test_trigger_rule(void **state) {
    (void)state;
    /* budget 64, window 16, prompt 100. */
    /* Prefill never evicts, even far above the budget and on a multiple of the window. */
    assert_false(vase_layout_evict_due(99, 100, 112, 64, 16));
    assert_false(vase_layout_evict_due(0, 100, 80, 64, 16));
    /* The first decode token (position 100) on a multiple of the window above the budget. */
    assert_true(vase_layout_evict_due(100, 100, 112, 64, 16));
    assert_false(vase_layout_evict_due(100, 100, 113, 64, 16));
    assert_false(vase_layout_evict_due(101, 100, 127, 64, 16));
    assert_true(vase_layout_evict_due(115, 100, 128, 64, 16));
    /* Not above the budget: len == budget does not evict. */
    assert_false(vase_layout_evict_due(200, 0, 64, 64, 16));
    assert_false(vase_layout_evict_due(200, 0, 48, 64, 16));
    assert_true(vase_layout_evict_due(200, 0, 80, 64, 16));
    /* Steady state: after each eviction len is budget + appended, next at budget + W. */
    assert_true(vase_layout_evict_due(300, 0, 80, 64, 16));
    /* No prompt at all: decode from position 0. */
    assert_true(vase_layout_evict_due(79, 0, 80, 64, 16));
    /* A zero window never fires (and never divides by zero). */
    assert_false(vase_layout_evict_due(1000, 0, 80, 64, 0));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_sizes_of_real_models),
        cmocka_unit_test(test_compute),
        cmocka_unit_test(test_blocks_and_slots),
        cmocka_unit_test(test_ring_pages),
        cmocka_unit_test(test_plans),
        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_units),
        cmocka_unit_test(test_kv_offsets),
        cmocka_unit_test(test_kv_view),
        cmocka_unit_test(test_query_offsets),
        cmocka_unit_test(test_plan_offsets),
        cmocka_unit_test(test_ring_entry_and_first),
        cmocka_unit_test(test_trigger_rule),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
