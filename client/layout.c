/* SPDX-License-Identifier: MIT */

/*
 * Layout arithmetic. Everything here follows PROTOCOL.md "Memory" to the letter, because the
 * daemon computes the same numbers independently: the client checks the daemon's ModelLayout
 * against vase__layout_compute() and refuses a mismatch rather than write KV where the daemon
 * will not read it. Offsets are 64-bit: an arena spans far more than 4 GiB.
 */

#include <errno.h>

#include "layout.h"

int vase__layout_compute(const struct vase_geometry *g, uint64_t page_bytes,
                         struct vase__layout *ret) {
    if (!g || !ret || page_bytes == 0)
        return -EINVAL;
    size_t es = vase_dtype_size(g->dtype);
    if (es == 0 || g->layers == 0 || g->q_heads == 0 || g->kv_heads == 0 || g->head_dim == 0 ||
        g->kv_heads > VASE_MAX_HEADS || g->q_heads > VASE_MAX_HEADS || g->head_dim > VASE_MAX_DIM ||
        g->q_heads % g->kv_heads != 0)
        return -EINVAL;
    uint32_t align = g->align ? g->align : 1;

    uint64_t token_stride = (uint64_t)g->kv_heads * g->head_dim * es;
    /* A layer count in the millions would overflow nothing below (token_stride < 2^23), but a
     * page must hold at least one token of every layer. */
    uint64_t per_token = (uint64_t)g->layers * 2 * token_stride;
    uint64_t tpp = page_bytes / per_token;
    tpp -= tpp % align;
    if (tpp == 0 || tpp > UINT32_MAX)
        return -EINVAL;

    uint64_t ring_row = (uint64_t)g->q_heads * g->head_dim * es;
    uint64_t rows = page_bytes / ((uint64_t)g->layers * ring_row);
    if (rows > UINT32_MAX)
        rows = UINT32_MAX;

    *ret = (struct vase__layout){
        .layers = g->layers,
        .q_heads = g->q_heads,
        .kv_heads = g->kv_heads,
        .head_dim = g->head_dim,
        .dtype = g->dtype,
        .tokens_per_page = (uint32_t)tpp,
        .ring_rows_per_page = (uint32_t)rows,
        .page_bytes = page_bytes,
        .token_stride = token_stride,
        .head_stride = (uint64_t)g->head_dim * es,
        .kv_stride = tpp * token_stride,
        .layer_stride = 2 * tpp * token_stride,
        .ring_row_stride = ring_row,
        .ring_layer_stride = rows * ring_row,
    };
    return 0;
}

uint64_t vase__layout_kv_offset(const struct vase__layout *l, const uint32_t *pages, uint32_t layer,
                                enum vase_kv kv, uint32_t slot, uint32_t kv_head) {
    uint64_t page = pages[slot / l->tokens_per_page];
    uint64_t token = slot % l->tokens_per_page;
    return page * l->page_bytes + layer * l->layer_stride + (kv == VASE_V ? l->kv_stride : 0) +
           token * l->token_stride + kv_head * l->head_stride;
}

struct vase_view vase__layout_kv_view(const struct vase__layout *l, void *arena_base,
                                      const uint32_t *pages, uint32_t layer, enum vase_kv kv) {
    uint64_t off = layer * l->layer_stride + (kv == VASE_V ? l->kv_stride : 0);
    return (struct vase_view){
        .base = (char *)arena_base + off,
        .pages = pages,
        .tokens_per_page = l->tokens_per_page,
        .ring = 0,
        .first = 0,
        .heads = l->kv_heads,
        .dim = l->head_dim,
        .dtype = l->dtype,
        .page_stride = (int64_t)l->page_bytes,
        .token_stride = (int64_t)l->token_stride,
        .head_stride = (int64_t)l->head_stride,
    };
}

uint32_t vase__ring_entry(uint64_t pos, uint32_t window) {
    return (uint32_t)(pos % (2 * (uint64_t)window));
}

uint64_t vase__layout_query_offset(const struct vase__layout *l, const uint32_t *ring_pages,
                                   uint32_t window, uint32_t layer, uint64_t pos, uint32_t q_head) {
    uint32_t e = vase__ring_entry(pos, window);
    uint64_t page = ring_pages[e / l->ring_rows_per_page];
    uint64_t row = e % l->ring_rows_per_page;
    return page * l->page_bytes + layer * l->ring_layer_stride + row * l->ring_row_stride +
           q_head * l->head_stride;
}

size_t vase__layout_ring_pages(const struct vase__layout *l, uint32_t window) {
    if (l->ring_rows_per_page == 0)
        return 0;
    uint64_t entries = 2 * (uint64_t)window;
    return (size_t)((entries + l->ring_rows_per_page - 1) / l->ring_rows_per_page);
}

uint32_t vase__plans_per_page(uint64_t page_bytes, uint32_t keep) {
    if (keep == 0)
        return 0;
    uint64_t n = page_bytes / (4 * (uint64_t)keep);
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

uint64_t vase__plan_offset(uint64_t page_bytes, const uint32_t *plan_pages, uint32_t plans_per_page,
                           uint32_t keep, uint32_t i) {
    uint64_t page = plan_pages[i / plans_per_page];
    return page * page_bytes + (uint64_t)(i % plans_per_page) * 4 * keep;
}

bool vase__evict_due(uint64_t pos, uint32_t prompt_len, uint32_t len, uint32_t budget,
                     uint32_t window) {
    return window > 0 && pos >= prompt_len && len > budget && len % window == 0;
}

uint32_t vase__ring_first(uint64_t pos_after, uint32_t window) {
    return vase__ring_entry(pos_after - window, window);
}
