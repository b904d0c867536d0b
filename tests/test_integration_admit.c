/* SPDX-License-Identifier: MIT */

/*
 * Admission wait against a real vased: an open that finds the arena full and asks to wait is
 * parked (Status opens_waiting counts it) and admitted, in arrival order, once closes free
 * enough memory; refused with -ENOSPC when its wait passes; refused at once without a wait, for
 * a quota or for a sequence larger than the arena; dropped with nothing held when its client
 * dies. Every ordering comes from Status (an open is parked before the close that admits it),
 * never from sleeping, and the only time bound checked is that a wait is not cut short.
 */

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "integration/harness.h"

/* Long enough that no test ends by it: a parked open these tests admit is admitted by a close. */
#define LONG_WAIT_MS 120000

static int setup(void **state) {
    return harness_fixture_setup(state, sizeof(struct harness_fixture), NULL);
}

/* A streaming sequence of the harness model with kv_pages KV pages of one granule each
 * (budget + window + slack = kv_pages * 64 tokens), and the given admission wait. */
static struct vase_seq_config seq_of(uint32_t kv_pages, int32_t wait_ms) {
    struct vase_seq_config cfg =
        harness_seq_config(VASE_POLICY_STREAMING, kv_pages * 64 - 64, 32, 0, 0);
    cfg.admission_wait_ms = wait_ms;
    return cfg;
}

/* A full arena; another client's open with a wait is parked, and admitted when a sequence of
 * the first closes. */
static void test_admitted_after_close(void **state) {
    struct harness_fixture *f = *state;
    struct vase_geometry g = harness_geometry();
    struct vase_model *m0, *m1;
    assert_int_equal(harness_engine_open(&f->d, "fill", &g, &f->c[0], &m0), 0);
    assert_int_equal(harness_engine_open(&f->d, "waiter", &g, &f->c[1], &m1), 0);
    struct vase_seq *seqs[64] = {0};
    int n = harness_fill(f->c[0], m0, seq_of(12, 0), seqs, 64);
    assert_true(n >= 2);
    struct harness_status full = harness_status_of(&f->d);

    struct harness_opener o = {.c = f->c[1], .m = m1, .cfg = seq_of(12, LONG_WAIT_MS)};
    harness_opener_start(&o);
    harness_wait_parked(&f->d, 1);
    /* Parked holds nothing. */
    struct harness_status st = harness_status_of(&f->d);
    assert_int_equal(st.bytes_free, full.bytes_free);
    assert_int_equal(st.seqs, (uint32_t)n);

    assert_int_equal(vase_seq_close(seqs[0]), 0);
    seqs[0] = NULL;
    harness_opener_join(&o);
    assert_int_equal(o.r, 0);
    assert_non_null(o.s);
    st = harness_status_of(&f->d);
    assert_int_equal(st.opens_waiting, 0);
    assert_int_equal(st.seqs, (uint32_t)n);
    /* The admitted sequence works like any other. */
    assert_int_equal(harness_append_tokens(o.s, &g, 1, 8, true), 0);
    assert_int_equal(vase_seq_close(o.s), 0);
    harness_close_all(seqs, n);
    harness_assert_all_free(&f->d);
}

/* No room is freed: the parked open is refused with -ENOSPC once its wait has passed, not
 * before, saying how long it waited; nothing is left parked or held. */
static void test_wait_expires(void **state) {
    struct harness_fixture *f = *state;
    struct vase_geometry g = harness_geometry();
    struct vase_model *m;
    assert_int_equal(harness_engine_open(&f->d, "expire", &g, &f->c[0], &m), 0);
    struct vase_seq *seqs[64] = {0};
    int n = harness_fill(f->c[0], m, seq_of(12, 0), seqs, 64);
    struct harness_status full = harness_status_of(&f->d);

    struct vase_seq_config cfg = seq_of(12, 300);
    struct vase_seq *s = NULL;
    double t0 = harness_now();
    assert_int_equal(vase_seq_open(f->c[0], m, &cfg, &s), -ENOSPC);
    double waited = harness_now() - t0;
    assert_null(s);
    assert_true(waited >= 0.3);
    assert_non_null(strstr(vase_last_error(f->c[0]), "waited 300 ms"));
    struct harness_status st = harness_status_of(&f->d);
    assert_int_equal(st.opens_waiting, 0);
    assert_int_equal(st.bytes_free, full.bytes_free);
    assert_int_equal(st.seqs, (uint32_t)n);

    /* The daemon's default applies to an open that asks for it (-1). */
    assert_int_equal(harness_config_set(&f->d, "admission_wait_ms", "200"), 0);
    cfg.admission_wait_ms = -1;
    t0 = harness_now();
    assert_int_equal(vase_seq_open(f->c[0], m, &cfg, &s), -ENOSPC);
    assert_true(harness_now() - t0 >= 0.2);
    assert_non_null(strstr(vase_last_error(f->c[0]), "waited 200 ms"));
    harness_close_all(seqs, n);
    harness_assert_all_free(&f->d);
}

/* Refused at once: no wait (0, or the default 0), a sequence larger than the whole arena, a
 * quota; out-of-range waits are -EINVAL. None of them is parked. */
static void test_no_wait(void **state) {
    struct harness_fixture *f = *state;
    struct vase_geometry g = harness_geometry();
    struct vase_model *m;
    assert_int_equal(harness_engine_open(&f->d, "nowait", &g, &f->c[0], &m), 0);
    struct vase_seq *seqs[64] = {0};
    int n = harness_fill(f->c[0], m, seq_of(12, 0), seqs, 64);
    struct vase_seq *s = NULL;

    struct vase_seq_config cfg = seq_of(12, 0);
    assert_int_equal(vase_seq_open(f->c[0], m, &cfg, &s), -ENOSPC);
    assert_null(strstr(vase_last_error(f->c[0]), "waited"));
    cfg.admission_wait_ms = -1; /* the daemon's default: 0 */
    assert_int_equal(vase_seq_open(f->c[0], m, &cfg, &s), -ENOSPC);
    assert_null(strstr(vase_last_error(f->c[0]), "waited"));

    /* Waiting cannot make room for more than the arena: refused at once, not after the wait. */
    struct vase_seq_config huge = seq_of(HARNESS_ARENA_PAGES + 1, LONG_WAIT_MS);
    assert_int_equal(vase_seq_open(f->c[0], m, &huge, &s), -ENOSPC);
    assert_non_null(strstr(vase_last_error(f->c[0]), "more than the whole arena"));

    /* A quota refusal does not wait either. */
    assert_int_equal(harness_config_set(&f->d, "max_seqs_per_client", "1"), 0);
    cfg.admission_wait_ms = LONG_WAIT_MS;
    assert_int_equal(vase_seq_open(f->c[0], m, &cfg, &s), -EDQUOT);
    assert_null(s);

    cfg.admission_wait_ms = -2;
    assert_int_equal(vase_seq_open(f->c[0], m, &cfg, &s), -EINVAL);
    cfg.admission_wait_ms = VASE_MAX_ADMISSION_WAIT_MS + 1;
    assert_int_equal(vase_seq_open(f->c[0], m, &cfg, &s), -EINVAL);
    assert_null(s);
    assert_int_equal(harness_status_of(&f->d).opens_waiting, 0);
    harness_close_all(seqs, n);
    harness_assert_all_free(&f->d);
}

struct child_waiter {
    const struct harness_daemon *d;
    int go_fd; /* a byte arrives once the arena is full */
};

/* The child: connects, waits for the parent to fill the arena, then opens with a long wait
 * (it is killed while parked). */
static int run_child_waiter(void *arg) {
    struct child_waiter *cw = arg;
    struct vase_geometry g = harness_geometry();
    struct vase_client *c;
    struct vase_model *m;
    char b;
    if (harness_engine_open(cw->d, "doomed", &g, &c, &m) < 0 || read(cw->go_fd, &b, 1) != 1)
        return 2;
    struct vase_seq_config cfg = seq_of(12, LONG_WAIT_MS);
    struct vase_seq *s;
    int r = vase_seq_open(c, m, &cfg, &s);
    fprintf(stderr, "child: the open returned %d\n", r);
    return 3;
}

/* The client of a parked open dies: the open is dropped, nothing is reserved for it, and a
 * later open gets the memory. */
static void test_waiter_dies(void **state) {
    struct harness_fixture *f = *state;
    int go[2];
    assert_int_equal(pipe(go), 0);
    struct child_waiter cw = {.d = &f->d, .go_fd = go[0]};
    pid_t pid;
    assert_int_equal(harness_fork(run_child_waiter, &cw, &pid), 0);
    close(go[0]);

    struct vase_geometry g = harness_geometry();
    struct vase_model *m;
    assert_int_equal(harness_engine_open(&f->d, "survivor", &g, &f->c[0], &m), 0);
    assert_int_equal(harness_wait_clients(&f->d, 2, HARNESS_WAIT_MS), 0);
    struct vase_seq *seqs[64] = {0};
    int n = harness_fill(f->c[0], m, seq_of(12, 0), seqs, 64);
    struct harness_status full = harness_status_of(&f->d);
    assert_int_equal(write(go[1], "x", 1), 1);
    close(go[1]);
    harness_wait_parked(&f->d, 1);

    assert_int_equal(kill(pid, SIGKILL), 0);
    int status;
    assert_int_equal(harness_wait_pid(pid, HARNESS_WAIT_MS, &status), 0);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(harness_wait_clients(&f->d, 1, HARNESS_WAIT_MS), 0);
    struct harness_status st = harness_status_of(&f->d);
    assert_int_equal(st.opens_waiting, 0);
    assert_int_equal(st.bytes_free, full.bytes_free);
    assert_int_equal(st.seqs, (uint32_t)n);

    /* The memory a close frees goes to whoever asks next, not to the dead waiter. */
    assert_int_equal(vase_seq_close(seqs[0]), 0);
    struct vase_seq_config cfg = seq_of(12, 0);
    assert_int_equal(vase_seq_open(f->c[0], m, &cfg, &seqs[0]), 0);
    harness_close_all(seqs, n);
    harness_assert_all_free(&f->d);
}

/* Closes seqs[0 .. n): both parked opens are admitted, the first one first, and leave. */
static void admitted_in_order(const struct harness_daemon *d, struct vase_seq **seqs, int n,
                              struct harness_opener *first, struct harness_opener *second) {
    harness_close_all(seqs, n);
    harness_opener_join(first);
    harness_opener_join(second);
    assert_int_equal(first->r, 0);
    assert_int_equal(second->r, 0);
    assert_true(vase_seq_id(first->s) < vase_seq_id(second->s));
    assert_int_equal(vase_seq_close(first->s), 0);
    assert_int_equal(vase_seq_close(second->s), 0);
    harness_assert_all_free(d);
}

/* Two parked opens, a large one first: a close that makes room for the small one only admits
 * neither (nothing overtakes the first waiter); once the large one fits, it is admitted first. */
static void test_fifo(void **state) {
    struct harness_fixture *f = *state;
    struct vase_geometry g = harness_geometry();
    struct vase_model *m0, *m1, *m2;
    assert_int_equal(harness_engine_open(&f->d, "fill", &g, &f->c[0], &m0), 0);
    assert_int_equal(harness_engine_open(&f->d, "large", &g, &f->c[1], &m1), 0);
    assert_int_equal(harness_engine_open(&f->d, "small", &g, &f->c[2], &m2), 0);
    /* Sequences of 8 KV pages fill the arena; less than 8 granules stay free. */
    struct vase_seq *seqs[64] = {0};
    int n = harness_fill(f->c[0], m0, seq_of(8, 0), seqs, 64);
    assert_true(n >= 4);
    assert_true(harness_status_of(&f->d).bytes_free < 8 * (uint64_t)HARNESS_PAGE_BYTES);

    /* Large: 20 KV pages, more than one closed sequence leaves free. Small: one like those. */
    struct harness_opener large = {.c = f->c[1], .m = m1, .cfg = seq_of(20, LONG_WAIT_MS)};
    struct harness_opener small = {.c = f->c[2], .m = m2, .cfg = seq_of(8, 20000)};
    harness_opener_start(&large);
    harness_wait_parked(&f->d, 1);
    harness_opener_start(&small);
    harness_wait_parked(&f->d, 2);

    /* Room for the small one, not the large one: both stay parked. */
    assert_int_equal(vase_seq_close(seqs[0]), 0);
    seqs[0] = NULL;
    assert_int_equal(harness_status_of(&f->d).opens_waiting, 2);

    admitted_in_order(&f->d, seqs, n, &large, &small);
}

/* Three engines: c[0] "fill", which fills the arena with sequences of 12 KV pages (into seqs,
 * the number returned), c[1] "large" and c[2] "small", whose models go to *m0, *m1, *m2. */
static int fill_large_small(struct harness_fixture *f, struct vase_model **m0,
                            struct vase_model **m1, struct vase_model **m2,
                            struct vase_seq **seqs) {
    struct vase_geometry g = harness_geometry();
    assert_int_equal(harness_engine_open(&f->d, "fill", &g, &f->c[0], m0), 0);
    assert_int_equal(harness_engine_open(&f->d, "large", &g, &f->c[1], m1), 0);
    assert_int_equal(harness_engine_open(&f->d, "small", &g, &f->c[2], m2), 0);
    return harness_fill(f->c[0], *m0, seq_of(12, 0), seqs, 64);
}

/* A new open never overtakes opens that wait for its arena, not even into memory that is free
 * now: without a wait it is refused, with one it waits behind them. */
static void test_no_overtaking(void **state) {
    struct harness_fixture *f = *state;
    struct vase_model *m0, *m1, *m2;
    struct vase_seq *seqs[64] = {0};
    int n = fill_large_small(f, &m0, &m1, &m2, seqs);
    assert_true(n >= 3);
    struct harness_opener large = {.c = f->c[1], .m = m1, .cfg = seq_of(20, LONG_WAIT_MS)};
    harness_opener_start(&large);
    harness_wait_parked(&f->d, 1);
    /* Room for a small one, not for the large one. */
    assert_int_equal(vase_seq_close(seqs[0]), 0);
    seqs[0] = NULL;
    assert_true(harness_status_of(&f->d).bytes_free >= 9 * (uint64_t)HARNESS_PAGE_BYTES);
    struct vase_seq *s = NULL;
    struct vase_seq_config now = seq_of(8, 0);
    assert_int_equal(vase_seq_open(f->c[2], m2, &now, &s), -ENOSPC);
    assert_non_null(strstr(vase_last_error(f->c[2]), "earlier opens wait for room"));
    struct harness_opener small = {.c = f->c[2], .m = m2, .cfg = seq_of(8, LONG_WAIT_MS)};
    harness_opener_start(&small);
    harness_wait_parked(&f->d, 2);

    admitted_in_order(&f->d, seqs, n, &large, &small);
}

/* The first waiter's wait passes: the one behind it, which fits, is admitted then, not at the
 * end of its own wait. */
static void test_expired_head_unblocks(void **state) {
    struct harness_fixture *f = *state;
    struct vase_model *m0, *m1, *m2;
    struct vase_seq *seqs[64] = {0};
    int n = fill_large_small(f, &m0, &m1, &m2, seqs);
    struct harness_opener large = {.c = f->c[1], .m = m1, .cfg = seq_of(20, 2000)};
    struct harness_opener small = {.c = f->c[2], .m = m2, .cfg = seq_of(8, 20000)};
    harness_opener_start(&large);
    harness_wait_parked(&f->d, 1);
    harness_opener_start(&small);
    harness_wait_parked(&f->d, 2);
    assert_int_equal(vase_seq_close(seqs[0]), 0);
    seqs[0] = NULL;
    harness_opener_join(&large);
    assert_int_equal(large.r, -ENOSPC);
    harness_opener_join(&small);
    assert_int_equal(small.r, 0);
    assert_int_equal(vase_seq_close(small.s), 0);
    harness_close_all(seqs, n);
    harness_assert_all_free(&f->d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_admitted_after_close, setup, harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_wait_expires, setup, harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_no_wait, setup, harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_waiter_dies, setup, harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_fifo, setup, harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_no_overtaking, setup, harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_expired_head_unblocks, setup,
                                        harness_fixture_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
