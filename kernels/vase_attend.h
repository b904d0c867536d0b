/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * Paged attention on the CPU: the attention of a batch's new queries over the slots each
 * sequence holds in a host arena, read in place through its block table (no gather, no copy).
 * The engines of the Python binding (vase.torch's "paged-cpu") call it once per layer and step.
 *
 * This header includes nothing of vase: the binding, which builds against the public vase.h,
 * includes it beside that header.
 */

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The element type of the arena's K and V. */
enum vase_attend_dtype {
    VASE_ATTEND_F32,
    VASE_ATTEND_F16,
    VASE_ATTEND_BF16,
};

/* One layer's K and V in the arena, each a strided [blocks][block_tokens][kv_heads][head_dim]
 * array whose last dimension is contiguous. Strides are in elements. */
struct vase_attend_cache {
    const void *k, *v;
    enum vase_attend_dtype dtype;
    uint32_t blocks, block_tokens, kv_heads, head_dim;
    int64_t k_stride[3], v_stride[3]; /* block, token, head */
};

/* The batch: b sequences of n query columns of q_heads heads (a multiple of kv_heads; group
 * q_heads / kv_heads query heads share a KV head). */
struct vase_attend_batch {
    const float *q;         /* [b][n][q_heads][head_dim], contiguous */
    const int32_t *table;   /* [b][width]: sequence i's j-th block of the arena */
    const int32_t *visible; /* [b][n]: query j of sequence i sees its slots 0 .. visible - 1 */
    uint32_t b, n, q_heads, width;
    float scale; /* the scores' factor, 1/sqrt(head_dim) for plain attention */
};

/*
 * out [b][n][q_heads][head_dim] (contiguous) = softmax(scale * q k^T) v over the slots each query
 * sees, in float32 (the arena's elements are widened as read; the softmax subtracts its row's
 * maximum). A query that sees no slot (visible 0) gets zeros. Slots past what a query sees,
 * table entries past the blocks those take and every other block are never read, so they may
 * hold anything, NaN included.
 *
 * Returns 0, -EINVAL when a visible count is beyond the table (over width * block_tokens, or
 * negative) or a table entry a query needs is not a block of the cache (why says which, out is
 * untouched: everything is checked before anything is written), -ENOMEM when scratch memory
 * cannot be had.
 */
int vase_paged_attention(const struct vase_attend_cache *cache,
                         const struct vase_attend_batch *batch, float *out, char *why,
                         size_t why_size);

/* The checks vase_paged_attention() makes before it computes anything (the arguments, every
 * visible count and every table entry a query reads): 0, or -EINVAL with why. A caller that
 * splits a batch across threads checks the whole of it first, so that a refusal leaves all of
 * out untouched. */
int vase_paged_attention_check(const struct vase_attend_cache *cache,
                               const struct vase_attend_batch *batch, char *why, size_t why_size);

#ifdef __cplusplus
}
#endif
