/* SPDX-License-Identifier: MIT */

/*
 * Tests of lib/chan.c, the control channel, against a ROUTER in the test process playing
 * the daemon's part: envelope fields (version, incarnation, increasing client_seq, distinct
 * request ids, the routing id), replies taken out of order through the reply queue, the
 * unclaimed-reply callback, bounded waits, a closed session socket ending a wait at once,
 * Error codes mapped to -errno, the daemon's words for them escaped and bounded, and size limits.
 */

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include <cmocka.h>

#include "chan.h"
#include "vase.h"
#include "wire.h"

static const uint8_t token[16] = {0x11, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

/* The channel's timeout, and the bound on anything else a test waits for: long enough that it
 * never ends a wait that a test expects to end otherwise, however loaded the machine. */
#define PATIENCE_MS 30000

struct fixture {
    char dir[64];
    char endpoint[128];
    void *zctx, *router;
    struct vase__chan *chan;
    int session[2];
    int unclaimed_calls;
    bool keep_unclaimed;
};

static bool on_unclaimed(void *userdata, const Vase__Envelope *e) {
    struct fixture *f = userdata;
    (void)e;
    f->unclaimed_calls++;
    return f->keep_unclaimed;
}

static int setup(void **state) {
    struct fixture *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    strcpy(f->dir, "/tmp/vase-test-chan-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->endpoint, sizeof(f->endpoint), "ipc://%s/control.sock", f->dir);
    f->zctx = zmq_ctx_new();
    f->router = zmq_socket(f->zctx, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(f->router, ZMQ_LINGER, &zero, sizeof(zero));
    assert_int_equal(zmq_bind(f->router, f->endpoint), 0);
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, f->session), 0);
    f->keep_unclaimed = true;

    struct vase__chan_options o = {
        .endpoint = f->endpoint,
        .routing_id = token,
        .routing_id_len = sizeof(token),
        .timeout_ms = PATIENCE_MS,
        .max_message_bytes = 4096,
        .session_fd = f->session[0],
        .unclaimed = on_unclaimed,
        .userdata = f,
    };
    assert_int_equal(vase__chan_new(&o, &f->chan), 0);
    vase__chan_set_incarnation(f->chan, 0x1234567890abcdefull);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    struct fixture *f = *state;
    vase__chan_free(f->chan);
    zmq_close(f->router);
    zmq_ctx_term(f->zctx);
    close(f->session[0]);
    if (f->session[1] >= 0)
        close(f->session[1]);
    char path[128];
    snprintf(path, sizeof(path), "%s/control.sock", f->dir);
    unlink(path);
    rmdir(f->dir);
    free(f);
    return 0;
}

/* Receives one request at the ROUTER: the routing id (checked) and the envelope. */
static Vase__Envelope *router_recv(struct fixture *f) {
    uint8_t id[256];
    char buf[8192];
    int n = zmq_recv(f->router, id, sizeof(id), 0);
    assert_int_equal(n, sizeof(token));
    assert_memory_equal(id, token, sizeof(token));
    int more;
    size_t ml = sizeof(more);
    zmq_getsockopt(f->router, ZMQ_RCVMORE, &more, &ml);
    assert_true(more);
    n = zmq_recv(f->router, buf, sizeof(buf), 0);
    assert_true(n >= 0);
    Vase__Envelope *e = NULL;
    assert_int_equal(vase_wire_unpack(buf, (size_t)n, sizeof(buf), &e), 0);
    return e;
}

static void router_send(struct fixture *f, Vase__Envelope *e) {
    void *buf;
    size_t len;
    assert_int_equal(vase_wire_pack(e, &buf, &len), 0);
    assert_int_equal(zmq_send(f->router, token, sizeof(token), ZMQ_SNDMORE), sizeof(token));
    assert_int_equal(zmq_send(f->router, buf, len, 0), (int)len);
    free(buf);
}

static void reply_pong(struct fixture *f, uint64_t request_id) {
    Vase__Pong pong = VASE__PONG__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    e.version = VASE_WIRE_VERSION;
    e.request_id = request_id;
    e.body_case = VASE__ENVELOPE__BODY_PONG;
    e.pong = &pong;
    router_send(f, &e);
}

static void reply_error_says(struct fixture *f, uint64_t request_id, int32_t code,
                             const char *message) {
    Vase__Error err = VASE__ERROR__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    err.code = code;
    err.message = (char *)message;
    e.version = VASE_WIRE_VERSION;
    e.request_id = request_id;
    e.body_case = VASE__ENVELOPE__BODY_ERROR;
    e.error = &err;
    router_send(f, &e);
}

static void reply_error(struct fixture *f, uint64_t request_id, int32_t code) {
    Vase__Error err = VASE__ERROR__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    err.code = code;
    err.message = "refused";
    e.version = VASE_WIRE_VERSION;
    e.request_id = request_id;
    e.body_case = VASE__ENVELOPE__BODY_ERROR;
    e.error = &err;
    router_send(f, &e);
}

static uint64_t send_ping(struct fixture *f) {
    Vase__Ping ping = VASE__PING__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    uint64_t id = 0;
    e.body_case = VASE__ENVELOPE__BODY_PING;
    e.ping = &ping;
    assert_int_equal(vase__chan_send(f->chan, &e, &id), 0);
    assert_true(id > 0);
    return id;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void test_envelope_fields(void **state) {
    struct fixture *f = *state;
    uint64_t a = send_ping(f), b = send_ping(f);
    assert_true(b > a);

    Vase__Envelope *ea = router_recv(f), *eb = router_recv(f);
    assert_int_equal(ea->version, VASE_WIRE_VERSION);
    assert_int_equal(ea->incarnation, 0x1234567890abcdefull);
    assert_int_equal(ea->request_id, a);
    assert_int_equal(eb->request_id, b);
    assert_true(eb->client_seq > ea->client_seq);
    assert_int_equal(ea->body_case, VASE__ENVELOPE__BODY_PING);
    vase__envelope__free_unpacked(ea, NULL);
    vase__envelope__free_unpacked(eb, NULL);
}

static void test_out_of_order(void **state) {
    struct fixture *f = *state;
    uint64_t a = send_ping(f), b = send_ping(f), c = send_ping(f);
    for (int i = 0; i < 3; i++)
        vase__envelope__free_unpacked(router_recv(f), NULL);

    /* The daemon answers c, then b, then a; the client waits for a first. */
    reply_pong(f, c);
    reply_pong(f, b);
    reply_pong(f, a);
    Vase__Envelope *e;
    assert_int_equal(vase__chan_wait(f->chan, a, -1, &e), 0);
    assert_int_equal(e->request_id, a);
    vase__envelope__free_unpacked(e, NULL);
    /* b and c went through the callback into the queue: taken without waiting. */
    assert_int_equal(f->unclaimed_calls, 2);
    assert_int_equal(vase__chan_wait(f->chan, c, 0, &e), 0);
    assert_int_equal(e->request_id, c);
    vase__envelope__free_unpacked(e, NULL);
    assert_int_equal(vase__chan_wait(f->chan, b, 0, &e), 0);
    assert_int_equal(e->request_id, b);
    vase__envelope__free_unpacked(e, NULL);
    /* Each exactly once. */
    assert_int_equal(vase__chan_wait(f->chan, b, 0, &e), -EAGAIN);
}

static void test_unclaimed_dropped(void **state) {
    struct fixture *f = *state;
    f->keep_unclaimed = false;
    uint64_t a = send_ping(f), b = send_ping(f);
    vase__envelope__free_unpacked(router_recv(f), NULL);
    vase__envelope__free_unpacked(router_recv(f), NULL);
    reply_pong(f, b);
    reply_pong(f, a);
    Vase__Envelope *e;
    assert_int_equal(vase__chan_wait(f->chan, a, -1, &e), 0);
    vase__envelope__free_unpacked(e, NULL);
    assert_int_equal(f->unclaimed_calls, 1);
    /* The callback declined b: it is gone. */
    assert_int_equal(vase__chan_wait(f->chan, b, 0, &e), -EAGAIN);

    /* vase__chan_drain() sorts without waiting for anything: it is called until the pong,
     * which nothing announces, has arrived. */
    uint64_t c = send_ping(f);
    vase__envelope__free_unpacked(router_recv(f), NULL);
    reply_pong(f, c);
    double t0 = now();
    while (f->unclaimed_calls < 2 && now() - t0 < PATIENCE_MS / 1000.0) {
        assert_int_equal(vase__chan_drain(f->chan), 0);
        usleep(1000);
    }
    assert_int_equal(f->unclaimed_calls, 2);
}

static void test_timeouts(void **state) {
    struct fixture *f = *state;
    Vase__Envelope *e = NULL;
    uint64_t a = send_ping(f);
    vase__envelope__free_unpacked(router_recv(f), NULL);

    assert_int_equal(vase__chan_wait(f->chan, a, 0, &e), -EAGAIN);
    double t0 = now();
    assert_int_equal(vase__chan_wait(f->chan, a, 100, &e), -ETIMEDOUT);
    double dt = now() - t0;
    /* It waited out its own 100 ms (load can only make that longer) and not the channel's
     * timeout, which only a stall of that length could reach. */
    assert_true(dt >= 0.09);
    assert_true(dt < PATIENCE_MS / 1000.0);
    assert_null(e);
}

static void test_session_closed(void **state) {
    struct fixture *f = *state;
    Vase__Envelope *e;
    uint64_t a = send_ping(f);
    vase__envelope__free_unpacked(router_recv(f), NULL);

    /* A stray packet on the session is read and ignored, and does not end the session. */
    assert_int_equal(send(f->session[1], "x", 1, 0), 1);
    assert_false(vase__session_closed(f->session[0]));
    assert_int_equal(vase__chan_wait(f->chan, a, 50, &e), -ETIMEDOUT);

    /* The daemon dies: the wait ends at once with -ECONNRESET, not at its timeout (which would
     * be -ETIMEDOUT, after PATIENCE_MS). */
    close(f->session[1]);
    f->session[1] = -1;
    assert_int_equal(vase__chan_wait(f->chan, a, -1, &e), -ECONNRESET);
    assert_int_equal(vase__chan_drain(f->chan), -ECONNRESET);
    assert_true(vase__session_closed(f->session[0]));
    assert_false(vase__session_closed(-1));
}

/* Closes fd once thread tid is blocked in the poll() of vase__chan_wait(): zmq_poll() over the
 * DEALER and the session socket, the only poll of two descriptors in this test. */
struct closer {
    pid_t tid;
    int fd;
    bool seen; /* the close came while the wait slept in poll() */
};

static bool polling_two(pid_t tid) {
    char path[64], buf[256];
    snprintf(path, sizeof(path), "/proc/self/task/%d/syscall", (int)tid);
    FILE *fp = fopen(path, "re");
    if (!fp)
        return false;
    bool yes = false;
    long nr;
    unsigned long fds, nfds;
    if (fgets(buf, sizeof(buf), fp) && sscanf(buf, "%ld %lx %lx", &nr, &fds, &nfds) == 3)
        yes = nfds == 2 && (
#ifdef SYS_poll
                               nr == SYS_poll ||
#endif
                               nr == SYS_ppoll);
    fclose(fp);
    return yes;
}

static void *close_while_polling(void *arg) {
    struct closer *cl = arg;
    double t0 = now();
    while (!(cl->seen = polling_two(cl->tid)) && now() - t0 < PATIENCE_MS / 1000.0)
        usleep(1000);
    close(cl->fd);
    return NULL;
}

static void test_session_closed_while_waiting(void **state) {
    struct fixture *f = *state;
    Vase__Envelope *e;
    uint64_t a = send_ping(f);
    vase__envelope__free_unpacked(router_recv(f), NULL);

    /* The daemon's end of the session closes while the wait sleeps in zmq_poll(): another thread
     * closes it once the kernel shows this one blocked there. The wait must end with
     * -ECONNRESET, not at the channel's timeout (-ETIMEDOUT). */
    struct closer cl = {.tid = (pid_t)syscall(SYS_gettid), .fd = f->session[1]};
    f->session[1] = -1;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, close_while_polling, &cl), 0);
    int r = vase__chan_wait(f->chan, a, -1, &e);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_true(cl.seen);
    assert_int_equal(r, -ECONNRESET);
}

static void test_call_errors(void **state) {
    struct fixture *f = *state;
    const struct {
        int32_t code;
        int expect;
    } cases[] = {
        {EPERM, -EPERM}, {ENOENT, -ENOENT}, {1001, -VASE_ESTALE}, {1000, -VASE_EPROTOVERSION},
        {-5, -EPROTO},   {0, -EPROTO},      {70000, -EPROTO},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        Vase__Error err = VASE__ERROR__INIT;
        err.code = cases[i].code;
        assert_int_equal(vase__error_code(&err), cases[i].expect);
    }
    assert_int_equal(vase__error_code(NULL), -EPROTO);

    /* Through a whole call: send, the daemon refuses, the caller gets -errno. Requests and
     * replies alternate here, so the test's ROUTER answers each before the next is sent. */
    Vase__Ping ping = VASE__PING__INIT;
    Vase__Envelope req = VASE__ENVELOPE__INIT;
    Vase__Envelope *reply = NULL;
    req.body_case = VASE__ENVELOPE__BODY_PING;
    req.ping = &ping;

    /* Pre-answer the next request id: the ROUTER replies before the call waits. */
    uint64_t next = send_ping(f) + 1;
    vase__envelope__free_unpacked(router_recv(f), NULL);
    reply_error(f, next, 1001);
    assert_int_equal(vase__chan_call(f->chan, &req, VASE__ENVELOPE__BODY_PONG, &reply),
                     -VASE_ESTALE);
    vase__envelope__free_unpacked(router_recv(f), NULL);

    /* A reply of the wrong kind. */
    next = req.request_id + 1;
    reply_error(f, next + 100, EINVAL); /* unrelated: queued, not returned */
    Vase__Status st = VASE__STATUS__INIT;
    Vase__Envelope bad = VASE__ENVELOPE__INIT;
    bad.version = VASE_WIRE_VERSION;
    bad.request_id = next;
    bad.body_case = VASE__ENVELOPE__BODY_STATUS;
    bad.status = &st;
    router_send(f, &bad);
    assert_int_equal(vase__chan_call(f->chan, &req, VASE__ENVELOPE__BODY_PONG, &reply), -EPROTO);
    vase__envelope__free_unpacked(router_recv(f), NULL);

    /* And a good one. */
    next = req.request_id + 1;
    reply_pong(f, next);
    assert_int_equal(vase__chan_call(f->chan, &req, VASE__ENVELOPE__BODY_PONG, &reply), 0);
    assert_int_equal(reply->body_case, VASE__ENVELOPE__BODY_PONG);
    vase__envelope__free_unpacked(reply, NULL);
    vase__envelope__free_unpacked(router_recv(f), NULL);
}

/* The daemon's words for a refusal reach vase_last_error() and from there terminals, logs and
 * Python exceptions: they come out escaped (no line breaks, no escape sequences) and bounded. */
static void test_error_words(void **state) {
    struct fixture *f = *state;
    Vase__Envelope *e;
    uint64_t a = send_ping(f);
    vase__envelope__free_unpacked(router_recv(f), NULL);
    reply_error_says(f, a, EINVAL, "budget 100\nFAKE LINE\x1b[31m\xff");
    assert_int_equal(vase__chan_wait(f->chan, a, -1, &e), 0);
    assert_int_equal(vase__chan_reply(f->chan, e, VASE__ENVELOPE__BODY_PONG, &e), -EINVAL);
    assert_string_equal(vase__chan_last_error(f->chan), "budget 100\\x0aFAKE LINE\\x1b[31m\\xff");

    static char longer[3000];
    memset(longer, 'w', sizeof(longer) - 1);
    a = send_ping(f);
    vase__envelope__free_unpacked(router_recv(f), NULL);
    reply_error_says(f, a, EINVAL, longer);
    assert_int_equal(vase__chan_wait(f->chan, a, -1, &e), 0);
    assert_int_equal(vase__chan_reply(f->chan, e, VASE__ENVELOPE__BODY_PONG, &e), -EINVAL);
    size_t n = strlen(vase__chan_last_error(f->chan));
    assert_true(n > 0 && n < 512);
}

static void test_bad_replies(void **state) {
    struct fixture *f = *state;
    Vase__Envelope *e;
    uint64_t a = send_ping(f);
    vase__envelope__free_unpacked(router_recv(f), NULL);

    /* Another protocol version. */
    Vase__Pong pong = VASE__PONG__INIT;
    Vase__Envelope r = VASE__ENVELOPE__INIT;
    r.version = VASE_WIRE_VERSION + 1;
    r.request_id = a;
    r.body_case = VASE__ENVELOPE__BODY_PONG;
    r.pong = &pong;
    router_send(f, &r);
    assert_int_equal(vase__chan_wait(f->chan, a, -1, &e), -VASE_EPROTOVERSION);

    /* Bytes that are no envelope. */
    assert_int_equal(zmq_send(f->router, token, sizeof(token), ZMQ_SNDMORE), sizeof(token));
    assert_int_equal(zmq_send(f->router, "\xff\xff\xff", 3, 0), 3);
    assert_int_equal(vase__chan_wait(f->chan, a, -1, &e), -EBADMSG);

    /* Larger than max_message_bytes (4096 here). */
    static char big[5000];
    assert_int_equal(zmq_send(f->router, token, sizeof(token), ZMQ_SNDMORE), sizeof(token));
    assert_int_equal(zmq_send(f->router, big, sizeof(big), 0), (int)sizeof(big));
    assert_int_equal(vase__chan_wait(f->chan, a, -1, &e), -EMSGSIZE);

    /* After all that the channel still works. */
    reply_pong(f, a);
    assert_int_equal(vase__chan_wait(f->chan, a, -1, &e), 0);
    vase__envelope__free_unpacked(e, NULL);
}

static void test_message_size(void **state) {
    struct fixture *f = *state;
    static uint8_t payload[5000];
    Vase__Ping ping = VASE__PING__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    uint64_t id = 0;

    uint64_t before = send_ping(f);
    Vase__Envelope *first = router_recv(f);

    ping.payload = (ProtobufCBinaryData){.len = sizeof(payload), .data = payload};
    e.body_case = VASE__ENVELOPE__BODY_PING;
    e.ping = &ping;
    assert_int_equal(vase__chan_send(f->chan, &e, &id), -EMSGSIZE);
    assert_int_equal(id, 0);

    /* Nothing left, so the next message follows the previous one without a gap. */
    uint64_t after = send_ping(f);
    assert_int_equal(after, before + 1);
    Vase__Envelope *second = router_recv(f);
    assert_int_equal(second->client_seq, first->client_seq + 1);
    vase__envelope__free_unpacked(first, NULL);
    vase__envelope__free_unpacked(second, NULL);
}

static void test_new_invalid(void **state) {
    (void)state;
    struct vase__chan *ch = NULL;
    struct vase__chan_options o = {.endpoint = "ipc:///nonexistent/x.sock", .timeout_ms = 0};
    assert_int_equal(vase__chan_new(&o, &ch), -EINVAL);
    assert_int_equal(vase__chan_new(NULL, &ch), -EINVAL);
    o.timeout_ms = 10;
    assert_int_equal(vase__chan_new(&o, NULL), -EINVAL);
    o.routing_id = token;
    o.routing_id_len = 0;
    assert_int_equal(vase__chan_new(&o, &ch), -EINVAL);
    o.routing_id = NULL;
    o.endpoint = "nonsense://x";
    assert_true(vase__chan_new(&o, &ch) < 0);
    assert_null(ch);
    assert_null(vase__chan_free(NULL));
}

#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)

int main(void) {
    const struct CMUnitTest tests[] = {
        T(test_envelope_fields),
        T(test_out_of_order),
        T(test_unclaimed_dropped),
        T(test_timeouts),
        T(test_session_closed),
        T(test_session_closed_while_waiting),
        T(test_call_errors),
        T(test_error_words),
        T(test_bad_replies),
        T(test_message_size),
        cmocka_unit_test(test_new_invalid),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
