/* SPDX-License-Identifier: MIT */

/*
 * vase_size_seq(): the footprint of a sequence and how many fit an arena, without a daemon. The
 * layout and the footprint are kernels/layout.c's, which vased computes them with, and the count
 * runs vased's allocator (daemon/core/alloc.c, pure and linked into libvase for this) on an empty
 * arena of the same size and granule: sequences are reserved one after another, each as vased
 * reserves an open (its KV, ring and plan pages in one all-or-nothing request), until one does
 * not fit. So the figure is the daemon's own, granules shared by two page sizes included, and
 * cannot drift from it.
 */

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "alloc.h"
#include "internal.h"
#include "vase_layout.h"

/* Sequences of footprint fp that an empty allocator of a->arena_bytes takes. 0 or -ENOMEM. */
static int count_fits(struct vase_alloc *a, const struct vase_layout *l,
                      const struct vase_layout_footprint *fp, uint64_t *ret) {
    uint32_t *kv = malloc((size_t)(fp->kv_pages ? fp->kv_pages : 1) * sizeof(uint32_t));
    uint32_t *ring = malloc((size_t)(fp->ring_pages ? fp->ring_pages : 1) * sizeof(uint32_t));
    uint32_t plan[1];
    int r = 0;
    uint64_t n = 0, bytes = 0;

    if (!kv || !ring) {
        r = -ENOMEM;
        goto out;
    }
    /* The pages are never released: every reservation takes new ones, as opens that stay. */
    for (;;) {
        struct vase_alloc_req parts[3] = {
            {.unit = l->page_bytes, .n = fp->kv_pages, .ret = kv},
            {.unit = l->ring_page_bytes, .n = fp->ring_pages, .ret = ring},
            {.unit = fp->plan.plan_page_bytes, .n = fp->plan.plan_pages, .ret = plan},
        };
        r = vase_alloc_reserve(a, parts, 3, 0, &bytes);
        if (r == -ENOSPC) {
            r = 0;
            break;
        }
        if (r < 0)
            goto out;
        n++;
    }
    *ret = n;
out:
    free(kv);
    free(ring);
    return r;
}

int vase_size_seq(const struct vase_geometry *g, const struct vase_seq_config *cfg,
                  uint64_t arena_bytes, uint64_t granule_bytes, struct vase_size *ret, char *msg,
                  size_t msg_size) {
    struct vase_layout l;
    struct vase_layout_footprint fp;
    struct vase_alloc *a;
    char why[256];
    uint64_t seqs;

    if (msg && msg_size)
        msg[0] = '\0';
    if (!g || !cfg || !ret)
        return vase_layout_refuse(msg, msg_size, "no geometry, configuration or result pointer");
    if (granule_bytes < 4096 || granule_bytes % 4096 != 0)
        return vase_layout_refuse(
            msg, msg_size, "granule_bytes must be a multiple of 4096 (granule_bytes %" PRIu64 ")",
            granule_bytes);
    if (arena_bytes == 0 || arena_bytes % granule_bytes != 0 ||
        arena_bytes / granule_bytes > INT32_MAX)
        return vase_layout_refuse(
            msg, msg_size,
            "arena_bytes must be a multiple of granule_bytes (arena_bytes %" PRIu64
            ", granule_bytes %" PRIu64 ")",
            arena_bytes, granule_bytes);
    if (vase_params_explain_prompt(&cfg->params, cfg->policy, cfg->prompt_len, why, sizeof(why)) <
        0)
        return vase_layout_refuse(msg, msg_size, "%s", why);
    if (cfg->slack < -1)
        return vase_layout_refuse(msg, msg_size, "slack must be >= -1 (slack %d)", (int)cfg->slack);
    struct vase_layout_geometry lg;
    vase__geometry_layout(g, &lg);
    int r = vase_layout_compute(&lg, arena_bytes, &l, msg, msg_size);
    if (r < 0)
        return r;
    uint32_t W = cfg->params.window;
    uint32_t slack = cfg->slack < 0 ? W : (uint32_t)cfg->slack;
    r = vase_layout_footprint(&l, vase_policy_needs(cfg->policy) & VASE_NEEDS_Q, cfg->prompt_len,
                              cfg->params.budget, W, slack, vase_plan_keep_count(&cfg->params), &fp,
                              msg, msg_size);
    if (r < 0)
        return r;
    r = vase_alloc_new(arena_bytes, granule_bytes, &a);
    if (r < 0)
        return r;
    r = count_fits(a, &l, &fp, &seqs);
    vase_alloc_free(a);
    if (r < 0)
        return r;
    *ret = (struct vase_size){
        .token_bytes = 2 * l.layers * l.token_stride,
        .page_bytes = l.page_bytes,
        .slots = (uint32_t)vase_layout_open_slots(cfg->prompt_len, cfg->params.budget, W, slack),
        .kv_pages = fp.kv_pages,
        .ring_pages = fp.ring_pages,
        .ring_page_bytes = l.ring_page_bytes,
        .plan_page_bytes = fp.plan.plan_page_bytes,
        .seq_bytes = fp.bytes,
        .seqs = seqs,
    };
    return 0;
}
