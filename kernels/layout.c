/* SPDX-License-Identifier: MIT */

/*
 * The layout formulas of vase_layout.h. Both ends compile this file; libvase still checks the
 * daemon's numbers against its own (a daemon of another build must not make an engine write
 * where the daemon does not read). Offsets are 64-bit: an arena spans far more than 4 GiB.
 */

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

#include "vase_layout.h"

int vase_layout_refuse(char *msg, size_t msg_size, const char *fmt, ...) {
    if (msg && msg_size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, msg_size, fmt, ap);
        va_end(ap);
    }
    return -EINVAL;
}

static uint64_t div_up(uint64_t a, uint64_t b) {
    return a / b + (a % b != 0);
}

uint64_t vase_layout_units(uint64_t arena_bytes, uint64_t unit_bytes) {
    return unit_bytes ? arena_bytes / unit_bytes : 0;
}

int vase_layout_compute(const struct vase_layout_geometry *g, uint64_t arena_bytes,
                        struct vase_layout *ret, char *msg, size_t msg_size) {
    if (!g || !ret)
        return vase_layout_refuse(msg, msg_size, "no geometry");
    size_t es = vase_dtype_size(g->dtype);
    uint32_t B = g->block_tokens ? g->block_tokens : VASE_LAYOUT_DEFAULT_BLOCK_TOKENS;

    if (es == 0)
        return vase_layout_refuse(msg, msg_size, "unknown dtype %d", (int)g->dtype);
    if (g->layers == 0 || g->layers > VASE_LAYOUT_MAX_LAYERS)
        return vase_layout_refuse(msg, msg_size, "layers must be 1 .. %u, not %u",
                                  VASE_LAYOUT_MAX_LAYERS, g->layers);
    if (g->kv_heads == 0 || g->kv_heads > VASE_MAX_HEADS)
        return vase_layout_refuse(msg, msg_size, "kv_heads must be 1 .. %u, not %u", VASE_MAX_HEADS,
                                  g->kv_heads);
    if (g->q_heads == 0 || g->q_heads > VASE_MAX_HEADS)
        return vase_layout_refuse(msg, msg_size, "q_heads must be 1 .. %u, not %u", VASE_MAX_HEADS,
                                  g->q_heads);
    if (g->q_heads % g->kv_heads != 0)
        return vase_layout_refuse(msg, msg_size, "q_heads (%u) must be a multiple of kv_heads (%u)",
                                  g->q_heads, g->kv_heads);
    if (g->head_dim == 0 || g->head_dim > VASE_MAX_DIM)
        return vase_layout_refuse(msg, msg_size, "head_dim must be 1 .. %u, not %u", VASE_MAX_DIM,
                                  g->head_dim);
    if (B > VASE_LAYOUT_MAX_BLOCK_TOKENS)
        return vase_layout_refuse(msg, msg_size, "block_tokens must be 1 .. %u, not %u",
                                  VASE_LAYOUT_MAX_BLOCK_TOKENS, B);

    /* Every product below is bounded: token_stride < 2^23, times 2 * layers < 2^34, times
     * B <= 2^16: page_bytes < 2^50. */
    uint64_t token_stride = (uint64_t)g->kv_heads * g->head_dim * es;
    uint64_t page_bytes = (uint64_t)B * g->layers * 2 * token_stride;
    if (page_bytes > arena_bytes)
        return vase_layout_refuse(msg, msg_size,
                                  "one page of %u tokens (block_tokens) of %u layers is %" PRIu64
                                  " bytes, more than the arena's %" PRIu64
                                  " bytes: use a smaller block_tokens or a larger arena",
                                  B, g->layers, page_bytes, arena_bytes);
    if (arena_bytes / page_bytes > VASE_LAYOUT_MAX_UNITS)
        return vase_layout_refuse(msg, msg_size,
                                  "pages of %" PRIu64
                                  " bytes are too small for an arena of %" PRIu64
                                  " bytes (more than 2^26 blocks): use a larger block_tokens",
                                  page_bytes, arena_bytes);

    /* Ring pages are the model's pages wherever one entry of every layer fits one: then the
     * ring and the KV cache are pages of one size, which pack together. */
    uint64_t ring_row = (uint64_t)g->q_heads * g->head_dim * es;
    uint64_t ring_entry = (uint64_t)g->layers * ring_row;
    uint64_t rows = page_bytes / ring_entry, ring_page_bytes = page_bytes;
    if (rows == 0) {
        rows = 1;
        ring_page_bytes = ring_entry;
    }

    *ret = (struct vase_layout){
        .layers = g->layers,
        .q_heads = g->q_heads,
        .kv_heads = g->kv_heads,
        .head_dim = g->head_dim,
        .dtype = g->dtype,
        .block_tokens = B,
        .arena_bytes = arena_bytes,
        .page_bytes = page_bytes,
        .num_blocks = (uint32_t)(arena_bytes / page_bytes),
        .token_stride = token_stride,
        .head_stride = (uint64_t)g->head_dim * es,
        .kv_stride = B * token_stride,
        .layer_stride = 2 * B * token_stride,
        .ring_rows_per_page = (uint32_t)rows,
        .ring_row_stride = ring_row,
        .ring_layer_stride = rows * ring_row,
        .ring_page_bytes = ring_page_bytes,
    };
    return 0;
}

uint32_t vase_layout_blocks_for(const struct vase_layout *l, uint64_t slots) {
    uint64_t n = div_up(slots, l->block_tokens);
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

uint64_t vase_layout_open_slots(uint32_t prompt_len, uint32_t budget, uint32_t window,
                                uint32_t slack) {
    return (uint64_t)(prompt_len > budget ? prompt_len : budget) + window + slack;
}

uint64_t vase_layout_steady_slots(uint32_t budget, uint32_t window, uint32_t slack) {
    return (uint64_t)budget + window + slack;
}

uint32_t vase_layout_ring_pages(const struct vase_layout *l, uint32_t window, bool *ret_fits) {
    bool fits = l->ring_page_bytes <= l->arena_bytes &&
                vase_layout_units(l->arena_bytes, l->ring_page_bytes) <= VASE_LAYOUT_MAX_UNITS;
    if (ret_fits)
        *ret_fits = fits;
    if (!fits || window == 0)
        return 0;
    uint64_t n = div_up(2 * (uint64_t)window, l->ring_rows_per_page);
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

int vase_layout_plans(const struct vase_layout *l, uint32_t keep, struct vase_plan_layout *ret,
                      char *msg, size_t msg_size) {
    if (keep == 0)
        return vase_layout_refuse(msg, msg_size, "a plan keeps no slot");
    uint32_t lists = l->layers * l->kv_heads; /* < 2^20 */
    uint64_t need = (uint64_t)lists * 4 * keep, bytes = VASE_LAYOUT_MIN_PLAN_BYTES;
    while (bytes < need || l->arena_bytes / bytes > VASE_LAYOUT_MAX_UNITS)
        bytes *= 2;
    if (bytes > l->arena_bytes)
        return vase_layout_refuse(msg, msg_size,
                                  "the plan area (%u keep lists of %u slots, %" PRIu64
                                  " bytes in a plan page of %" PRIu64
                                  ") does not fit the arena's %" PRIu64 " bytes",
                                  lists, keep, need, bytes, l->arena_bytes);
    *ret = (struct vase_plan_layout){
        .keep = keep,
        .lists = lists,
        .plans_per_page = lists,
        .plan_page_bytes = bytes,
        .plan_pages = 1,
    };
    return 0;
}

int vase_layout_footprint(const struct vase_layout *l, bool ring, uint32_t prompt_len,
                          uint32_t budget, uint32_t window, uint32_t slack, uint32_t keep,
                          struct vase_layout_footprint *ret, char *msg, size_t msg_size) {
    uint64_t slots = vase_layout_open_slots(prompt_len, budget, window, slack);
    struct vase_layout_footprint fp = {.kv_pages = vase_layout_blocks_for(l, slots)};
    if (slots > UINT32_MAX || (uint64_t)fp.kv_pages * l->block_tokens > UINT32_MAX)
        return vase_layout_refuse(msg, msg_size, "the sequence's capacity does not fit 32 bits");
    if (ring) {
        bool fits;
        fp.ring_pages = vase_layout_ring_pages(l, window, &fits);
        if (!fits)
            return vase_layout_refuse(msg, msg_size,
                                      "one query ring page of this model (%" PRIu64
                                      " bytes) does not fit the arena",
                                      l->ring_page_bytes);
    }
    int r = vase_layout_plans(l, keep, &fp.plan, msg, msg_size);
    if (r < 0)
        return r;
    fp.bytes = (uint64_t)fp.kv_pages * l->page_bytes +
               (uint64_t)fp.ring_pages * l->ring_page_bytes +
               (uint64_t)fp.plan.plan_pages * fp.plan.plan_page_bytes;
    *ret = fp;
    return 0;
}

uint64_t vase_layout_kv_offset(const struct vase_layout *l, const uint32_t *table, uint32_t layer,
                               enum vase_kv kv, uint32_t slot, uint32_t kv_head) {
    uint64_t block = table[slot / l->block_tokens];
    uint64_t token = slot % l->block_tokens;
    return block * l->page_bytes + layer * l->layer_stride + (kv == VASE_V ? l->kv_stride : 0) +
           token * l->token_stride + kv_head * l->head_stride;
}

struct vase_view vase_layout_kv_view(const struct vase_layout *l, void *arena_base,
                                     const uint32_t *table, uint32_t layer, enum vase_kv kv) {
    uint64_t off = layer * l->layer_stride + (kv == VASE_V ? l->kv_stride : 0);
    return (struct vase_view){
        .base = (char *)arena_base + off,
        .pages = table,
        .tokens_per_page = l->block_tokens,
        .heads = l->kv_heads,
        .dim = l->head_dim,
        .dtype = l->dtype,
        .page_stride = (int64_t)l->page_bytes,
        .token_stride = (int64_t)l->token_stride,
        .head_stride = (int64_t)l->head_stride,
    };
}

uint32_t vase_layout_ring_entry(uint64_t pos, uint32_t window) {
    return (uint32_t)(pos % (2 * (uint64_t)window));
}

uint32_t vase_layout_ring_first(uint64_t pos_after, uint32_t window) {
    return vase_layout_ring_entry(pos_after - window, window);
}

uint64_t vase_layout_query_offset(const struct vase_layout *l, const uint32_t *ring_pages,
                                  uint32_t window, uint32_t layer, uint64_t pos, uint32_t q_head) {
    uint32_t e = vase_layout_ring_entry(pos, window);
    uint64_t page = ring_pages[e / l->ring_rows_per_page];
    uint64_t row = e % l->ring_rows_per_page;
    return page * l->ring_page_bytes + layer * l->ring_layer_stride + row * l->ring_row_stride +
           q_head * l->head_stride;
}

struct vase_view vase_layout_query_view(const struct vase_layout *l, void *arena_base,
                                        const uint32_t *ring_pages, uint32_t window, uint32_t first,
                                        uint32_t layer) {
    return (struct vase_view){
        .base = (char *)arena_base + layer * l->ring_layer_stride,
        .pages = ring_pages,
        .tokens_per_page = l->ring_rows_per_page,
        .ring = 2 * window,
        .first = first,
        .heads = l->q_heads,
        .dim = l->head_dim,
        .dtype = l->dtype,
        .page_stride = (int64_t)l->ring_page_bytes,
        .token_stride = (int64_t)l->ring_row_stride,
        .head_stride = (int64_t)l->head_stride,
    };
}

uint64_t vase_layout_plan_offset(const struct vase_plan_layout *p, const uint32_t *plan_pages,
                                 uint32_t i) {
    uint64_t page = plan_pages[i / p->plans_per_page];
    return page * p->plan_page_bytes + (uint64_t)(i % p->plans_per_page) * 4 * p->keep;
}

void vase_layout_kv_tensor(const struct vase_layout *l, uint32_t layer, enum vase_kv kv,
                           struct vase_layout_tensor *ret) {
    int64_t es = (int64_t)vase_dtype_size(l->dtype);
    int64_t bytes[4] = {(int64_t)l->page_bytes, (int64_t)l->token_stride, (int64_t)l->head_stride,
                        es};
    *ret = (struct vase_layout_tensor){
        .offset = layer * l->layer_stride + (kv == VASE_V ? l->kv_stride : 0),
        .shape = {l->num_blocks, l->block_tokens, l->kv_heads, l->head_dim},
    };
    for (int i = 0; i < 4; i++) {
        ret->byte_strides[i] = bytes[i];
        ret->strides[i] = bytes[i] / es; /* every stride is a multiple of the element size */
    }
}

bool vase_layout_evict_due(uint64_t pos, uint32_t prompt_len, uint32_t len, uint32_t budget,
                           uint32_t window) {
    return window > 0 && pos >= prompt_len && len > budget && len % window == 0;
}
