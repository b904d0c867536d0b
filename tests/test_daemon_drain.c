/* SPDX-License-Identifier: MIT */

/*
 * Unit tests of daemon/serve/drain.c with clients.c and registry.c: a client whose session closes
 * while its process may still run GPU work keeps the pages of its device sequences out of the free
 * pool until its process is gone and the grace has passed, while its host pages return at once; a
 * process that lives on (a clean disconnect) gets nothing held. The processes are real children
 * of the test, watched by real pidfds; the device arena is a stand-in whose only property is being
 * on a device, which is all the draining looks at.
 */

#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include <cmocka.h>

#include "../daemon/core/alloc.h"
#include "../daemon/core/arena.h"
#include "../daemon/serve/clients.h"
#include "../daemon/serve/drain.h"
#include "../daemon/core/events.h"
#include "../daemon/core/log.h"
#include "../daemon/core/registry.h"
#include "../daemon/plan/planner.h"
#include "../daemon/state.h"

#define ARENA (4u << 20)
#define GRANULE (64u << 10)

/* layers, q heads, KV heads, head dim, dtype, block tokens: KV pages of 64 KiB. */
static const struct vase_layout_geometry tiny = {4, 6, 2, 16, VASE_DTYPE_F32, 64};

static const struct vase_arena_ops device_ops = {.share = "test-device", .on_device = true};

/* A child that waits until the test writes to its pipe, then exits. */
struct child {
    pid_t pid;
    int wake; /* write end */
};

static void child_start(struct child *ch) {
    int p[2];
    assert_int_equal(pipe(p), 0);
    ch->pid = fork();
    assert_true(ch->pid >= 0);
    if (ch->pid == 0) {
        char b;
        close(p[1]);
        while (read(p[0], &b, 1) < 0 && errno == EINTR)
            ;
        _exit(0);
    }
    close(p[0]);
    ch->wake = p[1];
}

/* Makes the child exit and waits until pidfd says so (not reaped: it stays a zombie). */
static void child_exit(struct child *ch, int pidfd) {
    struct pollfd p = {.fd = pidfd, .events = POLLIN};
    close(ch->wake);
    ch->wake = -1;
    /* A bound that only a lost exit reaches, never a slow one. */
    assert_int_equal(poll(&p, 1, 60000), 1);
}

static void child_reap(struct child *ch) {
    if (ch->wake >= 0)
        close(ch->wake);
    ch->wake = -1;
    if (ch->pid > 0)
        assert_int_equal(waitpid(ch->pid, NULL, 0), ch->pid);
    ch->pid = -ch->pid; /* reaped; the pid may be anyone's now */
}

/* Descriptors open in this process. */
static int count_fds(void) {
    DIR *dir = opendir("/proc/self/fd");
    int n = 0;
    assert_non_null(dir);
    while (readdir(dir))
        n++;
    closedir(dir);
    return n;
}

struct fixture {
    int fds; /* open before setup: teardown checks none leaked, pidfds included */
    void *ctx;
    struct vased *d;
    struct vase_arena device, host;
    struct vased_client *c;
    struct vased_seq *on_device, *on_host;
    int peer; /* the client's end of its session */
    struct child child;
};

/* Opens a sequence of client c (a model of its own each time) on arena_id: 0 or -errno. */
static int try_open(struct fixture *f, struct vased_client *c, uint32_t arena_id,
                    struct vased_seq **ret) {
    struct vase_layout lay;
    struct vased_model *m;
    char msg[256];
    struct vased_seq_request req = {.policy = VASE_POLICY_VASE_ATTNV, .prompt_len = 500};
    req.params = vase_params_default(256);
    req.params.window = 32;
    req.slack = 32;
    assert_int_equal(vase_layout_compute(&tiny, ARENA, &lay, msg, sizeof(msg)), 0);
    assert_int_equal(vase_registry_add_model(f->d->reg, c, "tiny", arena_id, &lay, &m), 0);
    return vase_registry_open_seq(f->d->reg, f->d->allocs[arena_id], c, m, &req, 64, 0, ret, msg,
                                  sizeof(msg));
}

static struct vased_seq *open_seq(struct fixture *f, uint32_t arena_id) {
    struct vased_seq *s;
    assert_int_equal(try_open(f, f->c, arena_id, &s), 0);
    return s;
}

/* A daemon with a device arena (0) and a host arena (1), and one client, the process of a child,
 * with a sequence on each. */
static int setup(void **state) {
    struct fixture *f = calloc(1, sizeof(*f));
    struct vased *d = calloc(1, sizeof(*d));
    int sv[2];

    f->fds = count_fds();
    f->d = d;
    f->ctx = zmq_ctx_new();
    assert_int_equal(vase_events_new(f->ctx, "inproc://test-drain-events", 1, &d->events), 0);
    assert_int_equal(vase_registry_new(vase_plan_run_free, &d->reg), 0);
    f->device = (struct vase_arena){.id = 0, .kind = "cuda:0", .ops = &device_ops, .fd = -1};
    f->host = (struct vase_arena){.id = 1, .kind = "host", .ops = &vase_arena_host_ops, .fd = -1};
    d->arenas[0] = &f->device;
    d->arenas[1] = &f->host;
    d->n_arenas = 2;
    for (int i = 0; i < 2; i++)
        assert_int_equal(vase_alloc_new(ARENA, GRANULE, &d->allocs[i]), 0);

    child_start(&f->child);
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    f->peer = sv[1];
    assert_int_equal(vase_registry_add_client(d->reg, sv[0], &f->c), 0);
    f->c->pid = (uint32_t)f->child.pid;
    f->c->arenas = 3;
    /* -ENOSYS only where pidfd_open(2) is not there (valgrind does not know it): the tests
     * that need a pidfd say they were skipped. */
    int r = vase_drain_watch(f->child.pid, &f->c->pidfd);
    assert_true(r == 0 || r == -ENOSYS);
    f->c->pidfd_error = r;
    f->on_device = open_seq(f, 0);
    f->on_host = open_seq(f, 1);
    assert_true(d->allocs[0]->used_bytes > 0);
    assert_true(d->allocs[1]->used_bytes > 0);
    assert_string_equal(vase_registry_client_state(f->c), "connected");
    *state = f;
    return 0;
}

static int teardown(void **state) {
    struct fixture *f = *state;
    struct vased *d = f->d;
    if (f->peer >= 0)
        close(f->peer);
    vase_registry_free(d->reg);
    for (int i = 0; i < 2; i++)
        vase_alloc_free(d->allocs[i]);
    vase_events_free(d->events);
    zmq_ctx_term(f->ctx);
    child_reap(&f->child);
    assert_int_equal(count_fds(), f->fds);
    free(d);
    free(f);
    return 0;
}

static void need_pidfd(const struct fixture *f) {
    if (f->c->pidfd < 0)
        skip();
}

/* The session ends: what the main loop does when the client's session socket reports it. */
static void close_session(struct fixture *f) {
    close(f->peer);
    f->peer = -1;
    vase_clients_on_session(f->d, f->c, f->c->fd, ZMQ_POLLIN);
}

static void test_watch_and_judge(void **state) {
    struct fixture *f = *state;
    need_pidfd(f);
    int fd;

    assert_int_equal(vase_drain_watch(0, &fd), -EINVAL);
    /* Alive and not exiting: it closed its session itself. */
    assert_int_equal(vase_drain_judge(f->child.pid, f->c->pidfd, 0), VASE_DRAIN_RELEASE);
    child_exit(&f->child, f->c->pidfd);
    assert_int_equal(vase_drain_judge(f->child.pid, f->c->pidfd, 0), VASE_DRAIN_EXITED);
    pid_t pid = f->child.pid;
    child_reap(&f->child);
    assert_int_equal(vase_drain_watch(pid, &fd), -ESRCH);
    /* Without a pidfd: gone before its hello, or not watchable. */
    assert_int_equal(vase_drain_judge(pid, -1, -ESRCH), VASE_DRAIN_RELEASE);
    assert_int_equal(vase_drain_judge(pid, -1, -ENOSYS), VASE_DRAIN_FALLBACK);
    assert_int_equal(vase_drain_judge(0, -1, -EINVAL), VASE_DRAIN_FALLBACK);
}

/* A process that lives on closed its session (libvase unmaps first): nothing is held. */
static void test_clean_disconnect(void **state) {
    struct fixture *f = *state;
    need_pidfd(f);
    close_session(f);
    assert_int_equal(f->d->reg->n_clients, 0);
    assert_int_equal(f->d->reg->n_draining, 0);
    assert_null(f->d->reg->orphans);
    assert_int_equal(f->d->allocs[0]->used_bytes, 0);
    assert_int_equal(f->d->allocs[1]->used_bytes, 0);
}

/*
 * The process died: its session closed and its exit is known. Its device pages stay out of the
 * free pool, charged to it and shown as draining, for the grace; its host pages return at once.
 */
static void test_dead_client_held_for_grace(void **state) {
    struct fixture *f = *state;
    need_pidfd(f);
    struct vased *d = f->d;
    struct vased_client *c = f->c;
    uint64_t device_bytes = vase_registry_seq_bytes(f->on_device);
    uint64_t device_used = d->allocs[0]->used_bytes;

    child_exit(&f->child, c->pidfd);
    close_session(f);
    assert_int_equal(d->reg->n_clients, 0);
    assert_int_equal(d->reg->n_seqs, 0);
    assert_int_equal(d->reg->n_draining, 1);
    assert_ptr_equal(d->reg->draining, c);
    assert_string_equal(vase_registry_client_state(c), "draining");
    assert_int_equal(c->fd, -1);
    assert_int_equal(c->pidfd, -1); /* its exit is known: nothing more to watch */
    assert_int_equal(c->n_held, 1);
    assert_int_equal(c->bytes, device_bytes);
    assert_null(vase_registry_find_token(d->reg, c->token, sizeof(c->token)));
    assert_int_equal(d->allocs[0]->used_bytes, device_used);
    assert_int_equal(d->allocs[1]->used_bytes, 0);

    double at = c->release_at;
    assert_true(at > 0);
    vase_drain_tick(d, at - VASED_DRAIN_GRACE / 2);
    assert_int_equal(d->reg->n_draining, 1);
    assert_int_equal(d->allocs[0]->used_bytes, device_used);
    vase_drain_tick(d, at);
    assert_int_equal(d->reg->n_draining, 0);
    assert_null(d->reg->draining);
    assert_null(d->reg->orphans);
    assert_int_equal(d->allocs[0]->used_bytes, 0);
}

/*
 * The point of it all: while the dead client's pages are held, another tenant that fills the
 * device arena never gets one of them; once they are released, it does.
 */
static void test_other_tenant_waits(void **state) {
    struct fixture *f = *state;
    struct vased *d = f->d;
    struct vased_client *other;
    struct vased_seq *s;
    int r;

    need_pidfd(f);
    child_exit(&f->child, f->c->pidfd);
    close_session(f);
    assert_int_equal(d->reg->n_draining, 1);
    const struct vased_seq *held = f->on_device; /* an orphan now, its pages kept */
    assert_int_equal(vase_registry_add_client(d->reg, -1, &other), 0);
    int opened = 0;
    while ((r = try_open(f, other, 0, &s)) == 0) {
        opened++;
        for (uint32_t i = 0; i < s->n_pages; i++)
            for (uint32_t j = 0; j < held->n_pages; j++)
                assert_int_not_equal(s->pages[i], held->pages[j]);
    }
    assert_int_equal(r, -ENOSPC);
    assert_true(opened > 0);

    vase_drain_tick(d, d->reg->draining->release_at);
    assert_int_equal(d->reg->n_draining, 0);
    assert_int_equal(try_open(f, other, 0, &s), 0);
}

/*
 * The process is still exiting when its session closes: its device pages wait for its pidfd,
 * with no time limit, then for the grace. The order is what matters: no tick, however late,
 * returns them before the exit.
 */
static void test_pages_wait_for_exit(void **state) {
    struct fixture *f = *state;
    need_pidfd(f);
    struct vased *d = f->d;
    struct vased_client *c = f->c;
    uint64_t device_used = d->allocs[0]->used_bytes;

    /* What drop_client() does for a process judged exiting. */
    c->release_at = 0;
    vase_registry_close_seq(d->reg, d->allocs[1], f->on_host);
    vase_registry_hold_seq(d->reg, f->on_device);
    vase_drain_start(d, c);
    int pidfd = c->pidfd;
    assert_true(pidfd >= 0);

    vase_drain_tick(d, vased_now() + 1e6);
    assert_int_equal(d->reg->n_draining, 1);
    assert_int_equal(d->allocs[0]->used_bytes, device_used);
    /* An event for another fd changes nothing. */
    vase_drain_on_exit(d, c, pidfd + 1000, vased_now());
    assert_int_equal(c->release_at, 0);

    child_exit(&f->child, pidfd);
    double t = vased_now();
    vase_drain_on_exit(d, c, pidfd, t);
    assert_int_equal(c->pidfd, -1);
    assert_true(c->release_at == t + VASED_DRAIN_GRACE);
    vase_drain_tick(d, t);
    assert_int_equal(d->allocs[0]->used_bytes, device_used);
    vase_drain_tick(d, t + VASED_DRAIN_GRACE);
    assert_int_equal(d->reg->n_draining, 0);
    assert_int_equal(d->allocs[0]->used_bytes, 0);
}

/* A process that cannot be watched: its device pages are held for the fallback period. */
static void test_unwatchable(void **state) {
    struct fixture *f = *state;
    struct vased *d = f->d;
    struct vased_client *c = f->c;

    close(c->pidfd);
    c->pidfd = -1;
    c->pidfd_error = -ENOSYS;
    double before = vased_now();
    close_session(f);
    assert_int_equal(d->reg->n_draining, 1);
    assert_true(c->release_at >= before + VASED_DRAIN_FALLBACK);
    assert_int_equal(d->allocs[1]->used_bytes, 0);
    uint64_t used = d->allocs[0]->used_bytes;
    assert_true(used > 0);
    vase_drain_tick(d, c->release_at - 1);
    assert_int_equal(d->allocs[0]->used_bytes, used);
    vase_drain_tick(d, c->release_at);
    assert_int_equal(d->allocs[0]->used_bytes, 0);
}

/* Only device sequences are held: a client with none on a device is ended at once even if it
 * died. */
static void test_host_only(void **state) {
    struct fixture *f = *state;
    need_pidfd(f);
    struct vased *d = f->d;

    vase_registry_close_seq(d->reg, d->allocs[0], f->on_device);
    child_exit(&f->child, f->c->pidfd);
    close_session(f);
    assert_int_equal(d->reg->n_draining, 0);
    assert_int_equal(d->reg->n_clients, 0);
    assert_int_equal(d->allocs[1]->used_bytes, 0);
}

/* The registry freed with a draining client (shutdown): nothing leaks, pidfd included. */
static void test_free_while_draining(void **state) {
    struct fixture *f = *state;
    f->c->release_at = 0;
    vase_registry_hold_seq(f->d->reg, f->on_device);
    vase_registry_hold_seq(f->d->reg, f->on_host);
    vase_drain_start(f->d, f->c);
    assert_int_equal(f->c->n_held, 2);
    /* teardown frees the registry */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_watch_and_judge, setup, teardown),
        cmocka_unit_test_setup_teardown(test_clean_disconnect, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dead_client_held_for_grace, setup, teardown),
        cmocka_unit_test_setup_teardown(test_other_tenant_waits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pages_wait_for_exit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unwatchable, setup, teardown),
        cmocka_unit_test_setup_teardown(test_host_only, setup, teardown),
        cmocka_unit_test_setup_teardown(test_free_while_draining, setup, teardown),
    };
    vase_log_set_max_level(LOG_ERR);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
