/* SPDX-License-Identifier: MIT */

/*
 * The registry of clients, models and sequences. Invariants: ids are never reused within an
 * incarnation; a live sequence is on its client's list and in the id table, an orphan on the
 * orphan list only; the pages of a sequence are charged to its client while it is live
 * (client->bytes), and stay out of the free pool until the sequence is freed, so no plan is
 * ever written into pages someone else owns. An orphan held by a draining client (its holder,
 * on the draining list, still charged) is freed only when that client is released, so no dead
 * process's GPU work lands in pages someone else owns either. All page movement goes through
 * the allocator's all-or-nothing calls. Sequences kept across a restart are
 * registry_restore.c's.
 */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "alloc.h"
#include "registry.h"
#include "registry_internal.h"

int vase_registry_new(struct vase_plan_run *(*free_run)(struct vase_plan_run *run),
                      struct vase_registry **ret) {
    struct vase_registry *reg = calloc(1, sizeof(*reg));
    if (!reg)
        return -ENOMEM;
    reg->free_run = free_run;
    reg->seq_table_size = 1024;
    reg->seq_table = calloc(reg->seq_table_size, sizeof(*reg->seq_table));
    if (!reg->seq_table) {
        free(reg);
        return -ENOMEM;
    }
    reg->next_client_id = reg->next_model_id = reg->next_seq_id = 1;
    *ret = reg;
    return 0;
}

void vase_registry_seq_free(const struct vase_registry *reg, struct vased_seq *s) {
    if (!s)
        return;
    vase_registry_drop_scores(s);
    vase_registry_drop_acc(s);
    free(s->scores);
    free(s->scores_len);
    free(s->pages);
    free(s->ring_pages);
    free(s->plan_pages);
    if (s->run && reg->free_run)
        reg->free_run(s->run);
    free(s);
}

static void model_free(struct vased_model *m) {
    if (!m)
        return;
    free(m->name);
    free(m);
}

static void client_free(const struct vase_registry *reg, struct vased_client *c) {
    if (!c)
        return;
    while (c->seqs) {
        struct vased_seq *s = c->seqs;
        c->seqs = s->next;
        vase_registry_seq_free(reg, s);
    }
    while (c->models) {
        struct vased_model *m = c->models;
        c->models = m->next;
        model_free(m);
    }
    if (c->fd >= 0)
        close(c->fd);
    if (c->pidfd >= 0)
        close(c->pidfd);
    free(c->name);
    free(c);
}

struct vase_registry *vase_registry_free(struct vase_registry *reg) {
    if (!reg)
        return NULL;
    while (reg->clients) {
        struct vased_client *c = reg->clients;
        reg->clients = c->next;
        client_free(reg, c);
    }
    while (reg->draining) {
        struct vased_client *c = reg->draining;
        reg->draining = c->next;
        client_free(reg, c);
    }
    while (reg->orphans) {
        struct vased_seq *s = reg->orphans;
        reg->orphans = s->next;
        vase_registry_seq_free(reg, s);
    }
    while (reg->restored) {
        struct vased_seq *s = reg->restored;
        reg->restored = s->next;
        vase_registry_seq_free(reg, s);
    }
    free(reg->seq_table);
    free(reg);
    return NULL;
}

/* ---- clients ---- */

int vase_registry_add_client(struct vase_registry *reg, int fd, struct vased_client **ret) {
    struct vased_client *c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    c->fd = -1;
    c->pidfd = -1;
    /* The token is the control socket's routing id: random, so that one client cannot guess
     * another's, and never starting with a zero byte, which ZeroMQ reserves. */
    if (getrandom(c->token, sizeof(c->token), 0) != (ssize_t)sizeof(c->token)) {
        int r = errno ? -errno : -EIO;
        free(c);
        return r;
    }
    if (c->token[0] == 0)
        c->token[0] = 1;
    c->id = reg->next_client_id++;
    c->fd = fd;
    c->log_limit = (struct vase_ratelimit){.interval = VASE_CLIENT_LOG_INTERVAL,
                                           .burst = VASE_CLIENT_LOG_BURST};
    c->next = reg->clients;
    reg->clients = c;
    reg->n_clients++;
    *ret = c;
    return 0;
}

struct vased_client *vase_registry_find_client(const struct vase_registry *reg, uint32_t id) {
    for (struct vased_client *c = reg->clients; c; c = c->next)
        if (c->id == id)
            return c;
    return NULL;
}

struct vased_client *vase_registry_find_token(const struct vase_registry *reg, const void *token,
                                              size_t len) {
    if (len != VASE_TOKEN_BYTES)
        return NULL;
    for (struct vased_client *c = reg->clients; c; c = c->next)
        if (memcmp(c->token, token, VASE_TOKEN_BYTES) == 0)
            return c;
    return NULL;
}

const char *vase_registry_client_state(const struct vased_client *c) {
    return c->draining ? "draining" : "connected";
}

void vase_registry_remove_client(struct vase_registry *reg, struct vased_client *c) {
    for (struct vased_client **p = &reg->clients; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            reg->n_clients--;
            break;
        }
    client_free(reg, c);
}

/* ---- models ---- */

int vase_registry_add_model(struct vase_registry *reg, struct vased_client *c, const char *name,
                            uint32_t arena_id, const struct vase_layout *layout,
                            struct vased_model **ret) {
    struct vased_model *m = calloc(1, sizeof(*m));
    if (!m)
        return -ENOMEM;
    m->name = strdup(name ? name : "");
    if (!m->name) {
        free(m);
        return -ENOMEM;
    }
    m->id = reg->next_model_id++;
    m->arena_id = arena_id;
    m->client = c;
    m->layout = *layout;
    m->next = c->models;
    c->models = m;
    c->n_models++;
    *ret = m;
    return 0;
}

int vase_registry_get_model(const struct vase_registry *reg, const struct vased_client *c,
                            uint32_t id, struct vased_model **ret) {
    for (const struct vased_client *o = reg->clients; o; o = o->next)
        for (struct vased_model *m = o->models; m; m = m->next)
            if (m->id == id) {
                /* Another client's model is answered as one that does not exist: ids are
                 * not a way to learn what other tenants run. */
                if (o != c)
                    return -ENOENT;
                *ret = m;
                return 0;
            }
    return -ENOENT;
}

/* ---- sequences ---- */

static uint32_t seq_slot(const struct vase_registry *reg, uint32_t id) {
    return (id * 2654435761u) & (reg->seq_table_size - 1);
}

static void seq_table_remove(struct vase_registry *reg, struct vased_seq *s) {
    for (struct vased_seq **p = &reg->seq_table[seq_slot(reg, s->id)]; *p; p = &(*p)->hash_next)
        if (*p == s) {
            *p = s->hash_next;
            s->hash_next = NULL;
            return;
        }
}

void vase_registry_seq_link(struct vase_registry *reg, struct vased_client *c,
                            struct vased_seq *s) {
    s->next = c->seqs;
    c->seqs = s;
    c->n_seqs++;
    uint32_t slot = seq_slot(reg, s->id);
    s->hash_next = reg->seq_table[slot];
    reg->seq_table[slot] = s;
    reg->n_seqs++;
}

struct vased_seq *vase_registry_find_seq(const struct vase_registry *reg, uint32_t id) {
    for (struct vased_seq *s = reg->seq_table[seq_slot(reg, id)]; s; s = s->hash_next)
        if (s->id == id)
            return s;
    return NULL;
}

int vase_registry_get_seq(const struct vase_registry *reg, const struct vased_client *c,
                          uint32_t id, struct vased_seq **ret) {
    struct vased_seq *s = vase_registry_find_seq(reg, id);
    /* Another client's sequence is answered as one that does not exist (as for models). */
    if (!s || s->client != c)
        return -ENOENT;
    *ret = s;
    return 0;
}

int vase_registry_footprint(const struct vase_layout *l, const struct vased_seq_request *req,
                            struct vased_seq_footprint *ret, char *msg, size_t msg_size) {
    return vase_registry_footprint_at(l, req, req->params.budget, ret, msg, msg_size);
}

int vase_registry_footprint_at(const struct vase_layout *l, const struct vased_seq_request *req,
                               uint32_t budget, struct vased_seq_footprint *ret, char *msg,
                               size_t msg_size) {
    struct vase_layout_footprint fp;
    int r = vase_layout_footprint(l, vase_policy_needs(req->policy) & VASE_NEEDS_Q, req->prompt_len,
                                  budget, req->params.window, req->slack,
                                  vase_plan_keep_count(&req->params), &fp, msg, msg_size);
    if (r < 0)
        return r;
    *ret = (struct vased_seq_footprint){
        .kv_pages = fp.kv_pages,
        .ring_pages = fp.ring_pages,
        .plan = fp.plan,
        .bytes = fp.bytes,
    };
    return 0;
}

uint64_t vase_registry_seq_bytes(const struct vased_seq *s) {
    return (uint64_t)s->n_pages * s->layout.page_bytes +
           (uint64_t)s->n_ring_pages * s->layout.ring_page_bytes +
           (uint64_t)s->n_plan_pages * s->plan.plan_page_bytes;
}

struct vased_seq *vase_registry_seq_new(const struct vase_registry *reg,
                                        const struct vase_layout *l,
                                        const struct vased_seq_footprint *most) {
    struct vased_seq *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->pages = malloc((size_t)most->kv_pages * sizeof(uint32_t));
    s->ring_pages = malloc((size_t)(most->ring_pages ? most->ring_pages : 1) * sizeof(uint32_t));
    s->plan_pages =
        malloc((size_t)(most->plan.plan_pages ? most->plan.plan_pages : 1) * sizeof(uint32_t));
    s->scores = calloc(l->layers, sizeof(float *));
    s->scores_len = calloc(l->layers, sizeof(uint32_t));
    if (!s->pages || !s->ring_pages || !s->plan_pages || !s->scores || !s->scores_len) {
        vase_registry_seq_free(reg, s);
        return NULL;
    }
    return s;
}

void vase_registry_seq_init(struct vased_seq *s, const struct vase_layout *l,
                            const struct vased_seq_request *req, uint32_t budget,
                            const struct vased_seq_footprint *most,
                            const struct vased_seq_footprint *fp) {
    s->layers = l->layers;
    s->kv_heads = l->kv_heads;
    s->policy = req->policy;
    s->max_params = req->params;
    s->params = vase_params_at_budget(&req->params, budget);
    s->keep = vase_plan_keep_count(&s->params);
    s->max_budget = s->cap_budget = s->target_budget = req->params.budget;
    s->min_budget = req->min_budget ? req->min_budget : req->params.budget;
    s->weight = req->weight ? req->weight : 1;
    s->mode = req->mode;
    s->slack = req->slack;
    s->prompt_len = req->prompt_len;
    s->seed = req->seed;
    memcpy(s->label, req->label, sizeof(s->label));
    s->layout = *l;
    s->plan = fp->plan;
    s->n_pages = fp->kv_pages;
    s->max_pages = most->kv_pages;
    s->n_ring_pages = fp->ring_pages;
    s->n_plan_pages = fp->plan.plan_pages;
    s->capacity = fp->kv_pages * l->block_tokens;
    s->acc_stride = most->kv_pages * l->block_tokens;
    s->state = VASED_SEQ_IDLE;
}

/* One all-or-nothing reservation of a sequence's pages at budget: its KV pages for that
 * budget, the ring, and the plan area of the budget it asked for (into s's arrays, sized for
 * that). 0, -ENOSPC, -EDQUOT, -ENOMEM, -EINVAL; the reason in msg. */
static int reserve_at(struct vase_alloc *alloc, struct vased_client *c, const struct vased_model *m,
                      const struct vased_seq_request *req, uint32_t budget, uint64_t byte_quota,
                      struct vased_seq *s, struct vased_seq_footprint *ret, char *msg,
                      size_t msg_size) {
    struct vased_seq_footprint fp;
    int r = vase_registry_footprint_at(&m->layout, req, budget, &fp, msg, msg_size);
    if (r < 0)
        return r;
    struct vase_alloc_req parts[3] = {
        {.unit = m->layout.page_bytes, .n = fp.kv_pages, .ret = s->pages},
        {.unit = m->layout.ring_page_bytes, .n = fp.ring_pages, .ret = s->ring_pages},
        {.unit = fp.plan.plan_page_bytes, .n = fp.plan.plan_pages, .ret = s->plan_pages},
    };
    r = vase_alloc_reserve(alloc, parts, 3, byte_quota, &c->bytes);
    if (r == -EDQUOT)
        snprintf(msg, msg_size,
                 "the sequence needs %llu bytes; the client holds %llu of its "
                 "max_bytes_per_client %llu",
                 (unsigned long long)fp.bytes, (unsigned long long)c->bytes,
                 (unsigned long long)byte_quota);
    else if (r == -ENOSPC)
        snprintf(msg, msg_size,
                 "not enough free memory in the arena for the sequence's %llu bytes (%llu of "
                 "%llu bytes in granules no model holds)",
                 (unsigned long long)fp.bytes, (unsigned long long)vase_alloc_free_bytes(alloc),
                 (unsigned long long)alloc->arena_bytes);
    *ret = fp;
    return r;
}

int vase_registry_open_seq(struct vase_registry *reg, struct vase_alloc *alloc,
                           struct vased_client *c, struct vased_model *m,
                           const struct vased_seq_request *req, uint32_t max_seqs,
                           uint64_t byte_quota, struct vased_seq **ret, char *msg,
                           size_t msg_size) {
    struct vased_seq_footprint fp, most;
    int r;

    msg[0] = '\0';
    if (c->n_seqs >= max_seqs) {
        snprintf(msg, msg_size, "the client has max_seqs_per_client (%u) sequences open", max_seqs);
        return -EDQUOT;
    }
    r = vase_registry_footprint(&m->layout, req, &most, msg, msg_size);
    if (r < 0)
        return r;
    uint32_t max = req->params.budget, min = req->min_budget ? req->min_budget : max;
    r = vase_registry_footprint_at(&m->layout, req, min, &fp, msg, msg_size);
    if (r < 0)
        return r;
    if (fp.bytes > alloc->arena_bytes) {
        snprintf(msg, msg_size,
                 "the sequence needs %llu bytes, more than the whole arena (%llu bytes)",
                 (unsigned long long)fp.bytes, (unsigned long long)alloc->arena_bytes);
        return -ENOSPC;
    }

    struct vased_seq *s = vase_registry_seq_new(reg, &m->layout, &most);
    if (!s)
        return -ENOMEM;
    if (getrandom(s->resume_token, sizeof(s->resume_token), 0) !=
        (ssize_t)sizeof(s->resume_token)) {
        r = errno ? -errno : -EIO;
        goto free_seq;
    }

    /* One reservation for everything: the sequence exists whole or not at all. An elastic one
     * that does not fit its budget takes the most that fits of a few budgets down to its
     * min_budget (a quarter of the range at a time), and grows later (elastic.h). */
    uint32_t W = req->params.window, budget = max, step = (max - min) / 4 / W * W;
    if (step == 0)
        step = W;
    for (;;) {
        r = reserve_at(alloc, c, m, req, budget, byte_quota, s, &fp, msg, msg_size);
        if (r == 0 || budget == min || (r != -ENOSPC && r != -EDQUOT))
            break;
        budget = budget - min > step ? budget - step : min;
    }
    if (r < 0)
        goto free_seq;
    msg[0] = '\0';

    vase_registry_seq_init(s, &m->layout, req, budget, &most, &fp);
    s->id = reg->next_seq_id++;
    s->client = c;
    s->owner_uid = c->uid;
    s->model = m;
    s->arena_id = m->arena_id;
    vase_registry_seq_link(reg, c, s);
    *ret = s;
    return 0;

free_seq:
    vase_registry_seq_free(reg, s);
    return r;
}

void vase_registry_seq_release_pages(struct vased_seq *s, struct vase_alloc *alloc,
                                     uint64_t *client_bytes) {
    /* Cannot fail: these pages were reserved for this sequence and nothing else frees them. */
    vase_alloc_release(alloc, s->layout.page_bytes, s->pages, s->n_pages, client_bytes);
    vase_alloc_release(alloc, s->layout.ring_page_bytes, s->ring_pages, s->n_ring_pages,
                       client_bytes);
    vase_alloc_release(alloc, s->plan.plan_page_bytes, s->plan_pages, s->n_plan_pages,
                       client_bytes);
    s->n_pages = s->n_ring_pages = s->n_plan_pages = 0;
}

/* Takes live sequence s off its client's list and the id table; the client stops paying for its
 * statistics. */
static void seq_unlink(struct vase_registry *reg, struct vased_seq *s) {
    struct vased_client *c = s->client;

    for (struct vased_seq **p = &c->seqs; *p; p = &(*p)->next)
        if (*p == s) {
            *p = s->next;
            break;
        }
    s->next = NULL;
    c->n_seqs--;
    c->stats_bytes -= s->stats_bytes < c->stats_bytes ? s->stats_bytes : c->stats_bytes;
    seq_table_remove(reg, s);
    reg->n_seqs--;
}

/* Puts s, unlinked, on the orphan list: no client, no model, its pages kept. */
static void seq_orphan(struct vase_registry *reg, struct vased_seq *s) {
    s->client = NULL;
    s->model = NULL;
    s->next = reg->orphans;
    reg->orphans = s;
}

static void orphan_unlink(struct vase_registry *reg, struct vased_seq *s) {
    for (struct vased_seq **p = &reg->orphans; *p; p = &(*p)->next)
        if (*p == s) {
            *p = s->next;
            break;
        }
}

static void uncharge(struct vased_client *c, uint64_t bytes) {
    c->bytes -= bytes < c->bytes ? bytes : c->bytes;
}

int vase_registry_close_seq(struct vase_registry *reg, struct vase_alloc *alloc,
                            struct vased_seq *s) {
    struct vased_client *c = s->client;

    seq_unlink(reg, s);
    if (s->state == VASED_SEQ_PLANNING) {
        /* Evictor threads may still write this sequence's plan pages: keep every page out of
         * the free pool until they are done, but stop charging the client for them. */
        uncharge(c, vase_registry_seq_bytes(s));
        seq_orphan(reg, s);
        return 1;
    }
    vase_registry_seq_release_pages(s, alloc, &c->bytes);
    vase_registry_seq_free(reg, s);
    return 0;
}

void vase_registry_reap(struct vase_registry *reg, struct vase_alloc *alloc, struct vased_seq *s) {
    if (s->holder) {
        /* The plan is done, but the dead client's process may still write the pages. */
        if (s->run && reg->free_run)
            reg->free_run(s->run);
        s->run = NULL;
        s->state = VASED_SEQ_IDLE;
        return;
    }
    orphan_unlink(reg, s);
    vase_registry_seq_release_pages(s, alloc, NULL);
    vase_registry_seq_free(reg, s);
}

void vase_registry_hold_seq(struct vase_registry *reg, struct vased_seq *s) {
    struct vased_client *c = s->client;

    seq_unlink(reg, s);
    seq_orphan(reg, s);
    s->holder = c;
    c->n_held++;
}

void vase_registry_drain_client(struct vase_registry *reg, struct vased_client *c) {
    for (struct vased_client **p = &reg->clients; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            reg->n_clients--;
            break;
        }
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->draining = true;
    c->next = reg->draining;
    reg->draining = c;
    reg->n_draining++;
}

uint64_t vase_registry_release_client(struct vase_registry *reg, struct vase_alloc *const *allocs,
                                      struct vased_client *c) {
    uint64_t released = 0;
    struct vased_seq *next;

    for (struct vased_seq *s = reg->orphans; s; s = next) {
        next = s->next;
        if (s->holder != c)
            continue;
        s->holder = NULL;
        c->n_held--;
        if (s->state == VASED_SEQ_PLANNING) {
            /* Its run comes back later and reaps it. */
            uncharge(c, vase_registry_seq_bytes(s));
            continue;
        }
        released += vase_registry_seq_bytes(s);
        orphan_unlink(reg, s);
        vase_registry_seq_release_pages(s, allocs[s->arena_id], &c->bytes);
        vase_registry_seq_free(reg, s);
    }
    for (struct vased_client **p = &reg->draining; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            reg->n_draining--;
            break;
        }
    client_free(reg, c);
    return released;
}

int vase_registry_shrink_seq(struct vased_seq *s, struct vase_alloc *alloc, uint32_t keep_pages) {
    if (keep_pages >= s->n_pages)
        return 0;
    int r = vase_alloc_release(alloc, s->layout.page_bytes, s->pages + keep_pages,
                               s->n_pages - keep_pages, s->client ? &s->client->bytes : NULL);
    if (r < 0)
        return r;
    s->n_pages = keep_pages;
    s->capacity = keep_pages * s->layout.block_tokens;
    return 1;
}

int vase_registry_grow_seq(struct vased_seq *s, struct vase_alloc *alloc, uint32_t n_pages,
                           uint64_t quota) {
    if (n_pages <= s->n_pages)
        return 0;
    if (n_pages > s->max_pages || !s->client)
        return -EINVAL;
    struct vase_alloc_req part = {
        .unit = s->layout.page_bytes, .n = n_pages - s->n_pages, .ret = s->pages + s->n_pages};
    int r = vase_alloc_reserve(alloc, &part, 1, quota, &s->client->bytes);
    if (r < 0)
        return r;
    s->n_pages = n_pages;
    s->capacity = n_pages * s->layout.block_tokens;
    return 0;
}

const char *vase_registry_state_name(enum vased_seq_state st) {
    switch (st) {
    case VASED_SEQ_IDLE:
        return "idle";
    case VASED_SEQ_PLANNING:
        return "planning";
    case VASED_SEQ_PLAN_READY:
        return "plan-ready";
    }
    return "?";
}

void vase_registry_charge_stats(struct vased_seq *s, int64_t delta) {
    uint64_t d = delta < 0 ? (uint64_t)-delta : (uint64_t)delta;
    if (delta >= 0) {
        s->stats_bytes += d;
        if (s->client)
            s->client->stats_bytes += d;
        return;
    }
    s->stats_bytes -= d < s->stats_bytes ? d : s->stats_bytes;
    if (s->client)
        s->client->stats_bytes -= d < s->client->stats_bytes ? d : s->client->stats_bytes;
}

bool vase_registry_stats_fit(const struct vased_seq *s, uint64_t delta, uint64_t quota) {
    uint64_t held = s->client ? s->client->stats_bytes : s->stats_bytes;
    return delta <= quota && held <= quota - delta;
}

uint64_t vase_registry_acc_bytes(const struct vased_seq *s) {
    return (uint64_t)s->layers * s->kv_heads * s->acc_stride * sizeof(float);
}

void vase_registry_drop_acc(struct vased_seq *s) {
    if (!s->acc)
        return;
    free(s->acc);
    s->acc = NULL;
    vase_registry_charge_stats(s, -(int64_t)vase_registry_acc_bytes(s));
}

void vase_registry_drop_scores(struct vased_seq *s) {
    if (!s->scores)
        return;
    for (uint32_t l = 0; l < s->layers; l++) {
        if (s->scores[l])
            vase_registry_charge_stats(
                s, -(int64_t)((uint64_t)s->scores_len[l] * s->kv_heads * sizeof(float)));
        free(s->scores[l]);
        s->scores[l] = NULL;
        s->scores_len[l] = 0;
    }
}

uint64_t vase_registry_draining_bytes(const struct vase_registry *reg) {
    uint64_t bytes = 0;
    for (const struct vased_client *c = reg->draining; c; c = c->next)
        bytes += c->bytes;
    return bytes;
}

void vase_registry_uid_usage(const struct vase_registry *reg, uid_t uid,
                             struct vased_uid_usage *ret) {
    struct vased_uid_usage u = {0};
    for (const struct vased_client *c = reg->clients; c; c = c->next) {
        if (c->uid != uid)
            continue;
        u.sessions++;
        u.seqs += c->n_seqs;
        u.stats_bytes += c->stats_bytes;
    }
    *ret = u;
}
