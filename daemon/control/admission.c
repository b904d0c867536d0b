/* SPDX-License-Identifier: MIT */

/*
 * The admission of opens, in one place: whether a new sequence fits now (its uid's sequences,
 * then the registry's all-or-nothing reservation against the arena and the client's quotas);
 * if not, whether it may wait (it could fit the whole arena and asked for an admission wait),
 * and then it is parked in the admission queue (core/admitq.h) behind the opens already
 * waiting for that arena, tried again in arrival order whenever the arena's used bytes changed,
 * and refused with ENOSPC when its wait passes. Nothing overtakes a parked open, not even into
 * memory that is free now: it may be the room being made for it (serve/elastic.c). Every open
 * admitted, at once or later, is answered here with its SeqLayout. Main thread only.
 */

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "admission.h"
#include "core/admitq.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/registry.h"
#include "reply.h"
#include "serve/access.h"
#include "serve/metrics.h"
#include "serve/publish.h"
#include "state.h"
#include "wire.h"

void vase_admission_send_layout(struct vased *d, const struct vase_reply_to *p,
                                struct vased_seq *s) {
    /* The label is one vase_wire_label_check() accepted: nothing in it needs escaping. */
    log_debug("Client %u opened sequence %u%s%s: %s, budget %u, window %u, %llu bytes.",
              s->client->id, s->id, s->label[0] ? " labelled " : "", s->label,
              vase_policy_to_string(s->policy), s->params.budget, s->params.window,
              (unsigned long long)vase_registry_seq_bytes(s));

    Vase__SeqLayout sl = VASE__SEQ_LAYOUT__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    sl.seq_id = s->id;
    sl.capacity = s->capacity;
    sl.n_pages = s->n_pages;
    sl.pages = s->pages;
    sl.n_ring_pages = s->n_ring_pages;
    sl.ring_pages = s->ring_pages;
    sl.n_plan_pages = s->n_plan_pages;
    sl.plan_pages = s->plan_pages;
    sl.keep = s->keep;
    sl.plans_per_page = s->plan.plans_per_page;
    sl.plan_page_bytes = s->plan.plan_page_bytes;
    sl.window = s->params.window;
    sl.budget = s->params.budget;
    sl.max_budget = s->max_budget;
    sl.slack = s->slack;
    sl.min_budget = s->min_budget;
    sl.weight = s->weight;
    sl.resume_token =
        (ProtobufCBinaryData){.len = sizeof(s->resume_token), .data = s->resume_token};
    sl.rounds = s->rounds;
    sl.len = s->len;
    sl.position = s->position;
    e.body_case = VASE__ENVELOPE__BODY_SEQ_LAYOUT;
    e.seq_layout = &sl;
    vase_reply_send(d, p, &e);
    vase_publish_seq(d, s, true);
    vase_publish_pressure(d, false);
}

/* Whether a refusal with -ENOSPC can end by waiting: the sequence fits the whole arena. Its
 * footprint (at its min_budget: what admits it) in *ret_bytes. */
static bool could_fit(const struct vase_alloc *a, const struct vased_model *m,
                      const struct vased_seq_request *req, uint64_t *ret_bytes) {
    struct vased_seq_footprint fp;
    char msg[8];
    if (vase_registry_footprint_at(&m->layout, req, req->min_budget, &fp, msg, sizeof(msg)) < 0)
        return false;
    *ret_bytes = fp.bytes;
    return fp.bytes <= a->arena_bytes;
}

int vase_admission_uid_quota(const struct vased *d, const struct vased_client *c, char *why,
                             size_t why_size) {
    if (!vase_access_uid_capped(d, c->uid))
        return 0;
    struct vased_uid_usage used;
    vase_registry_uid_usage(d->reg, c->uid, &used);
    if (used.seqs < d->cfg.max_seqs_per_uid)
        return 0;
    snprintf(why, why_size, "the clients of uid %u have max_seqs_per_uid (%u) sequences open",
             (unsigned)c->uid, d->cfg.max_seqs_per_uid);
    return -EDQUOT;
}

/* Parks an open that found no room: 0 (parked, the reply comes later), or the -code of the
 * Error sent. */
static int park_open(struct vased *d, struct vased_client *c, const struct vase_reply_to *p,
                     const struct vased_model *m, const struct vased_seq_request *req,
                     uint64_t bytes, uint32_t wait_ms, const char *why) {
    uint32_t most = d->cfg.max_seqs_per_client;
    if (vase_admitq_count_client(&d->admitq, c->id) >= most)
        return vase_reply_error(d, p, EDQUOT,
                                "cannot open the sequence: %s; and the client already has "
                                "max_seqs_per_client (%u) opens waiting for room",
                                why, most);
    most = d->cfg.max_waiting_opens_per_uid;
    if (vase_access_uid_capped(d, c->uid) && vase_admitq_count_uid(&d->admitq, c->uid) >= most)
        return vase_reply_error(d, p, EDQUOT,
                                "cannot open the sequence: %s; and the clients of uid %u already "
                                "have max_waiting_opens_per_uid (%u) opens waiting for room",
                                why, (unsigned)c->uid, most);
    if (p->id_len > VASE_ADMIT_MAX_ROUTING_ID)
        return vase_reply_error(d, p, ENOSPC, "cannot open the sequence: %s", why);
    struct vase_admit_wait *w = vase_admit_wait_new();
    if (!w) {
        log_oom();
        return vase_reply_error(d, p, ENOMEM, "out of memory parking the open");
    }
    w->client_id = c->id;
    w->uid = c->uid;
    w->arena_id = m->arena_id;
    w->model_id = m->id;
    w->req = *req;
    w->bytes = bytes;
    w->page_bytes = m->layout.page_bytes;
    w->wait_ms = wait_ms;
    w->deadline = vased_now() + wait_ms / 1000.0;
    memcpy(w->routing_id, p->id, p->id_len);
    w->routing_id_len = p->id_len;
    w->request_id = p->request_id;
    w->cred_known = p->cred_known;
    w->cred = p->cred;
    vase_admitq_push(&d->admitq, w);
    /* The next retry tries the arena's first waiter again and records what it saw. */
    d->admit_free_seen[m->arena_id] = UINT64_MAX;
    log_debug("Client %u: open of a sequence of model %u parked for up to %u ms (%s).", c->id,
              m->id, wait_ms, why);
    return 0;
}

int vase_admission_open(struct vased *d, struct vased_client *c, const struct vase_reply_to *p,
                        struct vased_model *m, const struct vased_seq_request *req,
                        uint32_t wait_ms) {
    struct vased_seq *s;
    char why[256];
    int r = vase_admission_uid_quota(d, c, why, sizeof(why));
    if (r < 0)
        return vase_reply_error(d, p, -r, "cannot open the sequence: %s", why);
    struct vase_alloc *a = d->allocs[m->arena_id];
    uint32_t ahead = vase_admitq_count_arena(&d->admitq, m->arena_id);
    uint64_t bytes;
    if (ahead && c->n_seqs < d->cfg.max_seqs_per_client && could_fit(a, m, req, &bytes)) {
        /* Opens wait for this arena already: nothing overtakes them, not even into memory that
         * is free now (it may be the room being made for them). */
        snprintf(why, sizeof(why), "%u earlier opens wait for room in arena %u", ahead,
                 m->arena_id);
        r = -ENOSPC;
    } else {
        r = vase_registry_open_seq(d->reg, a, c, m, req, d->cfg.max_seqs_per_client,
                                   d->cfg.max_bytes_per_client, &s, why, sizeof(why));
    }
    if (r == -ENOSPC && wait_ms > 0 && could_fit(a, m, req, &bytes))
        return park_open(d, c, p, m, req, bytes, wait_ms, why[0] ? why : strerror(-r));
    if (r < 0)
        return vase_reply_error(d, p, -r, "cannot open the sequence: %s",
                                why[0] ? why : strerror(-r));
    vase_admission_send_layout(d, p, s);
    return 0;
}

static struct vase_reply_to wait_reply_to(const struct vase_admit_wait *w) {
    return (struct vase_reply_to){.id = w->routing_id,
                                  .id_len = w->routing_id_len,
                                  .request_id = w->request_id,
                                  .cred_known = w->cred_known,
                                  .cred = w->cred,
                                  .body = VASE__ENVELOPE__BODY_OPEN_SEQ};
}

/* Tries a parked open once more. 1 admitted, 0 still no room (it stays parked), or < 0 refused
 * for another reason (replied). */
static int retry_open(struct vased *d, const struct vase_admit_wait *w) {
    struct vase_reply_to p = wait_reply_to(w);
    struct vased_client *c = vase_registry_find_client(d->reg, w->client_id);
    struct vased_model *m;
    if (!c || vase_registry_get_model(d->reg, c, w->model_id, &m) < 0)
        return vase_reply_error(d, &p, ENOENT, "model %u is gone", w->model_id);
    struct vased_seq *s;
    char why[256];
    /* Its uid may have opened others meanwhile. */
    int r = vase_admission_uid_quota(d, c, why, sizeof(why));
    if (r < 0)
        return vase_reply_error(d, &p, -r, "cannot open the sequence: %s", why);
    r = vase_registry_open_seq(d->reg, d->allocs[w->arena_id], c, m, &w->req,
                               d->cfg.max_seqs_per_client, d->cfg.max_bytes_per_client, &s, why,
                               sizeof(why));
    if (r == -ENOSPC)
        return 0;
    if (r < 0)
        return vase_reply_error(d, &p, -r, "cannot open the sequence: %s",
                                why[0] ? why : strerror(-r));
    log_debug("Client %u: parked open admitted.", c->id);
    vase_admission_send_layout(d, &p, s);
    return 1;
}

void vase_admission_retry(struct vased *d) {
    uint32_t blocked = 0; /* bit i: arena i's first waiter still does not fit */
    bool tried[VASED_MAX_ARENAS] = {false};
    struct vase_admit_wait *prev = NULL, *w = d->admitq.head;

    while (w) {
        struct vase_admit_wait *next = w->next;
        uint32_t bit = 1u << w->arena_id;
        struct vase_alloc *a = d->allocs[w->arena_id];
        /* Strict FIFO per arena: nothing overtakes a waiter that does not fit, and nothing is
         * tried while the arena's used bytes are what they were when it last did not fit. */
        if ((blocked & bit) ||
            (!tried[w->arena_id] && a->used_bytes >= d->admit_free_seen[w->arena_id])) {
            blocked |= bit;
            prev = w;
            w = next;
            continue;
        }
        tried[w->arena_id] = true;
        int r = retry_open(d, w);
        if (r < 0)
            d->metrics.refusals[vase_metrics_refusal_of(r)]++;
        if (r == 0) {
            blocked |= bit;
            d->admit_free_seen[w->arena_id] = a->used_bytes;
            prev = w;
        } else {
            vase_admitq_unlink(&d->admitq, prev, w);
            free(w);
        }
        w = next;
    }
}

void vase_admission_expire(struct vased *d, double now) {
    struct vase_admit_wait *w;
    while ((w = vase_admitq_pop_expired(&d->admitq, now))) {
        /* The next retry tries the arena's first waiter again, though no memory changed: the
         * one that expired may have been what held it back. */
        d->admit_free_seen[w->arena_id] = UINT64_MAX;
        struct vase_reply_to p = wait_reply_to(w);
        log_debug("Client %u: parked open refused after %u ms.", w->client_id, w->wait_ms);
        d->metrics.refusals[VASE_METRICS_REFUSAL_TIMEOUT]++;
        vase_reply_error(d, &p, ENOSPC,
                         "cannot open the sequence: not enough free memory in the arena; waited "
                         "%u ms (admission_wait_ms) and no room was freed in time",
                         w->wait_ms);
        free(w);
    }
}
