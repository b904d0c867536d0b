/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * One sequence laid out in an arena as the planner sees it, shared by the unit tests of
 * daemon/evictor.c and daemon/planner_cuda.c: the paged layout of an F32 geometry, a block
 * table, query-ring and plan pages (which pages is the test's choice), K, V and queries filled
 * from rand(), the addresses of a token's K/V and a query row through the block table, and a
 * plan run describing it all. Failures are cmocka assertions; include <cmocka.h> (and what it
 * needs) before this header.
 */

#include <stdint.h>

#include "../daemon/arena.h"
#include "../daemon/evictor.h"
#include "../daemon/registry.h"

struct plan_fixture {
    struct vase_arena *arena; /* the test's; its map holds the sequence */
    struct vase_layout lay;
    uint32_t layers, q_heads, kv_heads, head_dim, len, window, budget;
    uint32_t pages[32], ring[4], plan[4]; /* chosen by the test after plan_fixture_shape() */
    uint32_t n_pages, n_ring, n_plan, ppp;
};

/* Computes the layout of g (F32, on f->arena's pages) and how many block-table, ring and plan
 * pages a sequence of len tokens with the given window and budget needs. */
void plan_fixture_shape(struct plan_fixture *f, const struct vase_geometry_desc *g, uint32_t len,
                        uint32_t window, uint32_t budget);

/* Where head h of token slot's key (v = 0) or value (v = 1) of layer l lies. */
float *plan_fixture_kv(const struct plan_fixture *f, uint32_t l, int v, uint32_t slot, uint32_t h);

/* Where query head h of ring entry `entry` of layer l lies. */
float *plan_fixture_q(const struct plan_fixture *f, uint32_t l, uint32_t entry, uint32_t h);

/* srand(seed), then every K, V (all len tokens) and query (2 * window ring entries) value,
 * layer by layer, uniform in [-0.5, 0.5]. */
void plan_fixture_fill(struct plan_fixture *f, unsigned seed);

/* A run of the policy over the whole sequence, default parameters at f->budget and f->window:
 * geometry, layout and copies of the page lists. The caller sets the rest (ids, seed, ring_first,
 * arena, keep_lists, acc) and frees it with vase_plan_run_free(). */
struct vase_plan_run *plan_fixture_run(const struct plan_fixture *f, enum vase_policy policy);
