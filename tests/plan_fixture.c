/* SPDX-License-Identifier: MIT */

/* The planner tests' sequence in an arena (plan_fixture.h): layout, addresses through the block
 * table and ring pages, data from a seeded rand(), and the run that describes it. It owns
 * nothing; the arena and the choice of pages are the test's. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "plan_fixture.h"

void plan_fixture_shape(struct plan_fixture *f, const struct vase_geometry_desc *g, uint32_t len,
                        uint32_t window, uint32_t budget) {
    uint64_t page_bytes = f->arena->page_bytes;

    assert_int_equal(g->dtype, VASE_DTYPE_F32);
    assert_int_equal(vase_layout_compute(g, page_bytes, &f->lay, NULL), 0);
    f->layers = g->layers;
    f->q_heads = g->q_heads;
    f->kv_heads = g->kv_heads;
    f->head_dim = g->head_dim;
    f->len = len;
    f->window = window;
    f->budget = budget;
    f->n_pages = (len + window + f->lay.tokens_per_page - 1) / f->lay.tokens_per_page;
    f->n_ring = (2 * window + f->lay.ring_rows_per_page - 1) / f->lay.ring_rows_per_page;
    f->ppp = (uint32_t)(page_bytes / (4 * (budget - window)));
    f->n_plan = (f->layers * f->kv_heads + f->ppp - 1) / f->ppp;
    assert_true(f->n_pages <= sizeof(f->pages) / sizeof(f->pages[0]));
    assert_true(f->n_ring <= sizeof(f->ring) / sizeof(f->ring[0]));
    assert_true(f->n_plan <= sizeof(f->plan) / sizeof(f->plan[0]));
}

float *plan_fixture_kv(const struct plan_fixture *f, uint32_t l, int v, uint32_t slot, uint32_t h) {
    uint32_t tpp = f->lay.tokens_per_page;
    return (float *)((char *)f->arena->map + (uint64_t)f->pages[slot / tpp] * f->arena->page_bytes +
                     l * f->lay.layer_stride + v * f->lay.kv_stride +
                     (slot % tpp) * f->lay.token_stride + h * f->lay.head_stride);
}

float *plan_fixture_q(const struct plan_fixture *f, uint32_t l, uint32_t entry, uint32_t h) {
    uint32_t rr = f->lay.ring_rows_per_page;
    return (float *)((char *)f->arena->map + (uint64_t)f->ring[entry / rr] * f->arena->page_bytes +
                     l * f->lay.ring_layer_stride + (entry % rr) * f->lay.ring_row_stride +
                     h * f->lay.head_stride);
}

void plan_fixture_fill(struct plan_fixture *f, unsigned seed) {
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
    run->arena_base = f->arena->map;
    run->layout = f->lay;
    run->plans_per_page = f->ppp;
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
