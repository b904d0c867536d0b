/* SPDX-License-Identifier: MIT */

/*
 * Tests of client/layout.c against numbers worked out by hand from PROTOCOL.md "Memory" for a
 * made-up model: 3 layers, 4 query heads, 2 KV heads, head dim 8, float16, 4 KiB pages.
 *
 *   token_stride = 2 * 8 * 2 = 32          per token of every layer, K and V: 3 * 2 * 32 = 192
 *   tokens_per_page = floor(4096 / 192) = 21 (20 with align 4)
 *   kv_stride = 21 * 32 = 672, layer_stride = 1344, head_stride = 16
 *   ring row = 4 * 8 * 2 = 64, ring_rows_per_page = floor(4096 / (3 * 64)) = 21,
 *   ring_layer_stride = 21 * 64 = 1344
 */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "layout.h"

static const struct vase_geometry geo = {
    .name = "made-up",
    .layers = 3,
    .q_heads = 4,
    .kv_heads = 2,
    .head_dim = 8,
    .dtype = VASE_DTYPE_F16,
    .align = 1,
};

static void test_compute(void **state) {
    (void)state;
    struct vase__layout l;
    assert_int_equal(vase__layout_compute(&geo, 4096, &l), 0);
    assert_int_equal(l.tokens_per_page, 21);
    assert_int_equal(l.token_stride, 32);
    assert_int_equal(l.kv_stride, 672);
    assert_int_equal(l.layer_stride, 1344);
    assert_int_equal(l.head_stride, 16);
    assert_int_equal(l.ring_rows_per_page, 21);
    assert_int_equal(l.ring_row_stride, 64);
    assert_int_equal(l.ring_layer_stride, 1344);

    struct vase_geometry g = geo;
    g.align = 4;
    assert_int_equal(vase__layout_compute(&g, 4096, &l), 0);
    assert_int_equal(l.tokens_per_page, 20);
    assert_int_equal(l.kv_stride, 640);
    g.align = 0; /* none, like 1 */
    assert_int_equal(vase__layout_compute(&g, 4096, &l), 0);
    assert_int_equal(l.tokens_per_page, 21);

    /* float32 doubles every stride. */
    g.dtype = VASE_DTYPE_F32;
    assert_int_equal(vase__layout_compute(&g, 4096, &l), 0);
    assert_int_equal(l.tokens_per_page, 10);
    assert_int_equal(l.token_stride, 64);
}

static void test_compute_invalid(void **state) {
    (void)state;
    struct vase__layout l;
    memset(&l, 0xaa, sizeof(l));
    struct vase__layout before = l;
    struct vase_geometry g = geo;

    g.align = 32; /* 21 tokens rounded down to 32: none */
    assert_int_equal(vase__layout_compute(&g, 4096, &l), -EINVAL);
    g = geo;
    assert_int_equal(vase__layout_compute(&g, 191, &l), -EINVAL); /* not one token */
    g.q_heads = 3;                                                /* not a multiple of 2 */
    assert_int_equal(vase__layout_compute(&g, 4096, &l), -EINVAL);
    g = geo;
    g.dtype = _VASE_DTYPE_MAX;
    assert_int_equal(vase__layout_compute(&g, 4096, &l), -EINVAL);
    g = geo;
    g.layers = 0;
    assert_int_equal(vase__layout_compute(&g, 4096, &l), -EINVAL);
    g = geo;
    g.head_dim = VASE_MAX_DIM + 1;
    assert_int_equal(vase__layout_compute(&g, 1u << 30, &l), -EINVAL);
    assert_int_equal(vase__layout_compute(NULL, 4096, &l), -EINVAL);
    assert_int_equal(vase__layout_compute(&geo, 4096, NULL), -EINVAL);
    assert_int_equal(vase__layout_compute(&geo, 0, &l), -EINVAL);
    /* ret untouched on failure */
    assert_memory_equal(&l, &before, sizeof(l));
}

static void test_kv_offsets_and_view(void **state) {
    (void)state;
    struct vase__layout l;
    static char arena[16 * 4096];
    const uint32_t pages[] = {7, 3, 9};

    assert_int_equal(vase__layout_compute(&geo, 4096, &l), 0);
    /* Slot 45: page index 45 / 21 = 2 (page 9), token 45 % 21 = 3.
     * K(layer 2, head 1) = 9 * 4096 + 2 * 1344 + 3 * 32 + 1 * 16 = 39664; V 672 further. */
    assert_int_equal(vase__layout_kv_offset(&l, pages, 2, VASE_K, 45, 1), 39664);
    assert_int_equal(vase__layout_kv_offset(&l, pages, 2, VASE_V, 45, 1), 40336);
    /* Slot 0 of layer 0, head 0: the start of page 7. Slot 20 is the last of page 7. */
    assert_int_equal(vase__layout_kv_offset(&l, pages, 0, VASE_K, 0, 0), 7 * 4096);
    assert_int_equal(vase__layout_kv_offset(&l, pages, 0, VASE_K, 20, 0), 7 * 4096 + 20 * 32);
    assert_int_equal(vase__layout_kv_offset(&l, pages, 0, VASE_K, 21, 0), 3 * 4096);

    struct vase_view v = vase__layout_kv_view(&l, arena, pages, 2, VASE_V);
    assert_ptr_equal(v.base, arena + 2 * 1344 + 672);
    assert_ptr_equal(v.pages, pages);
    assert_int_equal(v.tokens_per_page, 21);
    assert_int_equal(v.ring, 0);
    assert_int_equal(v.first, 0);
    assert_int_equal(v.heads, 2);
    assert_int_equal(v.dim, 8);
    assert_int_equal(v.dtype, VASE_DTYPE_F16);
    assert_int_equal(v.page_stride, 4096);
    assert_int_equal(v.token_stride, 32);
    assert_int_equal(v.head_stride, 16);
    /* The kernels' addressing agrees with the protocol's formula for every slot and head. */
    for (uint32_t layer = 0; layer < 3; layer++)
        for (int kv = VASE_K; kv <= VASE_V; kv++) {
            struct vase_view w = vase__layout_kv_view(&l, arena, pages, layer, (enum vase_kv)kv);
            for (uint32_t slot = 0; slot < 63; slot++)
                for (uint32_t h = 0; h < 2; h++)
                    assert_ptr_equal(vase_view_row(&w, slot, h),
                                     arena + vase__layout_kv_offset(&l, pages, layer,
                                                                    (enum vase_kv)kv, slot, h));
        }
}

static void test_ring(void **state) {
    (void)state;
    struct vase__layout l;
    const uint32_t ring_pages[] = {5, 11};

    assert_int_equal(vase__layout_compute(&geo, 4096, &l), 0);
    /* Window 16: 32 entries, 21 rows per page, so 2 pages. */
    assert_int_equal(vase__layout_ring_pages(&l, 16), 2);
    assert_int_equal(vase__layout_ring_pages(&l, 8), 1);
    assert_int_equal(vase__ring_entry(0, 16), 0);
    assert_int_equal(vase__ring_entry(31, 16), 31);
    assert_int_equal(vase__ring_entry(32, 16), 0);
    assert_int_equal(vase__ring_entry(100, 16), 4);
    assert_int_equal(vase__ring_entry((1ull << 40) + 3, 16), 3);
    /* pos 100: entry 4, page 5 row 4; layer 1, q_head 3:
     * 5 * 4096 + 1 * 1344 + 4 * 64 + 3 * 16 = 22128. */
    assert_int_equal(vase__layout_query_offset(&l, ring_pages, 16, 1, 100, 3), 22128);
    /* pos 57: entry 25, page index 1 (11), row 4; layer 2, q_head 0:
     * 11 * 4096 + 2 * 1344 + 4 * 64 = 48000. */
    assert_int_equal(vase__layout_query_offset(&l, ring_pages, 16, 2, 57, 0), 48000);

    /* A page too small for one query row of every layer: no ring. */
    struct vase__layout tiny = l;
    tiny.ring_rows_per_page = 0;
    assert_int_equal(vase__layout_ring_pages(&tiny, 16), 0);
}

static void test_plan_offsets(void **state) {
    (void)state;
    const uint32_t plan_pages[] = {2, 8};
    /* budget 64, window 16: K = 48, 192 bytes per list, 21 lists per 4 KiB page. */
    assert_int_equal(vase__plans_per_page(4096, 48), 21);
    assert_int_equal(vase__plans_per_page(4096, 0), 0);
    assert_int_equal(vase__plans_per_page(100, 48), 0);
    assert_int_equal(vase__plan_offset(4096, plan_pages, 21, 48, 0), 2 * 4096);
    assert_int_equal(vase__plan_offset(4096, plan_pages, 21, 48, 20), 2 * 4096 + 20 * 192);
    /* List 22 = layer 11, head 0 of a 2-head model: page 8, offset 1 * 192. */
    assert_int_equal(vase__plan_offset(4096, plan_pages, 21, 48, 22), 8 * 4096 + 192);
}

static void test_trigger_rule(void **state) {
    (void)state;
    /* budget 64, window 16, prompt 100. */
    /* Prefill never evicts, even far above the budget and on a multiple of the window. */
    assert_false(vase__evict_due(99, 100, 112, 64, 16));
    assert_false(vase__evict_due(0, 100, 80, 64, 16));
    /* The first decode token (position 100) on a multiple of the window above the budget. */
    assert_true(vase__evict_due(100, 100, 112, 64, 16));
    assert_false(vase__evict_due(100, 100, 113, 64, 16));
    assert_false(vase__evict_due(101, 100, 127, 64, 16));
    assert_true(vase__evict_due(115, 100, 128, 64, 16));
    /* Not above the budget: len == budget does not evict. */
    assert_false(vase__evict_due(200, 0, 64, 64, 16));
    assert_false(vase__evict_due(200, 0, 48, 64, 16));
    assert_true(vase__evict_due(200, 0, 80, 64, 16));
    /* Steady state: after each eviction len is budget + appended, next at budget + W. */
    assert_true(vase__evict_due(300, 0, 80, 64, 16));
    /* No prompt at all: decode from position 0. */
    assert_true(vase__evict_due(79, 0, 80, 64, 16));
    /* A zero window never fires (and never divides by zero). */
    assert_false(vase__evict_due(1000, 0, 80, 64, 0));
}

static void test_ring_first(void **state) {
    (void)state;
    /* After 128 tokens the window's queries are those of positions 112 .. 127: entries
     * 112 % 32 = 16 .. 31. */
    assert_int_equal(vase__ring_first(128, 16), 16);
    assert_int_equal(vase__ring_first(16, 16), 0);
    assert_int_equal(vase__ring_first(40, 16), 24);
    /* Each query of the window is at ring_first + i (mod 2W), i < W, and equals its entry. */
    for (uint64_t pos_after = 16; pos_after < 200; pos_after++) {
        uint32_t first = vase__ring_first(pos_after, 16);
        for (uint32_t i = 0; i < 16; i++)
            assert_int_equal((first + i) % 32, vase__ring_entry(pos_after - 16 + i, 16));
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compute),
        cmocka_unit_test(test_compute_invalid),
        cmocka_unit_test(test_kv_offsets_and_view),
        cmocka_unit_test(test_ring),
        cmocka_unit_test(test_plan_offsets),
        cmocka_unit_test(test_trigger_rule),
        cmocka_unit_test(test_ring_first),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
