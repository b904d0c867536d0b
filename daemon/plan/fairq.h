/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The evictor's planning queue as a plain data structure: no threads, no locks, no
 * allocation. A run is a list of jobs queued for a tenant (the client it was submitted for),
 * and every tenant belongs to one uid (the client's, as the kernel reported it). Fairness has
 * two levels: uids take turns, and within a uid its tenants take turns, each turn one run. A
 * pop hands out the next job of the head run of the front tenant of the uid whose turn it is;
 * when that run's last job is out, that tenant goes to the back of its uid's tenants (if it has
 * runs left) and the uid to the back of the uids (if any of its tenants has runs left). So the
 * jobs of one run leave together; no uid's second run leaves before the first run of every uid
 * that was already waiting, however many tenants it has; and within a uid, no tenant's second
 * run leaves before the first run of each of that uid's tenants already waiting. A tenant's
 * uid is the one given with its first run still queued; the caller gives every run of one
 * tenant the same uid. The caller owns every node and serializes calls (the evictor holds its
 * mutex).
 */

#include <stdbool.h>
#include <stdint.h>

/* Embedded in the caller's job. */
struct vase_fairq_job {
    struct vase_fairq_job *next;
};

/* Embedded in the caller's run; its fields are the queue's. */
struct vase_fairq_run {
    uint32_t uid, tenant;
    bool started;                /* one of its jobs has been handed out */
    struct vase_fairq_job *jobs; /* the jobs not yet handed out, in order */
    struct vase_fairq_run *next; /* the tenant's next run */
    /* Only on a tenant's head run, the one in its uid's tenant list: */
    struct vase_fairq_run *last;      /* the tenant's last run */
    uint32_t runs;                    /* the tenant's runs with jobs left, this one included */
    struct vase_fairq_run *next_turn; /* the head run of the uid's next tenant */
    /* Only on a uid's front tenant's head run, the one in the uid turn list: */
    struct vase_fairq_run *tenant_last; /* the head run of the uid's last tenant */
    uint32_t tenants;                   /* the uid's tenants with jobs left */
    struct vase_fairq_run *next_uid;    /* the front head run of the next uid */
};

/* All zero is an empty queue. */
struct vase_fairq {
    struct vase_fairq_run *turn, *turn_last; /* uids' front runs by turn; turn is served now */
    uint32_t runs_queued;                    /* runs none of whose jobs was handed out */
    uint32_t tenants;                        /* tenants with jobs left, of every uid */
    uint32_t uids;                           /* uids in the turn list */
};

struct vase_fairq_counts {
    uint32_t runs_queued;     /* runs none of whose jobs was handed out */
    uint32_t runs_partial;    /* 0 or 1: the run being handed out, some jobs out, some left */
    uint32_t tenants_waiting; /* tenants with at least one queued run */
};

/*
 * Queues run for tenant of uid with its jobs, first and those linked from it through next (NULL
 * ends the list). The run and its jobs belong to the queue until its last job is popped; a
 * job belongs to the queue until it is popped. Costs one step per uid with work and one per
 * tenant of uid with work. 0, or -EINVAL for a run without jobs (nothing queued).
 */
int vase_fairq_push(struct vase_fairq *q, struct vase_fairq_run *run, uint32_t uid, uint32_t tenant,
                    struct vase_fairq_job *first);

/* Hands out the next job (its next set to NULL) in *ret. 1, or 0 when the queue is empty
 * (*ret untouched). */
int vase_fairq_pop(struct vase_fairq *q, struct vase_fairq_job **ret);

bool vase_fairq_is_empty(const struct vase_fairq *q);
void vase_fairq_get_counts(const struct vase_fairq *q, struct vase_fairq_counts *ret);
/* The runs of tenant none of whose jobs was handed out. Costs one step per tenant with work. */
uint32_t vase_fairq_count_tenant(const struct vase_fairq *q, uint32_t tenant);
