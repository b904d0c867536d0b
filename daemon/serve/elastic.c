/* SPDX-License-Identifier: MIT */

/*
 * Elastic budgets (elastic.h). The targets of an arena are recomputed from scratch whenever its
 * waiting opens or its used bytes change: the deficit is what the waiting opens need beyond the
 * room the arena has for them, and balance.c spreads it over the sequences' next releases. As
 * sequences commit their shrunken plans the room grows and the releases still to come shrink,
 * so the targets stay put (or rise) while the waiters are admitted in order. Nothing here
 * reserves or releases pages except vase_elastic_grow(); the commits release (cycle.c).
 */

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/admitq.h"
#include "core/alloc.h"
#include "core/balance.h"
#include "elastic.h"
#include "core/log.h"
#include "core/registry.h"
#include "state.h"
#include "vase.pb-c.h"
#include "core/events.h"

uint32_t vase_elastic_plan_budget(const struct vased_seq *s) {
    return s->target_budget < s->params.budget ? s->target_budget : s->params.budget;
}

static void publish_change(struct vased *d, const struct vased_seq *s, uint32_t old,
                           const char *reason, uint32_t round) {
    Vase__BudgetChange bc = VASE__BUDGET_CHANGE__INIT;
    Vase__Event ev = VASE__EVENT__INIT;
    bc.seq_id = s->id;
    bc.client_id = s->client ? s->client->id : 0;
    bc.arena_id = s->arena_id;
    bc.old_budget = old;
    bc.new_budget = s->params.budget;
    bc.reason = (char *)reason;
    bc.round = round;
    bc.label = (char *)s->label;
    ev.body_case = VASE__EVENT__BODY_BUDGET_CHANGE;
    ev.budget_change = &bc;
    vase_events_publish(d->events, "budget", &ev);
}

/* Makes budget the one of s; publishes and counts the change. */
static void set_budget(struct vased *d, struct vased_seq *s, uint32_t budget, const char *reason,
                       uint32_t round) {
    uint32_t old = s->params.budget;
    s->params = vase_params_at_budget(&s->max_params, budget);
    s->keep = vase_plan_keep_count(&s->params);
    s->budget_changes++;
    if (budget < old)
        d->budget_shrinks_total++;
    else
        d->budget_grows_total++;
    log_debug("Sequence %u: budget %u -> %u (%s, round %u).", s->id, old, budget, reason, round);
    publish_change(d, s, old, reason, round);
}

void vase_elastic_committed(struct vased *d, struct vased_seq *s, uint32_t budget, uint32_t round) {
    if (budget == s->params.budget)
        return;
    /* Lower than the cap: the daemon made room; at the cap: the engine asked for it. */
    set_budget(d, s, budget, budget < s->cap_budget ? "make-room" : "cap", round);
}

static uint32_t waiters(const struct vased *d, uint32_t i) {
    return vase_admitq_count_arena(&d->admitq, i);
}

static uint32_t blocks_at(const struct vased_seq *s, uint32_t budget) {
    return vase_layout_blocks_for(&s->layout,
                                  vase_layout_steady_slots(budget, s->params.window, s->slack));
}

void vase_elastic_grow(struct vased *d, struct vased_seq *s) {
    uint32_t W = s->params.window, now = s->params.budget;
    if (s->target_budget <= now || d->stopping || !s->client || waiters(d, s->arena_id))
        return;
    struct vase_alloc *a = d->allocs[s->arena_id];
    /* The whole way, else halfway, and so on down to one window. */
    for (uint32_t want = s->target_budget; want > now; want = now + (want - now) / 2 / W * W) {
        uint32_t pages = blocks_at(s, want);
        if (pages > s->max_pages)
            pages = s->max_pages;
        uint64_t bytes =
            pages > s->n_pages ? (uint64_t)(pages - s->n_pages) * s->layout.page_bytes : 0;
        /* A cheap look first: most commits of a full arena find no room. */
        if (bytes > a->arena_bytes - a->used_bytes)
            continue;
        int r = vase_registry_grow_seq(s, a, pages, d->cfg.max_bytes_per_client);
        if (r == 0) {
            set_budget(d, s, want, "grow", s->rounds);
            return;
        }
        if (r != -ENOSPC && r != -EDQUOT) {
            log_warning_errno(r, "Cannot grow sequence %u: %m", s->id);
            return;
        }
    }
}

void vase_elastic_set_cap(struct vased *d, struct vased_seq *s, uint32_t cap) {
    s->cap_budget = cap;
    if (s->target_budget > cap || !waiters(d, s->arena_id))
        s->target_budget = cap;
    d->elastic_dirty = true;
}

/* The live sequences of arena i as the balancer sees them, in *ret (malloc). -ENOMEM. */
static int collect(const struct vased *d, uint32_t i, struct vased_seq ***ret_seqs,
                   struct vase_balance_seq **ret, size_t *ret_n) {
    size_t n = 0;
    for (struct vased_client *c = d->reg->clients; c; c = c->next)
        for (struct vased_seq *s = c->seqs; s; s = s->next)
            n += s->arena_id == i;
    struct vase_balance_seq *b = calloc(n ? n : 1, sizeof(*b));
    struct vased_seq **seqs = calloc(n ? n : 1, sizeof(*seqs));
    if (!b || !seqs) {
        free(b);
        free(seqs);
        return -ENOMEM;
    }
    size_t k = 0;
    for (struct vased_client *c = d->reg->clients; c; c = c->next)
        for (struct vased_seq *s = c->seqs; s; s = s->next) {
            if (s->arena_id != i)
                continue;
            seqs[k] = s;
            b[k++] = (struct vase_balance_seq){.min = s->min_budget,
                                               .cap = s->cap_budget,
                                               .max = s->max_budget,
                                               .window = s->params.window,
                                               .slack = s->slack,
                                               .block_tokens = s->layout.block_tokens,
                                               .weight = s->weight,
                                               .n_pages = s->n_pages,
                                               .page_bytes = s->layout.page_bytes};
        }
    *ret_seqs = seqs;
    *ret = b;
    *ret_n = n;
    return 0;
}

/* The bytes the waiting opens of arena i need beyond its room for them: the first one's, and
 * the later ones' while all of them could be made room for. 0 when none waits. */
static uint64_t deficit_of(const struct vased *d, uint32_t i, const struct vase_balance_seq *b,
                           size_t n, uint64_t *ret_page_bytes) {
    const struct vase_alloc *a = d->allocs[i];
    const struct vase_admit_wait *first = NULL;
    for (const struct vase_admit_wait *w = d->admitq.head; w && !first; w = w->next)
        if (w->arena_id == i)
            first = w;
    if (!first)
        return 0;
    *ret_page_bytes = first->page_bytes;
    /* Room for its pages: free granules, and the holes of its own page size. */
    uint64_t room = vase_alloc_free_bytes(a) +
                    (uint64_t)vase_alloc_class_holes(a, first->page_bytes) * first->page_bytes;
    uint64_t most = room;
    for (size_t k = 0; k < n; k++)
        most += vase_balance_release(&b[k], b[k].min);
    uint64_t need = 0;
    for (const struct vase_admit_wait *w = first; w; w = w->next)
        if (w->arena_id == i && (need == 0 || need + w->bytes <= most))
            need += w->bytes;
    if (need > room)
        return need - room;
    /* The retry found no room though the bytes are there (page sizes that do not mix): ask for
     * whole granules' worth. */
    return need > vase_alloc_free_bytes(a) ? need - vase_alloc_free_bytes(a) : a->granule_bytes;
}

static void rebalance_arena(struct vased *d, uint32_t i) {
    struct vased_seq **seqs;
    struct vase_balance_seq *b;
    size_t n;
    if (collect(d, i, &seqs, &b, &n) < 0) {
        log_oom();
        return;
    }
    uint64_t unit = 0;
    uint64_t deficit = deficit_of(d, i, b, n, &unit);
    enum vase_elastic_policy policy = (enum vase_elastic_policy)d->cfg.elastic_policy;
    /* First only the sequences of the first waiting open's page size: the pages they release
     * are room for its KV pages at once, where other sizes free room only as whole granules
     * empty. When they cannot cover the deficit, all of them. */
    struct vase_balance_seq *same = deficit ? calloc(n ? n : 1, sizeof(*same)) : NULL;
    int r = -ENOSPC;
    if (same) {
        for (size_t k = 0; k < n; k++) {
            same[k] = b[k];
            if (seqs[k]->layout.page_bytes != unit)
                same[k].min = same[k].cap;
        }
        r = vase_balance(same, n, deficit, policy);
        if (r >= 0)
            memcpy(b, same, n * sizeof(*b));
        free(same);
    }
    if (r < 0)
        r = vase_balance(b, n, deficit, policy);
    if (r == -ENOSPC)
        log_debug("Arena %u: the waiting opens need %llu more bytes than the minimums of the "
                  "elastic sequences can free; waiting for closes.",
                  i, (unsigned long long)deficit);
    for (size_t k = 0; k < n; k++)
        seqs[k]->target_budget = b[k].target;
    free(seqs);
    free(b);
}

void vase_elastic_rebalance(struct vased *d) {
    bool queue_changed = d->admitq.gen != d->elastic_gen;
    bool waiting_before = false;
    for (uint32_t i = 0; i < d->n_arenas; i++)
        waiting_before |= d->elastic_waiting[i];
    /* The common case, on every turn of the main loop: nothing waits, nothing did. */
    if (!d->admitq.n && !waiting_before)
        return;
    /* One pass over the queue for every arena's waiters. */
    bool waits[VASED_MAX_ARENAS] = {false};
    for (const struct vase_admit_wait *w = d->admitq.head; w; w = w->next)
        waits[w->arena_id] = true;
    for (uint32_t i = 0; i < d->n_arenas; i++) {
        uint64_t used = d->allocs[i]->used_bytes;
        bool waiting = waits[i];
        /* No one waits and no one did: every target is at its cap already. */
        bool stale = waiting ? queue_changed || d->elastic_dirty || used != d->elastic_used[i]
                             : d->elastic_waiting[i];
        d->elastic_used[i] = used;
        d->elastic_waiting[i] = waiting;
        if (stale)
            rebalance_arena(d, i);
    }
    d->elastic_gen = d->admitq.gen;
    d->elastic_dirty = false;
}

uint64_t vase_elastic_reclaiming(const struct vased *d, uint32_t *ret_shrunk) {
    uint64_t bytes = 0;
    uint32_t shrunk = 0;
    for (struct vased_client *c = d->reg->clients; c; c = c->next)
        for (struct vased_seq *s = c->seqs; s; s = s->next) {
            uint32_t keep = blocks_at(s, vase_elastic_plan_budget(s));
            if (s->n_pages > keep)
                bytes += (uint64_t)(s->n_pages - keep) * s->layout.page_bytes;
            shrunk += s->params.budget < s->max_budget;
        }
    if (ret_shrunk)
        *ret_shrunk = shrunk;
    return bytes;
}
