/* SPDX-License-Identifier: MIT */

/*
 * The CUDA backends in a build without CUDA (USE_CUDA=0): every CUDA arena is refused at
 * creation with a message that says why, so a daemon configured for a GPU fails at start-up
 * instead of running without its arena. arena_cuda.c replaces this file when the build has
 * CUDA.
 */

#include <errno.h>

#include "arena.h"
#include "log.h"

const bool vase_arena_have_cuda = false;

static int nocuda_create(struct vase_arena *a) {
    return log_error_errno(-EOPNOTSUPP,
                           "Arena \"%s\": this vased was built without CUDA (rebuild with "
                           "USE_CUDA=1, or use arena=host).",
                           a->kind);
}

static int nocuda_export_fd(const struct vase_arena *a, int *ret_fd) {
    (void)a;
    (void)ret_fd;
    return -EOPNOTSUPP;
}

static void nocuda_destroy(struct vase_arena *a) {
    (void)a;
}

/* Device arenas cannot exist here, so the planner hooks are never reached; they are set so
 * that vase_arena_on_device() means the same in both builds. */
static int nocuda_planner_new(const struct vase_arena *a, struct vase_arena_planner **ret) {
    (void)a;
    (void)ret;
    return -EOPNOTSUPP;
}

static void nocuda_planner_free(struct vase_arena_planner *p) {
    (void)p;
}

static int nocuda_plan_layers(struct vase_arena_planner *p, struct vase_plan_run *run, uint32_t l0,
                              uint32_t l1, uint32_t *ret_bad_layer) {
    (void)p;
    (void)run;
    (void)l1;
    if (ret_bad_layer)
        *ret_bad_layer = l0;
    return -EOPNOTSUPP;
}

const struct vase_arena_ops vase_arena_cuda_ipc_ops = {
    .share = "cuda-ipc",
    .create = nocuda_create,
    .export_fd = nocuda_export_fd,
    .destroy = nocuda_destroy,
    .planner_new = nocuda_planner_new,
    .planner_free = nocuda_planner_free,
    .plan_layers = nocuda_plan_layers,
};

const struct vase_arena_ops vase_arena_cuda_vmm_ops = {
    .share = "cuda-vmm",
    .create = nocuda_create,
    .export_fd = nocuda_export_fd,
    .destroy = nocuda_destroy,
    .planner_new = nocuda_planner_new,
    .planner_free = nocuda_planner_free,
    .plan_layers = nocuda_plan_layers,
};
