/* SPDX-License-Identifier: MIT */

/*
 * Allocation-failure sweeps of the parts of libvase that run without a daemon: the reply queue
 * (its storage grows while replies arrive out of order) and the control channel (its
 * construction, packing a request, and queuing a reply nobody waits for), the channel talking
 * to a ROUTER socket this test plays the daemon with. The hook is tests/alloc_fail.c, linked
 * in with -Wl,--wrap (see the Makefile and tests/alloc_fail.h): every allocation libvase makes
 * while a step is armed is counted, the Nth fails, and each failure must come back as -ENOMEM
 * with everything freed. The pure layout arithmetic (kernels/layout.c) allocates nothing and is
 * not swept.
 */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include <cmocka.h>

#include "alloc_fail.h"
#include "chan.h"
#include "replyq.h"
#include "wire.h"

/* ---- the reply queue ---- */

/* Enough replies that the queue's storage grows several times. */
#define N_REPLIES 100

/* A Pong answering request_id, packed as the daemon sends it; the caller frees *ret_buf. */
static void pack_pong(uint64_t request_id, void **ret_buf, size_t *ret_len) {
    Vase__Pong pong = VASE__PONG__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    e.version = VASE_WIRE_VERSION;
    e.request_id = request_id;
    e.body_case = VASE__ENVELOPE__BODY_PONG;
    e.pong = &pong;
    assert_int_equal(vase_wire_pack(&e, ret_buf, ret_len), 0);
}

static int step_replyq(void *ctx) {
    (void)ctx;
    struct vase__replyq q = {0};
    Vase__Envelope *replies[N_REPLIES];
    size_t pushed = 0;
    int r = 0;

    /* Unpacked as the channel unpacks them, so that the queue may free them. */
    for (size_t i = 0; i < N_REPLIES; i++) {
        void *buf;
        size_t len;
        pack_pong(N_REPLIES - i, &buf, &len);
        replies[i] = NULL;
        assert_int_equal(vase_wire_unpack(buf, len, VASE_WIRE_DEFAULT_MAX, &replies[i]), 0);
        free(buf);
    }
    alloc_fail_arm();
    while (r == 0 && pushed < N_REPLIES)
        r = vase__replyq_push(&q, replies[pushed++]); /* freed by the queue on failure too */
    alloc_fail_disarm();
    for (size_t i = pushed; i < N_REPLIES; i++)
        vase__envelope__free_unpacked(replies[i], NULL);
    /* What was queued before the failure is still there, in order. */
    size_t queued = r == 0 ? pushed : pushed - 1;
    assert_int_equal(q.n, queued);
    for (size_t i = 0; i < queued; i++)
        assert_true(vase__replyq_has(&q, N_REPLIES - i));
    vase__replyq_clear(&q);
    return r;
}

static void test_replyq(void **state) {
    (void)state;
    assert_true(alloc_fail_sweep("libvase: vase__replyq_push", step_replyq, NULL, 0) >= 2);
}

/* ---- the control channel ---- */

struct peer {
    char dir[64];
    char endpoint[128];
    void *zctx, *router;
};

/* Plays the daemon for one request: takes it, answers a request nobody sent (the channel must
 * queue that reply), then answers it. */
static void peer_answer(struct peer *p) {
    uint8_t id[256];
    char buf[8192];
    int n = zmq_recv(p->router, id, sizeof(id), 0);
    assert_true(n > 0);
    size_t id_len = (size_t)n;
    n = zmq_recv(p->router, buf, sizeof(buf), 0);
    assert_true(n > 0);
    Vase__Envelope *req = NULL;
    assert_int_equal(vase_wire_unpack(buf, (size_t)n, sizeof(buf), &req), 0);

    uint64_t ids[2] = {req->request_id + 1000, req->request_id};
    vase__envelope__free_unpacked(req, NULL);
    for (size_t i = 0; i < 2; i++) {
        void *out;
        size_t len;
        pack_pong(ids[i], &out, &len);
        assert_int_equal(zmq_send(p->router, id, id_len, ZMQ_SNDMORE), (int)id_len);
        assert_int_equal(zmq_send(p->router, out, len, 0), (int)len);
        free(out);
    }
}

/* A channel made, a Ping sent, the peer's two replies received: one waited for, one queued. */
static int step_chan(void *ctx) {
    struct peer *p = ctx;
    struct vase__chan_options o = {.endpoint = p->endpoint, .timeout_ms = 5000, .session_fd = -1};
    struct vase__chan *ch = NULL;
    Vase__Ping ping = VASE__PING__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT, *reply = NULL;
    uint64_t id = 0;

    e.body_case = VASE__ENVELOPE__BODY_PING;
    e.ping = &ping;
    alloc_fail_arm();
    int r = vase__chan_new(&o, &ch);
    if (r == 0)
        r = vase__chan_send(ch, &e, &id);
    alloc_fail_disarm();
    if (r == 0) {
        peer_answer(p);
        alloc_fail_resume();
        r = vase__chan_wait(ch, id, -1, &reply);
        alloc_fail_disarm();
    }
    if (r == 0) {
        assert_int_equal(reply->request_id, id);
        vase__envelope__free_unpacked(reply, NULL);
        Vase__Envelope *other = NULL;
        assert_int_equal(vase__chan_wait(ch, id + 1000, 0, &other), 0);
        vase__envelope__free_unpacked(other, NULL);
    }
    vase__chan_free(ch);
    return r;
}

static void test_chan(void **state) {
    (void)state;
    struct peer p = {.dir = "/tmp/vase-alloc-fail-XXXXXX"};
    int zero = 0, patience = 5000;
    assert_non_null(mkdtemp(p.dir));
    snprintf(p.endpoint, sizeof(p.endpoint), "ipc://%s/control.sock", p.dir);
    p.zctx = zmq_ctx_new();
    p.router = zmq_socket(p.zctx, ZMQ_ROUTER);
    zmq_setsockopt(p.router, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(p.router, ZMQ_RCVTIMEO, &patience, sizeof(patience));
    assert_int_equal(zmq_bind(p.router, p.endpoint), 0);

    assert_true(alloc_fail_sweep("libvase: vase__chan_new/send/wait", step_chan, &p, 0) >= 3);

    zmq_close(p.router);
    zmq_ctx_term(p.zctx);
    char path[160];
    snprintf(path, sizeof(path), "%s/control.sock", p.dir);
    unlink(path);
    rmdir(p.dir);
}

static int teardown(void **state) {
    (void)state;
    alloc_fail_disarm(); /* a failed assertion may leave a step armed */
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_replyq, teardown),
        cmocka_unit_test_teardown(test_chan, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
