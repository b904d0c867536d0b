/* SPDX-License-Identifier: MIT */

/*
 * The daemon's events, built from the registry and handed to events.c, which numbers and sends
 * them. Only the main thread publishes. A pressure event goes out when an arena's free pages
 * cross 10% of it, either way, and for every arena at each stats_interval, so a subscriber that
 * joined late or lost one learns the state without asking.
 */

#include "core/alloc.h"
#include "core/arena.h"
#include "core/events.h"
#include "plan/evictor.h"
#include "core/log.h"
#include "publish.h"
#include "core/registry.h"
#include "state.h"

void vase_publish_arena_status(const struct vased *d, uint32_t i, Vase__ArenaStatus *ret) {
    const struct vase_alloc *a = d->allocs[i];
    vase__arena_status__init(ret);
    ret->id = d->arenas[i]->id;
    ret->name = (char *)d->arena_names[i];
    ret->kind = d->arenas[i]->kind;
    ret->granule_bytes = a->granule_bytes;
    ret->bytes_total = a->arena_bytes;
    ret->bytes_free = vase_alloc_free_bytes(a);
    ret->bytes_pages = a->used_bytes;
}

void vase_publish_client_info(const struct vased *d, const struct vased_client *c,
                              Vase__ClientInfo *ret) {
    vase__client_info__init(ret);
    ret->client_id = c->id;
    ret->name = c->name ? c->name : (char *)"";
    ret->pid = c->pid;
    ret->uid = c->uid;
    ret->gid = c->gid;
    ret->bytes = c->bytes;
    ret->seqs = c->n_seqs;
    ret->models = c->n_models;
    ret->connected_seconds = vased_now() - c->connected_at;
    ret->plans_queued = d->evictor ? vase_evictor_count_queued(d->evictor, c->id) : 0;
    ret->state = (char *)vase_registry_client_state(c);
}

void vase_publish_seq_info(const struct vased_seq *s, Vase__SeqInfo *ret) {
    vase__seq_info__init(ret);
    ret->seq_id = s->id;
    ret->client_id = s->client ? s->client->id : 0;
    ret->model_id = s->model ? s->model->id : 0;
    /* An orphan (its model unregistered with its client) has no name. */
    ret->model_name = s->model && s->model->name ? s->model->name : (char *)"";
    ret->policy = (char *)vase_policy_to_string(s->policy);
    ret->mode = s->mode == VASE__MODE__MODE_SYNC ? VASE__MODE__MODE_SYNC : VASE__MODE__MODE_ASYNC;
    ret->budget = s->params.budget;
    ret->window = s->params.window;
    ret->len = s->len;
    ret->capacity = s->capacity;
    ret->pages = s->n_pages;
    ret->bytes = vase_registry_seq_bytes(s);
    ret->block_tokens = s->layout.block_tokens;
    ret->rounds = s->rounds;
    ret->position = s->position;
    ret->state = (char *)vase_registry_state_name(s->state);
    ret->last_plan_seconds = s->last_plan_seconds;
    ret->arena_id = s->arena_id;
    ret->max_budget = s->max_budget;
    ret->min_budget = s->min_budget;
    ret->cap_budget = s->cap_budget;
    ret->target_budget = s->target_budget;
    ret->weight = s->weight;
    ret->budget_changes = s->budget_changes;
    ret->stalls = s->engine_stalls;
    ret->stall_seconds = s->engine_stall_seconds;
    ret->compact_seconds = s->engine_compact_seconds;
    ret->protect_prompt = s->max_params.protect_prompt != 0;
    ret->prompt_len = s->prompt_len;
    ret->label = (char *)s->label;
}

void vase_publish_seq(struct vased *d, const struct vased_seq *s, bool open) {
    Vase__SeqInfo info;
    Vase__Event e = VASE__EVENT__INIT;
    vase_publish_seq_info(s, &info);
    e.body_case = open ? VASE__EVENT__BODY_SEQ_OPEN : VASE__EVENT__BODY_SEQ_CLOSE;
    if (open)
        e.seq_open = &info;
    else
        e.seq_close = &info;
    vase_events_publish(d->events, "seq", &e);
}

void vase_publish_client(struct vased *d, const struct vased_client *c, bool join) {
    Vase__ClientInfo info;
    Vase__Event e = VASE__EVENT__INIT;
    vase_publish_client_info(d, c, &info);
    e.body_case = join ? VASE__EVENT__BODY_CLIENT_JOIN : VASE__EVENT__BODY_CLIENT_LEAVE;
    if (join)
        e.client_join = &info;
    else
        e.client_leave = &info;
    vase_events_publish(d->events, "client", &e);
}

void vase_publish_pressure(struct vased *d, bool force) {
    for (uint32_t i = 0; i < d->n_arenas; i++) {
        const struct vase_alloc *a = d->allocs[i];
        uint64_t free_bytes = vase_alloc_free_bytes(a);
        bool low = free_bytes < a->arena_bytes / 10;
        if (!force && low == d->pressure_low[i])
            continue;
        if (low != d->pressure_low[i])
            log_full_errno(low ? LOG_WARNING : LOG_INFO, 0,
                           "Arena %u: %llu of %llu bytes free (%s 10%%).", i,
                           (unsigned long long)free_bytes, (unsigned long long)a->arena_bytes,
                           low ? "below" : "back above");
        d->pressure_low[i] = low;

        Vase__ArenaStatus as;
        Vase__Event e = VASE__EVENT__INIT;
        vase_publish_arena_status(d, i, &as);
        e.body_case = VASE__EVENT__BODY_PRESSURE;
        e.pressure = &as;
        vase_events_publish(d->events, "pressure", &e);
    }
}

void vase_publish_eviction(struct vased *d, Vase__EvictPlan *plan) {
    Vase__Event ev = VASE__EVENT__INIT;
    ev.body_case = VASE__EVENT__BODY_EVICTION;
    ev.eviction = plan;
    vase_events_publish(d->events, "evict", &ev);
}
