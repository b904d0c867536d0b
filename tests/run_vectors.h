/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The kernels run_vectors drives: the CPU's by default; with --cuda, those of a backend linked
 * into the binary (tests/gpu/vectors_cuda.c, in build/tests/gpu/run_vectors_cuda). The hooks
 * take what run_vectors has, host arrays behind views made by vase_view_contiguous(), or with
 * --block paged views through a host block table; a backend copies what it needs and returns
 * what the CPU function would.
 */

#include "vase_kernels.h"

struct vectors_backend {
    const char *plan_name;    /* for messages: "vase_plan()" */
    const char *compact_name; /* "vase_compact()" */
    /* vase_plan(in, 1, ws, keep): rows [0, n) of k and v, window rows of q, keep [Hkv][K]. */
    int (*plan)(const struct vase_plan_input *in, struct vase_workspace **ws, uint32_t *keep);
    /* vase_compact() of rows [0, len) of view. */
    int (*compact)(struct vase_view *view, const uint32_t *keep, uint32_t K, uint32_t n,
                   uint32_t len);
    /* Releases whatever the backend holds; may be NULL. */
    void (*done)(void);
};

/* The CUDA backend. A weak reference: NULL in a binary linked without tests/gpu/vectors_cuda.o,
 * so the CPU-only run_vectors needs no CUDA and no #ifdef. */
const struct vectors_backend *vectors_backend_cuda(void) __attribute__((weak));
