/* SPDX-License-Identifier: MIT */

/*
 * The per-uid caps against a real vased, with peers of two other uids (children that drop
 * privileges; the test runs as root): the clients of one uid together get at most
 * max_sessions_per_uid sessions, max_seqs_per_uid sequences, max_waiting_opens_per_uid opens
 * waiting for room and max_stats_bytes_per_uid of statistics, however many sessions they spread
 * them over, each refused with the per-client cap's errno, while another uid still gets in;
 * root is not capped.
 */

#include <errno.h>
#include <grp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "integration/harness.h"

#define UID_A 40011 /* the other tenant; its gid is the same number */
#define UID_B 40012 /* the uid that takes all it may */
#define LONG_WAIT_MS 120000

static int setup(void **state) {
    static const char *const args[] = {
        "--allow-users=40011,40012",     "--max-sessions-per-uid=3",
        "--max-seqs-per-uid=3",          "--max-waiting-opens-per-uid=2",
        "--max-stats-bytes-per-uid=48K", "--arena-bytes=16M",
        "--metrics-address=127.0.0.1:0", NULL};
    int r = harness_fixture_setup(state, sizeof(struct harness_fixture), args);
    if (r < 0)
        return r;
    /* The socket files opened to everyone, so that the daemon's own checks are the only gate. */
    struct harness_fixture *f = *state;
    static const char *const socks[] = {"session.sock", "control.sock", "events.sock"};
    if (getuid() != 0) {
        fprintf(stderr, "this test must run as root (it switches to other users)\n");
        return -1;
    }
    if (chmod(f->d.dir, 0755) < 0)
        return -1;
    for (size_t i = 0; i < 3; i++) {
        char path[128];
        harness_daemon_path(&f->d, socks[i], path, sizeof(path));
        if (chmod(path, 0666) < 0)
            return -1;
    }
    return 0;
}

static int teardown(void **state) {
    return harness_fixture_teardown(state);
}

/* In a child: a failed expectation prints and makes the child exit non-zero. */
#define CHILD_EXPECT(cond, ...)                                                                    \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "child uid %u, line %d: ", (unsigned)getuid(), __LINE__);              \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            return 10;                                                                             \
        }                                                                                          \
    } while (0)

typedef int part_fn(const struct harness_daemon *d, void *arg);

/* A part run in a child as uid (0: stays root) that keeps what it opened until released. */
struct holder {
    const struct harness_daemon *d;
    uid_t uid;
    part_fn *fn;
    void *arg;
    int ready[2], done[2];
    pid_t pid;
};

static int become(uid_t uid) {
    if (uid == 0)
        return 0;
    return setgroups(0, NULL) < 0 || setgid((gid_t)uid) < 0 || setuid(uid) < 0 ? -1 : 0;
}

static int holder_child(void *arg) {
    struct holder *h = arg;
    close(h->ready[0]);
    close(h->done[1]);
    if (become(h->uid) < 0) {
        fprintf(stderr, "child: cannot become %u\n", (unsigned)h->uid);
        return 2;
    }
    int r = h->fn(h->d, h->arg);
    if (r != 0)
        return r;
    if (write(h->ready[1], "r", 1) != 1)
        return 3;
    char c;
    (void)!read(h->done[0], &c, 1);
    /* Its sessions close with the process, waiting opens and all: threads may still wait. */
    _exit(0);
}

/* Starts h's part and waits until it holds what it opened (fails the test if it failed). */
static void hold(struct holder *h) {
    assert_int_equal(pipe(h->ready), 0);
    assert_int_equal(pipe(h->done), 0);
    assert_int_equal(harness_fork(holder_child, h, &h->pid), 0);
    close(h->ready[1]);
    close(h->done[0]);
    char c;
    if (read(h->ready[0], &c, 1) != 1) {
        int status = 0;
        harness_wait_pid(h->pid, HARNESS_RUN_MS, &status);
        fail_msg("the part run as uid %u failed (wait status 0x%x)", (unsigned)h->uid, status);
    }
}

static void release(struct holder *h) {
    int status;
    assert_int_equal(write(h->done[1], "d", 1), 1);
    assert_int_equal(harness_wait_pid(h->pid, HARNESS_RUN_MS, &status), 0);
    close(h->ready[0]);
    close(h->done[1]);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("the part run as uid %u failed (wait status 0x%x)", (unsigned)h->uid, status);
}

/* Runs fn in a child as uid to its end; fails the test unless it exits 0. */
static void run_as(const struct harness_daemon *d, uid_t uid, part_fn *fn, void *arg) {
    struct holder h = {.d = d, .uid = uid, .fn = fn, .arg = arg};
    hold(&h);
    release(&h);
}

/* ---- sessions ---- */

static int b_takes_sessions(const struct harness_daemon *d, void *arg) {
    (void)arg;
    static struct vase_client *c[4]; /* kept open while held */
    for (int i = 0; i < 3; i++)
        CHILD_EXPECT(harness_connect(d, "b", &c[i]) == 0, "session %d of uid B refused", i + 1);
    int r = harness_connect(d, "b", &c[3]);
    CHILD_EXPECT(r == -EUSERS, "the 4th session of uid B: %d, not -EUSERS", r);
    return 0;
}

static int a_connects(const struct harness_daemon *d, void *arg) {
    (void)arg;
    struct vase_client *c;
    int r = harness_connect(d, "a", &c);
    CHILD_EXPECT(r == 0, "uid A refused a session: %d", r);
    CHILD_EXPECT(vase_ping(c) == 0, "uid A's ping failed");
    vase_disconnect(c);
    return 0;
}

/* max_sessions_per_uid sessions of uid B; its next handshake is refused with -EUSERS (as at
 * max_clients) while uid A still gets in; root is not capped. */
static void test_sessions(void **state) {
    struct harness_fixture *f = *state;
    struct holder b = {.d = &f->d, .uid = UID_B, .fn = b_takes_sessions};
    hold(&b);
    run_as(&f->d, UID_A, a_connects, NULL);
    assert_int_equal(harness_wait_clients(&f->d, 3, HARNESS_WAIT_MS), 0);
    for (int i = 0; i < 4; i++)
        assert_int_equal(harness_connect(&f->d, "root", &f->c[i]), 0);
    release(&b);
}

/* ---- sequences ---- */

static int b_takes_seqs(const struct harness_daemon *d, void *arg) {
    (void)arg;
    struct vase_geometry g = harness_geometry();
    static struct vase_client *c[2];
    static struct vase_model *m[2];
    static struct vase_seq *s[4];
    struct vase_seq_config cfg = harness_seq_config(VASE_POLICY_STREAMING, 64, 32, 0, 0);
    for (int i = 0; i < 2; i++)
        CHILD_EXPECT(harness_engine_open(d, "b", &g, &c[i], &m[i]) == 0, "uid B's engine");
    /* Two sequences on one session, one on the other: the uid's three. */
    for (int i = 0; i < 3; i++)
        CHILD_EXPECT(vase_seq_open(c[i / 2], m[i / 2], &cfg, &s[i]) == 0,
                     "sequence %d of uid B refused: %s", i + 1, vase_last_error(c[i / 2]));
    int r = vase_seq_open(c[1], m[1], &cfg, &s[3]);
    CHILD_EXPECT(r == -EDQUOT, "the 4th sequence of uid B: %d, not -EDQUOT", r);
    CHILD_EXPECT(strstr(vase_last_error(c[1]), "max_seqs_per_uid"), "reason: %s",
                 vase_last_error(c[1]));
    return 0;
}

static int a_opens_seq(const struct harness_daemon *d, void *arg) {
    (void)arg;
    struct vase_geometry g = harness_geometry();
    struct vase_client *c;
    struct vase_model *m;
    struct vase_seq *s;
    struct vase_seq_config cfg = harness_seq_config(VASE_POLICY_STREAMING, 64, 32, 0, 0);
    CHILD_EXPECT(harness_engine_open(d, "a", &g, &c, &m) == 0, "uid A's engine");
    int r = vase_seq_open(c, m, &cfg, &s);
    CHILD_EXPECT(r == 0, "uid A's sequence refused: %d %s", r, vase_last_error(c));
    vase_disconnect(c);
    return 0;
}

/* max_seqs_per_uid sequences over two sessions of uid B; its next open is refused with -EDQUOT
 * (as at max_seqs_per_client) and counted as a quota refusal, while uid A still opens one. */
static void test_seqs(void **state) {
    struct harness_fixture *f = *state;
    struct holder b = {.d = &f->d, .uid = UID_B, .fn = b_takes_seqs};
    hold(&b);
    run_as(&f->d, UID_A, a_opens_seq, NULL);
    char *response;
    const char *text;
    assert_int_equal(harness_scrape(&f->d, &response, &text), 0);
    assert_true(harness_metric(text, "vase_admission_refusals_total{reason=\"quota\"}") == 1);
    free(response);
    release(&b);
}

/* ---- opens waiting for room ---- */

/* Root (not capped) fills the arena with sequences of 12 pages, and keeps them. */
static int root_fills(const struct harness_daemon *d, void *arg) {
    (void)arg;
    struct vase_geometry g = harness_geometry();
    static struct vase_client *c;
    static struct vase_model *m;
    static struct vase_seq *s[256];
    CHILD_EXPECT(harness_engine_open(d, "fill", &g, &c, &m) == 0, "root's engine");
    struct vase_seq_config cfg = harness_seq_config(VASE_POLICY_STREAMING, 12 * 64 - 64, 32, 0, 0);
    CHILD_EXPECT(harness_fill(c, m, cfg, s, 256) >= 2, "the arena took fewer than 2");
    return 0;
}

static struct vase_seq_config waiting(int32_t wait_ms) {
    struct vase_seq_config cfg = harness_seq_config(VASE_POLICY_STREAMING, 12 * 64 - 64, 32, 0, 0);
    cfg.admission_wait_ms = wait_ms;
    return cfg;
}

static int b_parks(const struct harness_daemon *d, void *arg) {
    (void)arg;
    struct vase_geometry g = harness_geometry();
    static struct vase_client *c[3];
    static struct vase_model *m[3];
    static struct harness_opener o[2];
    for (int i = 0; i < 3; i++)
        CHILD_EXPECT(harness_engine_open(d, "b", &g, &c[i], &m[i]) == 0, "uid B's engine");
    /* One waiting open on each of two sessions: the uid's two. */
    for (int i = 0; i < 2; i++) {
        o[i] = (struct harness_opener){.c = c[i], .m = m[i], .cfg = waiting(LONG_WAIT_MS)};
        harness_opener_start(&o[i]);
        harness_wait_parked(d, (uint32_t)i + 1);
    }
    struct vase_seq *s;
    struct vase_seq_config cfg = waiting(LONG_WAIT_MS);
    int r = vase_seq_open(c[2], m[2], &cfg, &s);
    CHILD_EXPECT(r == -EDQUOT, "the 3rd waiting open of uid B: %d, not -EDQUOT", r);
    CHILD_EXPECT(strstr(vase_last_error(c[2]), "max_waiting_opens_per_uid"), "reason: %s",
                 vase_last_error(c[2]));
    return 0;
}

static int a_waits(const struct harness_daemon *d, void *arg) {
    (void)arg;
    struct vase_geometry g = harness_geometry();
    struct vase_client *c;
    struct vase_model *m;
    struct vase_seq *s;
    CHILD_EXPECT(harness_engine_open(d, "a", &g, &c, &m) == 0, "uid A's engine");
    /* Parked like any other (no room comes): refused only once its wait is over. */
    struct vase_seq_config cfg = waiting(300);
    int r = vase_seq_open(c, m, &cfg, &s);
    CHILD_EXPECT(r == -ENOSPC, "uid A's waiting open: %d, not -ENOSPC", r);
    CHILD_EXPECT(strstr(vase_last_error(c), "waited"), "not parked: %s", vase_last_error(c));
    vase_disconnect(c);
    return 0;
}

/* max_waiting_opens_per_uid opens of uid B wait for room, over two sessions; its next open that
 * finds no room is refused at once with -EDQUOT (as beyond max_seqs_per_client waiting), while
 * uid A's open still waits its turn. */
static void test_waiting_opens(void **state) {
    struct harness_fixture *f = *state;
    struct holder fill = {.d = &f->d, .uid = 0, .fn = root_fills};
    struct holder b = {.d = &f->d, .uid = UID_B, .fn = b_parks};
    hold(&fill);
    hold(&b);
    run_as(&f->d, UID_A, a_waits, NULL);
    release(&b);
    release(&fill);
}

/* ---- statistics ---- */

/* Pushes accumulators for layer 0 of s; the daemon's answer (the refusal of a push arrives with
 * the next reply: a Ping makes it arrive, the next call on the sequence returns it). */
static int push_acc(struct vase_client *c, struct vase_seq *s, const struct vase_geometry *g) {
    float v[2 * 64] = {0};
    int r = vase_seq_push_stats(s, 0, VASE_STATS_ACC_ADD, v, 64);
    (void)g;
    if (r < 0)
        return r;
    if ((r = vase_ping(c)) < 0)
        return r;
    return vase_seq_poll(s);
}

/* An h2o sequence whose accumulators take 2 layers * 2 heads * 1088 slots * 4 = 17408 bytes. */
static int open_h2o(struct vase_client *c, struct vase_model *m, const struct vase_geometry *g,
                    struct vase_seq **ret) {
    struct vase_seq_config cfg = harness_seq_config(VASE_POLICY_H2O, 1024, 32, 64, 0);
    int r = vase_seq_open(c, m, &cfg, ret);
    if (r < 0)
        return r;
    return harness_append_tokens(*ret, g, 0, 64, true);
}

static int b_pushes(const struct harness_daemon *d, void *arg) {
    (void)arg;
    struct vase_geometry g = harness_geometry();
    static struct vase_client *c[2];
    static struct vase_model *m[2];
    static struct vase_seq *s[3];
    for (int i = 0; i < 2; i++)
        CHILD_EXPECT(harness_engine_open(d, "b", &g, &c[i], &m[i]) == 0, "uid B's engine");
    /* Two accumulators fit in 48 KiB, both on one session; a third, on the other, does not,
     * though that session's own quota (128M) has all its room. */
    for (int i = 0; i < 3; i++) {
        struct vase_client *ci = c[i / 2];
        CHILD_EXPECT(open_h2o(ci, m[i / 2], &g, &s[i]) == 0, "uid B's h2o sequence %d", i);
        int r = push_acc(ci, s[i], &g);
        CHILD_EXPECT(r == (i < 2 ? 0 : -EDQUOT), "uid B's push %d: %d", i + 1, r);
    }
    CHILD_EXPECT(strstr(vase_last_error(c[1]), "max_stats_bytes_per_uid"), "reason: %s",
                 vase_last_error(c[1]));
    return 0;
}

static int a_pushes(const struct harness_daemon *d, void *arg) {
    (void)arg;
    struct vase_geometry g = harness_geometry();
    struct vase_client *c;
    struct vase_model *m;
    struct vase_seq *s;
    CHILD_EXPECT(harness_engine_open(d, "a", &g, &c, &m) == 0, "uid A's engine");
    CHILD_EXPECT(open_h2o(c, m, &g, &s) == 0, "uid A's h2o sequence");
    int r = push_acc(c, s, &g);
    CHILD_EXPECT(r == 0, "uid A's push: %d %s", r, vase_last_error(c));
    vase_disconnect(c);
    return 0;
}

/* The statistics of uid B's sessions together stop at max_stats_bytes_per_uid (-EDQUOT, as at
 * max_stats_bytes_per_client), while uid A's are still taken. */
static void test_stats(void **state) {
    struct harness_fixture *f = *state;
    struct holder b = {.d = &f->d, .uid = UID_B, .fn = b_pushes};
    hold(&b);
    run_as(&f->d, UID_A, a_pushes, NULL);
    release(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_sessions, setup, teardown),
        cmocka_unit_test_setup_teardown(test_seqs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_waiting_opens, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stats, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
