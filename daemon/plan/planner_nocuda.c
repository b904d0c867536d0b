/* SPDX-License-Identifier: MIT */

/*
 * The CUDA planner in a build without CUDA (USE_CUDA=0): device arenas cannot exist here
 * (arena_nocuda.c refuses them), so no run ever reaches it; every call is refused all the same,
 * so that vase_planner_for() means the same in both builds. planner_cuda.c replaces this file
 * when the build has CUDA.
 */

#include <errno.h>

#include "planner.h"

const bool vase_planner_have_cuda = false;

static int nocuda_new(const struct vase_arena *a, struct vase_planner **ret) {
    (void)a;
    (void)ret;
    return -EOPNOTSUPP;
}

static void nocuda_free(struct vase_planner *p) {
    (void)p;
}

static int nocuda_plan_layers(struct vase_planner *p, struct vase_plan_run *run, uint32_t l0,
                              uint32_t l1, uint32_t *ret_bad_layer) {
    (void)p;
    (void)run;
    (void)l1;
    if (ret_bad_layer)
        *ret_bad_layer = l0;
    return -EOPNOTSUPP;
}

const struct vase_planner_ops vase_planner_cuda_ops = {
    .name = "cuda",
    .thread_new = nocuda_new,
    .thread_free = nocuda_free,
    .plan_layers = nocuda_plan_layers,
};
