/* SPDX-License-Identifier: MIT */

/*
 * libvase's CUDA side in a build without CUDA (USE_CUDA=0): device arenas are listed in the
 * welcome but cannot be mapped, so a model cannot be registered on one (-EOPNOTSUPP, with a
 * sentence for vase_last_error()), and nothing else here is ever reached. lib/cuda.c
 * replaces this file when the build has CUDA.
 */

#include <errno.h>
#include <stdio.h>

#include "cuda_arena.h"
#include "session.h"

int vase__cuda_map(struct vase__arena *a, uint64_t incarnation, char *msg, size_t msg_len) {
    (void)incarnation;
    if (msg && msg_len)
        snprintf(msg, msg_len,
                 "arena %u (%s) is GPU memory, and this libvase was built without CUDA",
                 a ? a->id : 0, a && a->kind ? a->kind : "?");
    return -EOPNOTSUPP;
}

void vase__cuda_unmap(struct vase__arena *a) {
    (void)a;
}

int vase__cuda_sync(int device, void *stream) {
    (void)device;
    (void)stream;
    return -EOPNOTSUPP;
}

int vase__cuda_copy(int device, void *stream, void *dst, const void *src, size_t n,
                    bool to_device) {
    (void)device;
    (void)stream;
    (void)dst;
    (void)src;
    (void)n;
    (void)to_device;
    return -EOPNOTSUPP;
}

const uint32_t *vase__cuda_seq_table(const struct vase__cuda_seq *cs) {
    (void)cs;
    return NULL;
}

int vase__cuda_seq_new(struct vase__cuda_mapping *m, const uint32_t *table, size_t n_pages,
                       size_t max_pages, size_t keep_entries, size_t scratch_bytes,
                       struct vase__cuda_seq **ret) {
    (void)m;
    (void)table;
    (void)n_pages;
    (void)max_pages;
    (void)keep_entries;
    (void)scratch_bytes;
    (void)ret;
    return -EOPNOTSUPP;
}

int vase__cuda_seq_set_table(struct vase__cuda_seq *cs, void *stream, const uint32_t *table,
                             size_t from, size_t n) {
    (void)cs;
    (void)stream;
    (void)table;
    (void)from;
    (void)n;
    return -EOPNOTSUPP;
}

void vase__cuda_seq_set_stream(struct vase__cuda_seq *cs, void *stream) {
    (void)cs;
    (void)stream;
}

struct vase__cuda_seq *vase__cuda_seq_free(struct vase__cuda_seq *cs) {
    (void)cs;
    return NULL;
}

int vase__cuda_seq_mark(struct vase__cuda_seq *cs, void *stream, enum vase__cuda_mark mark) {
    (void)cs;
    (void)stream;
    (void)mark;
    return -EOPNOTSUPP;
}

int vase__cuda_seq_reached(struct vase__cuda_seq *cs, enum vase__cuda_mark mark, bool wait) {
    (void)cs;
    (void)mark;
    (void)wait;
    return -EOPNOTSUPP;
}

int vase__cuda_compact(struct vase__cuda_seq *cs, void *stream, const struct vase__cuda_compact *c,
                       bool ordered) {
    (void)cs;
    (void)stream;
    (void)c;
    (void)ordered;
    return -EOPNOTSUPP;
}
