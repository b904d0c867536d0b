/* SPDX-License-Identifier: MIT */

/*
 * A sequence never sees another sequence's keys, values or queries, against a real vased
 * through the real libvase. Client A fills the whole arena with sequences and writes a pattern
 * into every K and V slot and every query entry they hold, then gives them back (closing them,
 * or by disconnecting); client B, another session in the same arena, fills it again (so it gets
 * every page A had) and reads each slot and query entry: all zero, as vased zeroes the pages a
 * sequence releases before it hands them out again.
 */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "integration/harness.h"

#define MOST 64
#define BUDGET 128u
#define WINDOW 64u

static int setup(void **state) {
    return harness_fixture_setup(state, sizeof(struct harness_fixture), NULL);
}

/* One row at p (n bytes): filled with 0xa5 when write, else the count of its bytes not zero. */
static uint64_t touch(unsigned char *p, size_t n, bool write) {
    uint64_t dirty = 0;
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) {
        if (write)
            p[i] = 0xa5;
        else
            dirty += p[i] != 0;
    }
    return dirty;
}

/* Visits every byte a sequence can read: K and V of every slot, head and layer, and the query
 * ring's entries (2 * window positions). write: fills them with 0xa5; else returns how many are
 * not zero. */
static uint64_t visit(struct vase_seq *s, const struct vase_geometry *g, bool write) {
    size_t row = (size_t)g->head_dim * vase_dtype_size(g->dtype);
    uint64_t dirty = 0;
    for (uint32_t l = 0; l < g->layers; l++) {
        for (uint32_t slot = 0; slot < vase_seq_capacity(s); slot++)
            for (int kv = 0; kv < 2; kv++)
                for (uint32_t h = 0; h < g->kv_heads; h++) {
                    dirty += touch(vase_seq_kv_ptr(s, l, (enum vase_kv)kv, slot, h), row, write);
                }
        for (uint64_t pos = 0; pos < 2 * WINDOW; pos++)
            for (uint32_t h = 0; h < g->q_heads; h++) {
                dirty += touch(vase_seq_query_ptr(s, l, pos, h), row, write);
            }
    }
    return dirty;
}

/* A fills the arena and writes everything, gives it back (disconnecting when drop, else
 * closing each sequence), then B fills it and finds zeros only. */
static void first_then_second(struct harness_fixture *f, bool drop) {
    struct vase_geometry g = harness_geometry();
    struct vase_seq_config cfg =
        harness_seq_config(VASE_POLICY_VASE_ATTNV, BUDGET, WINDOW, 0, VASE_MODE_SYNC);
    struct vase_seq *a[MOST] = {0}, *b[MOST] = {0};
    struct vase_client *ca = NULL, *cb = NULL;
    struct vase_model *ma = NULL, *mb = NULL;

    assert_int_equal(harness_engine_open(&f->d, "writer", &g, &ca, &ma), 0);
    int na = harness_fill(ca, ma, cfg, a, MOST);
    assert_true(na >= 2);
    for (int i = 0; i < na; i++)
        assert_int_equal(visit(a[i], &g, true), 0);
    if (drop) {
        vase_disconnect(ca);
        harness_assert_all_free(&f->d);
    } else {
        harness_close_all(a, na);
        vase_disconnect(ca);
    }

    assert_int_equal(harness_engine_open(&f->d, "reader", &g, &cb, &mb), 0);
    int nb = harness_fill(cb, mb, cfg, b, MOST);
    /* The same arena, the same geometry: B holds every page A held. */
    assert_int_equal(nb, na);
    uint64_t dirty = 0;
    for (int i = 0; i < nb; i++)
        dirty += visit(b[i], &g, false);
    if (dirty)
        print_error("%llu bytes of the first client's sequences seen by the second's\n",
                    (unsigned long long)dirty);
    assert_int_equal(dirty, 0);
    harness_close_all(b, nb);
    vase_disconnect(cb);
}

static void test_closed_pages_are_zeroed(void **state) {
    first_then_second(*state, false);
}

static void test_dropped_client_pages_are_zeroed(void **state) {
    first_then_second(*state, true);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_closed_pages_are_zeroed, setup,
                                        harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_dropped_client_pages_are_zeroed, setup,
                                        harness_fixture_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
