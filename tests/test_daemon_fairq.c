/* SPDX-License-Identifier: MIT */

/* Unit tests of daemon/plan/fairq.c, the evictor's planning queue: uids served in turn, then each
 * uid's tenants, at run granularity; the jobs of a run handed out together, the counters, the
 * empty queue, and a seeded random sequence of pushes and pops over several uids checked against
 * a plain model of the rule. */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../daemon/plan/fairq.h"

#define MAX_RUNS 512
#define NTENANTS 5 /* tenants of the random mix */
#define NUIDS 3    /* uids of the random mix: tenant t belongs to uid t % NUIDS */
#define MAX_JOBS 4

struct tjob {
    struct vase_fairq_job node;
    int run;   /* index in struct fixture's runs */
    int index; /* within its run */
};

struct trun {
    struct vase_fairq_run node;
    uint32_t uid, tenant;
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

/* Pushes a run of njobs jobs for tenant of uid; returns its index. */
static int push_uid(struct fixture *f, uint32_t uid, uint32_t tenant, int njobs) {
    assert_true(f->nruns < MAX_RUNS && njobs >= 1 && njobs <= MAX_JOBS);
    int i = f->nruns++;
    struct trun *r = &f->runs[i];
    r->uid = uid;
    r->tenant = tenant;
    r->njobs = njobs;
    for (int k = 0; k < njobs; k++) {
        r->jobs[k] = (struct tjob){.run = i, .index = k};
        r->jobs[k].node.next = k + 1 < njobs ? &r->jobs[k + 1].node : NULL;
    }
    assert_int_equal(vase_fairq_push(&f->q, &r->node, uid, tenant, &r->jobs[0].node), 0);
    return i;
}

/* Pushes a run for tenant, all tenants of one uid: the rule within a uid. */
static int push(struct fixture *f, uint32_t tenant, int njobs) {
    return push_uid(f, 1000, tenant, njobs);
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
    assert_int_equal(vase_fairq_push(&f->q, &f->runs[0].node, 1000, 1, NULL), -EINVAL);
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

/*
 * The case a queue fair only among clients gets wrong: uid B has 32 clients with a run each
 * queued, then uid A's one client queues one. A's run leaves after at most one run of B (the
 * one B was handed first), not after all 32; then B's clients take their turns among B's.
 */
static void test_uid_with_many_clients(void **state) {
    struct fixture *f = *state;
    int b[32], b2[32], a;

    for (uint32_t t = 0; t < 32; t++)
        b[t] = push_uid(f, 2000, 100 + t, 2);
    a = push_uid(f, 1000, 1, 2);
    assert_int_equal(pop_run(f), b[0]);
    assert_int_equal(pop_run(f), a);
    for (int t = 1; t < 32; t++)
        assert_int_equal(pop_run(f), b[t]);
    assert_true(vase_fairq_is_empty(&f->q));

    /* A uid with work keeps its turn every other run while the other has 32 clients queued,
     * and each of B's clients has its run out before any of them a second. */
    for (uint32_t t = 0; t < 32; t++) {
        b[t] = push_uid(f, 2000, 100 + t, 1);
        b2[t] = push_uid(f, 2000, 100 + t, 1);
    }
    int a0 = push_uid(f, 1000, 1, 1), a1 = push_uid(f, 1000, 1, 1), a2 = push_uid(f, 1000, 2, 1);
    assert_int_equal(pop_run(f), b[0]);
    assert_int_equal(pop_run(f), a0);
    assert_int_equal(pop_run(f), b[1]);
    assert_int_equal(pop_run(f), a2); /* A's other client before A's first one again */
    assert_int_equal(pop_run(f), b[2]);
    assert_int_equal(pop_run(f), a1);
    for (int t = 3; t < 32; t++)
        assert_int_equal(pop_run(f), b[t]);
    for (int t = 0; t < 32; t++)
        assert_int_equal(pop_run(f), b2[t]);
    assert_true(vase_fairq_is_empty(&f->q));
    assert_counts(&f->q, 0, 0, 0);
}

/* A run that started is finished first, even when another uid arrives meanwhile; a uid that ran
 * dry rejoins at the back of the uids; the counters count tenants of every uid. */
static void test_uids_runs_stay_whole(void **state) {
    struct fixture *f = *state;

    int b0 = push_uid(f, 2000, 20, 3);
    const struct tjob *j = pop(f);
    assert_true(j->run == b0 && j->index == 0);
    int a0 = push_uid(f, 1000, 10, 1);
    int b1 = push_uid(f, 2000, 21, 1);
    int c0 = push_uid(f, 3000, 30, 1);
    assert_counts(&f->q, 3, 1, 3);
    assert_int_equal(vase_fairq_count_tenant(&f->q, 21), 1);
    assert_int_equal(vase_fairq_count_tenant(&f->q, 20), 0);
    for (int k = 1; k < 3; k++) {
        j = pop(f);
        assert_true(j->run == b0 && j->index == k);
    }
    /* B had its turn: A and C go before B's other client. */
    assert_int_equal(pop_run(f), a0);
    int a1 = push_uid(f, 1000, 10, 1); /* A ran dry: back of the uids, behind C and B */
    assert_int_equal(pop_run(f), c0);
    assert_int_equal(pop_run(f), b1);
    assert_int_equal(pop_run(f), a1);
    assert_true(vase_fairq_is_empty(&f->q));
    assert_counts(&f->q, 0, 0, 0);
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
 * The rule, written out plainly: uids in the order they got work, each with its tenants in the
 * order they got work, each with its runs in order. The front uid's front tenant hands out its
 * front run's jobs; then that tenant goes to the back of its uid's tenants if it has runs left,
 * and the uid to the back of the uids if any of its tenants has. A seeded random mix of pushes
 * and pops must give the same jobs, in the same order, and the same counts.
 */
struct model_uid {
    uint32_t uid;
    uint32_t tenants[NTENANTS];
    int runs[NTENANTS][MAX_RUNS]; /* per tenant, in turn order: its runs, in order */
    int nruns[NTENANTS];
    int ntenants;
};

struct model {
    struct model_uid uids[NUIDS]; /* in turn order */
    int nuids;
    int next_job; /* of the front run */
};

static void model_push(struct model *m, uint32_t uid, uint32_t tenant, int run) {
    int u = 0;
    while (u < m->nuids && m->uids[u].uid != uid)
        u++;
    if (u == m->nuids)
        m->uids[m->nuids++] = (struct model_uid){.uid = uid};
    struct model_uid *mu = &m->uids[u];
    int t = 0;
    while (t < mu->ntenants && mu->tenants[t] != tenant)
        t++;
    if (t == mu->ntenants) {
        mu->tenants[mu->ntenants] = tenant;
        mu->nruns[mu->ntenants++] = 0;
    }
    mu->runs[t][mu->nruns[t]++] = run;
}

/* Moves entry 0 of a[n] (each of size bytes) to the back. */
static void rotate(void *a, int n, size_t size, void *tmp) {
    memcpy(tmp, a, size);
    memmove(a, (char *)a + size, (size_t)(n - 1) * size);
    memcpy((char *)a + (size_t)(n - 1) * size, tmp, size);
}

/* The next job as (run, index), or run -1. */
static void model_pop(struct model *m, const struct fixture *f, int *ret_run, int *ret_index) {
    static struct model_uid tmp_uid;
    static int tmp_runs[MAX_RUNS];
    *ret_run = -1;
    if (m->nuids == 0)
        return;
    struct model_uid *mu = &m->uids[0];
    int run = mu->runs[0][0];
    *ret_run = run;
    *ret_index = m->next_job++;
    if (m->next_job < f->runs[run].njobs)
        return;
    m->next_job = 0;
    /* The front tenant loses its front run and goes to the back of its uid's tenants. */
    memmove(mu->runs[0], mu->runs[0] + 1, (size_t)(mu->nruns[0] - 1) * sizeof(int));
    mu->nruns[0]--;
    uint32_t tenant = mu->tenants[0];
    int n = mu->nruns[0];
    memcpy(tmp_runs, mu->runs[0], (size_t)n * sizeof(int));
    for (int t = 1; t < mu->ntenants; t++) {
        mu->tenants[t - 1] = mu->tenants[t];
        mu->nruns[t - 1] = mu->nruns[t];
        memcpy(mu->runs[t - 1], mu->runs[t], (size_t)mu->nruns[t] * sizeof(int));
    }
    mu->ntenants--;
    if (n > 0) {
        mu->tenants[mu->ntenants] = tenant;
        mu->nruns[mu->ntenants] = n;
        memcpy(mu->runs[mu->ntenants], tmp_runs, (size_t)n * sizeof(int));
        mu->ntenants++;
    }
    /* The uid goes to the back of the uids, or leaves them. */
    if (mu->ntenants > 0) {
        rotate(m->uids, m->nuids, sizeof(m->uids[0]), &tmp_uid);
    } else {
        memmove(m->uids, m->uids + 1, (size_t)(m->nuids - 1) * sizeof(m->uids[0]));
        m->nuids--;
    }
}

static void model_counts(const struct model *m, uint32_t tenant, struct vase_fairq_counts *ret,
                         uint32_t *ret_tenant_queued) {
    *ret = (struct vase_fairq_counts){.runs_partial = m->next_job > 0};
    *ret_tenant_queued = 0;
    for (int u = 0; u < m->nuids; u++) {
        const struct model_uid *mu = &m->uids[u];
        for (int t = 0; t < mu->ntenants; t++) {
            uint32_t mine = (uint32_t)mu->nruns[t] - (u == 0 && t == 0 && m->next_job > 0);
            ret->runs_queued += mine;
            ret->tenants_waiting += mine > 0;
            if (mu->tenants[t] == tenant)
                *ret_tenant_queued = mine;
        }
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
            uint32_t uid = 1000 + tenant % NUIDS;
            int run = push_uid(f, uid, tenant, 1 + (int)((x >> 16) % MAX_JOBS));
            model_push(&m, uid, tenant, run);
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
        assert_int_equal(vase_fairq_is_empty(&f->q), m.nuids == 0);
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
        cmocka_unit_test_setup_teardown(test_uid_with_many_clients, setup, teardown),
        cmocka_unit_test_setup_teardown(test_uids_runs_stay_whole, setup, teardown),
        cmocka_unit_test_setup_teardown(test_counts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_against_model, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
