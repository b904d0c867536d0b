/* SPDX-License-Identifier: MIT */

/*
 * Compaction: applies a plan in place (ALGORITHM.md, "Compaction"). Slot i < K receives
 * candidate keep[i]; the tokens appended since the plan's candidates were fixed (old slots
 * n .. len-1) follow in order. The kept candidates are first copied out to a buffer, because
 * their destinations overlap the sources; the tail then moves towards lower slots in ascending
 * order, which never overwrites a slot it has still to read; last the buffer is written back.
 * Everything is validated before the first byte moves.
 */

#include <errno.h>
#include <stdlib.h>

#include "internal.h"

int vase_plan_validate(const uint32_t *keep, uint32_t heads, uint32_t K, uint32_t n) {
    if (!keep || K > n)
        return -EINVAL;
    /* stamp[s] == h + 1 once head h kept slot s: no clearing between heads. */
    uint32_t *stamp = calloc((size_t)n + 1, sizeof(*stamp));
    if (!stamp)
        return -ENOMEM;
    int r = 0;
    for (uint32_t h = 0; h < heads && r == 0; h++) {
        const uint32_t *k = keep + (size_t)h * K;
        for (uint32_t i = 0; i < K; i++) {
            if (k[i] >= n || stamp[k[i]] == h + 1) {
                r = -EINVAL;
                break;
            }
            stamp[k[i]] = h + 1;
        }
    }
    free(stamp);
    return r;
}

/* Rows whose copy is requested this many copies ahead: the kept rows are scattered over the
 * arena, and without it every copy waits on memory. (Measured at the Qwen3-4B shape: asking for
 * the first cache line of a row 8 copies ahead beat 4, 16, 32, and asking for every line.) */
#define COMPACT_AHEAD 8

/*
 * The move, one head at a time, so that the buffer of kept rows (K rows of one head) stays in
 * the cache between the gather and the write-back. The byte offset of every slot is computed
 * once (no division per row), and the scattered rows are requested ahead of their copy.
 */
static void compact_rows(struct vase_view *view, const uint32_t *keep, uint32_t K, uint32_t n,
                         uint32_t len, int64_t *off, char *buf) {
    size_t rb = (size_t)view->dim * vase_dtype_size(view->dtype);
    char *base = view->base;

    for (uint32_t s = 0; s < len; s++)
        off[s] = (char *)vase__row(view, s, 0) - base;

    for (uint32_t h = 0; h < view->heads; h++) {
        const uint32_t *k = keep + (size_t)h * K;
        char *hb = base + h * view->head_stride;
        for (uint32_t i = 0; i < K; i++) {
            if (i + COMPACT_AHEAD < K)
                __builtin_prefetch(hb + off[k[i + COMPACT_AHEAD]], 0, 0);
            memcpy(buf + i * rb, hb + off[k[i]], rb);
        }
        for (uint32_t t = 0; K < n && t < len - n; t++)
            memcpy(hb + off[K + t], hb + off[n + t], rb);
        for (uint32_t i = 0; i < K; i++) {
            if (i + COMPACT_AHEAD < K)
                __builtin_prefetch(hb + off[i + COMPACT_AHEAD], 1, 0);
            if (k[i] != i)
                memcpy(hb + off[i], buf + i * rb, rb);
        }
    }
}

static size_t row_bytes(const struct vase_view *v) {
    return (size_t)v->dim * vase_dtype_size(v->dtype);
}

int vase_compact(struct vase_view *view, const uint32_t *keep, uint32_t K, uint32_t n,
                 uint32_t len) {
    return vase_compact_layer(view, NULL, keep, K, n, len);
}

int vase_compact_layer(struct vase_view *k, struct vase_view *v, const uint32_t *keep, uint32_t K,
                       uint32_t n, uint32_t len) {
    if (!k || !keep || K > n || n > len || vase__view_check(k, len) < 0)
        return -EINVAL;
    if (v && (vase__view_check(v, len) < 0 || v->heads != k->heads))
        return -EINVAL;
    int r = vase_plan_validate(keep, k->heads, K, n);
    if (r < 0)
        return r;

    /* All scratch up front, so nothing can fail between moving K and moving V. */
    size_t rb = row_bytes(k);
    if (v && row_bytes(v) > rb)
        rb = row_bytes(v);
    int64_t *off = malloc((size_t)len * sizeof(*off) + 1);
    char *buf = malloc((size_t)K * rb + 1);
    if (!off || !buf) {
        free(buf);
        free(off);
        return -ENOMEM;
    }
    compact_rows(k, keep, K, n, len, off, buf);
    if (v)
        compact_rows(v, keep, K, n, len, off, buf);
    free(buf);
    free(off);
    return (int)(K + len - n);
}

int vase_compact_f32(float *data, uint32_t heads, size_t stride, const uint32_t *keep, uint32_t K,
                     uint32_t n, uint32_t len) {
    if (!data || !keep || K > n || n > len || len > stride)
        return -EINVAL;
    int r = vase_plan_validate(keep, heads, K, n);
    if (r < 0)
        return r;
    float *buf = malloc((size_t)K * sizeof(float) + 1);
    if (!buf)
        return -ENOMEM;
    for (uint32_t h = 0; h < heads; h++) {
        float *row = data + (size_t)h * stride;
        const uint32_t *k = keep + (size_t)h * K;
        for (uint32_t i = 0; i < K; i++)
            buf[i] = row[k[i]];
        memmove(row + K, row + n, (size_t)(len - n) * sizeof(float));
        memcpy(row, buf, (size_t)K * sizeof(float));
        uint32_t new_len = K + len - n;
        memset(row + new_len, 0, (size_t)(len - new_len) * sizeof(float));
    }
    free(buf);
    return (int)(K + len - n);
}
