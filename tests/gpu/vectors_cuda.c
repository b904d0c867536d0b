/* SPDX-License-Identifier: MIT */

/*
 * The CUDA backend of run_vectors (run_vectors.h): each hook copies the host arrays behind the
 * views it is given to the device, calls vase_plan_cuda() or vase_compact_cuda() with device
 * views, and copies the result back. The views run_vectors makes are supported: contiguous ones
 * and, with --block, paged ones through a host block table; a paged view's bytes are copied
 * whole, up to the end of the highest page its table names, unused pages between included, and
 * its table too, so the device reads the same layout through the same table. A ring, or a
 * negative stride, is -EOPNOTSUPP. Copies are of the bytes the kernel may touch: heads of rows
 * rows each.
 */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "run_vectors.h"

static struct vase_cuda_workspace *cuda_ws;

static int cuda_errno(cudaError_t e) {
    if (e == cudaSuccess)
        return 0;
    fprintf(stderr, "run_vectors: CUDA: %s\n", cudaGetErrorString(e));
    return e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO;
}

/* Entries of v's block table that rows [0, rows) use (0 for a view without one). */
static size_t view_table_len(const struct vase_view *v, uint32_t rows) {
    if (!v->pages || !v->tokens_per_page)
        return 0;
    return rows / v->tokens_per_page + (rows % v->tokens_per_page != 0);
}

/* The bytes from v->base that rows [0, rows) of every head span (strides are non-negative in
 * the views run_vectors makes): through the last page the block table names, for a paged
 * view. */
static int view_extent(const struct vase_view *v, uint32_t rows, size_t *ret) {
    uint64_t last_page = 0, last_tok = rows ? rows - 1 : 0;

    if (v->ring || v->page_stride < 0 || v->token_stride < 0 || v->head_stride < 0 ||
        (v->pages && !v->tokens_per_page))
        return -EOPNOTSUPP;
    if (!v->base || v->heads == 0 || rows == 0) {
        *ret = 0;
        return 0;
    }
    if (v->tokens_per_page) {
        /* The highest page any row is on, and any token of a page: a bound, not the last row. */
        last_page = (rows - 1) / v->tokens_per_page;
        if (v->pages) {
            last_page = 0;
            for (size_t i = 0; i < view_table_len(v, rows); i++)
                if (v->pages[i] > last_page)
                    last_page = v->pages[i];
        }
        if (last_tok >= v->tokens_per_page)
            last_tok = v->tokens_per_page - 1;
    }
    *ret = last_page * (size_t)v->page_stride + (size_t)(v->heads - 1) * (size_t)v->head_stride +
           last_tok * (size_t)v->token_stride + (size_t)v->dim * vase_dtype_size(v->dtype);
    return 0;
}

/* Copies count bytes of host src to a new device buffer *ret (NULL when src is NULL). */
static int to_device(const void *src, size_t count, void **ret) {
    *ret = NULL;
    if (!src || count == 0)
        return 0;
    int r = cuda_errno(cudaMalloc(ret, count));
    if (r < 0)
        return r;
    return cuda_errno(cudaMemcpy(*ret, src, count, cudaMemcpyHostToDevice));
}

/* A device copy of rows [0, rows) of a host view and of its block table: *ret is the same
 * view on the device; *ret_buf and *ret_pages are for cudaFree(). */
static int view_to_device(const struct vase_view *v, uint32_t rows, struct vase_view *ret,
                          void **ret_buf, void **ret_pages) {
    size_t bytes;
    int r = view_extent(v, rows, &bytes);
    if (r < 0)
        return r;
    r = to_device(v->base, bytes, ret_buf);
    if (r == 0)
        r = to_device(v->pages, view_table_len(v, rows) * sizeof *v->pages, ret_pages);
    *ret = *v;
    ret->base = *ret_buf;
    ret->pages = *ret_pages;
    return r;
}

static int cuda_plan(const struct vase_plan_input *in, struct vase_workspace **ws, uint32_t *keep) {
    enum { B_K, B_V, B_Q, B_KP, B_VP, B_QP, B_ACC, B_SCORES, B_EXP, B_GAUSS, B_KEEP, B_MAX };
    void *buf[B_MAX] = {NULL};
    struct vase_plan_input din = *in;
    uint32_t heads = in->k.heads, K = vase_plan_keep_count(&in->params);
    size_t hn = (size_t)heads * in->n * sizeof(float);
    int r;

    (void)ws; /* the CPU's workspace: the device one is cuda_ws */
    if ((r = view_to_device(&in->k, in->n, &din.k, &buf[B_K], &buf[B_KP])) < 0 ||
        (r = view_to_device(&in->v, in->n, &din.v, &buf[B_V], &buf[B_VP])) < 0 ||
        (r = view_to_device(&in->q, in->params.window, &din.q, &buf[B_Q], &buf[B_QP])) < 0 ||
        (r = to_device(in->acc, hn, &buf[B_ACC])) < 0 ||
        (r = to_device(in->scores, hn, &buf[B_SCORES])) < 0 ||
        (r = to_device(in->exp_draws, hn, &buf[B_EXP])) < 0 ||
        (r = to_device(in->gauss, (size_t)in->k.dim * in->params.rank * sizeof(float),
                       &buf[B_GAUSS])) < 0 ||
        (r = cuda_errno(cudaMalloc(&buf[B_KEEP], (size_t)heads * K * sizeof(uint32_t) + 4))) < 0)
        goto out;
    din.acc = buf[B_ACC];
    din.scores = buf[B_SCORES];
    din.exp_draws = buf[B_EXP];
    din.gauss = buf[B_GAUSS];
    r = vase_plan_cuda(&din, cuda_ws, NULL, buf[B_KEEP]);
    if (r < 0) {
        if (vase_cuda_last_error())
            fprintf(stderr, "run_vectors: vase_plan_cuda(): %s\n", vase_cuda_last_error());
        goto out;
    }
    r = cuda_errno(cudaMemcpy(keep, buf[B_KEEP], (size_t)heads * K * sizeof(uint32_t),
                              cudaMemcpyDeviceToHost));
out:
    for (int i = 0; i < B_MAX; i++)
        cudaFree(buf[i]);
    return r;
}

static int cuda_compact(struct vase_view *view, const uint32_t *keep, uint32_t K, uint32_t n,
                        uint32_t len) {
    struct vase_view dv;
    void *data = NULL, *dpages = NULL, *dkeep = NULL;
    size_t bytes = 0;
    int r, moved;

    if ((r = view_extent(view, len, &bytes)) < 0 ||
        (r = view_to_device(view, len, &dv, &data, &dpages)) < 0 ||
        (r = to_device(keep, (size_t)view->heads * K * sizeof(uint32_t), &dkeep)) < 0)
        goto out;
    moved = vase_compact_cuda(&dv, dkeep, K, n, len, NULL, 0, NULL);
    if (moved < 0) {
        r = moved;
        goto out;
    }
    r = cuda_errno(cudaMemcpy(view->base, data, bytes, cudaMemcpyDeviceToHost));
    if (r == 0)
        r = moved;
out:
    cudaFree(dkeep);
    cudaFree(dpages);
    cudaFree(data);
    return r;
}

static void cuda_done(void) {
    cuda_ws = vase_cuda_workspace_free(cuda_ws);
}

static const struct vectors_backend backend = {
    .plan_name = "vase_plan_cuda()",
    .compact_name = "vase_compact_cuda()",
    .plan = cuda_plan,
    .compact = cuda_compact,
    .done = cuda_done,
};

const struct vectors_backend *vectors_backend_cuda(void) {
    int r = vase_cuda_available();
    if (r <= 0) {
        fprintf(stderr, "run_vectors: no CUDA device (%s)\n",
                r < 0 ? strerror(-r) : "vase_cuda_available() = 0");
        return NULL;
    }
    if (!cuda_ws && vase_cuda_workspace_new(&cuda_ws) < 0)
        return NULL;
    return &backend;
}
