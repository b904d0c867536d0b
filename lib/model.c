/* SPDX-License-Identifier: MIT */

/*
 * Models. A registered model is the daemon's ModelLayout, checked against the layout the client
 * computes itself from the geometry (PROTOCOL.md "Memory"): both sides must agree to the byte on
 * where each K and V row lives, or the engine's writes and the daemon's reads would silently
 * miss each other. Models belong to the client and live until it is freed; registering the
 * same geometry under the same name on the same arena again hands back the model already
 * registered, so an engine that makes a cache per request does not use up the daemon's
 * max_models_per_client.
 */

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

struct vase_model *vase__model_free(struct vase_model *m) {
    if (m)
        free(m->name);
    free(m);
    return NULL;
}

/* The model of c already registered with layout l under name on arena, if any. */
static struct vase_model *find_model(struct vase_client *c, const struct vase__arena *arena,
                                     const struct vase_layout *l, const char *name) {
    for (struct vase_model *m = c->models; m; m = m->next)
        if (m->arena == arena && m->layout.layers == l->layers && m->layout.q_heads == l->q_heads &&
            m->layout.kv_heads == l->kv_heads && m->layout.head_dim == l->head_dim &&
            m->layout.dtype == l->dtype && m->layout.block_tokens == l->block_tokens &&
            strcmp(m->name, name) == 0)
            return m;
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

static bool layout_matches(const struct vase_layout *want, const Vase__ModelLayout *got) {
    return got->block_tokens == want->block_tokens && got->page_bytes == want->page_bytes &&
           got->layer_stride == want->layer_stride && got->kv_stride == want->kv_stride &&
           got->token_stride == want->token_stride && got->head_stride == want->head_stride &&
           got->ring_rows_per_page == want->ring_rows_per_page &&
           got->ring_row_stride == want->ring_row_stride &&
           got->ring_layer_stride == want->ring_layer_stride &&
           got->ring_page_bytes == want->ring_page_bytes && got->num_blocks == want->num_blocks;
}

void vase__geometry_layout(const struct vase_geometry *g, struct vase_layout_geometry *ret) {
    *ret = (struct vase_layout_geometry){
        .layers = g->layers,
        .q_heads = g->q_heads,
        .kv_heads = g->kv_heads,
        .head_dim = g->head_dim,
        .dtype = g->dtype,
        .block_tokens = g->block_tokens,
    };
}

int vase_model_register(struct vase_client *c, const struct vase_geometry *g,
                        struct vase_model **ret) {
    Vase__ModelGeometry geo = VASE__MODEL_GEOMETRY__INIT;
    Vase__RegisterModel reg = VASE__REGISTER_MODEL__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    Vase__Envelope *reply = NULL;
    struct vase_layout layout;
    char why[200];
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
    struct vase_layout_geometry lg;
    vase__geometry_layout(g, &lg);
    r = vase_layout_compute(&lg, arena->size_bytes, &layout, why, sizeof(why));
    if (r < 0) {
        vase__client_fail(c, r, "arena %u (\"%s\", %llu bytes) cannot hold the model: %s", g->arena,
                          arena->name, (unsigned long long)arena->size_bytes, why);
        goto out;
    }
    const char *name = g->name ? g->name : "";
    struct vase_model *known = find_model(c, arena, &layout, name);
    if (known) {
        *ret = known;
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

    geo.name = (char *)name;
    geo.layers = g->layers;
    geo.q_heads = g->q_heads;
    geo.kv_heads = g->kv_heads;
    geo.head_dim = g->head_dim;
    geo.dtype = (Vase__Dtype)g->dtype;
    geo.block_tokens = layout.block_tokens;
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
    char *copy = strdup(name);
    if (!m || !copy) {
        free(m);
        free(copy);
        r = -ENOMEM;
        goto out;
    }
    *m = (struct vase_model){
        .client = c,
        .next = c->models,
        .id = reply->model_layout->model_id,
        .arena = arena,
        .layout = layout,
        .name = copy,
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
    return m ? m->layout.block_tokens : 0;
}

uint64_t vase_model_page_bytes(const struct vase_model *m) {
    return m ? m->layout.page_bytes : 0;
}

int vase_model_kv_tensor(const struct vase_model *m, uint32_t layer, enum vase_kv kv,
                         struct vase_tensor *ret) {
    if (!m)
        return -EINVAL;
    vase__client_lock(m->client);
    int r = 0;
    if (!ret || layer >= m->layout.layers || (kv != VASE_K && kv != VASE_V)) {
        r = vase__client_fail(m->client, -EINVAL,
                              "vase_model_kv_tensor: layer %u of %u, kv %d, result pointer %s",
                              layer, m->layout.layers, (int)kv, ret ? "given" : "NULL");
    } else {
        struct vase_layout_tensor t;
        vase_layout_kv_tensor(&m->layout, layer, kv, &t);
        *ret = (struct vase_tensor){
            .data = (char *)m->arena->map + t.offset,
            .dtype = m->layout.dtype,
            .device = vase__arena_on_device(m->arena) ? m->arena->device : -1,
            .ndim = 4,
        };
        for (int i = 0; i < 4; i++) {
            ret->shape[i] = t.shape[i];
            ret->strides[i] = t.strides[i];
            ret->byte_strides[i] = t.byte_strides[i];
        }
    }
    pthread_mutex_unlock(&m->client->lock);
    return r;
}
