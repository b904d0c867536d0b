/* SPDX-License-Identifier: MIT */

/*
 * synthetic_engine: an inference engine without a model. It decodes N sequences through libvase
 * exactly as a real engine would: for every appended token it writes K and V of every layer and
 * KV head into the sequence's slots in the shared arena (and the query of every query head into
 * the query ring, when the policy reads queries), calls vase_seq_append() and vase_seq_poll()
 * at each step boundary, and optionally pushes accumulated attention for h2o. A simulated step
 * time (sleep or busy work) stands in for the forward pass.
 *
 * The data are heavy-tailed: standard normal rows, of which a small fraction of value rows are
 * scaled 20x. Those are the outliers VaSE-AttnV reserves slots for, so the summary counts how
 * many of them are still cached at the end, next to what the eviction cycle cost the engine:
 * stalls (time blocked waiting for a plan), compaction time and the daemon's plan time.
 *
 * Rows are cut from one precomputed pool of normal draws at random offsets, already converted
 * to the model's dtype, so that writing a token is a few memcpy()s and the engine measures the
 * service rather than its own random number generator. Rows are assembled in host buffers and
 * written with vase_seq_write_kv() and vase_seq_write_query(), so the same engine runs on the
 * host arena (memcpy) and on a CUDA arena (copies to the GPU on the legacy default stream):
 * whichever arena vased offers as --arena.
 */

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vase.h"

/* Normal draws in the row pool: far more than any head dim, so rows cut at random offsets are
 * distinct. */
#define POOL_SIZE (1u << 16)
/* Value rows that are outliers, and how much larger they are. */
#define OUTLIER_PROB 0.01
#define OUTLIER_SCALE 20.0f
#define MAX_SEQS 1024

enum step_work { STEP_SLEEP, STEP_BUSY };

static uint32_t arg_layers = 4;
static uint32_t arg_q_heads = 8;
static uint32_t arg_kv_heads = 2;
static uint32_t arg_head_dim = 64;
static enum vase_dtype arg_dtype = VASE_DTYPE_BF16;
static uint32_t arg_block; /* 0: the library's default (16) */
static uint32_t arg_seqs = 2;
static uint32_t arg_budget = 512;
static uint32_t arg_window = 64;
static int32_t arg_slack = -1;
static int32_t arg_admission_wait_ms = -1; /* -1: the daemon's admission_wait_ms */
static uint32_t arg_min_budget;            /* 0: the budget (not elastic) */
static uint32_t arg_weight;                /* 0: 1 */
static enum vase_policy arg_policy = VASE_POLICY_VASE_ATTNV;
static enum vase_mode arg_mode = VASE_MODE_ASYNC;
static uint32_t arg_prompt = 256;
static uint64_t arg_steps = 1024;
static bool arg_steps_set;
static double arg_duration; /* seconds; 0: --steps decides */
static double arg_step_ms = 1.0;
static enum step_work arg_step_work = STEP_SLEEP;
static uint64_t arg_seed = 1;
static bool arg_push_stats;
static uint32_t arg_arena;
static const char *arg_runtime_dir;
static const char *arg_name = "synthetic_engine";

static volatile sig_atomic_t stop_requested;

/* ---- small helpers ---------------------------------------------------------------------- */

static double now_seconds(void) {
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* splitmix64: small, fast and good enough for synthetic data and random offsets. */
struct rng {
    uint64_t state;
};

static uint64_t rng_next(struct rng *r) {
    uint64_t z = (r->state += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in (0, 1]. */
static double rng_uniform(struct rng *r) {
    return ((double)(rng_next(r) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

static uint32_t rng_below(struct rng *r, uint32_t n) {
    return (uint32_t)(((rng_next(r) >> 32) * (uint64_t)n) >> 32);
}

static void store(void *dst, enum vase_dtype dtype, size_t i, float x) {
    switch (dtype) {
    case VASE_DTYPE_F32:
        ((float *)dst)[i] = x;
        break;
    case VASE_DTYPE_F16:
        ((uint16_t *)dst)[i] = vase_f32_to_f16(x);
        break;
    default:
        ((uint16_t *)dst)[i] = vase_f32_to_bf16(x);
        break;
    }
}

/* A decimal number within [min, max] and nothing else: no blanks, no sign (strtoull() would
 * take both, and wrap a minus). 0, -EINVAL when s is not a number, -ERANGE when it is one out
 * of range; *ret untouched on failure. Digits are accumulated here with an overflow check. */
static int parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *ret) {
    uint64_t v = 0;
    bool overflow = false;

    if (*s == '\0')
        return -EINVAL;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9')
            return -EINVAL;
        unsigned digit = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - digit) / 10)
            overflow = true;
        else
            v = v * 10 + digit;
    }
    if (overflow || v < min || v > max)
        return -ERANGE;
    *ret = v;
    return 0;
}

static int parse_seconds(const char *s, double max, double *ret) {
    char *end;
    double v;

    errno = 0;
    v = strtod(s, &end);
    if (end == s || *end != '\0' || errno == EINVAL)
        return -EINVAL;
    if (errno == ERANGE || !isfinite(v) || v < 0 || v > max)
        return -ERANGE;
    *ret = v;
    return 0;
}

/* ---- the row pool ---------------------------------------------------------------------- */

struct pool {
    float *f32; /* [POOL_SIZE + dim] standard normal draws */
    void *raw;  /* the same in the model's dtype */
    size_t es;  /* bytes per element of raw */
    uint32_t dim;
    float threshold; /* a value row whose range exceeds this is an outlier */
};

static void pool_done(struct pool *p) {
    free(p->raw);
    free(p->f32);
}

static int pool_init(struct pool *p, uint32_t dim, enum vase_dtype dtype, uint64_t seed) {
    size_t n = (size_t)POOL_SIZE + dim;
    struct rng r = {.state = seed ^ 0x5eed5eed5eed5eedull};
    float maxabs = 0;

    *p = (struct pool){.es = vase_dtype_size(dtype), .dim = dim};
    p->f32 = malloc(n * sizeof(float));
    p->raw = malloc(n * p->es);
    if (!p->f32 || !p->raw) {
        pool_done(p);
        return -ENOMEM;
    }
    /* Box-Muller; the values pass through the dtype and back so that the threshold below holds
     * for what is actually stored. */
    for (size_t i = 0; i < n; i += 2) {
        double rad = sqrt(-2.0 * log(rng_uniform(&r))), th = 2.0 * M_PI * rng_uniform(&r);

        p->f32[i] = (float)(rad * cos(th));
        if (i + 1 < n)
            p->f32[i + 1] = (float)(rad * sin(th));
    }
    for (size_t i = 0; i < n; i++) {
        store(p->raw, dtype, i, p->f32[i]);
        maxabs = fmaxf(maxabs, fabsf(p->f32[i]));
    }
    /* No ordinary row can have a range above 2 * maxabs; an outlier row (20x) has one far above
     * unless its own range is tiny, which the writer checks when it makes one. */
    p->threshold = 2.0f * maxabs * 1.01f;
    return 0;
}

/* ---- sequences ------------------------------------------------------------------------- */

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

static int fail(const struct engine *e, const char *what, const struct seq_state *ss, int r);

/* Writes one row of dim elements at dst, cut from the pool at a random offset; scaled for an
 * outlier. Returns whether the row is an outlier. */
static bool write_row(const struct pool *p, struct rng *r, void *dst, bool may_be_outlier) {
    uint32_t off = rng_below(r, POOL_SIZE);

    if (may_be_outlier && rng_uniform(r) < OUTLIER_PROB) {
        float lo = INFINITY, hi = -INFINITY;

        for (uint32_t d = 0; d < p->dim; d++) {
            lo = fminf(lo, p->f32[off + d]);
            hi = fmaxf(hi, p->f32[off + d]);
        }
        /* A row that, scaled, would still look ordinary is not worth calling an outlier. */
        if ((hi - lo) * OUTLIER_SCALE > 2.0f * p->threshold) {
            for (uint32_t d = 0; d < p->dim; d++)
                store(dst, arg_dtype, d, p->f32[off + d] * OUTLIER_SCALE);
            return true;
        }
    }
    memcpy(dst, (const char *)p->raw + (size_t)off * p->es, (size_t)p->dim * p->es);
    return false;
}

/* Writes K, V and queries of n tokens at slots len .. len + n - 1 and positions
 * position .. position + n - 1. Only the last 2 * window queries can still be in the ring after
 * the append, so earlier ones are skipped. */
static int write_tokens(struct engine *e, struct seq_state *ss, uint32_t n) {
    uint32_t len = vase_seq_len(ss->seq);
    uint64_t pos = vase_seq_position(ss->seq);
    size_t row = (size_t)arg_head_dim * e->pool.es;
    int r;

    for (uint32_t i = 0; i < n; i++)
        for (uint32_t l = 0; l < arg_layers; l++) {
            if (len + i >= vase_seq_capacity(ss->seq)) {
                fprintf(stderr, "%s: sequence %u: no slot %u (capacity %u) for the next token\n",
                        arg_name, vase_seq_id(ss->seq), len + i, vase_seq_capacity(ss->seq));
                return -ENOSPC;
            }
            for (uint32_t h = 0; h < arg_kv_heads; h++) {
                write_row(&e->pool, &ss->rng, (char *)e->k_row + h * row, false);
                if (write_row(&e->pool, &ss->rng, (char *)e->v_row + h * row, true))
                    ss->outliers++;
            }
            r = vase_seq_write_kv(ss->seq, l, len + i, e->k_row, e->v_row);
            if (r < 0)
                return fail(e, "vase_seq_write_kv()", ss, r);
            if (n - i > 2 * arg_window || !ss->has_ring)
                continue;
            for (uint32_t h = 0; h < arg_q_heads; h++)
                write_row(&e->pool, &ss->rng, (char *)e->q_row + h * row, false);
            r = vase_seq_write_query(ss->seq, l, pos + i, e->q_row);
            if (r < 0)
                return fail(e, "vase_seq_write_query()", ss, r);
        }
    return 0;
}

/* Synthetic attention for h2o: per KV head, positive weights over the live slots that sum to 1,
 * with the attention sinks taking a large share as real models do. */
static int push_stats(struct seq_state *ss) {
    uint32_t len = vase_seq_len(ss->seq);
    int r;

    if (len == 0)
        return 0;
    if (len > ss->stats_cap) {
        float *p = realloc(ss->stats, (size_t)arg_kv_heads * len * sizeof(float));

        if (!p)
            return -ENOMEM;
        ss->stats = p;
        ss->stats_cap = len;
    }
    for (uint32_t l = 0; l < arg_layers; l++) {
        for (uint32_t h = 0; h < arg_kv_heads; h++) {
            float *row = ss->stats + (size_t)h * len, sum = 0;

            for (uint32_t j = 0; j < len; j++) {
                row[j] = (float)(-log(rng_uniform(&ss->rng))) * (j < 4 ? 50.0f : 1.0f);
                sum += row[j];
            }
            for (uint32_t j = 0; j < len; j++)
                row[j] /= sum;
        }
        r = vase_seq_push_stats(ss->seq, l, VASE_STATS_ACC_ADD, ss->stats, len);
        if (r < 0)
            return r;
    }
    return 0;
}

/* Records a plan that a call applied: the daemon's plan time, and the time the call blocked if
 * it had to wait for the plan. */
static void note_plan(struct seq_state *ss, bool stalled, double seconds) {
    struct vase_seq_stats st;

    vase_seq_get_stats(ss->seq, &st);
    ss->plans++;
    ss->plan_seconds += st.last_plan_seconds;
    ss->plan_max = fmax(ss->plan_max, st.last_plan_seconds);
    if (stalled) {
        ss->stalls++;
        ss->stall_seconds += seconds;
        ss->stall_max = fmax(ss->stall_max, seconds);
    }
}

/* Reports a failed call, with the daemon's own words about it when it sent some. */
static int fail(const struct engine *e, const char *what, const struct seq_state *ss, int r) {
    const char *detail = e && e->client ? vase_last_error(e->client) : "";

    if (ss)
        fprintf(stderr, "%s: %s (sequence %u) failed: %s", arg_name, what, vase_seq_id(ss->seq),
                vase_strerror(r));
    else
        fprintf(stderr, "%s: %s failed: %s", arg_name, what, vase_strerror(r));
    fprintf(stderr, detail[0] ? " (vased: %s)\n" : "\n", detail);
    return r;
}

/* One decode step of one sequence: make room if the sequence is full, write the token, append
 * it, and apply a plan that became ready. */
static int step_seq(struct engine *e, struct seq_state *ss) {
    double t0;
    int r;

    /* Async mode: when the slack is used up the engine cannot write the next token before the
     * pending plan is applied. That wait is the stall async mode tries to avoid. */
    if (vase_seq_len(ss->seq) >= vase_seq_capacity(ss->seq)) {
        t0 = now_seconds();
        r = vase_seq_wait(ss->seq);
        if (r < 0)
            return fail(e, "vase_seq_wait()", ss, r);
        if (r > 0)
            note_plan(ss, true, now_seconds() - t0);
    }
    r = write_tokens(e, ss, 1);
    if (r < 0)
        return r;

    t0 = now_seconds();
    r = vase_seq_append(ss->seq, 1);
    if (r < 0)
        return fail(e, "vase_seq_append()", ss, r);
    /* A plan applied inside the append was waited for: always in sync mode, and in async mode
     * when the sequence was full. */
    if (r > 0)
        note_plan(ss, true, now_seconds() - t0);

    r = vase_seq_poll(ss->seq);
    if (r < 0)
        return fail(e, "vase_seq_poll()", ss, r);
    if (r > 0)
        note_plan(ss, false, 0);

    if (arg_push_stats) {
        r = push_stats(ss);
        if (r < 0)
            return fail(e, "vase_seq_push_stats()", ss, r);
    }
    return 0;
}

/* Stands in for the forward pass of one decode step. */
static void simulate_step(double start) {
    double until = start + arg_step_ms * 1e-3;

    if (arg_step_ms <= 0)
        return;
    if (arg_step_work == STEP_BUSY) {
        volatile double sink = 0;

        while (now_seconds() < until)
            for (int i = 0; i < 1000; i++)
                sink += sqrt((double)i);
        return;
    }
    for (double left = until - now_seconds(); left > 0; left = until - now_seconds()) {
        struct timespec ts = {.tv_sec = (time_t)left,
                              .tv_nsec = (long)((left - (double)(time_t)left) * 1e9)};

        if (nanosleep(&ts, NULL) == 0)
            break;
        if (stop_requested)
            break;
    }
}

/* Value rows still cached whose range marks them as outliers. */
static int count_outliers(const struct engine *e, const struct seq_state *ss, uint64_t *ret) {
    uint32_t len = vase_seq_len(ss->seq);
    uint64_t count = 0;
    float *row;
    int r = 0;

    row = malloc((size_t)arg_head_dim * sizeof(float));
    if (!row)
        return -ENOMEM;
    /* The token's V rows, read back to the host: [kv_heads][dim], one row per head. */
    struct vase_view view =
        vase_view_contiguous(e->v_row, arg_dtype, arg_kv_heads, 1, arg_head_dim);
    for (uint32_t l = 0; l < arg_layers && r >= 0; l++)
        for (uint32_t s = 0; s < len && r >= 0; s++) {
            r = vase_seq_read_kv(ss->seq, l, s, e->k_row, e->v_row);
            for (uint32_t h = 0; h < arg_kv_heads && r >= 0; h++) {
                float lo = INFINITY, hi = -INFINITY;

                vase_view_read_row(&view, 0, h, row);
                for (uint32_t d = 0; d < arg_head_dim; d++) {
                    lo = fminf(lo, row[d]);
                    hi = fmaxf(hi, row[d]);
                }
                if (hi - lo > e->pool.threshold)
                    count++;
            }
        }
    free(row);
    if (r < 0)
        return r;
    *ret = count;
    return 0;
}

static int report(const struct engine *e, uint64_t steps, double seconds) {
    uint32_t tpp = vase_model_tokens_per_page(e->model);

    printf("%s: %" PRIu64 " decode steps in %.2f s (%.1f steps/s per sequence), simulated step "
           "%.3g ms (%s)\n",
           arg_name, steps, seconds, seconds > 0 ? (double)steps / seconds : 0.0, arg_step_ms,
           arg_step_work == STEP_BUSY ? "busy" : "sleep");
    printf("stall: time an append or wait blocked for a plan (compaction included); compact:\n"
           "libvase's compaction; plan: the daemon's time per plan; outliers: value rows %gx\n"
           "larger than the rest, still cached / written (over layers and KV heads)\n",
           (double)OUTLIER_SCALE);
    printf("%-5s %8s %6s %8s %6s %6s %6s %6s %10s %9s %9s %9s %9s %12s\n", "seq", "position", "len",
           "capacity", "pages", "budget", "evict", "stalls", "stall-ms", "stall-max", "compact",
           "plan", "plan-max", "outliers");
    printf("%-5s %8s %6s %8s %6s %6s %6s %6s %10s %9s %9s %9s %9s %12s\n", "", "", "", "", "", "",
           "", "", "total", "ms", "ms/evict", "ms/evict", "ms", "kept/written");
    for (uint32_t i = 0; i < e->nseqs; i++) {
        const struct seq_state *ss = &e->seqs[i];
        struct vase_seq_stats st;
        uint64_t kept = 0;
        int r;

        vase_seq_get_stats(ss->seq, &st);
        r = count_outliers(e, ss, &kept);
        if (r < 0)
            return fail(e, "reading back the value rows", ss, r);
        printf("%-5u %8" PRIu64 " %6u %8u %6u %6u %6" PRIu64 " %6" PRIu64 " %10.2f %9.2f %9.3f "
               "%9.2f %9.2f %5" PRIu64 "/%-6" PRIu64 "\n",
               vase_seq_id(ss->seq), vase_seq_position(ss->seq), vase_seq_len(ss->seq),
               vase_seq_capacity(ss->seq), (vase_seq_capacity(ss->seq) + tpp - 1) / tpp,
               vase_seq_budget(ss->seq), st.evictions, ss->stalls, ss->stall_seconds * 1e3,
               ss->stall_max * 1e3,
               st.evictions ? st.compact_seconds * 1e3 / (double)st.evictions : 0.0,
               ss->plans ? ss->plan_seconds * 1e3 / (double)ss->plans : 0.0, ss->plan_max * 1e3,
               kept, ss->outliers);
        /* The library keeps its own count of async waits (sync ones it does not count, as they
         * are by design); say so when it disagrees with the engine's. */
        if (arg_mode == VASE_MODE_ASYNC && st.stalls != ss->stalls)
            printf("      (libvase counts %" PRIu64 " stalls, %.2f ms)\n", st.stalls,
                   st.stall_seconds * 1e3);
    }
    return 0;
}

static void on_signal(int sig) {
    (void)sig;
    stop_requested = 1;
}

/* The configuration every sequence opens with (its seed aside), checked as the daemon will. */
static int seq_config(struct vase_seq_config *ret) {
    struct vase_seq_config cfg = {
        .policy = arg_policy,
        .params = vase_params_default(arg_budget),
        .prompt_len = arg_prompt,
        .mode = arg_mode,
        .slack = arg_slack,
        .admission_wait_ms = arg_admission_wait_ms,
        .min_budget = arg_min_budget,
        .weight = arg_weight,
    };
    int r;

    cfg.params.window = arg_window;
    r = vase_params_check(&cfg.params, arg_policy);
    if (r < 0) {
        fprintf(stderr,
                "%s: budget %u and window %u are not valid for %s (the budget must be a "
                "multiple of the window and larger)\n",
                arg_name, arg_budget, arg_window, vase_policy_to_string(arg_policy));
        return r;
    }
    *ret = cfg;
    return 0;
}

/* The sequences' states and the host buffers of one token's rows, next to the row pool. */
static int engine_alloc(struct engine *e) {
    e->seqs = calloc(arg_seqs, sizeof *e->seqs);
    e->k_row = malloc((size_t)arg_kv_heads * arg_head_dim * e->pool.es);
    e->v_row = malloc((size_t)arg_kv_heads * arg_head_dim * e->pool.es);
    e->q_row = malloc((size_t)arg_q_heads * arg_head_dim * e->pool.es);
    if (!e->seqs || !e->k_row || !e->v_row || !e->q_row)
        return fail(e, "allocating the sequences", NULL, -ENOMEM);
    return 0;
}

static void engine_free(struct engine *e) {
    free(e->seqs);
    free(e->k_row);
    free(e->v_row);
    free(e->q_row);
    pool_done(&e->pool);
}

/* Connects to vased and registers the model of the command line; disconnects again when the
 * model is refused. */
static int engine_connect(struct engine *e) {
    struct vase_connect_options copts = {.runtime_dir = arg_runtime_dir, .name = arg_name};
    char model_name[96];
    int r;

    r = vase_connect(&copts, &e->client);
    if (r < 0) {
        fprintf(stderr, "%s: cannot connect to vased (runtime directory %s): %s%s\n", arg_name,
                arg_runtime_dir ? arg_runtime_dir : "from $VASE_RUNTIME_DIR, /run/vase or ./run",
                vase_strerror(r),
                r == -ENOENT || r == -ECONNREFUSED ? "; is vased running there?" : "");
        return r;
    }
    snprintf(model_name, sizeof model_name, "synthetic-L%u-H%ux%u-D%u-%s", arg_layers, arg_q_heads,
             arg_kv_heads, arg_head_dim, vase_dtype_to_string(arg_dtype));
    r = vase_model_register(e->client,
                            &(struct vase_geometry){
                                .name = model_name,
                                .layers = arg_layers,
                                .q_heads = arg_q_heads,
                                .kv_heads = arg_kv_heads,
                                .head_dim = arg_head_dim,
                                .dtype = arg_dtype,
                                .block_tokens = arg_block,
                                .arena = arg_arena,
                            },
                            &e->model);
    if (r < 0) {
        fail(e, "vase_model_register()", NULL, r);
        e->client = vase_disconnect(e->client);
        return r;
    }
    printf("%s: client %u, model %s (tokens_per_page %u, page_bytes %llu), policy %s, %s mode, "
           "budget %u, window %u, prompt %u, %u sequences\n",
           arg_name, vase_client_id(e->client), model_name, vase_model_tokens_per_page(e->model),
           (unsigned long long)vase_model_page_bytes(e->model), vase_policy_to_string(arg_policy),
           arg_mode == VASE_MODE_SYNC ? "sync" : "async", arg_budget, arg_window, arg_prompt,
           arg_seqs);
    return 0;
}

/* Opens --seqs sequences; those opened before a failure stay in e->nseqs, for close_seqs(). */
static int open_seqs(struct engine *e, struct vase_seq_config *cfg) {
    for (uint32_t i = 0; i < arg_seqs; i++) {
        struct seq_state *ss = &e->seqs[i];
        int r;

        cfg->seed = arg_seed + i;
        ss->rng.state = arg_seed * 0x100000001b3ull + i;
        r = vase_seq_open(e->client, e->model, cfg, &ss->seq);
        if (r < 0) {
            char what[64];

            snprintf(what, sizeof what, "vase_seq_open() of sequence %u of %u", i + 1, arg_seqs);
            return fail(e, what, NULL, r);
        }
        e->nseqs++;
        /* Only tested, never dereferenced: on a CUDA arena it is a device address. */
        ss->has_ring = vase_seq_query_ptr(ss->seq, 0, 0, 0) != NULL;
    }
    return 0;
}

/* Prefill: the whole prompt in one append, as an engine's prefill writes it in one pass. */
static int prefill(struct engine *e) {
    for (uint32_t i = 0; i < e->nseqs && arg_prompt > 0; i++) {
        int r = write_tokens(e, &e->seqs[i], arg_prompt);

        if (r < 0)
            return r;
        r = vase_seq_append(e->seqs[i].seq, arg_prompt);
        if (r < 0)
            return fail(e, "vase_seq_append() of the prompt", &e->seqs[i], r);
    }
    return 0;
}

/* Decodes every sequence a step at a time until --steps or --duration ends (or a signal comes),
 * then reports. */
static int decode(struct engine *e) {
    struct sigaction sa = {.sa_handler = on_signal};
    uint64_t steps = 0;
    double start, end;
    int r;

    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    start = now_seconds();
    while (!stop_requested) {
        double t = now_seconds();

        if ((arg_steps_set || arg_duration <= 0) && steps >= arg_steps)
            break;
        if (arg_duration > 0 && t - start >= arg_duration)
            break;
        for (uint32_t i = 0; i < e->nseqs; i++) {
            r = step_seq(e, &e->seqs[i]);
            if (r < 0)
                return r;
        }
        steps++;
        simulate_step(t);
    }
    end = now_seconds();
    if (stop_requested)
        printf("%s: interrupted\n", arg_name);
    return report(e, steps, end - start);
}

/* Closes the sequences opened; r, the run's result so far, becomes a close's failure when it
 * was a success. */
static int close_seqs(struct engine *e, int r) {
    for (uint32_t i = 0; i < e->nseqs; i++) {
        int r2 = vase_seq_close(e->seqs[i].seq);

        if (r2 < 0 && r >= 0)
            r = fail(e, "vase_seq_close()", NULL, r2);
        free(e->seqs[i].stats);
    }
    return r;
}

static int run(void) {
    struct engine e = {.nseqs = 0};
    struct vase_seq_config cfg;
    int r;

    r = seq_config(&cfg);
    if (r < 0)
        return r;
    r = pool_init(&e.pool, arg_head_dim, arg_dtype, arg_seed);
    if (r < 0)
        return fail(&e, "allocating the row pool", NULL, r);
    r = engine_alloc(&e);
    if (r < 0)
        goto free_engine;
    r = engine_connect(&e);
    if (r < 0)
        goto free_engine;
    r = open_seqs(&e, &cfg);
    if (r >= 0)
        r = prefill(&e);
    if (r >= 0)
        r = decode(&e);
    r = close_seqs(&e, r);
    vase_disconnect(e.client);
free_engine:
    engine_free(&e);
    return r;
}

static void help(void) {
    printf(
        "Usage: %s [OPTIONS]\n"
        "Decodes sequences of synthetic heavy-tailed K/V/Q through libvase and vased, and\n"
        "reports evictions, stalls, compaction and plan times.\n"
        "\n"
        "Model:\n"
        "      --layers=N         layers (4)\n"
        "      --q-heads=N        query heads (8)\n"
        "      --kv-heads=N       KV heads, dividing the query heads (2)\n"
        "      --head-dim=N       head dim (64)\n"
        "      --dtype=T          f32, f16 or bf16 (bf16)\n"
        "      --block=N          tokens per page (block) of the attention kernel (16)\n"
        "Sequences:\n"
        "      --seqs=N           sequences decoded together (2)\n"
        "      --budget=N         slots kept per sequence (512)\n"
        "      --window=N         window W (64)\n"
        "      --slack=N          steps the engine may run ahead of a plan (window)\n"
        "      --admission-wait-ms=N  how long an open waits for room in a full arena\n"
        "                         (the daemon's admission_wait_ms; 0: refused at once)\n"
        "      --min-budget=N     elastic: the least budget a sequence accepts when the\n"
        "                         daemon makes room for waiting opens (the budget: not elastic)\n"
        "      --weight=N         weight of the sequences when budgets are lowered (1)\n"
        "      --policy=NAME      vase-attnv, vase-dkv, curdkv, snapkv, rkv, streaming,\n"
        "                         random, h2o, ... (vase-attnv)\n"
        "      --mode=MODE        sync or async (async)\n"
        "      --prompt=N         prompt tokens prefilled in one append (256)\n"
        "      --push-stats       push accumulated attention (AttnStats) every step, for h2o\n"
        "Run:\n"
        "      --steps=N          decode steps (1024)\n"
        "      --duration=SEC     decode for this long instead (with --steps: whichever first)\n"
        "      --step-ms=MS       simulated forward time per step (1)\n"
        "      --step-work=KIND   sleep or busy (sleep)\n"
        "      --seed=N           data and sampling seed (1)\n"
        "      --arena=ID         the daemon's arena to run on, host or CUDA alike (0)\n"
        "      --runtime-dir=DIR  vased's runtime directory ($VASE_RUNTIME_DIR, /run/vase, ./run)\n"
        "      --name=NAME        client name shown by vasectl\n"
        "  -h --help              show this help\n",
        program_invocation_short_name);
}

/* Every option that takes a number: where it goes, its bounds and how an error names them
 * (NULL: no range worth naming), and the flag it sets when given. */
enum num_kind { NUM_U32, NUM_I32, NUM_U64, NUM_SECONDS };
static const struct num_option {
    const char *name;
    enum num_kind kind;
    void *value;
    uint64_t min, max; /* NUM_SECONDS: max only, in the option's unit */
    const char *range;
    bool *given;
} num_options[] = {
    {"layers", NUM_U32, &arg_layers, 1, 65535, "1..65535", NULL},
    {"q-heads", NUM_U32, &arg_q_heads, 1, VASE_MAX_HEADS, "1..1024", NULL},
    {"kv-heads", NUM_U32, &arg_kv_heads, 1, VASE_MAX_HEADS, "1..1024", NULL},
    {"head-dim", NUM_U32, &arg_head_dim, 1, VASE_MAX_DIM, "1..1024", NULL},
    {"block", NUM_U32, &arg_block, 1, 65536, "1..65536", NULL},
    {"block-tokens", NUM_U32, &arg_block, 1, 65536, "1..65536", NULL},
    {"seqs", NUM_U32, &arg_seqs, 1, MAX_SEQS, "1..1024", NULL},
    {"budget", NUM_U32, &arg_budget, 2, VASE_MAX_BUDGET, "2..4194304", NULL},
    {"window", NUM_U32, &arg_window, 1, VASE_MAX_BUDGET, "1..4194304", NULL},
    {"slack", NUM_I32, &arg_slack, 0, VASE_MAX_BUDGET, "0..4194304", NULL},
    {"admission-wait-ms", NUM_I32, &arg_admission_wait_ms, 0, VASE_MAX_ADMISSION_WAIT_MS,
     "0..600000", NULL},
    {"min-budget", NUM_U32, &arg_min_budget, 0, VASE_MAX_BUDGET, "0..4194304", NULL},
    {"weight", NUM_U32, &arg_weight, 0, VASE_MAX_WEIGHT, "0..1000", NULL},
    {"prompt", NUM_U32, &arg_prompt, 0, VASE_MAX_TOKENS, "0..4194304", NULL},
    {"steps", NUM_U64, &arg_steps, 0, UINT64_MAX, NULL, &arg_steps_set},
    {"duration", NUM_SECONDS, &arg_duration, 0, 10000000, "seconds >= 0", NULL},
    {"step-ms", NUM_SECONDS, &arg_step_ms, 0, 1000000, "milliseconds >= 0", NULL},
    {"seed", NUM_U64, &arg_seed, 0, UINT64_MAX, NULL, NULL},
    {"arena", NUM_U32, &arg_arena, 0, 255, "0..255", NULL},
};
#define N_NUM_OPTIONS (sizeof(num_options) / sizeof(num_options[0]))

/* The options that take a word, or nothing; the numeric ones follow from OPT_NUM. */
enum {
    OPT_DTYPE = 0x100,
    OPT_POLICY,
    OPT_MODE,
    OPT_PUSH_STATS,
    OPT_STEP_WORK,
    OPT_RUNTIME_DIR,
    OPT_NAME,
    OPT_NUM,
};
static const struct option word_options[] = {
    {"dtype", required_argument, NULL, OPT_DTYPE},
    {"policy", required_argument, NULL, OPT_POLICY},
    {"mode", required_argument, NULL, OPT_MODE},
    {"push-stats", no_argument, NULL, OPT_PUSH_STATS},
    {"step-work", required_argument, NULL, OPT_STEP_WORK},
    {"runtime-dir", required_argument, NULL, OPT_RUNTIME_DIR},
    {"name", required_argument, NULL, OPT_NAME},
    {"help", no_argument, NULL, 'h'},
};
#define N_WORD_OPTIONS (sizeof(word_options) / sizeof(word_options[0]))

static int bad_value(const char *option, const char *value, int r, const char *range) {
    fprintf(stderr, "%s: invalid --%s '%s': %s%s%s\n", program_invocation_short_name, option, value,
            r == -ERANGE ? "out of range" : "not a number", range ? ", expected " : "",
            range ? range : "");
    return -EINVAL;
}

/* Parses the value s of a numeric option into its variable; the error names it as given. */
static int parse_num(const struct num_option *o, const char *given_name, const char *s) {
    uint64_t v;
    int r;

    if (o->kind == NUM_SECONDS)
        r = parse_seconds(s, (double)o->max, o->value);
    else if ((r = parse_u64(s, o->min, o->max, &v)) >= 0) {
        if (o->kind == NUM_U32)
            *(uint32_t *)o->value = (uint32_t)v;
        else if (o->kind == NUM_I32)
            *(int32_t *)o->value = (int32_t)v;
        else
            *(uint64_t *)o->value = v;
    }
    if (r < 0)
        return bad_value(given_name, s, r, o->range);
    if (o->given)
        *o->given = true;
    return 0;
}

static int unknown_word(const char *option, const char *value, const char *expected) {
    fprintf(stderr, "%s: unknown --%s '%s'%s%s\n", program_invocation_short_name, option, value,
            expected ? ", expected " : "", expected ? expected : "");
    return -EINVAL;
}

/* The options that take a word (or nothing): 0, or -EINVAL after saying why. */
static int parse_word(int c, const char *s) {
    switch (c) {
    case OPT_DTYPE:
        return vase_dtype_from_string(s, &arg_dtype) < 0
                   ? unknown_word("dtype", s, "f32, f16 or bf16")
                   : 0;
    case OPT_POLICY:
        return vase_policy_from_string(s, &arg_policy) < 0 ? unknown_word("policy", s, NULL) : 0;
    case OPT_MODE:
        if (strcmp(s, "sync") != 0 && strcmp(s, "async") != 0)
            return unknown_word("mode", s, "sync or async");
        arg_mode = s[0] == 's' ? VASE_MODE_SYNC : VASE_MODE_ASYNC;
        return 0;
    case OPT_STEP_WORK:
        if (strcmp(s, "sleep") != 0 && strcmp(s, "busy") != 0)
            return unknown_word("step-work", s, "sleep or busy");
        arg_step_work = s[0] == 's' ? STEP_SLEEP : STEP_BUSY;
        return 0;
    case OPT_PUSH_STATS:
        arg_push_stats = true;
        return 0;
    case OPT_RUNTIME_DIR:
        arg_runtime_dir = s;
        return 0;
    case OPT_NAME:
        arg_name = s;
        return 0;
    default: /* '?': getopt_long() said why */
        return -EINVAL;
    }
}

/* Returns < 0 on a usage error, 0 to exit successfully (help), > 0 to go on. */
static int parse_argv(int argc, char **argv) {
    struct option options[N_WORD_OPTIONS + N_NUM_OPTIONS + 1] = {{0}};
    int c, r, idx = 0;

    memcpy(options, word_options, sizeof(word_options));
    /* An alias (block-tokens) shares its option's value, so that a prefix of both is no
     * ambiguity to getopt_long(). */
    for (size_t i = 0; i < N_NUM_OPTIONS; i++) {
        size_t j = 0;

        while (num_options[j].value != num_options[i].value)
            j++;
        options[N_WORD_OPTIONS + i] =
            (struct option){num_options[i].name, required_argument, NULL, OPT_NUM + (int)j};
    }
    while ((c = getopt_long(argc, argv, "h", options, &idx)) >= 0) {
        if (c == 'h') {
            help();
            return 0;
        }
        r = c >= OPT_NUM ? parse_num(&num_options[c - OPT_NUM], options[idx].name, optarg)
                         : parse_word(c, optarg);
        if (r < 0)
            return r;
    }
    if (optind < argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", program_invocation_short_name,
                argv[optind]);
        return -EINVAL;
    }
    if (arg_q_heads % arg_kv_heads != 0) {
        fprintf(stderr, "%s: --q-heads=%u is not a multiple of --kv-heads=%u\n",
                program_invocation_short_name, arg_q_heads, arg_kv_heads);
        return -EINVAL;
    }
    return 1;
}

int main(int argc, char **argv) {
    int r;

    r = parse_argv(argc, argv);
    if (r <= 0)
        return r < 0 ? 2 : 0;
    return run() < 0 ? 1 : 0;
}
