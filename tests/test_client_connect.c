/* SPDX-License-Identifier: MIT */

/*
 * Tests of vase_connect() and the session handshake (lib/session.c, lib/client.c) that
 * need no daemon: the runtime directory rules, a missing or dead socket, and a peer thread in
 * the test that plays the daemon's side of the session socket only (refusal, silence, closing,
 * another protocol version, malformed welcomes, a good welcome whose memfd arena must come out
 * mapped shared), plus a ROUTER playing the daemon's control socket (serve_requests()): it
 * answers Ping, RegisterModel, OpenSeq, CloseSeq, EvictRequest and EvictCommit with the layout
 * vase_layout.h prescribes, or, when a test says so, with one thing wrong, which the library
 * must refuse with -EPROTO (a ModelLayout field, a SeqLayout's page count, capacity or page
 * indices, a commit reply that changes the block table). Also the arguments every public entry
 * point refuses with -EINVAL before it talks to anyone.
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
#include "vase_layout.h"
#include "wire.h"

#define PAGE 4096u
#define NPAGES 16u
#define INCARNATION 0xfeedfacecafebeefull
/* The timeout of every handshake and call the peer answers (or ends by closing): long enough
 * that it never ends a wait that a test expects to end otherwise, however loaded the machine. */
#define PATIENCE_MS 30000

enum peer_mode {
    PEER_REFUSE,       /* Error{EACCES} after the hello */
    PEER_REFUSE_EARLY, /* Error{EPERM} and close without reading the hello */
    PEER_SILENT,       /* read the hello, say nothing */
    PEER_CLOSE,        /* read the hello, close */
    PEER_VERSION,      /* a welcome of the next protocol version */
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
    void *zctx, *router; /* PEER_WELCOME: answers requests when serve_ping */
    bool serve_ping;
    /* The fake daemon's side of the control socket (serve_requests()), touched by the peer
     * thread only, but for tamper (set by the test before a call) and the counters (read by
     * the test after one), accessed atomically. */
    int tamper;       /* enum tamper */
    int tamper_field; /* TAMPER_MODEL_FIELD: which field of ModelLayout */
    unsigned n_register, n_open, n_close, n_evict, n_commit;
    struct vase_layout models[16];
    uint32_t n_models;
    uint32_t seq_id, seq_keep, seq_window, seq_round;
    uint32_t seq_pages[32], seq_n_pages, seq_capacity;
    struct vase_plan_layout seq_plan;
    uint32_t seq_plan_pages[8];
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
    e.version = VASE_WIRE_VERSION;
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
    host.granule_bytes = PAGE;
    host.granules = NPAGES;
    host.size_bytes = (uint64_t)PAGE * NPAGES;
    host.share = "memfd";
    dev.id = 1;
    dev.kind = "cuda:0";
    dev.granule_bytes = PAGE;
    dev.granules = 2;
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
    e.incarnation = INCARNATION;
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

/* What the fake daemon gets wrong in its replies, set by the test before the call it answers. */
enum tamper {
    TAMPER_NONE,
    TAMPER_MODEL_FIELD,     /* ModelLayout: field tamper_field off by one */
    TAMPER_ONE_PAGE_MORE,   /* SeqLayout: one block more than prescribed (capacity as is) */
    TAMPER_ONE_PAGE_FEWER,  /* SeqLayout: one block fewer */
    TAMPER_CAPACITY,        /* SeqLayout: a capacity one slot short of the blocks' */
    TAMPER_KV_INDEX,        /* SeqLayout: a block index of num_blocks */
    TAMPER_PLAN_INDEX,      /* SeqLayout: a plan page past the arena in plan-page units */
    TAMPER_PLAN_INDEX_LAST, /* SeqLayout: the last plan page of the arena (valid) */
    TAMPER_COMMIT_CHANGE,   /* CommitReply: block-table entry 1 replaced */
    TAMPER_COMMIT_GROW,     /* CommitReply: one block appended */
    TAMPER_COMMIT_SHORT,    /* CommitReply: a capacity below the new length */
    TAMPER_COMMIT_TAIL,     /* CommitReply: the tail the length does not need dropped (valid) */
    TAMPER_COMMIT_BUDGET,   /* CommitReply: a budget one window above the open's */
    TAMPER_PLAN_BUDGET,     /* EvictPlan: a budget one window below (the sequence is not elastic) */
};

#define MODEL_ID0 100u
#define SEQ_ID 42u

static void set_tamper(struct peer *p, enum tamper t, int field) {
    __atomic_store_n(&p->tamper_field, field, __ATOMIC_SEQ_CST);
    __atomic_store_n(&p->tamper, (int)t, __ATOMIC_SEQ_CST);
}

static unsigned count(unsigned *n) {
    return __atomic_load_n(n, __ATOMIC_SEQ_CST);
}

static void bump(unsigned *n) {
    __atomic_fetch_add(n, 1, __ATOMIC_SEQ_CST);
}

/* ModelLayout for RegisterModel, as the daemon computes it (the layout module), but for the
 * field a test breaks. */
static int answer_register(struct peer *p, const Vase__RegisterModel *rm, int tamper, int field,
                           Vase__ModelLayout *ml) {
    const Vase__ModelGeometry *g = rm->geometry;
    struct vase_layout_geometry lg = {
        .layers = g->layers,
        .q_heads = g->q_heads,
        .kv_heads = g->kv_heads,
        .head_dim = g->head_dim,
        .dtype = (enum vase_dtype)g->dtype,
        .block_tokens = g->block_tokens,
    };
    struct vase_layout l;
    if (g->arena_id != 0 || p->n_models == 16 ||
        vase_layout_compute(&lg, (uint64_t)PAGE * NPAGES, &l, NULL, 0) < 0)
        return EINVAL;
    p->models[p->n_models] = l;
    ml->model_id = MODEL_ID0 + p->n_models++;
    ml->block_tokens = l.block_tokens;
    ml->page_bytes = l.page_bytes;
    ml->layer_stride = l.layer_stride;
    ml->kv_stride = l.kv_stride;
    ml->token_stride = l.token_stride;
    ml->head_stride = l.head_stride;
    ml->ring_rows_per_page = l.ring_rows_per_page;
    ml->ring_layer_stride = l.ring_layer_stride;
    ml->ring_row_stride = l.ring_row_stride;
    ml->ring_page_bytes = l.ring_page_bytes;
    ml->num_blocks = l.num_blocks;
    if (tamper == TAMPER_MODEL_FIELD) {
        switch (field) {
        case 0:
            ml->block_tokens++;
            break;
        case 1:
            ml->page_bytes++;
            break;
        case 2:
            ml->layer_stride++;
            break;
        case 3:
            ml->kv_stride++;
            break;
        case 4:
            ml->token_stride++;
            break;
        case 5:
            ml->head_stride++;
            break;
        case 6:
            ml->ring_rows_per_page++;
            break;
        case 7:
            ml->ring_layer_stride++;
            break;
        case 8:
            ml->ring_row_stride++;
            break;
        case 9:
            ml->ring_page_bytes++;
            break;
        case 10:
            ml->num_blocks--;
            break;
        default:
            break;
        }
    }
    return 0;
}

/* SeqLayout for OpenSeq: the blocks vase_layout.h prescribes, from the top of the arena down in
 * steps of two (so not in order and not contiguous), plan pages from the bottom, no ring (the
 * tests open policies that read no queries). */
static int answer_open(struct peer *p, const Vase__OpenSeq *o, int tamper, Vase__SeqLayout *sl) {
    if (o->model_id < MODEL_ID0 || o->model_id - MODEL_ID0 >= p->n_models)
        return EINVAL;
    const struct vase_layout *l = &p->models[o->model_id - MODEL_ID0];
    uint32_t window = o->params->window, budget = o->params->budget;
    uint32_t slack = o->slack >= 0 ? (uint32_t)o->slack : window;
    uint32_t keep = budget - window;
    uint32_t n =
        vase_layout_blocks_for(l, vase_layout_open_slots(o->prompt_len, budget, window, slack));
    if (n + 1 > l->num_blocks / 2 || n + 1 > 32 ||
        vase_layout_plans(l, keep, &p->seq_plan, NULL, 0) < 0 || p->seq_plan.plan_pages > 8)
        return ENOSPC;
    for (uint32_t i = 0; i < n + 1; i++)
        p->seq_pages[i] = l->num_blocks - 1 - 2 * i;
    for (uint32_t i = 0; i < p->seq_plan.plan_pages; i++)
        p->seq_plan_pages[i] = i;
    uint32_t capacity = n * l->block_tokens;
    switch (tamper) {
    case TAMPER_ONE_PAGE_MORE:
        n++;
        break;
    case TAMPER_ONE_PAGE_FEWER:
        n--;
        break;
    case TAMPER_CAPACITY:
        capacity--;
        break;
    case TAMPER_KV_INDEX:
        p->seq_pages[n - 1] = l->num_blocks;
        break;
    case TAMPER_PLAN_INDEX:
        p->seq_plan_pages[0] =
            (uint32_t)vase_layout_units(l->arena_bytes, p->seq_plan.plan_page_bytes);
        break;
    case TAMPER_PLAN_INDEX_LAST:
        p->seq_plan_pages[0] =
            (uint32_t)vase_layout_units(l->arena_bytes, p->seq_plan.plan_page_bytes) - 1;
        break;
    default:
        break;
    }
    p->seq_id = SEQ_ID;
    p->seq_keep = keep;
    p->seq_window = window;
    p->seq_round = 0;
    p->seq_n_pages = n;
    p->seq_capacity = capacity;
    sl->seq_id = SEQ_ID;
    sl->capacity = p->seq_capacity;
    sl->n_pages = n;
    sl->pages = p->seq_pages;
    sl->n_plan_pages = p->seq_plan.plan_pages;
    sl->plan_pages = p->seq_plan_pages;
    sl->keep = keep;
    sl->plans_per_page = p->seq_plan.plans_per_page;
    sl->plan_page_bytes = p->seq_plan.plan_page_bytes;
    sl->window = window;
    sl->budget = budget;
    sl->slack = slack;
    return 0;
}

/* EvictPlan for an EvictRequest: every keep list is the even candidates 0, 2, .., written into
 * the plan area through the memfd. */
static int answer_evict(struct peer *p, const Vase__EvictRequest *er, int tamper,
                        Vase__EvictPlan *ep) {
    uint32_t n = er->len - p->seq_window, keep = p->seq_keep;
    if (tamper == TAMPER_PLAN_BUDGET)
        keep -= p->seq_window;
    if (er->seq_id != p->seq_id || 2 * keep > n || keep > 1024)
        return EINVAL;
    uint32_t list[1024];
    for (uint32_t j = 0; j < keep; j++)
        list[j] = 2 * j;
    for (uint32_t i = 0; i < p->seq_plan.lists; i++) {
        off_t at = (off_t)vase_layout_plan_offset(&p->seq_plan, p->seq_plan_pages, i);
        if (pwrite(p->memfd, list, keep * sizeof(*list), at) != (ssize_t)(keep * sizeof(*list)))
            return EIO;
    }
    ep->seq_id = p->seq_id;
    ep->round = p->seq_round++;
    ep->n = n;
    ep->len = er->len;
    ep->keep = keep;
    ep->budget = keep + p->seq_window;
    return 0;
}

/* CommitReply for an EvictCommit: the block table as it was, or broken, or cut to what the new
 * length needs. */
static int answer_commit(struct peer *p, const Vase__EvictCommit *ec, int tamper,
                         Vase__CommitReply *cr) {
    if (ec->seq_id != p->seq_id || p->n_models == 0)
        return EINVAL;
    uint32_t B = p->models[0].block_tokens;
    if (tamper == TAMPER_COMMIT_CHANGE)
        p->seq_pages[1] = 1; /* a valid block, but not the one the slots are in */
    if (tamper == TAMPER_COMMIT_GROW) {
        p->seq_n_pages++; /* answer_open() computed one entry more */
        p->seq_capacity += B;
    }
    if (tamper == TAMPER_COMMIT_SHORT)
        p->seq_capacity = ec->new_len - 1;
    if (tamper == TAMPER_COMMIT_BUDGET)
        cr->budget = p->seq_keep + 2 * p->seq_window;
    if (tamper == TAMPER_COMMIT_TAIL) {
        p->seq_n_pages = (ec->new_len + B - 1) / B;
        p->seq_capacity = p->seq_n_pages * B;
    }
    cr->seq_id = p->seq_id;
    cr->capacity = p->seq_capacity;
    cr->n_pages = p->seq_n_pages;
    cr->pages = p->seq_pages;
    return 0;
}

/* Answers requests on the ROUTER as a daemon would, until told to stop. */
static void serve_requests(struct peer *p) {
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
        if (req->incarnation != INCARNATION || idn != sizeof(token) ||
            memcmp(id, token, sizeof(token)) != 0) {
            vase__envelope__free_unpacked(req, NULL);
            continue;
        }
        int tamper = __atomic_load_n(&p->tamper, __ATOMIC_SEQ_CST);
        int field = __atomic_load_n(&p->tamper_field, __ATOMIC_SEQ_CST);
        Vase__Pong pong = VASE__PONG__INIT;
        Vase__ModelLayout ml = VASE__MODEL_LAYOUT__INIT;
        Vase__SeqLayout sl = VASE__SEQ_LAYOUT__INIT;
        Vase__EvictPlan ep = VASE__EVICT_PLAN__INIT;
        Vase__CommitReply cr = VASE__COMMIT_REPLY__INIT;
        Vase__Ok ok = VASE__OK__INIT;
        Vase__Error err = VASE__ERROR__INIT;
        Vase__Envelope r = VASE__ENVELOPE__INIT;
        int code = 0;
        r.version = VASE_WIRE_VERSION;
        r.incarnation = INCARNATION;
        r.request_id = req->request_id;
        switch (req->body_case) {
        case VASE__ENVELOPE__BODY_PING:
            pong.payload = req->ping->payload;
            r.body_case = VASE__ENVELOPE__BODY_PONG;
            r.pong = &pong;
            break;
        case VASE__ENVELOPE__BODY_REGISTER_MODEL:
            bump(&p->n_register);
            code = answer_register(p, req->register_model, tamper, field, &ml);
            r.body_case = VASE__ENVELOPE__BODY_MODEL_LAYOUT;
            r.model_layout = &ml;
            break;
        case VASE__ENVELOPE__BODY_OPEN_SEQ:
            bump(&p->n_open);
            code = answer_open(p, req->open_seq, tamper, &sl);
            r.body_case = VASE__ENVELOPE__BODY_SEQ_LAYOUT;
            r.seq_layout = &sl;
            break;
        case VASE__ENVELOPE__BODY_CLOSE_SEQ:
            bump(&p->n_close);
            r.body_case = VASE__ENVELOPE__BODY_OK;
            r.ok = &ok;
            break;
        case VASE__ENVELOPE__BODY_EVICT_REQUEST:
            bump(&p->n_evict);
            code = answer_evict(p, req->evict_request, tamper, &ep);
            r.body_case = VASE__ENVELOPE__BODY_EVICT_PLAN;
            r.evict_plan = &ep;
            break;
        case VASE__ENVELOPE__BODY_EVICT_COMMIT:
            bump(&p->n_commit);
            code = answer_commit(p, req->evict_commit, tamper, &cr);
            r.body_case = VASE__ENVELOPE__BODY_COMMIT_REPLY;
            r.commit_reply = &cr;
            break;
        default:
            code = EOPNOTSUPP;
            break;
        }
        if (code) {
            err.code = code;
            err.message = "the fake daemon cannot do that";
            r.body_case = VASE__ENVELOPE__BODY_ERROR;
            r.error = &err;
        }
        void *out;
        size_t len;
        if (vase_wire_pack(&r, &out, &len) == 0) {
            zmq_send(p->router, id, (size_t)idn, ZMQ_SNDMORE);
            zmq_send(p->router, out, len, 0);
            free(out);
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
        send_welcome(p, fd, VASE_WIRE_VERSION + 1, true);
        break;
    case PEER_WELCOME:
        send_welcome(p, fd, VASE_WIRE_VERSION, true);
        if (p->serve_ping)
            serve_requests(p);
        break;
    case PEER_NO_FD:
        send_welcome(p, fd, VASE_WIRE_VERSION, false);
        break;
    case PEER_SHORT_MEMFD:
        assert_int_equal(ftruncate(p->memfd, PAGE), 0);
        send_welcome(p, fd, VASE_WIRE_VERSION, true);
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
    assert_int_equal(s.arenas[0].granules, NPAGES);
    assert_int_equal(s.arenas[0].granule_bytes, PAGE);
    assert_int_equal(s.arenas[0].size_bytes, PAGE * NPAGES);
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
    g.layers = 1000; /* pages of 16 * 1000 * 2 * 64 bytes > the 64 KiB arena */
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
    /* None of these reached the daemon. */
    assert_int_equal(count(&p->n_register), 0);

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

/* ---- layouts against a fake daemon ---- */

/* The model of these tests: 2 layers, 4 query heads, 2 KV heads, dim 8, float32, 16-token
 * pages of 16 * 2 * 2 * 2 * 8 * 4 = 4096 bytes; the 64 KiB arena holds 16 blocks. */
static const struct vase_geometry small_model = {
    .name = "small",
    .layers = 2,
    .q_heads = 4,
    .kv_heads = 2,
    .head_dim = 8,
    .dtype = VASE_DTYPE_F32,
    .block_tokens = 16,
    .arena = 0,
};

static struct vase_client *connect_fake(struct peer *p) {
    struct vase_client *c = NULL;
    struct vase_connect_options o = {
        .runtime_dir = p->dir, .name = "unit", .timeout_ms = PATIENCE_MS};
    p->serve_ping = true;
    peer_start(p, PEER_WELCOME);
    assert_int_equal(vase_connect(&o, &c), 0);
    return c;
}

static void test_model_layout_refused(void **state) {
    struct peer *p = *state;
    struct vase_client *c = connect_fake(p);
    struct vase_model *m = NULL;

    /* Each field of ModelLayout is checked: one off by one is a protocol error. */
    for (int field = 0; field <= 10; field++) {
        set_tamper(p, TAMPER_MODEL_FIELD, field);
        assert_int_equal(vase_model_register(c, &small_model, &m), -EPROTO);
        assert_null(m);
        assert_non_null(strstr(vase_last_error(c), "layout"));
    }
    assert_int_equal(count(&p->n_register), 11);
    set_tamper(p, TAMPER_NONE, 0);
    assert_int_equal(vase_model_register(c, &small_model, &m), 0);
    assert_non_null(m);
    assert_int_equal(vase_model_tokens_per_page(m), 16);
    assert_int_equal(vase_model_page_bytes(m), 4096);
    assert_int_equal(count(&p->n_register), 12);
    /* block_tokens 0 is 16: the same geometry under the same name gives back the model already
     * registered, without a word to the daemon. */
    struct vase_geometry g = small_model;
    g.block_tokens = 0;
    struct vase_model *m0 = NULL;
    assert_int_equal(vase_model_register(c, &g, &m0), 0);
    assert_ptr_equal(m0, m);
    assert_int_equal(count(&p->n_register), 12);
    /* Another name, another dtype, another block size: another model. */
    g.name = "other";
    assert_int_equal(vase_model_register(c, &g, &m0), 0);
    assert_ptr_not_equal(m0, m);
    assert_int_equal(vase_model_tokens_per_page(m0), 16);
    assert_int_equal(count(&p->n_register), 13);
    struct vase_model *again = NULL;
    assert_int_equal(vase_model_register(c, &g, &again), 0);
    assert_ptr_equal(again, m0);
    g.name = small_model.name;
    g.dtype = VASE_DTYPE_F16;
    assert_int_equal(vase_model_register(c, &g, &again), 0);
    assert_ptr_not_equal(again, m);
    assert_int_equal(count(&p->n_register), 14);
    g.dtype = small_model.dtype;

    /* A block size whose page does not fit the arena: 1024 tokens make 262144-byte pages in a
     * 65536-byte arena. The library refuses it without asking the daemon, and says what to
     * change. */
    g.block_tokens = 1024;
    m0 = NULL;
    assert_int_equal(vase_model_register(c, &g, &m0), -EINVAL);
    assert_null(m0);
    const char *why = vase_last_error(c);
    assert_non_null(strstr(why, "block_tokens"));
    assert_non_null(strstr(why, "1024 tokens"));
    assert_non_null(strstr(why, "262144 bytes"));
    assert_non_null(strstr(why, "65536 bytes"));
    assert_non_null(strstr(why, "smaller block_tokens or a larger arena"));
    assert_int_equal(count(&p->n_register), 14);
    /* 64 tokens fit: 16384-byte pages, four of them. */
    g.block_tokens = 64;
    assert_int_equal(vase_model_register(c, &g, &m0), 0);
    assert_int_equal(vase_model_page_bytes(m0), 16384);
    assert_int_equal(vase_model_tokens_per_page(m0), 64);
    struct vase_tensor t;
    assert_int_equal(vase_model_kv_tensor(m0, 0, VASE_K, &t), 0);
    assert_int_equal(t.shape[0], 4);
    assert_int_equal(t.shape[1], 64);
    assert_null(vase_disconnect(c));
    peer_stop(p);
}

static void test_kv_tensor(void **state) {
    struct peer *p = *state;
    struct vase_client *c = connect_fake(p);
    struct vase_model *m = NULL;
    struct vase_tensor t, t0;

    assert_int_equal(vase_model_register(c, &small_model, &m), 0);
    assert_int_equal(vase_model_kv_tensor(m, 0, VASE_K, &t0), 0);
    assert_non_null(t0.data);
    assert_int_equal(vase_model_kv_tensor(m, 1, VASE_V, &t), 0);
    /* Layer 1's V: one layer (2 * 16 * 2 * 8 * 4 = 2048 bytes) and one K (1024) further. */
    assert_ptr_equal(t.data, (char *)t0.data + 2048 + 1024);
    assert_int_equal(t.dtype, VASE_DTYPE_F32);
    assert_int_equal(t.device, -1);
    assert_int_equal(t.ndim, 4);
    const int64_t shape[4] = {16, 16, 2, 8}, strides[4] = {1024, 16, 8, 1},
                  bytes[4] = {4096, 64, 32, 4};
    assert_memory_equal(t.shape, shape, sizeof(shape));
    assert_memory_equal(t.strides, strides, sizeof(strides));
    assert_memory_equal(t.byte_strides, bytes, sizeof(bytes));

    /* The tensor is the arena: what the test writes into the memfd at block 3, token 5, head 1
     * of layer 1's V is that element. */
    float x = 2.5f, got;
    off_t at = 3 * 4096 + 2048 + 1024 + 5 * 64 + 32;
    assert_int_equal(pwrite(p->memfd, &x, sizeof(x), at), (ssize_t)sizeof(x));
    memcpy(&got, (char *)t.data + 3 * bytes[0] + 5 * bytes[1] + 1 * bytes[2], sizeof(got));
    assert_true(got == 2.5f);

    memset(&t, 0x5a, sizeof(t));
    struct vase_tensor before = t;
    assert_int_equal(vase_model_kv_tensor(m, 2, VASE_K, &t), -EINVAL);
    assert_non_null(strstr(vase_last_error(c), "layer 2 of 2"));
    assert_int_equal(vase_model_kv_tensor(m, 0, (enum vase_kv)2, &t), -EINVAL);
    assert_memory_equal(&t, &before, sizeof(t));
    assert_int_equal(vase_model_kv_tensor(m, 0, VASE_K, NULL), -EINVAL);
    assert_int_equal(vase_model_kv_tensor(NULL, 0, VASE_K, &t), -EINVAL);
    assert_null(vase_disconnect(c));
    peer_stop(p);
}

static struct vase_seq_config seq_config(void) {
    struct vase_seq_config cfg = {
        .policy = VASE_POLICY_STREAMING,
        .params = vase_params_default(32),
        .prompt_len = 0,
        .seed = 1,
        .mode = VASE_MODE_SYNC,
        .slack = 16,
    };
    cfg.params.window = 16;
    return cfg;
}

static void test_seq_layout_refused(void **state) {
    struct peer *p = *state;
    struct vase_client *c = connect_fake(p);
    struct vase_model *m = NULL;
    struct vase_seq *s = NULL;
    struct vase_seq_config cfg = seq_config();
    const enum tamper bad[] = {TAMPER_ONE_PAGE_MORE, TAMPER_ONE_PAGE_FEWER, TAMPER_CAPACITY,
                               TAMPER_KV_INDEX, TAMPER_PLAN_INDEX};

    assert_int_equal(vase_model_register(c, &small_model, &m), 0);
    /* budget 32 + window 16 + slack 16 = 64 slots: 4 blocks, exactly. */
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        set_tamper(p, bad[i], 0);
        assert_int_equal(vase_seq_open(c, m, &cfg, &s), -EPROTO);
        assert_null(s);
        assert_non_null(strstr(vase_last_error(c), "layout of the new sequence"));
        /* The pages the daemon reserved are given back. */
        assert_int_equal(count(&p->n_close), i + 1);
    }
    assert_int_equal(count(&p->n_open), 5);

    /* Plan pages are counted in units of their own size: the last of the 256 plan pages of
     * 256 bytes is inside the arena, though its index is far beyond the 16 blocks. */
    set_tamper(p, TAMPER_PLAN_INDEX_LAST, 0);
    assert_int_equal(vase_seq_open(c, m, &cfg, &s), 0);
    assert_int_equal(vase_seq_close(s), 0);
    assert_int_equal(count(&p->n_close), 6);

    set_tamper(p, TAMPER_NONE, 0);
    s = NULL;
    assert_int_equal(vase_seq_open(c, m, &cfg, &s), 0);
    assert_int_equal(vase_seq_capacity(s), 64);
    const int32_t *table = NULL;
    uint32_t n = 0;
    assert_int_equal(vase_seq_block_table(s, &table, &n), 0);
    const int32_t want[] = {15, 13, 11, 9};
    assert_int_equal(n, 4);
    assert_memory_equal(table, want, sizeof(want));
    /* A host arena has no device copy. */
    assert_null(vase_seq_block_table_device(s));
    assert_null(vase_seq_block_table_device(NULL));
    assert_int_equal(vase_seq_block_table(s, NULL, &n), -EINVAL);
    assert_int_equal(vase_seq_block_table(s, &table, NULL), -EINVAL);
    assert_int_equal(vase_seq_block_table(NULL, &table, &n), -EINVAL);

    /* Element [table[slot / 16]][slot % 16][h] of the tensor is the slot's row. */
    struct vase_tensor t;
    for (uint32_t layer = 0; layer < 2; layer++)
        for (int kv = VASE_K; kv <= VASE_V; kv++) {
            assert_int_equal(vase_model_kv_tensor(m, layer, (enum vase_kv)kv, &t), 0);
            for (uint32_t slot = 0; slot < 64; slot++)
                for (uint32_t h = 0; h < 2; h++)
                    assert_ptr_equal((char *)t.data + table[slot / 16] * t.byte_strides[0] +
                                         (slot % 16) * t.byte_strides[1] + h * t.byte_strides[2],
                                     vase_seq_kv_ptr(s, layer, (enum vase_kv)kv, slot, h));
        }
    assert_int_equal(vase_seq_close(s), 0);
    assert_null(vase_disconnect(c));
    peer_stop(p);
}

/* Fills every slot below len of both layers with K = slot + 1000 * layer, V = -(that). */
static void fill(struct vase_seq *s, uint32_t len) {
    float k[16], v[16];
    for (uint32_t layer = 0; layer < 2; layer++)
        for (uint32_t slot = 0; slot < len; slot++) {
            for (int i = 0; i < 16; i++) {
                k[i] = (float)(slot + 1000 * layer);
                v[i] = -k[i];
            }
            assert_int_equal(vase_seq_write_kv(s, layer, slot, k, v), 0);
        }
}

/* One eviction in sync mode: 48 slots, the plan keeps the even candidates of 0 .. 31 and the
 * window 32 .. 47 moves down behind them. */
static void evict_once(struct peer *p, struct vase_seq *s) {
    unsigned evicts = count(&p->n_evict);
    fill(s, 48);
    assert_int_equal(vase_seq_append(s, 47), 0);
    assert_int_equal(vase_seq_append(s, 1), 1);
    assert_int_equal(count(&p->n_evict), evicts + 1);
    assert_int_equal(vase_seq_len(s), 32);
    float k[16], v[16];
    for (uint32_t layer = 0; layer < 2; layer++)
        for (uint32_t slot = 0; slot < 32; slot++) {
            assert_int_equal(vase_seq_read_kv(s, layer, slot, k, v), 0);
            float want = (float)((slot < 16 ? 2 * slot : slot + 16) + 1000 * layer);
            assert_true(k[0] == want && k[15] == want && v[0] == -want && v[15] == -want);
        }
}

static void test_commit_reply(void **state) {
    struct peer *p = *state;
    struct vase_client *c = connect_fake(p);
    struct vase_model *m = NULL;
    struct vase_seq *s = NULL;
    struct vase_seq_config cfg = seq_config();
    const int32_t *table;
    uint32_t n;

    assert_int_equal(vase_model_register(c, &small_model, &m), 0);

    /* A commit reply that drops the tail the new length does not need is taken: 32 slots in
     * 2 blocks, the first two of the table. */
    assert_int_equal(vase_seq_open(c, m, &cfg, &s), 0);
    set_tamper(p, TAMPER_COMMIT_TAIL, 0);
    evict_once(p, s);
    assert_int_equal(vase_seq_flush(s), 0);
    assert_int_equal(count(&p->n_commit), 1);
    assert_int_equal(vase_seq_block_table(s, &table, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(table[0], 15);
    assert_int_equal(table[1], 13);
    assert_int_equal(vase_seq_capacity(s), 32);
    assert_int_equal(vase_seq_close(s), 0);

    /* One that changes an entry, adds one, or leaves less room than the new length is a
     * protocol error, and the sequence is broken for good. */
    const enum tamper bad[] = {TAMPER_COMMIT_CHANGE, TAMPER_COMMIT_GROW, TAMPER_COMMIT_SHORT,
                               TAMPER_COMMIT_BUDGET};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        set_tamper(p, bad[i], 0);
        s = NULL;
        assert_int_equal(vase_seq_open(c, m, &cfg, &s), 0);
        evict_once(p, s);
        assert_int_equal(vase_seq_flush(s), -EPROTO);
        assert_int_equal(count(&p->n_commit), 2 + i);
        assert_non_null(strstr(vase_last_error(c), "commit"));
        assert_int_equal(vase_seq_append(s, 1), -EPROTO);
        assert_int_equal(vase_seq_poll(s), -EPROTO);
        /* The table the engine holds is still the one its slots are in. */
        assert_int_equal(vase_seq_block_table(s, &table, &n), 0);
        assert_int_equal(n, 4);
        assert_int_equal(table[1], 13);
        assert_int_equal(vase_seq_capacity(s), 64);
        assert_int_equal(vase_seq_close(s), 0);
    }

    /* A plan that lowers the budget of a sequence that is not elastic is refused before it
     * moves anything, and breaks the sequence. */
    set_tamper(p, TAMPER_PLAN_BUDGET, 0);
    s = NULL;
    assert_int_equal(vase_seq_open(c, m, &cfg, &s), 0);
    fill(s, 48);
    assert_int_equal(vase_seq_append(s, 47), 0);
    assert_int_equal(vase_seq_append(s, 1), -EPROTO);
    assert_non_null(strstr(vase_last_error(c), "does not answer the eviction request"));
    assert_int_equal(vase_seq_len(s), 48);
    assert_int_equal(vase_seq_budget(s), 32);
    assert_int_equal(vase_seq_close(s), 0);

    /* An untouched reply keeps the table. */
    set_tamper(p, TAMPER_NONE, 0);
    s = NULL;
    assert_int_equal(vase_seq_open(c, m, &cfg, &s), 0);
    evict_once(p, s);
    assert_int_equal(vase_seq_flush(s), 0);
    assert_int_equal(vase_seq_block_table(s, &table, &n), 0);
    assert_int_equal(n, 4);
    assert_int_equal(vase_seq_capacity(s), 64);
    assert_int_equal(vase_seq_close(s), 0);
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
    assert_int_equal(vase_model_page_bytes(NULL), 0);
    struct vase_tensor t;
    assert_int_equal(vase_model_kv_tensor(NULL, 0, VASE_K, &t), -EINVAL);
    const int32_t *table;
    uint32_t n;
    assert_int_equal(vase_seq_block_table(NULL, &table, &n), -EINVAL);
    assert_null(vase_seq_block_table_device(NULL));
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
        T(test_model_layout_refused),
        T(test_kv_tensor),
        T(test_seq_layout_refused),
        T(test_commit_reply),
        cmocka_unit_test(test_null_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
