/* SPDX-License-Identifier: MIT */

/* The planner tests' sequence in an arena (plan_fixture.h): sizes, addresses through the block
 * table, ring and plan pages by the fixture's own arithmetic, data from a seeded rand(), and the
 * run that describes it. It owns nothing; the arena and the choice of pages are the test's. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "plan_fixture.h"

static uint32_t div_up(uint64_t a, uint64_t b) {
    return (uint32_t)((a + b - 1) / b);
}

void plan_fixture_shape(struct plan_fixture *f, const struct vase_layout_geometry *g, uint32_t len,
                        uint32_t window, uint32_t budget) {
    const uint64_t es = sizeof(float);
    char msg[256] = "";

    assert_int_equal(g->dtype, VASE_DTYPE_F32);
    assert_true(g->block_tokens > 0);
    assert_true(budget > window);
    f->layers = g->layers;
    f->q_heads = g->q_heads;
    f->kv_heads = g->kv_heads;
    f->head_dim = g->head_dim;
    f->block_tokens = g->block_tokens;
    f->len = len;
    f->window = window;
    f->budget = budget;
    f->keep = budget - window;

    /* A page: block_tokens tokens of every layer, [layer][K,V][token][kv_head][dim]. */
    f->head_stride = g->head_dim * es;
    f->token_stride = g->kv_heads * f->head_stride;
    f->kv_stride = g->block_tokens * f->token_stride;
    f->layer_stride = 2 * f->kv_stride;
    f->page_bytes = g->layers * f->layer_stride;
    /* A ring page: as many entries of every layer as fit a page (at least one),
     * [layer][entry][q_head][dim]. */
    f->ring_row_stride = g->q_heads * f->head_stride;
    /* Ring pages are KV pages, with as many entries of every layer as fit, unless one entry is
     * larger than a page: then a ring page is one entry. */
    f->ring_rows = (uint32_t)(f->page_bytes / (g->layers * f->ring_row_stride));
    f->ring_page_bytes = f->page_bytes;
    if (f->ring_rows == 0) {
        f->ring_rows = 1;
        f->ring_page_bytes = g->layers * f->ring_row_stride;
    }
    f->ring_layer_stride = f->ring_rows * f->ring_row_stride;
    /* One plan page of every keep list, the smallest power of two of at least 4096 bytes (the
     * test arenas are far below 2^38 bytes, where the least plan page would grow). */
    uint32_t lists = g->layers * g->kv_heads;
    f->ppp = lists;
    for (f->plan_page_bytes = 4096; f->plan_page_bytes < (uint64_t)lists * 4 * f->keep;)
        f->plan_page_bytes *= 2;

    f->n_pages = div_up(len + window, g->block_tokens);
    f->n_ring = div_up(2 * window, f->ring_rows);
    f->n_plan = div_up(lists, f->ppp);
    assert_true(f->n_pages <= PLAN_FIXTURE_MAX_PAGES);
    assert_true(f->n_ring <= PLAN_FIXTURE_MAX_RING);
    assert_true(f->n_plan <= PLAN_FIXTURE_MAX_PLAN);

    /* The layout the run carries must describe the same units, or the planner would read and
     * write elsewhere than the fixture does. */
    assert_int_equal(vase_layout_compute(g, f->arena->size, &f->lay, msg, sizeof(msg)), 0);
    assert_int_equal(f->lay.page_bytes, f->page_bytes);
    assert_int_equal(f->lay.ring_rows_per_page, f->ring_rows);
    assert_int_equal(f->lay.ring_page_bytes, f->ring_page_bytes);
    assert_int_equal(vase_layout_plans(&f->lay, f->keep, &f->plan_lay, msg, sizeof(msg)), 0);
    assert_int_equal(f->plan_lay.plans_per_page, f->ppp);
    assert_int_equal(f->plan_lay.plan_page_bytes, f->plan_page_bytes);
    assert_int_equal(f->plan_lay.plan_pages, f->n_plan);
}

struct span {
    uint64_t start, end;
    const char *kind;
    uint32_t index;
};

void plan_fixture_check_pages(const struct plan_fixture *f) {
    struct span s[PLAN_FIXTURE_MAX_PAGES + PLAN_FIXTURE_MAX_RING + PLAN_FIXTURE_MAX_PLAN];
    uint32_t n = 0;

    for (uint32_t i = 0; i < f->n_pages; i++)
        s[n++] = (struct span){f->pages[i] * f->page_bytes, (f->pages[i] + 1ull) * f->page_bytes,
                               "KV page", i};
    for (uint32_t i = 0; i < f->n_ring; i++)
        s[n++] = (struct span){f->ring[i] * f->ring_page_bytes,
                               (f->ring[i] + 1ull) * f->ring_page_bytes, "ring page", i};
    for (uint32_t i = 0; i < f->n_plan; i++)
        s[n++] = (struct span){f->plan[i] * f->plan_page_bytes,
                               (f->plan[i] + 1ull) * f->plan_page_bytes, "plan page", i};
    for (uint32_t i = 0; i < n; i++) {
        if (s[i].end > f->arena->size)
            fail_msg("%s %u ends at byte %llu, beyond the arena's %llu", s[i].kind, s[i].index,
                     (unsigned long long)s[i].end, (unsigned long long)f->arena->size);
        for (uint32_t j = 0; j < i; j++)
            if (s[i].start < s[j].end && s[j].start < s[i].end)
                fail_msg("%s %u [%llu, %llu) overlaps %s %u [%llu, %llu)", s[i].kind, s[i].index,
                         (unsigned long long)s[i].start, (unsigned long long)s[i].end, s[j].kind,
                         s[j].index, (unsigned long long)s[j].start, (unsigned long long)s[j].end);
    }
}

float *plan_fixture_kv(const struct plan_fixture *f, uint32_t l, int v, uint32_t slot, uint32_t h) {
    uint32_t B = f->block_tokens;
    assert_true(slot / B < f->n_pages);
    return (float *)((char *)f->arena->map + (uint64_t)f->pages[slot / B] * f->page_bytes +
                     l * f->layer_stride + (uint64_t)v * f->kv_stride +
                     (slot % B) * f->token_stride + h * f->head_stride);
}

float *plan_fixture_q(const struct plan_fixture *f, uint32_t l, uint32_t entry, uint32_t h) {
    uint32_t rr = f->ring_rows;
    assert_true(entry / rr < f->n_ring);
    return (float *)((char *)f->arena->map + (uint64_t)f->ring[entry / rr] * f->ring_page_bytes +
                     l * f->ring_layer_stride + (entry % rr) * f->ring_row_stride +
                     h * f->head_stride);
}

uint32_t *plan_fixture_list(const struct plan_fixture *f, uint32_t i) {
    assert_true(i / f->ppp < f->n_plan);
    return (uint32_t *)((char *)f->arena->map + (uint64_t)f->plan[i / f->ppp] * f->plan_page_bytes +
                        (uint64_t)(i % f->ppp) * 4 * f->keep);
}

void plan_fixture_fill(struct plan_fixture *f, unsigned seed) {
    plan_fixture_check_pages(f);
    srand(seed);
    for (uint32_t l = 0; l < f->layers; l++) {
        for (uint32_t s = 0; s < f->len; s++)
            for (int v = 0; v < 2; v++)
                for (uint32_t h = 0; h < f->kv_heads; h++)
                    for (uint32_t d = 0; d < f->head_dim; d++)
                        plan_fixture_kv(f, l, v, s, h)[d] = (float)rand() / RAND_MAX - 0.5f;
        for (uint32_t e = 0; e < 2 * f->window; e++)
            for (uint32_t h = 0; h < f->q_heads; h++)
                for (uint32_t d = 0; d < f->head_dim; d++)
                    plan_fixture_q(f, l, e, h)[d] = (float)rand() / RAND_MAX - 0.5f;
    }
}

struct vase_plan_run *plan_fixture_run(const struct plan_fixture *f, enum vase_policy policy) {
    struct vase_plan_run *run;
    plan_fixture_check_pages(f);
    assert_int_equal(vase_plan_run_new(&run), 0);
    run->len = f->len;
    run->n = f->len - f->window;
    run->layers = f->layers;
    run->kv_heads = f->kv_heads;
    run->q_heads = f->q_heads;
    run->head_dim = f->head_dim;
    run->dtype = VASE_DTYPE_F32;
    run->policy = policy;
    run->params = vase_params_default(f->budget);
    run->params.window = f->window;
    run->keep = vase_plan_keep_count(&run->params);
    assert_int_equal(run->keep, f->keep);
    run->arena_base = f->arena->map;
    run->layout = f->lay;
    run->plan = f->plan_lay;
    run->n_pages = f->n_pages;
    run->n_plan_pages = f->n_plan;
    run->pages = malloc(sizeof(f->pages));
    run->ring_pages = malloc(sizeof(f->ring));
    run->plan_pages = malloc(sizeof(f->plan));
    assert_non_null(run->pages);
    assert_non_null(run->ring_pages);
    assert_non_null(run->plan_pages);
    memcpy(run->pages, f->pages, sizeof(f->pages));
    memcpy(run->ring_pages, f->ring, sizeof(f->ring));
    memcpy(run->plan_pages, f->plan, sizeof(f->plan));
    return run;
}
