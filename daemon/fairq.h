/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The evictor's planning queue as a plain data structure: no threads, no locks, no
 * allocation. A run is a list of jobs queued for a tenant (the client it was submitted for).
 * Each tenant with work keeps a FIFO of its runs, and tenants take turns: a pop hands out the
 * next job of the head run of the tenant whose turn it is, and the turn passes to the next
 * tenant only when that run's last job has been handed out. So the jobs of one run leave
 * together, and no tenant's second run leaves before the first run of every tenant that was
 * already waiting. The caller owns every node and serializes calls (the evictor holds its
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
    uint32_t tenant;
    bool started;                /* one of its jobs has been handed out */
    struct vase_fairq_job *jobs; /* the jobs not yet handed out, in order */
    struct vase_fairq_run *next; /* the tenant's next run */
    /* Only on a tenant's head run, the one in the turn list: */
    struct vase_fairq_run *last;      /* the tenant's last run */
    uint32_t runs;                    /* the tenant's runs with jobs left, this one included */
    struct vase_fairq_run *next_turn; /* the next tenant's head run */
};

/* All zero is an empty queue. */
struct vase_fairq {
    struct vase_fairq_run *turn, *turn_last; /* head runs by turn; turn is served now */
    uint32_t runs_queued;                    /* runs none of whose jobs was handed out */
    uint32_t tenants;                        /* tenants in the turn list */
};

struct vase_fairq_counts {
    uint32_t runs_queued;     /* runs none of whose jobs was handed out */
    uint32_t runs_partial;    /* 0 or 1: the run being handed out, some jobs out, some left */
    uint32_t tenants_waiting; /* tenants with at least one queued run */
};

/*
 * Queues run for tenant with its jobs, first and those linked from it through next (NULL
 * ends the list). The run and its jobs belong to the queue until its last job is popped; a
 * job belongs to the queue until it is popped. Costs one step per tenant with work. 0, or
 * -EINVAL for a run without jobs (nothing queued).
 */
int vase_fairq_push(struct vase_fairq *q, struct vase_fairq_run *run, uint32_t tenant,
                    struct vase_fairq_job *first);

/* Hands out the next job (its next set to NULL) in *ret. 1, or 0 when the queue is empty
 * (*ret untouched). */
int vase_fairq_pop(struct vase_fairq *q, struct vase_fairq_job **ret);

bool vase_fairq_is_empty(const struct vase_fairq *q);
void vase_fairq_get_counts(const struct vase_fairq *q, struct vase_fairq_counts *ret);
/* The runs of tenant none of whose jobs was handed out. Costs one step per tenant with work. */
uint32_t vase_fairq_count_tenant(const struct vase_fairq *q, uint32_t tenant);
