/* SPDX-License-Identifier: MIT */

/*
 * Selection: top-k with the canonical tie order (descending value, ties in ascending index)
 * and sampling without replacement by the exponential race. Both reduce to one stable sort of
 * (key, index) pairs: a least-significant-digit radix sort over order-preserving integer keys,
 * O(n) and branch-light, so that a plan's selection never costs O(n log n) comparisons.
 */

#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "internal.h"

/* Maps a float to an unsigned key whose ascending order is the float's descending order;
 * -0 and +0 map alike, so they tie as equal values must. */
static uint32_t desc_key(float f) {
    uint32_t u;
    if (f == 0.0f)
        f = 0.0f;
    memcpy(&u, &f, sizeof(u));
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ~u;
}

#define RADIX_BITS 11
#define RADIX_SIZE (1u << RADIX_BITS)
#define RADIX_MASK (RADIX_SIZE - 1)

/*
 * Sorts m (key, index) pairs stably by key, ascending. keys/idx are sorted in place, with
 * tmp_keys/tmp_idx (m words each) as the second buffer. Three passes of 11 bits; a pass whose
 * digit is the same for every key is skipped.
 */
static void radix_sort(uint32_t *keys, uint32_t *idx, uint32_t *tmp_keys, uint32_t *tmp_idx,
                       uint32_t m) {
    static const unsigned shifts[3] = {0, RADIX_BITS, 2 * RADIX_BITS};
    uint32_t *src_k = keys, *src_i = idx, *dst_k = tmp_keys, *dst_i = tmp_idx;

    for (unsigned p = 0; p < 3; p++) {
        uint32_t count[RADIX_SIZE] = {0};
        unsigned sh = shifts[p];
        for (uint32_t i = 0; i < m; i++)
            count[(src_k[i] >> sh) & RADIX_MASK]++;
        if (m == 0 || count[(src_k[0] >> sh) & RADIX_MASK] == m)
            continue;
        uint32_t sum = 0;
        for (uint32_t b = 0; b < RADIX_SIZE; b++) {
            uint32_t c = count[b];
            count[b] = sum;
            sum += c;
        }
        for (uint32_t i = 0; i < m; i++) {
            uint32_t pos = count[(src_k[i] >> sh) & RADIX_MASK]++;
            dst_k[pos] = src_k[i];
            dst_i[pos] = src_i[i];
        }
        uint32_t *t = src_k;
        src_k = dst_k;
        dst_k = t;
        t = src_i;
        src_i = dst_i;
        dst_i = t;
    }
    if (src_k != keys) {
        memcpy(keys, src_k, (size_t)m * sizeof(*keys));
        memcpy(idx, src_i, (size_t)m * sizeof(*idx));
    }
}

int vase__select_top(const float *key, const uint8_t *exclude, uint32_t len, uint32_t n,
                     uint32_t *out, uint32_t *scratch) {
    uint32_t *k = scratch, *ix = scratch + len, *tk = scratch + 2 * (size_t)len,
             *ti = scratch + 3 * (size_t)len;
    uint32_t m = 0;

    for (uint32_t i = 0; i < len; i++) {
        if (exclude && exclude[i])
            continue;
        k[m] = desc_key(key[i]);
        ix[m] = i; /* ascending index in, so the stable sort keeps ties in ascending index */
        m++;
    }
    if (n > m)
        return -EINVAL;
    radix_sort(k, ix, tk, ti, m);
    memcpy(out, ix, (size_t)n * sizeof(*out));
    return 0;
}

static bool has_nan(const float *x, uint32_t len) {
    bool nan = false;
    for (uint32_t i = 0; i < len; i++)
        nan |= x[i] != x[i];
    return nan;
}

int vase_topk(const float *x, uint32_t len, uint32_t n, uint32_t *out) {
    if (!x || !out || n > len || has_nan(x, len))
        return -EINVAL;
    uint32_t *scratch = malloc(4 * (size_t)len * sizeof(uint32_t) + 1);
    if (!scratch)
        return -ENOMEM;
    int r = vase__select_top(x, NULL, len, n, out, scratch);
    free(scratch);
    return r;
}

int vase__race_keys(const float *w, const float *exp_draws, uint32_t len, float *keys) {
    for (uint32_t i = 0; i < len; i++) {
        float wi = w[i], e = exp_draws[i];
        /* Weights must be non-negative and finite, draws non-negative (Inf is a valid, if
         * unlikely, draw: it ranks the index last among the positive weights). */
        if (!(wi >= 0.0f) || wi == INFINITY || !(e >= 0.0f))
            return -EINVAL;
        /* A zero weight has key 0 whatever its draw, so zeros fill in ascending index; a zero
         * draw with a positive weight is an infinitely early arrival. */
        keys[i] = wi == 0.0f ? 0.0f : wi / e;
    }
    return 0;
}

int vase_sample(const float *w, const float *exp_draws, const uint8_t *exclude, uint32_t len,
                uint32_t n, uint32_t *out) {
    if (!w || !exp_draws || !out || n > len)
        return -EINVAL;
    float *keys = malloc((size_t)len * sizeof(float) + 1);
    uint32_t *scratch = malloc(4 * (size_t)len * sizeof(uint32_t) + 1);
    int r = -ENOMEM;
    if (!keys || !scratch)
        goto out;
    r = vase__race_keys(w, exp_draws, len, keys);
    if (r < 0)
        goto out;
    r = vase__select_top(keys, exclude, len, n, out, scratch);
out:
    free(scratch);
    free(keys);
    return r;
}
