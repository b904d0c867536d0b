/* SPDX-License-Identifier: MIT */
#pragma once

/* The arithmetic of PROTOCOL.md "Memory" and ALGORITHM.md "When eviction runs": where a
 * model's K, V, queries and plans live in an arena, and when a sequence evicts. Pure functions,
 * no I/O, so the unit tests check them against hand-computed numbers. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vase.h"

/* A model's layout in its arena: the daemon's ModelLayout plus the geometry it follows from. */
struct vase__layout {
    uint32_t layers, q_heads, kv_heads, head_dim;
    enum vase_dtype dtype;
    uint32_t tokens_per_page;
    uint32_t ring_rows_per_page; /* 0: a page cannot hold one query row of every layer */
    uint64_t page_bytes;
    uint64_t layer_stride, kv_stride, token_stride, head_stride;
    uint64_t ring_layer_stride, ring_row_stride;
};

/* The layout PROTOCOL.md prescribes for geometry g (align 0 counts as 1) in pages of page_bytes.
 * 0 and *ret; -EINVAL if the geometry is invalid or a page cannot hold one aligned group of
 * tokens. */
int vase__layout_compute(const struct vase_geometry *g, uint64_t page_bytes,
                         struct vase__layout *ret);

/* Byte offset in the arena of (slot, kv_head) of layer's K or V; slot must be below
 * n_pages * tokens_per_page. */
uint64_t vase__layout_kv_offset(const struct vase__layout *l, const uint32_t *pages, uint32_t layer,
                                enum vase_kv kv, uint32_t slot, uint32_t kv_head);
/* The view of one layer's K or V over a sequence's block table, arena mapped at arena_base.
 * The view points at pages; it stays valid while pages does. */
struct vase_view vase__layout_kv_view(const struct vase__layout *l, void *arena_base,
                                      const uint32_t *pages, uint32_t layer, enum vase_kv kv);

/* The query ring entry of the token at position pos: pos % (2 * window). */
uint32_t vase__ring_entry(uint64_t pos, uint32_t window);
/* Byte offset in the arena of the query of q_head of layer for the token at position pos. */
uint64_t vase__layout_query_offset(const struct vase__layout *l, const uint32_t *ring_pages,
                                   uint32_t window, uint32_t layer, uint64_t pos, uint32_t q_head);
/* Query ring pages needed for 2 * window entries; 0 if ring_rows_per_page is 0. */
size_t vase__layout_ring_pages(const struct vase__layout *l, uint32_t window);

/* Keep lists per plan page: floor(page_bytes / (4 * keep)). */
uint32_t vase__plans_per_page(uint64_t page_bytes, uint32_t keep);
/* Byte offset in the arena of keep list i = layer * kv_heads + head. */
uint64_t vase__plan_offset(uint64_t page_bytes, const uint32_t *plan_pages, uint32_t plans_per_page,
                           uint32_t keep, uint32_t i);

/*
 * The trigger rule: after the token at position pos (0-based, counted since the open, prompt
 * included) was appended and the sequence holds len slots, an eviction is due if the token is
 * a decode token (pos >= prompt_len), len > budget and len % window == 0.
 */
bool vase__evict_due(uint64_t pos, uint32_t prompt_len, uint32_t len, uint32_t budget,
                     uint32_t window);
/* ring_first of an EvictRequest sent when pos_after tokens have been appended:
 * the entry of the oldest of the window's queries, (pos_after - window) % (2 * window).
 * pos_after must be >= window. */
uint32_t vase__ring_first(uint64_t pos_after, uint32_t window);
