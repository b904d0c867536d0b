/* SPDX-License-Identifier: MIT */

/*
 * Tests of vase_connect() and the session handshake (client/session.c, client/client.c) that
 * need no daemon: the runtime directory rules, a missing or dead socket, and a peer thread in
 * the test that plays the daemon's side of the session socket only (refusal, silence, closing,
 * another protocol version, malformed welcomes, a good welcome whose memfd arena must come out
 * mapped shared), plus a ROUTER answering the connect's Ping. Also the arguments every public
 * entry point refuses with -EINVAL before it talks to anyone.
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
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <zmq.h>

#include <cmocka.h>

#include "session.h"
#include "vase.h"
#include "wire.h"

#define PAGE 4096u
#define NPAGES 4u
/* The timeout of every handshake and call the peer answers (or ends by closing): long enough
 * that it never ends a wait that a test expects to end otherwise, however loaded the machine. */
#define PATIENCE_MS 30000

enum peer_mode {
    PEER_REFUSE,       /* Error{EACCES} after the hello */
    PEER_REFUSE_EARLY, /* Error{EPERM} and close without reading the hello */
    PEER_SILENT,       /* read the hello, say nothing */
    PEER_CLOSE,        /* read the hello, close */
    PEER_VERSION,      /* a welcome of protocol version 2 */
    PEER_WELCOME,      /* a good welcome: one memfd arena, one cuda-ipc arena */
    PEER_NO_FD,        /* a memfd arena without its fd */
    PEER_SHORT_MEMFD,  /* a memfd smaller than the arena it claims */
};

struct peer {
    char dir[64];
    int listen_fd;
    enum peer_mode mode;
    pthread_t thread;
    int memfd; /* the test's own handle on the arena, to check sharing */
    char hello_name[64];
    uint32_t hello_pid;
    int conn; /* kept open until the test ends, like a live daemon */
    volatile bool stop;
    bool joined;
    void *zctx, *router; /* PEER_WELCOME: answers the connect's Ping when serve_ping */
    bool serve_ping;
};

static const uint8_t token[16] = {0x21, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 1, 2, 3, 4, 5};

static void send_envelope(int fd, Vase__Envelope *e, const int *fds, size_t nfds) {
    void *buf;
    size_t len;
    assert_int_equal(vase_wire_pack(e, &buf, &len), 0);
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int) * 4)];
    } control = {0};
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (nfds) {
        msg.msg_control = control.buf;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
    }
    (void)sendmsg(fd, &msg, MSG_NOSIGNAL);
    free(buf);
}

static void send_error(int fd, int code) {
    Vase__Error err = VASE__ERROR__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    err.code = code;
    err.message = "not on the allow-list";
    e.version = 1;
    e.body_case = VASE__ENVELOPE__BODY_ERROR;
    e.error = &err;
    send_envelope(fd, &e, NULL, 0);
}

static void send_welcome(struct peer *p, int fd, uint32_t version, bool with_fd) {
    Vase__ArenaInfo host = VASE__ARENA_INFO__INIT, dev = VASE__ARENA_INFO__INIT;
    Vase__ArenaInfo *arenas[] = {&host, &dev};
    Vase__SessionWelcome w = VASE__SESSION_WELCOME__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    char control[128], events[128];

    snprintf(control, sizeof(control), "ipc://%s/control.sock", p->dir);
    snprintf(events, sizeof(events), "ipc://%s/events.sock", p->dir);
    host.id = 0;
    host.kind = "host";
    host.page_bytes = PAGE;
    host.num_pages = NPAGES;
    host.size_bytes = (uint64_t)PAGE * NPAGES;
    host.share = "memfd";
    dev.id = 1;
    dev.kind = "cuda:0";
    dev.page_bytes = PAGE;
    dev.num_pages = 2;
    dev.size_bytes = 2 * PAGE;
    dev.share = "cuda-ipc";
    /* A CUDA arena names its GPU and carries its 64-byte legacy IPC handle. */
    static uint8_t handle[64];
    dev.device_uuid = "GPU-01234567-89ab-cdef-0123-456789abcdef";
    dev.ipc_handle = (ProtobufCBinaryData){.len = sizeof(handle), .data = handle};
    w.client_id = 7;
    w.token = (ProtobufCBinaryData){.len = sizeof(token), .data = (uint8_t *)token};
    w.n_arenas = 2;
    w.arenas = arenas;
    w.control_endpoint = control;
    w.events_endpoint = events;
    w.max_message_bytes = 1 << 20;
    e.version = version;
    e.incarnation = 0xfeedfacecafebeefull;
    e.body_case = VASE__ENVELOPE__BODY_WELCOME;
    e.welcome = &w;
    send_envelope(fd, &e, &p->memfd, with_fd ? 1 : 0);
}

static void read_hello(struct peer *p, int fd) {
    char buf[4096];
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0)
        return;
    Vase__Envelope *e = NULL;
    if (vase_wire_unpack(buf, (size_t)n, sizeof(buf), &e) == 0 &&
        e->body_case == VASE__ENVELOPE__BODY_HELLO) {
        snprintf(p->hello_name, sizeof(p->hello_name), "%s", e->hello->name);
        p->hello_pid = e->hello->pid;
    }
    if (e)
        vase__envelope__free_unpacked(e, NULL);
}

/* Answers Pings on the ROUTER until told to stop. */
static void serve_pings(struct peer *p) {
    while (!p->stop) {
        zmq_pollitem_t it = {.socket = p->router, .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, 20) <= 0)
            continue;
        uint8_t id[256];
        char buf[4096];
        int idn = zmq_recv(p->router, id, sizeof(id), 0);
        int n = zmq_recv(p->router, buf, sizeof(buf), 0);
        Vase__Envelope *req = NULL;
        if (idn <= 0 || n < 0 || vase_wire_unpack(buf, (size_t)n, sizeof(buf), &req) < 0) {
            if (req)
                vase__envelope__free_unpacked(req, NULL);
            continue;
        }
        Vase__Pong pong = VASE__PONG__INIT;
        Vase__Envelope r = VASE__ENVELOPE__INIT;
        r.version = 1;
        r.incarnation = 0xfeedfacecafebeefull;
        r.request_id = req->request_id;
        if (req->body_case == VASE__ENVELOPE__BODY_PING &&
            req->incarnation == 0xfeedfacecafebeefull && idn == sizeof(token) &&
            memcmp(id, token, sizeof(token)) == 0) {
            pong.payload = req->ping->payload;
            r.body_case = VASE__ENVELOPE__BODY_PONG;
            r.pong = &pong;
            void *out;
            size_t len;
            if (vase_wire_pack(&r, &out, &len) == 0) {
                zmq_send(p->router, id, (size_t)idn, ZMQ_SNDMORE);
                zmq_send(p->router, out, len, 0);
                free(out);
            }
        }
        vase__envelope__free_unpacked(req, NULL);
    }
}

static void *peer_main(void *arg) {
    struct peer *p = arg;
    int fd = accept4(p->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0)
        return NULL;
    p->conn = fd;
    if (p->mode == PEER_REFUSE_EARLY) {
        send_error(fd, EPERM);
        shutdown(fd, SHUT_RDWR);
        return NULL;
    }
    read_hello(p, fd);
    switch (p->mode) {
    case PEER_REFUSE:
        send_error(fd, EACCES);
        break;
    case PEER_SILENT:
        break;
    case PEER_CLOSE:
        shutdown(fd, SHUT_RDWR);
        break;
    case PEER_VERSION:
        send_welcome(p, fd, 2, true);
        break;
    case PEER_WELCOME:
        send_welcome(p, fd, 1, true);
        if (p->serve_ping)
            serve_pings(p);
        break;
    case PEER_NO_FD:
        send_welcome(p, fd, 1, false);
        break;
    case PEER_SHORT_MEMFD:
        assert_int_equal(ftruncate(p->memfd, PAGE), 0);
        send_welcome(p, fd, 1, true);
        break;
    default:
        break;
    }
    return NULL;
}

static void peer_start(struct peer *p, enum peer_mode mode) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    p->mode = mode;
    p->conn = -1;
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/session.sock", p->dir);
    p->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    assert_true(p->listen_fd >= 0);
    assert_int_equal(bind(p->listen_fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(p->listen_fd, 4), 0);
    p->memfd = memfd_create("vase-test-arena", MFD_CLOEXEC);
    assert_true(p->memfd >= 0);
    assert_int_equal(ftruncate(p->memfd, (off_t)PAGE * NPAGES), 0);
    if (p->serve_ping) {
        char ep[128];
        snprintf(ep, sizeof(ep), "ipc://%s/control.sock", p->dir);
        p->zctx = zmq_ctx_new();
        p->router = zmq_socket(p->zctx, ZMQ_ROUTER);
        int zero = 0;
        zmq_setsockopt(p->router, ZMQ_LINGER, &zero, sizeof(zero));
        assert_int_equal(zmq_bind(p->router, ep), 0);
    }
    assert_int_equal(pthread_create(&p->thread, NULL, peer_main, p), 0);
}

static void peer_stop(struct peer *p) {
    p->stop = true;
    /* Unblocks accept() if the client never came. */
    shutdown(p->listen_fd, SHUT_RDWR);
    if (!p->joined)
        pthread_join(p->thread, NULL);
    if (p->conn >= 0)
        close(p->conn);
    close(p->listen_fd);
    close(p->memfd);
    if (p->router) {
        zmq_close(p->router);
        zmq_ctx_term(p->zctx);
    }
    char path[128];
    snprintf(path, sizeof(path), "%s/session.sock", p->dir);
    unlink(path);
    snprintf(path, sizeof(path), "%s/control.sock", p->dir);
    unlink(path);
}

static int setup(void **state) {
    struct peer *p = calloc(1, sizeof(*p));
    assert_non_null(p);
    strcpy(p->dir, "/tmp/vase-test-conn-XXXXXX");
    assert_non_null(mkdtemp(p->dir));
    *state = p;
    return 0;
}

static int teardown(void **state) {
    struct peer *p = *state;
    rmdir(p->dir);
    free(p);
    return 0;
}

static bool fcntl_cloexec_ok(int fd) {
    int flags = fcntl(fd, F_GETFD);
    return flags >= 0 && (flags & FD_CLOEXEC);
}

/* ---- runtime directory ---- */

static void test_runtime_dir(void **state) {
    (void)state;
    char buf[256];
    struct stat st;

    assert_int_equal(vase__runtime_dir("/some/dir", buf, sizeof(buf)), 0);
    assert_string_equal(buf, "/some/dir");
    assert_int_equal(setenv("VASE_RUNTIME_DIR", "/from/env", 1), 0);
    assert_int_equal(vase__runtime_dir(NULL, buf, sizeof(buf)), 0);
    assert_string_equal(buf, "/from/env");
    /* An explicit directory beats the environment. */
    assert_int_equal(vase__runtime_dir("/explicit", buf, sizeof(buf)), 0);
    assert_string_equal(buf, "/explicit");
    /* Empty counts as unset. */
    assert_int_equal(setenv("VASE_RUNTIME_DIR", "", 1), 0);
    assert_int_equal(vase__runtime_dir(NULL, buf, sizeof(buf)), 0);
    bool have_run = stat("/run/vase", &st) == 0 && S_ISDIR(st.st_mode);
    assert_string_equal(buf, have_run ? "/run/vase" : "./run");
    unsetenv("VASE_RUNTIME_DIR");
    assert_int_equal(vase__runtime_dir(NULL, buf, sizeof(buf)), 0);
    assert_string_equal(buf, have_run ? "/run/vase" : "./run");

    assert_int_equal(vase__runtime_dir("/a/long/name", buf, 5), -ENAMETOOLONG);
}

/* ---- connect without a daemon ---- */

static void test_connect_missing_dir(void **state) {
    (void)state;
    struct vase_client *c = NULL;
    struct vase_connect_options o = {.runtime_dir = "/nonexistent/vase-test",
                                     .timeout_ms = PATIENCE_MS};
    /* At once: a connect that waited for the daemon would end with -ETIMEDOUT. */
    assert_int_equal(vase_connect(&o, &c), -ENOENT);
    assert_null(c);

    /* Through the environment too. */
    assert_int_equal(setenv("VASE_RUNTIME_DIR", "/nonexistent/vase-env", 1), 0);
    o.runtime_dir = NULL;
    assert_int_equal(vase_connect(&o, &c), -ENOENT);
    assert_int_equal(vase_connect(NULL, &c), -ENOENT);
    unsetenv("VASE_RUNTIME_DIR");
}

static void test_connect_no_socket(void **state) {
    struct peer *p = *state;
    struct vase_client *c = NULL;
    struct vase_connect_options o = {.runtime_dir = p->dir};
    /* The directory exists, the socket does not. */
    assert_int_equal(vase_connect(&o, &c), -ENOENT);

    /* A socket file nobody listens on: a daemon that died without cleaning up. */
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/session.sock", p->dir);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    close(fd);
    assert_int_equal(vase_connect(&o, &c), -ECONNREFUSED);
    unlink(sa.sun_path);
    assert_null(c);
}

static void test_connect_name_too_long(void **state) {
    (void)state;
    char dir[200];
    memset(dir, 'a', sizeof(dir) - 1);
    dir[0] = '/';
    dir[sizeof(dir) - 1] = 0;
    struct vase_client *c = NULL;
    struct vase_connect_options o = {.runtime_dir = dir};
    assert_int_equal(vase_connect(&o, &c), -ENAMETOOLONG);
}

/* ---- the handshake against a peer ---- */

static int open_session(struct peer *p, enum peer_mode mode, int timeout_ms,
                        struct vase__session *s) {
    peer_start(p, mode);
    int r = vase__session_open(p->dir, "test-engine", timeout_ms, s);
    peer_stop(p);
    return r;
}

static void test_refused(void **state) {
    struct peer *p = *state;
    struct vase__session s;
    assert_int_equal(open_session(p, PEER_REFUSE, PATIENCE_MS, &s), -EACCES);
    assert_string_equal(p->hello_name, "test-engine");
    assert_int_equal(p->hello_pid, (uint32_t)getpid());
    assert_int_equal(s.fd, -1);
    assert_int_equal(open_session(p, PEER_REFUSE_EARLY, PATIENCE_MS, &s), -EPERM);
}

static void test_silent_and_closed(void **state) {
    struct peer *p = *state;
    struct vase__session s;
    assert_int_equal(open_session(p, PEER_SILENT, 100, &s), -ETIMEDOUT);
    /* A peer that closes ends the handshake with -ECONNRESET, not at the timeout. */
    assert_int_equal(open_session(p, PEER_CLOSE, PATIENCE_MS, &s), -ECONNRESET);
}

static void test_version(void **state) {
    struct peer *p = *state;
    struct vase__session s;
    assert_int_equal(open_session(p, PEER_VERSION, PATIENCE_MS, &s), -VASE_EPROTOVERSION);
}

static void test_malformed_welcomes(void **state) {
    struct peer *p = *state;
    struct vase__session s;
    assert_int_equal(open_session(p, PEER_NO_FD, PATIENCE_MS, &s), -EPROTO);
    assert_int_equal(open_session(p, PEER_SHORT_MEMFD, PATIENCE_MS, &s), -EPROTO);
}

static void test_welcome(void **state) {
    struct peer *p = *state;
    struct vase__session s;

    peer_start(p, PEER_WELCOME);
    assert_int_equal(vase__session_open(p->dir, "test-engine", PATIENCE_MS, &s), 0);
    assert_int_equal(s.client_id, 7);
    assert_int_equal(s.incarnation, 0xfeedfacecafebeefull);
    assert_int_equal(s.token_len, sizeof(token));
    assert_memory_equal(s.token, token, sizeof(token));
    assert_int_equal(s.max_message_bytes, 1 << 20);
    assert_non_null(strstr(s.control_endpoint, "/control.sock"));
    assert_non_null(strstr(s.events_endpoint, "/events.sock"));
    assert_int_equal(s.n_arenas, 2);
    assert_string_equal(s.arenas[0].kind, "host");
    assert_string_equal(s.arenas[0].share, "memfd");
    assert_int_equal(s.arenas[0].num_pages, NPAGES);
    assert_non_null(s.arenas[0].map);
    /* Device arenas are described but not mapped (until a model is registered on them). */
    assert_string_equal(s.arenas[1].kind, "cuda:0");
    assert_string_equal(s.arenas[1].device_uuid, "GPU-01234567-89ab-cdef-0123-456789abcdef");
    assert_int_equal(s.arenas[1].ipc_handle_len, 64);
    assert_null(s.arenas[1].map);

    /* The mapping is shared and writable: what the engine writes, the daemon reads. */
    memcpy((char *)s.arenas[0].map + 3 * PAGE + 5, "kv", 2);
    char got[2] = {0};
    assert_int_equal(pread(p->memfd, got, 2, 3 * PAGE + 5), 2);
    assert_memory_equal(got, "kv", 2);
    assert_int_equal(pwrite(p->memfd, "pl", 2, 100), 2);
    assert_memory_equal((char *)s.arenas[0].map + 100, "pl", 2);

    /* The session socket is close-on-exec, as is every fd the library opens. */
    assert_true(fcntl_cloexec_ok(s.fd));
    vase__session_close(&s);
    assert_int_equal(s.fd, -1);
    assert_null(s.arenas);
    vase__session_close(&s); /* twice is harmless */
    peer_stop(p);
}

/* ---- a whole vase_connect against the peer and a ROUTER ---- */

static void test_connect_ping_timeout(void **state) {
    struct peer *p = *state;
    struct vase_client *c = NULL;
    struct vase_connect_options o = {.runtime_dir = p->dir, .timeout_ms = 150};

    /* Session fine, nobody on the control socket: the Ping times out, everything unwinds. */
    peer_start(p, PEER_WELCOME);
    assert_int_equal(vase_connect(&o, &c), -ETIMEDOUT);
    assert_null(c);
    peer_stop(p);
}

static void test_connect_ok(void **state) {
    struct peer *p = *state;
    struct vase_client *c = NULL;
    struct vase_connect_options o = {
        .runtime_dir = p->dir, .name = "unit", .timeout_ms = PATIENCE_MS};

    p->serve_ping = true;
    peer_start(p, PEER_WELCOME);
    assert_int_equal(vase_connect(&o, &c), 0);
    assert_non_null(c);
    assert_string_equal(p->hello_name, "unit");
    assert_int_equal(vase_client_id(c), 7);
    assert_int_equal(vase_client_incarnation(c), 0xfeedfacecafebeefull);
    assert_int_equal(vase_ping(c), 0);

    /* Geometry checks happen before any message. */
    struct vase_model *m = NULL;
    struct vase_geometry g = {.name = "m",
                              .layers = 2,
                              .q_heads = 4,
                              .kv_heads = 2,
                              .head_dim = 8,
                              .dtype = VASE_DTYPE_F32};
    assert_int_equal(vase_model_register(c, NULL, &m), -EINVAL);
    assert_int_equal(vase_model_register(c, &g, NULL), -EINVAL);
    g.q_heads = 3;
    assert_int_equal(vase_model_register(c, &g, &m), -EINVAL);
    g.q_heads = 4;
    g.dtype = _VASE_DTYPE_MAX;
    assert_int_equal(vase_model_register(c, &g, &m), -EINVAL);
    g.dtype = VASE_DTYPE_F32;
    g.layers = 1000; /* 1000 * 2 * 64 bytes per token > one 4 KiB page */
    assert_int_equal(vase_model_register(c, &g, &m), -EINVAL);
    g.layers = 2;
    g.arena = 9; /* no such arena */
    assert_int_equal(vase_model_register(c, &g, &m), -EINVAL);
    /* A device arena this process cannot map: a libvase without CUDA, or one with CUDA and no
     * device with the arena's made-up UUID. Either way the library says why, without a word to
     * the daemon. */
    g.arena = 1;
    int r = vase_model_register(c, &g, &m);
    if (r == -EOPNOTSUPP)
        assert_non_null(strstr(vase_last_error(c), "built without CUDA"));
    else {
        assert_int_equal(r, -ENODEV);
        assert_non_null(strstr(vase_last_error(c), "GPU-01234567-89ab-cdef-0123-456789abcdef"));
    }
    assert_null(m);

    /* The daemon goes away: the next call says so at once (-ECONNRESET, where waiting for the
     * Pong until the timeout would give -ETIMEDOUT), and every later one too. */
    p->stop = true;
    pthread_join(p->thread, NULL);
    p->joined = true;
    close(p->conn);
    p->conn = -1;
    assert_int_equal(vase_ping(c), -ECONNRESET);
    assert_int_equal(vase_ping(c), -ECONNRESET);
    g.arena = 0;
    assert_int_equal(vase_model_register(c, &g, &m), -ECONNRESET);
    assert_null(vase_disconnect(c));
    peer_stop(p);
}

/* ---- arguments ---- */

static void test_null_arguments(void **state) {
    (void)state;
    struct vase_client *c = NULL;
    struct vase_view v;
    struct vase_seq_stats st;
    float x = 1;

    assert_int_equal(vase_connect(NULL, NULL), -EINVAL);
    struct vase_connect_options o = {.timeout_ms = -1};
    assert_int_equal(vase_connect(&o, &c), -EINVAL);
    assert_null(vase_disconnect(NULL));
    assert_int_equal(vase_client_incarnation(NULL), 0);
    assert_int_equal(vase_client_id(NULL), 0);
    assert_int_equal(vase_ping(NULL), -EINVAL);
    assert_int_equal(vase_model_register(NULL, NULL, NULL), -EINVAL);
    assert_int_equal(vase_model_tokens_per_page(NULL), 0);
    assert_int_equal(vase_seq_open(NULL, NULL, NULL, NULL), -EINVAL);
    assert_int_equal(vase_seq_close(NULL), 0);
    assert_int_equal(vase_seq_id(NULL), 0);
    assert_int_equal(vase_seq_len(NULL), 0);
    assert_int_equal(vase_seq_capacity(NULL), 0);
    assert_int_equal(vase_seq_position(NULL), 0);
    assert_int_equal(vase_seq_rounds(NULL), 0);
    assert_int_equal(vase_seq_kv_view(NULL, 0, VASE_K, &v), -EINVAL);
    assert_null(vase_seq_kv_ptr(NULL, 0, VASE_K, 0, 0));
    assert_null(vase_seq_query_ptr(NULL, 0, 0, 0));
    assert_int_equal(vase_seq_append(NULL, 1), -EINVAL);
    assert_int_equal(vase_seq_set_draws(NULL, &x, 1, NULL, 0), -EINVAL);
    assert_int_equal(vase_seq_poll(NULL), -EINVAL);
    assert_int_equal(vase_seq_wait(NULL), -EINVAL);
    assert_int_equal(vase_seq_push_stats(NULL, 0, VASE_STATS_ACC_ADD, &x, 1), -EINVAL);
    vase_seq_get_stats(NULL, &st);
}

#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_runtime_dir),
        cmocka_unit_test(test_connect_missing_dir),
        T(test_connect_no_socket),
        cmocka_unit_test(test_connect_name_too_long),
        T(test_refused),
        T(test_silent_and_closed),
        T(test_version),
        T(test_malformed_welcomes),
        T(test_welcome),
        T(test_connect_ping_timeout),
        T(test_connect_ok),
        cmocka_unit_test(test_null_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
