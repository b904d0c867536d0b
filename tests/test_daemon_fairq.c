/* SPDX-License-Identifier: MIT */

/* Unit tests of daemon/fairq.c, the evictor's planning queue: tenants served in turn at run
 * granularity, the jobs of a run handed out together, the counters, the empty queue, and a
 * seeded random sequence of pushes and pops checked against a plain model of the rule. */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../daemon/fairq.h"

#define MAX_RUNS 512
#define NTENANTS 5 /* tenants of the random mix */
#define MAX_JOBS 4

struct tjob {
    struct vase_fairq_job node;
    int run;   /* index in struct fixture's runs */
    int index; /* within its run */
};

struct trun {
    struct vase_fairq_run node;
    uint32_t tenant;
    int njobs;
    struct tjob jobs[MAX_JOBS];
};

struct fixture {
    struct vase_fairq q;
    struct trun runs[MAX_RUNS];
    int nruns;
};

static int setup(void **state) {
    struct fixture *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    free(*state);
    return 0;
}

/* Pushes a run of njobs jobs for tenant; returns its index. */
static int push(struct fixture *f, uint32_t tenant, int njobs) {
    assert_true(f->nruns < MAX_RUNS && njobs >= 1 && njobs <= MAX_JOBS);
    int i = f->nruns++;
    struct trun *r = &f->runs[i];
    r->tenant = tenant;
    r->njobs = njobs;
    for (int k = 0; k < njobs; k++) {
        r->jobs[k] = (struct tjob){.run = i, .index = k};
        r->jobs[k].node.next = k + 1 < njobs ? &r->jobs[k + 1].node : NULL;
    }
    assert_int_equal(vase_fairq_push(&f->q, &r->node, tenant, &r->jobs[0].node), 0);
    return i;
}

static const struct tjob *pop(struct fixture *f) {
    struct vase_fairq_job *node = NULL;
    assert_int_equal(vase_fairq_pop(&f->q, &node), 1);
    assert_non_null(node);
    assert_null(node->next);
    return (const struct tjob *)((const char *)node - offsetof(struct tjob, node));
}

/* Pops a whole run: its jobs must come out together and in order. Returns its index. */
static int pop_run(struct fixture *f) {
    const struct tjob *j = pop(f);
    int run = j->run;
    assert_int_equal(j->index, 0);
    for (int k = 1; k < f->runs[run].njobs; k++) {
        j = pop(f);
        assert_int_equal(j->run, run);
        assert_int_equal(j->index, k);
    }
    return run;
}

static void assert_counts(const struct vase_fairq *q, uint32_t queued, uint32_t partial,
                          uint32_t waiting) {
    struct vase_fairq_counts c;
    vase_fairq_get_counts(q, &c);
    assert_int_equal(c.runs_queued, queued);
    assert_int_equal(c.runs_partial, partial);
    assert_int_equal(c.tenants_waiting, waiting);
}

static void test_empty(void **state) {
    struct fixture *f = *state;
    struct vase_fairq_job *node = (struct vase_fairq_job *)&f->runs[0].jobs[0].node;

    assert_true(vase_fairq_is_empty(&f->q));
    assert_int_equal(vase_fairq_pop(&f->q, &node), 0);
    assert_ptr_equal(node, &f->runs[0].jobs[0].node); /* untouched */
    assert_counts(&f->q, 0, 0, 0);
    assert_int_equal(vase_fairq_count_tenant(&f->q, 1), 0);

    /* A run without jobs would never leave: refused, nothing queued. */
    assert_int_equal(vase_fairq_push(&f->q, &f->runs[0].node, 1, NULL), -EINVAL);
    assert_true(vase_fairq_is_empty(&f->q));
    assert_counts(&f->q, 0, 0, 0);

    /* Emptied again after use, the queue behaves as new. */
    push(f, 1, 2);
    assert_false(vase_fairq_is_empty(&f->q));
    assert_int_equal(pop_run(f), 0);
    assert_true(vase_fairq_is_empty(&f->q));
    assert_int_equal(vase_fairq_pop(&f->q, &node), 0);
    assert_counts(&f->q, 0, 0, 0);
    assert_int_equal(push(f, 2, 1), 1);
    assert_int_equal(pop_run(f), 1);
    assert_true(vase_fairq_is_empty(&f->q));
}

/* The case a first-come first-served queue gets wrong: a client with five plans queued, then a
 * client with one. The second client's plan goes second, not sixth. */
static void test_late_client_goes_second(void **state) {
    struct fixture *f = *state;
    int a[5], b;

    for (int i = 0; i < 5; i++)
        a[i] = push(f, 1, 3);
    b = push(f, 2, 3);
    assert_int_equal(pop_run(f), a[0]);
    assert_int_equal(pop_run(f), b);
    for (int i = 1; i < 5; i++)
        assert_int_equal(pop_run(f), a[i]);
    assert_true(vase_fairq_is_empty(&f->q));
}

/* Three clients, each pushing its runs in one burst: one run of each per round. */
static void test_three_clients_interleave(void **state) {
    struct fixture *f = *state;
    int a[3], b[2], c[3];

    for (int i = 0; i < 3; i++)
        a[i] = push(f, 10, 1 + i % 2);
    for (int i = 0; i < 2; i++)
        b[i] = push(f, 20, 2);
    for (int i = 0; i < 3; i++)
        c[i] = push(f, 30, 1);
    const int want[] = {a[0], b[0], c[0], a[1], b[1], c[1], a[2], c[2]};
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        assert_int_equal(pop_run(f), want[i]);
    assert_true(vase_fairq_is_empty(&f->q));
}

/* A run that has started is finished before anyone else's, whoever arrives meanwhile; a
 * client that arrives joins the back of the round; one that ran dry and comes back too. */
static void test_runs_stay_whole(void **state) {
    struct fixture *f = *state;

    int a0 = push(f, 1, 4);
    int a1 = push(f, 1, 2);
    const struct tjob *j = pop(f);
    assert_true(j->run == a0 && j->index == 0);
    int b0 = push(f, 2, 3);
    int c0 = push(f, 3, 1);
    for (int k = 1; k < 4; k++) {
        j = pop(f);
        assert_true(j->run == a0 && j->index == k);
    }
    j = pop(f);
    assert_true(j->run == b0 && j->index == 0);
    int a2 = push(f, 1, 1); /* behind a1, not before c0 */
    int d0 = push(f, 4, 1); /* behind a1: it was already waiting */
    for (int k = 1; k < 3; k++) {
        j = pop(f);
        assert_true(j->run == b0 && j->index == k);
    }
    assert_int_equal(pop_run(f), c0);
    assert_int_equal(pop_run(f), a1);
    int b1 = push(f, 2, 2); /* b ran dry after b0: it rejoins at the back */
    assert_int_equal(pop_run(f), d0);
    assert_int_equal(pop_run(f), a2);
    assert_int_equal(pop_run(f), b1);
    assert_true(vase_fairq_is_empty(&f->q));
}

static void test_counts(void **state) {
    struct fixture *f = *state;

    push(f, 1, 2);
    push(f, 1, 2);
    push(f, 1, 1);
    push(f, 2, 2);
    assert_counts(&f->q, 4, 0, 2);
    assert_int_equal(vase_fairq_count_tenant(&f->q, 1), 3);
    assert_int_equal(vase_fairq_count_tenant(&f->q, 2), 1);
    assert_int_equal(vase_fairq_count_tenant(&f->q, 3), 0);

    pop(f); /* half of tenant 1's first run: started, no longer queued */
    assert_counts(&f->q, 3, 1, 2);
    assert_int_equal(vase_fairq_count_tenant(&f->q, 1), 2);
    pop(f);
    assert_counts(&f->q, 3, 0, 2);
    assert_int_equal(vase_fairq_count_tenant(&f->q, 1), 2);

    pop(f); /* half of tenant 2's only run: tenant 2 no longer waits */
    assert_counts(&f->q, 2, 1, 1);
    assert_int_equal(vase_fairq_count_tenant(&f->q, 2), 0);
    pop(f);
    assert_counts(&f->q, 2, 0, 1);

    pop_run(f);
    assert_counts(&f->q, 1, 0, 1);
    assert_int_equal(vase_fairq_count_tenant(&f->q, 1), 1);
    pop_run(f);
    assert_counts(&f->q, 0, 0, 0);
    assert_int_equal(vase_fairq_count_tenant(&f->q, 1), 0);
    assert_true(vase_fairq_is_empty(&f->q));
}

/*
 * The rule, written out plainly: tenants in the order they got work, each with its runs in
 * order; the front tenant hands out its front run's jobs, then goes to the back if it has runs
 * left. A seeded random mix of pushes and pops must give the same jobs, in the same order, and
 * the same counts.
 */
struct model {
    uint32_t tenants[NTENANTS];
    int runs[NTENANTS][MAX_RUNS]; /* per tenant, in turn order: its runs, in order */
    int nruns[NTENANTS];
    int ntenants;
    int next_job; /* of the front run */
};

static void model_push(struct model *m, uint32_t tenant, int run) {
    int t = 0;
    while (t < m->ntenants && m->tenants[t] != tenant)
        t++;
    if (t == m->ntenants) {
        m->tenants[m->ntenants] = tenant;
        m->nruns[m->ntenants++] = 0;
    }
    m->runs[t][m->nruns[t]++] = run;
}

/* The next job as (run, index), or run -1. */
static void model_pop(struct model *m, const struct fixture *f, int *ret_run, int *ret_index) {
    *ret_run = -1;
    if (m->ntenants == 0)
        return;
    int run = m->runs[0][0];
    *ret_run = run;
    *ret_index = m->next_job++;
    if (m->next_job < f->runs[run].njobs)
        return;
    m->next_job = 0;
    uint32_t tenant = m->tenants[0];
    int n = m->nruns[0] - 1, rest[MAX_RUNS];
    memcpy(rest, m->runs[0] + 1, (size_t)n * sizeof(int));
    for (int t = 1; t < m->ntenants; t++) {
        m->tenants[t - 1] = m->tenants[t];
        m->nruns[t - 1] = m->nruns[t];
        memcpy(m->runs[t - 1], m->runs[t], (size_t)m->nruns[t] * sizeof(int));
    }
    m->ntenants--;
    if (n > 0) {
        m->tenants[m->ntenants] = tenant;
        m->nruns[m->ntenants] = n;
        memcpy(m->runs[m->ntenants], rest, (size_t)n * sizeof(int));
        m->ntenants++;
    }
}

static void model_counts(const struct model *m, uint32_t tenant, struct vase_fairq_counts *ret,
                         uint32_t *ret_tenant_queued) {
    *ret = (struct vase_fairq_counts){.runs_partial = m->next_job > 0};
    *ret_tenant_queued = 0;
    for (int t = 0; t < m->ntenants; t++) {
        uint32_t mine = (uint32_t)m->nruns[t] - (t == 0 && m->next_job > 0);
        ret->runs_queued += mine;
        ret->tenants_waiting += mine > 0;
        if (m->tenants[t] == tenant)
            *ret_tenant_queued = mine;
    }
}

static void test_against_model(void **state) {
    struct fixture *f = *state;
    struct model m = {0};
    uint64_t x = 0x9e3779b97f4a7c15ull;
    int pops = 0, deepest = 0;

    /* About 0.8 jobs pushed per step against 0.67 popped: the queue grows to hundreds of runs
     * across every tenant, then, the runs spent, drains to empty. */
    for (int step = 0; step < 3 * MAX_RUNS + 4 * MAX_RUNS; step++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17; /* xorshift64: the same sequence every run */
        uint32_t tenant = (uint32_t)(x >> 8) % NTENANTS;
        if ((x >> 32) % 3 == 0 && f->nruns < MAX_RUNS) {
            int run = push(f, tenant, 1 + (int)((x >> 16) % MAX_JOBS));
            model_push(&m, tenant, run);
        } else {
            int run, index;
            model_pop(&m, f, &run, &index);
            struct vase_fairq_job *node;
            if (run < 0) {
                assert_int_equal(vase_fairq_pop(&f->q, &node), 0);
            } else {
                const struct tjob *j = pop(f);
                assert_int_equal(j->run, run);
                assert_int_equal(j->index, index);
                pops++;
            }
        }
        uint32_t tenant_queued;
        struct vase_fairq_counts want;
        model_counts(&m, tenant, &want, &tenant_queued);
        assert_counts(&f->q, want.runs_queued, want.runs_partial, want.tenants_waiting);
        assert_int_equal(vase_fairq_count_tenant(&f->q, tenant), tenant_queued);
        assert_int_equal(vase_fairq_is_empty(&f->q), m.ntenants == 0);
        if ((int)want.runs_queued > deepest)
            deepest = (int)want.runs_queued;
    }
    /* The mix did what it is for: every run pushed, a deep queue, all of it popped. */
    assert_int_equal(f->nruns, MAX_RUNS);
    assert_true(deepest > MAX_RUNS / 8);
    assert_true(vase_fairq_is_empty(&f->q));
    assert_true(pops > MAX_RUNS);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_empty, setup, teardown),
        cmocka_unit_test_setup_teardown(test_late_client_goes_second, setup, teardown),
        cmocka_unit_test_setup_teardown(test_three_clients_interleave, setup, teardown),
        cmocka_unit_test_setup_teardown(test_runs_stay_whole, setup, teardown),
        cmocka_unit_test_setup_teardown(test_counts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_against_model, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
