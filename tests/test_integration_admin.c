/* SPDX-License-Identifier: MIT */

/*
 * The administrative API of libvase (vase_admin.h) against a real vased: every request, the
 * daemon's refusals with their words, an unknown runtime directory, and the event stream with
 * an event the test causes. vasectl is built on the same calls (test_integration_tools.c runs
 * it as a user would).
 */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "integration/harness.h"
#include "vase_admin.h"

struct fixture {
    struct harness_fixture h;
    struct vase_model *m;
    struct vase_admin *a;
};

static int setup(void **state) {
    static const char *const args[] = {"--stats-interval=0", NULL};
    int r = harness_fixture_setup(state, sizeof(struct fixture), args);
    if (r < 0)
        return r;
    struct fixture *f = *state;
    r = vase_admin_new(&(struct vase_admin_options){.runtime_dir = f->h.d.dir}, &f->a);
    if (r == 0)
        r = vase_admin_connect(f->a);
    return r < 0 ? -1 : 0;
}

static int teardown(void **state) {
    struct fixture *f = *state;
    if (f)
        f->a = vase_admin_free(f->a);
    return harness_fixture_teardown(state);
}

static void test_requests(void **state) {
    struct fixture *f = *state;
    struct vase_geometry g = harness_geometry();
    uint64_t inc = 0;

    assert_int_equal(vase_admin_connect(f->a), -EALREADY);
    assert_int_equal(vase_admin_ping(f->a, &inc), 0);
    assert_int_equal(inc, f->h.d.incarnation);
    assert_int_equal(harness_engine_open(&f->h.d, "admin-engine", &g, &f->h.c[0], &f->m), 0);

    Vase__StatusReply *st = NULL;
    assert_int_equal(vase_admin_status(f->a, &st), 0);
    assert_int_equal(st->clients, 1);
    assert_int_equal(st->n_arenas, 1);
    assert_int_equal(st->arenas[0]->bytes_total, HARNESS_ARENA_BYTES);
    protobuf_c_message_free_unpacked(&st->base, NULL);

    Vase__ClientsReply *cr = NULL;
    assert_int_equal(vase_admin_clients(f->a, &cr), 0);
    assert_int_equal(cr->n_clients, 1);
    assert_string_equal(cr->clients[0]->name, "admin-engine");
    uint32_t client_id = cr->clients[0]->client_id;
    protobuf_c_message_free_unpacked(&cr->base, NULL);

    struct vase_seq *s;
    struct vase_seq_config cfg = harness_seq_config(VASE_POLICY_SNAPKV, 64, 16, 32, VASE_MODE_SYNC);
    assert_int_equal(vase_seq_open(f->h.c[0], f->m, &cfg, &s), 0);

    Vase__SeqsReply *sr = NULL;
    assert_int_equal(vase_admin_seqs(f->a, client_id, &sr), 0);
    assert_int_equal(sr->n_seqs, 1);
    uint32_t seq_id = sr->seqs[0]->seq_id;
    assert_int_equal(seq_id, vase_seq_id(s));
    protobuf_c_message_free_unpacked(&sr->base, NULL);

    Vase__SeqInfo *si = NULL;
    assert_int_equal(vase_admin_seq(f->a, seq_id, &si), 0);
    assert_string_equal(si->policy, "snapkv");
    assert_int_equal(si->budget, 64);
    protobuf_c_message_free_unpacked(&si->base, NULL);

    /* A refusal: -ENOENT with the daemon's words, and *ret untouched. */
    si = NULL;
    assert_int_equal(vase_admin_seq(f->a, seq_id + 1000, &si), -ENOENT);
    assert_null(si);
    assert_true(vase_admin_last_error(f->a)[0] != '\0');
    assert_int_equal(vase_seq_close(s), 0);
}

static void test_config(void **state) {
    struct fixture *f = *state;
    Vase__ConfigReply *cr = NULL;

    assert_int_equal(vase_admin_config_get(f->a, NULL, &cr), 0);
    assert_true(cr->n_entries > 1);
    protobuf_c_message_free_unpacked(&cr->base, NULL);

    assert_int_equal(vase_admin_config_set(f->a, "default_slack", "-1", &cr), 0);
    assert_int_equal(cr->n_entries, 1);
    assert_string_equal(cr->entries[0]->key, "default_slack");
    assert_string_equal(cr->entries[0]->value, "-1");
    protobuf_c_message_free_unpacked(&cr->base, NULL);

    assert_int_equal(vase_admin_config_get(f->a, "default_slack", &cr), 0);
    assert_string_equal(cr->entries[0]->value, "-1");
    protobuf_c_message_free_unpacked(&cr->base, NULL);

    cr = NULL;
    assert_int_equal(vase_admin_config_get(f->a, "no_such_setting", &cr), -ENOENT);
    assert_null(cr);
    assert_int_equal(vase_admin_config_set(NULL, "default_slack", "1", &cr), -EINVAL);
}

/* Events are made until one arrives, since a subscriber misses what is published before its
 * subscription is in place (nothing tells the test when that is); a short timeout keeps each
 * wait brief. */
static void test_events(void **state) {
    struct fixture *f = *state;
    struct vase_admin *a = NULL;
    struct vase_admin_events *ev = NULL;
    struct vase_geometry g = harness_geometry();
    struct vase_seq_config cfg = harness_seq_config(VASE_POLICY_STREAMING, 128, 32, 0, 0);
    char topic[64];
    Vase__Event *e = NULL;
    int r = 0;

    assert_int_equal(
        vase_admin_new(&(struct vase_admin_options){.runtime_dir = f->h.d.dir, .timeout_ms = 250},
                       &a),
        0);
    assert_int_equal(vase_admin_connect(a), 0);
    assert_int_equal(vase_admin_events_subscribe(a, &ev), 0);
    assert_int_equal(harness_engine_open(&f->h.d, "admin-events", &g, &f->h.c[0], &f->m), 0);
    double end = harness_now() + HARNESS_WAIT_MS / 1000.0;
    while (r != 1 && harness_now() < end) {
        struct vase_seq *s;
        assert_int_equal(vase_seq_open(f->h.c[0], f->m, &cfg, &s), 0);
        assert_int_equal(vase_seq_close(s), 0);
        do
            r = vase_admin_events_next(ev, topic, sizeof(topic), &e);
        while (r == -EINTR);
        assert_true(r >= 0);
    }
    assert_int_equal(r, 1);
    if (strcmp(topic, "client") == 0)
        assert_int_equal(e->body_case, VASE__EVENT__BODY_CLIENT_JOIN);
    else {
        assert_string_equal(topic, "seq");
        assert_true(e->body_case == VASE__EVENT__BODY_SEQ_OPEN ||
                    e->body_case == VASE__EVENT__BODY_SEQ_CLOSE);
    }
    protobuf_c_message_free_unpacked(&e->base, NULL);
    assert_null(vase_admin_events_free(ev));
    assert_null(vase_admin_free(a));
}

static void test_no_daemon(void **state) {
    struct vase_admin *a = NULL;
    Vase__StatusReply *st = NULL;

    (void)state;
    assert_int_equal(
        vase_admin_new(&(struct vase_admin_options){.runtime_dir = "/nonexistent/vase"}, &a), 0);
    assert_string_equal(vase_admin_path(a), "/nonexistent/vase/control.sock");
    assert_int_equal(vase_admin_connect(a), -ENOENT);
    assert_int_equal(vase_admin_status(a, &st), -ENOTCONN);
    assert_null(st);
    assert_null(vase_admin_free(a));
    assert_int_equal(vase_admin_new(&(struct vase_admin_options){.timeout_ms = -1}, &a), -EINVAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_requests, setup, teardown),
        cmocka_unit_test_setup_teardown(test_config, setup, teardown),
        cmocka_unit_test_setup_teardown(test_events, setup, teardown),
        cmocka_unit_test(test_no_daemon),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
