/* SPDX-License-Identifier: MIT */

/*
 * bench_service: what the service costs an engine, measured through libvase against a running
 * vased (it starts nothing itself; tests/bench_service.sh runs it against a private daemon).
 * A benchmark, not a test: it prints medians and percentiles and asserts nothing; the targets
 * it prints next to the figures are for comparison.
 *
 *  (a) control plane: the round trip of a Ping, and of an eviction of a `streaming` sequence,
 *      whose plan costs microseconds, so what remains is the control plane: request to plan
 *      (async), and the whole cycle of a sync append with the compaction subtracted;
 *  (b) AttnStats ingestion: M messages pushed as fast as the socket takes them, then a Ping,
 *      which the daemon answers only after it processed everything before it;
 *  (c) the engine-visible stall per eviction of a Qwen3-4B-shaped model (36 layers, 32/8 heads,
 *      head dim 128, bf16) with VaSE-AttnV on the host arena, async against sync, next to the
 *      compaction time alone and the daemon's plan time. The decode step is simulated by a
 *      sleep, so the engine leaves the CPU to the daemon's evictor threads as a GPU engine would.
 */

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "argnum.h"
#include "vase.h"

static const char *arg_runtime_dir;
static uint32_t arg_pings = 20000;
static uint32_t arg_rtt_evictions = 2000;
static uint32_t arg_stats_messages = 200000;
static uint32_t arg_stall_evictions = 8;
static uint32_t arg_budget = 4096;
static uint32_t arg_layers = 36;
static double arg_step_ms = 20.0;
static bool arg_run_rtt = true, arg_run_stats = true, arg_run_stall = true;

/* ---- measurements ---------------------------------------------------------------------- */

static double now_seconds(void) {
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_until(double t) {
    for (double left = t - now_seconds(); left > 0; left = t - now_seconds()) {
        struct timespec ts = {.tv_sec = (time_t)left,
                              .tv_nsec = (long)((left - (double)(time_t)left) * 1e9)};

        if (nanosleep(&ts, NULL) == 0)
            break;
    }
}

/* A growing list of samples in seconds. */
struct samples {
    double *v;
    size_t n, cap;
};

static int samples_add(struct samples *s, double x) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 1024;
        double *p = realloc(s->v, cap * sizeof *p);

        if (!p)
            return -ENOMEM;
        s->v = p;
        s->cap = cap;
    }
    s->v[s->n++] = x;
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile q in [0, 1] of the (sorted) samples. */
static double percentile(const struct samples *s, double q) {
    size_t k;

    if (s->n == 0)
        return NAN;
    k = (size_t)ceil(q * (double)s->n);
    return s->v[k > 0 ? k - 1 : 0];
}

/* One line of the summary table. */
struct row {
    char what[64];
    char n[16];
    char p50[16], p99[16], max[16];
    char target[32];
};

#define MAX_ROWS 16
static struct row rows[MAX_ROWS];
static size_t nrows;

static void add_row(const char *what, struct samples *s, double scale, const char *unit,
                    const char *target) {
    struct row *r;

    if (nrows == MAX_ROWS)
        return;
    r = &rows[nrows++];
    qsort(s->v, s->n, sizeof *s->v, cmp_double);
    snprintf(r->what, sizeof r->what, "%s", what);
    snprintf(r->n, sizeof r->n, "%zu", s->n);
    snprintf(r->p50, sizeof r->p50, "%.1f %s", percentile(s, 0.5) * scale, unit);
    snprintf(r->p99, sizeof r->p99, "%.1f %s", percentile(s, 0.99) * scale, unit);
    snprintf(r->max, sizeof r->max, "%.1f %s", s->n ? s->v[s->n - 1] * scale : NAN, unit);
    snprintf(r->target, sizeof r->target, "%s", target ? target : "");
}

static void add_rate_row(const char *what, uint64_t n, double per_second, const char *target) {
    struct row *r;

    if (nrows == MAX_ROWS)
        return;
    r = &rows[nrows++];
    snprintf(r->what, sizeof r->what, "%s", what);
    snprintf(r->n, sizeof r->n, "%" PRIu64, n);
    snprintf(r->p50, sizeof r->p50, "%.0f/s", per_second);
    snprintf(r->p99, sizeof r->p99, "-");
    snprintf(r->max, sizeof r->max, "-");
    snprintf(r->target, sizeof r->target, "%s", target ? target : "");
}

static void print_table(void) {
    printf("\n%-44s %8s %12s %12s %12s  %s\n", "measurement", "n", "p50", "p99", "max",
           "target (not asserted)");
    for (size_t i = 0; i < nrows; i++)
        printf("%-44s %8s %12s %12s %12s  %s\n", rows[i].what, rows[i].n, rows[i].p50, rows[i].p99,
               rows[i].max, rows[i].target);
    printf("\n[1] The triggering sync append: EvictRequest -> plan -> EvictPlan, compaction "
           "(subtracted)\n"
           "    and the EvictCommit sent; its CommitReply is read by the next call.\n"
           "[2] From the append that sends EvictRequest to the start of the vase_seq_poll() that\n"
           "    finds the EvictPlan (the engine spins on poll), so within one poll.\n"
           "[3] From the append that sends the request to the end of the call that applied the\n"
           "    plan: waits for the plan, compaction and sending the commit; the decode steps\n"
           "    in between are not counted.\n");
}

static int fail(const char *what, int r) {
    fprintf(stderr, "bench_service: %s failed: %s\n", what, vase_strerror(r));
    return r;
}

/* ---- row data ------------------------------------------------------------------------- */

/* Rows of K, V and Q are cut from one pool of normal draws in the model's dtype, so that
 * writing a token costs memcpy()s and the plans read realistic, finite data. */
#define POOL_SIZE (1u << 16)

struct pool {
    void *raw;
    size_t es;
    uint32_t dim;
    uint64_t state;
};

static uint64_t next_random(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int pool_init(struct pool *p, enum vase_dtype dtype, uint32_t dim) {
    size_t n = (size_t)POOL_SIZE + dim;

    *p = (struct pool){.es = vase_dtype_size(dtype), .dim = dim, .state = 42};
    p->raw = malloc(n * p->es);
    if (!p->raw)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        /* Box-Muller on two 53-bit uniforms in (0, 1]. */
        double u1 = ((double)(next_random(&p->state) >> 11) + 1.0) / 9007199254740992.0;
        double u2 = ((double)(next_random(&p->state) >> 11) + 1.0) / 9007199254740992.0;
        float x = (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));

        if (dtype == VASE_DTYPE_F32)
            ((float *)p->raw)[i] = x;
        else if (dtype == VASE_DTYPE_F16)
            ((uint16_t *)p->raw)[i] = vase_f32_to_f16(x);
        else
            ((uint16_t *)p->raw)[i] = vase_f32_to_bf16(x);
    }
    return 0;
}

static void pool_row(struct pool *p, void *dst) {
    uint32_t off = (uint32_t)((next_random(&p->state) >> 32) % POOL_SIZE);

    memcpy(dst, (const char *)p->raw + (size_t)off * p->es, (size_t)p->dim * p->es);
}

/* Writes n tokens (K, V, and the queries that stay in the ring) at the sequence's end. */
static int write_tokens(struct vase_seq *s, const struct vase_geometry *g, uint32_t window,
                        struct pool *p, uint32_t n) {
    uint32_t len = vase_seq_len(s);
    uint64_t pos = vase_seq_position(s);

    for (uint32_t i = 0; i < n; i++)
        for (uint32_t l = 0; l < g->layers; l++) {
            for (uint32_t h = 0; h < g->kv_heads; h++) {
                void *k = vase_seq_kv_ptr(s, l, VASE_K, len + i, h);
                void *v = vase_seq_kv_ptr(s, l, VASE_V, len + i, h);

                if (!k || !v)
                    return -ENOSPC;
                pool_row(p, k);
                pool_row(p, v);
            }
            if (n - i > 2 * window)
                continue;
            for (uint32_t h = 0; h < g->q_heads; h++) {
                void *q = vase_seq_query_ptr(s, l, pos + i, h);

                if (!q)
                    break;
                pool_row(p, q);
            }
        }
    return 0;
}

static int open_seq(struct vase_client *c, struct vase_model *m, enum vase_policy policy,
                    uint32_t budget, uint32_t window, uint32_t prompt, enum vase_mode mode,
                    struct vase_seq **ret) {
    struct vase_seq_config cfg = {
        .policy = policy,
        .params = vase_params_default(budget),
        .prompt_len = prompt,
        .seed = 7,
        .mode = mode,
        .slack = -1,
    };

    cfg.params.window = window;
    return vase_seq_open(c, m, &cfg, ret);
}

/* ---- (a) control plane ---------------------------------------------------------------- */

static int bench_ping(struct vase_client *c) {
    struct samples s = {.n = 0};
    int r = 0;

    for (uint32_t i = 0; i < arg_pings / 10 + 1; i++) /* warm-up */
        if ((r = vase_ping(c)) < 0)
            return fail("vase_ping()", r);
    for (uint32_t i = 0; i < arg_pings; i++) {
        double t0 = now_seconds();

        r = vase_ping(c);
        if (r < 0) {
            fail("vase_ping()", r);
            goto out;
        }
        if ((r = samples_add(&s, now_seconds() - t0)) < 0)
            goto out;
    }
    add_row("Ping round trip", &s, 1e6, "us", "p99 < 200 us");
out:
    free(s.v);
    return r;
}

/*
 * Evictions of a streaming sequence of a one-head model, whose plan costs microseconds.
 *
 * Sync: the append that triggers waits for the plan, compacts and sends the commit; its time
 * without the compaction is one round trip (request to plan) and the commit's send.
 *
 * Async: the append that triggers sends the request and returns; the engine then spins on
 * vase_seq_poll(). The poll that applies the plan began after the plan had arrived, and the one
 * before it began before; so the start of the successful poll, less the start of the append, is
 * the request-to-plan round trip to within one poll (a few microseconds).
 */
static int bench_evict_rtt(struct vase_client *c, enum vase_mode mode) {
    const uint32_t window = 16, budget = 32;
    struct vase_geometry g = {.name = "bench-rtt",
                              .layers = 1,
                              .q_heads = 1,
                              .kv_heads = 1,
                              .head_dim = 16,
                              .dtype = VASE_DTYPE_F32};
    struct samples rtt = {.n = 0}, plan = {.n = 0};
    struct vase_model *m;
    struct vase_seq *s = NULL;
    struct pool p = {.raw = NULL};
    uint32_t done = 0;
    int r;

    if ((r = vase_model_register(c, &g, &m)) < 0)
        return fail("vase_model_register(bench-rtt)", r);
    if ((r = pool_init(&p, g.dtype, g.head_dim)) < 0)
        return fail("allocating rows", r);
    if ((r = open_seq(c, m, VASE_POLICY_STREAMING, budget, window, 0, mode, &s)) < 0) {
        fail("vase_seq_open(streaming)", r);
        goto out;
    }
    /* One warm-up eviction, then the measured ones. */
    while (done < arg_rtt_evictions + 1) {
        uint32_t len = vase_seq_len(s);
        bool trigger = len + 1 > budget && (len + 1) % window == 0;
        struct vase_seq_stats before, after;
        double t0, t1, dt;

        if ((r = write_tokens(s, &g, window, &p, 1)) < 0) {
            fail("writing a token", r);
            goto out;
        }
        vase_seq_get_stats(s, &before);
        t0 = now_seconds();
        r = vase_seq_append(s, 1);
        dt = now_seconds() - t0;
        if (r < 0) {
            fail("vase_seq_append(streaming)", r);
            goto out;
        }
        if (!trigger)
            continue;
        if (mode == VASE_MODE_SYNC) {
            if (r == 0) {
                fprintf(stderr, "bench_service: the sync append at len %u applied no plan\n",
                        len + 1);
                r = -EPROTO;
                goto out;
            }
            vase_seq_get_stats(s, &after);
            dt -= after.compact_seconds - before.compact_seconds;
        } else {
            do {
                t1 = now_seconds();
                r = vase_seq_poll(s);
            } while (r == 0);
            if (r < 0) {
                fail("vase_seq_poll(streaming)", r);
                goto out;
            }
            vase_seq_get_stats(s, &after);
            dt = t1 - t0;
        }
        if (done++ == 0)
            continue;
        if ((r = samples_add(&rtt, dt)) < 0 ||
            (r = samples_add(&plan, after.last_plan_seconds)) < 0)
            goto out;
    }
    if (mode == VASE_MODE_SYNC)
        add_row("evict cycle, streaming (sync) [1]", &rtt, 1e6, "us", NULL);
    else
        add_row("evict request -> plan, streaming (async) [2]", &rtt, 1e6, "us", "p99 < 200 us");
    add_row("  of which the daemon's plan", &plan, 1e6, "us", NULL);
    r = 0;
out:
    vase_seq_close(s);
    free(p.raw);
    free(plan.v);
    free(rtt.v);
    return r;
}

/* ---- (b) AttnStats ingestion -------------------------------------------------------------- */

/* Pushes n messages of [kv_heads][len] floats into an h2o sequence whose prompt fills len
 * slots, then a Ping; the daemon handles one client's messages in order, so the Pong means all
 * were processed. */
static int bench_stats(struct vase_client *c, uint32_t kv_heads, uint32_t len, uint32_t n) {
    struct vase_geometry g = {.name = "bench-stats",
                              .layers = 1,
                              .q_heads = kv_heads,
                              .kv_heads = kv_heads,
                              .head_dim = 8,
                              .dtype = VASE_DTYPE_F32};
    struct vase_model *m;
    struct vase_seq *s = NULL;
    struct pool p = {.raw = NULL};
    float *values = NULL;
    char what[64];
    double t0, dt;
    int r;

    if ((r = vase_model_register(c, &g, &m)) < 0)
        return fail("vase_model_register(bench-stats)", r);
    if ((r = pool_init(&p, g.dtype, g.head_dim)) < 0)
        return fail("allocating rows", r);
    values = malloc((size_t)kv_heads * len * sizeof *values);
    if (!values) {
        r = fail("allocating the statistics", -ENOMEM);
        goto out;
    }
    for (size_t i = 0; i < (size_t)kv_heads * len; i++)
        values[i] = 1.0f / (float)len;
    /* The budget only has to exceed the prompt (len, a multiple of 64); nothing is decoded. */
    if ((r = open_seq(c, m, VASE_POLICY_H2O, len + 64, 64, len, VASE_MODE_ASYNC, &s)) < 0) {
        fail("vase_seq_open(h2o)", r);
        goto out;
    }
    if ((r = write_tokens(s, &g, 64, &p, len)) < 0 || (r = vase_seq_append(s, len)) < 0) {
        fail("prefilling the h2o sequence", r);
        goto out;
    }
    if ((r = vase_ping(c)) < 0) {
        fail("vase_ping()", r);
        goto out;
    }

    t0 = now_seconds();
    for (uint32_t i = 0; i < n; i++) {
        r = vase_seq_push_stats(s, 0, VASE_STATS_ACC_ADD, values, len);
        if (r < 0) {
            fail("vase_seq_push_stats()", r);
            goto out;
        }
    }
    r = vase_ping(c);
    dt = now_seconds() - t0;
    if (r < 0) {
        fail("vase_ping() after the statistics", r);
        goto out;
    }
    snprintf(what, sizeof what, "AttnStats ingested, %ux%u floats", kv_heads, len);
    add_rate_row(what, n, (double)n / dt, kv_heads * len <= 64 ? ">= 200k msgs/s" : NULL);
    printf("AttnStats %ux%u floats: %u messages in %.3f s: %.0f msgs/s, %.1f MB/s\n", kv_heads, len,
           n, dt, (double)n / dt, (double)n * kv_heads * len * sizeof(float) / dt / 1e6);
    r = 0;
out:
    vase_seq_close(s);
    free(values);
    free(p.raw);
    return r;
}

/* ---- (c) stalls ----------------------------------------------------------------------- */

struct stall_result {
    struct samples stall;   /* engine-visible time per eviction */
    struct samples compact; /* compaction alone */
    struct samples plan;    /* the daemon's plan time */
    struct samples append;  /* appends that neither triggered nor applied a plan */
};

static void stall_result_done(struct stall_result *sr) {
    free(sr->stall.v);
    free(sr->compact.v);
    free(sr->plan.v);
    free(sr->append.v);
}

/* Times one libvase call that may apply a plan: adds its time to the eviction being paid for,
 * and on an applied plan records the eviction's total, its compaction and its plan time. */
static int account(struct vase_seq *s, struct stall_result *sr, double dt, bool part_of_eviction,
                   int applied, const struct vase_seq_stats *before, double *pending) {
    struct vase_seq_stats after;
    int r;

    if (part_of_eviction || applied > 0)
        *pending += dt;
    else if ((r = samples_add(&sr->append, dt)) < 0)
        return r;
    if (applied <= 0)
        return 0;
    vase_seq_get_stats(s, &after);
    if ((r = samples_add(&sr->stall, *pending)) < 0 ||
        (r = samples_add(&sr->compact, after.compact_seconds - before->compact_seconds)) < 0 ||
        (r = samples_add(&sr->plan, after.last_plan_seconds)) < 0)
        return r;
    *pending = 0;
    return 0;
}

static int bench_stall_mode(struct vase_client *c, struct vase_model *m,
                            const struct vase_geometry *g, struct pool *p, enum vase_mode mode,
                            struct stall_result *sr) {
    const uint32_t window = 64;
    const char *name = mode == VASE_MODE_SYNC ? "sync" : "async";
    struct vase_seq *s = NULL;
    double pending = 0, t0, step_start, prefill;
    uint64_t steps = 0;
    int r;

    r = open_seq(c, m, VASE_POLICY_VASE_ATTNV, arg_budget, window, arg_budget, mode, &s);
    if (r < 0) {
        fprintf(stderr, "bench_service: vase_seq_open(vase-attnv, budget %u, %s) failed: %s\n",
                arg_budget, name, vase_strerror(r));
        return r;
    }
    t0 = now_seconds();
    if ((r = write_tokens(s, g, window, p, arg_budget)) < 0 ||
        (r = vase_seq_append(s, arg_budget)) < 0) {
        fail("prefilling the Qwen3-4B-shaped sequence", r);
        goto out;
    }
    prefill = now_seconds() - t0;
    printf("stall, %s: sequence %u, capacity %u, prompt %u written in %.2f s\n", name,
           vase_seq_id(s), vase_seq_capacity(s), arg_budget, prefill);

    while (sr->stall.n < arg_stall_evictions) {
        struct vase_seq_stats before;
        uint32_t len = vase_seq_len(s);
        bool trigger = len + 1 > arg_budget && (len + 1) % window == 0;
        double dt;

        step_start = now_seconds();
        vase_seq_get_stats(s, &before);
        /* Full (async, the slack used up): the engine must wait before it can write. */
        if (len >= vase_seq_capacity(s)) {
            t0 = now_seconds();
            r = vase_seq_wait(s);
            dt = now_seconds() - t0;
            if (r < 0) {
                fail("vase_seq_wait()", r);
                goto out;
            }
            if ((r = account(s, sr, dt, true, r, &before, &pending)) < 0)
                goto out;
            vase_seq_get_stats(s, &before);
        }
        if ((r = write_tokens(s, g, window, p, 1)) < 0) {
            fail("writing a token", r);
            goto out;
        }
        t0 = now_seconds();
        r = vase_seq_append(s, 1);
        dt = now_seconds() - t0;
        if (r < 0) {
            fail("vase_seq_append()", r);
            goto out;
        }
        if ((r = account(s, sr, dt, trigger, r, &before, &pending)) < 0)
            goto out;

        vase_seq_get_stats(s, &before);
        t0 = now_seconds();
        r = vase_seq_poll(s);
        dt = now_seconds() - t0;
        if (r < 0) {
            fail("vase_seq_poll()", r);
            goto out;
        }
        /* A poll that found nothing is not an append; only one that applied a plan counts. */
        if (r > 0 && (r = account(s, sr, dt, false, r, &before, &pending)) < 0)
            goto out;
        steps++;
        sleep_until(step_start + arg_step_ms * 1e-3);
    }
    printf("stall, %s: %" PRIu64 " decode steps, %zu evictions\n", name, steps, sr->stall.n);
    r = 0;
out:
    vase_seq_close(s);
    return r;
}

static int bench_stall(struct vase_client *c) {
    struct vase_geometry g = {.name = "qwen3-4b-shape",
                              .layers = arg_layers,
                              .q_heads = 32,
                              .kv_heads = 8,
                              .head_dim = 128,
                              .dtype = VASE_DTYPE_BF16};
    struct stall_result async = {.stall.n = 0}, sync = {.stall.n = 0};
    struct samples compact = {.n = 0}, plan = {.n = 0}, beyond = {.n = 0};
    struct vase_model *m;
    struct pool p = {.raw = NULL};
    uint32_t tpp;
    char what[64];
    int r;

    if ((r = vase_model_register(c, &g, &m)) < 0)
        return fail("vase_model_register(Qwen3-4B shape)", r);
    tpp = vase_model_tokens_per_page(m);
    printf("stall: %u layers, 32/8 heads, dim 128, bf16, vase-attnv, budget %u, window 64, "
           "simulated step %.1f ms; %u tokens per page, %.1f MiB of KV per sequence\n",
           g.layers, arg_budget, arg_step_ms, tpp,
           (double)(arg_budget + 128) * g.layers * 2 * 8 * 128 * 2 / (1 << 20));
    if ((r = pool_init(&p, g.dtype, g.head_dim)) < 0)
        return fail("allocating rows", r);

    if ((r = bench_stall_mode(c, m, &g, &p, VASE_MODE_ASYNC, &async)) < 0 ||
        (r = bench_stall_mode(c, m, &g, &p, VASE_MODE_SYNC, &sync)) < 0)
        goto out;

    /* Paired, before add_row() sorts them: what an async eviction costs beyond its compaction
     * (the request, sending the commit, any wait). */
    for (size_t i = 0; i < async.stall.n; i++)
        if ((r = samples_add(&beyond, async.stall.v[i] - async.compact.v[i])) < 0)
            goto out;
    for (size_t i = 0; i < async.compact.n; i++)
        if ((r = samples_add(&compact, async.compact.v[i])) < 0 ||
            (r = samples_add(&plan, async.plan.v[i])) < 0)
            goto out;
    for (size_t i = 0; i < sync.compact.n; i++)
        if ((r = samples_add(&compact, sync.compact.v[i])) < 0 ||
            (r = samples_add(&plan, sync.plan.v[i])) < 0)
            goto out;
    snprintf(what, sizeof what, "stall per eviction, async (budget %u) [3]", arg_budget);
    add_row(what, &async.stall, 1e3, "ms", "<= compaction");
    add_row("  async stall beyond its compaction", &beyond, 1e3, "ms", NULL);
    snprintf(what, sizeof what, "stall per eviction, sync (budget %u) [3]", arg_budget);
    add_row(what, &sync.stall, 1e3, "ms", NULL);
    add_row("compaction alone (both modes)", &compact, 1e3, "ms", NULL);
    add_row("daemon plan time (both modes)", &plan, 1e3, "ms", NULL);
    add_row("append without eviction, async", &async.append, 1e6, "us", NULL);
    r = 0;
out:
    stall_result_done(&async);
    stall_result_done(&sync);
    free(beyond.v);
    free(compact.v);
    free(plan.v);
    free(p.raw);
    return r;
}

/* ---- driver --------------------------------------------------------------------------- */

static int run(void) {
    struct vase_client *c;
    int r;

    r = vase_connect(&(struct vase_connect_options){.runtime_dir = arg_runtime_dir,
                                                    .name = "bench_service",
                                                    .timeout_ms = 60000},
                     &c);
    if (r < 0)
        return fail("vase_connect()", r);
    printf("bench_service: client %u, daemon incarnation %016" PRIx64 "\n", vase_client_id(c),
           vase_client_incarnation(c));

    if (arg_run_rtt && ((r = bench_ping(c)) < 0 || (r = bench_evict_rtt(c, VASE_MODE_ASYNC)) < 0 ||
                        (r = bench_evict_rtt(c, VASE_MODE_SYNC)) < 0))
        goto out;
    if (arg_run_stats && ((r = bench_stats(c, 1, 64, arg_stats_messages)) < 0 ||
                          (r = bench_stats(c, 8, 4096, arg_stats_messages / 100 + 1)) < 0))
        goto out;
    if (arg_run_stall && (r = bench_stall(c)) < 0)
        goto out;
    print_table();
out:
    vase_disconnect(c);
    return r;
}

static void help(void) {
    printf("Usage: %s [OPTIONS]\n"
           "Measures vased through libvase: control-plane round trips, AttnStats ingestion, and\n"
           "the engine-visible stall per eviction of a Qwen3-4B-shaped model. Needs a running\n"
           "daemon with an arena of about 1 GiB (tests/bench_service.sh starts one).\n"
           "\n"
           "      --runtime-dir=DIR        vased's runtime directory ($VASE_RUNTIME_DIR)\n"
           "      --only=PART              rtt, stats or stall (all)\n"
           "      --pings=N                Ping round trips timed (20000)\n"
           "      --rtt-evictions=N        streaming evictions timed (2000)\n"
           "      --stats-messages=N       AttnStats messages pushed (200000)\n"
           "      --stall-evictions=N      evictions per mode in the stall part (8)\n"
           "      --budget=N               budget of the stall part, a multiple of 64 (4096)\n"
           "      --layers=N               layers of the stall part's model (36)\n"
           "      --step-ms=MS             simulated decode step of the stall part (20)\n"
           "  -h --help                    show this help\n",
           program_invocation_short_name);
}

/* Returns < 0 on a usage error, 0 to exit successfully (help), > 0 to go on. */
static int parse_argv(int argc, char **argv) {
    enum {
        OPT_RUNTIME_DIR = 0x100,
        OPT_ONLY,
        OPT_PINGS,
        OPT_RTT,
        OPT_STATS,
        OPT_STALL,
        OPT_BUDGET,
        OPT_LAYERS,
        OPT_STEP_MS
    };
    static const struct option options[] = {
        {"runtime-dir", required_argument, NULL, OPT_RUNTIME_DIR},
        {"only", required_argument, NULL, OPT_ONLY},
        {"pings", required_argument, NULL, OPT_PINGS},
        {"rtt-evictions", required_argument, NULL, OPT_RTT},
        {"stats-messages", required_argument, NULL, OPT_STATS},
        {"stall-evictions", required_argument, NULL, OPT_STALL},
        {"budget", required_argument, NULL, OPT_BUDGET},
        {"layers", required_argument, NULL, OPT_LAYERS},
        {"step-ms", required_argument, NULL, OPT_STEP_MS},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c, r = 0, idx = 0;
    char *end;

    while ((c = getopt_long(argc, argv, "h", options, &idx)) >= 0) {
        switch (c) {
        case 'h':
            help();
            return 0;
        case OPT_RUNTIME_DIR:
            arg_runtime_dir = optarg;
            continue;
        case OPT_ONLY:
            arg_run_rtt = strcmp(optarg, "rtt") == 0;
            arg_run_stats = strcmp(optarg, "stats") == 0;
            arg_run_stall = strcmp(optarg, "stall") == 0;
            if (!arg_run_rtt && !arg_run_stats && !arg_run_stall) {
                fprintf(stderr, "%s: unknown --only '%s', expected rtt, stats or stall\n",
                        program_invocation_short_name, optarg);
                return -EINVAL;
            }
            continue;
        case OPT_PINGS:
            r = argnum_u32(optarg, 1, 100000000, &arg_pings);
            break;
        case OPT_RTT:
            r = argnum_u32(optarg, 1, 100000000, &arg_rtt_evictions);
            break;
        case OPT_STATS:
            r = argnum_u32(optarg, 1, 1000000000, &arg_stats_messages);
            break;
        case OPT_STALL:
            r = argnum_u32(optarg, 1, 100000, &arg_stall_evictions);
            break;
        case OPT_BUDGET:
            r = argnum_u32(optarg, 128, VASE_MAX_BUDGET, &arg_budget);
            if (r == 0 && arg_budget % 64 != 0)
                r = -EINVAL;
            break;
        case OPT_LAYERS:
            r = argnum_u32(optarg, 1, 1024, &arg_layers);
            break;
        case OPT_STEP_MS:
            errno = 0;
            arg_step_ms = strtod(optarg, &end);
            if (end == optarg || *end != '\0' || errno != 0 || !isfinite(arg_step_ms) ||
                arg_step_ms < 0 || arg_step_ms > 1e5)
                r = -EINVAL;
            break;
        default:
            return -EINVAL;
        }
        if (r < 0) {
            fprintf(stderr, "%s: invalid --%s '%s' (%s)\n", program_invocation_short_name,
                    options[idx].name, optarg,
                    r == -ERANGE      ? "out of range"
                    : c == OPT_BUDGET ? "a multiple of 64 of at least 128 expected"
                                      : "not a number");
            return r;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", program_invocation_short_name,
                argv[optind]);
        return -EINVAL;
    }
    return 1;
}

int main(int argc, char **argv) {
    int r = parse_argv(argc, argv);

    if (r <= 0)
        return r < 0 ? 2 : 0;
    return run() < 0 ? 1 : 0;
}
