/* SPDX-License-Identifier: MIT */

/*
 * Models. A registered model is the daemon's ModelLayout, checked against the layout the client
 * computes itself from the geometry (PROTOCOL.md "Memory"): both sides must agree to the byte on
 * where each K and V row lives, or the engine's writes and the daemon's reads would silently
 * miss each other. Models belong to the client and live until it is freed.
 */

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

struct vase_model *vase__model_free(struct vase_model *m) {
    free(m);
    return NULL;
}

static struct vase__arena *find_arena(struct vase_client *c, uint32_t id) {
    for (size_t i = 0; i < c->session.n_arenas; i++)
        if (c->session.arenas[i].id == id)
            return &c->session.arenas[i];
    return NULL;
}

int vase_arena_find(struct vase_client *c, const char *name, uint32_t *ret_id) {
    if (!c || !name || !ret_id)
        return -EINVAL;
    for (size_t i = 0; i < c->session.n_arenas; i++)
        if (strcmp(c->session.arenas[i].name, name) == 0) {
            *ret_id = c->session.arenas[i].id;
            return 0;
        }
    return -ENOENT;
}

static bool layout_matches(const struct vase__layout *want, const Vase__ModelLayout *got) {
    return got->tokens_per_page == want->tokens_per_page && got->page_bytes == want->page_bytes &&
           got->layer_stride == want->layer_stride && got->kv_stride == want->kv_stride &&
           got->token_stride == want->token_stride && got->head_stride == want->head_stride &&
           got->ring_rows_per_page == want->ring_rows_per_page &&
           got->ring_row_stride == want->ring_row_stride &&
           (want->ring_rows_per_page == 0 || got->ring_layer_stride == want->ring_layer_stride);
}

int vase_model_register(struct vase_client *c, const struct vase_geometry *g,
                        struct vase_model **ret) {
    Vase__ModelGeometry geo = VASE__MODEL_GEOMETRY__INIT;
    Vase__RegisterModel reg = VASE__REGISTER_MODEL__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    Vase__Envelope *reply = NULL;
    struct vase__layout layout;
    int r;

    if (!c)
        return -EINVAL;
    vase__client_lock(c);
    if (!g || !ret) {
        r = vase__client_fail(c, -EINVAL, "vase_model_register: no geometry or no result pointer");
        goto out;
    }
    if (c->dead) {
        r = c->dead;
        goto out;
    }
    struct vase__arena *arena = find_arena(c, g->arena);
    if (!arena) {
        r = vase__client_fail(c, -EINVAL, "no arena %u", g->arena);
        goto out;
    }
    r = vase__layout_compute(g, arena->page_bytes, &layout);
    if (r < 0) {
        const char *dtype = vase_dtype_to_string(g->dtype);
        vase__client_fail(c, r,
                          "arena %u (pages of %llu bytes) cannot lay out %u layers, %u query "
                          "heads, %u KV heads of dimension %u, dtype %s, alignment %u",
                          g->arena, (unsigned long long)arena->page_bytes, g->layers, g->q_heads,
                          g->kv_heads, g->head_dim, dtype ? dtype : "unknown", g->align);
        goto out;
    }
    /* A device arena is mapped when the first model is registered on it, so that a client
     * that never uses it never touches CUDA; an arena this library cannot map is refused. */
    if (vase__arena_on_device(arena) && !arena->map) {
        r = vase__cuda_map(arena, c->session.incarnation, c->last_error, sizeof(c->last_error));
        if (r < 0)
            goto out;
    }
    if (!arena->map) {
        r = vase__client_fail(c, -EOPNOTSUPP,
                              "arena %u is shared as \"%s\", which libvase cannot map", g->arena,
                              arena->share);
        goto out;
    }

    geo.name = (char *)(g->name ? g->name : "");
    geo.layers = g->layers;
    geo.q_heads = g->q_heads;
    geo.kv_heads = g->kv_heads;
    geo.head_dim = g->head_dim;
    geo.dtype = (Vase__Dtype)g->dtype;
    geo.align = g->align ? g->align : 1;
    geo.arena_id = g->arena;
    reg.geometry = &geo;
    e.body_case = VASE__ENVELOPE__BODY_REGISTER_MODEL;
    e.register_model = &reg;
    r = vase__client_call(c, &e, VASE__ENVELOPE__BODY_MODEL_LAYOUT, &reply);
    if (r < 0)
        goto out;
    if (!layout_matches(&layout, reply->model_layout)) {
        r = vase__client_fail(c, -EPROTO,
                              "the daemon's layout of the model differs from PROTOCOL.md's");
        goto out;
    }

    struct vase_model *m = calloc(1, sizeof(*m));
    if (!m) {
        r = -ENOMEM;
        goto out;
    }
    *m = (struct vase_model){
        .client = c,
        .next = c->models,
        .id = reply->model_layout->model_id,
        .arena = arena,
        .layout = layout,
    };
    c->models = m;
    *ret = m;
out:
    if (reply)
        vase__envelope__free_unpacked(reply, NULL);
    pthread_mutex_unlock(&c->lock);
    return r;
}

uint32_t vase_model_tokens_per_page(const struct vase_model *m) {
    return m ? m->layout.tokens_per_page : 0;
}
