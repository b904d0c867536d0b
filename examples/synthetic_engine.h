/* SPDX-License-Identifier: MIT */

/*
 * What the files of synthetic_engine share: the settings of its command line, the row pool and
 * the engine's state (its client, model and sequences). What the program does is said at the top
 * of synthetic_engine.c.
 */

#ifndef SYNTHETIC_ENGINE_H
#define SYNTHETIC_ENGINE_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vase.h"

/* Normal draws in the row pool: far more than any head dim, so rows cut at random offsets are
 * distinct. */
#define POOL_SIZE (1u << 16)
/* Value rows that are outliers, and how much larger they are. */
#define OUTLIER_PROB 0.01
#define OUTLIER_SCALE 20.0f
#define MAX_SEQS 1024

enum step_work { STEP_SLEEP, STEP_BUSY };

extern uint32_t arg_layers;
extern uint32_t arg_q_heads;
extern uint32_t arg_kv_heads;
extern uint32_t arg_head_dim;
extern enum vase_dtype arg_dtype;
extern uint32_t arg_block; /* 0: the library's default (16) */
extern uint32_t arg_seqs;
extern uint32_t arg_budget;
extern uint32_t arg_window;
extern int32_t arg_slack;
extern int32_t arg_admission_wait_ms; /* -1: the daemon's admission_wait_ms */
extern uint32_t arg_min_budget;       /* 0: the budget (not elastic) */
extern uint32_t arg_weight;           /* 0: 1 */
extern enum vase_policy arg_policy;
extern enum vase_mode arg_mode;
extern uint32_t arg_prompt;
extern uint64_t arg_steps;
extern bool arg_steps_set;
extern double arg_duration; /* seconds; 0: --steps decides */
extern double arg_step_ms;
extern enum step_work arg_step_work;
extern uint64_t arg_seed;
extern bool arg_push_stats;
extern uint32_t arg_arena;
extern const char *arg_runtime_dir;
extern const char *arg_name;

extern volatile sig_atomic_t stop_requested;

/* ---- the synthetic data (synthetic_engine_data.c) ---- */

/* splitmix64: small, fast and good enough for synthetic data and random offsets. */
struct rng {
    uint64_t state;
};

struct pool {
    float *f32; /* [POOL_SIZE + dim] standard normal draws */
    void *raw;  /* the same in the model's dtype */
    size_t es;  /* bytes per element of raw */
    uint32_t dim;
    float threshold; /* a value row whose range exceeds this is an outlier */
};

int pool_init(struct pool *p, uint32_t dim, enum vase_dtype dtype, uint64_t seed);
void pool_done(struct pool *p);

struct seq_state {
    struct vase_seq *seq;
    struct rng rng;
    uint64_t outliers; /* outlier value rows written (over layers and heads) */

    /* What the engine saw: time blocked waiting for plans, and plans applied. */
    uint64_t stalls;
    double stall_seconds, stall_max;
    uint64_t plans;
    double plan_seconds, plan_max; /* the daemon's plan time, as reported with each plan */
    float *stats;                  /* [kv_heads][capacity], --push-stats only */
    uint32_t stats_cap;
    bool has_ring; /* the policy reads queries: the sequence has a query ring */
};

struct engine {
    struct vase_client *client;
    struct vase_model *model;
    struct pool pool;
    struct seq_state *seqs;
    uint32_t nseqs;
    /* One token's rows in the model's dtype, assembled on the host: K and V [kv_heads][dim],
     * the query [q_heads][dim]. */
    void *k_row, *v_row, *q_row;
};

/* Writes K, V and queries of n tokens at slots len .. len + n - 1 and positions
 * position .. position + n - 1 (synthetic_engine_data.c). */
int write_tokens(struct engine *e, struct seq_state *ss, uint32_t n);
/* Pushes synthetic accumulated attention of every layer, for h2o. */
int push_stats(struct seq_state *ss);
/* Value rows still cached whose range marks them as outliers. */
int count_outliers(const struct engine *e, const struct seq_state *ss, uint64_t *ret);

/* ---- the run (synthetic_engine_run.c) ---- */

/* Reports a failed call, with the daemon's own words about it when it sent some; returns r. */
int fail(const struct engine *e, const char *what, const struct seq_state *ss, int r);
/* Connects, opens the sequences, prefills and decodes them, reports and closes: 0, or -errno
 * after saying why. */
int run(void);

#endif
