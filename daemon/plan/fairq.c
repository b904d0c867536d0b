/* SPDX-License-Identifier: MIT */

/*
 * The planning queue: round-robin across uids, then across each uid's tenants, at run
 * granularity (fairq.h). Every node is a run: a tenant with work is represented by its head
 * run, which carries the tenant's bookkeeping (its last run, its run count) and links to the
 * head run of the uid's next tenant; a uid with work is represented by the head run of its
 * front tenant, which also carries the uid's bookkeeping (its last tenant, its tenant count)
 * and links to the next uid. When a run leaves, whichever of these roles it held passes to the
 * run that follows it, so the queue needs no node of its own and never allocates.
 * Invariants: a uid appears in the turn list at most once, exactly while one of its tenants has
 * jobs left; a tenant appears in its uid's tenant list at most once, exactly while it has jobs
 * left; only the run at the front of the turn list can have started, so at most one run is ever
 * partly handed out; runs_queued counts the runs not started; tenants counts the tenants in
 * every uid's list, uids the uids in the turn list.
 */

#include <errno.h>
#include <stddef.h>

#include "fairq.h"

static void uid_append(struct vase_fairq *q, struct vase_fairq_run *front) {
    front->next_uid = NULL;
    if (q->turn_last)
        q->turn_last->next_uid = front;
    else
        q->turn = front;
    q->turn_last = front;
}

static struct vase_fairq_run *find_uid(const struct vase_fairq *q, uint32_t uid) {
    for (struct vase_fairq_run *u = q->turn; u; u = u->next_uid)
        if (u->uid == uid)
            return u;
    return NULL;
}

/* The head run of tenant among the tenants of the uid whose front run is front, or NULL. */
static struct vase_fairq_run *find_tenant_of(struct vase_fairq_run *front, uint32_t tenant) {
    for (struct vase_fairq_run *h = front; h; h = h->next_turn)
        if (h->tenant == tenant)
            return h;
    return NULL;
}

int vase_fairq_push(struct vase_fairq *q, struct vase_fairq_run *run, uint32_t uid, uint32_t tenant,
                    struct vase_fairq_job *first) {
    if (!first)
        return -EINVAL;
    *run = (struct vase_fairq_run){.uid = uid, .tenant = tenant, .jobs = first};

    struct vase_fairq_run *front = find_uid(q, uid);
    struct vase_fairq_run *head = front ? find_tenant_of(front, tenant) : NULL;
    if (head) {
        head->last->next = run;
        head->last = run;
        head->runs++;
    } else {
        run->last = run;
        run->runs = 1;
        q->tenants++;
        if (front) {
            /* A tenant with no work joins the back of its uid's tenants. */
            front->tenant_last->next_turn = run;
            front->tenant_last = run;
            front->tenants++;
        } else {
            /* A uid with no work joins at the back: every uid already waiting goes first. */
            run->tenant_last = run;
            run->tenants = 1;
            uid_append(q, run);
            q->uids++;
        }
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
        /* The run's last job is out: the turn passes to the next uid. Within this uid, the
         * tenant's next run, if it has one, waits behind the uid's other tenants; and the uid,
         * if any of its tenants has work left, waits at the back for its next turn. */
        q->turn = head->next_uid;
        if (!q->turn)
            q->turn_last = NULL;
        struct vase_fairq_run *front = head->next_turn, *back = head->tenant_last;
        uint32_t tenants = head->tenants;
        struct vase_fairq_run *next = head->next;
        if (next) {
            next->last = head->last;
            next->runs = head->runs - 1;
            next->next_turn = NULL;
            if (front)
                back->next_turn = next;
            else
                front = next;
            back = next;
        } else {
            tenants--;
            q->tenants--;
        }
        if (front) {
            front->tenant_last = back;
            front->tenants = tenants;
            uid_append(q, front);
        } else {
            q->uids--;
        }
        head->next = head->next_turn = head->last = head->tenant_last = head->next_uid = NULL;
        head->runs = head->tenants = 0;
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
    for (const struct vase_fairq_run *u = q->turn; u; u = u->next_uid) {
        const struct vase_fairq_run *head = find_tenant_of((struct vase_fairq_run *)u, tenant);
        if (head)
            return head->runs - head->started;
    }
    return 0;
}
