/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * A paged decode-attention kernel for the benchmarks of tests/gpu: one query token per query
 * head attends over len cached tokens of one layer, K and V read through the block table in
 * vase's layout (kernels/vase_layout.h), grouped-query attention (query head h reads KV head
 * h / (hq / kv_heads)). It stands in for an engine's attention in bench_decode_gpu: a plain
 * split-K kernel, not FlashAttention, so its time is an upper bound on a tuned engine's. The
 * emulation (tests/gpu/emu) and bench_decode_gpu check it against a float64 CPU reference.
 */

#include <stddef.h>
#include <stdint.h>

#include "vase_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Keys per split when decode_attn.split_keys is 0. */
#define DECODE_ATTN_SPLIT_KEYS 256u
/* The largest head_dim the kernel takes. */
#define DECODE_ATTN_MAX_DIM 256u

/* One layer's attention for seqs sequences of len tokens each. Every pointer reached is DEVICE
 * memory; the views are of the layer's K and V with the block table of sequence 0 as pages. */
struct decode_attn {
    struct vase_view k, v;
    uint32_t table_stride; /* block-table entries from one sequence's table to the next */
    uint32_t seqs, len, hq;
    uint32_t split_keys; /* keys per split; 0: DECODE_ATTN_SPLIT_KEYS */
    const void *q;       /* [seqs][hq][dim], k.dtype */
    float *out;          /* [seqs][hq][dim]: softmax(q K^T / sqrt(dim)) V */
    void *scratch;       /* decode_attn_scratch_bytes() bytes */
};

/* Bytes of scratch a decode_attn_cuda() call with these parameters needs. */
size_t decode_attn_scratch_bytes(const struct decode_attn *a);

/* Enqueues the attention on stream (a cudaStream_t) without waiting for it. 0; -EINVAL for bad
 * parameters (nothing queued); a CUDA error as vase_cuda_errno() maps it. */
int decode_attn_cuda(const struct decode_attn *a, void *stream);

#ifdef __cplusplus
}
#endif
