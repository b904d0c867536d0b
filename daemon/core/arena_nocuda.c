/* SPDX-License-Identifier: MIT */

/*
 * The CUDA backends in a build without CUDA (USE_CUDA=0): every CUDA arena is refused at
 * creation with a message that says why, so a daemon configured for a GPU fails at start-up
 * instead of running without its arena. The ops still say the memory would be on a device, so
 * that vase_arena_on_device() means the same in both builds. arena_cuda.c replaces this file
 * when the build has CUDA.
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

const struct vase_arena_ops vase_arena_cuda_ipc_ops = {
    .share = "cuda-ipc",
    .create = nocuda_create,
    .export_fd = nocuda_export_fd,
    .destroy = nocuda_destroy,
    .on_device = true,
};

const struct vase_arena_ops vase_arena_cuda_vmm_ops = {
    .share = "cuda-vmm",
    .create = nocuda_create,
    .export_fd = nocuda_export_fd,
    .destroy = nocuda_destroy,
    .on_device = true,
};
