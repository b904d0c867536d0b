/* SPDX-License-Identifier: MIT */

/*
 * The planning queue: round-robin across tenants at run granularity (fairq.h). The turn list
 * links one run per tenant with work, that tenant's head run, which also carries the tenant's
 * bookkeeping (its last run, its run count), so the queue needs no node of its own and never
 * allocates. Invariants: a tenant appears in the turn list at most once, exactly while it has
 * jobs left; only the run at the front of the turn list can have started, so at most one run
 * is ever partly handed out; runs_queued counts the runs not started.
 */

#include <errno.h>
#include <stddef.h>

#include "fairq.h"

static void turn_append(struct vase_fairq *q, struct vase_fairq_run *head) {
    head->next_turn = NULL;
    if (q->turn_last)
        q->turn_last->next_turn = head;
    else
        q->turn = head;
    q->turn_last = head;
}

static struct vase_fairq_run *find_tenant(const struct vase_fairq *q, uint32_t tenant) {
    for (struct vase_fairq_run *h = q->turn; h; h = h->next_turn)
        if (h->tenant == tenant)
            return h;
    return NULL;
}

int vase_fairq_push(struct vase_fairq *q, struct vase_fairq_run *run, uint32_t tenant,
                    struct vase_fairq_job *first) {
    if (!first)
        return -EINVAL;
    *run = (struct vase_fairq_run){.tenant = tenant, .jobs = first};

    struct vase_fairq_run *head = find_tenant(q, tenant);
    if (head) {
        head->last->next = run;
        head->last = run;
        head->runs++;
    } else {
        /* A tenant with no work joins at the back: everyone already waiting goes first. */
        run->last = run;
        run->runs = 1;
        turn_append(q, run);
        q->tenants++;
    }
    q->runs_queued++;
    return 0;
}

int vase_fairq_pop(struct vase_fairq *q, struct vase_fairq_job **ret) {
    struct vase_fairq_run *head = q->turn;
    if (!head)
        return 0;

    struct vase_fairq_job *j = head->jobs;
    head->jobs = j->next;
    j->next = NULL;
    if (!head->started) {
        head->started = true;
        q->runs_queued--;
    }
    if (!head->jobs) {
        /* The run's last job is out: the turn passes on, and the tenant's next run, if it has
         * one, waits at the back for the tenant's next turn. */
        q->turn = head->next_turn;
        if (!q->turn)
            q->turn_last = NULL;
        struct vase_fairq_run *next = head->next;
        if (next) {
            next->last = head->last;
            next->runs = head->runs - 1;
            turn_append(q, next);
        } else {
            q->tenants--;
        }
        head->next = head->next_turn = head->last = NULL;
        head->runs = 0;
    }
    *ret = j;
    return 1;
}

bool vase_fairq_is_empty(const struct vase_fairq *q) {
    return !q->turn;
}

void vase_fairq_get_counts(const struct vase_fairq *q, struct vase_fairq_counts *ret) {
    /* Only the front run can have started; its tenant is waiting only for a run after it. */
    bool partial = q->turn && q->turn->started;
    *ret = (struct vase_fairq_counts){
        .runs_queued = q->runs_queued,
        .runs_partial = partial,
        .tenants_waiting = q->tenants - (partial && q->turn->runs == 1),
    };
}

uint32_t vase_fairq_count_tenant(const struct vase_fairq *q, uint32_t tenant) {
    const struct vase_fairq_run *head = find_tenant(q, tenant);
    return head ? head->runs - head->started : 0;
}
