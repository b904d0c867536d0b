/* SPDX-License-Identifier: MIT */

/*
 * What the files of loadgen share: the engines' models, the settings of the command line, the
 * arrival schedule, and the records one mode's run fills (each sequence's outcome, the sampler's
 * series) and loadgen_report.c sums up. What the program does, and which thread touches what,
 * is said at the top of loadgen.c.
 */

#ifndef LOADGEN_H
#define LOADGEN_H

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vase.h"
#include "vase_admin.h"

/* ---- the engines (loadgen_engine.c) ---- */

/* One synthetic model and how its sequences are shaped. Prompts are uniform in
 * [budget / 2, budget], so that a sequence starts evicting (and can give up budget) after at
 * most budget / 2 decoded tokens; a prompt above the budget would reserve more than the steady
 * state at the open. */
struct model_spec {
    const char *name;
    uint32_t layers, q_heads, kv_heads, head_dim;
    enum vase_dtype dtype;
    uint32_t block_tokens, budget, window;
    enum vase_policy policy;
    double share; /* the fraction of arrivals it serves */
};

#define N_MODELS 3
extern const struct model_spec models[N_MODELS];

/* ---- settings (loadgen.c) ---- */

extern double arg_duration;      /* seconds of arrivals per mode */
extern double arg_calm_rate;     /* arrivals per second in the calm state */
extern double arg_burst_rate;    /* ... in the burst state */
extern double arg_calm_seconds;  /* mean length of a calm period */
extern double arg_burst_seconds; /* ... of a burst */
extern double arg_decode_min;    /* decoded tokens per sequence, uniform in [min, max] */
extern double arg_decode_max;
extern double arg_step_ms; /* simulated forward time per decoded token */
extern double arg_admission_wait_ms;
/* Elastic: min_budget = this fraction of the budget; one elastic run per fraction. */
#define MAX_MIN_FRACS 3
extern double arg_min_fracs[MAX_MIN_FRACS];
extern size_t arg_n_min_fracs;
extern double arg_max_inflight; /* sequences opening or running at once */
extern double arg_seed;
extern double arg_sample_ms;
extern const char *arg_modes;
extern const char *arg_out;
extern const char *arg_runtime_dir;

extern volatile sig_atomic_t stop_requested;

/* ---- time, randomness and the arrival schedule (loadgen_schedule.c) ---- */

double now_seconds(void);
/* Sleeps until now_seconds() reaches t, or a signal asks to stop. */
void sleep_until(double t);
/* splitmix64 */
uint64_t mix(uint64_t *state);
/* Uniform in (0, 1]. */
double uniform(uint64_t *state);

/*
 * A two-state Markov-modulated Poisson process: the state alternates between calm and burst,
 * each period lasting an exponential time (means --calm-seconds, --burst-seconds; the run
 * starts calm), and arrivals within a period are Poisson at the state's rate. Since both are
 * memoryless, an inter-arrival draw that overshoots the end of the period is discarded and drawn
 * again at the new rate from the switch. Each arrival picks its engine by the models' shares,
 * a prompt uniform in [budget / 2, budget] (a multiple of nothing in particular) and a decode
 * length uniform in [--decode-min, --decode-max], all from one splitmix64 stream of --seed: the
 * same seed gives the same schedule in both modes.
 */
struct arrival {
    double t; /* seconds after the mode started */
    uint32_t engine, prompt, length;
    bool burst; /* arrived during a burst */
};

/* The schedule of --seed, --duration and the rates: 0, or -ENOMEM. */
int make_schedule(struct arrival **ret, size_t *ret_n);

/* ---- one mode's run ---- */

enum outcome {
    OUT_NONE,      /* not yet decided (a thread still running) */
    OUT_ADMITTED,  /* opened; decoded to its length and closed unless failed says otherwise */
    OUT_ENOSPC,    /* refused: the arena had no room within the admission wait */
    OUT_REFUSED,   /* refused for another reason (the errno is in err) */
    OUT_GENERATOR, /* never opened: --max-inflight sequences were in flight, or no thread */
};

struct seq_rec {
    const struct arrival *a;
    enum outcome outcome;
    int err;       /* the open's errno, or the first failure while decoding or closing */
    bool failed;   /* admitted, but a call failed afterwards */
    bool roomy;    /* refused while the free granules and what the evicting sequences of its
                      model held above their minimums exceeded its KV pages */
    bool fit_free; /* refused while the free granules alone exceeded them */
    uint32_t seq_id, budget, min_budget, budget_min;
    double budget_mean; /* over its decode steps */
    double open_s, admitted_s, closed_s;
    uint64_t tokens; /* decoded */
    uint64_t evictions, budget_changes;
};

/* What the threads share while a mode runs. */
struct gauges {
    atomic_uint_fast64_t tokens;     /* decoded so far */
    atomic_int inflight;             /* threads started and not finished */
    atomic_int waiting;              /* opens not yet returned */
    atomic_int running;              /* admitted and not yet closed */
    atomic_uint_fast64_t budget_ppm; /* sum over decoding sequences of budget / opened budget */
    atomic_int decoding;             /* sequences past their prompt (in budget_ppm) */
    /* Per engine: bytes its evicting sequences hold above their minimums. */
    atomic_uint_fast64_t headroom[N_MODELS];
    atomic_uint_fast64_t free_bytes; /* the arena's, at the last sample */
};

struct sample {
    double t;
    uint64_t bytes_total, bytes_free, bytes_pages, bytes_reclaiming;
    uint32_t seqs, opens_waiting, seqs_shrunk;
    uint64_t shrinks, grows, tokens;
    int running, waiting;
    double budget_frac; /* mean over the decoding sequences */
};

struct engine {
    const struct model_spec *spec;
    struct vase_client *client;
    struct vase_model *model;
    uint32_t tpp;
    uint64_t page_bytes;
    size_t row_bytes; /* one token of one layer: [kv_heads][head_dim] */
    void *rows;       /* [ROW_POOL][kv_heads][head_dim] in the model's dtype */
};

struct mode_run {
    char name[32];
    double min_frac; /* 0: static */
    struct engine engines[N_MODELS];
    struct seq_rec *recs;
    size_t n;
    double start;
    struct gauges g;
    /* The sampler's. */
    struct vase_admin *admin;
    struct sample *samples;
    size_t n_samples, cap_samples;
    atomic_bool sampling;
    int sampler_err;
    bool empty; /* the arena held nothing after the mode */
};

struct job {
    struct mode_run *run;
    struct seq_rec *rec;
    pthread_t thread;
    bool started;
};

struct summary {
    size_t arrived, admitted, enospc, refused, generator, failed, roomy, fit_free, unfinished;
    double wait_p50, wait_p99, wait_max; /* ms, admitted opens */
    double window_tps, total_tps;        /* decoded tokens per second */
    double last_close;                   /* seconds after the start */
    uint64_t tokens;
    double occupancy_mean, occupancy_max; /* bytes in pages / bytes total, during the window */
    int running_max;
    uint32_t shrunk_max;
    uint64_t shrinks, grows;
    double frac_mean, frac_p10, frac_min; /* per admitted sequence, mean budget / budget */
    double frac_lowest;                   /* the lowest budget any sequence ran with */
    bool consistent; /* every arrival counted once, none refused but for room; every admitted
                        sequence decoded and closed */
};

/* loadgen_engine.c: the elastic minimum of a model's budget at fraction frac; the engines' clients
 * and models; the thread that serves one arrival (a struct job). */
uint32_t min_budget_of(const struct model_spec *s, double frac);
int connect_engines(struct mode_run *m);
void disconnect_engines(struct mode_run *m);
void *serve(void *arg);

/* loadgen_mode.c: seconds since the mode started; one mode's run (the records, samples and checks
 * stay in m): 0, or -errno when the run could not be made at all (a connection, memory,
 * threads). */
double since(const struct mode_run *m);
int run_mode(struct mode_run *m, const struct arrival *sched, size_t n,
             uint64_t *ret_window_tokens);

/* loadgen_report.c: the summary of a mode's run, its CSV files, and the table of all runs. */
void summarize(struct mode_run *m, uint64_t window_tokens, struct summary *ret);
int write_csvs(const struct mode_run *m);
int write_table(struct mode_run *runs, const struct summary *sums, size_t n);

#endif
