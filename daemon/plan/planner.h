/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * Planners: the compute that turns a plan run (evictor.h) into keep lists, behind one interface
 * with a CPU implementation (planner_cpu.c, over the daemon's host mapping of an arena) and a
 * CUDA one (planner_cuda.c, on the arena's device; planner_nocuda.c refuses in a build without
 * CUDA). Arenas are memory and know nothing of planners: vase_planner_for() chooses, per arena,
 * by where its memory is. A planner's state belongs to one evictor thread, which makes it on its
 * first job for an arena, uses it only there and frees it when it stops. No CUDA type appears
 * here.
 */

#include <stdbool.h>
#include <stdint.h>

#include "fairq.h"
#include "vase_kernels.h"
#include "vase_layout.h"

struct vase_arena;
/* One eviction as the main thread describes it to the evictor (evictor.h): copies of
 * everything a planner reads besides the arena itself, so that no thread sees the registry. */
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

struct vase_planner; /* one implementation's per-thread state */

struct vase_planner_ops {
    const char *name; /* "cpu", "cuda" */
    /* Makes the calling thread's state for planning over arena a (NULL: host memory the run
     * names, tests). 0 or -errno, logged. */
    int (*thread_new)(const struct vase_arena *a, struct vase_planner **ret);
    /* Frees it on the thread that made it; accepts NULL. */
    void (*thread_free)(struct vase_planner *p);
    /*
     * Computes layers [l0, l1) of run, writes their keep lists into run->keep_lists and the
     * plan pages, all complete before it returns. 0 or the first failure's -errno (-EINVAL for
     * bad data, which is the engine's and not logged; anything else logged once with the native
     * message); *ret_bad_layer names the failing layer.
     */
    int (*plan_layers)(struct vase_planner *p, struct vase_plan_run *run, uint32_t l0, uint32_t l1,
                       uint32_t *ret_bad_layer);
};

extern const struct vase_planner_ops vase_planner_cpu_ops;
/* planner_cuda.c, or planner_nocuda.c (every call refused with -EOPNOTSUPP) without CUDA. */
extern const struct vase_planner_ops vase_planner_cuda_ops;
/* Whether this build has the CUDA planner (false: planner_nocuda.c). */
extern const bool vase_planner_have_cuda;

/* The planner for runs over arena a: the CUDA one for device memory, else the CPU's (also for
 * a NULL arena). Never NULL. */
const struct vase_planner_ops *vase_planner_for(const struct vase_arena *a);

/* The plan input of one layer of a run: views over arena_base through the run's page lists,
 * and its slices of acc, scores and draws (host pointers, as the run holds them). */
void vase_plan_run_input(const struct vase_plan_run *run, uint32_t layer,
                         struct vase_plan_input *ret);
/* Byte offset in the arena of keep list i = layer * kv_heads + head. */
uint64_t vase_plan_run_list_offset(const struct vase_plan_run *run, uint32_t i);

/* The CPU planner's work on the calling thread with workspace ws (NULL: each plan makes its
 * own scratch), exposed for tests: layers [l0, l1) over the host mapping at run->arena_base.
 * Same returns as plan_layers(); ret_bad_layer may be NULL. */
int vase_plan_run_layers(struct vase_plan_run *run, uint32_t l0, uint32_t l1,
                         struct vase_workspace *ws, uint32_t *ret_bad_layer);
