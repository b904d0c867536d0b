/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The evictor: a pool of threads that compute eviction plans. The main thread describes one
 * eviction as a struct vase_plan_run holding copies of everything the plan reads besides the
 * arena itself; the evictor cuts it into layer-range jobs, threads compute them with the
 * planner of the run's arena (planner.h), which writes the keep lists into the sequence's plan
 * pages, and each finished job is posted back to the main thread over an inproc ZeroMQ
 * PUSH/PULL pair. Threads take jobs from a queue that serves the uids in turn, then each uid's
 * clients in turn, one run each (fairq.h), so that neither a client with many sequences nor a
 * uid with many clients can hold back the plans of the others. No
 * lock guards the registry: threads never see it. Each thread makes its planner state on its
 * first job over host memory (one for all host arenas) or over a device arena (one per arena),
 * and frees it when it stops.
 */

#include <stdbool.h>
#include <stdint.h>

#include "planner.h"

#define VASE_EVICTOR_ENDPOINT "inproc://vase-evictor"

struct vase_evictor;

/* Starts nthreads (>= 1) threads; the results socket (PULL) lives in zmq_ctx. 0 or -errno. */
int vase_evictor_new(void *zmq_ctx, unsigned nthreads, struct vase_evictor **ret);
/* Stops the threads after their current job, drops queued jobs, joins, frees the jobs. Runs
 * are not freed (their owners do that). Accepts NULL. */
struct vase_evictor *vase_evictor_free(struct vase_evictor *ev);

/* The PULL socket the main thread polls for finished jobs. */
void *vase_evictor_socket(struct vase_evictor *ev);
unsigned vase_evictor_threads(const struct vase_evictor *ev);

/* Queues a run, cut into layer ranges so that several threads share it, behind the runs of
 * run->tenant already queued; uids are served in turn, then the tenants of each uid, one run at
 * a time (fairq.h). 0 or
 * -ENOMEM (nothing queued). */
int vase_evictor_submit(struct vase_evictor *ev, struct vase_plan_run *run);

struct vase_evictor_counts {
    uint32_t plans_queued;    /* runs no thread has started */
    uint32_t plans_running;   /* runs started whose result the main thread has not received */
    uint32_t clients_waiting; /* tenants with a run no thread has started */
};

/* The queue as it stands (main thread: the one that submits and receives). */
void vase_evictor_get_counts(struct vase_evictor *ev, struct vase_evictor_counts *ret);
/* The runs of tenant that no thread has started (main thread). */
uint32_t vase_evictor_count_queued(struct vase_evictor *ev, uint32_t tenant);

/*
 * Takes one finished job from the results socket without blocking. Returns 1 and *ret_run when
 * that job was its run's last (the run is complete: run->error tells how it went), 0 when a job
 * finished but its run is not complete, -EAGAIN when nothing is waiting.
 */
int vase_evictor_receive(struct vase_evictor *ev, struct vase_plan_run **ret_run);
