/* SPDX-License-Identifier: MIT */

/*
 * Sequences kept across a restart, on the registry's side (restore.h reads and writes the
 * snapshot): a saved sequence is checked again against what an open of its request would hold
 * before any of its pages is claimed, since the snapshot is input; it is then kept unowned on
 * the restored list, unreachable by id, its pages held, until a client of its uid reopens it
 * (adopt: onto the client's list and the id table, charged to it) or restore_grace runs out
 * (drop: its pages back to the allocator). Its state is made as an open makes it
 * (vase_registry_seq_init()), then given what it had become.
 */

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "registry.h"
#include "registry_internal.h"

/* The budget range of a saved sequence: what elastic_from() and the elastic module keep. */
static bool saved_budgets_valid(const struct vased_seq_saved *sv) {
    uint32_t W = sv->req.params.window, max = sv->req.params.budget, min = sv->req.min_budget;
    return W > 0 && min > W && min % W == 0 && min <= max && sv->budget >= min &&
           sv->budget <= max && sv->budget % W == 0 && sv->target_budget >= min &&
           sv->target_budget <= sv->cap_budget && sv->cap_budget <= max && sv->req.weight >= 1;
}

/* A protected prompt fits every budget the sequence may have: as elastic_from() requires. */
static bool saved_prompt_fits(const struct vased_seq_saved *sv) {
    struct vase_params at_min = vase_params_at_budget(&sv->req.params, sv->req.min_budget);
    return vase_params_explain_prompt(&at_min, sv->req.policy, sv->req.prompt_len, NULL, 0) == 0;
}

/* Takes the saved pages of its three sizes, all or none. */
static int claim_saved(struct vase_alloc *alloc, const struct vased_seq_saved *sv,
                       const struct vase_plan_layout *plan) {
    const struct vase_layout *l = &sv->layout;
    int r = vase_alloc_claim(alloc, l->page_bytes, sv->pages, sv->n_pages, NULL);
    if (r < 0)
        return r;
    r = vase_alloc_claim(alloc, l->ring_page_bytes, sv->ring_pages, sv->n_ring_pages, NULL);
    if (r < 0) {
        vase_alloc_release(alloc, l->page_bytes, sv->pages, sv->n_pages, NULL);
        return r;
    }
    r = vase_alloc_claim(alloc, plan->plan_page_bytes, sv->plan_pages, sv->n_plan_pages, NULL);
    if (r < 0) {
        vase_alloc_release(alloc, l->page_bytes, sv->pages, sv->n_pages, NULL);
        vase_alloc_release(alloc, l->ring_page_bytes, sv->ring_pages, sv->n_ring_pages, NULL);
    }
    return r;
}

int vase_registry_restore_seq(struct vase_registry *reg, struct vase_alloc *alloc,
                              const struct vased_seq_saved *sv, char *msg, size_t msg_size) {
    struct vased_seq_footprint most, fp;
    const struct vase_layout *l = &sv->layout;
    int r;

    msg[0] = '\0';
    if (sv->id == 0 || vase_registry_find_restored(reg, sv->id)) {
        snprintf(msg, msg_size, "sequence id %u is 0 or given twice", sv->id);
        return -EINVAL;
    }
    /* In this order: the budgets must be valid before the prompt is checked at min_budget. */
    if (vase_params_check(&sv->req.params, sv->req.policy) < 0 || !saved_budgets_valid(sv) ||
        !saved_prompt_fits(sv) || vase_wire_label_check(sv->req.label, NULL, 0) < 0) {
        snprintf(msg, msg_size, "sequence %u: its parameters, budgets or label are not valid",
                 sv->id);
        return -EINVAL;
    }
    if ((r = vase_registry_footprint(l, &sv->req, &most, msg, msg_size)) < 0 ||
        (r = vase_registry_footprint_at(l, &sv->req, sv->budget, &fp, msg, msg_size)) < 0)
        return r;
    if (sv->n_pages == 0 || sv->n_pages > most.kv_pages || sv->n_ring_pages != fp.ring_pages ||
        sv->n_plan_pages != fp.plan.plan_pages ||
        sv->len > (uint64_t)sv->n_pages * l->block_tokens) {
        snprintf(msg, msg_size,
                 "sequence %u: %u KV, %u ring and %u plan pages and len %u do not fit its "
                 "request (at most %u KV, %u ring, %u plan pages)",
                 sv->id, sv->n_pages, sv->n_ring_pages, sv->n_plan_pages, sv->len, most.kv_pages,
                 fp.ring_pages, fp.plan.plan_pages);
        return -EINVAL;
    }

    struct vased_seq *s = vase_registry_seq_new(reg, l, &most);
    if (!s)
        return -ENOMEM;
    r = claim_saved(alloc, sv, &fp.plan);
    if (r < 0) {
        vase_registry_seq_free(reg, s);
        if (r == -EEXIST)
            snprintf(msg, msg_size,
                     "sequence %u: a page lies outside the arena or is another's too", sv->id);
        return r;
    }
    memcpy(s->pages, sv->pages, (size_t)sv->n_pages * sizeof(uint32_t));
    memcpy(s->ring_pages, sv->ring_pages, (size_t)sv->n_ring_pages * sizeof(uint32_t));
    memcpy(s->plan_pages, sv->plan_pages, (size_t)sv->n_plan_pages * sizeof(uint32_t));
    /* What an open of its request would hold (checked above: the same ring and plan pages, no
     * more KV pages), then what it had become. */
    vase_registry_seq_init(s, l, &sv->req, sv->budget, &most, &fp);
    s->n_pages = sv->n_pages;
    s->capacity = sv->n_pages * l->block_tokens;
    s->id = sv->id;
    s->owner_uid = sv->uid;
    memcpy(s->resume_token, sv->token, sizeof(s->resume_token));
    s->arena_id = sv->arena_id;
    s->cap_budget = sv->cap_budget;
    s->target_budget = sv->target_budget;
    s->budget_changes = sv->budget_changes;
    s->len = sv->len;
    s->position = sv->position;
    s->rounds = sv->rounds;
    s->next = reg->restored;
    reg->restored = s;
    reg->n_restored++;
    if (reg->next_seq_id <= s->id)
        reg->next_seq_id = s->id + 1;
    return 0;
}

struct vased_seq *vase_registry_find_restored(const struct vase_registry *reg, uint32_t id) {
    for (struct vased_seq *s = reg->restored; s; s = s->next)
        if (s->id == id)
            return s;
    return NULL;
}

static void restored_unlink(struct vase_registry *reg, struct vased_seq *s) {
    for (struct vased_seq **p = &reg->restored; *p; p = &(*p)->next)
        if (*p == s) {
            *p = s->next;
            reg->n_restored--;
            break;
        }
    s->next = NULL;
}

void vase_registry_adopt_restored(struct vase_registry *reg, struct vased_client *c,
                                  struct vased_model *m, struct vased_seq *s) {
    restored_unlink(reg, s);
    s->client = c;
    s->model = m;
    c->bytes += vase_registry_seq_bytes(s);
    vase_registry_seq_link(reg, c, s);
}

void vase_registry_drop_restored(struct vase_registry *reg, struct vase_alloc *alloc,
                                 struct vased_seq *s) {
    restored_unlink(reg, s);
    vase_registry_seq_release_pages(s, alloc, NULL);
    vase_registry_seq_free(reg, s);
}
