/* SPDX-License-Identifier: MIT */

/*
 * Allocation-failure sweep of libvase against a real vased: connect, register a model, open a
 * sync sequence, append up to an eviction and apply its plan, poll, close, disconnect. The
 * daemon is another process; only this process's allocations (libvase's and this file's) go
 * through tests/alloc_fail.c. ZeroMQ's and protobuf-c's own allocations are made inside their
 * shared libraries and are not injected.
 *
 * Every failure must surface as -ENOMEM from the call that met it, the client must free what
 * it allocated, and the daemon must end up as if the client had never come: after each step
 * the client has gone and every page is free again.
 */

#include <errno.h>
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

#include <cmocka.h>

#include "alloc_fail.h"
#include "integration/harness.h"

#define BUDGET 32
#define WINDOW 16
#define PROMPT 8
/* Appends from the prompt to the first eviction, which fires at len BUDGET + WINDOW. */
#define STEPS_TO_FIRST (BUDGET + WINDOW - PROMPT)

struct fixture {
    struct harness_fixture h;
};

/*
 * One client's life, stopping at the first call that fails: connect, register, open a sync
 * sequence of policy, the prompt, statistics for every layer when with_stats, appends up to the
 * first eviction (whose plan the sync append applies and commits), close, disconnect.
 */
static int client_life(const struct harness_daemon *d, enum vase_policy policy, bool with_stats,
                       struct vase_client **c, struct vase_seq **s) {
    struct vase_geometry g = harness_geometry();
    struct vase_seq_config cfg = harness_seq_config(policy, BUDGET, WINDOW, PROMPT, VASE_MODE_SYNC);
    struct vase_model *m;
    float values[2 * PROMPT];
    int r;

    for (size_t i = 0; i < 2 * PROMPT; i++)
        values[i] = (float)i / 16;
    if ((r = harness_connect(d, "alloc-fail", c)) < 0)
        return r;
    if ((r = vase_model_register(*c, &g, &m)) < 0)
        return r;
    if ((r = vase_seq_open(*c, m, &cfg, s)) < 0)
        return r;
    if ((r = harness_append_tokens(*s, &g, 1, PROMPT, true)) < 0)
        return r;
    for (uint32_t l = 0; with_stats && l < g.layers; l++)
        if ((r = vase_seq_push_stats(*s, l, VASE_STATS_ACC_ADD, values, PROMPT)) < 0)
            return r;
    /* A refused push is returned by the sequence's next call once its reply has come. */
    if (with_stats && (r = vase_seq_flush(*s)) < 0)
        return r;
    /* One token a call: the last one fires the eviction, whose plan a sync append applies. */
    if ((r = harness_append_tokens(*s, &g, 1, STEPS_TO_FIRST, false)) < 0)
        return r;
    if (r != 1)
        fail_msg("%d plans applied on the way to the first eviction, expected 1", r);
    if (vase_seq_len(*s) != BUDGET)
        fail_msg("length %u after the eviction, expected %u", vase_seq_len(*s), BUDGET);
    /* The commit's reply is read here, so a refused commit shows. */
    if ((r = vase_seq_flush(*s)) < 0)
        return r;
    r = vase_seq_close(*s);
    *s = NULL;
    if (r < 0)
        return r;
    *c = vase_disconnect(*c);
    return 0;
}

static int step_client(void *ctx) {
    struct fixture *f = ctx;
    struct vase_client *c = NULL;
    struct vase_seq *s = NULL;

    alloc_fail_arm();
    int r = client_life(&f->h.d, VASE_POLICY_VASE_ATTNV, false, &c, &s);
    alloc_fail_disarm();
    /* After a failure, what was made is undone the ordinary way; tracked blocks must go. */
    if (s)
        vase_seq_close(s);
    vase_disconnect(c);

    /* The daemon forgets the client and takes its pages back whichever call failed. */
    assert_int_equal(harness_wait_clients(&f->h.d, 0, HARNESS_WAIT_MS), 0);
    assert_int_equal(harness_wait_bytes_pages(&f->h.d, 0, HARNESS_WAIT_MS, NULL), 0);
    struct harness_status st;
    assert_int_equal(harness_status(&f->h.d, &st), 0);
    assert_int_equal(st.seqs, 0);
    return r;
}

static void test_client_cycle(void **state) {
    struct fixture *f = *state;
    struct harness_status st;
    assert_int_equal(harness_status(&f->h.d, &st), 0);
    assert_int_equal(st.bytes_free, st.bytes_total);
    assert_int_equal(st.bytes_pages, 0);
    assert_true(alloc_fail_sweep("libvase: connect, register, open, evict, close, disconnect",
                                 step_client, f, 0) >= 5);
    /* Every step's eviction that ran to the end was counted by the daemon. */
    assert_int_equal(harness_status(&f->h.d, &st), 0);
    assert_true(st.evictions_total >= 1);
}

/*
 * The daemon's side: build/tests/vased_alloc_fail fails the Nth allocation its main thread
 * makes once it is ready (tests/vased_alloc_fail.c), for N = 1, 2, ... until a run reaches no
 * injected failure. Each run takes a fresh daemon through one client's life with an h2o sync
 * sequence: connect, register, open, the prompt, statistics for every layer, appends up to an
 * eviction whose plan is applied and committed, close, disconnect. Whatever request met the
 * failure must be refused with -ENOMEM (or its failure must stay inside the daemon), every
 * other call must succeed, and afterwards the daemon must still answer Ping and Status, hold
 * no client and no page, exit 0 on SIGTERM and have freed every block it allocated while armed.
 */
#define HOOK_PROGRAM "tests/vased_alloc_fail"

/* The hook's report in the daemon's log: 1 if allocation n failed, 0 if it was not reached,
 * -EBADMSG without a report; the blocks left in *ret_left. */
static int hook_report(const struct harness_daemon *d, unsigned n, unsigned *ret_left) {
    FILE *f = fopen(d->log, "re");
    if (!f)
        return -errno;
    char line[512], want[64];
    int found = -EBADMSG;
    snprintf(want, sizeof(want), "vased_alloc_fail: allocation %u ", n);
    while (fgets(line, sizeof(line), f)) {
        char *p = strstr(line, want);
        char what[16];
        if (p && sscanf(p + strlen(want), "%15[a-z ], %u blocks left", what, ret_left) == 2)
            found = strcmp(what, "failed") == 0 ? 1 : 0;
    }
    fclose(f);
    return found;
}

/* One run with the daemon's nth allocation failing; whether it was reached (1) or not (0). */
static int daemon_step(unsigned n) {
    struct harness_daemon d = {0};
    struct vase_client *c = NULL;
    struct vase_seq *s = NULL;
    char arg[16];

    snprintf(arg, sizeof(arg), "%u", n);
    assert_int_equal(setenv("VASE_VASED_PROGRAM", HOOK_PROGRAM, 1), 0);
    assert_int_equal(setenv("VASE_ALLOC_FAIL_AFTER_READY", arg, 1), 0);
    int r = harness_daemon_start(&d, NULL);
    unsetenv("VASE_VASED_PROGRAM");
    unsetenv("VASE_ALLOC_FAIL_AFTER_READY");
    if (r != 0)
        fail_msg("daemon allocation %u: the daemon did not start: %s", n, vase_strerror(r));

    r = client_life(&d, VASE_POLICY_H2O, true, &c, &s);
    if (s)
        vase_seq_close(s);
    vase_disconnect(c);
    if (r != 0 && r != -ENOMEM) {
        harness_daemon_dump_log(&d);
        fail_msg("daemon allocation %u failed and a client call returned %d (%s), not -ENOMEM", n,
                 r, vase_strerror(r));
    }

    /* The daemon keeps serving, and has forgotten the client and its pages. The one injected
     * failure may fall on these requests too, when the scenario made fewer allocations: a
     * request is then refused with ENOMEM once and answered the next time. */
    int pr = harness_ping(&d);
    if (pr == -ENOMEM)
        pr = harness_ping(&d);
    assert_int_equal(pr, 0);
    struct harness_status st = {0};
    bool settled = false;
    unsigned refused = 0;
    for (double end = harness_now() + HARNESS_WAIT_MS / 1000.0; !settled;) {
        pr = harness_status(&d, &st);
        if (pr == -ENOMEM && refused++ == 0)
            continue;
        assert_int_equal(pr, 0);
        settled = st.clients == 0 && st.seqs == 0 && st.bytes_pages == 0 &&
                  st.bytes_free == st.bytes_total;
        if (!settled && harness_now() > end)
            fail_msg("daemon allocation %u: %u clients, %u sequences, %llu bytes in pages, %llu "
                     "of %llu bytes free",
                     n, st.clients, st.seqs, (unsigned long long)st.bytes_pages,
                     (unsigned long long)st.bytes_free, (unsigned long long)st.bytes_total);
        if (!settled)
            harness_sleep_ms(10);
    }

    int status;
    assert_int_equal(harness_daemon_stop(&d, SIGTERM, &status), 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        harness_daemon_dump_log(&d);
        fail_msg("daemon allocation %u failed and vased ended with status 0x%x", n, status);
    }
    unsigned left = 0;
    int reached = hook_report(&d, n, &left);
    if (reached < 0 || left != 0) {
        harness_daemon_dump_log(&d);
        fail_msg("daemon allocation %u: %s", n,
                 reached < 0 ? "no report from the hook" : "blocks left allocated at exit");
    }
    if (!reached && r != 0)
        fail_msg("no injected failure, yet a client call returned %d", r);
    harness_daemon_free(&d);
    return reached;
}

static void test_daemon_handlers(void **state) {
    (void)state;
    unsigned n;
    for (n = 1; daemon_step(n); n++)
        if (n > 10000)
            fail_msg("no end to the daemon's allocations");
    printf("daemon handlers: %u allocation failure points, daemon kept serving\n", n - 1);
    assert_true(n - 1 >= 5);
}

static int setup(void **state) {
    return harness_fixture_setup(state, sizeof(struct fixture), NULL);
}

static int teardown(void **state) {
    alloc_fail_disarm(); /* a failed assertion may leave a step armed */
    return harness_fixture_teardown(state);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_client_cycle, setup, teardown),
        cmocka_unit_test(test_daemon_handlers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
