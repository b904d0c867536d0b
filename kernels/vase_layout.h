/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The memory layout of vase (PROTOCOL.md "Memory"), in one place: the daemon and libvase both
 * compile this file, and every formula about where a model's K, V, queries and plans live in an
 * arena, how many pages a sequence needs, and the per-layer tensors an attention kernel reads is
 * here and nowhere else. Pure functions, no I/O, no allocation.
 *
 * A model registers its block size B (block_tokens, the page size of its attention kernel). One
 * page holds B tokens of every layer, ordered [layer][K,V][token][kv_head][dim]:
 *
 *     page_bytes   = B * layers * 2 * kv_heads * head_dim * dtype_bytes
 *     token_stride = kv_heads * head_dim * dtype_bytes
 *     kv_stride    = B * token_stride            (V after K, inside a layer)
 *     layer_stride = 2 * B * token_stride        (= 2 * kv_stride)
 *
 * Page (block) i of a model starts at byte i * page_bytes of the arena: the daemon places every
 * page at a multiple of its model's page_bytes. So K of layer l, over the whole arena, is one
 * strided tensor [num_blocks][B][kv_heads][head_dim] at byte offset l * layer_stride, block
 * stride page_bytes, and V the same at + kv_stride; a sequence's block table lists block indices
 * into it. No padding is added: rows are aligned to their element size, and to 16 bytes whenever
 * head_dim * dtype_bytes is a multiple of 16 (every real model).
 *
 * The query ring of a sequence (attention policies) holds 2 * window entries of every layer in
 * ring pages of ring_rows_per_page entries, ordered [layer][entry][q_head][dim]; ring page j
 * starts at j * ring_page_bytes. A ring page is one of the model's pages (ring_page_bytes =
 * page_bytes, ring_rows_per_page = the entries that fit one) unless one entry of every layer is
 * larger than a page; then it is exactly one entry. The plan area is one plan page holding the keep
 * lists [layers * kv_heads][keep] (uint32): plan_page_bytes is the smallest power of two, at least
 * 4096 (and arena_bytes / 2^26), that holds them, so that sequences of every model share a few plan
 * page sizes; plan page j starts at j * plan_page_bytes.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vase_types.h"

#define VASE_LAYOUT_MAX_LAYERS 1024u
#define VASE_LAYOUT_MAX_BLOCK_TOKENS 65536u
#define VASE_LAYOUT_DEFAULT_BLOCK_TOKENS 16u
/* Most pages of one size an arena may hold (2^26): block indices fit int32 for the kernels, and
 * the daemon's books of one page size stay small. */
#define VASE_LAYOUT_MAX_UNITS ((uint64_t)1 << 26)
/* The smallest plan page. */
#define VASE_LAYOUT_MIN_PLAN_BYTES 4096u

/* What a model registers. block_tokens 0 means VASE_LAYOUT_DEFAULT_BLOCK_TOKENS. */
struct vase_layout_geometry {
    uint32_t layers, q_heads, kv_heads, head_dim;
    enum vase_dtype dtype;
    uint32_t block_tokens;
};

struct vase_layout {
    uint32_t layers, q_heads, kv_heads, head_dim;
    enum vase_dtype dtype;
    uint32_t block_tokens; /* tokens per page, exactly */
    uint64_t arena_bytes;
    uint64_t page_bytes;
    uint32_t num_blocks; /* floor(arena_bytes / page_bytes) */
    uint64_t token_stride, head_stride, kv_stride, layer_stride;
    /* Query ring: ring_rows_per_page >= 1 entries of every layer per ring page. */
    uint32_t ring_rows_per_page;
    uint64_t ring_row_stride;   /* q_heads * head_dim * dtype_bytes */
    uint64_t ring_layer_stride; /* ring_rows_per_page * ring_row_stride */
    uint64_t ring_page_bytes;   /* page_bytes, or one entry of every layer when that is more */
};

/* The plan area of a sequence whose plans keep `keep` slots. */
struct vase_plan_layout {
    uint32_t keep;
    uint32_t lists;          /* layers * kv_heads */
    uint32_t plans_per_page; /* lists: every list in the one plan page */
    uint64_t plan_page_bytes;
    uint32_t plan_pages; /* 1 */
};

/*
 * The layout of geometry g in an arena of arena_bytes. 0 and *ret, or -EINVAL with the reason
 * (and what to change) written to msg[0 .. msg_size) when the geometry is out of bounds or one
 * page of block_tokens tokens does not fit the arena.
 */
int vase_layout_compute(const struct vase_layout_geometry *g, uint64_t arena_bytes,
                        struct vase_layout *ret, char *msg, size_t msg_size);

/* Pages (blocks) of the block table a sequence holds to have room for `slots` slots. */
uint32_t vase_layout_blocks_for(const struct vase_layout *l, uint64_t slots);
/* Slots a sequence reserves at open: max(prompt_len, budget) + window + slack. */
uint64_t vase_layout_open_slots(uint32_t prompt_len, uint32_t budget, uint32_t window,
                                uint32_t slack);
/* Slots of the steady state, kept after the first eviction: budget + window + slack. */
uint64_t vase_layout_steady_slots(uint32_t budget, uint32_t window, uint32_t slack);

/* Ring pages for 2 * window entries (0 for window 0). *ret_fits (may be NULL) says whether a
 * ring page fits the arena at all; when it does not, the count is 0. */
uint32_t vase_layout_ring_pages(const struct vase_layout *l, uint32_t window, bool *ret_fits);
/* The plan area for keep slots. -EINVAL with msg when a plan page does not fit the arena. */
int vase_layout_plans(const struct vase_layout *l, uint32_t keep, struct vase_plan_layout *ret,
                      char *msg, size_t msg_size);

/*
 * What a sequence holds from its open on (the daemon reserves it whole, vasectl size and
 * vase_size_seq() count it): the KV pages of max(prompt_len, budget) + window + slack slots, the
 * query ring's pages when ring (the policy reads queries: VASE_NEEDS_Q), and the plan page of
 * keep slots. Pages are whole: the slots round up to block_tokens.
 */
struct vase_layout_footprint {
    uint32_t kv_pages, ring_pages;
    struct vase_plan_layout plan;
    uint64_t bytes; /* kv_pages * page_bytes + ring_pages * ring_page_bytes + the plan page */
};
/* 0 and *ret, or -EINVAL with the reason in msg: a capacity beyond 32 bits, a ring page or a
 * plan page that does not fit the arena. */
int vase_layout_footprint(const struct vase_layout *l, bool ring, uint32_t prompt_len,
                          uint32_t budget, uint32_t window, uint32_t slack, uint32_t keep,
                          struct vase_layout_footprint *ret, char *msg, size_t msg_size);

/* Units of unit_bytes an arena of arena_bytes holds: the bound of every page index. */
uint64_t vase_layout_units(uint64_t arena_bytes, uint64_t unit_bytes);

/* Byte offset in the arena of (slot, kv_head) of layer's K or V through block table `table`. */
uint64_t vase_layout_kv_offset(const struct vase_layout *l, const uint32_t *table, uint32_t layer,
                               enum vase_kv kv, uint32_t slot, uint32_t kv_head);
/* The view of one layer's K or V through block table `table`, arena mapped at arena_base. */
struct vase_view vase_layout_kv_view(const struct vase_layout *l, void *arena_base,
                                     const uint32_t *table, uint32_t layer, enum vase_kv kv);

/* The ring entry of the token at position pos: pos % (2 * window). */
uint32_t vase_layout_ring_entry(uint64_t pos, uint32_t window);
/* The ring entry of the oldest of the window's queries when pos_after tokens were appended:
 * (pos_after - window) % (2 * window); pos_after >= window. */
uint32_t vase_layout_ring_first(uint64_t pos_after, uint32_t window);
/* Byte offset in the arena of the query of q_head of layer for the token at position pos. */
uint64_t vase_layout_query_offset(const struct vase_layout *l, const uint32_t *ring_pages,
                                  uint32_t window, uint32_t layer, uint64_t pos, uint32_t q_head);
/* The view of layer's window of queries, the oldest at ring entry first. */
struct vase_view vase_layout_query_view(const struct vase_layout *l, void *arena_base,
                                        const uint32_t *ring_pages, uint32_t window, uint32_t first,
                                        uint32_t layer);

/* Byte offset in the arena of keep list i (= layer * kv_heads + head). */
uint64_t vase_layout_plan_offset(const struct vase_plan_layout *p, const uint32_t *plan_pages,
                                 uint32_t i);

/*
 * One layer's K or V of the whole arena as a 4-d strided tensor [num_blocks][block_tokens]
 * [kv_heads][head_dim]: its byte offset from the arena base, shape, and strides in elements and
 * in bytes (the block stride is page_bytes).
 */
struct vase_layout_tensor {
    uint64_t offset;
    int64_t shape[4];
    int64_t strides[4];      /* elements */
    int64_t byte_strides[4]; /* bytes */
};
void vase_layout_kv_tensor(const struct vase_layout *l, uint32_t layer, enum vase_kv kv,
                           struct vase_layout_tensor *ret);

/*
 * The trigger rule: after the token at position pos (0-based, counted since the open, prompt
 * included) was appended and the sequence holds len slots, an eviction is due if the token is
 * a decode token (pos >= prompt_len), len > budget and len % window == 0.
 */
bool vase_layout_evict_due(uint64_t pos, uint32_t prompt_len, uint32_t len, uint32_t budget,
                           uint32_t window);

/*
 * Formats the reason for a refusal into msg (msg_size bytes; msg may be NULL) and returns
 * -EINVAL: the one helper of every check that explains its refusal (the layout, the policy
 * parameters, libvase's sizes).
 */
__attribute__((format(printf, 3, 4))) int vase_layout_refuse(char *msg, size_t msg_size,
                                                             const char *fmt, ...);
