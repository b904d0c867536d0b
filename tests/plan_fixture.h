/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * One sequence laid out in an arena as the planner sees it, shared by the unit tests of
 * daemon/plan/evictor.c and daemon/plan/planner_cuda.c: the paged layout of an F32 geometry with
 * its block size, a block table of KV pages, query-ring pages and plan pages (which pages is the
 * test's choice; each kind in units of its own size), K, V and queries filled from rand(), the
 * addresses of a token's K/V, a query row and a keep list, and a plan run describing it all.
 *
 * Sizes and addresses are the fixture's own arithmetic (PROTOCOL.md "Memory"), not calls into
 * kernels/layout.c, so that the tests check the layout module instead of repeating it. Before
 * data is written or a run is made, the fixture asserts that every chosen page lies inside the
 * arena and that no two overlap in bytes. Failures are cmocka assertions; include <cmocka.h>
 * (and what it needs) before this header.
 */

#include <stdint.h>

#include "../daemon/core/arena.h"
#include "../daemon/plan/evictor.h"
#include "../daemon/core/registry.h"

#define PLAN_FIXTURE_MAX_PAGES 512u
#define PLAN_FIXTURE_MAX_RING 64u
#define PLAN_FIXTURE_MAX_PLAN 8u

struct plan_fixture {
    struct vase_arena *arena; /* the test's; its map holds the sequence */
    struct vase_layout lay;   /* vase_layout_compute's, for the run (checked against below) */
    struct vase_plan_layout plan_lay;
    uint32_t layers, q_heads, kv_heads, head_dim, block_tokens, len, window, budget, keep;
    /* The fixture's arithmetic: unit sizes and strides in bytes. */
    uint64_t page_bytes, token_stride, head_stride, kv_stride, layer_stride;
    uint64_t ring_page_bytes, ring_row_stride, ring_layer_stride;
    uint64_t plan_page_bytes;
    uint32_t ring_rows, ppp; /* ring entries per ring page, keep lists per plan page */
    /* Chosen by the test after plan_fixture_shape(): KV pages of page_bytes, ring pages of
     * ring_page_bytes, plan pages of plan_page_bytes. */
    uint32_t pages[PLAN_FIXTURE_MAX_PAGES], ring[PLAN_FIXTURE_MAX_RING],
        plan[PLAN_FIXTURE_MAX_PLAN];
    uint32_t n_pages, n_ring, n_plan;
};

/* Computes the layout of g (F32) in f->arena and how many KV, ring and plan pages a sequence of
 * len tokens with the given window and budget needs; asserts that the layout module's unit
 * sizes agree with the fixture's. */
void plan_fixture_shape(struct plan_fixture *f, const struct vase_layout_geometry *g, uint32_t len,
                        uint32_t window, uint32_t budget);

/* Asserts that every chosen page lies inside the arena and that no two pages, of any kinds,
 * share a byte. plan_fixture_fill() and plan_fixture_run() call it. */
void plan_fixture_check_pages(const struct plan_fixture *f);

/* Where head h of token slot's key (v = 0) or value (v = 1) of layer l lies. */
float *plan_fixture_kv(const struct plan_fixture *f, uint32_t l, int v, uint32_t slot, uint32_t h);

/* Where query head h of ring entry `entry` of layer l lies. */
float *plan_fixture_q(const struct plan_fixture *f, uint32_t l, uint32_t entry, uint32_t h);

/* Where keep list i (= layer * kv_heads + head) lies in the plan pages. */
uint32_t *plan_fixture_list(const struct plan_fixture *f, uint32_t i);

/* srand(seed), then every K, V (all len tokens) and query (2 * window ring entries) value,
 * layer by layer, uniform in [-0.5, 0.5]. */
void plan_fixture_fill(struct plan_fixture *f, unsigned seed);

/* A run of the policy over the whole sequence, default parameters at f->budget and f->window:
 * geometry, layout and copies of the page lists. The caller sets the rest (ids, seed, ring_first,
 * arena, keep_lists, acc) and frees it with vase_plan_run_free(). */
struct vase_plan_run *plan_fixture_run(const struct plan_fixture *f, enum vase_policy policy);
