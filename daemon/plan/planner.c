/* SPDX-License-Identifier: MIT */

/*
 * What every planner shares: which one plans over an arena, and how a run (evictor.h) becomes
 * the kernels' input for one layer and where its keep lists go in the plan pages. Pure
 * functions of the run, so that the CPU and CUDA planners read the same views and write the
 * same offsets; neither calls back into the evictor.
 */

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>

#include "core/arena.h"
#include "evictor.h"
#include "planner.h"

int vase_plan_run_new(struct vase_plan_run **ret) {
    struct vase_plan_run *run = calloc(1, sizeof(*run));
    if (!run)
        return -ENOMEM;
    *ret = run;
    return 0;
}

struct vase_plan_run *vase_plan_run_free(struct vase_plan_run *run) {
    if (!run)
        return NULL;
    free(run->pages);
    free(run->ring_pages);
    free(run->plan_pages);
    free(run->acc);
    if (run->scores)
        for (uint32_t l = 0; l < run->layers; l++)
            free(run->scores[l]);
    free(run->scores);
    free(run->exp_draws);
    free(run->gauss);
    free(run->keep_lists);
    free(run);
    return NULL;
}

const struct vase_planner_ops *vase_planner_for(const struct vase_arena *a) {
    return a && vase_arena_on_device(a) ? &vase_planner_cuda_ops : &vase_planner_cpu_ops;
}

void vase_plan_run_input(const struct vase_plan_run *run, uint32_t layer,
                         struct vase_plan_input *in) {
    *in = (struct vase_plan_input){
        .policy = run->policy,
        .params = run->params,
        .n = run->n,
        .hq = run->q_heads,
        .k = vase_layout_kv_view(&run->layout, run->arena_base, run->pages, layer, VASE_K),
        .v = vase_layout_kv_view(&run->layout, run->arena_base, run->pages, layer, VASE_V),
        .rng = {.seed = run->seed, .sequence = run->seq_id, .layer = layer, .round = run->round},
        .prompt_len = run->prompt_len,
    };
    if (run->ring_pages)
        in->q = vase_layout_query_view(&run->layout, run->arena_base, run->ring_pages,
                                       run->params.window, run->ring_first, layer);
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
    return vase_layout_plan_offset(&run->plan, run->plan_pages, i);
}
