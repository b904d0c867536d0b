/* SPDX-License-Identifier: MIT */

/*
 * What every planner shares: which one plans over an arena, and how a run (evictor.h) becomes
 * the kernels' input for one layer and where its keep lists go in the plan pages. Pure
 * functions of the run, so that the CPU and CUDA planners read the same views and write the
 * same offsets; neither calls back into the evictor.
 */

#include <stddef.h>

#include "arena.h"
#include "evictor.h"
#include "planner.h"

const struct vase_planner_ops *vase_planner_for(const struct vase_arena *a) {
    return a && vase_arena_on_device(a) ? &vase_planner_cuda_ops : &vase_planner_cpu_ops;
}

void vase_plan_run_input(const struct vase_plan_run *run, uint32_t layer,
                         struct vase_plan_input *in) {
    size_t es = vase_dtype_size(run->dtype);
    char *base = run->arena_base;

    *in = (struct vase_plan_input){
        .policy = run->policy,
        .params = run->params,
        .n = run->n,
        .hq = run->q_heads,
        .k =
            {
                .base = base + layer * run->layout.layer_stride,
                .pages = run->pages,
                .tokens_per_page = run->layout.tokens_per_page,
                .heads = run->kv_heads,
                .dim = run->head_dim,
                .dtype = run->dtype,
                .page_stride = (int64_t)run->layout.page_bytes,
                .token_stride = (int64_t)run->layout.token_stride,
                .head_stride = (int64_t)(run->head_dim * es),
            },
        .rng = {.seed = run->seed, .sequence = run->seq_id, .layer = layer, .round = run->round},
    };
    in->v = in->k;
    in->v.base = base + layer * run->layout.layer_stride + run->layout.kv_stride;
    if (run->ring_pages && run->layout.ring_rows_per_page) {
        in->q = (struct vase_view){
            .base = base + layer * run->layout.ring_layer_stride,
            .pages = run->ring_pages,
            .tokens_per_page = run->layout.ring_rows_per_page,
            .ring = 2 * run->params.window,
            .first = run->ring_first,
            .heads = run->q_heads,
            .dim = run->head_dim,
            .dtype = run->dtype,
            .page_stride = (int64_t)run->layout.page_bytes,
            .token_stride = (int64_t)run->layout.ring_row_stride,
            .head_stride = (int64_t)(run->head_dim * es),
        };
    }
    size_t per_layer = (size_t)run->kv_heads * run->n;
    if (run->acc)
        in->acc = run->acc + layer * per_layer;
    if (run->scores && run->scores[layer])
        in->scores = run->scores[layer];
    if (run->exp_draws)
        in->exp_draws = run->exp_draws + layer * per_layer;
    in->gauss = run->gauss;
}

uint64_t vase_plan_run_list_offset(const struct vase_plan_run *run, uint32_t i) {
    return (uint64_t)run->plan_pages[i / run->plans_per_page] * run->layout.page_bytes +
           (uint64_t)(i % run->plans_per_page) * run->keep * sizeof(uint32_t);
}
