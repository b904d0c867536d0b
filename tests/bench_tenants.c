/* SPDX-License-Identifier: MIT */

/*
 * bench_tenants: what a crowd of sessions of one uid costs the plans of another uid, measured
 * through libvase against a running vased (tests/bench_tenants.sh runs it against a private
 * daemon). A benchmark, not a test: it prints medians and percentiles and asserts nothing.
 *
 * It runs as root and forks: a victim session of uid A (--victim-uid) evicts one sequence in
 * sync mode, a few milliseconds of simulated decode between evictions, first alone, then beside
 * --sessions sessions of uid B (--noisy-uid), each evicting its own sequence back to back, so that
 * each of them always has a plan queued. The victim's plan latency is the time of the append that
 * triggers an eviction (request, queueing, plan, reply, commit sent) less its compaction; the
 * daemon's own time for the plan is printed beside it. Sessions of B that the daemon refuses
 * (max_sessions_per_uid) are counted and the figures taken beside those it admitted.
 */

#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "argnum.h"
#include "vase.h"

#define MAX_SESSIONS 256

static const char *arg_runtime_dir;
static uint32_t arg_victim_uid = 40001, arg_noisy_uid = 40002;
static uint32_t arg_sessions = 32;
static uint32_t arg_evictions = 200;
static uint32_t arg_layers = 4, arg_budget = 512, arg_window = 64;
static double arg_step_ms = 2.0;

static double now_seconds(void) {
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_ms(double ms) {
    struct timespec ts = {.tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)fmod(ms * 1e6, 1e9)};

    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

/* The q-quantile of the n sorted values v (nearest rank). */
static double quantile(const double *v, size_t n, double q) {
    size_t i = (size_t)ceil(q * (double)n);

    return v[i ? i - 1 : 0];
}

static struct vase_geometry geometry(void) {
    return (struct vase_geometry){.name = "bench-tenants",
                                  .layers = arg_layers,
                                  .q_heads = 8,
                                  .kv_heads = 2,
                                  .head_dim = 64,
                                  .dtype = VASE_DTYPE_F32};
}

/* Fills n floats with values in [-1, 1) from *state (xorshift64). */
static void fill(float *p, uint32_t n, uint64_t *state) {
    for (uint32_t i = 0; i < n; i++) {
        uint64_t x = *state;
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        *state = x;
        p[i] = (float)((double)(x >> 11) / 4503599627370496.0 - 1.0);
    }
}

/* Writes one token (K, V of every layer and head, and its queries) at the sequence's end. */
static int write_token(struct vase_seq *s, const struct vase_geometry *g, uint64_t *state) {
    uint32_t len = vase_seq_len(s);
    uint64_t pos = vase_seq_position(s);

    for (uint32_t l = 0; l < g->layers; l++) {
        for (uint32_t h = 0; h < g->kv_heads; h++) {
            float *k = vase_seq_kv_ptr(s, l, VASE_K, len, h);
            float *v = vase_seq_kv_ptr(s, l, VASE_V, len, h);

            if (!k || !v)
                return -ENOSPC;
            fill(k, g->head_dim, state);
            fill(v, g->head_dim, state);
        }
        for (uint32_t h = 0; h < g->q_heads; h++) {
            float *q = vase_seq_query_ptr(s, l, pos, h);

            if (q)
                fill(q, g->head_dim, state);
        }
    }
    return 0;
}

/* A session as uid:gid, no supplementary groups; its model and one sync VaSE-AttnV sequence. */
struct session {
    struct vase_client *c;
    struct vase_model *m;
    struct vase_seq *s;
    struct vase_geometry g;
    uint64_t state;
};

static int become(uid_t uid) {
    if (setgroups(0, NULL) < 0 || setgid((gid_t)uid) < 0 || setuid(uid) < 0)
        return -errno;
    return 0;
}

static int session_open(struct session *x, const char *name, uint64_t seed) {
    struct vase_seq_config cfg = {
        .policy = VASE_POLICY_VASE_ATTNV,
        .params = vase_params_default(arg_budget),
        .seed = seed,
        .mode = VASE_MODE_SYNC,
        .slack = -1,
    };
    int r;

    *x = (struct session){.g = geometry(), .state = seed * 0x9e3779b97f4a7c15ull + 1};
    cfg.params.window = arg_window;
    r = vase_connect(&(struct vase_connect_options){.runtime_dir = arg_runtime_dir,
                                                    .name = name,
                                                    .timeout_ms = 120000},
                     &x->c);
    if (r < 0)
        return r;
    if ((r = vase_model_register(x->c, &x->g, &x->m)) < 0 ||
        (r = vase_seq_open(x->c, x->m, &cfg, &x->s)) < 0) {
        x->c = vase_disconnect(x->c);
        return r;
    }
    return 0;
}

/* Appends tokens up to and through the next eviction; the latency of the append that evicted
 * (its compaction taken off) and the daemon's plan time. */
static int evict_once(struct session *x, double *ret_latency, double *ret_plan) {
    for (;;) {
        struct vase_seq_stats before, after;
        int r = write_token(x->s, &x->g, &x->state);

        if (r < 0)
            return r;
        vase_seq_get_stats(x->s, &before);
        double t0 = now_seconds();
        r = vase_seq_append(x->s, 1);
        double dt = now_seconds() - t0;
        if (r < 0)
            return r;
        vase_seq_get_stats(x->s, &after);
        if (after.evictions == before.evictions)
            continue;
        *ret_latency = dt - (after.compact_seconds - before.compact_seconds);
        *ret_plan = after.last_plan_seconds;
        return 0;
    }
}

/* The victim: warm-up, then arg_evictions measured evictions; prints one line. */
static int victim(const char *what) {
    struct session x;
    double *lat = calloc(arg_evictions, sizeof(double));
    double *plan = calloc(arg_evictions, sizeof(double));
    int r;

    if (!lat || !plan)
        return -ENOMEM;
    if ((r = become(arg_victim_uid)) < 0 || (r = session_open(&x, "victim", 1)) < 0) {
        fprintf(stderr, "bench_tenants: victim: %s\n", vase_strerror(r));
        return r;
    }
    for (uint32_t i = 0; i < 3 + arg_evictions; i++) {
        double l, p;

        if ((r = evict_once(&x, &l, &p)) < 0) {
            fprintf(stderr, "bench_tenants: victim eviction: %s\n", vase_strerror(r));
            break;
        }
        if (i >= 3) {
            lat[i - 3] = l;
            plan[i - 3] = p;
        }
        sleep_ms(arg_step_ms);
    }
    if (r == 0) {
        qsort(lat, arg_evictions, sizeof(double), cmp_double);
        qsort(plan, arg_evictions, sizeof(double), cmp_double);
        printf("%-44s %6u  latency p50 %8.2f ms  p99 %8.2f ms  | daemon's plan p50 %6.2f ms\n",
               what, arg_evictions, 1e3 * quantile(lat, arg_evictions, 0.5),
               1e3 * quantile(lat, arg_evictions, 0.99), 1e3 * quantile(plan, arg_evictions, 0.5));
        fflush(stdout);
    }
    vase_disconnect(x.c);
    free(lat);
    free(plan);
    return r;
}

/* A session of the noisy uid: says 'r' (admitted) or 'x' (refused) on ready, then evicts back to
 * back until stop is readable (closed). */
static int noisy(int index, int ready, int stop) {
    struct session x;
    char name[32];
    int r;

    snprintf(name, sizeof(name), "noisy-%d", index);
    r = become(arg_noisy_uid);
    if (r == 0)
        r = session_open(&x, name, 100 + (uint64_t)index);
    if (r < 0) {
        fprintf(stderr, "bench_tenants: %s refused: %s\n", name, vase_strerror(r));
        (void)!write(ready, "x", 1);
        return 0;
    }
    (void)!write(ready, "r", 1);
    close(ready);
    while (r == 0) {
        double l, p;
        struct timespec zero = {0};
        fd_set fds;

        FD_ZERO(&fds);
        FD_SET(stop, &fds);
        if (pselect(stop + 1, &fds, NULL, NULL, &zero, NULL) != 0)
            break;
        r = evict_once(&x, &l, &p);
    }
    vase_disconnect(x.c);
    return r < 0 ? 1 : 0;
}

static pid_t fork_child(int (*fn)(void *), void *arg) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0)
        _exit(fn(arg) < 0 ? 1 : 0);
    return pid;
}

static int victim_main(void *what) {
    return victim(what);
}

static int wait_child(pid_t pid) {
    int status;

    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return -errno;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -ECHILD;
}

/* The runtime directory and its sockets opened to the two uids: the allow-list is the gate. */
static int open_sockets(void) {
    static const char *const socks[] = {"session.sock", "control.sock", "events.sock"};
    const char *dir = arg_runtime_dir ? arg_runtime_dir : getenv("VASE_RUNTIME_DIR");
    char path[4096];

    if (!dir)
        return -EINVAL;
    if (chmod(dir, 0755) < 0)
        return -errno;
    for (size_t i = 0; i < 3; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, socks[i]);
        if (chmod(path, 0666) < 0)
            return -errno;
    }
    return 0;
}

static int run(void) {
    pid_t pids[MAX_SESSIONS];
    int ready[2], stop[2], r;
    uint32_t admitted = 0, refused = 0;
    char what[64];

    if (getuid() != 0) {
        fprintf(stderr, "bench_tenants: must run as root (it switches to other uids)\n");
        return -EPERM;
    }
    if ((r = open_sockets()) < 0) {
        fprintf(stderr, "bench_tenants: cannot open the runtime directory: %s\n", strerror(-r));
        return r;
    }
    printf("bench_tenants: victim uid %u, %u sessions of uid %u; %u layers, budget %u, window %u, "
           "VaSE-AttnV, sync\n",
           arg_victim_uid, arg_sessions, arg_noisy_uid, arg_layers, arg_budget, arg_window);
    if ((r = wait_child(fork_child(victim_main, "victim alone"))) < 0)
        return r;

    if (pipe(ready) < 0 || pipe(stop) < 0)
        return -errno;
    for (uint32_t i = 0; i < arg_sessions; i++) {
        fflush(stdout);
        pids[i] = fork();
        if (pids[i] == 0) {
            close(ready[0]);
            close(stop[1]);
            _exit(noisy((int)i, ready[1], stop[0]));
        }
    }
    close(ready[1]);
    close(stop[0]);
    for (uint32_t i = 0; i < arg_sessions; i++) {
        char c;
        if (read(ready[0], &c, 1) != 1)
            break;
        if (c == 'r')
            admitted++;
        else
            refused++;
    }
    close(ready[0]);
    printf("sessions of uid %u: %u admitted, %u refused\n", arg_noisy_uid, admitted, refused);
    snprintf(what, sizeof(what), "victim beside %u sessions of uid %u", admitted, arg_noisy_uid);
    r = wait_child(fork_child(victim_main, what));
    close(stop[1]);
    for (uint32_t i = 0; i < arg_sessions; i++)
        wait_child(pids[i]);
    return r;
}

static void help(void) {
    printf("%s [OPTIONS]\n\n"
           "The plan latency of one session of uid A, alone and beside many sessions of uid B,\n"
           "against the vased in $VASE_RUNTIME_DIR (run as root; the daemon's allow_users must\n"
           "admit both uids).\n\n"
           "  -h --help             Show this help\n"
           "     --runtime-dir=DIR  The daemon's runtime directory\n"
           "     --victim-uid=UID   Uid A (default 40001; its gid is the same number)\n"
           "     --noisy-uid=UID    Uid B (default 40002)\n"
           "     --sessions=N       Sessions of uid B (default 32)\n"
           "     --evictions=N      Measured evictions of the victim (default 200)\n"
           "     --layers=N         Layers of the model (default 4)\n"
           "     --budget=N         Budget of every sequence (default 512)\n"
           "     --window=N         Window (default 64)\n"
           "     --step-ms=MS       The victim's simulated decode step (default 2)\n",
           program_invocation_short_name);
}

static int parse_argv(int argc, char **argv) {
    enum {
        ARG_DIR = 0x100,
        ARG_VICTIM,
        ARG_NOISY,
        ARG_SESSIONS,
        ARG_EVICTIONS,
        ARG_LAYERS,
        ARG_BUDGET,
        ARG_WINDOW,
        ARG_STEP
    };
    static const struct option options[] = {
        {"help", no_argument, NULL, 'h'},
        {"runtime-dir", required_argument, NULL, ARG_DIR},
        {"victim-uid", required_argument, NULL, ARG_VICTIM},
        {"noisy-uid", required_argument, NULL, ARG_NOISY},
        {"sessions", required_argument, NULL, ARG_SESSIONS},
        {"evictions", required_argument, NULL, ARG_EVICTIONS},
        {"layers", required_argument, NULL, ARG_LAYERS},
        {"budget", required_argument, NULL, ARG_BUDGET},
        {"window", required_argument, NULL, ARG_WINDOW},
        {"step-ms", required_argument, NULL, ARG_STEP},
        {},
    };
    int c;

    while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0) {
        uint32_t *u = NULL, lo = 1, hi = UINT32_MAX;

        switch (c) {
        case 'h':
            help();
            return 0;
        case ARG_DIR:
            arg_runtime_dir = optarg;
            continue;
        case ARG_VICTIM:
            u = &arg_victim_uid;
            break;
        case ARG_NOISY:
            u = &arg_noisy_uid;
            break;
        case ARG_SESSIONS:
            u = &arg_sessions, lo = 0, hi = MAX_SESSIONS;
            break;
        case ARG_EVICTIONS:
            u = &arg_evictions, hi = 1000000;
            break;
        case ARG_LAYERS:
            u = &arg_layers, hi = 256;
            break;
        case ARG_BUDGET:
            u = &arg_budget;
            break;
        case ARG_WINDOW:
            u = &arg_window;
            break;
        case ARG_STEP: {
            char *end;
            errno = 0;
            arg_step_ms = strtod(optarg, &end);
            if (errno || *end || !(arg_step_ms >= 0 && arg_step_ms <= 10000)) {
                fprintf(stderr, "bench_tenants: bad --step-ms: %s\n", optarg);
                return -EINVAL;
            }
            continue;
        }
        default:
            return -EINVAL;
        }
        if (argnum_u32(optarg, lo, hi, u) < 0) {
            fprintf(stderr, "bench_tenants: bad value for --%s: %s\n",
                    options[c - ARG_DIR + 1].name, optarg);
            return -EINVAL;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "bench_tenants: unexpected argument: %s\n", argv[optind]);
        return -EINVAL;
    }
    return 1;
}

int main(int argc, char **argv) {
    int r = parse_argv(argc, argv);

    if (r <= 0)
        return r < 0 ? 2 : 0;
    signal(SIGPIPE, SIG_IGN);
    return run() < 0 ? 1 : 0;
}
