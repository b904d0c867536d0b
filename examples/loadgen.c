/* SPDX-License-Identifier: MIT */

/*
 * loadgen: static against elastic budgets on one arena, under the same bursty load. Three
 * synthetic engines (one client and one model each, of different page sizes) serve sequences
 * that arrive by a seeded two-state Markov-modulated Poisson process; every arrival is served by
 * a thread of its own, which opens the sequence with an admission wait, prefills its prompt,
 * decodes to its length at a fixed simulated step time and closes it. The same arrival schedule
 * runs once per mode, one mode after the other on the same daemon: first with every sequence at
 * a fixed budget (static), then with every sequence elastic (min_budget a fraction of the budget,
 * one run per fraction of --min-frac), and the modes are compared: admitted and refused
 * sequences, admission waits, decode throughput, the arena's occupancy over time (sampled
 * through the administrative API) and the budgets the sequences actually ran with.
 *
 * Threads: the dispatcher (main) starts one thread per arrival; they share their engine's client
 * (libvase serialises the calls, and releases the client's lock while an open waits, so the
 * engine's other sequences keep decoding and, when elastic, give up budget to it). A sampler
 * thread owns the administrative handle while a mode runs. What threads share besides the
 * clients is in atomics (struct gauges); each sequence's record is written by its thread only and
 * read after it was joined.
 *
 * After each mode the generator checks what must hold in any run, load and machine speed aside:
 * every arrival is accounted for exactly once, every admitted sequence decoded to its length and
 * closed, and the arena holds no pages and no sequences afterwards. It exits with 1 otherwise.
 */

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vase.h"
#include "vase_admin.h"

/* ---- the engines ------------------------------------------------------------------------ */

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

static const struct model_spec models[] = {
    /* 32 KiB pages of 16 tokens. */
    {"small", 4, 8, 2, 64, VASE_DTYPE_BF16, 16, 512, 64, VASE_POLICY_VASE_DKV, 0.5},
    /* 256 KiB pages of 32 tokens. */
    {"wide", 4, 16, 4, 128, VASE_DTYPE_F16, 32, 768, 64, VASE_POLICY_STREAMING, 0.3},
    /* 512 KiB pages of 256 tokens. */
    {"long", 2, 4, 1, 128, VASE_DTYPE_F32, 256, 1024, 128, VASE_POLICY_STREAMING, 0.2},
};
#define N_MODELS (sizeof(models) / sizeof(models[0]))

/* Distinct K/V rows per engine; a token's rows are picked by a hash of (sequence, slot, layer). */
#define ROW_POOL 64u

/* ---- settings ---------------------------------------------------------------------------- */

static double arg_duration = 30;     /* seconds of arrivals per mode */
static double arg_calm_rate = 3;     /* arrivals per second in the calm state */
static double arg_burst_rate = 12;   /* ... in the burst state */
static double arg_calm_seconds = 4;  /* mean length of a calm period */
static double arg_burst_seconds = 3; /* ... of a burst */
static double arg_decode_min = 1024; /* decoded tokens per sequence, uniform in [min, max] */
static double arg_decode_max = 3072;
static double arg_step_ms = 2; /* simulated forward time per decoded token */
static double arg_admission_wait_ms = 2000;
/* Elastic: min_budget = this fraction of the budget; one elastic run per fraction. */
#define MAX_MIN_FRACS 3
static double arg_min_fracs[MAX_MIN_FRACS] = {0.5};
static size_t arg_n_min_fracs = 1;
static double arg_max_inflight = 512; /* sequences opening or running at once */
static double arg_seed = 1;
static double arg_sample_ms = 100;
static const char *arg_modes = "static,elastic";
static const char *arg_out = ".";
static const char *arg_runtime_dir;

static volatile sig_atomic_t stop_requested;

/* ---- small helpers ---------------------------------------------------------------------- */

static double now_seconds(void) {
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_until(double t) {
    for (double left = t - now_seconds(); left > 0 && !stop_requested; left = t - now_seconds()) {
        struct timespec ts = {.tv_sec = (time_t)left,
                              .tv_nsec = (long)((left - (double)(time_t)left) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

/* splitmix64 */
static uint64_t mix(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in (0, 1]. */
static double uniform(uint64_t *state) {
    return ((double)(mix(state) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

static double exponential(uint64_t *state, double mean) {
    return -mean * log(uniform(state));
}

/* Uniform integer in [lo, hi]. */
static uint32_t uniform_in(uint64_t *state, uint32_t lo, uint32_t hi) {
    return lo + (uint32_t)((mix(state) >> 33) % ((uint64_t)hi - lo + 1));
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

/* The q-quantile (nearest rank) of n values, sorted in place; NAN for none. */
static double quantile(double *v, size_t n, double q) {
    if (n == 0)
        return NAN;
    qsort(v, n, sizeof(*v), cmp_double);
    size_t k = (size_t)ceil(q * (double)n);
    return v[k > 0 ? k - 1 : 0];
}

/* ---- the arrival schedule ---------------------------------------------------------------- */

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

static int make_schedule(struct arrival **ret, size_t *ret_n) {
    uint64_t rng = (uint64_t)arg_seed;
    struct arrival *a = NULL;
    size_t n = 0, cap = 0;
    bool burst = false;
    double t = 0, period_end = exponential(&rng, arg_calm_seconds);

    for (;;) {
        double rate = burst ? arg_burst_rate : arg_calm_rate;
        double next = rate > 0 ? t + exponential(&rng, 1.0 / rate) : INFINITY;

        if (next > period_end) {
            t = period_end;
            burst = !burst;
            period_end = t + exponential(&rng, burst ? arg_burst_seconds : arg_calm_seconds);
            if (t >= arg_duration)
                break;
            continue;
        }
        t = next;
        if (t >= arg_duration)
            break;
        if (n == cap) {
            size_t ncap = cap ? 2 * cap : 256;
            struct arrival *p = realloc(a, ncap * sizeof(*a));

            if (!p) {
                free(a);
                return -ENOMEM;
            }
            a = p;
            cap = ncap;
        }
        double pick = uniform(&rng), acc = 0;
        uint32_t e = 0;
        for (e = 0; e + 1 < N_MODELS; e++) {
            acc += models[e].share;
            if (pick <= acc)
                break;
        }
        a[n++] = (struct arrival){
            .t = t,
            .engine = e,
            .prompt = uniform_in(&rng, models[e].budget / 2, models[e].budget),
            .length = uniform_in(&rng, (uint32_t)arg_decode_min, (uint32_t)arg_decode_max),
            .burst = burst,
        };
    }
    *ret = a;
    *ret_n = n;
    return 0;
}

/* ---- one mode's run ---------------------------------------------------------------------- */

enum outcome {
    OUT_NONE,      /* not yet decided (a thread still running) */
    OUT_ADMITTED,  /* opened; decoded to its length and closed unless failed says otherwise */
    OUT_ENOSPC,    /* refused: the arena had no room within the admission wait */
    OUT_REFUSED,   /* refused for another reason (the errno is in err) */
    OUT_GENERATOR, /* never opened: --max-inflight sequences were in flight, or no thread */
};

static const char *const outcome_names[] = {"none", "admitted", "enospc", "refused", "generator"};

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

static double since(const struct mode_run *m) {
    return now_seconds() - m->start;
}

static uint32_t min_budget_of(const struct model_spec *s, double frac) {
    uint32_t w = s->window, m = (uint32_t)(frac * s->budget) / w * w;

    return m <= w ? 2 * w : m;
}

/* KV pages a sequence of s holds in its steady state at budget b (the daemon's
 * vase_layout_steady_slots with the default slack of one window). */
static uint64_t pages_at(const struct engine *e, uint32_t b) {
    return (b + 2 * e->spec->window + e->tpp - 1) / e->tpp;
}

static void fill_rows(struct engine *e, uint64_t seed) {
    const struct model_spec *s = e->spec;
    size_t n = (size_t)ROW_POOL * s->kv_heads * s->head_dim;
    uint64_t rng = seed;

    for (size_t i = 0; i < n; i++) {
        float x = (float)(2.0 * uniform(&rng) - 1.0);

        if (s->dtype == VASE_DTYPE_F32)
            ((float *)e->rows)[i] = x;
        else if (s->dtype == VASE_DTYPE_F16)
            ((uint16_t *)e->rows)[i] = vase_f32_to_f16(x);
        else
            ((uint16_t *)e->rows)[i] = vase_f32_to_bf16(x);
    }
}

static const void *row_for(const struct engine *e, uint64_t seq, uint32_t slot, uint32_t layer) {
    uint64_t h = seq * 0x100000001b3ull ^ ((uint64_t)slot << 20) ^ layer;

    return (const char *)e->rows + (size_t)(mix(&h) % ROW_POOL) * e->row_bytes;
}

/* K and V of tokens slot .. slot + n - 1 of every layer. */
static int write_tokens(const struct engine *e, struct vase_seq *s, uint64_t key, uint32_t slot,
                        uint32_t n) {
    for (uint32_t i = slot; i < slot + n; i++)
        for (uint32_t l = 0; l < e->spec->layers; l++) {
            int r = vase_seq_write_kv(s, l, i, row_for(e, key, i, l), row_for(e, ~key, i, l));

            if (r < 0)
                return r;
        }
    return 0;
}

/* Publishes a sequence's budget fraction and headroom into the gauges, replacing what it
 * published before (*ppm, *head). */
static void publish(struct mode_run *m, const struct engine *e, struct vase_seq *s, uint64_t *ppm,
                    uint64_t *head) {
    uint64_t p = s ? (uint64_t)vase_seq_budget(s) * 1000000 / e->spec->budget : 0;
    /* Only a sequence that has evicted plans every window tokens: one before its first eviction
     * cannot release anything until its length passes its budget. */
    uint64_t now = s && vase_seq_rounds(s) > 0 ? vase_seq_capacity(s) / e->tpp : 0;
    uint64_t floor = s ? pages_at(e, vase_seq_min_budget(s)) : 0;
    uint64_t h = now > floor ? (now - floor) * e->page_bytes : 0;

    atomic_fetch_add(&m->g.budget_ppm, p - *ppm);
    if ((p > 0) != (*ppm > 0))
        atomic_fetch_add(&m->g.decoding, p > 0 ? 1 : -1);
    atomic_fetch_add(&m->g.headroom[e - m->engines], h - *head);
    *ppm = p;
    *head = h;
}

/* Decodes an admitted sequence to its length (or until interrupted). */
static int decode(struct mode_run *m, const struct engine *e, struct seq_rec *rec,
                  struct vase_seq *s, const char **ret_what) {
    uint64_t key = (uint64_t)(rec - m->recs) + 1, ppm = 0, head = 0;
    double sum = 0;
    int r;

    *ret_what = "writing the prompt";
    r = write_tokens(e, s, key, 0, rec->a->prompt);
    if (r >= 0 && (*ret_what = "vase_seq_append() of the prompt"))
        r = vase_seq_append(s, rec->a->prompt);
    rec->budget_min = vase_seq_budget(s);
    for (uint32_t i = 0; r >= 0 && i < rec->a->length && !stop_requested; i++) {
        *ret_what = "vase_seq_wait()";
        if (vase_seq_len(s) >= vase_seq_capacity(s) && (r = vase_seq_wait(s)) < 0)
            break;
        *ret_what = "vase_seq_write_kv()";
        if ((r = write_tokens(e, s, key, vase_seq_len(s), 1)) < 0)
            break;
        *ret_what = "vase_seq_append()";
        if ((r = vase_seq_append(s, 1)) < 0)
            break;
        *ret_what = "vase_seq_poll()";
        if ((r = vase_seq_poll(s)) < 0)
            break;
        uint32_t b = vase_seq_budget(s);
        sum += b;
        if (b < rec->budget_min)
            rec->budget_min = b;
        rec->tokens++;
        atomic_fetch_add(&m->g.tokens, 1);
        publish(m, e, s, &ppm, &head);
        sleep_until(now_seconds() + arg_step_ms * 1e-3);
    }
    publish(m, e, NULL, &ppm, &head);
    rec->budget_mean = rec->tokens ? sum / (double)rec->tokens : rec->budget;
    return r < 0 ? r : 0;
}

static void *serve(void *arg) {
    struct job *job = arg;
    struct mode_run *m = job->run;
    struct seq_rec *rec = job->rec;
    const struct engine *e = &m->engines[rec->a->engine];
    const struct model_spec *spec = e->spec;
    struct vase_seq_config cfg = {
        .policy = spec->policy,
        .params = vase_params_default(spec->budget),
        .prompt_len = rec->a->prompt,
        .seed = (uint64_t)(rec - m->recs) + 1,
        .mode = VASE_MODE_ASYNC,
        .slack = -1,
        .admission_wait_ms = (int32_t)arg_admission_wait_ms,
        .min_budget = m->min_frac > 0 ? min_budget_of(spec, m->min_frac) : 0,
    };
    struct vase_seq *s = NULL;
    int r;

    cfg.params.window = spec->window;
    atomic_fetch_add(&m->g.waiting, 1);
    rec->open_s = since(m);
    r = vase_seq_open(e->client, e->model, &cfg, &s);
    rec->admitted_s = since(m);
    atomic_fetch_sub(&m->g.waiting, 1);
    if (r < 0) {
        uint64_t need = pages_at(e, spec->budget) * e->page_bytes;
        uint64_t free_bytes = atomic_load(&m->g.free_bytes);

        rec->outcome = r == -ENOSPC ? OUT_ENOSPC : OUT_REFUSED;
        rec->err = -r;
        rec->fit_free = r == -ENOSPC && free_bytes >= need;
        rec->roomy =
            r == -ENOSPC && atomic_load(&m->g.headroom[rec->a->engine]) + free_bytes >= need;
        goto out;
    }
    rec->outcome = OUT_ADMITTED;
    rec->seq_id = vase_seq_id(s);
    rec->budget = vase_seq_budget(s);
    rec->min_budget = vase_seq_min_budget(s);
    atomic_fetch_add(&m->g.running, 1);
    const char *what;
    r = decode(m, e, rec, s, &what);
    if (r < 0) {
        /* The client's last error may be another thread's by now; it is printed as a hint. */
        rec->failed = true;
        rec->err = -r;
        fprintf(stderr,
                "loadgen: %s: sequence %u of %s: %s failed after %" PRIu64 " tokens: %s "
                "(len %u, capacity %u, budget %u, rounds %u; the client's last error: %s)\n",
                m->name, rec->seq_id, spec->name, what, rec->tokens, vase_strerror(r),
                vase_seq_len(s), vase_seq_capacity(s), vase_seq_budget(s), vase_seq_rounds(s),
                vase_last_error(e->client));
    }
    struct vase_seq_stats st;
    vase_seq_get_stats(s, &st);
    rec->evictions = st.evictions;
    rec->budget_changes = st.budget_changes;
    r = vase_seq_close(s);
    if (r < 0 && !rec->failed) {
        rec->failed = true;
        rec->err = -r;
        fprintf(stderr, "loadgen: %s: closing sequence %u failed: %s\n", m->name, rec->seq_id,
                vase_strerror(r));
    }
    rec->closed_s = since(m);
    atomic_fetch_sub(&m->g.running, 1);
out:
    atomic_fetch_sub(&m->g.inflight, 1);
    return NULL;
}

/* ---- the sampler ------------------------------------------------------------------------- */

static int take_sample(struct mode_run *m) {
    Vase__StatusReply *st;
    int r = vase_admin_status(m->admin, &st);

    if (r < 0)
        return r;
    if (st->n_arenas < 1) {
        protobuf_c_message_free_unpacked(&st->base, NULL);
        return -EPROTO;
    }
    const Vase__ArenaStatus *a = st->arenas[0];
    struct sample x = {
        .t = since(m),
        .bytes_total = a->bytes_total,
        .bytes_free = a->bytes_free,
        .bytes_pages = a->bytes_pages,
        .bytes_reclaiming = st->bytes_reclaiming,
        .seqs = st->seqs,
        .opens_waiting = st->opens_waiting,
        .seqs_shrunk = st->seqs_shrunk,
        .shrinks = st->budget_shrinks_total,
        .grows = st->budget_grows_total,
        .tokens = atomic_load(&m->g.tokens),
        .running = atomic_load(&m->g.running),
        .waiting = atomic_load(&m->g.waiting),
    };
    protobuf_c_message_free_unpacked(&st->base, NULL);
    int decoding = atomic_load(&m->g.decoding);
    x.budget_frac = decoding > 0 ? (double)atomic_load(&m->g.budget_ppm) / 1e6 / decoding : NAN;
    atomic_store(&m->g.free_bytes, x.bytes_free);
    if (m->n_samples == m->cap_samples) {
        size_t ncap = m->cap_samples ? 2 * m->cap_samples : 1024;
        struct sample *p = realloc(m->samples, ncap * sizeof(*p));

        if (!p)
            return -ENOMEM;
        m->samples = p;
        m->cap_samples = ncap;
    }
    m->samples[m->n_samples++] = x;
    return 0;
}

static void *sampler(void *arg) {
    struct mode_run *m = arg;
    double next = now_seconds();

    while (atomic_load(&m->sampling)) {
        int r = take_sample(m);

        if (r < 0 && m->sampler_err == 0) {
            m->sampler_err = r;
            fprintf(stderr, "loadgen: %s: status from vased failed: %s %s\n", m->name,
                    vase_strerror(r), vase_admin_last_error(m->admin));
        }
        next += arg_sample_ms * 1e-3;
        sleep_until(next);
    }
    return NULL;
}

/* ---- a mode, start to end ------------------------------------------------------------------ */

static void disconnect_engines(struct mode_run *m) {
    for (size_t i = 0; i < N_MODELS; i++) {
        m->engines[i].client = vase_disconnect(m->engines[i].client);
        free(m->engines[i].rows);
        m->engines[i].rows = NULL;
    }
}

static int connect_engines(struct mode_run *m) {
    for (size_t i = 0; i < N_MODELS; i++) {
        struct engine *e = &m->engines[i];
        const struct model_spec *s = &models[i];
        char name[64];
        int r;

        *e = (struct engine){.spec = s};
        e->row_bytes = (size_t)s->kv_heads * s->head_dim * vase_dtype_size(s->dtype);
        e->rows = malloc(ROW_POOL * e->row_bytes);
        if (!e->rows)
            return -ENOMEM;
        fill_rows(e, (uint64_t)arg_seed + i);
        snprintf(name, sizeof(name), "loadgen-%.24s-%.24s", m->name, s->name);
        r = vase_connect(
            &(struct vase_connect_options){.runtime_dir = arg_runtime_dir, .name = name},
            &e->client);
        if (r < 0) {
            fprintf(stderr, "loadgen: cannot connect to vased: %s\n", vase_strerror(r));
            return r;
        }
        r = vase_model_register(e->client,
                                &(struct vase_geometry){
                                    .name = s->name,
                                    .layers = s->layers,
                                    .q_heads = s->q_heads,
                                    .kv_heads = s->kv_heads,
                                    .head_dim = s->head_dim,
                                    .dtype = s->dtype,
                                    .block_tokens = s->block_tokens,
                                },
                                &e->model);
        if (r < 0) {
            fprintf(stderr, "loadgen: registering model %s failed: %s (%s)\n", s->name,
                    vase_strerror(r), vase_last_error(e->client));
            return r;
        }
        e->tpp = vase_model_tokens_per_page(e->model);
        e->page_bytes = vase_model_page_bytes(e->model);
    }
    return 0;
}

/* Waits up to 10 s for the arena to hold no sequence and no page (closes are handled by the
 * daemon's main loop in order, so this is quick). 0, -EBUSY if it does not empty, -errno. */
static int check_empty(struct mode_run *m) {
    double deadline = now_seconds() + 10;
    int r;

    for (;;) {
        Vase__StatusReply *st;

        r = vase_admin_status(m->admin, &st);
        if (r < 0)
            return r;
        bool empty = st->seqs == 0 && st->opens_waiting == 0 && st->n_arenas > 0 &&
                     st->arenas[0]->bytes_pages == 0 &&
                     st->arenas[0]->bytes_free == st->arenas[0]->bytes_total;
        if (!empty && now_seconds() > deadline)
            fprintf(stderr,
                    "loadgen: %s: the arena is not empty after the run: %u sequences, %u opens "
                    "waiting, %" PRIu64 " bytes in pages, %" PRIu64 " of %" PRIu64 " free\n",
                    m->name, st->seqs, st->opens_waiting,
                    st->n_arenas ? st->arenas[0]->bytes_pages : 0,
                    st->n_arenas ? st->arenas[0]->bytes_free : 0,
                    st->n_arenas ? st->arenas[0]->bytes_total : 0);
        protobuf_c_message_free_unpacked(&st->base, NULL);
        if (empty)
            return 0;
        if (now_seconds() > deadline)
            return -EBUSY;
        sleep_until(now_seconds() + 0.05);
    }
}

/* Starts a thread per arrival at its time, until the schedule or --duration ends. */
static void dispatch(struct mode_run *m, struct job *jobs, uint64_t *ret_tokens) {
    pthread_attr_t attr;

    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    for (size_t i = 0; i < m->n && !stop_requested; i++) {
        struct job *j = &jobs[i];

        sleep_until(m->start + m->recs[i].a->t);
        if (stop_requested)
            break;
        *j = (struct job){.run = m, .rec = &m->recs[i]};
        if (atomic_load(&m->g.inflight) >= (int)arg_max_inflight) {
            m->recs[i].outcome = OUT_GENERATOR;
            continue;
        }
        atomic_fetch_add(&m->g.inflight, 1);
        int r = pthread_create(&j->thread, &attr, serve, j);
        if (r != 0) {
            atomic_fetch_sub(&m->g.inflight, 1);
            m->recs[i].outcome = OUT_GENERATOR;
            m->recs[i].err = r;
            continue;
        }
        j->started = true;
    }
    pthread_attr_destroy(&attr);
    sleep_until(m->start + arg_duration);
    *ret_tokens = atomic_load(&m->g.tokens);
}

/* Runs one mode; the records, samples and checks stay in m. 0, or -errno when the run could not
 * be made at all (a connection, memory, threads). */
static int run_mode(struct mode_run *m, const struct arrival *sched, size_t n,
                    uint64_t *ret_window_tokens) {
    struct job *jobs;
    pthread_t sampler_thread;
    int r;

    m->recs = calloc(n ? n : 1, sizeof(*m->recs));
    jobs = calloc(n ? n : 1, sizeof(*jobs));
    if (!m->recs || !jobs) {
        free(jobs);
        return -ENOMEM;
    }
    m->n = n;
    for (size_t i = 0; i < n; i++)
        m->recs[i] = (struct seq_rec){.a = &sched[i]};
    r = vase_admin_new(&(struct vase_admin_options){.runtime_dir = arg_runtime_dir}, &m->admin);
    if (r >= 0)
        r = vase_admin_connect(m->admin);
    if (r < 0) {
        fprintf(stderr, "loadgen: cannot reach vased's control socket: %s\n", vase_strerror(r));
        goto out;
    }
    r = connect_engines(m);
    if (r < 0)
        goto out;

    m->start = now_seconds();
    atomic_store(&m->sampling, true);
    r = -pthread_create(&sampler_thread, NULL, sampler, m);
    if (r < 0) {
        fprintf(stderr, "loadgen: cannot start the sampler thread: %s\n", strerror(-r));
        goto out;
    }
    dispatch(m, jobs, ret_window_tokens);
    for (size_t i = 0; i < n; i++)
        if (jobs[i].started)
            pthread_join(jobs[i].thread, NULL);
    /* A few samples of the emptied arena close the series. */
    sleep_until(now_seconds() + 3 * arg_sample_ms * 1e-3);
    atomic_store(&m->sampling, false);
    pthread_join(sampler_thread, NULL);
    disconnect_engines(m);
    r = check_empty(m);
    m->empty = r == 0;
    if (r == -EBUSY)
        r = 0;
    else if (r < 0)
        fprintf(stderr, "loadgen: %s: status from vased failed: %s\n", m->name, vase_strerror(r));
out:
    disconnect_engines(m);
    m->admin = vase_admin_free(m->admin);
    free(jobs);
    return r;
}

/* ---- the summary --------------------------------------------------------------------------- */

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

/* Counts one sequence's record into s; its admission wait goes to waits and its mean budget
 * fraction to fracs (each NULL when it could not be allocated). */
static void count_rec(const struct seq_rec *r, struct summary *s, double *waits, double *fracs,
                      size_t *n_fracs) {
    switch (r->outcome) {
    case OUT_ADMITTED:
        s->admitted++;
        if (waits)
            waits[s->admitted - 1] = (r->admitted_s - r->open_s) * 1e3;
        s->failed += r->failed;
        s->unfinished += r->tokens != r->a->length;
        s->tokens += r->tokens;
        if (r->closed_s > s->last_close)
            s->last_close = r->closed_s;
        if (fracs && r->tokens > 0)
            fracs[(*n_fracs)++] = r->budget_mean / r->budget;
        if ((double)r->budget_min / r->budget < s->frac_lowest)
            s->frac_lowest = (double)r->budget_min / r->budget;
        break;
    case OUT_ENOSPC:
        s->enospc++;
        s->roomy += r->roomy;
        s->fit_free += r->fit_free;
        break;
    case OUT_REFUSED:
        s->refused++;
        break;
    case OUT_GENERATOR:
        s->generator++;
        break;
    case OUT_NONE:
        break;
    }
}

/* The first arrival finds the arena empty, so some sequence is always admitted; a refusal other
 * than ENOSPC (a quota, an invalid configuration) is a failure of the run. */
static bool consistent(const struct summary *s) {
    return s->admitted + s->enospc + s->refused + s->generator == s->arrived &&
           (s->admitted > 0 || s->arrived == 0) && s->refused == 0 && s->failed == 0 &&
           (stop_requested || s->unfinished == 0);
}

/* The quantiles of the admission waits and of the budget fractions (NAN where none). */
static void summarize_quantiles(struct summary *s, double *waits, double *fracs, size_t n_fracs) {
    s->wait_max = waits && s->admitted ? quantile(waits, s->admitted, 1.0) : NAN;
    s->wait_p50 = waits ? quantile(waits, s->admitted, 0.5) : NAN;
    s->wait_p99 = waits ? quantile(waits, s->admitted, 0.99) : NAN;
    s->frac_mean = 0;
    for (size_t i = 0; i < n_fracs; i++)
        s->frac_mean += fracs[i] / (double)n_fracs;
    s->frac_p10 = fracs ? quantile(fracs, n_fracs, 0.1) : NAN;
    s->frac_min = fracs && n_fracs ? quantile(fracs, n_fracs, 0) : NAN;
}

/* What the sampler saw: the arena's occupancy while arrivals came, the most sequences running
 * and shrunk at once, and the daemon's budget changes over the run. */
static void summarize_samples(const struct mode_run *m, struct summary *s) {
    size_t n_window = 0;

    for (size_t i = 0; i < m->n_samples; i++) {
        const struct sample *x = &m->samples[i];
        double occ = x->bytes_total ? (double)x->bytes_pages / (double)x->bytes_total : 0;

        if (x->running > s->running_max)
            s->running_max = x->running;
        if (x->seqs_shrunk > s->shrunk_max)
            s->shrunk_max = x->seqs_shrunk;
        if (x->t > arg_duration)
            continue;
        s->occupancy_mean += occ;
        n_window++;
        if (occ > s->occupancy_max)
            s->occupancy_max = occ;
    }
    if (n_window)
        s->occupancy_mean /= (double)n_window;
    if (m->n_samples) {
        s->shrinks = m->samples[m->n_samples - 1].shrinks - m->samples[0].shrinks;
        s->grows = m->samples[m->n_samples - 1].grows - m->samples[0].grows;
    }
}

static void summarize(struct mode_run *m, uint64_t window_tokens, struct summary *ret) {
    struct summary s = {.arrived = m->n, .frac_lowest = 1};
    double *waits = calloc(m->n + 1, sizeof(double)), *fracs = calloc(m->n + 1, sizeof(double));
    size_t n_fracs = 0;

    for (size_t i = 0; i < m->n; i++)
        count_rec(&m->recs[i], &s, waits, fracs, &n_fracs);
    s.consistent = consistent(&s);
    summarize_quantiles(&s, waits, fracs, n_fracs);
    s.window_tps = (double)window_tokens / arg_duration;
    s.total_tps = s.last_close > 0 ? (double)s.tokens / s.last_close : 0;
    summarize_samples(m, &s);
    free(waits);
    free(fracs);
    *ret = s;
}

static FILE *open_out(const char *kind, const char *mode) {
    char path[4096];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s%s%s.csv", arg_out, kind, mode ? "_" : "", mode ? mode : "");
    f = fopen(path, "we");
    if (!f)
        fprintf(stderr, "loadgen: cannot write %s: %s\n", path, strerror(errno));
    return f;
}

static int write_csvs(const struct mode_run *m) {
    FILE *f = open_out("occupancy", m->name);
    int r = 0;

    if (!f)
        return -errno;
    fprintf(f, "t,bytes_total,bytes_free,bytes_pages,bytes_reclaiming,seqs,opens_waiting,"
               "seqs_shrunk,budget_shrinks,budget_grows,tokens,running,waiting,budget_frac\n");
    for (size_t i = 0; i < m->n_samples; i++) {
        const struct sample *x = &m->samples[i];

        fprintf(f,
                "%.3f,%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%u,%u,%u,%" PRIu64 ",%" PRIu64
                ",%" PRIu64 ",%d,%d,%.4f\n",
                x->t, x->bytes_total, x->bytes_free, x->bytes_pages, x->bytes_reclaiming, x->seqs,
                x->opens_waiting, x->seqs_shrunk, x->shrinks, x->grows, x->tokens, x->running,
                x->waiting, x->budget_frac);
    }
    if (fclose(f) != 0)
        r = -errno;
    f = open_out("seqs", m->name);
    if (!f)
        return -errno;
    fprintf(f, "arrival_s,engine,burst,prompt,length,outcome,errno,failed,roomy,fit_free,seq_id,"
               "budget,min_budget,budget_mean,budget_min,wait_ms,closed_s,tokens,evictions,"
               "budget_changes\n");
    for (size_t i = 0; i < m->n; i++) {
        const struct seq_rec *x = &m->recs[i];
        bool opened =
            x->outcome == OUT_ADMITTED || x->outcome == OUT_ENOSPC || x->outcome == OUT_REFUSED;

        fprintf(f,
                "%.3f,%s,%d,%u,%u,%s,%d,%d,%d,%d,%u,%u,%u,%.1f,%u,%.1f,%.3f,%" PRIu64 ",%" PRIu64
                ",%" PRIu64 "\n",
                x->a->t, models[x->a->engine].name, x->a->burst, x->a->prompt, x->a->length,
                outcome_names[x->outcome], x->err, x->failed, x->roomy, x->fit_free, x->seq_id,
                x->budget, x->min_budget, x->budget_mean, x->budget_min,
                opened ? (x->admitted_s - x->open_s) * 1e3 : 0.0, x->closed_s, x->tokens,
                x->evictions, x->budget_changes);
    }
    if (fclose(f) != 0 && r == 0)
        r = -errno;
    return r;
}

/* One row of the table: a label and a printf format applied to each mode's value. */
#define ROW(label, fmt, ...)                                                                       \
    do {                                                                                           \
        fprintf(f, "| %s |", label);                                                               \
        for (size_t i_ = 0; i_ < n; i_++) {                                                        \
            const struct summary *s = &sums[i_];                                                   \
            (void)s;                                                                               \
            fprintf(f, " " fmt " |", __VA_ARGS__);                                                 \
        }                                                                                          \
        fprintf(f, "\n");                                                                          \
    } while (0)

/* A fraction as %g prints it, in a static buffer (one caller at a time). */
static const char *fmt_frac(double x) {
    static char buf[32];

    snprintf(buf, sizeof(buf), "%g", x);
    return buf;
}

static void print_table(FILE *f, struct mode_run *runs, const struct summary *sums, size_t n) {
    fprintf(f, "| %u arrivals in %.0f s, seed %.0f |", (unsigned)sums[0].arrived, arg_duration,
            arg_seed);
    for (size_t i = 0; i < n; i++)
        fprintf(f, " %s |", runs[i].name);
    fprintf(f, "\n|---|");
    for (size_t i = 0; i < n; i++)
        fprintf(f, "---:|");
    fprintf(f, "\n");
    ROW("min_budget / budget", "%s", runs[i_].min_frac > 0 ? fmt_frac(runs[i_].min_frac) : "-");
    ROW("admitted", "%zu (%.0f%%)", s->admitted,
        s->arrived ? 100.0 * (double)s->admitted / (double)s->arrived : 0.0);
    if (runs[0].min_frac == 0 && sums[0].admitted > 0)
        ROW("admitted / static's", "%.2fx", (double)s->admitted / (double)sums[0].admitted);
    ROW("refused: no room within the admission wait (ENOSPC)", "%zu", s->enospc);
    ROW("... of which room could have been made for (see below)", "%zu", s->roomy);
    ROW("... of which the free granules alone would have held (see below)", "%zu", s->fit_free);
    ROW("refused: other errors", "%zu", s->refused);
    ROW("admitted, then a call on the sequence failed", "%zu", s->failed);
    ROW("not opened (generator's thread limit)", "%zu", s->generator);
    ROW("admission wait of admitted opens, p50 / p99 / max (ms)", "%.0f / %.0f / %.0f", s->wait_p50,
        s->wait_p99, s->wait_max);
    ROW("decoded tokens/s while arrivals came", "%.0f", s->window_tps);
    ROW("decoded tokens, all / per second until the last close", "%" PRIu64 " / %.0f", s->tokens,
        s->total_tps);
    ROW("arena in pages of sequences, mean / max while arrivals came", "%.0f%% / %.0f%%",
        100 * s->occupancy_mean, 100 * s->occupancy_max);
    ROW("sequences running at once, max (sampled)", "%d", s->running_max);
    ROW("budget lowered / raised (daemon's counts)", "%" PRIu64 " / %" PRIu64, s->shrinks,
        s->grows);
    ROW("sequences below their budget at once, max (sampled)", "%u", s->shrunk_max);
    ROW("budget run with / opened with, per sequence: mean, p10, min", "%.2f, %.2f, %.2f",
        s->frac_mean, s->frac_p10, s->frac_min);
    ROW("lowest budget any sequence ran with / its opened budget", "%.2f", s->frac_lowest);
    fprintf(f,
            "\nRoom could have been made for a refused open when, at its refusal, the arena's "
            "free granules (the latest sample, up to %g ms old) and the KV pages that the "
            "sequences of its model which had started evicting held above their minimums "
            "added up to its KV pages; the free granules alone would have held it when they "
            "alone did. Budgets are per decoded token of each sequence.\n",
            arg_sample_ms);
}

static int write_table(struct mode_run *runs, const struct summary *sums, size_t n) {
    char path[4096];
    FILE *f;

    print_table(stdout, runs, sums, n);
    snprintf(path, sizeof(path), "%s/table.md", arg_out);
    f = fopen(path, "we");
    if (!f) {
        fprintf(stderr, "loadgen: cannot write %s: %s\n", path, strerror(errno));
        return -errno;
    }
    print_table(f, runs, sums, n);
    return fclose(f) != 0 ? -errno : 0;
}

/* ---- command line -------------------------------------------------------------------------- */

/* Every numeric option, checked against its bounds; integers where integral is true. */
static const struct num_option {
    const char *name;
    double *value;
    double min, max;
    bool integral;
    const char *help;
} num_options[] = {
    {"duration", &arg_duration, 0.1, 3600, false, "seconds of arrivals per mode (30)"},
    {"calm-rate", &arg_calm_rate, 0, 10000, false, "arrivals per second while calm (3)"},
    {"burst-rate", &arg_burst_rate, 0, 10000, false, "arrivals per second in a burst (12)"},
    {"calm-seconds", &arg_calm_seconds, 0.001, 3600, false, "mean length of a calm period (4)"},
    {"burst-seconds", &arg_burst_seconds, 0.001, 3600, false, "mean length of a burst (3)"},
    {"decode-min", &arg_decode_min, 1, 1 << 20, true, "fewest tokens a sequence decodes (1024)"},
    {"decode-max", &arg_decode_max, 1, 1 << 20, true, "most tokens a sequence decodes (3072)"},
    {"step-ms", &arg_step_ms, 0, 1000, false, "simulated time per decoded token (2)"},
    {"admission-wait-ms", &arg_admission_wait_ms, 0, VASE_MAX_ADMISSION_WAIT_MS, true,
     "how long an open waits for room, both modes (2000)"},
    {"max-inflight", &arg_max_inflight, 1, 4096, true,
     "sequences opening or running at once; later arrivals are not opened (512)"},
    {"seed", &arg_seed, 0, 9007199254740992.0, true, "seed of the arrival schedule (1)"},
    {"sample-ms", &arg_sample_ms, 10, 10000, false, "interval of the status samples (100)"},
};
#define N_NUM_OPTIONS (sizeof(num_options) / sizeof(num_options[0]))

enum { OPT_MODES = 0x100, OPT_MIN_FRAC, OPT_OUT, OPT_RUNTIME_DIR, OPT_NUM };

static void help(void) {
    printf("Usage: %s [OPTIONS]\n"
           "Serves the same seeded bursty arrivals on one vased arena once with static budgets\n"
           "and once per --min-frac with elastic ones, and writes CSV files of every run and a\n"
           "Markdown table to --out.\n\n",
           program_invocation_short_name);
    for (size_t i = 0; i < N_NUM_OPTIONS; i++)
        printf("      --%s=N%*s%s\n", num_options[i].name, (int)(20 - strlen(num_options[i].name)),
               "", num_options[i].help);
    printf(
        "      --min-frac=F[,F...]     elastic: min_budget as a fraction of the budget,\n"
        "                              rounded down to a multiple of the window, at least\n"
        "                              two windows; one elastic run per fraction, up to 3 (0.5)\n"
        "      --modes=LIST            static, elastic or both, in that order (static,elastic)\n"
        "      --out=DIR               where the CSV files and table.md go (.)\n"
        "      --runtime-dir=DIR       vased's runtime directory ($VASE_RUNTIME_DIR, ...)\n"
        "  -h --help                   show this help\n");
}

static int parse_num(const struct num_option *o, const char *s) {
    char *end;
    double v;

    errno = 0;
    v = strtod(s, &end);
    if (end == s || *end != '\0' || errno != 0 || !isfinite(v) || v < o->min || v > o->max ||
        (o->integral && v != floor(v))) {
        fprintf(stderr, "%s: invalid --%s '%s': want %s in [%g, %g]\n",
                program_invocation_short_name, o->name, s, o->integral ? "an integer" : "a number",
                o->min, o->max);
        return -EINVAL;
    }
    *o->value = v;
    return 0;
}

/* A comma-separated list of fractions in (0, 1]. */
static int parse_fracs(const char *s) {
    static const struct num_option frac = {"min-frac", NULL, 0.001, 1, false, NULL};
    char buf[128], *save = NULL;
    size_t n = 0;

    if (strlen(s) >= sizeof(buf))
        goto bad;
    strcpy(buf, s);
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        struct num_option o = frac;

        if (n == MAX_MIN_FRACS)
            goto bad;
        o.value = &arg_min_fracs[n++];
        if (parse_num(&o, tok) < 0)
            return -EINVAL;
    }
    if (n == 0)
        goto bad;
    arg_n_min_fracs = n;
    return 0;
bad:
    fprintf(stderr,
            "%s: invalid --min-frac '%s': want 1 to %d fractions in (0, 1], comma-separated\n",
            program_invocation_short_name, s, MAX_MIN_FRACS);
    return -EINVAL;
}

/* Returns < 0 on a usage error, 0 to exit successfully (help), > 0 to go on. */
static int parse_argv(int argc, char **argv) {
    struct option options[N_NUM_OPTIONS + 6] = {
        {"modes", required_argument, NULL, OPT_MODES},
        {"min-frac", required_argument, NULL, OPT_MIN_FRAC},
        {"out", required_argument, NULL, OPT_OUT},
        {"runtime-dir", required_argument, NULL, OPT_RUNTIME_DIR},
        {"help", no_argument, NULL, 'h'},
    };
    int c, idx;

    for (size_t i = 0; i < N_NUM_OPTIONS; i++)
        options[5 + i] =
            (struct option){num_options[i].name, required_argument, NULL, OPT_NUM + (int)i};
    while ((c = getopt_long(argc, argv, "h", options, &idx)) >= 0) {
        switch (c) {
        case 'h':
            help();
            return 0;
        case OPT_MODES:
            if (strcmp(optarg, "static") && strcmp(optarg, "elastic") &&
                strcmp(optarg, "static,elastic")) {
                fprintf(stderr, "%s: invalid --modes '%s'\n", program_invocation_short_name,
                        optarg);
                return -EINVAL;
            }
            arg_modes = optarg;
            break;
        case OPT_MIN_FRAC:
            if (parse_fracs(optarg) < 0)
                return -EINVAL;
            break;
        case OPT_OUT:
            arg_out = optarg;
            break;
        case OPT_RUNTIME_DIR:
            arg_runtime_dir = optarg;
            break;
        default:
            if (c >= OPT_NUM && c < OPT_NUM + (int)N_NUM_OPTIONS) {
                if (parse_num(&num_options[c - OPT_NUM], optarg) < 0)
                    return -EINVAL;
                break;
            }
            return -EINVAL;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", program_invocation_short_name,
                argv[optind]);
        return -EINVAL;
    }
    if (arg_decode_min > arg_decode_max) {
        fprintf(stderr, "%s: --decode-min is above --decode-max\n", program_invocation_short_name);
        return -EINVAL;
    }
    for (size_t i = 0; i < N_MODELS; i++) {
        struct vase_params p = vase_params_default(models[i].budget);

        p.window = models[i].window;
        if (vase_params_check(&p, models[i].policy) < 0) {
            fprintf(stderr, "%s: model %s: budget %u and window %u are not valid\n",
                    program_invocation_short_name, models[i].name, models[i].budget,
                    models[i].window);
            return -EINVAL;
        }
        for (size_t k = 0; k < arg_n_min_fracs; k++)
            if (min_budget_of(&models[i], arg_min_fracs[k]) > models[i].budget) {
                fprintf(stderr,
                        "%s: --min-frac=%g gives model %s (window %u) a min_budget above "
                        "its budget %u\n",
                        program_invocation_short_name, arg_min_fracs[k], models[i].name,
                        models[i].window, models[i].budget);
                return -EINVAL;
            }
    }
    return 1;
}

static void on_signal(int sig) {
    (void)sig;
    stop_requested = 1;
}

int main(int argc, char **argv) {
    struct sigaction sa = {.sa_handler = on_signal};
    struct mode_run runs[1 + MAX_MIN_FRACS] = {{.name = "static"}};
    struct summary sums[1 + MAX_MIN_FRACS];
    struct arrival *sched;
    size_t n_sched, n_runs = 0;
    bool ok = true;
    int r;

    r = parse_argv(argc, argv);
    if (r <= 0)
        return r < 0 ? 2 : 0;
    if (strcmp(arg_modes, "elastic") != 0)
        n_runs++;
    for (size_t k = 0; k < arg_n_min_fracs && strcmp(arg_modes, "static") != 0; k++) {
        struct mode_run *m = &runs[n_runs++];

        *m = (struct mode_run){.min_frac = arg_min_fracs[k]};
        if (arg_n_min_fracs == 1)
            snprintf(m->name, sizeof(m->name), "elastic");
        else
            snprintf(m->name, sizeof(m->name), "elastic-%g", arg_min_fracs[k]);
    }
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    if (make_schedule(&sched, &n_sched) < 0) {
        fprintf(stderr, "loadgen: out of memory\n");
        return 1;
    }
    printf("loadgen: %zu arrivals in %.1f s (seed %.0f); modes %s\n", n_sched, arg_duration,
           arg_seed, arg_modes);
    for (size_t k = 0; k < n_runs; k++) {
        struct mode_run *m = &runs[k];
        struct summary *sum = &sums[k];
        uint64_t window_tokens = 0;

        r = stop_requested ? -EINTR : run_mode(m, sched, n_sched, &window_tokens);
        if (r < 0) {
            ok = false;
            n_runs = k;
            break;
        }
        summarize(m, window_tokens, sum);
        if (write_csvs(m) < 0)
            ok = false;
        printf("loadgen: %s: %zu arrived = %zu admitted + %zu refused (ENOSPC) + %zu refused "
               "(other) + %zu not opened; %zu failed while decoding or closing; arena %s "
               "afterwards\n",
               m->name, sum->arrived, sum->admitted, sum->enospc, sum->refused, sum->generator,
               sum->failed, m->empty ? "empty" : "NOT empty");
        if (!sum->consistent || !m->empty || m->sampler_err < 0) {
            fprintf(stderr, "loadgen: %s: the run is not consistent (see above)\n", m->name);
            ok = false;
        }
    }
    if (n_runs > 0 && write_table(runs, sums, n_runs) < 0)
        ok = false;
    for (size_t k = 0; k < 1 + MAX_MIN_FRACS; k++) {
        free(runs[k].recs);
        free(runs[k].samples);
    }
    free(sched);
    return ok && !stop_requested ? 0 : 1;
}
