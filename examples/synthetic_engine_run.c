/* SPDX-License-Identifier: MIT */

/*
 * The run of synthetic_engine: each start-up stage its own function with its own unwind (the
 * configuration, the buffers, the connection and model, the sequences, the prefill), then the
 * decode loop, where every step of every sequence makes room when the sequence is full, writes
 * and appends a token and applies a plan that became ready, and the step's forward pass is
 * simulated; then the report of what the eviction cycle cost the engine.
 */

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "synthetic_engine.h"

static double now_seconds(void) {
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
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
int fail(const struct engine *e, const char *what, const struct seq_state *ss, int r) {
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

int run(void) {
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
