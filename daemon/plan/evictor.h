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

#include "fairq.h"
#include "core/registry.h"
#include "vase_kernels.h"

struct vase_arena;

#define VASE_EVICTOR_ENDPOINT "inproc://vase-evictor"

struct vase_plan_run {
    /* Filled by the main thread before submission; read-only while jobs are in flight. */
    /* The client it is planned for, and that client's uid: the queue serves uids in turn, then
     * each uid's clients in turn. */
    uint32_t uid, tenant;
    uint32_t seq_id;
    uint32_t round;
    uint32_t len;  /* len of the request */
    uint32_t n;    /* candidates: len - window */
    uint32_t keep; /* K */
    uint32_t layers, kv_heads, q_heads, head_dim;
    enum vase_dtype dtype;
    enum vase_policy policy;
    struct vase_params params;
    uint32_t prompt_len; /* the sequence's, for params.protect_prompt */
    uint64_t seed;
    const struct vase_arena *arena; /* NULL: host memory at arena_base (tests) */
    void *arena_base;               /* the arena's mapping: a device address on a device arena */
    struct vase_layout layout;      /* the sequence's (its model's), copied */
    uint32_t *pages;                /* copies of the block table, ring and plan pages */
    uint32_t n_pages;
    uint32_t *ring_pages;
    uint32_t ring_first;
    uint32_t *plan_pages;
    uint32_t n_plan_pages;
    struct vase_plan_layout plan;
    float *acc;     /* [layers][kv_heads][n] snapshot (h2o), or NULL */
    float **scores; /* [layers] -> [kv_heads][n] pushed window scores or NULL; array may be NULL */
    float *exp_draws; /* injected [layers][kv_heads][n], or NULL */
    float *gauss;     /* injected [head_dim][rank], or NULL */
    /* The evictor's, under its lock: the run's place in the queue. */
    struct vase_fairq_run queued;
    /* Written by the threads, each its own layers. */
    uint32_t *keep_lists; /* [layers][kv_heads][K] */
    /* Main thread only. */
    void *owner; /* the sequence the plan is for */
    uint8_t routing_id[256];
    size_t routing_id_len;
    uint64_t request_id;
    double started; /* CLOCK_MONOTONIC seconds */
    double seconds;
    unsigned jobs_total, jobs_done;
    int error; /* the first failing layer's -errno, or 0 */
    uint32_t error_layer;
};

/* Allocates an empty run (zeroed). 0 or -ENOMEM. */
int vase_plan_run_new(struct vase_plan_run **ret);
struct vase_plan_run *vase_plan_run_free(struct vase_plan_run *run);

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
