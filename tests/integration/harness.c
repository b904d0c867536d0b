/* SPDX-License-Identifier: MIT */

/*
 * The integration harness (harness.h). It owns the processes it starts: each pid is recorded
 * until it is reaped, and an atexit handler (which runs only in the test process, never in a
 * forked child) kills and reaps whatever is left and removes the runtime directories, so a
 * failing test leaves no daemon and no /tmp litter behind. Children are started with
 * PR_SET_PDEATHSIG so they also die when the test process is killed outright.
 */

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <zmq.h>

#include "harness.h"
#include "wire.h"

extern char **environ;

/* ---- bookkeeping for the atexit clean-up ---- */

#define MAX_TRACKED 32

static pid_t owner_pid;
static pid_t tracked_pids[MAX_TRACKED];
static char tracked_dirs[MAX_TRACKED][64];

static void remove_dir(const char *dir) {
    DIR *dh = opendir(dir);
    if (dh) {
        struct dirent *de;
        while ((de = readdir(dh))) {
            if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                continue;
            char path[PATH_MAX];
            snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
            if (unlink(path) < 0 && errno == EISDIR)
                remove_dir(path);
        }
        closedir(dh);
    }
    rmdir(dir);
}

static void cleanup_at_exit(void) {
    if (getpid() != owner_pid)
        return;
    for (size_t i = 0; i < MAX_TRACKED; i++)
        if (tracked_pids[i] > 0) {
            kill(tracked_pids[i], SIGKILL);
            waitpid(tracked_pids[i], NULL, 0);
            tracked_pids[i] = 0;
        }
    for (size_t i = 0; i < MAX_TRACKED; i++)
        if (tracked_dirs[i][0]) {
            remove_dir(tracked_dirs[i]);
            tracked_dirs[i][0] = '\0';
        }
}

static void ensure_atexit(void) {
    if (owner_pid == 0) {
        owner_pid = getpid();
        atexit(cleanup_at_exit);
    }
}

static void track_pid(pid_t pid) {
    for (size_t i = 0; i < MAX_TRACKED; i++)
        if (tracked_pids[i] == 0) {
            tracked_pids[i] = pid;
            return;
        }
    fprintf(stderr, "harness: more than %d live children; %d is not tracked\n", MAX_TRACKED,
            (int)pid);
}

static void untrack_pid(pid_t pid) {
    for (size_t i = 0; i < MAX_TRACKED; i++)
        if (tracked_pids[i] == pid)
            tracked_pids[i] = 0;
}

static void track_dir(const char *dir) {
    for (size_t i = 0; i < MAX_TRACKED; i++)
        if (!tracked_dirs[i][0]) {
            snprintf(tracked_dirs[i], sizeof(tracked_dirs[i]), "%s", dir);
            return;
        }
}

static void untrack_dir(const char *dir) {
    for (size_t i = 0; i < MAX_TRACKED; i++)
        if (strcmp(tracked_dirs[i], dir) == 0)
            tracked_dirs[i][0] = '\0';
}

/* ---- time ---- */

double harness_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void harness_sleep_ms(int ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* ---- processes ---- */

int harness_program(const char *name, char *buf, size_t size) {
    char dir[PATH_MAX];
    const char *env = getenv("VASE_BUILD_DIR");
    if (env && env[0]) {
        snprintf(dir, sizeof(dir), "%s", env);
    } else {
        /* The test binaries live in <build>/tests/. */
        ssize_t n = readlink("/proc/self/exe", dir, sizeof(dir) - 1);
        if (n < 0)
            return -errno;
        dir[n] = '\0';
        for (int i = 0; i < 2; i++) {
            char *slash = strrchr(dir, '/');
            if (!slash)
                return -ENOENT;
            *slash = '\0';
        }
    }
    if ((size_t)snprintf(buf, size, "%s/%s", dir, name) >= size)
        return -ENAMETOOLONG;
    if (access(buf, X_OK) < 0) {
        int r = -errno;
        fprintf(stderr, "harness: %s is missing or not executable (%s); build it first\n", buf,
                strerror(-r));
        return r;
    }
    return 0;
}

/* The environment of a child: ours without systemd's notification variables and journal
 * stream (a daemon under test must not talk to the service manager the tests may run under),
 * plus extra ("NAME=value", replacing ours) if given. Built before fork(), since a child of a
 * threaded process may only do async-signal-safe work. */
static char **child_env(const char *extra) {
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = calloc(n + 2, sizeof(*env));
    if (!env)
        return NULL;
    size_t o = 0, name = extra ? strcspn(extra, "=") + 1 : 0;
    for (size_t i = 0; i < n; i++) {
        if (strncmp(environ[i], "NOTIFY_SOCKET=", 14) == 0 ||
            strncmp(environ[i], "WATCHDOG_", 9) == 0 || strncmp(environ[i], "LISTEN_", 7) == 0 ||
            strncmp(environ[i], "JOURNAL_STREAM=", 15) == 0)
            continue;
        if (extra && strncmp(environ[i], extra, name) == 0)
            continue;
        env[o++] = environ[i];
    }
    if (extra)
        env[o++] = (char *)extra;
    return env;
}

/* In a fresh child: die with the test process, even if it is already gone. */
static void child_die_with_parent(pid_t parent) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(126);
}

/* Forks and execs path with argv and env, stdin from /dev/null, stdout and stderr onto out_fd.
 * Returns the pid or -errno. */
static pid_t spawn(const char *path, char *const *argv, char **env, int out_fd) {
    ensure_atexit();
    int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null_fd < 0)
        return -errno;
    pid_t parent = getpid();
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        int r = -errno;
        close(null_fd);
        return r;
    }
    if (pid == 0) {
        child_die_with_parent(parent);
        if (dup2(null_fd, 0) < 0 || dup2(out_fd, 1) < 0 || dup2(out_fd, 2) < 0)
            _exit(127);
        execve(path, argv, env);
        _exit(127);
    }
    close(null_fd);
    track_pid(pid);
    return pid;
}

int harness_wait_pid(pid_t pid, int timeout_ms, int *ret_status) {
    double end = harness_now() + timeout_ms / 1000.0;
    int status;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            break;
        if (r < 0) {
            int e = -errno;
            untrack_pid(pid);
            return e;
        }
        if (harness_now() > end) {
            fprintf(stderr, "harness: process %d did not exit within %d ms; killing it\n", (int)pid,
                    timeout_ms);
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            untrack_pid(pid);
            return -ETIMEDOUT;
        }
        harness_sleep_ms(1);
    }
    untrack_pid(pid);
    if (ret_status)
        *ret_status = status;
    return 0;
}

int harness_fork(int (*fn)(void *arg), void *arg, pid_t *ret_pid) {
    ensure_atexit();
    pid_t parent = getpid();
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return -errno;
    if (pid == 0) {
        child_die_with_parent(parent);
        int r = fn(arg);
        fflush(NULL);
        /* _exit: the test framework's and the harness's exit handlers belong to the parent. */
        _exit(r < 0 ? 1 : r);
    }
    track_pid(pid);
    *ret_pid = pid;
    return 0;
}

static int proc_read(struct harness_proc *p, int timeout_ms) {
    if (p->out_fd < 0)
        return 0;
    struct pollfd pfd = {.fd = p->out_fd, .events = POLLIN};
    int r = poll(&pfd, 1, timeout_ms);
    if (r < 0)
        return errno == EINTR ? 1 : -errno;
    if (r == 0)
        return 1;
    if (p->cap - p->len < 4097) {
        size_t cap = p->cap * 2 > p->len + 4097 ? p->cap * 2 : p->len + 16384;
        char *out = realloc(p->out, cap);
        if (!out)
            return -ENOMEM;
        p->out = out;
        p->cap = cap;
    }
    ssize_t n = read(p->out_fd, p->out + p->len, 4096);
    if (n < 0)
        return errno == EINTR || errno == EAGAIN ? 1 : -errno;
    if (n == 0) {
        close(p->out_fd);
        p->out_fd = -1;
        return 0;
    }
    p->len += (size_t)n;
    p->out[p->len] = '\0';
    return 1;
}

int harness_proc_start(struct harness_proc *p, const char *const *argv,
                       const struct harness_daemon *d) {
    *p = (struct harness_proc){.out_fd = -1};
    p->out = calloc(1, 1);
    if (!p->out)
        return -ENOMEM;
    p->cap = 1;
    char extra[128];
    if (d)
        snprintf(extra, sizeof(extra), "VASE_RUNTIME_DIR=%s", d->dir);
    char **env = child_env(d ? extra : NULL);
    if (!env)
        return -ENOMEM;
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) < 0) {
        int r = -errno;
        free(env);
        return r;
    }
    pid_t pid = spawn(argv[0], (char *const *)argv, env, fds[1]);
    free(env);
    close(fds[1]);
    if (pid < 0) {
        close(fds[0]);
        return pid;
    }
    p->pid = pid;
    p->out_fd = fds[0];
    return 0;
}

int harness_proc_wait_output(struct harness_proc *p, const char *needle, int timeout_ms) {
    double end = harness_now() + timeout_ms / 1000.0;
    for (;;) {
        if (p->out && strstr(p->out, needle))
            return 0;
        int left = (int)((end - harness_now()) * 1000.0);
        if (left <= 0)
            return -ETIMEDOUT;
        int r = proc_read(p, left);
        if (r < 0)
            return r;
        if (r == 0)
            return strstr(p->out, needle) ? 0 : -ESRCH;
    }
}

int harness_proc_finish(struct harness_proc *p, int timeout_ms, int *ret_status) {
    double end = harness_now() + timeout_ms / 1000.0;
    while (p->out_fd >= 0) {
        int left = (int)((end - harness_now()) * 1000.0);
        if (left <= 0)
            break;
        int r = proc_read(p, left);
        if (r < 0)
            return r;
    }
    int left = (int)((end - harness_now()) * 1000.0);
    int r = harness_wait_pid(p->pid, left > 0 ? left : 1, ret_status);
    p->pid = 0;
    return r;
}

void harness_proc_free(struct harness_proc *p) {
    if (p->pid > 0) {
        kill(p->pid, SIGKILL);
        waitpid(p->pid, NULL, 0);
        untrack_pid(p->pid);
    }
    if (p->out_fd >= 0)
        close(p->out_fd);
    free(p->out);
    *p = (struct harness_proc){.out_fd = -1};
}

int harness_run(struct harness_proc *p, const char *const *argv, const struct harness_daemon *d,
                int timeout_ms) {
    int r = harness_proc_start(p, argv, d);
    if (r < 0)
        return r;
    int status;
    r = harness_proc_finish(p, timeout_ms, &status);
    if (r < 0)
        return r;
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    return -EINTR;
}

/* ---- control requests ---- */

/* A DEALER on control.sock with bounded waits and linger 0. */
static int dealer_open(const struct harness_daemon *d, const void *routing_id, size_t id_len,
                       void **ret_ctx, void **ret_sock) {
    char endpoint[128];
    snprintf(endpoint, sizeof(endpoint), "ipc://%s/control.sock", d->dir);
    void *ctx = zmq_ctx_new();
    if (!ctx)
        return -errno;
    void *sock = zmq_socket(ctx, ZMQ_DEALER);
    if (!sock) {
        int r = -errno;
        zmq_ctx_term(ctx);
        return r;
    }
    int zero = 0, timeout = HARNESS_REQUEST_MS;
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(sock, ZMQ_RCVTIMEO, &timeout, sizeof(timeout));
    zmq_setsockopt(sock, ZMQ_SNDTIMEO, &timeout, sizeof(timeout));
    if ((routing_id && zmq_setsockopt(sock, ZMQ_ROUTING_ID, routing_id, id_len) < 0) ||
        zmq_connect(sock, endpoint) < 0) {
        int r = -errno;
        zmq_close(sock);
        zmq_ctx_term(ctx);
        return r;
    }
    *ret_ctx = ctx;
    *ret_sock = sock;
    return 0;
}

static void dealer_close(void *ctx, void *sock) {
    if (sock)
        zmq_close(sock);
    if (ctx)
        zmq_ctx_term(ctx);
}

/* Sends one frame and unpacks the one reply frame. */
static int dealer_exchange(void *sock, const void *buf, size_t len, Vase__Envelope **ret) {
    if (zmq_send(sock, buf, len, 0) < 0)
        return -errno;
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, sock, 0) < 0) {
        int r = errno == EAGAIN ? -ETIMEDOUT : -errno;
        zmq_msg_close(&msg);
        return r;
    }
    Vase__Envelope *e = NULL;
    int r = vase_wire_unpack(zmq_msg_data(&msg), zmq_msg_size(&msg), VASE_WIRE_HARD_MAX, &e);
    zmq_msg_close(&msg);
    if (r == 0) {
        *ret = e;
        return 0;
    }
    if (e)
        vase__envelope__free_unpacked(e, NULL);
    return r == -VASE_EPROTOVERSION ? -EPROTO : -EBADMSG;
}

int harness_send_frame(const struct harness_daemon *d, const void *buf, size_t len,
                       const void *routing_id, size_t id_len, Vase__Envelope **ret) {
    void *ctx, *sock;
    int r = dealer_open(d, routing_id, id_len, &ctx, &sock);
    if (r < 0)
        return r;
    r = dealer_exchange(sock, buf, len, ret);
    dealer_close(ctx, sock);
    return r;
}

/* Fills in the version and a fresh request id where e has none, and packs it. */
static int stamp_and_pack(Vase__Envelope *e, void **ret_buf, size_t *ret_len) {
    static uint64_t next_id = 1;
    if (e->version == 0)
        e->version = VASE_WIRE_VERSION;
    if (e->request_id == 0)
        e->request_id = next_id++;
    return vase_wire_pack(e, ret_buf, ret_len);
}

int harness_request(const struct harness_daemon *d, Vase__Envelope *e, Vase__Envelope **ret) {
    void *buf;
    size_t len;
    int r = stamp_and_pack(e, &buf, &len);
    if (r < 0)
        return r;
    r = harness_send_frame(d, buf, len, NULL, 0, ret);
    free(buf);
    return r;
}

/* Sends a request whose body is msg (body_case selects the member of the body union; every
 * member is a pointer to a message) and takes the reply. 0, -errno, or the code of an Error
 * reply negated (*ret is set then too). */
static int call(const struct harness_daemon *d, Vase__Envelope__BodyCase body_case, void *msg,
                Vase__Envelope **ret) {
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    e.body_case = body_case;
    e.ping = msg;
    int r = harness_request(d, &e, ret);
    if (r < 0)
        return r;
    if ((*ret)->request_id != e.request_id) {
        fprintf(stderr, "harness: reply to request %llu carries request id %llu\n",
                (unsigned long long)e.request_id, (unsigned long long)(*ret)->request_id);
        return -EPROTO;
    }
    return harness_reply_error(*ret);
}

int harness_call(const struct harness_daemon *d, Vase__Envelope__BodyCase body_case, void *msg,
                 Vase__Envelope **ret) {
    *ret = NULL;
    return call(d, body_case, msg, ret);
}

/* call() that expects a reply of body case want; frees the reply if ret is NULL. */
static int call_expect(const struct harness_daemon *d, Vase__Envelope__BodyCase body_case,
                       void *msg, Vase__Envelope__BodyCase want, Vase__Envelope **ret) {
    Vase__Envelope *reply = NULL;
    int r = call(d, body_case, msg, &reply);
    if (r == 0 && reply->body_case != want) {
        fprintf(stderr, "harness: request answered by %s\n", vase_wire_body_name(reply));
        r = -EPROTO;
    }
    if (r == 0 && ret)
        *ret = reply;
    else if (reply)
        vase__envelope__free_unpacked(reply, NULL);
    return r;
}

int harness_ping(const struct harness_daemon *d) {
    static const uint8_t payload[] = "harness";
    Vase__Ping ping = VASE__PING__INIT;
    ping.payload = (ProtobufCBinaryData){.len = sizeof(payload), .data = (uint8_t *)payload};
    Vase__Envelope *reply;
    int r = call_expect(d, VASE__ENVELOPE__BODY_PING, &ping, VASE__ENVELOPE__BODY_PONG, &reply);
    if (r < 0)
        return r;
    if (reply->pong->payload.len != sizeof(payload) ||
        memcmp(reply->pong->payload.data, payload, sizeof(payload)) != 0) {
        fprintf(stderr, "harness: Ping answered with another payload\n");
        r = -EPROTO;
    }
    vase__envelope__free_unpacked(reply, NULL);
    return r;
}

int harness_reply_error(const Vase__Envelope *reply) {
    if (reply->body_case != VASE__ENVELOPE__BODY_ERROR)
        return 0;
    return reply->error->code > 0 ? -reply->error->code : -EPROTO;
}

int harness_status(const struct harness_daemon *d, struct harness_status *ret) {
    Vase__Status st = VASE__STATUS__INIT;
    Vase__Envelope *reply;
    int r =
        call_expect(d, VASE__ENVELOPE__BODY_STATUS, &st, VASE__ENVELOPE__BODY_STATUS_REPLY, &reply);
    if (r < 0)
        return r;
    const Vase__StatusReply *s = reply->status_reply;
    if (s->n_arenas < 1) {
        fprintf(stderr, "harness: Status without arenas\n");
        r = -EPROTO;
    } else {
        *ret = (struct harness_status){
            .incarnation = s->incarnation,
            .bytes_total = s->arenas[0]->bytes_total,
            .bytes_free = s->arenas[0]->bytes_free,
            .bytes_pages = s->arenas[0]->bytes_pages,
            .clients = s->clients,
            .seqs = s->seqs,
            .evictions_total = s->evictions_total,
            .errors_total = s->errors_total,
            .admin_errors_total = s->admin_errors_total,
            .stats_messages_total = s->stats_messages_total,
            .opens_waiting = s->opens_waiting,
            .budget_shrinks_total = s->budget_shrinks_total,
            .budget_grows_total = s->budget_grows_total,
            .bytes_reclaiming = s->bytes_reclaiming,
            .seqs_shrunk = s->seqs_shrunk,
        };
        snprintf(ret->metrics_address, sizeof(ret->metrics_address), "%s",
                 s->metrics_address ? s->metrics_address : "");
        snprintf(ret->metrics_unavailable, sizeof(ret->metrics_unavailable), "%s",
                 s->metrics_unavailable ? s->metrics_unavailable : "");
    }
    vase__envelope__free_unpacked(reply, NULL);
    return r;
}

/* "127.0.0.1:PORT" into a socket address (the tests bind the metrics to IPv4 loopback). */
static int metrics_sockaddr(const char *address, struct sockaddr_in *ret) {
    const char *colon = strrchr(address, ':');
    char host[32];
    if (!colon || (size_t)(colon - address) >= sizeof(host))
        return -EINVAL;
    memcpy(host, address, (size_t)(colon - address));
    host[colon - address] = '\0';
    char *end;
    errno = 0;
    unsigned long port = strtoul(colon + 1, &end, 10);
    if (errno || end == colon + 1 || *end || port > 65535)
        return -EINVAL;
    *ret = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    return inet_pton(AF_INET, host, &ret->sin_addr) == 1 ? 0 : -EINVAL;
}

int harness_http(const struct harness_daemon *d, const char *method, const char *path, char **ret) {
    struct harness_status st;
    struct sockaddr_in sa;
    int r = harness_status(d, &st);
    if (r < 0)
        return r;
    if (!st.metrics_address[0])
        return -ENOTCONN;
    if ((r = metrics_sockaddr(st.metrics_address, &sa)) < 0)
        return r;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    char req[256];
    int n = snprintf(req, sizeof(req), "%s %s HTTP/1.0\r\nHost: %s\r\n\r\n", method, path,
                     st.metrics_address);
    size_t len = 0, cap = 1 << 16;
    char *buf = malloc(cap);
    if (!buf) {
        close(fd);
        return -ENOMEM;
    }
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || write(fd, req, (size_t)n) != n) {
        r = -errno;
        goto out;
    }
    /* HTTP/1.0: the daemon closes the connection after the response. */
    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, HARNESS_WAIT_MS) <= 0) {
            r = -ETIMEDOUT;
            goto out;
        }
        if (len + 4096 + 1 > cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) {
                r = -ENOMEM;
                goto out;
            }
            buf = nb;
        }
        ssize_t got = read(fd, buf + len, cap - len - 1);
        if (got < 0) {
            r = -errno;
            goto out;
        }
        if (got == 0)
            break;
        len += (size_t)got;
    }
    buf[len] = '\0';
    *ret = buf;
    buf = NULL;
    r = 0;
out:
    free(buf);
    close(fd);
    return r;
}

int harness_scrape(const struct harness_daemon *d, char **ret_response, const char **ret) {
    char *resp;
    int r = harness_http(d, "GET", "/metrics", &resp);
    if (r < 0)
        return r;
    const char *body = strstr(resp, "\r\n\r\n");
    if (strncmp(resp, "HTTP/1.", 7) != 0 || strncmp(resp + 8, " 200 ", 5) != 0 || !body ||
        !strstr(resp, "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n")) {
        fprintf(stderr, "harness: the metrics endpoint answered:\n%.400s\n", resp);
        free(resp);
        return -EPROTO;
    }
    *ret_response = resp;
    *ret = body + 4;
    return 0;
}

double harness_metric(const char *text, const char *series) {
    size_t n = strlen(series);
    for (const char *line = text; line && *line;
         line = strchr(line, '\n'), line = line ? line + 1 : NULL)
        if (strncmp(line, series, n) == 0 && line[n] == ' ')
            return strtod(line + n + 1, NULL);
    return NAN;
}

struct harness_status harness_status_of(const struct harness_daemon *d) {
    struct harness_status st;
    assert_int_equal(harness_status(d, &st), 0);
    return st;
}

void harness_wait_parked(const struct harness_daemon *d, uint32_t want) {
    double end = harness_now() + HARNESS_WAIT_MS / 1000.0;
    struct harness_status st = harness_status_of(d);
    while (st.opens_waiting != want) {
        if (harness_now() > end)
            fail_msg("%u opens parked, want %u", st.opens_waiting, want);
        harness_sleep_ms(5);
        st = harness_status_of(d);
    }
}

void harness_assert_all_free(const struct harness_daemon *d) {
    assert_int_equal(harness_wait_bytes_pages(d, 0, HARNESS_WAIT_MS, NULL), 0);
    struct harness_status st = harness_status_of(d);
    assert_int_equal(st.bytes_free, HARNESS_ARENA_BYTES);
    assert_int_equal(st.opens_waiting, 0);
    assert_int_equal(st.seqs, 0);
    assert_int_equal(st.seqs_shrunk, 0);
    assert_int_equal(st.bytes_reclaiming, 0);
}

int harness_get_seq(const struct harness_daemon *d, uint32_t seq_id, Vase__Envelope **ret) {
    Vase__GetSeq get = VASE__GET_SEQ__INIT;
    get.seq_id = seq_id;
    *ret = NULL;
    return call(d, VASE__ENVELOPE__BODY_GET_SEQ, &get, ret);
}

int harness_config_set(const struct harness_daemon *d, const char *key, const char *value) {
    Vase__ConfigSet set = VASE__CONFIG_SET__INIT;
    set.key = (char *)key;
    set.value = (char *)value;
    return call_expect(d, VASE__ENVELOPE__BODY_CONFIG_SET, &set, VASE__ENVELOPE__BODY_CONFIG_REPLY,
                       NULL);
}

/* Polls Status until the counter at offset (a uint32_t, or a uint64_t when wide, of struct
 * harness_status) is want. */
static int wait_status(const struct harness_daemon *d, size_t offset, bool wide, const char *what,
                       uint64_t want, int timeout_ms, double *ret_seconds) {
    double start = harness_now(), end = start + timeout_ms / 1000.0;
    struct harness_status st = {0};
    for (;;) {
        int r = harness_status(d, &st);
        if (r < 0)
            return r;
        uint64_t v;
        if (wide) {
            memcpy(&v, (const char *)&st + offset, sizeof(v));
        } else {
            uint32_t v32;
            memcpy(&v32, (const char *)&st + offset, sizeof(v32));
            v = v32;
        }
        if (v == want) {
            if (ret_seconds)
                *ret_seconds = harness_now() - start;
            return 0;
        }
        if (harness_now() > end) {
            fprintf(stderr, "harness: %s is %llu after %d ms, want %llu\n", what,
                    (unsigned long long)v, timeout_ms, (unsigned long long)want);
            return -ETIMEDOUT;
        }
        harness_sleep_ms(1);
    }
}

int harness_wait_bytes_pages(const struct harness_daemon *d, uint64_t want, int timeout_ms,
                             double *ret_seconds) {
    return wait_status(d, offsetof(struct harness_status, bytes_pages), true, "bytes_pages", want,
                       timeout_ms, ret_seconds);
}

uint64_t harness_seq_bytes(uint32_t kv_pages, uint32_t ring_pages, uint32_t keep) {
    /* The plan page: 2 layers * 2 KV heads = 4 keep lists of 4 * keep bytes, in the smallest
     * power of two of at least 4096 bytes. */
    uint64_t plan = 4096;
    while (plan < 4 * 4 * (uint64_t)keep)
        plan *= 2;
    return ((uint64_t)kv_pages + ring_pages) * HARNESS_PAGE_BYTES + plan;
}

int harness_wait_clients(const struct harness_daemon *d, uint32_t want, int timeout_ms) {
    return wait_status(d, offsetof(struct harness_status, clients), false, "clients", want,
                       timeout_ms, NULL);
}

/* ---- the daemon ---- */

void harness_daemon_path(const struct harness_daemon *d, const char *name, char *buf, size_t size) {
    snprintf(buf, size, "%s/%s", d->dir, name);
}

void harness_daemon_dump_log(const struct harness_daemon *d) {
    FILE *f = fopen(d->log, "re");
    if (!f)
        return;
    fprintf(stderr, "---- %s ----\n", d->log);
    char line[1024];
    while (fgets(line, sizeof(line), f))
        fputs(line, stderr);
    fprintf(stderr, "---- end of log ----\n");
    fclose(f);
}

static int make_runtime_dir(struct harness_daemon *d) {
    snprintf(d->dir, sizeof(d->dir), "/tmp/vase-it-XXXXXX");
    if (!mkdtemp(d->dir)) {
        int r = -errno;
        d->dir[0] = '\0';
        return r;
    }
    track_dir(d->dir);
    harness_daemon_path(d, "vased.log", d->log, sizeof(d->log));
    /* An empty configuration file, so that no /etc/vase/vased.conf of the host applies. */
    char conf[96];
    harness_daemon_path(d, "vased.conf", conf, sizeof(conf));
    int fd = open(conf, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    close(fd);
    return 0;
}

int harness_daemon_start(struct harness_daemon *d, const char *const *args) {
    ensure_atexit();
    if (d->pid > 0)
        return -EBUSY;
    char path[PATH_MAX];
    const char *program = getenv("VASE_VASED_PROGRAM");
    int r = harness_program(program && program[0] ? program : "vased", path, sizeof(path));
    if (r < 0)
        return r;
    if (!d->dir[0] && (r = make_runtime_dir(d)) < 0)
        return r;

    char dir_arg[96], conf_arg[128], arena_arg[64], page_arg[64];
    snprintf(dir_arg, sizeof(dir_arg), "--runtime-dir=%s", d->dir);
    snprintf(conf_arg, sizeof(conf_arg), "--config=%s/vased.conf", d->dir);
    snprintf(arena_arg, sizeof(arena_arg), "--arena-bytes=%u",
             HARNESS_PAGE_BYTES * HARNESS_ARENA_PAGES);
    snprintf(page_arg, sizeof(page_arg), "--granule-bytes=%u", HARNESS_PAGE_BYTES);
    /* No metrics endpoint unless the test asks: parallel tests, and an operator's daemon, would
     * collide on the default port. */
    const char *argv[40] = {path,
                            dir_arg,
                            conf_arg,
                            arena_arg,
                            page_arg,
                            "--evictor-threads=2",
                            "--metrics-address=off"};
    size_t argc = d->metrics_default ? 6 : 7;
    for (size_t i = 0; args && args[i]; i++) {
        if (argc + 1 >= sizeof(argv) / sizeof(argv[0]))
            return -E2BIG;
        argv[argc++] = args[i];
    }
    argv[argc] = NULL;

    int log_fd = open(d->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (log_fd < 0)
        return -errno;
    /* The log file stands for journald's stream, as systemd would name it: the daemon writes
     * "<N>" priority prefixes, which the tests look for. */
    struct stat log_st;
    char journal[80];
    if (fstat(log_fd, &log_st) < 0) {
        r = -errno;
        close(log_fd);
        return r;
    }
    snprintf(journal, sizeof(journal), "JOURNAL_STREAM=%llu:%llu",
             (unsigned long long)log_st.st_dev, (unsigned long long)log_st.st_ino);
    char **env = child_env(journal);
    if (!env) {
        close(log_fd);
        return -ENOMEM;
    }
    pid_t pid = spawn(path, (char *const *)argv, env, log_fd);
    free(env);
    close(log_fd);
    if (pid < 0)
        return pid;
    d->pid = pid;

    /* Ready when both sockets exist and a Ping is answered: the daemon binds before it
     * answers, and after a restart on the same directory only the new daemon can answer. */
    char session[96], control[96];
    harness_daemon_path(d, "session.sock", session, sizeof(session));
    harness_daemon_path(d, "control.sock", control, sizeof(control));
    double end = harness_now() + HARNESS_START_MS / 1000.0;
    for (;;) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            untrack_pid(pid);
            d->pid = 0;
            fprintf(stderr, "harness: vased exited during start-up (status 0x%x)\n", status);
            harness_daemon_dump_log(d);
            return -ECHILD;
        }
        struct harness_status st;
        if (access(session, F_OK) == 0 && access(control, F_OK) == 0 && harness_ping(d) == 0 &&
            harness_status(d, &st) == 0) {
            d->incarnation = st.incarnation;
            return 0;
        }
        if (harness_now() > end)
            break;
        harness_sleep_ms(5);
    }
    fprintf(stderr, "harness: vased did not answer Ping within %d ms\n", HARNESS_START_MS);
    harness_daemon_stop(d, SIGKILL, NULL);
    harness_daemon_dump_log(d);
    return -ETIMEDOUT;
}

int harness_daemon_stop(struct harness_daemon *d, int sig, int *ret_status) {
    if (d->pid <= 0)
        return -ESRCH;
    kill(d->pid, sig);
    int status;
    int r = harness_wait_pid(d->pid, HARNESS_STOP_MS, &status);
    d->pid = 0;
    if (r == 0 && ret_status)
        *ret_status = status;
    return r;
}

void harness_daemon_free(struct harness_daemon *d) {
    if (d->pid > 0)
        harness_daemon_stop(d, SIGKILL, NULL);
    if (d->dir[0]) {
        if (getenv("VASE_TEST_LOGS"))
            harness_daemon_dump_log(d);
        remove_dir(d->dir);
        untrack_dir(d->dir);
    }
    *d = (struct harness_daemon){0};
}

int harness_connect(const struct harness_daemon *d, const char *name, struct vase_client **ret) {
    struct vase_connect_options opts = {
        .runtime_dir = d->dir,
        .name = name,
        .timeout_ms = HARNESS_CLIENT_MS,
    };
    return vase_connect(&opts, ret);
}

struct vase_geometry harness_geometry(void) {
    return (struct vase_geometry){
        .name = "harness-small",
        .layers = 2,
        .q_heads = 4,
        .kv_heads = 2,
        .head_dim = 32,
        .dtype = VASE_DTYPE_F32,
        .block_tokens = 64,
    };
}

struct vase_seq_config harness_seq_config(enum vase_policy policy, uint32_t budget, uint32_t window,
                                          uint32_t prompt_len, enum vase_mode mode) {
    struct vase_seq_config cfg = {
        .policy = policy,
        .params = vase_params_default(budget),
        .prompt_len = prompt_len,
        .seed = 1,
        .mode = mode,
        .slack = -1,
    };
    cfg.params.window = window;
    return cfg;
}

int harness_engine_open(const struct harness_daemon *d, const char *name,
                        const struct vase_geometry *g, struct vase_client **ret_client,
                        struct vase_model **ret_model) {
    struct vase_client *c = NULL;
    int r = harness_connect(d, name, &c);
    if (r < 0) {
        fprintf(stderr, "harness: vase_connect: %s\n", vase_strerror(r));
        return r;
    }
    r = vase_model_register(c, g, ret_model);
    if (r < 0) {
        fprintf(stderr, "harness: vase_model_register: %s\n", vase_strerror(r));
        vase_disconnect(c);
        return r;
    }
    *ret_client = c;
    return 0;
}

/* ---- fixtures ---- */

int harness_fixture_setup(void **state, size_t size, const char *const *args) {
    struct harness_fixture *f = calloc(1, size);
    if (!f)
        return -1;
    f->arg = *state;
    *state = f;
    int r = harness_daemon_start(&f->d, args);
    if (r < 0) {
        fprintf(stderr, "cannot start vased: %s\n", vase_strerror(r));
        return -1;
    }
    return 0;
}

int harness_fixture_teardown(void **state) {
    struct harness_fixture *f = *state;
    if (!f)
        return 0;
    for (size_t i = 0; i < HARNESS_MAX_CLIENTS; i++)
        f->c[i] = vase_disconnect(f->c[i]);
    harness_daemon_free(&f->d);
    free(f);
    *state = NULL;
    return 0;
}

/* ---- a raw session ---- */

int harness_session_open(const struct harness_daemon *d, struct harness_session *ret) {
    ret->fd = -1;
    ret->zmq_ctx = ret->zmq_sock = NULL;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    harness_daemon_path(d, "session.sock", sa.sun_path, sizeof(sa.sun_path));
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    struct timeval tv = {.tv_sec = HARNESS_REQUEST_MS / 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    int r = 0;
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        r = -errno;
        goto fail;
    }

    Vase__SessionHello hello = VASE__SESSION_HELLO__INIT;
    hello.name = "harness-raw";
    hello.pid = (uint32_t)getpid();
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    e.version = VASE_WIRE_VERSION;
    e.body_case = VASE__ENVELOPE__BODY_HELLO;
    e.hello = &hello;
    void *buf;
    size_t len;
    if ((r = vase_wire_pack(&e, &buf, &len)) < 0)
        goto fail;
    ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);
    free(buf);
    if (n < 0) {
        r = -errno;
        goto fail;
    }

    static uint8_t packet[1 << 16];
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int) * 64)];
    } cmsg_buf;
    struct iovec iov = {.iov_base = packet, .iov_len = sizeof(packet)};
    struct msghdr msg = {
        .msg_iov = &iov,
        .msg_iovlen = 1,
        .msg_control = cmsg_buf.buf,
        .msg_controllen = sizeof(cmsg_buf.buf),
    };
    n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0) {
        r = errno == EAGAIN ? -ETIMEDOUT : -errno;
        goto fail;
    }
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
            size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < nfd; i++) {
                int afd;
                memcpy(&afd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
                close(afd);
            }
        }
    if (n == 0) {
        r = -ECONNRESET;
        goto fail;
    }
    Vase__Envelope *w = NULL;
    r = vase_wire_unpack(packet, (size_t)n, sizeof(packet), &w);
    if (r < 0) {
        if (w)
            vase__envelope__free_unpacked(w, NULL);
        goto fail;
    }
    if (w->body_case == VASE__ENVELOPE__BODY_ERROR) {
        r = harness_reply_error(w);
    } else if (w->body_case != VASE__ENVELOPE__BODY_WELCOME ||
               w->welcome->token.len > sizeof(ret->token)) {
        r = -EPROTO;
    } else {
        *ret = (struct harness_session){
            .fd = fd,
            .zmq_ctx = NULL,
            .token_len = w->welcome->token.len,
            .client_id = w->welcome->client_id,
            .incarnation = w->incarnation,
            .max_message_bytes = w->welcome->max_message_bytes,
            .next_seq = 1,
        };
        memcpy(ret->token, w->welcome->token.data, w->welcome->token.len);
        /* One DEALER for the session's life: a second connection with the same routing id
         * could be refused by the ROUTER while the first one is still being torn down. */
        r = dealer_open(d, ret->token, ret->token_len, &ret->zmq_ctx, &ret->zmq_sock);
        if (r < 0)
            ret->fd = -1;
    }
    vase__envelope__free_unpacked(w, NULL);
    if (r == 0)
        return 0;
fail:
    close(fd);
    return r;
}

void harness_session_close(struct harness_session *s) {
    dealer_close(s->zmq_ctx, s->zmq_sock);
    s->zmq_ctx = s->zmq_sock = NULL;
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
}

int harness_session_request(struct harness_session *s, Vase__Envelope *e, Vase__Envelope **ret) {
    if (e->incarnation == 0)
        e->incarnation = s->incarnation;
    if (e->client_seq == 0)
        e->client_seq = s->next_seq++;
    void *buf;
    size_t len;
    int r = stamp_and_pack(e, &buf, &len);
    if (r < 0)
        return r;
    r = dealer_exchange(s->zmq_sock, buf, len, ret);
    free(buf);
    return r;
}

/* ---- engine data ---- */

static uint32_t mix(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

/* A multiple of 1/64 in [-2, 2): 8 significant bits, exact in every dtype. */
static float hash_value(uint32_t a, uint32_t b, uint32_t c, uint32_t dd) {
    uint32_t h = mix(a ^ mix(b ^ mix(c ^ mix(dd))));
    return (float)((int)(h & 255) - 128) / 64.0f;
}

float harness_kv_value(uint32_t salt, uint32_t token, uint32_t layer, uint32_t head, uint32_t d,
                       enum vase_kv kv, uint32_t dim) {
    if (kv == VASE_K && d == dim - 1)
        return (float)(token % 64);
    if (kv == VASE_K && d == dim - 2)
        return (float)(token / 64);
    return hash_value(salt * 2 + (uint32_t)kv, token, layer << 16 | head, d);
}

static float query_value(uint32_t salt, uint32_t token, uint32_t layer, uint32_t head, uint32_t d,
                         uint32_t dim) {
    if (d >= dim - 2)
        return 0.0f;
    return hash_value(salt * 2 + 7, token, layer << 16 | head, d);
}

static int store_row(void *dst, enum vase_dtype dtype, const float *row, uint32_t dim) {
    if (!dst)
        return -EINVAL;
    for (uint32_t d = 0; d < dim; d++) {
        switch (dtype) {
        case VASE_DTYPE_F32:
            ((float *)dst)[d] = row[d];
            break;
        case VASE_DTYPE_F16:
            ((uint16_t *)dst)[d] = vase_f32_to_f16(row[d]);
            break;
        case VASE_DTYPE_BF16:
            ((uint16_t *)dst)[d] = vase_f32_to_bf16(row[d]);
            break;
        default:
            return -EINVAL;
        }
    }
    return 0;
}

int harness_write_token(struct vase_seq *s, const struct vase_geometry *g, uint32_t salt,
                        uint32_t slot, uint32_t token) {
    float row[VASE_MAX_DIM];
    if (g->head_dim < 2 || g->head_dim > VASE_MAX_DIM)
        return -EINVAL;
    for (uint32_t l = 0; l < g->layers; l++) {
        for (uint32_t h = 0; h < g->kv_heads; h++)
            for (int kv = VASE_K; kv <= VASE_V; kv++) {
                for (uint32_t d = 0; d < g->head_dim; d++)
                    row[d] = harness_kv_value(salt, token, l, h, d, kv, g->head_dim);
                int r = store_row(vase_seq_kv_ptr(s, l, kv, slot, h), g->dtype, row, g->head_dim);
                if (r < 0)
                    return r;
            }
        for (uint32_t h = 0; h < g->q_heads; h++) {
            void *q = vase_seq_query_ptr(s, l, token, h);
            if (!q)
                break; /* the policy reads no queries */
            for (uint32_t d = 0; d < g->head_dim; d++)
                row[d] = query_value(salt, token, l, h, d, g->head_dim);
            int r = store_row(q, g->dtype, row, g->head_dim);
            if (r < 0)
                return r;
        }
    }
    return 0;
}

int harness_fill(struct vase_client *c, struct vase_model *m, struct vase_seq_config cfg,
                 struct vase_seq **seqs, int most) {
    cfg.admission_wait_ms = 0;
    for (int n = 0; n < most; n++) {
        int r = vase_seq_open(c, m, &cfg, &seqs[n]);
        if (r == -ENOSPC)
            return n;
        assert_int_equal(r, 0);
    }
    fail_msg("the arena took %d sequences", most);
    return -1;
}

void harness_close_all(struct vase_seq **seqs, int n) {
    for (int i = 0; i < n; i++)
        if (seqs[i]) {
            assert_int_equal(vase_seq_close(seqs[i]), 0);
            seqs[i] = NULL;
        }
}

static void *open_thread(void *arg) {
    struct harness_opener *o = arg;
    o->r = vase_seq_open(o->c, o->m, &o->cfg, &o->s);
    snprintf(o->error, sizeof(o->error), "%s", vase_last_error(o->c));
    __atomic_store_n(&o->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

void harness_opener_start(struct harness_opener *o) {
    o->done = 0;
    assert_int_equal(pthread_create(&o->thread, NULL, open_thread, o), 0);
}

void harness_opener_join(struct harness_opener *o) {
    assert_int_equal(pthread_join(o->thread, NULL), 0);
}

int harness_append_tokens(struct vase_seq *s, const struct vase_geometry *g, uint32_t salt,
                          uint32_t n, bool one_call) {
    int applied = 0;
    for (uint32_t i = 0; i < n;) {
        uint32_t chunk = one_call ? n : 1;
        for (uint32_t j = 0; j < chunk; j++) {
            uint32_t token = (uint32_t)vase_seq_position(s) + j;
            int r = harness_write_token(s, g, salt, vase_seq_len(s) + j, token);
            if (r < 0) {
                fprintf(stderr,
                        "harness: cannot write token %u at slot %u (len %u, capacity "
                        "%u)\n",
                        token, vase_seq_len(s) + j, vase_seq_len(s), vase_seq_capacity(s));
                return r;
            }
        }
        int r = vase_seq_append(s, chunk);
        if (r < 0)
            return r;
        applied += r;
        i += chunk;
    }
    return applied;
}

int harness_slot_token(const struct vase_seq *s, const struct vase_geometry *g, uint32_t salt,
                       uint32_t layer, uint32_t head, uint32_t slot) {
    struct vase_view kv[2];
    float row[VASE_MAX_DIM];
    if (slot >= vase_seq_len(s) || g->head_dim > VASE_MAX_DIM ||
        vase_seq_kv_view(s, layer, VASE_K, &kv[0]) < 0 ||
        vase_seq_kv_view(s, layer, VASE_V, &kv[1]) < 0)
        return -EINVAL;
    if (vase_view_read_row(&kv[0], slot, head, row) < 0)
        return -1;
    float lo = row[g->head_dim - 1], hi = row[g->head_dim - 2];
    if (lo < 0 || lo >= 64 || hi < 0 || hi >= 64 || lo != floorf(lo) || hi != floorf(hi))
        return -1;
    uint32_t token = (uint32_t)hi * 64 + (uint32_t)lo;
    for (int k = VASE_K; k <= VASE_V; k++) {
        if (k == VASE_V && vase_view_read_row(&kv[1], slot, head, row) < 0)
            return -1;
        for (uint32_t d = 0; d < g->head_dim; d++)
            if (row[d] != harness_kv_value(salt, token, layer, head, d, k, g->head_dim))
                return -1;
    }
    return (int)token;
}

int harness_snapshot(const struct vase_seq *s, const struct vase_geometry *g, uint32_t salt,
                     int32_t **ret_tokens, uint32_t *ret_len) {
    uint32_t len = vase_seq_len(s);
    int32_t *tokens = malloc(sizeof(*tokens) * ((size_t)g->layers * g->kv_heads * len + 1));
    if (!tokens)
        return -ENOMEM;
    for (uint32_t l = 0; l < g->layers; l++)
        for (uint32_t h = 0; h < g->kv_heads; h++)
            for (uint32_t slot = 0; slot < len; slot++) {
                int t = harness_slot_token(s, g, salt, l, h, slot);
                if (t < 0) {
                    fprintf(stderr,
                            "harness: layer %u head %u slot %u holds no token's data "
                            "(%d)\n",
                            l, h, slot, t);
                    free(tokens);
                    return -EBADMSG;
                }
                tokens[((size_t)l * g->kv_heads + h) * len + slot] = t;
            }
    *ret_tokens = tokens;
    *ret_len = len;
    return 0;
}

int harness_check_plan(const int32_t *before, uint32_t len_before, const int32_t *after,
                       uint32_t len_after, uint32_t lists, uint32_t keep, uint32_t n,
                       uint32_t first_new) {
    if (keep > n || n > len_before || len_after < keep + (len_before - n)) {
        fprintf(stderr, "harness: lengths do not fit a plan: keep %u, n %u, before %u, after %u\n",
                keep, n, len_before, len_after);
        return -EINVAL;
    }
    for (uint32_t li = 0; li < lists; li++) {
        const int32_t *b = before + (size_t)li * len_before, *a = after + (size_t)li * len_after;
        for (uint32_t i = 0; i < keep; i++) {
            bool candidate = false;
            for (uint32_t j = 0; j < n && !candidate; j++)
                candidate = b[j] == a[i];
            bool repeated = false;
            for (uint32_t j = 0; j < i && !repeated; j++)
                repeated = a[j] == a[i];
            if (!candidate || repeated) {
                fprintf(stderr, "harness: list %u slot %u keeps token %d, %s\n", li, i, a[i],
                        candidate ? "kept twice" : "which was not a candidate");
                return -EINVAL;
            }
        }
        for (uint32_t i = keep; i < len_after; i++) {
            uint32_t src = n + (i - keep);
            int32_t want = src < len_before ? b[src] : (int32_t)(first_new + src - len_before);
            if (a[i] != want) {
                fprintf(stderr, "harness: list %u slot %u holds token %d, want %d\n", li, i, a[i],
                        want);
                return -EINVAL;
            }
        }
    }
    return 0;
}
