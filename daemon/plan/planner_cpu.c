/* SPDX-License-Identifier: MIT */

/*
 * The CPU planner: plans a run over the daemon's host mapping of its arena with
 * vase_plan_heads(), then copies the keep lists into the plan pages. Its per-thread state is a
 * kernel workspace, grown by the plans; a thread that cannot get one plans without it (each plan
 * allocates its own scratch: slower, still correct).
 */

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "evictor.h"
#include "core/log.h"
#include "planner.h"

struct vase_planner {
    struct vase_workspace *ws; /* NULL: none could be made */
};

int vase_plan_run_layers(struct vase_plan_run *run, uint32_t l0, uint32_t l1,
                         struct vase_workspace *ws, uint32_t *ret_bad_layer) {
    size_t list = (size_t)run->kv_heads * run->keep;
    int r = 0;

    for (uint32_t l = l0; l < l1; l++) {
        struct vase_plan_input in;
        vase_plan_run_input(run, l, &in);
        r = vase_plan_heads(&in, 0, run->kv_heads, ws, run->keep_lists + l * list);
        if (r < 0) {
            if (ret_bad_layer)
                *ret_bad_layer = l;
            return r;
        }
    }
    /* Every layer of this range is planned: publish its keep lists in the plan pages, where
     * the engine reads them after the EvictPlan reply. */
    size_t bytes = (size_t)run->keep * sizeof(uint32_t);
    for (uint32_t l = l0; l < l1; l++)
        for (uint32_t h = 0; h < run->kv_heads; h++) {
            uint32_t i = l * run->kv_heads + h;
            memcpy((char *)run->arena_base + vase_plan_run_list_offset(run, i),
                   run->keep_lists + (size_t)i * run->keep, bytes);
        }
    return 0;
}

static void cpu_free(struct vase_planner *p) {
    if (!p)
        return;
    vase_workspace_free(p->ws);
    free(p);
}

static int cpu_new(const struct vase_arena *a, struct vase_planner **ret) {
    (void)a;
    struct vase_planner *p = calloc(1, sizeof(*p));
    if (!p)
        return log_oom();
    if (vase_workspace_new(&p->ws) < 0)
        p->ws = NULL;
    *ret = p;
    return 0;
}

static int cpu_plan_layers(struct vase_planner *p, struct vase_plan_run *run, uint32_t l0,
                           uint32_t l1, uint32_t *ret_bad_layer) {
    return vase_plan_run_layers(run, l0, l1, p->ws, ret_bad_layer);
}

const struct vase_planner_ops vase_planner_cpu_ops = {
    .name = "cpu",
    .thread_new = cpu_new,
    .thread_free = cpu_free,
    .plan_layers = cpu_plan_layers,
};
