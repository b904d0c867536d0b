/* SPDX-License-Identifier: MIT */

/*
 * Integration tests of the eviction cycle against a real vased through the real libvase: the
 * sync and async modes, every policy of ALGORITHM.md through the daemon, h2o with pushed
 * statistics, long prompts handing pages back, a protected prompt kept whole by every kind of
 * policy and refused where it does not fit, NaN in K, V or Q refused without harm, two
 * engine processes of different geometry evicting at once, and an engine killed with SIGKILL
 * (its pages free again at once, the other engine unaffected).
 *
 * Engines write token-identifying K and V rows (harness.h), so after every plan the test reads
 * the whole cache back and checks, per layer and KV head, that the kept slots are distinct
 * candidates of the moment of the request and the recent tokens follow in order.
 */

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "integration/harness.h"

#define BUDGET 128
#define WINDOW 32
#define PROMPT 40
/* Decode steps from the prompt to the first eviction (at len BUDGET + WINDOW); then one every
 * WINDOW steps. */
#define STEPS_TO_FIRST (BUDGET + WINDOW - PROMPT)

/* ---- a checked engine ---- */

struct engine;
/* Called before the append that triggers an eviction (h2o pushes its statistics here). */
typedef int (*engine_hook)(struct engine *e);
/* Extra checks of an applied plan against the snapshot of the request. */
typedef int (*engine_check)(struct engine *e, const int32_t *after, uint32_t len_after);

struct engine {
    struct vase_seq *s;
    struct vase_geometry g;
    uint32_t salt;
    uint32_t budget, window, prompt, keep;
    enum vase_policy policy;
    enum vase_mode mode;
    uint32_t lag; /* async: tokens appended after a request before vase_seq_wait() */
    engine_hook before_request;
    engine_check check;
    void *arg;

    uint32_t rounds;        /* plans applied and checked */
    uint32_t committed_len; /* len after the last plan, as committed */
    /* The request in flight. */
    bool pending;
    int32_t *before; /* snapshot of every slot before the triggering token */
    uint32_t len_before, n, first_new, since;
};

static void engine_init(struct engine *e, struct vase_seq *s, const struct vase_geometry *g,
                        const struct vase_seq_config *cfg, uint32_t salt) {
    *e = (struct engine){
        .s = s,
        .g = *g,
        .salt = salt,
        .budget = cfg->params.budget,
        .window = cfg->params.window,
        .prompt = cfg->prompt_len,
        .keep = cfg->params.budget - cfg->params.window,
        .policy = cfg->policy,
        .mode = cfg->mode,
        .lag = cfg->params.window / 4,
    };
}

static void engine_done(struct engine *e) {
    free(e->before);
    e->before = NULL;
}

/* Checks the cache right after a plan was applied. */
static int engine_verify(struct engine *e) {
    int32_t *after;
    uint32_t len_after;
    int r = harness_snapshot(e->s, &e->g, e->salt, &after, &len_after);
    if (r < 0)
        return r;
    uint32_t want_len = e->keep + e->window + e->since;
    if (len_after != want_len) {
        fprintf(stderr, "after round %u: len %u, want %u\n", e->rounds, len_after, want_len);
        r = -EPROTO;
    }
    if (r == 0)
        r = harness_check_plan(e->before, e->len_before, after, len_after,
                               e->g.layers * e->g.kv_heads, e->keep, e->n, e->first_new);
    if (r == 0 && e->check)
        r = e->check(e, after, len_after);
    free(after);
    free(e->before);
    e->before = NULL;
    e->pending = false;
    if (r < 0)
        return r;
    e->rounds++;
    e->committed_len = len_after;
    if (vase_seq_rounds(e->s) != e->rounds) {
        fprintf(stderr, "vase_seq_rounds %u, want %u\n", vase_seq_rounds(e->s), e->rounds);
        return -EPROTO;
    }
    return 0;
}

/*
 * Appends the prompt (in one call) if nothing was appended yet, then decodes steps tokens one
 * by one. Before each token that fires the trigger it snapshots the cache; sync appends must
 * apply the plan at once, async ones lag tokens later at the latest (vase_seq_wait()). Every
 * plan is verified. No cmocka here: engine child processes use it too. 0 or -errno (printed).
 */
static int engine_decode(struct engine *e, uint32_t steps) {
    if (vase_seq_position(e->s) == 0 && e->prompt > 0) {
        int r = harness_append_tokens(e->s, &e->g, e->salt, e->prompt, true);
        if (r != 0) {
            fprintf(stderr, "prompt append: %d (%s)\n", r, vase_strerror(r));
            return r < 0 ? r : -EPROTO;
        }
    }
    for (uint32_t i = 0; i < steps; i++) {
        uint32_t len = vase_seq_len(e->s);
        uint64_t pos = vase_seq_position(e->s);
        bool due = pos >= e->prompt && len + 1 > e->budget && (len + 1) % e->window == 0;
        int r;
        if (due) {
            if (e->pending) {
                fprintf(stderr, "a trigger at position %lu while a plan is pending\n",
                        (unsigned long)pos);
                return -EBUSY;
            }
            if ((r = harness_snapshot(e->s, &e->g, e->salt, &e->before, &e->len_before)) < 0)
                return r;
            e->n = len + 1 - e->window;
            e->first_new = (uint32_t)pos;
            e->since = 0;
            e->pending = true;
            if (e->before_request && (r = e->before_request(e)) < 0)
                return r;
        } else if (e->pending) {
            e->since++;
        }
        r = harness_append_tokens(e->s, &e->g, e->salt, 1, false);
        if (r < 0) {
            fprintf(stderr, "append at position %lu: %s\n", (unsigned long)pos, vase_strerror(r));
            return r;
        }
        if (r > 1 || (r == 1 && !e->pending) || (e->mode == VASE_MODE_SYNC && due && r != 1)) {
            fprintf(stderr, "append at position %lu (len %u, %s) returned %d\n", (unsigned long)pos,
                    len, due ? "trigger" : "no trigger", r);
            return -EPROTO;
        }
        if (e->pending && r == 0 && e->since >= e->lag) {
            r = vase_seq_wait(e->s);
            if (r != 1) {
                fprintf(stderr, "vase_seq_wait: %d (%s), want 1\n", r, vase_strerror(r));
                return r < 0 ? r : -EPROTO;
            }
        }
        if (e->pending && r == 1 && (r = engine_verify(e)) < 0)
            return r;
    }
    return 0;
}

/* ---- fixtures ---- */

struct fixture {
    struct harness_fixture h;
    struct engine e[HARNESS_MAX_CLIENTS];
};

static int setup(void **state) {
    return harness_fixture_setup(state, sizeof(struct fixture), NULL);
}

static int teardown(void **state) {
    struct fixture *f = *state;
    for (size_t i = 0; f && i < HARNESS_MAX_CLIENTS; i++)
        engine_done(&f->e[i]);
    return harness_fixture_teardown(state);
}

static struct harness_status status_of(const struct harness_daemon *d) {
    struct harness_status st;
    assert_int_equal(harness_status(d, &st), 0);
    return st;
}

/* Connects client i, registers g and opens a sequence with cfg; the engine is f->e[i]. */
static struct engine *open_engine(struct fixture *f, size_t i, const struct vase_geometry *g,
                                  const struct vase_seq_config *cfg) {
    struct vase_model *m;
    char name[32];
    snprintf(name, sizeof(name), "engine-%zu", i);
    if (!f->h.c[i])
        assert_int_equal(harness_engine_open(&f->h.d, name, g, &f->h.c[i], &m), 0);
    else
        assert_int_equal(vase_model_register(f->h.c[i], g, &m), 0);
    struct vase_seq *s;
    int r = vase_seq_open(f->h.c[i], m, cfg, &s);
    if (r < 0)
        fail_msg("vase_seq_open: %s", vase_strerror(r));
    engine_init(&f->e[i], s, g, cfg, (uint32_t)i);
    return &f->e[i];
}

static void assert_decode(struct engine *e, uint32_t steps) {
    int r = engine_decode(e, steps);
    if (r < 0)
        fail_msg("decode failed: %d (%s)", r, vase_strerror(r));
}

/* The daemon's view of an idle sequence agrees with the library's. GetSeq goes over another
 * connection than the engine's, which nothing orders with the engine's last commit (libvase
 * does not wait for its reply): vase_seq_flush() first. */
static void assert_seq_info(const struct harness_daemon *d, const struct engine *e) {
    Vase__Envelope *reply = NULL;
    assert_false(e->pending);
    int r = vase_seq_flush(e->s);
    if (r < 0)
        fail_msg("vase_seq_flush: %s", vase_strerror(r));
    r = harness_get_seq(d, vase_seq_id(e->s), &reply);
    if (r < 0)
        fail_msg("GetSeq: %s", vase_strerror(r));
    assert_int_equal(reply->body_case, VASE__ENVELOPE__BODY_SEQ_INFO);
    const Vase__SeqInfo *si = reply->seq_info;
    assert_int_equal(si->seq_id, vase_seq_id(e->s));
    assert_int_equal(si->rounds, e->rounds);
    assert_int_equal(si->budget, e->budget);
    assert_int_equal(si->window, e->window);
    assert_int_equal(si->capacity, vase_seq_capacity(e->s));
    assert_string_equal(si->policy, vase_policy_to_string(e->policy));
    assert_string_equal(si->state, "idle");
    assert_int_equal(si->mode,
                     e->mode == VASE_MODE_SYNC ? VASE__MODE__MODE_SYNC : VASE__MODE__MODE_ASYNC);
    if (e->rounds)
        assert_int_equal(si->len, e->committed_len);
    vase__envelope__free_unpacked(reply, NULL);
}

/* Each of lists lists of a (len_a slots) starts with the list of b (len_b slots). */
static void assert_prefix_equal(const int32_t *b, uint32_t len_b, const int32_t *a, uint32_t len_a,
                                uint32_t lists) {
    assert_true(len_b <= len_a);
    for (uint32_t li = 0; li < lists; li++)
        assert_memory_equal(a + (size_t)li * len_a, b + (size_t)li * len_b, sizeof(*b) * len_b);
}

/* ---- the two modes ---- */

/* Sync: each triggering append applies its plan before it returns; len is back to the budget;
 * the rounds are counted on both sides. */
static void test_sync_cycle(void **state) {
    struct fixture *f = *state;
    struct vase_geometry g = harness_geometry();
    struct vase_seq_config cfg =
        harness_seq_config(VASE_POLICY_VASE_ATTNV, BUDGET, WINDOW, PROMPT, VASE_MODE_SYNC);
    struct engine *e = open_engine(f, 0, &g, &cfg);

    assert_decode(e, STEPS_TO_FIRST - 1);
    assert_int_equal(e->rounds, 0);
    assert_int_equal(vase_seq_len(e->s), BUDGET + WINDOW - 1);
    assert_decode(e, 1);
    assert_int_equal(e->rounds, 1);
    assert_int_equal(vase_seq_len(e->s), BUDGET);
    assert_decode(e, 2 * WINDOW);
    assert_int_equal(e->rounds, 3);
    assert_int_equal(vase_seq_len(e->s), BUDGET);
    assert_int_equal(vase_seq_position(e->s), PROMPT + STEPS_TO_FIRST + 2 * WINDOW);
    assert_seq_info(&f->h.d, e);

    struct vase_seq_stats st;
    vase_seq_get_stats(e->s, &st);
    assert_int_equal(st.evictions, 3);
    assert_int_equal(st.stalls, 0);
    assert_true(st.last_plan_seconds > 0);
    assert_int_equal(status_of(&f->h.d).evictions_total, 3);
}

/* Async: the triggering append returns at once; the engine appends lag more tokens, then
 * waits; len is K + the tokens after the candidates. */
static void test_async_cycle(void **state) {
    struct fixture *f = *state;
    struct vase_geometry g = harness_geometry();
    struct vase_seq_config cfg =
        harness_seq_config(VASE_POLICY_VASE_ATTNV, BUDGET, WINDOW, PROMPT, VASE_MODE_ASYNC);
    struct engine *e = open_engine(f, 0, &g, &cfg);
    e->lag = 8;

    assert_decode(e, STEPS_TO_FIRST);
    assert_true(e->pending || e->rounds == 1);
    assert_decode(e, e->lag);
    assert_int_equal(e->rounds, 1);
    assert_int_equal(vase_seq_len(e->s), BUDGET + e->lag);
    assert_decode(e, 2 * WINDOW);
    assert_int_equal(e->rounds, 3);
    assert_int_equal(vase_seq_len(e->s), BUDGET + e->lag);
    assert_seq_info(&f->h.d, e);
    assert_int_equal(status_of(&f->h.d).evictions_total, 3);
}

/*
 * vase_seq_flush(): what the engine sent without waiting for a reply (an eviction request, stats
 * pushes, a commit) has been handled by the daemon when the call returns, so another connection
 * sees it. The request is accepted (the sequence is planning or its plan is ready), the pushes
 * counted, and, after the plan is applied, the commit shows as one more round on an idle
 * sequence.
 */
static void test_flush(void **state) {
    struct fixture *f = *state;
    struct vase_geometry g = harness_geometry();
    struct vase_seq_config cfg =
        harness_seq_config(VASE_POLICY_H2O, BUDGET, WINDOW, PROMPT, VASE_MODE_ASYNC);
    struct engine *e = open_engine(f, 0, &g, &cfg);
    e->lag = UINT32_MAX;
    /* Nothing sent yet: nothing to wait for. */
    assert_int_equal(vase_seq_flush(e->s), 0);

    assert_decode(e, STEPS_TO_FIRST);
    assert_true(e->pending);
    uint64_t pushed = status_of(&f->h.d).stats_messages_total;
    float values[2 * 8];
    for (size_t i = 0; i < 2 * 8; i++)
        values[i] = (float)i;
    for (uint32_t l = 0; l < g.layers; l++)
        assert_int_equal(vase_seq_push_stats(e->s, l, VASE_STATS_ACC_ADD, values, 8), 0);
    assert_int_equal(vase_seq_flush(e->s), 0);

    assert_int_equal(status_of(&f->h.d).stats_messages_total, pushed + g.layers);
    Vase__Envelope *reply = NULL;
    assert_int_equal(harness_get_seq(&f->h.d, vase_seq_id(e->s), &reply), 0);
    assert_int_equal(reply->body_case, VASE__ENVELOPE__BODY_SEQ_INFO);
    if (strcmp(reply->seq_info->state, "planning") != 0 &&
        strcmp(reply->seq_info->state, "plan-ready") != 0)
        fail_msg("after the flush the sequence is %s, want planning or plan-ready",
                 reply->seq_info->state);
    assert_int_equal(reply->seq_info->rounds, 0);
    vase__envelope__free_unpacked(reply, NULL);

    /* The plan applied, its commit sent but not waited for: the flush waits for it. */
    assert_int_equal(vase_seq_wait(e->s), 1);
    assert_int_equal(engine_verify(e), 0);
    assert_seq_info(&f->h.d, e);
    assert_int_equal(vase_seq_flush(e->s), 0);
}

/* Streaming keeps the sinks and the most recent tokens: checks the cache exactly. */
static int streaming_check(struct engine *e, const int32_t *after, uint32_t len_after) {
    uint64_t pos = vase_seq_position(e->s);
    const uint32_t n_sink = 4;
    for (uint32_t li = 0; li < e->g.layers * e->g.kv_heads; li++)
        for (uint32_t i = 0; i < len_after; i++) {
            int64_t want = i < n_sink ? i : (int64_t)pos - len_after + i;
            if (after[(size_t)li * len_after + i] != want) {
                fprintf(stderr, "streaming: list %u slot %u holds token %d, want %ld\n", li, i,
                        after[(size_t)li * len_after + i], (long)want);
                return -EINVAL;
            }
        }
    return 0;
}

/* Async and the sequence full: the append that fills the block table waits for the pending
 * plan (a stall), applies it and, since that token fires the trigger again, sends the next
 * request. */
static void test_async_full_stalls(void **state) {
    struct fixture *f = *state;
    struct vase_geometry g = harness_geometry();
    struct vase_seq_config cfg =
        harness_seq_config(VASE_POLICY_STREAMING, BUDGET, WINDOW, PROMPT, VASE_MODE_ASYNC);
    struct engine *e = open_engine(f, 0, &g, &cfg);
    uint32_t cap = vase_seq_capacity(e->s);
    assert_int_equal(cap, BUDGET + 2 * WINDOW);
    e->lag = UINT32_MAX;

    assert_decode(e, STEPS_TO_FIRST);
    assert_true(e->pending);
    /* Up to one token short of full, nothing waits (no ring: streaming reads no queries). */
    for (uint32_t len = vase_seq_len(e->s); len < cap - 1; len++)
        assert_int_equal(harness_append_tokens(e->s, &g, 0, 1, false), 0);
    assert_int_equal(vase_seq_len(e->s), cap - 1);
    assert_int_equal(harness_append_tokens(e->s, &g, 0, 1, false), 1);
    struct vase_seq_stats st;
    vase_seq_get_stats(e->s, &st);
    assert_int_equal(st.evictions, 1);
    assert_int_equal(st.stalls, 1);
    assert_int_equal(vase_seq_len(e->s), BUDGET + WINDOW);
    assert_int_equal(vase_seq_wait(e->s), 1);
    assert_int_equal(vase_seq_len(e->s), BUDGET);
    assert_int_equal(vase_seq_rounds(e->s), 2);

    int32_t *after;
    uint32_t len;
    assert_int_equal(harness_snapshot(e->s, &g, 0, &after, &len), 0);
    int r = streaming_check(e, after, len);
    free(after);
    assert_int_equal(r, 0);
    engine_done(e);
}

/* A prompt longer than the budget: no eviction during the prompt; the first eviction hands
 * the pages beyond the steady state back. */
static void test_long_prompt(void **state) {
    struct fixture *f = *state;
    struct vase_geometry g = harness_geometry();
    const uint32_t prompt = 200;
    struct vase_seq_config cfg =
        harness_seq_config(VASE_POLICY_SNAPKV, BUDGET, WINDOW, prompt, VASE_MODE_SYNC);
    struct engine *e = open_engine(f, 0, &g, &cfg);
    /* ceil((200 + 32 + 32) / 64) = 5 KV pages, 1 ring page, a plan page. */
    assert_int_equal(vase_seq_capacity(e->s), 5 * 64);
    assert_int_equal(status_of(&f->h.d).bytes_pages, harness_seq_bytes(5, 1, BUDGET - WINDOW));

    assert_decode(e, 0); /* the prompt: no plan */
    assert_int_equal(vase_seq_len(e->s), prompt);
    assert_int_equal(e->rounds, 0);
    /* The first decode token at len 224 = 7 * 32 fires: N = 192 candidates. */
    assert_decode(e, 224 - prompt);
    assert_int_equal(e->rounds, 1);
    assert_int_equal(vase_seq_len(e->s), BUDGET);
    assert_int_equal(vase_seq_capacity(e->s), 3 * 64);
    assert_int_equal(status_of(&f->h.d).bytes_pages, harness_seq_bytes(3, 1, BUDGET - WINDOW));
    assert_decode(e, WINDOW);
    assert_int_equal(e->rounds, 2);
    assert_seq_info(&f->h.d, e);
}

/* ---- every policy ---- */

/* h2o: the test keeps its own copy of the accumulator (what it pushed, moved as each plan
 * moves the slots) and checks the exact keep order, topk with ties in ascending slot. */
struct h2o_model {
    float *acc; /* [lists][stride] */
    uint32_t stride;
    uint32_t pushes;
};

static int h2o_push(struct engine *e) {
    struct h2o_model *hm = e->arg;
    uint32_t len = vase_seq_len(e->s), hkv = e->g.kv_heads;
    float *values = malloc(sizeof(*values) * hkv * len);
    if (!values)
        return -ENOMEM;
    int r = 0;
    for (uint32_t l = 0; l < e->g.layers && r == 0; l++) {
        for (uint32_t h = 0; h < hkv; h++)
            for (uint32_t j = 0; j < len; j++) {
                /* Integers: sums are exact, so the order is the test's to predict. */
                float v = (float)((j * 37 + h * 11 + l * 5 + hm->pushes * 13) % 97);
                values[h * len + j] = v;
                hm->acc[(size_t)(l * hkv + h) * hm->stride + j] += v;
            }
        r = vase_seq_push_stats(e->s, l, VASE_STATS_ACC_ADD, values, len);
    }
    hm->pushes++;
    free(values);
    return r;
}

static int h2o_check(struct engine *e, const int32_t *after, uint32_t len_after) {
    struct h2o_model *hm = e->arg;
    uint32_t *keep = malloc(sizeof(*keep) * e->keep);
    float *moved = calloc(hm->stride, sizeof(*moved));
    if (!keep || !moved) {
        free(keep);
        free(moved);
        return -ENOMEM;
    }
    int r = 0;
    for (uint32_t li = 0; li < e->g.layers * e->g.kv_heads && r == 0; li++) {
        float *acc = hm->acc + (size_t)li * hm->stride;
        /* topk by selection: the largest not yet taken, the lowest slot among equals. */
        for (uint32_t i = 0; i < e->keep; i++) {
            uint32_t best = UINT32_MAX;
            for (uint32_t j = 0; j < e->n; j++) {
                bool taken = false;
                for (uint32_t k = 0; k < i && !taken; k++)
                    taken = keep[k] == j;
                if (!taken && (best == UINT32_MAX || acc[j] > acc[best]))
                    best = j;
            }
            keep[i] = best;
            int32_t want = e->before[(size_t)li * e->len_before + best];
            if (after[(size_t)li * len_after + i] != want) {
                fprintf(stderr, "h2o: list %u slot %u holds token %d, want %d (acc %g)\n", li, i,
                        after[(size_t)li * len_after + i], want, acc[best]);
                r = -EINVAL;
                break;
            }
        }
        memset(moved, 0, sizeof(*moved) * hm->stride);
        for (uint32_t i = 0; i < e->keep; i++)
            moved[i] = acc[keep[i]];
        for (uint32_t i = e->keep; i < len_after; i++)
            moved[i] = acc[e->n + i - e->keep];
        memcpy(acc, moved, sizeof(*moved) * hm->stride);
    }
    free(keep);
    free(moved);
    return r;
}

/* Two evictions of one policy through the daemon, each plan checked; streaming and h2o
 * exactly. */
static void test_policy(void **state) {
    struct fixture *f = *state;
    enum vase_policy policy = *(const enum vase_policy *)f->h.arg;
    struct vase_geometry g = harness_geometry();
    struct vase_seq_config cfg = harness_seq_config(policy, BUDGET, WINDOW, PROMPT, VASE_MODE_SYNC);
    struct engine *e = open_engine(f, 0, &g, &cfg);
    struct h2o_model hm = {.stride = vase_seq_capacity(e->s)};
    if (policy == VASE_POLICY_H2O) {
        hm.acc = calloc((size_t)g.layers * g.kv_heads * hm.stride, sizeof(float));
        assert_non_null(hm.acc);
        e->before_request = h2o_push;
        e->check = h2o_check;
        e->arg = &hm;
    } else if (policy == VASE_POLICY_STREAMING) {
        e->check = streaming_check;
    }
    int r = engine_decode(e, STEPS_TO_FIRST + WINDOW);
    free(hm.acc);
    if (r < 0)
        fail_msg("%s: %s", vase_policy_to_string(policy), vase_strerror(r));
    assert_int_equal(e->rounds, 2);
    assert_seq_info(&f->h.d, e);
    assert_int_equal(status_of(&f->h.d).evictions_total, 2);
}

/* ---- the protected prompt ---- */

/* After a plan of a sequence with protect_prompt, slots 0 .. prompt - 1 of every layer and KV
 * head hold the prompt's tokens in order: the arena still has their K and V rows there. */
static int prompt_check(struct engine *e, const int32_t *after, uint32_t len_after) {
    for (uint32_t li = 0; li < e->g.layers * e->g.kv_heads; li++)
        for (uint32_t s = 0; s < e->prompt; s++)
            if (after[(size_t)li * len_after + s] != (int32_t)s) {
                fprintf(stderr, "round %u: list %u slot %u holds token %d, not prompt token %u\n",
                        e->rounds, li, s, after[(size_t)li * len_after + s], s);
                return -EINVAL;
            }
    return 0;
}

/* Sampling, value-aware, attention, leverage and recency policies with the prompt protected,
 * through the daemon: four evictions each, every plan checked, the prompt's K and V intact in
 * their slots after each; GetSeq reports the parameter. */
static void test_protect_prompt(void **state) {
    static const enum vase_policy policies[] = {VASE_POLICY_RANDOM, VASE_POLICY_VASE_ATTNV,
                                                VASE_POLICY_SNAPKV, VASE_POLICY_VASE_DKV,
                                                VASE_POLICY_STREAMING};
    struct fixture *f = *state;
    struct vase_geometry g = harness_geometry();
    for (size_t i = 0; i < sizeof(policies) / sizeof(policies[0]); i++) {
        struct vase_seq_config cfg =
            harness_seq_config(policies[i], BUDGET, WINDOW, PROMPT, VASE_MODE_SYNC);
        cfg.params.protect_prompt = 1;
        struct engine *e = open_engine(f, 0, &g, &cfg);
        e->check = prompt_check;
        int r = engine_decode(e, STEPS_TO_FIRST + 3 * WINDOW);
        if (r < 0)
            fail_msg("%s: %s", vase_policy_to_string(policies[i]), vase_strerror(r));
        assert_int_equal(e->rounds, 4);
        assert_int_equal(vase_seq_len(e->s), BUDGET);
        assert_seq_info(&f->h.d, e);
        Vase__Envelope *reply = NULL;
        assert_int_equal(harness_get_seq(&f->h.d, vase_seq_id(e->s), &reply), 0);
        assert_true(reply->seq_info->protect_prompt);
        assert_int_equal(reply->seq_info->prompt_len, PROMPT);
        vase__envelope__free_unpacked(reply, NULL);
        assert_int_equal(vase_seq_close(e->s), 0);
        engine_done(e);
    }
}

/* A protected prompt that leaves no room for the window in the budget (or in min_budget, for an
 * elastic sequence) is refused with EINVAL naming the rule; the largest that fits opens. */
static void test_protect_prompt_refused(void **state) {
    struct fixture *f = *state;
    struct vase_geometry g = harness_geometry();
    struct vase_model *m;
    struct vase_seq *s = NULL;
    assert_int_equal(harness_engine_open(&f->h.d, "prompt", &g, &f->h.c[0], &m), 0);
    struct vase_seq_config cfg =
        harness_seq_config(VASE_POLICY_RANDOM, BUDGET, WINDOW, BUDGET, VASE_MODE_SYNC);
    cfg.params.protect_prompt = 1;
    assert_int_equal(vase_seq_open(f->h.c[0], m, &cfg, &s), -EINVAL);
    assert_null(s);
    assert_non_null(strstr(vase_last_error(f->h.c[0]),
                           "protect_prompt needs prompt_len at most budget - window"));
    assert_non_null(
        strstr(vase_last_error(f->h.c[0]), "(prompt_len 128, budget 128, window 32: at most 96)"));
    cfg.prompt_len = BUDGET - WINDOW + 1;
    assert_int_equal(vase_seq_open(f->h.c[0], m, &cfg, &s), -EINVAL);
    cfg.prompt_len = BUDGET - WINDOW;
    assert_int_equal(vase_seq_open(f->h.c[0], m, &cfg, &s), 0);
    assert_int_equal(vase_seq_close(s), 0);
    /* Elastic: the prompt must fit min_budget too. */
    cfg.params = vase_params_default(2 * BUDGET);
    cfg.params.window = WINDOW;
    cfg.params.protect_prompt = 1;
    cfg.min_budget = 2 * WINDOW;
    cfg.prompt_len = WINDOW + 1;
    assert_int_equal(vase_seq_open(f->h.c[0], m, &cfg, &s), -EINVAL);
    assert_non_null(strstr(vase_last_error(f->h.c[0]),
                           "protect_prompt needs prompt_len at most min_budget - window "
                           "(prompt_len 33, min_budget 64, window 32: at most 32)"));
    cfg.prompt_len = WINDOW;
    assert_int_equal(vase_seq_open(f->h.c[0], m, &cfg, &s), 0);
    assert_int_equal(vase_seq_close(s), 0);
    /* Off: any prompt. */
    cfg.params.protect_prompt = 0;
    cfg.prompt_len = 4 * BUDGET;
    assert_int_equal(vase_seq_open(f->h.c[0], m, &cfg, &s), 0);
    assert_int_equal(vase_seq_close(s), 0);
}

/* ---- NaN ---- */

/*
 * NaN in one element of what vase-attnv reads (a candidate's K or V, or a window query): the
 * eviction is refused with -EINVAL; the sequence keeps its data and length and evicts normally
 * once the value is repaired; another client's sequence is untouched and keeps evicting.
 */
static void test_nan(void **state) {
    struct fixture *f = *state;
    const char *what = f->h.arg;
    struct vase_geometry g = harness_geometry();
    struct vase_seq_config cfg =
        harness_seq_config(VASE_POLICY_VASE_ATTNV, BUDGET, WINDOW, PROMPT, VASE_MODE_SYNC);
    struct engine *e = open_engine(f, 0, &g, &cfg);
    struct engine *other = open_engine(f, 1, &g, &cfg);
    assert_decode(other, STEPS_TO_FIRST);
    assert_int_equal(other->rounds, 1);
    int32_t *other_before, *other_after, *before, *after;
    uint32_t other_len, len;
    assert_int_equal(harness_snapshot(other->s, &g, other->salt, &other_before, &other_len), 0);

    assert_decode(e, STEPS_TO_FIRST - 1);
    assert_int_equal(harness_snapshot(e->s, &g, e->salt, &before, &len), 0);
    /* No plan yet: slot t holds token t. Token 150 is in the window of the coming request. */
    uint32_t token = what[0] == 'Q' ? 150 : 10;
    float *x = what[0] == 'Q'
                   ? vase_seq_query_ptr(e->s, 1, token, 2)
                   : vase_seq_kv_ptr(e->s, 1, what[0] == 'K' ? VASE_K : VASE_V, token, 1);
    assert_non_null(x);
    x[3] = NAN;
    struct harness_status st = status_of(&f->h.d);

    int r = harness_append_tokens(e->s, &g, e->salt, 1, false);
    if (r != -EINVAL)
        fail_msg("NaN in %s: append returned %d (%s), want -EINVAL", what, r, vase_strerror(r));
    /* The reply said what and where, and the engine can read it. */
    char msg[128];
    snprintf(msg, sizeof(msg), "NaN or Inf in the keys/values/queries of layer 1 of sequence %u",
             vase_seq_id(e->s));
    if (!strstr(vase_last_error(f->h.c[0]), msg))
        fail_msg("vase_last_error() is \"%s\", want \"%s\"", vase_last_error(f->h.c[0]), msg);
    /* The token counts; nothing moved. */
    assert_int_equal(vase_seq_len(e->s), BUDGET + WINDOW);
    assert_int_equal(vase_seq_rounds(e->s), 0);
    /* An engine's failure, not an operator's. */
    struct harness_status st2 = status_of(&f->h.d);
    assert_true(st2.errors_total > st.errors_total);
    assert_int_equal(st2.admin_errors_total, st.admin_errors_total);
    assert_seq_info(&f->h.d, e);
    assert_int_equal(harness_write_token(e->s, &g, e->salt, token, token), 0);
    assert_int_equal(harness_snapshot(e->s, &g, e->salt, &after, &len), 0);
    assert_int_equal(len, BUDGET + WINDOW);
    assert_prefix_equal(before, BUDGET + WINDOW - 1, after, len, g.layers * g.kv_heads);
    free(after);
    free(before);

    /* The other client saw nothing and still evicts. */
    assert_int_equal(harness_snapshot(other->s, &g, other->salt, &other_after, &len), 0);
    assert_int_equal(len, other_len);
    assert_prefix_equal(other_before, len, other_after, len, g.layers * g.kv_heads);
    free(other_after);
    free(other_before);
    assert_decode(other, WINDOW);
    assert_int_equal(other->rounds, 2);

    /* Repaired, the sequence evicts at the next trigger (len 192: 160 candidates). */
    assert_decode(e, WINDOW);
    assert_int_equal(e->rounds, 1);
    assert_int_equal(vase_seq_len(e->s), BUDGET);
}

/* ---- engine processes ---- */

struct child_engine {
    const struct harness_daemon *d;
    struct vase_geometry g;
    struct vase_seq_config cfg;
    uint32_t salt, steps, want_rounds;
    int ready_fd, go_fd; /* the child writes one byte when ready, then waits for one */
};

/* Bounded wait for one byte (or end of file) on fd. 1 byte read, 0 end of file, -errno. */
static int read_byte(int fd, int timeout_ms) {
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int r = poll(&pfd, 1, timeout_ms);
    if (r <= 0)
        return r == 0 ? -ETIMEDOUT : -errno;
    char c;
    ssize_t n = read(fd, &c, 1);
    return n < 0 ? -errno : (int)n;
}

/* A child engine: connect, open, report ready, wait for go, decode, check, close. */
static int run_child_engine(void *arg) {
    struct child_engine *ce = arg;
    struct vase_client *c = NULL;
    struct vase_model *m;
    struct vase_seq *s;
    struct engine e;
    int r = harness_engine_open(ce->d, "child", &ce->g, &c, &m);
    if (r < 0)
        return 2;
    if ((r = vase_seq_open(c, m, &ce->cfg, &s)) < 0) {
        fprintf(stderr, "child %u: vase_seq_open: %s\n", ce->salt, vase_strerror(r));
        vase_disconnect(c);
        return 3;
    }
    engine_init(&e, s, &ce->g, &ce->cfg, ce->salt);
    e.lag = 8;
    if (write(ce->ready_fd, "R", 1) != 1 || read_byte(ce->go_fd, HARNESS_WAIT_MS) != 1) {
        fprintf(stderr, "child %u: no go from the test\n", ce->salt);
        vase_disconnect(c);
        return 4;
    }
    r = engine_decode(&e, ce->steps);
    if (r == 0 && e.rounds != ce->want_rounds) {
        fprintf(stderr, "child %u: %u rounds, want %u\n", ce->salt, e.rounds, ce->want_rounds);
        r = -EPROTO;
    }
    engine_done(&e);
    int rc = vase_seq_close(s);
    vase_disconnect(c);
    if (r < 0) {
        fprintf(stderr, "child %u: decode: %s\n", ce->salt, vase_strerror(r));
        return 5;
    }
    return rc < 0 ? 6 : 0;
}

/* Two engine processes with different geometries (f32 in blocks of 64 tokens, bf16 in blocks of
 * 16), policies and modes share the daemon and evict at the same time. */
static void test_two_engines(void **state) {
    struct fixture *f = *state;
    int ready[2], go[2];
    assert_int_equal(pipe2(ready, O_CLOEXEC), 0);
    assert_int_equal(pipe2(go, O_CLOEXEC), 0);
    struct child_engine ce[2] = {
        {.d = &f->h.d,
         .g = harness_geometry(),
         .cfg = harness_seq_config(VASE_POLICY_VASE_ATTNV, BUDGET, WINDOW, PROMPT, VASE_MODE_SYNC)},
        {.d = &f->h.d,
         .g = {"bf16-3x8x2x64", 3, 8, 2, 64, VASE_DTYPE_BF16, 16, 0},
         .cfg = harness_seq_config(VASE_POLICY_RKV, BUDGET, WINDOW, PROMPT, VASE_MODE_ASYNC)},
    };
    pid_t pid[2];
    for (int i = 0; i < 2; i++) {
        ce[i].salt = (uint32_t)i + 1;
        ce[i].steps = STEPS_TO_FIRST + 2 * WINDOW + 8;
        ce[i].want_rounds = 3;
        ce[i].ready_fd = ready[1];
        ce[i].go_fd = go[0];
        assert_int_equal(harness_fork(run_child_engine, &ce[i], &pid[i]), 0);
    }
    for (int i = 0; i < 2; i++)
        assert_int_equal(read_byte(ready[0], HARNESS_WAIT_MS), 1);
    struct harness_status st = status_of(&f->h.d);
    assert_int_equal(st.clients, 2);
    assert_int_equal(st.seqs, 2);
    /* f32: 3 KV + 1 ring pages of 64 KiB and a plan page. bf16, blocks of 16 tokens: pages of
     * 16 * 3 layers * 2 * 2 heads * 64 * 2 bytes = 24 KiB, 12 of them for 192 slots; ring pages
     * of 8 entries of 3 layers * 8 heads * 64 * 2 bytes = 24 KiB, 8 for 64 entries; a plan
     * page of 4096 bytes for 6 keep lists of 96 slots. */
    uint64_t bf16 = 12 * 24576 + 8 * 24576 + 4096;
    assert_int_equal(st.bytes_pages, harness_seq_bytes(3, 1, BUDGET - WINDOW) + bf16);
    assert_int_equal(write(go[1], "GG", 2), 2);

    for (int i = 0; i < 2; i++) {
        int status;
        assert_int_equal(harness_wait_pid(pid[i], HARNESS_RUN_MS, &status), 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            fail_msg("engine %d failed: status 0x%x", i + 1, status);
    }
    for (int i = 0; i < 2; i++) {
        close(ready[i]);
        close(go[i]);
    }
    assert_int_equal(harness_wait_bytes_pages(&f->h.d, 0, HARNESS_WAIT_MS, NULL), 0);
    st = status_of(&f->h.d);
    assert_int_equal(st.bytes_free, st.bytes_total);
    assert_int_equal(st.evictions_total, 6);
    assert_int_equal(harness_wait_clients(&f->h.d, 0, HARNESS_WAIT_MS), 0);
}

/* The victim of the SIGKILL test: three sequences, one with a plan in flight, then it waits
 * to be killed (or for the test to go away). */
static int run_victim(void *arg) {
    struct child_engine *ce = arg;
    struct vase_client *c = NULL;
    struct vase_model *m;
    struct vase_seq *s[3];
    struct engine e[3];
    static const enum vase_policy policies[3] = {VASE_POLICY_VASE_ATTNV, VASE_POLICY_SNAPKV,
                                                 VASE_POLICY_STREAMING};
    if (harness_engine_open(ce->d, "victim", &ce->g, &c, &m) < 0)
        return 2;
    for (int i = 0; i < 3; i++) {
        struct vase_seq_config cfg =
            harness_seq_config(policies[i], BUDGET, WINDOW, PROMPT, (enum vase_mode)(i == 1));
        int r = vase_seq_open(c, m, &cfg, &s[i]);
        if (r < 0) {
            fprintf(stderr, "victim: vase_seq_open: %s\n", vase_strerror(r));
            return 3;
        }
        engine_init(&e[i], s[i], &ce->g, &cfg, ce->salt);
        e[i].lag = UINT32_MAX;
        /* Up to the first trigger: the async ones have a request in flight. */
        if ((r = engine_decode(&e[i], STEPS_TO_FIRST)) < 0)
            return 4;
        engine_done(&e[i]);
    }
    if (write(ce->ready_fd, "R", 1) != 1)
        return 5;
    /* Killed here; if the test dies first, the pipe closes and so do we. */
    read_byte(ce->go_fd, 60000);
    vase_disconnect(c);
    return 0;
}

/*
 * SIGKILL of an engine: its session socket closes with the process, so every one of its pages
 * is free again (the daemon has no other way to learn of the death: no timeout ends a silent
 * client), and the other engine's data and evictions are unaffected. How long the pages took
 * to come back, from the kill to the Status that shows them, is printed, not asserted.
 */
static void test_sigkill(void **state) {
    struct fixture *f = *state;
    int ready[2], go[2];
    assert_int_equal(pipe2(ready, O_CLOEXEC), 0);
    assert_int_equal(pipe2(go, O_CLOEXEC), 0);
    struct child_engine ce = {
        .d = &f->h.d, .g = harness_geometry(), .salt = 7, .ready_fd = ready[1], .go_fd = go[0]};
    pid_t pid;
    assert_int_equal(harness_fork(run_victim, &ce, &pid), 0);
    close(ready[1]);
    close(go[0]);
    int r = read_byte(ready[0], HARNESS_WAIT_MS);
    if (r != 1) {
        int status = 0;
        harness_wait_pid(pid, 1000, &status);
        fail_msg("the victim did not get ready (%d, status 0x%x)", r, status);
    }

    /* The survivor, in this process. */
    struct vase_geometry g = harness_geometry();
    struct vase_seq_config cfg =
        harness_seq_config(VASE_POLICY_VASE_ATTNV, BUDGET, WINDOW, PROMPT, VASE_MODE_ASYNC);
    struct engine *e = open_engine(f, 0, &g, &cfg);
    e->lag = 4;
    assert_decode(e, STEPS_TO_FIRST + 4);
    assert_int_equal(e->rounds, 1);
    int32_t *before, *after;
    uint32_t len_before, len_after;
    assert_int_equal(harness_snapshot(e->s, &g, e->salt, &before, &len_before), 0);

    struct harness_status st = status_of(&f->h.d);
    assert_int_equal(st.clients, 2);
    assert_int_equal(st.seqs, 4);
    uint64_t survivor_bytes = harness_seq_bytes(3, 1, BUDGET - WINDOW);
    assert_true(st.bytes_pages > survivor_bytes);

    double t0 = harness_now();
    assert_int_equal(kill(pid, SIGKILL), 0);
    double dt;
    r = harness_wait_bytes_pages(&f->h.d, survivor_bytes, HARNESS_WAIT_MS, &dt);
    dt = harness_now() - t0;
    int status;
    assert_int_equal(harness_wait_pid(pid, HARNESS_WAIT_MS, &status), 0);
    close(ready[0]);
    close(go[1]);
    assert_int_equal(r, 0);
    printf("SIGKILL of an engine with 3 sequences: pages free again after %.2f ms\n", dt * 1e3);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    assert_int_equal(harness_wait_clients(&f->h.d, 1, HARNESS_WAIT_MS), 0);
    assert_int_equal(status_of(&f->h.d).seqs, 1);

    /* The survivor: same data, and it keeps evicting. */
    assert_int_equal(harness_snapshot(e->s, &g, e->salt, &after, &len_after), 0);
    assert_int_equal(len_after, len_before);
    assert_prefix_equal(before, len_before, after, len_after, g.layers * g.kv_heads);
    free(before);
    free(after);
    assert_decode(e, 2 * WINDOW);
    assert_int_equal(e->rounds, 3);
    assert_seq_info(&f->h.d, e);
}

int main(void) {
    static enum vase_policy policies[_VASE_POLICY_MAX];
    static const char *const nan_in[] = {"K", "V", "Q"};
    static char names[_VASE_POLICY_MAX + 3][48];
    struct CMUnitTest tests[32] = {
        cmocka_unit_test_setup_teardown(test_sync_cycle, setup, teardown),
        cmocka_unit_test_setup_teardown(test_async_cycle, setup, teardown),
        cmocka_unit_test_setup_teardown(test_async_full_stalls, setup, teardown),
        cmocka_unit_test_setup_teardown(test_long_prompt, setup, teardown),
        cmocka_unit_test_setup_teardown(test_flush, setup, teardown),
        cmocka_unit_test_setup_teardown(test_protect_prompt, setup, teardown),
        cmocka_unit_test_setup_teardown(test_protect_prompt_refused, setup, teardown),
    };
    size_t n = 7;
    for (size_t i = 0; i < _VASE_POLICY_MAX; i++) {
        policies[i] = (enum vase_policy)i;
        snprintf(names[i], sizeof(names[i]), "test_policy %s", vase_policy_to_string(policies[i]));
        tests[n++] =
            (struct CMUnitTest){names[i], test_policy, setup, teardown, (void *)&policies[i]};
    }
    for (size_t i = 0; i < 3; i++) {
        snprintf(names[_VASE_POLICY_MAX + i], sizeof(names[0]), "test_nan in %s", nan_in[i]);
        tests[n++] = (struct CMUnitTest){names[_VASE_POLICY_MAX + i], test_nan, setup, teardown,
                                         (void *)nan_in[i]};
    }
    tests[n++] =
        (struct CMUnitTest)cmocka_unit_test_setup_teardown(test_two_engines, setup, teardown);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test_setup_teardown(test_sigkill, setup, teardown);
    return _cmocka_run_group_tests("test_integration_evict", tests, n, NULL, NULL);
}
