/* SPDX-License-Identifier: MIT */

/*
 * Tests of the protected prompt of kernels/plan.c (ALGORITHM.md, "The protected prompt"): with
 * params.protect_prompt every policy keeps candidates [0, prompt_len) first, in slot order,
 * through any number of evictions, and chooses the rest of the budget among the other
 * candidates; the random policy then picks uniformly among those (checked exactly against the
 * Philox draws, and by counts over fixed seeds); sinks after the prompt keep their rule; the
 * parameter is validated; and with it off (or an empty prompt) every plan is what it was.
 */

#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "vase_kernels.h"

/* Every policy, by its enum value. */
#define N_POLICIES ((size_t)_VASE_POLICY_MAX)

/* Geometry of the generations: budget 32, window 8 (K = 24), 2 KV heads, 4 query heads. */
#define HKV 2u
#define HQ 4u
#define DIM 8u
#define BUDGET 32u
#define WINDOW 8u
#define CAP (BUDGET + WINDOW) /* the longest a sequence gets before an eviction */
#define ROUNDS 20u

/* Element d of head h of the row of token t in stream salt (0 K, 1 V, 2 Q, 3 acc): a multiple of
 * 1/32 in [-127/32, 127/32], exact in float32, reproducible from (t, h, d) alone. */
static float token_value(uint32_t t, uint32_t h, uint32_t d, uint32_t salt) {
    uint32_t x = t * 2654435761u ^ (h * 40503u + d * 9973u + salt * 0x9e3779b9u);
    x ^= x >> 15;
    x *= 0x2c1b3c6du;
    x ^= x >> 12;
    return (float)((int)(x % 255) - 127) / 32.0f;
}

/* A generation of one layer: K and V [HKV][CAP][DIM], the token held by each slot, the window's
 * queries and the accumulated attention of h2o. */
struct gen {
    float k[HKV * CAP * DIM], v[HKV * CAP * DIM];
    float pos[HKV * CAP]; /* token of slot s of head h: pos[h * CAP + s] */
    float q[HQ * WINDOW * DIM];
    float acc[HKV * CAP];
    uint32_t len, next; /* slots filled; the next token */
};

static void gen_append(struct gen *g) {
    for (uint32_t h = 0; h < HKV; h++) {
        for (uint32_t d = 0; d < DIM; d++) {
            g->k[((size_t)h * CAP + g->len) * DIM + d] = token_value(g->next, h, d, 0);
            g->v[((size_t)h * CAP + g->len) * DIM + d] = token_value(g->next, h, d, 1);
        }
        g->pos[h * CAP + g->len] = (float)g->next;
    }
    g->len++;
    g->next++;
}

/* The plan input of an eviction at g->len: the queries of the W newest tokens, h2o's scores. */
static struct vase_plan_input gen_input(struct gen *g, enum vase_policy policy,
                                        const struct vase_params *p, uint32_t prompt) {
    uint32_t n = g->len - WINDOW;
    for (uint32_t h = 0; h < HQ; h++)
        for (uint32_t i = 0; i < WINDOW; i++)
            for (uint32_t d = 0; d < DIM; d++)
                g->q[((size_t)h * WINDOW + i) * DIM + d] = token_value(g->next - 1 - i, h, d, 2);
    for (uint32_t i = 0; i < HKV * n; i++)
        g->acc[i] = fabsf(token_value(g->next, i / n, i % n, 3));
    return (struct vase_plan_input){
        .policy = policy,
        .params = *p,
        .n = n,
        .hq = HQ,
        .k = vase_view_contiguous(g->k, VASE_DTYPE_F32, HKV, CAP, DIM),
        .v = vase_view_contiguous(g->v, VASE_DTYPE_F32, HKV, CAP, DIM),
        .q = vase_view_contiguous(g->q, VASE_DTYPE_F32, HQ, WINDOW, DIM),
        .acc = g->acc,
        .rng = {.seed = 0x9e37, .sequence = 11, .layer = 1, .round = g->next},
        .prompt_len = prompt,
    };
}

static struct vase_params gen_params(uint32_t n_sink) {
    struct vase_params p = vase_params_default(BUDGET);
    p.window = WINDOW;
    p.n_sink = n_sink;
    p.n_large = 8;
    p.smooth = 3;
    p.rank = 4;
    p.protect_prompt = 1;
    return p;
}

/* A generation filled to CAP slots, for single plans. */
static struct gen *gen_full(void) {
    struct gen *g = calloc(1, sizeof(*g));
    assert_non_null(g);
    while (g->len < CAP)
        gen_append(g);
    return g;
}

/* Slots [0, prompt) of every head hold the prompt's tokens, in order, their K and V intact. */
static void assert_prompt_intact(const struct gen *g, uint32_t prompt, const char *what,
                                 uint32_t round) {
    for (uint32_t h = 0; h < HKV; h++)
        for (uint32_t s = 0; s < prompt; s++) {
            if (g->pos[h * CAP + s] != (float)s)
                fail_msg("%s, round %u: head %u slot %u holds token %g, not prompt token %u", what,
                         round, h, s, (double)g->pos[h * CAP + s], s);
            for (uint32_t d = 0; d < DIM; d++) {
                assert_true(g->k[((size_t)h * CAP + s) * DIM + d] == token_value(s, h, d, 0));
                assert_true(g->v[((size_t)h * CAP + s) * DIM + d] == token_value(s, h, d, 1));
            }
        }
}

/* Prefills prompt tokens, then decodes until ROUNDS evictions have run; after each, the length
 * is the budget and the prompt is where it was. */
static void generate(enum vase_policy policy, uint32_t prompt, uint32_t n_sink) {
    struct gen *g = calloc(1, sizeof(*g));
    struct vase_params p = gen_params(n_sink);
    uint32_t K = vase_plan_keep_count(&p), keep[HKV * (BUDGET - WINDOW)], rounds = 0;
    char what[96];
    assert_non_null(g);
    snprintf(what, sizeof(what), "%s, prompt %u, %u sinks", vase_policy_to_string(policy), prompt,
             n_sink);
    while (g->len < prompt)
        gen_append(g);
    while (rounds < ROUNDS) {
        gen_append(g);
        if (!(g->len > BUDGET && g->len % WINDOW == 0))
            continue;
        struct vase_plan_input in = gen_input(g, policy, &p, prompt);
        assert_int_equal(vase_plan(&in, 1, NULL, keep), 0);
        assert_int_equal(vase_plan_validate(keep, HKV, K, in.n), 0);
        for (uint32_t h = 0; h < HKV; h++)
            for (uint32_t i = 0; i < prompt; i++)
                assert_int_equal(keep[h * K + i], i);
        assert_int_equal(vase_compact_layer(&in.k, &in.v, keep, K, in.n, g->len), BUDGET);
        assert_int_equal(vase_compact_f32(g->pos, HKV, CAP, keep, K, in.n, g->len), BUDGET);
        g->len = BUDGET;
        assert_prompt_intact(g, prompt, what, rounds);
        rounds++;
    }
    free(g);
}

/* Every policy keeps the prompt through 20 evictions, with sinks inside the prompt and past it;
 * each eviction leaves exactly the budget. */
static void test_prompt_survives_evictions(void **state) {
    (void)state;
    for (size_t i = 0; i < N_POLICIES; i++) {
        generate((enum vase_policy)i, 10, 4);
        generate((enum vase_policy)i, 6, 9);
        generate((enum vase_policy)i, BUDGET - WINDOW, 4); /* the prompt is the whole plan */
    }
}

/* ---- random: uniform among the candidates after the prompt ---- */

#define UN 64u /* candidates */
#define UP 16u /* protected prompt */
#define UK 32u /* kept: budget 40, window 8 */
#define TRIALS 3000u

/* The random policy with the prompt protected picks exactly the K - P candidates after the
 * prompt with the smallest Exp(1) draws (largest race keys 1 / E), i.e. a uniformly random subset
 * of them; over 3000 rounds of fixed Philox draws each such candidate is kept within 4 standard
 * deviations of 3000 * 16 / 48 = 1000 times, and the prompt every time. */
static void test_random_uniform_after_prompt(void **state) {
    (void)state;
    struct vase_params p = vase_params_default(UK + 8);
    p.window = 8;
    p.protect_prompt = 1;
    assert_int_equal(vase_plan_keep_count(&p), UK);
    uint32_t keep[UK], count[UN] = {0};
    float draws[UN];
    struct vase_plan_input in = {
        .policy = VASE_POLICY_RANDOM,
        .params = p,
        .n = UN,
        .k = {.heads = 1},
        .rng = {.seed = 0x0dd5eed, .sequence = 7, .layer = 3},
        .prompt_len = UP,
    };
    for (uint32_t t = 0; t < TRIALS; t++) {
        in.rng.round = t;
        assert_int_equal(vase_plan(&in, 1, NULL, keep), 0);
        vase_rng_exp(&in.rng, 0, draws, UN);
        for (uint32_t i = 0; i < UP; i++)
            assert_int_equal(keep[i], i);
        /* Exactly the race: descending 1 / E, so ascending E, among slots UP .. UN - 1. */
        for (uint32_t i = UP; i < UK; i++) {
            assert_true(keep[i] >= UP && keep[i] < UN);
            if (i > UP)
                assert_true(draws[keep[i - 1]] <= draws[keep[i]]);
        }
        for (uint32_t j = UP; j < UN; j++) {
            bool kept = false;
            for (uint32_t i = UP; i < UK; i++)
                kept |= keep[i] == j;
            if (!kept)
                assert_true(draws[j] >= draws[keep[UK - 1]]);
        }
        for (uint32_t i = 0; i < UK; i++)
            count[keep[i]]++;
    }
    uint64_t total = 0;
    double chi2 = 0.0, expect = (double)TRIALS * (UK - UP) / (UN - UP);
    double sd = sqrt(expect * (1.0 - (double)(UK - UP) / (UN - UP)));
    for (uint32_t j = 0; j < UN; j++) {
        total += count[j];
        if (j < UP) {
            assert_int_equal(count[j], TRIALS);
            continue;
        }
        if (fabs(count[j] - expect) > 4.0 * sd)
            fail_msg("slot %u kept %u times of %u, expected %g +- %g", j, count[j], TRIALS, expect,
                     4.0 * sd);
        chi2 += (count[j] - expect) * (count[j] - expect) / expect;
    }
    assert_int_equal(total, (uint64_t)TRIALS * UK);
    /* 47 degrees of freedom: chi2 above 90 has probability below 1e-4; the draws are fixed, so
     * this is one fixed number, which a correct race keeps far below the bound. */
    if (chi2 > 90.0)
        fail_msg("chi-square %g over the slots after the prompt", chi2);
}

/* ---- sinks and the prompt ---- */

/* Sinks past the prompt keep their rule and follow the prompt in the plan; sinks inside it are
 * kept as prompt. */
static void test_sinks_after_prompt(void **state) {
    (void)state;
    static const enum vase_policy sink_policies[] = {VASE_POLICY_VASE_ATTNV, VASE_POLICY_VASE_DKV,
                                                     VASE_POLICY_CURDKV, VASE_POLICY_STREAMING};
    struct gen *g = gen_full();
    struct vase_params p = gen_params(9);
    uint32_t K = vase_plan_keep_count(&p), keep[HKV * (BUDGET - WINDOW)];
    for (size_t i = 0; i < sizeof(sink_policies) / sizeof(sink_policies[0]); i++) {
        struct vase_plan_input in = gen_input(g, sink_policies[i], &p, 6);
        assert_int_equal(vase_plan(&in, 1, NULL, keep), 0);
        for (uint32_t h = 0; h < HKV; h++)
            for (uint32_t s = 0; s < 9; s++)
                assert_int_equal(keep[h * K + s], s);
        if (sink_policies[i] != VASE_POLICY_STREAMING)
            continue;
        /* Then the most recent candidates. */
        for (uint32_t h = 0; h < HKV; h++)
            for (uint32_t s = 9; s < K; s++)
                assert_int_equal(keep[h * K + s], in.n - (K - s));
        /* A prompt longer than the sinks: the prompt, then the most recent. */
        in.prompt_len = 12;
        assert_int_equal(vase_plan(&in, 1, NULL, keep), 0);
        for (uint32_t s = 0; s < K; s++)
            assert_int_equal(keep[s], s < 12 ? s : in.n - (K - s));
    }
    free(g);
}

/* ---- parameters, and plans with the protection off ---- */

static void test_prompt_params(void **state) {
    (void)state;
    struct vase_params p = vase_params_default(256);
    char msg[256];
    assert_int_equal(p.protect_prompt, 0);
    p.protect_prompt = 2;
    assert_int_equal(vase_params_explain(&p, VASE_POLICY_RANDOM, msg, sizeof(msg)), -EINVAL);
    assert_non_null(strstr(msg, "protect_prompt must be 0 or 1"));

    /* The prompt and the window must fit the budget: prompt_len <= budget - window. */
    p.protect_prompt = 1;
    for (size_t i = 0; i < N_POLICIES; i++) {
        assert_int_equal(vase_params_explain_prompt(&p, (enum vase_policy)i, 0, msg, sizeof(msg)),
                         0);
        assert_string_equal(msg, "");
        assert_int_equal(vase_params_explain_prompt(&p, (enum vase_policy)i, 192, msg, sizeof(msg)),
                         0);
        assert_int_equal(vase_params_explain_prompt(&p, (enum vase_policy)i, 193, msg, sizeof(msg)),
                         -EINVAL);
        assert_non_null(strstr(msg, "protect_prompt needs prompt_len at most budget - window"));
        assert_non_null(strstr(msg, "prompt_len 193, budget 256, window 64: at most 192"));
        assert_int_equal(vase_params_explain_prompt(&p, (enum vase_policy)i, 256, NULL, 0),
                         -EINVAL);
    }
    /* Without the protection any prompt goes; other rules still come first. */
    p.protect_prompt = 0;
    assert_int_equal(vase_params_explain_prompt(&p, VASE_POLICY_SNAPKV, 100000, msg, sizeof(msg)),
                     0);
    p.budget = 100;
    p.protect_prompt = 1;
    assert_int_equal(vase_params_explain_prompt(&p, VASE_POLICY_SNAPKV, 1, msg, sizeof(msg)),
                     -EINVAL);
    assert_non_null(strstr(msg, "multiple of window"));
}

/* A plan refuses a protected prompt longer than K, writing nothing; one of exactly K is the whole
 * plan. */
static void test_prompt_longer_than_keep(void **state) {
    (void)state;
    struct gen *g = gen_full();
    struct vase_params p = gen_params(4);
    uint32_t K = vase_plan_keep_count(&p), keep[HKV * (BUDGET - WINDOW)];
    for (size_t i = 0; i < N_POLICIES; i++) {
        struct vase_plan_input in = gen_input(g, (enum vase_policy)i, &p, K + 1);
        memset(keep, 0xab, sizeof(keep));
        assert_int_equal(vase_plan(&in, 1, NULL, keep), -EINVAL);
        for (size_t j = 0; j < sizeof(keep) / sizeof(keep[0]); j++)
            assert_int_equal(keep[j], 0xababababu);
        in.prompt_len = K;
        assert_int_equal(vase_plan(&in, 1, NULL, keep), 0);
        for (uint32_t j = 0; j < HKV * K; j++)
            assert_int_equal(keep[j], j % K);
    }
    free(g);
}

/* protect_prompt 0 ignores prompt_len, and an empty protected prompt changes nothing: the plans
 * are those of a plan without either. */
static void test_prompt_off_unchanged(void **state) {
    (void)state;
    struct gen *g = gen_full();
    struct vase_params on = gen_params(4), off = on;
    off.protect_prompt = 0;
    uint32_t want[HKV * (BUDGET - WINDOW)], got[HKV * (BUDGET - WINDOW)];
    for (size_t i = 0; i < N_POLICIES; i++) {
        struct vase_plan_input in = gen_input(g, (enum vase_policy)i, &off, 0);
        assert_int_equal(vase_plan(&in, 1, NULL, want), 0);
        in.prompt_len = 10;
        assert_int_equal(vase_plan(&in, 1, NULL, got), 0);
        assert_memory_equal(got, want, sizeof(want));
        in.params = on;
        in.prompt_len = 0;
        assert_int_equal(vase_plan(&in, 1, NULL, got), 0);
        assert_memory_equal(got, want, sizeof(want));
        /* And a real prompt does change it (it is not already kept by chance). */
        in.prompt_len = 10;
        assert_int_equal(vase_plan(&in, 1, NULL, got), 0);
        assert_true(memcmp(got, want, sizeof(want)) != 0);
    }
    free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prompt_survives_evictions),
        cmocka_unit_test(test_random_uniform_after_prompt),
        cmocka_unit_test(test_sinks_after_prompt),
        cmocka_unit_test(test_prompt_params),
        cmocka_unit_test(test_prompt_longer_than_keep),
        cmocka_unit_test(test_prompt_off_unchanged),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
