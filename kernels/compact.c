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
    uint8_t *seen = calloc((size_t)n + 1, 1);
    if (!seen)
        return -ENOMEM;
    int r = 0;
    for (uint32_t h = 0; h < heads && r == 0; h++) {
        const uint32_t *k = keep + (size_t)h * K;
        for (uint32_t i = 0; i < K; i++) {
            if (k[i] >= n || seen[k[i]]) {
                r = -EINVAL;
                break;
            }
            seen[k[i]] = 1;
        }
        for (uint32_t i = 0; i < K; i++)
            if (k[i] < n)
                seen[k[i]] = 0;
    }
    free(seen);
    return r;
}

int vase_compact(struct vase_view *view, const uint32_t *keep, uint32_t K, uint32_t n,
                 uint32_t len) {
    if (!view || !keep || K > n || n > len || vase__view_check(view, len) < 0)
        return -EINVAL;
    int r = vase_plan_validate(keep, view->heads, K, n);
    if (r < 0)
        return r;

    size_t row_bytes = (size_t)view->dim * vase_dtype_size(view->dtype);
    char *buf = malloc((size_t)K * row_bytes + 1);
    if (!buf)
        return -ENOMEM;
    for (uint32_t h = 0; h < view->heads; h++) {
        const uint32_t *k = keep + (size_t)h * K;
        for (uint32_t i = 0; i < K; i++)
            memcpy(buf + i * row_bytes, vase__row(view, k[i], h), row_bytes);
        for (uint32_t t = 0; K < n && t < len - n; t++)
            memcpy(vase__row(view, K + t, h), vase__row(view, n + t, h), row_bytes);
        for (uint32_t i = 0; i < K; i++)
            if (k[i] != i)
                memcpy(vase__row(view, i, h), buf + i * row_bytes, row_bytes);
    }
    free(buf);
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
