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
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

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
    uint32_t pages_total;
};

/* The calls under test, stopping at the first that fails. */
static int client_cycle(const struct harness_daemon *d, struct vase_client **c,
                        struct vase_seq **s) {
    struct vase_connect_options opts = {
        .runtime_dir = d->dir,
        .name = "alloc-fail",
        .timeout_ms = HARNESS_CLIENT_MS,
    };
    struct vase_geometry g = harness_geometry();
    struct vase_seq_config cfg =
        harness_seq_config(VASE_POLICY_VASE_ATTNV, BUDGET, WINDOW, PROMPT, VASE_MODE_SYNC);
    struct vase_model *m;
    int r;

    if ((r = vase_connect(&opts, c)) < 0)
        return r;
    if ((r = vase_model_register(*c, &g, &m)) < 0)
        return r;
    if ((r = vase_seq_open(*c, m, &cfg, s)) < 0)
        return r;
    if ((r = harness_append_tokens(*s, &g, 1, PROMPT, true)) < 0)
        return r;
    /* One token a call: the last one fires the eviction, whose plan a sync append applies. */
    if ((r = harness_append_tokens(*s, &g, 1, STEPS_TO_FIRST, false)) < 0)
        return r;
    if (r != 1)
        fail_msg("%d plans applied on the way to the first eviction, expected 1", r);
    if (vase_seq_len(*s) != BUDGET)
        fail_msg("length %u after the eviction, expected %u", vase_seq_len(*s), BUDGET);
    if ((r = vase_seq_poll(*s)) < 0)
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
    int r = client_cycle(&f->h.d, &c, &s);
    alloc_fail_disarm();
    /* After a failure, what was made is undone the ordinary way; tracked blocks must go. */
    if (s)
        vase_seq_close(s);
    vase_disconnect(c);

    /* The daemon forgets the client and takes its pages back whichever call failed. */
    assert_int_equal(harness_wait_clients(&f->h.d, 0, HARNESS_WAIT_MS), 0);
    assert_int_equal(harness_wait_pages_free(&f->h.d, f->pages_total, HARNESS_WAIT_MS, NULL), 0);
    struct harness_status st;
    assert_int_equal(harness_status(&f->h.d, &st), 0);
    assert_int_equal(st.seqs, 0);
    return r;
}

static void test_client_cycle(void **state) {
    struct fixture *f = *state;
    struct harness_status st;
    assert_int_equal(harness_status(&f->h.d, &st), 0);
    f->pages_total = st.pages_total;
    assert_int_equal(st.pages_free, st.pages_total);
    assert_true(alloc_fail_sweep("libvase: connect, register, open, evict, close, disconnect",
                                 step_client, f, 0) >= 5);
    /* Every step's eviction that ran to the end was counted by the daemon. */
    assert_int_equal(harness_status(&f->h.d, &st), 0);
    assert_true(st.evictions_total >= 1);
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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
