/* SPDX-License-Identifier: MIT */

/*
 * Who may do what, tried against a real vased by peers of other uids (children that drop
 * privileges; the test runs as root): settings change only for root, the daemon's user and
 * admin_group; listings only for allowed uids and only of their arenas; the allow-list is applied
 * at accept, before a peer holds a pending slot; the runtime directory must be the daemon's
 * alone; peers cannot forge or flood log lines; one client's statistics cannot grow the daemon's
 * heap beyond its quota; arenas are separate trust domains.
 */

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <signal.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include <cmocka.h>

#include "integration/harness.h"
#include "wire.h"

#define STRANGER 12345 /* a uid and gid on no list and in no group */
#define ADMIN_GID 4242

static uid_t nobody_uid(void) {
    struct passwd *pw = getpwnam("nobody");
    if (!pw)
        fail_msg("no user \"nobody\" on this system");
    return pw->pw_uid;
}

static gid_t nobody_gid(void) {
    struct passwd *pw = getpwnam("nobody");
    if (!pw)
        fail_msg("no user \"nobody\" on this system");
    return pw->pw_gid;
}

/* The socket files opened to everyone, so that the daemon's own checks are the only gate. */
static void open_sockets(const struct harness_daemon *d) {
    static const char *const socks[] = {"session.sock", "control.sock", "events.sock"};
    if (getuid() != 0)
        fail_msg("this test must run as root (it switches to other users)");
    assert_int_equal(chmod(d->dir, 0755), 0);
    for (size_t i = 0; i < 3; i++) {
        char path[128];
        harness_daemon_path(d, socks[i], path, sizeof(path));
        assert_int_equal(chmod(path, 0666), 0);
    }
}

struct as_user {
    const struct harness_daemon *d;
    uid_t uid;
    gid_t gid;
    int (*fn)(const struct harness_daemon *d, void *arg);
    void *arg;
};

static int as_user_child(void *arg) {
    const struct as_user *a = arg;
    if (setgroups(0, NULL) < 0 || setgid(a->gid) < 0 || setuid(a->uid) < 0) {
        fprintf(stderr, "child: cannot become %u:%u\n", (unsigned)a->uid, (unsigned)a->gid);
        return 2;
    }
    return a->fn(a->d, a->arg);
}

/* Runs fn(d, arg) in a child as uid:gid (no supplementary groups); fails the test unless it
 * exits 0. */
static void run_as(const struct harness_daemon *d, uid_t uid, gid_t gid,
                   int (*fn)(const struct harness_daemon *d, void *arg), void *arg) {
    struct as_user a = {.d = d, .uid = uid, .gid = gid, .fn = fn, .arg = arg};
    pid_t pid;
    int status;
    assert_int_equal(harness_fork(as_user_child, &a, &pid), 0);
    assert_int_equal(harness_wait_pid(pid, 20000, &status), 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("the part run as %u:%u failed (wait status 0x%x)", (unsigned)uid, (unsigned)gid,
                 status);
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

static int call_code(const struct harness_daemon *d, Vase__Envelope__BodyCase body, void *msg,
                     Vase__Envelope **ret) {
    Vase__Envelope *reply = NULL;
    int r = harness_call(d, body, msg, &reply);
    if (ret)
        *ret = reply;
    else if (reply)
        vase__envelope__free_unpacked(reply, NULL);
    return r;
}

static int config_set(const struct harness_daemon *d, const char *key, const char *value) {
    return harness_config_set(d, key, value);
}

/* How many lines of the daemon's log contain needle (and, with prefix, start with it). */
static size_t log_count(const struct harness_daemon *d, const char *needle, bool prefix) {
    FILE *f = fopen(d->log, "r");
    char line[4096];
    size_t n = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof(line), f))
        if (prefix ? strncmp(line, needle, strlen(needle)) == 0 : strstr(line, needle) != NULL)
            n++;
    fclose(f);
    return n;
}

/* Polls the log until a line contains needle (the daemon writes it when it acts). */
static bool log_wait(const struct harness_daemon *d, const char *needle, int timeout_ms) {
    double end = harness_now() + timeout_ms / 1000.0;
    while (log_count(d, needle, false) == 0) {
        if (harness_now() > end)
            return false;
        harness_sleep_ms(20);
    }
    return true;
}

/*
 * The most lines a rate limit of burst per interval seconds lets through in a test that began
 * at t0: the limit works per interval, so a slow run (valgrind) may span several.
 */
static size_t burst_bound(double t0, unsigned burst, double interval) {
    return burst * ((size_t)((harness_now() - t0) / interval) + 2);
}

/* ---- settings: who may change them ---- */

static int setup_allow_nobody(void **state) {
    static const char *const args[] = {"--allow-users=nobody", NULL};
    return harness_fixture_setup(state, sizeof(struct harness_fixture), args);
}

static int setup_admin_group(void **state) {
    static const char *const args[] = {"--allow-users=nobody", "--admin-group=4242", NULL};
    return harness_fixture_setup(state, sizeof(struct harness_fixture), args);
}

/* An allowed, non-admin uid: reads work, no setting may change (the allow-list least). */
static int allowed_user_part(const struct harness_daemon *d, void *arg) {
    (void)arg;
    CHILD_EXPECT(config_set(d, "allow_users", "nobody,12345") == -EPERM,
                 "ConfigSet allow_users was not refused with EPERM");
    CHILD_EXPECT(config_set(d, "max_clients", "1") == -EPERM, "ConfigSet max_clients allowed");
    CHILD_EXPECT(config_set(d, "log_level", "emerg") == -EPERM, "ConfigSet log_level allowed");
    Vase__ConfigGet get = VASE__CONFIG_GET__INIT;
    get.key = "allow_users";
    CHILD_EXPECT(call_code(d, VASE__ENVELOPE__BODY_CONFIG_GET, &get, NULL) == 0,
                 "ConfigGet refused");
    Vase__ListClients lc = VASE__LIST_CLIENTS__INIT;
    CHILD_EXPECT(call_code(d, VASE__ENVELOPE__BODY_LIST_CLIENTS, &lc, NULL) == 0,
                 "ListClients refused to an allowed uid");
    return 0;
}

/* A uid in the socket's reach but not on the allow-list: it cannot add itself, change
 * anything, or list anyone; Ping, Status and ConfigGet answer, Status without arenas. */
static int stranger_part(const struct harness_daemon *d, void *arg) {
    uint32_t seq_id = *(const uint32_t *)arg;
    CHILD_EXPECT(config_set(d, "allow_users", "nobody,12345") == -EPERM,
                 "a stranger changed allow_users");
    CHILD_EXPECT(config_set(d, "allow_groups", "12345") == -EPERM,
                 "a stranger changed allow_groups");
    Vase__ListClients lc = VASE__LIST_CLIENTS__INIT;
    CHILD_EXPECT(call_code(d, VASE__ENVELOPE__BODY_LIST_CLIENTS, &lc, NULL) == -EPERM,
                 "a stranger listed the clients");
    Vase__ListSeqs ls = VASE__LIST_SEQS__INIT;
    CHILD_EXPECT(call_code(d, VASE__ENVELOPE__BODY_LIST_SEQS, &ls, NULL) == -EPERM,
                 "a stranger listed the sequences");
    Vase__GetSeq gs = VASE__GET_SEQ__INIT;
    gs.seq_id = seq_id;
    CHILD_EXPECT(call_code(d, VASE__ENVELOPE__BODY_GET_SEQ, &gs, NULL) == -EPERM,
                 "a stranger read a sequence");
    Vase__Status st = VASE__STATUS__INIT;
    Vase__Envelope *reply = NULL;
    CHILD_EXPECT(call_code(d, VASE__ENVELOPE__BODY_STATUS, &st, &reply) == 0, "Status refused");
    size_t arenas = reply->status_reply->n_arenas;
    vase__envelope__free_unpacked(reply, NULL);
    CHILD_EXPECT(arenas == 0, "a stranger was shown %zu arenas", arenas);
    struct vase_client *c = NULL;
    CHILD_EXPECT(harness_connect(d, "stranger", &c) == -EPERM, "the stranger got a session");
    return 0;
}

static void test_settings_need_authority(void **state) {
    struct harness_fixture *f = *state;
    open_sockets(&f->d);
    /* A sequence the stranger must not see. */
    struct vase_geometry g = harness_geometry();
    struct vase_model *m;
    struct vase_seq *s;
    struct vase_seq_config cfg = harness_seq_config(VASE_POLICY_SNAPKV, 128, 32, 16, 0);
    assert_int_equal(harness_engine_open(&f->d, "owner", &g, &f->c[0], &m), 0);
    assert_int_equal(vase_seq_open(f->c[0], m, &cfg, &s), 0);
    uint32_t seq_id = vase_seq_id(s);

    run_as(&f->d, nobody_uid(), nobody_gid(), allowed_user_part, NULL);
    run_as(&f->d, STRANGER, STRANGER, stranger_part, &seq_id);

    /* Root may; the change is logged with who made it and the old and new values. */
    assert_int_equal(config_set(&f->d, "max_clients", "12"), 0);
    assert_int_equal(
        log_count(&f->d, "Setting max_clients changed from \"64\" to \"12\" by uid 0", false), 1);

    /* A reload names who sent SIGHUP, then each setting it changed, old and new. */
    char conf[sizeof(f->d.dir) + 16], who[160];
    snprintf(conf, sizeof(conf), "%s/vased.conf", f->d.dir);
    FILE *cf = fopen(conf, "w");
    assert_non_null(cf);
    fputs("[vased]\nmax_clients = 20\n", cf);
    assert_int_equal(fclose(cf), 0);
    assert_int_equal(kill(f->d.pid, SIGHUP), 0);
    snprintf(who, sizeof(who), "<5>SIGHUP from uid %u (pid %d): reloading", (unsigned)getuid(),
             (int)getpid());
    assert_true(log_wait(&f->d, "Reload: max_clients = 20 (was 12) from ", 10000));
    if (log_count(&f->d, who, true) != 1) {
        harness_daemon_dump_log(&f->d);
        fail_msg("no line starting \"%s\"", who);
    }

    /* vasectl reload: the log names the command, and systemctl reload where the unit's
     * ExecReload= runs it (INVOCATION_ID and MAINPID in its environment, as systemd sets). */
    char vasectl[PATH_MAX], pid[16], mine[16];
    struct harness_proc p = {.out_fd = -1};
    assert_int_equal(harness_program("vasectl", vasectl, sizeof(vasectl)), 0);
    snprintf(pid, sizeof(pid), "%d", (int)f->d.pid);
    assert_int_equal(harness_run(&p, (const char *[]){vasectl, "reload", pid, NULL}, NULL, 10000),
                     0);
    harness_proc_free(&p);
    snprintf(who, sizeof(who), "<5>SIGHUP from vasectl reload by uid %u (pid ", (unsigned)getuid());
    assert_true(log_wait(&f->d, who, 10000));
    assert_int_equal(setenv("INVOCATION_ID", "5d0c6b1e2f3a4b5c6d7e8f9a0b1c2d3e", 1), 0);
    assert_int_equal(setenv("MAINPID", pid, 1), 0);
    assert_int_equal(harness_run(&p, (const char *[]){vasectl, "reload", NULL}, NULL, 10000), 0);
    harness_proc_free(&p);
    unsetenv("MAINPID");
    unsetenv("INVOCATION_ID");
    snprintf(who, sizeof(who),
             "<5>SIGHUP from systemctl reload (the unit's ExecReload=, vasectl reload as uid %u, "
             "pid ",
             (unsigned)getuid());
    assert_true(log_wait(&f->d, who, 10000));
    /* A process that is not vased is not signalled; no pid at all is a usage error. */
    snprintf(mine, sizeof(mine), "%d", (int)getpid());
    assert_int_equal(harness_run(&p, (const char *[]){vasectl, "reload", mine, NULL}, NULL, 10000),
                     1);
    assert_non_null(strstr(p.out, "is not vased"));
    harness_proc_free(&p);
    assert_int_equal(harness_run(&p, (const char *[]){vasectl, "reload", NULL}, NULL, 10000), 2);
    harness_proc_free(&p);
}

static int admin_group_part(const struct harness_daemon *d, void *arg) {
    (void)arg;
    CHILD_EXPECT(config_set(d, "max_clients", "10") == 0, "admin_group member refused");
    /* Who may change the daemon may also read it, allow-list or not. */
    Vase__ListClients lc = VASE__LIST_CLIENTS__INIT;
    CHILD_EXPECT(call_code(d, VASE__ENVELOPE__BODY_LIST_CLIENTS, &lc, NULL) == 0,
                 "ListClients refused to an admin_group member");
    return 0;
}

static void test_admin_group(void **state) {
    struct harness_fixture *f = *state;
    open_sockets(&f->d);
    run_as(&f->d, STRANGER, STRANGER, stranger_part, &(uint32_t){1});
    run_as(&f->d, STRANGER + 1, ADMIN_GID, admin_group_part, NULL);
    assert_int_equal(log_count(&f->d, "changed from \"64\" to \"10\" by uid 12346", false), 1);
}

/* A session's token routes engine requests to its client, but only from the client's own uid:
 * another user who learned the token cannot act as the client. */
struct stolen {
    uint8_t token[64];
    size_t token_len;
    uint64_t incarnation;
};

static int stolen_token_part(const struct harness_daemon *d, void *arg) {
    const struct stolen *t = arg;
    Vase__CloseSeq cs = VASE__CLOSE_SEQ__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    cs.seq_id = 1;
    e.version = VASE_WIRE_VERSION;
    e.incarnation = t->incarnation;
    e.client_seq = 1;
    e.request_id = 77;
    e.body_case = VASE__ENVELOPE__BODY_CLOSE_SEQ;
    e.close_seq = &cs;
    void *buf;
    size_t len;
    CHILD_EXPECT(vase_wire_pack(&e, &buf, &len) == 0, "pack");
    Vase__Envelope *reply = NULL;
    int r = harness_send_frame(d, buf, len, t->token, t->token_len, &reply);
    free(buf);
    CHILD_EXPECT(r == 0, "no reply: %d", r);
    r = harness_reply_error(reply);
    vase__envelope__free_unpacked(reply, NULL);
    CHILD_EXPECT(r == -EPERM, "CloseSeq with another uid's token gave %d, not -EPERM", r);
    return 0;
}

static void test_token_bound_to_uid(void **state) {
    struct harness_fixture *f = *state;
    open_sockets(&f->d);
    struct harness_session s;
    assert_int_equal(harness_session_open(&f->d, &s), 0);
    struct stolen t = {.token_len = s.token_len, .incarnation = s.incarnation};
    memcpy(t.token, s.token, s.token_len);
    /* The session socket stays open (the client lives); its ZeroMQ side goes before the fork. */
    zmq_close(s.zmq_sock);
    zmq_ctx_term(s.zmq_ctx);
    s.zmq_sock = s.zmq_ctx = NULL;
    run_as(&f->d, nobody_uid(), nobody_gid(), stolen_token_part, &t);
    harness_session_close(&s);
}

/* ---- the session socket: refusals at accept, pending slots per uid ---- */

/* Connects n raw SEQPACKET sockets to session.sock and says nothing. */
static int raw_connect(const struct harness_daemon *d, int *fds, size_t n) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    harness_daemon_path(d, "session.sock", sa.sun_path, sizeof(sa.sun_path));
    for (size_t i = 0; i < n; i++) {
        fds[i] = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (fds[i] < 0 || connect(fds[i], (struct sockaddr *)&sa, sizeof(sa)) < 0)
            return -errno;
    }
    return 0;
}

/* The Error code of the packet the daemon sent on fd (waiting up to 10 s), or -ETIMEDOUT. */
static int refusal_code(int fd) {
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    uint8_t buf[4096];
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0)
        return -ETIMEDOUT;
    Vase__Envelope *e = NULL;
    if (vase_wire_unpack(buf, (size_t)n, sizeof(buf), &e) < 0)
        return -EBADMSG;
    int code = e->body_case == VASE__ENVELOPE__BODY_ERROR ? e->error->code : 0;
    vase__envelope__free_unpacked(e, NULL);
    return code;
}

struct flood {
    size_t n;       /* silent connections to open */
    size_t refused; /* the first one expected to be refused (n: none) */
    int code;       /* with this code */
    int ready[2];   /* child -> parent: the connections are open */
    int done[2];    /* parent -> child: the parent has checked, close them */
};

static int flood_part(const struct harness_daemon *d, void *arg) {
    struct flood *fl = arg;
    int fds[64];
    close(fl->ready[0]);
    close(fl->done[1]);
    CHILD_EXPECT(fl->n <= 64 && raw_connect(d, fds, fl->n) == 0, "connect: %s", strerror(errno));
    for (size_t i = fl->refused; i < fl->n; i++) {
        int code = refusal_code(fds[i]);
        CHILD_EXPECT(code == fl->code, "connection %zu: refusal code %d, want %d", i, code,
                     fl->code);
    }
    CHILD_EXPECT(write(fl->ready[1], "r", 1) == 1, "pipe");
    char c;
    CHILD_EXPECT(read(fl->done[0], &c, 1) == 1, "pipe");
    for (size_t i = 0; i < fl->n; i++)
        close(fds[i]);
    return 0;
}

/* Runs flood_part as uid:gid in a child and, while its connections are open, connects as root
 * (which must work), then lets the child go. */
static void flood_then_connect(struct harness_fixture *f, uid_t uid, gid_t gid, struct flood *fl) {
    assert_int_equal(pipe(fl->ready), 0);
    assert_int_equal(pipe(fl->done), 0);
    struct as_user a = {.d = &f->d, .uid = uid, .gid = gid, .fn = flood_part, .arg = fl};
    pid_t pid;
    assert_int_equal(harness_fork(as_user_child, &a, &pid), 0);
    close(fl->ready[1]);
    close(fl->done[0]);
    char c;
    assert_int_equal(read(fl->ready[0], &c, 1), 1);
    /* Every slot the flood could have taken: a legitimate client still gets in. */
    struct vase_client *cl = NULL;
    assert_int_equal(harness_connect(&f->d, "legit", &cl), 0);
    assert_int_equal(vase_ping(cl), 0);
    vase_disconnect(cl);
    assert_int_equal(write(fl->done[1], "d", 1), 1);
    int status;
    assert_int_equal(harness_wait_pid(pid, 20000, &status), 0);
    close(fl->ready[0]);
    close(fl->done[1]);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("the flooding child failed (wait status 0x%x)", status);
}

static void test_pending_slots(void **state) {
    struct harness_fixture *f = *state;
    double t0 = harness_now();
    open_sockets(&f->d);
    /* A uid the allow-list refuses is refused at accept: it holds no slot. */
    struct flood strangers = {.n = 64, .refused = 0, .code = EPERM};
    flood_then_connect(f, STRANGER, STRANGER, &strangers);
    /* An allowed uid holds at most 8 slots while silent; the rest are refused with EAGAIN. */
    struct flood silent = {.n = 20, .refused = 8, .code = EAGAIN};
    flood_then_connect(f, nobody_uid(), nobody_gid(), &silent);
    /* Refusals are logged as a burst and a summary, not once each. */
    size_t lines = log_count(&f->d, "Session refused:", false);
    printf("76 refused sessions: %zu log lines\n", lines);
    assert_true(lines <= burst_bound(t0, 10, 10.0) && lines < 76);
}

/* ---- the runtime directory ---- */

static int run_vased_on(const char *dir, struct harness_proc *p) {
    char vased[512], dir_arg[256];
    assert_int_equal(harness_program("vased", vased, sizeof(vased)), 0);
    snprintf(dir_arg, sizeof(dir_arg), "--runtime-dir=%s", dir);
    const char *argv[] = {vased,
                          dir_arg,
                          "--config=/dev/null",
                          "--arena-bytes=1M",
                          "--granule-bytes=64K",
                          "--metrics-address=off",
                          NULL};
    return harness_run(p, argv, NULL, 10000);
}

static void expect_refused_dir(const char *dir, const char *why) {
    struct harness_proc p;
    int r = run_vased_on(dir, &p);
    if (r != 1 || !strstr(p.out, "runtime directory"))
        fail_msg("vased on a runtime directory that %s: exit %d, output:\n%s", why, r, p.out);
    harness_proc_free(&p);
}

/*
 * A runtime directory that others can write (world-writable, group-writable, another user's, or
 * a symlink) is refused: its owner could swap a socket for a symlink and have the daemon change
 * a file of their choice. The sockets of an accepted one are 0660 from their bind.
 */
static void test_runtime_dir(void **state) {
    struct harness_fixture *f = *state;
    char base[] = "/tmp/vase-rd-XXXXXX";
    assert_non_null(mkdtemp(base));
    char dir[64], link[64];
    snprintf(dir, sizeof(dir), "%s/run", base);
    snprintf(link, sizeof(link), "%s/link", base);
    assert_int_equal(mkdir(dir, 0755), 0);

    assert_int_equal(chmod(dir, 01777), 0);
    expect_refused_dir(dir, "everyone can write");
    assert_int_equal(chmod(dir, 0775), 0);
    expect_refused_dir(dir, "its group can write");
    assert_int_equal(chmod(dir, 0755), 0);
    assert_int_equal(chown(dir, STRANGER, STRANGER), 0);
    expect_refused_dir(dir, "belongs to another user");
    assert_int_equal(chown(dir, 0, 0), 0);
    assert_int_equal(symlink(dir, link), 0);
    expect_refused_dir(link, "is a symlink");
    assert_int_equal(unlink(link), 0);
    /* The directories above it too: whoever can write one could move it aside and put their
     * own in its place. A sticky one (as /tmp) is safe: only an entry's owner may rename it. */
    assert_int_equal(chmod(base, 0777), 0);
    expect_refused_dir(dir, "sits in a directory everyone can write");
    assert_int_equal(chmod(base, 0775), 0);
    expect_refused_dir(dir, "sits in a directory its group can write");
    assert_int_equal(chmod(base, 0755), 0);
    assert_int_equal(chown(base, STRANGER, STRANGER), 0);
    expect_refused_dir(dir, "sits in another user's directory");
    assert_int_equal(chown(base, 0, 0), 0);
    /* (Every harness daemon, this fixture's included, runs in a directory made under the
     * sticky /tmp: that one is accepted.) */
    assert_int_equal(rmdir(dir), 0);
    assert_int_equal(rmdir(base), 0);

    static const char *const socks[] = {"session.sock", "control.sock", "events.sock"};
    for (size_t i = 0; i < 3; i++) {
        char path[128];
        struct stat st;
        harness_daemon_path(&f->d, socks[i], path, sizeof(path));
        assert_int_equal(lstat(path, &st), 0);
        assert_true(S_ISSOCK(st.st_mode));
        assert_int_equal(st.st_mode & 07777, 0660);
    }
}

/* ---- the log ---- */

static int setup(void **state) {
    return harness_fixture_setup(state, sizeof(struct harness_fixture), NULL);
}

/* A client name with a newline and a priority prefix cannot end its log line and forge one. */
static void test_log_injection(void **state) {
    struct harness_fixture *f = *state;
    assert_int_equal(harness_connect(&f->d, "evil\n<0>vased: forged emergency\x1b[2J", &f->c[0]),
                     0);
    /* The daemon logs the connection before it reads this client's first request. */
    assert_int_equal(vase_ping(f->c[0]), 0);
    assert_int_equal(log_count(&f->d, "<0>", true), 0);
    assert_int_equal(log_count(&f->d, "\x1b", false), 0);
    assert_int_equal(log_count(&f->d, "evil\\x0a<0>vased: forged emergency\\x1b[2J", false), 1);

    /* Nor can it reach an operator's terminal through vasectl. */
    char vasectl[512];
    struct harness_proc p;
    assert_int_equal(harness_program("vasectl", vasectl, sizeof(vasectl)), 0);
    const char *argv[] = {vasectl, "clients", NULL};
    assert_int_equal(harness_run(&p, argv, &f->d, 10000), 0);
    assert_null(strchr(p.out, '\x1b'));
    assert_non_null(strstr(p.out, "evil\\x0a<0>vased: forged emergency\\x1b[2J"));
    harness_proc_free(&p);
}

/* The bytes that an 8-bit or bidi-aware terminal acts on, or that make one name look like
 * another: a raw 0x9b (CSI), U+009B (CSI in UTF-8), U+202E (right-to-left override), U+200B
 * (zero width space). */
#define HOSTILE_NAME                                                                               \
    "a\x9b"                                                                                        \
    "2Jb\xc2\x9b"                                                                                  \
    "2Jc\xe2\x80\xae"                                                                              \
    "d\xe2\x80\x8b"                                                                                \
    "e"
#define HOSTILE_ESCAPED "a\\x9b2Jb\\u009b2Jc\\u202ed\\u200be"

static bool has_hidden_bytes(const char *text) {
    return strchr(text, '\x9b') || strstr(text, "\xe2\x80\xae") || strstr(text, "\xe2\x80\x8b");
}

/* Neither the log nor vasectl's tables, live view or JSON pass those on: a client and a model
 * named with them show escaped. */
static void test_log_and_tables_escape_c1_and_format(void **state) {
    struct harness_fixture *f = *state;
    struct vase_geometry g = harness_geometry();
    struct vase_model *m;
    struct vase_seq *s;
    struct vase_seq_config cfg = harness_seq_config(VASE_POLICY_SNAPKV, 128, 32, 16, 0);
    g.name = HOSTILE_NAME;
    assert_int_equal(harness_engine_open(&f->d, HOSTILE_NAME, &g, &f->c[0], &m), 0);
    assert_int_equal(vase_seq_open(f->c[0], m, &cfg, &s), 0);
    assert_int_equal(vase_ping(f->c[0]), 0);

    FILE *log = fopen(f->d.log, "r");
    assert_non_null(log);
    char line[4096];
    size_t named = 0;
    while (fgets(line, sizeof(line), log)) {
        assert_false(has_hidden_bytes(line));
        named += strstr(line, HOSTILE_ESCAPED) != NULL;
    }
    fclose(log);
    assert_true(named >= 1);

    char vasectl[512];
    assert_int_equal(harness_program("vasectl", vasectl, sizeof(vasectl)), 0);
    const char *commands[][5] = {
        {vasectl, "clients", NULL},
        {vasectl, "seqs", NULL},
        {vasectl, "top", "-n", "1", NULL},
    };
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
        struct harness_proc p;
        assert_int_equal(harness_run(&p, commands[i], &f->d, 10000), 0);
        assert_false(has_hidden_bytes(p.out));
        assert_non_null(strstr(p.out, HOSTILE_ESCAPED));
        harness_proc_free(&p);
    }
    /* JSON keeps the name exact, as \u escapes a terminal shows as text; the raw byte that is
     * not UTF-8 becomes U+FFFD as before. */
    const char *json[] = {vasectl, "--json", "clients", NULL};
    struct harness_proc p;
    assert_int_equal(harness_run(&p, json, &f->d, 10000), 0);
    assert_false(has_hidden_bytes(p.out));
    assert_non_null(strstr(p.out, "\"a\\ufffd2Jb\\u009b2Jc\\u202ed\\u200be\""));
    harness_proc_free(&p);
    vase_seq_close(s);
}

/* Packets on an established session and client_seq gaps log a burst, then a summary. */
static void test_log_flood(void **state) {
    struct harness_fixture *f = *state;
    double t0 = harness_now();
    struct harness_session s;
    assert_int_equal(harness_session_open(&f->d, &s), 0);

    for (int i = 0; i < 40; i++) {
        Vase__Ping ping = VASE__PING__INIT;
        Vase__Envelope e = VASE__ENVELOPE__INIT;
        Vase__Envelope *reply = NULL;
        e.body_case = VASE__ENVELOPE__BODY_PING;
        e.ping = &ping;
        e.client_seq = s.next_seq + 1; /* skips one each time */
        s.next_seq += 2;
        assert_int_equal(harness_session_request(&s, &e, &reply), 0);
        assert_int_equal(reply->body_case, VASE__ENVELOPE__BODY_PONG);
        vase__envelope__free_unpacked(reply, NULL);
    }
    size_t gaps = log_count(&f->d, "client_seq jumped", false);
    printf("40 client_seq gaps: %zu log lines\n", gaps);
    assert_true(gaps >= 1 && gaps <= burst_bound(t0, 5, 10.0) && gaps < 40);
    t0 = harness_now();

    for (int i = 0; i < 1000; i++)
        assert_int_equal(send(s.fd, "junk", 4, MSG_NOSIGNAL), 4);
    /* The daemon reads the packets before it sees the socket close, and then sums up. */
    harness_session_close(&s);
    assert_int_equal(harness_wait_clients(&f->d, 0, 20000), 0);
    size_t lines = log_count(&f->d, "on its session socket; ignored", false);
    printf("1000 packets on a session: %zu log lines\n", lines);
    assert_true(lines <= burst_bound(t0, 5, 10.0) && lines < 1000);
    assert_true(log_count(&f->d, "more messages about it were suppressed", false) >= 1);
}

/* Sessions opened and closed in a loop log a burst, then a line that counts the rest; an
 * engine connecting after the flood is still admitted. */
static void test_session_churn_log(void **state) {
    struct harness_fixture *f = *state;
    double t0 = harness_now();
    const int n = 300;
    for (int i = 0; i < n; i++) {
        struct harness_session s;
        assert_int_equal(harness_session_open(&f->d, &s), 0);
        harness_session_close(&s);
    }
    assert_int_equal(harness_wait_clients(&f->d, 0, 20000), 0);
    size_t up = log_count(&f->d, ") connected.", false),
           down = log_count(&f->d, ") disconnected;", false);
    printf("%d sessions begun and ended: %zu + %zu log lines\n", n, up, down);
    assert_true(up + down >= 1 && up + down <= burst_bound(t0, 32, 10.0) && up + down < 2 * n);
    assert_int_equal(harness_connect(&f->d, "after the flood", &f->c[0]), 0);
    assert_int_equal(vase_ping(f->c[0]), 0);
    assert_true(log_wait(&f->d, "without a log line each", 30000));
}

/* ---- statistics memory ---- */

static int setup_stats_quota(void **state) {
    static const char *const args[] = {"--max-stats-bytes-per-client=64K", "--arena-bytes=16M",
                                       NULL};
    return harness_fixture_setup(state, sizeof(struct harness_fixture), args);
}

/* The refusal of a stats push arrives with the next reply on the same connection: a Ping
 * makes it arrive, the sequence's next call returns it. */
static int pushed(struct vase_client *c, struct vase_seq *s, enum vase_stats_kind kind,
                  uint32_t len, const struct vase_geometry *g) {
    float *v = calloc((size_t)g->kv_heads * len, sizeof(float));
    assert_non_null(v);
    int r = vase_seq_push_stats(s, 0, kind, v, len);
    free(v);
    if (r < 0)
        return r;
    assert_int_equal(vase_ping(c), 0);
    return vase_seq_poll(s);
}

/*
 * Statistics the daemon keeps count against max_stats_bytes_per_client: an h2o sequence whose
 * accumulators alone exceed it is refused with EDQUOT, smaller ones fit until the client's sum
 * would exceed it, and closing a sequence gives its share back.
 */
static void test_stats_quota(void **state) {
    struct harness_fixture *f = *state;
    struct vase_geometry g = harness_geometry();
    struct vase_model *m;
    struct vase_seq *big, *small[4];
    assert_int_equal(harness_engine_open(&f->d, "stats", &g, &f->c[0], &m), 0);

    /* Accumulators are layers * kv_heads * capacity floats: 2 * 2 * 4160 * 4 > 64 KiB. */
    struct vase_seq_config cfg = harness_seq_config(VASE_POLICY_H2O, 4096, 32, 64, 0);
    assert_int_equal(vase_seq_open(f->c[0], m, &cfg, &big), 0);
    assert_int_equal(harness_append_tokens(big, &g, 0, 64, true), 0);
    assert_int_equal(pushed(f->c[0], big, VASE_STATS_ACC_ADD, 64, &g), -EDQUOT);
    assert_non_null(strstr(vase_last_error(f->c[0]), "max_stats_bytes_per_client"));

    /* 2 * 2 * 1088 * 4 = 17408 bytes each: three fit in 64 KiB, the fourth does not. */
    cfg = harness_seq_config(VASE_POLICY_H2O, 1024, 32, 64, 0);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(vase_seq_open(f->c[0], m, &cfg, &small[i]), 0);
        assert_int_equal(harness_append_tokens(small[i], &g, 0, 64, true), 0);
        assert_int_equal(pushed(f->c[0], small[i], VASE_STATS_ACC_ADD, 64, &g),
                         i < 3 ? 0 : -EDQUOT);
    }
    /* Window scores count too (2 * 64 floats, 512 bytes, fit in what is left)... */
    assert_int_equal(pushed(f->c[0], small[3], VASE_STATS_WINDOW_SCORES, 64, &g), 0);
    assert_int_equal(vase_seq_close(small[0]), 0);
    /* ... and a closed sequence's accumulators are given back. */
    assert_int_equal(pushed(f->c[0], small[3], VASE_STATS_ACC_ADD, 64, &g), 0);
    assert_int_equal(pushed(f->c[0], big, VASE_STATS_ACC_ADD, 64, &g), -EDQUOT);
    assert_int_equal(pushed(f->c[0], small[1], VASE_STATS_ACC_ADD, 64, &g), 0);
}

/* ---- arenas: one per tenant ---- */

static char arena_conf[64];

/* The default arena for uid 12345 (and root), arena "b" for nobody. */
static int setup_arenas(void **state) {
    snprintf(arena_conf, sizeof(arena_conf), "/tmp/vase-arenas-XXXXXX");
    int fd = mkstemp(arena_conf);
    if (fd < 0)
        return -1;
    static const char text[] = "[vased]\n"
                               "allow_users = nobody, 12345\n"
                               "arena_users = 12345\n"
                               "\n"
                               "[arena b]\n"
                               "arena_bytes = 1M\n"
                               "granule_bytes = 64K\n"
                               "users = nobody\n";
    if (write(fd, text, sizeof(text) - 1) != (ssize_t)sizeof(text) - 1)
        return -1;
    close(fd);
    static char conf_arg[96];
    snprintf(conf_arg, sizeof(conf_arg), "--config=%s", arena_conf);
    static const char *args[] = {conf_arg, NULL};
    return harness_fixture_setup(state, sizeof(struct harness_fixture), args);
}

static int teardown_arenas(void **state) {
    unlink(arena_conf);
    return harness_fixture_teardown(state);
}

struct arena_view {
    uint32_t root_seq;  /* a sequence of root's in the default arena */
    uint32_t own_arena; /* the arena the child may use */
    const char *own_name, *other_name;
};

/* The names of the clients and the arena ids of the sequences the caller may list. */
static int list_part(const struct harness_daemon *d, const struct arena_view *v,
                     struct vase_client *own) {
    Vase__ListSeqs ls = VASE__LIST_SEQS__INIT;
    Vase__Envelope *reply = NULL;
    CHILD_EXPECT(call_code(d, VASE__ENVELOPE__BODY_LIST_SEQS, &ls, &reply) == 0, "ListSeqs");
    for (size_t i = 0; i < reply->seqs_reply->n_seqs; i++)
        CHILD_EXPECT(reply->seqs_reply->seqs[i]->arena_id == v->own_arena,
                     "listed sequence %u of arena %u", reply->seqs_reply->seqs[i]->seq_id,
                     reply->seqs_reply->seqs[i]->arena_id);
    size_t n_seqs = reply->seqs_reply->n_seqs;
    vase__envelope__free_unpacked(reply, NULL);
    CHILD_EXPECT(n_seqs == 1, "%zu sequences listed, want the caller's own", n_seqs);

    Vase__ListClients lc = VASE__LIST_CLIENTS__INIT;
    CHILD_EXPECT(call_code(d, VASE__ENVELOPE__BODY_LIST_CLIENTS, &lc, &reply) == 0, "ListClients");
    size_t n_clients = reply->clients_reply->n_clients;
    uint32_t first = n_clients ? reply->clients_reply->clients[0]->client_id : 0;
    vase__envelope__free_unpacked(reply, NULL);
    CHILD_EXPECT(n_clients == 1 && first == vase_client_id(own),
                 "%zu clients listed, want the caller's own", n_clients);

    Vase__GetSeq gs = VASE__GET_SEQ__INIT;
    gs.seq_id = v->root_seq;
    CHILD_EXPECT(call_code(d, VASE__ENVELOPE__BODY_GET_SEQ, &gs, NULL) == -ENOENT,
                 "another arena's sequence was readable");

    Vase__Status st = VASE__STATUS__INIT;
    CHILD_EXPECT(call_code(d, VASE__ENVELOPE__BODY_STATUS, &st, &reply) == 0, "Status");
    size_t n_arenas = reply->status_reply->n_arenas;
    bool named = n_arenas == 1 && strcmp(reply->status_reply->arenas[0]->name, v->own_name) == 0;
    vase__envelope__free_unpacked(reply, NULL);
    CHILD_EXPECT(named, "Status showed %zu arenas, want only \"%s\"", n_arenas, v->own_name);
    return 0;
}

static int tenant_part(const struct harness_daemon *d, void *arg) {
    const struct arena_view *v = arg;
    struct vase_client *c = NULL;
    uint32_t id;
    CHILD_EXPECT(harness_connect(d, "tenant", &c) == 0, "connect");
    CHILD_EXPECT(vase_arena_find(c, v->other_name, &id) == -ENOENT, "arena \"%s\" was offered",
                 v->other_name);
    CHILD_EXPECT(vase_arena_find(c, v->own_name, &id) == 0 && id == v->own_arena,
                 "arena \"%s\" missing", v->own_name);
    struct vase_geometry g = harness_geometry();
    struct vase_model *m;
    struct vase_seq *s;
    g.arena = v->own_arena;
    CHILD_EXPECT(vase_model_register(c, &g, &m) == 0, "register in its arena");
    struct vase_seq_config cfg = harness_seq_config(VASE_POLICY_SNAPKV, 128, 32, 16, 0);
    CHILD_EXPECT(vase_seq_open(c, m, &cfg, &s) == 0, "open in its arena");
    int r = list_part(d, v, c);
    vase_disconnect(c);
    if (r)
        return r;

    /* The daemon refuses the other arena too, not only the library. */
    struct harness_session hs;
    CHILD_EXPECT(harness_session_open(d, &hs) == 0, "raw session");
    Vase__ModelGeometry geo = VASE__MODEL_GEOMETRY__INIT;
    Vase__RegisterModel reg = VASE__REGISTER_MODEL__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    Vase__Envelope *reply = NULL;
    geo.name = "raw";
    geo.layers = 2;
    geo.q_heads = 4;
    geo.kv_heads = 2;
    geo.head_dim = 32;
    geo.arena_id = v->own_arena == 0 ? 1 : 0;
    reg.geometry = &geo;
    e.body_case = VASE__ENVELOPE__BODY_REGISTER_MODEL;
    e.register_model = &reg;
    r = harness_session_request(&hs, &e, &reply);
    int code = r == 0 ? harness_reply_error(reply) : r;
    if (reply)
        vase__envelope__free_unpacked(reply, NULL);
    harness_session_close(&hs);
    CHILD_EXPECT(code == -EPERM, "RegisterModel in another tenant's arena gave %d", code);
    return 0;
}

struct subscriber {
    int ready[2]; /* child -> parent: connected */
    int done[2];  /* parent -> child: the refusal was seen */
};

static int events_part(const struct harness_daemon *d, void *arg) {
    struct subscriber *sb = arg;
    char endpoint[160], path[128], c;
    close(sb->ready[0]);
    close(sb->done[1]);
    harness_daemon_path(d, "events.sock", path, sizeof(path));
    snprintf(endpoint, sizeof(endpoint), "ipc://%s", path);
    void *ctx = zmq_ctx_new();
    void *sub = zmq_socket(ctx, ZMQ_SUB);
    int zero = 0;
    zmq_setsockopt(sub, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0);
    int r = zmq_connect(sub, endpoint);
    /* Connected (ZeroMQ keeps retrying) until the parent has seen the daemon refuse it. */
    bool ok = r == 0 && write(sb->ready[1], "r", 1) == 1 && read(sb->done[0], &c, 1) == 1;
    zmq_close(sub);
    zmq_ctx_term(ctx);
    CHILD_EXPECT(ok, "subscribing failed");
    return 0;
}

static void test_arenas(void **state) {
    struct harness_fixture *f = *state;
    open_sockets(&f->d);

    /* Root may use both, and sees both. */
    struct harness_status st;
    assert_int_equal(harness_status(&f->d, &st), 0);
    struct vase_geometry g = harness_geometry();
    struct vase_model *m;
    struct vase_seq *s;
    uint32_t id;
    assert_int_equal(harness_engine_open(&f->d, "root", &g, &f->c[0], &m), 0);
    assert_int_equal(vase_arena_find(f->c[0], "default", &id), 0);
    assert_int_equal(id, 0);
    assert_int_equal(vase_arena_find(f->c[0], "b", &id), 0);
    assert_int_equal(id, 1);
    assert_int_equal(vase_arena_find(f->c[0], "c", &id), -ENOENT);
    struct vase_seq_config cfg = harness_seq_config(VASE_POLICY_SNAPKV, 128, 32, 16, 0);
    assert_int_equal(vase_seq_open(f->c[0], m, &cfg, &s), 0);

    /* vasectl lists the arenas by name, and each sequence's arena. */
    char vasectl[512];
    struct harness_proc p;
    assert_int_equal(harness_program("vasectl", vasectl, sizeof(vasectl)), 0);
    const char *status_argv[] = {vasectl, "status", NULL};
    assert_int_equal(harness_run(&p, status_argv, &f->d, 10000), 0);
    assert_non_null(strstr(p.out, " default "));
    assert_non_null(strstr(p.out, " b "));
    harness_proc_free(&p);
    const char *seqs_argv[] = {vasectl, "seqs", NULL};
    assert_int_equal(harness_run(&p, seqs_argv, &f->d, 10000), 0);
    assert_non_null(strstr(p.out, "ARENA"));
    harness_proc_free(&p);

    struct arena_view nobody = {
        .root_seq = vase_seq_id(s), .own_arena = 1, .own_name = "b", .other_name = "default"};
    run_as(&f->d, nobody_uid(), nobody_gid(), tenant_part, &nobody);
    /* The events name every arena's clients: refused to a peer limited to one arena. */
    struct subscriber sb;
    assert_int_equal(pipe(sb.ready), 0);
    assert_int_equal(pipe(sb.done), 0);
    struct as_user a = {
        .d = &f->d, .uid = nobody_uid(), .gid = nobody_gid(), .fn = events_part, .arg = &sb};
    pid_t pid;
    int status;
    char c;
    assert_int_equal(harness_fork(as_user_child, &a, &pid), 0);
    close(sb.ready[1]);
    close(sb.done[0]);
    assert_int_equal(read(sb.ready[0], &c, 1), 1);
    bool refused = log_wait(&f->d, "Events subscription refused", 20000);
    assert_int_equal(write(sb.done[1], "d", 1), 1);
    assert_int_equal(harness_wait_pid(pid, 20000, &status), 0);
    close(sb.ready[0]);
    close(sb.done[1]);
    assert_true(refused);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_settings_need_authority, setup_allow_nobody,
                                        harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_admin_group, setup_admin_group,
                                        harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_token_bound_to_uid, setup_allow_nobody,
                                        harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_pending_slots, setup_allow_nobody,
                                        harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_runtime_dir, setup, harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_log_injection, setup, harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_log_and_tables_escape_c1_and_format, setup,
                                        harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_log_flood, setup, harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_session_churn_log, setup, harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_stats_quota, setup_stats_quota,
                                        harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_arenas, setup_arenas, teardown_arenas),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
