/* SPDX-License-Identifier: MIT */

/*
 * What a sequence hands the engine to reach its memory: views and pointers into the arena
 * through its block table and ring pages (the formulas of vase_layout.h, which the daemon
 * computes too), the engine's CUDA stream and ordering, and the convenience copies of K, V and
 * query rows for engines that do not write the arena themselves (memcpy on the host arena, a copy
 * on the engine's stream on a device one). The block table read here changes only under the
 * client's lock, when a commit's reply arrives (cycle.c); the ring pages never after the open.
 */

#include <errno.h>
#include <string.h>

#include "internal.h"

/* ---- views ---- */

int vase_seq_kv_view(const struct vase_seq *s, uint32_t layer, enum vase_kv kv,
                     struct vase_view *ret) {
    int r = 0;

    if (!s)
        return -EINVAL;
    vase__client_lock(s->client);
    if (!ret || (kv != VASE_K && kv != VASE_V) || layer >= s->model->layout.layers)
        r = vase__client_fail(s->client, -EINVAL,
                              "vase_seq_kv_view: layer %u of %u, kv %d, result pointer %s", layer,
                              s->model->layout.layers, (int)kv, ret ? "given" : "NULL");
    else
        *ret = vase_layout_kv_view(&s->model->layout, s->model->arena->map, s->pages, layer, kv);
    pthread_mutex_unlock(&s->client->lock);
    return r;
}

void *vase_seq_kv_ptr(const struct vase_seq *s, uint32_t layer, enum vase_kv kv, uint32_t slot,
                      uint32_t kv_head) {
    if (!s || (kv != VASE_K && kv != VASE_V))
        return NULL;
    const struct vase_layout *l = &s->model->layout;
    if (layer >= l->layers || kv_head >= l->kv_heads)
        return NULL;
    void *p = NULL;
    pthread_mutex_lock(&s->client->lock);
    if (slot < s->capacity)
        p = (char *)s->model->arena->map +
            vase_layout_kv_offset(l, s->pages, layer, kv, slot, kv_head);
    pthread_mutex_unlock(&s->client->lock);
    return p;
}

int vase_seq_block_table(const struct vase_seq *s, const int32_t **ret_table, uint32_t *ret_n) {
    if (!s)
        return -EINVAL;
    int r = 0;
    vase__client_lock(s->client);
    if (!ret_table || !ret_n) {
        r = vase__client_fail(s->client, -EINVAL, "vase_seq_block_table: NULL result pointer");
    } else {
        /* Block indices are below 2^31 (vase_layout.h): the same bits as int32. */
        *ret_table = (const int32_t *)s->pages;
        *ret_n = (uint32_t)s->n_pages;
    }
    pthread_mutex_unlock(&s->client->lock);
    return r;
}

const int32_t *vase_seq_block_table_device(const struct vase_seq *s) {
    return s ? (const int32_t *)vase__cuda_seq_table(s->cuda) : NULL;
}

void *vase_seq_query_ptr(const struct vase_seq *s, uint32_t layer, uint64_t pos, uint32_t q_head) {
    if (!s || s->n_ring_pages == 0)
        return NULL;
    const struct vase_layout *l = &s->model->layout;
    if (layer >= l->layers || q_head >= l->q_heads)
        return NULL;
    /* The ring pages never change after the open: no lock needed. */
    return (char *)s->model->arena->map +
           vase_layout_query_offset(l, s->ring_pages, s->window, layer, pos, q_head);
}

/* ---- the engine's stream and convenience copies ---- */

int vase_seq_set_stream(struct vase_seq *s, void *cuda_stream) {
    if (!s)
        return -EINVAL;
    vase__client_lock(s->client);
    s->stream = cuda_stream;
    vase__cuda_seq_set_stream(s->cuda, cuda_stream);
    pthread_mutex_unlock(&s->client->lock);
    return 0;
}

int vase_seq_set_ordering(struct vase_seq *s, enum vase_ordering ordering) {
    int r = 0;

    if (!s)
        return -EINVAL;
    vase__client_lock(s->client);
    if (ordering != VASE_ORDER_HOST && ordering != VASE_ORDER_STREAM)
        r = vase__client_fail(s->client, -EINVAL, "vase_seq_set_ordering: ordering %d",
                              (int)ordering);
    else
        s->ordering = ordering; /* what is queued still goes out as before */
    pthread_mutex_unlock(&s->client->lock);
    return r;
}

/* Copies n bytes between the host buffer buf and offset off of the sequence's arena: memcpy on
 * the host arena, a copy on the engine's stream (waited for) on a device arena. Lock held. */
static int arena_copy(struct vase_seq *s, uint64_t off, void *buf, size_t n, bool to_arena) {
    char *at = (char *)s->model->arena->map + off;

    if (s->cuda)
        return vase__cuda_copy(s->model->arena->device, s->stream, to_arena ? at : buf,
                               to_arena ? buf : at, n, to_arena);
    if (to_arena)
        memcpy(at, buf, n);
    else
        memcpy(buf, at, n);
    return 0;
}

/* K and V rows of (layer, slot), every KV head, from or to the host buffers k and v. */
static int kv_copy(struct vase_seq *s, uint32_t layer, uint32_t slot, void *k, void *v,
                   bool to_arena) {
    int r;

    if (!s)
        return -EINVAL;
    const struct vase_layout *l = &s->model->layout;
    /* A token's heads are contiguous ([token][kv_head][dim]): one copy each for K and V. */
    size_t bytes = (size_t)l->token_stride;
    vase__client_lock(s->client);
    if (!k || !v || layer >= l->layers || slot >= s->capacity) {
        r = vase__client_fail(s->client, -EINVAL, "%s: layer %u of %u, slot %u of %u%s",
                              to_arena ? "vase_seq_write_kv" : "vase_seq_read_kv", layer, l->layers,
                              slot, s->capacity, k && v ? "" : ", a NULL buffer");
        goto out;
    }
    r = arena_copy(s, vase_layout_kv_offset(l, s->pages, layer, VASE_K, slot, 0), k, bytes,
                   to_arena);
    if (r == 0)
        r = arena_copy(s, vase_layout_kv_offset(l, s->pages, layer, VASE_V, slot, 0), v, bytes,
                       to_arena);
out:
    pthread_mutex_unlock(&s->client->lock);
    return r;
}

int vase_seq_write_kv(struct vase_seq *s, uint32_t layer, uint32_t slot, const void *k,
                      const void *v) {
    return kv_copy(s, layer, slot, (void *)k, (void *)v, true);
}

int vase_seq_read_kv(struct vase_seq *s, uint32_t layer, uint32_t slot, void *k, void *v) {
    return kv_copy(s, layer, slot, k, v, false);
}

int vase_seq_write_query(struct vase_seq *s, uint32_t layer, uint64_t pos, const void *q) {
    int r;

    if (!s)
        return -EINVAL;
    const struct vase_layout *l = &s->model->layout;
    vase__client_lock(s->client);
    if (s->n_ring_pages == 0)
        r = vase__client_fail(s->client, -EINVAL,
                              "vase_seq_write_query: policy %s reads no queries",
                              vase_policy_to_string(s->policy));
    else if (!q || layer >= l->layers)
        r = vase__client_fail(s->client, -EINVAL, "vase_seq_write_query: layer %u of %u%s", layer,
                              l->layers, q ? "" : ", no query");
    else
        /* A ring entry's query heads are contiguous ([entry][q_head][dim]). */
        r = arena_copy(s, vase_layout_query_offset(l, s->ring_pages, s->window, layer, pos, 0),
                       (void *)q, (size_t)l->ring_row_stride, true);
    pthread_mutex_unlock(&s->client->lock);
    return r;
}
