/* SPDX-License-Identifier: MIT */

/*
 * Start-up and teardown. Each stage is its own function and leaves what it made in struct vased,
 * so one teardown releases any prefix of them in reverse order: plans first (threads read the
 * arenas), then sessions (closing them is what tells clients we are gone), sockets, and the
 * arenas last, when no session is left that could still map them. Signals are blocked before any
 * thread starts; the runtime directory is checked before a socket is made in it, and the old
 * sockets are probed before anything big is allocated.
 */

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <time.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/arena.h"
#include "serve/clients.h"
#include "control/control.h"
#include "core/events.h"
#include "plan/evictor.h"
#include "core/log.h"
#include "serve/metrics_http.h"
#include "serve/restore.h"
#include "setup.h"
#include "state.h"
#include "core/zap.h"

/*
 * The main thread's id, for forward_signal(). Libraries may start threads before main() runs
 * (OpenBLAS does, from a constructor) with every signal unblocked; the kernel may hand them a
 * process-directed SIGTERM, whose default action would kill us. Their copy of the signal is
 * redirected to the main thread, which blocks it, so it waits for the signalfd. It goes with its
 * siginfo, so that the log still names who sent it (a SIGHUP reload is an administrative change).
 */
static volatile pid_t main_tid;

static void forward_signal(int sig, siginfo_t *si, void *context) {
    (void)context;
    int saved = errno;
    /* The kernel lets a thread other than the leader queue a signal with a sender's pid and uid
     * only as SI_QUEUE; the sender's are what the main thread reads. */
    siginfo_t copy = *si;
    copy.si_code = SI_QUEUE;
    if (main_tid > 0 && syscall(SYS_rt_tgsigqueueinfo, getpid(), main_tid, sig, &copy) < 0)
        syscall(SYS_tgkill, getpid(), main_tid, sig);
    errno = saved;
}

static int setup_signals(struct vased *d) {
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGHUP);
    /* Blocked before any thread starts (ZeroMQ's, the evictor's), so they all inherit the mask
     * and the signals reach only the signalfd. */
    if (pthread_sigmask(SIG_BLOCK, &mask, NULL) != 0)
        return log_error_errno(-EINVAL, "Cannot block signals.");
    main_tid = gettid();
    struct sigaction sa = {.sa_sigaction = forward_signal, .sa_flags = SA_RESTART | SA_SIGINFO};
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGTERM, &sa, NULL) < 0 || sigaction(SIGINT, &sa, NULL) < 0 ||
        sigaction(SIGHUP, &sa, NULL) < 0)
        return log_error_errno(-errno, "sigaction() failed: %m");
    signal(SIGPIPE, SIG_IGN);
    d->signal_fd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (d->signal_fd < 0)
        return log_error_errno(-errno, "signalfd() failed: %m");
    return 0;
}

static int setup_timer(struct vased *d) {
    /* Ticks every second, faster if the watchdog needs it (a ping every half interval). */
    long tick_ns = 1000000000L;
    uint64_t usec = 0;
    if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0) {
        d->watchdog_usec = usec;
        if ((long)(usec * 1000 / 4) < tick_ns)
            tick_ns = (long)(usec * 1000 / 4);
        if (tick_ns < 1000000)
            tick_ns = 1000000;
    }
    d->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
    if (d->timer_fd < 0)
        return log_error_errno(-errno, "timerfd_create() failed: %m");
    struct itimerspec its = {
        .it_interval = {.tv_sec = tick_ns / 1000000000L, .tv_nsec = tick_ns % 1000000000L},
        .it_value = {.tv_sec = tick_ns / 1000000000L, .tv_nsec = tick_ns % 1000000000L},
    };
    if (timerfd_settime(d->timer_fd, 0, &its, NULL) < 0)
        return log_error_errno(-errno, "timerfd_settime() failed: %m");
    return 0;
}

static char *path_join(const char *dir, const char *name) {
    char *p;
    return asprintf(&p, "%s/%s", dir, name) < 0 ? NULL : p;
}

/*
 * The runtime directory holds the sockets, whose modes and group are the access control of
 * the whole daemon. Whoever can write the directory can replace a socket (with a symlink to a
 * file of their choice, or with their own listener), so it must be a real directory that no
 * one but the daemon's user and root can write. Kept open (runtime_dir_fd) so that the sockets'
 * group is set relative to the directory that was checked.
 */
static int check_runtime_dir(struct vased *d, const char *dir, bool created) {
    struct stat st;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return log_error_errno(
            -errno, "Cannot open the runtime directory %s%s: %m", dir,
            errno == ELOOP || errno == ENOTDIR ? " (a symlink or not a directory)" : "");
    if (fstat(fd, &st) < 0) {
        int r = log_error_errno(-errno, "Cannot stat the runtime directory %s: %m", dir);
        close(fd);
        return r;
    }
    /* mkdir() applied the umask; clients need to reach the sockets inside. */
    if (created && fchmod(fd, 0755) == 0)
        st.st_mode = (st.st_mode & ~(mode_t)07777) | 0755;
    const char *why = NULL;
    if (st.st_uid != d->self_uid && st.st_uid != 0)
        why = "it belongs to another user";
    else if (st.st_mode & (S_IWGRP | S_IWOTH))
        why = "others than its owner can write it (chmod go-w)";
    if (why) {
        close(fd);
        return log_error_errno(-EPERM,
                               "Refusing the runtime directory %s (owner uid %u, mode "
                               "%04o): %s; whoever can write it could replace the sockets.",
                               dir, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777), why);
    }
    d->runtime_dir_fd = fd;
    return 0;
}

/*
 * Clients find the sockets by the runtime directory's path, so each directory above it matters
 * too: whoever can write one (and rename entries in it) can move the runtime directory aside and
 * put their own, with their own listener, at the path clients connect to. Each must belong to
 * root or the daemon's user and be writable by no one else, unless it is sticky (as /tmp is),
 * where only an entry's owner may rename it. dir is a resolved path (no symlinks, no "..").
 */
static int check_runtime_parents(struct vased *d, const char *dir) {
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s", dir);
    for (char *slash = strrchr(path, '/'); slash; slash = strrchr(path, '/')) {
        if (slash == path)
            slash[1] = '\0'; /* the root itself */
        else
            *slash = '\0';
        struct stat st;
        if (lstat(path, &st) < 0)
            return log_error_errno(-errno, "Cannot stat %s, above the runtime directory %s: %m",
                                   path, dir);
        const char *why = NULL;
        if (st.st_uid != d->self_uid && st.st_uid != 0)
            why = "it belongs to another user";
        else if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX))
            why = "others than its owner can write it and it is not sticky (chmod go-w or +t)";
        if (why)
            return log_error_errno(-EPERM,
                                   "Refusing the runtime directory %s: the directory %s above it "
                                   "(owner uid %u, mode %04o) is not safe: %s; whoever can write "
                                   "it could put another directory and other sockets in its place.",
                                   dir, path, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777),
                                   why);
        if (slash == path)
            break;
    }
    return 0;
}

static int setup_runtime_dir(struct vased *d) {
    const char *dir = d->cfg.runtime_dir;
    char first[PATH_MAX];

    if (!dir[0])
        dir = getenv("VASE_RUNTIME_DIR");
    if (!dir || !dir[0]) {
        /* systemd's RuntimeDirectory= may list several directories, colon-separated. */
        const char *rd = getenv("RUNTIME_DIRECTORY");
        if (rd && rd[0]) {
            snprintf(first, sizeof(first), "%.*s", (int)strcspn(rd, ":"), rd);
            dir = first;
        }
    }
    if (!dir || !dir[0])
        dir = "./run";

    bool created = mkdir(dir, 0755) == 0;
    if (!created && errno != EEXIST)
        return log_error_errno(-errno, "Cannot create the runtime directory %s: %m", dir);
    int r = check_runtime_dir(d, dir, created);
    if (r < 0)
        return r;
    d->runtime_dir = realpath(dir, NULL);
    if (!d->runtime_dir)
        return log_error_errno(-errno, "Cannot resolve the runtime directory %s: %m", dir);
    if ((r = check_runtime_parents(d, d->runtime_dir)) < 0)
        return r;

    d->session_path = path_join(d->runtime_dir, "session.sock");
    d->control_path = path_join(d->runtime_dir, "control.sock");
    d->events_path = path_join(d->runtime_dir, "events.sock");
    if (!d->session_path || !d->control_path || !d->events_path)
        return log_oom();
    if (asprintf(&d->control_endpoint, "ipc://%s", d->control_path) < 0) {
        d->control_endpoint = NULL;
        return log_oom();
    }
    if (asprintf(&d->events_endpoint, "ipc://%s", d->events_path) < 0) {
        d->events_endpoint = NULL;
        return log_oom();
    }
    if (strlen(d->session_path) >= 100)
        return log_error_errno(-ENAMETOOLONG, "Runtime directory path too long for sockets: %s",
                               d->runtime_dir);
    return 0;
}

/*
 * Socket activation: vased.socket makes the session listener and keeps it while vased stops and
 * starts, so an engine that connects while the daemon is down or starting waits in its queue
 * (and the connect starts vased) instead of failing. The passed socket must be the one vased
 * would make itself; anything else is a configuration error, not something to work around. The
 * LISTEN_* variables are unset, so nothing vased starts takes them for its own.
 */
static int adopt_listener(struct vased *d, int fd, const char *name) {
    if (d->session_fd >= 0)
        return log_error_errno(-EEXIST,
                               "systemd passed a second socket (%s); vased takes one, the "
                               "session socket.",
                               name);
    int r = vase_session_adopt(fd, d->session_path);
    if (r == -ENOTSOCK)
        return log_error_errno(r,
                               "The socket systemd passed (%s) is not a listening AF_UNIX "
                               "SOCK_SEQPACKET socket; vased.socket must say "
                               "ListenSequentialPacket=%s.",
                               name, d->session_path);
    if (r == -EADDRNOTAVAIL)
        return log_error_errno(r,
                               "The socket systemd passed (%s) is not bound to %s, the session "
                               "socket of the runtime directory %s; make vased.socket's "
                               "ListenSequentialPacket= name it.",
                               name, d->session_path, d->runtime_dir);
    if (r < 0)
        return log_error_errno(r, "Cannot use the socket systemd passed (%s): %m", name);
    d->session_fd = fd;
    d->session_activated = true;
    log_info("Listening on %s, passed by systemd (socket activation).", d->session_path);
    return 0;
}

static int setup_listen_fds(struct vased *d) {
    char **names = NULL;
    int n = sd_listen_fds_with_names(1, &names);
    if (n < 0)
        return log_error_errno(n, "Cannot read the sockets passed by systemd (LISTEN_FDS): %m");
    int r = 0;
    for (int i = 0; i < n; i++) {
        int fd = SD_LISTEN_FDS_START + i;
        const char *name = names && names[i] ? names[i] : "unnamed";
        /* What the fd store kept (restore.h) goes there; the rest must be the listener. */
        int kept = r >= 0 ? vase_restore_take_fd(d, fd, name) : 0;
        if (kept > 0)
            continue;
        if (kept < 0)
            r = log_oom();
        if (r >= 0)
            r = adopt_listener(d, fd, name);
        if (fd != d->session_fd)
            close(fd);
    }
    if (names)
        for (int i = 0; i < n; i++)
            free(names[i]);
    free(names);
    return r;
}

static bool blank(const char *s) {
    return !s || s[strspn(s, " \t,")] == '\0';
}

/* One arena: its memory, its allocator and who may use it. */
static int add_arena(struct vased *d, const char *name, const char *spec, const char *cuda_share,
                     uint64_t bytes, uint64_t granule_bytes, const char *users,
                     const char *groups) {
    uint32_t i = d->n_arenas;
    enum vase_cuda_share share;
    int r = vase_cuda_share_from_string(cuda_share, &share);
    if (r < 0)
        return log_error_errno(r, "Arena %s: cuda_share=\"%s\": expected \"ipc\" or \"vmm\".", name,
                               cuda_share);
    r = vase_restore_arena(d, i, name, spec, share, bytes, granule_bytes, &d->arenas[i]);
    if (r < 0)
        return r;
    d->n_arenas++;
    d->arena_names[i] = name;
    r = vase_alloc_new(d->arenas[i]->size, d->arenas[i]->granule_bytes, &d->allocs[i]);
    if (r < 0)
        return log_oom();
    vase_alloc_set_release_hook(d->allocs[i], vase_arena_zero, d->arenas[i]);
    /* An arena that names no one is open to every allowed peer; one whose names do not
     * resolve is open to no one but root and the daemon's user (denying more, never less). */
    d->arena_open[i] = blank(users) && blank(groups);
    if (vase_allow_parse(users, groups, &d->arena_allow[i]) < 0)
        return log_oom();
    log_info("Arena %u \"%s\" (%s%s%s, shared as %s): %llu bytes, %u granules of %llu bytes; for "
             "%s%s%s%s.",
             i, name, d->arenas[i]->kind, d->arenas[i]->device_uuid[0] ? ", " : "",
             d->arenas[i]->device_uuid, d->arenas[i]->ops->share,
             (unsigned long long)d->arenas[i]->size, d->arenas[i]->num_granules,
             (unsigned long long)d->arenas[i]->granule_bytes,
             d->arena_open[i] ? "every allowed peer" : "users: ", d->arena_open[i] ? "" : users,
             d->arena_open[i] ? "" : "; groups: ", d->arena_open[i] ? "" : groups);
    return 0;
}

static int setup_arenas(struct vased *d) {
    const struct vase_config *c = &d->cfg;
    int r = vase_restore_load(d);
    if (r < 0)
        return r;
    r = add_arena(d, "default", c->arena, c->cuda_share, c->arena_bytes, c->granule_bytes,
                  c->arena_users, c->arena_groups);
    for (size_t i = 0; r >= 0 && i < c->n_extra_arenas; i++) {
        const struct vase_arena_config *a = &c->extra_arenas[i];
        r = add_arena(d, a->name, a->arena, a->cuda_share, a->arena_bytes, a->granule_bytes,
                      a->users, a->groups);
    }
    return r;
}

/* Sockets are files in the runtime directory: mode 0660 (the umask of their bind), group
 * socket_group when set. The directory is ours alone (check_runtime_dir()), and the change is
 * made without following a symlink all the same. */
static int set_socket_group(struct vased *d, const char *path) {
    if (!d->cfg.socket_group[0])
        return 0;
    gid_t gid;
    uint64_t id;
    if (vase_parse_u64(d->cfg.socket_group, &id) == 0 && id < UINT32_MAX) {
        gid = (gid_t)id;
    } else {
        struct group *gr = getgrnam(d->cfg.socket_group);
        if (!gr)
            return log_error_errno(-ENOENT, "socket_group: no group \"%s\".", d->cfg.socket_group);
        gid = gr->gr_gid;
    }
    const char *name = strrchr(path, '/');
    name = name ? name + 1 : path;
    if (fchownat(d->runtime_dir_fd, name, (uid_t)-1, gid, AT_SYMLINK_NOFOLLOW) < 0)
        return log_error_errno(-errno, "Cannot give %s to group %s: %m", path, d->cfg.socket_group);
    return 0;
}

static int probe(const char *path, int type) {
    int r = vase_session_probe(path, type);
    if (r == -EADDRINUSE)
        return log_error_errno(r, "Another vased is running on %s; refusing to start.", path);
    if (r == -EEXIST)
        return log_error_errno(r, "%s exists and is not a socket; refusing to replace it.", path);
    if (r < 0)
        return log_error_errno(r, "Cannot check %s: %m", path);
    return 0;
}

/* A live daemon answers on its sockets; a dead one left files no one listens on. Checked
 * before anything big is allocated. */
static int check_stale_sockets(struct vased *d) {
    int r;
    /* A socket passed by systemd answers: it is ours. */
    if ((!d->session_activated && (r = probe(d->session_path, SOCK_SEQPACKET)) < 0) ||
        (r = probe(d->control_path, SOCK_STREAM)) < 0 ||
        (r = probe(d->events_path, SOCK_STREAM)) < 0)
        return r;
    return 0;
}

static int setup_sockets(struct vased *d) {
    int r;

    d->zmq_ctx = zmq_ctx_new();
    if (!d->zmq_ctx)
        return log_error_errno(-zmq_errno(), "zmq_ctx_new() failed: %m");

    r = vase_zap_open(d->zmq_ctx, &d->zap);
    if (r < 0)
        return r;
    mode_t old = umask(0117);
    r = vase_control_open(d->zmq_ctx, d->control_endpoint, d->cfg.max_message_bytes, &d->router);
    if (r >= 0)
        r = vase_events_new(d->zmq_ctx, d->events_endpoint, d->incarnation, &d->events);
    if (r >= 0 && !d->session_activated) {
        r = vase_session_listen(d->session_path, &d->session_fd);
        if (r < 0)
            log_error_errno(r, "Cannot listen on %s: %m", d->session_path);
    }
    umask(old);
    if (r < 0)
        return r;
    /* vased.socket gives its socket the owner and mode it names (SocketGroup=, SocketMode=). */
    if ((!d->session_activated && (r = set_socket_group(d, d->session_path)) < 0) ||
        (r = set_socket_group(d, d->control_path)) < 0 ||
        (r = set_socket_group(d, d->events_path)) < 0)
        return r;
    return 0;
}

static int render_metrics(void *userdata, struct vase_metrics_buf *b) {
    return vase_metrics_render(userdata, b);
}

/* Whether the configuration (a file, a flag) names metrics_address, rather than leaving it to
 * its default. */
static bool metrics_address_given(const struct vased *d) {
    const struct vase_setting *s = vase_setting_find("metrics_address");
    return s && d->cfg.origins &&
           d->cfg.origins[s - vase_settings].from != VASE_CONFIG_FROM_DEFAULT;
}

/* The metrics endpoint, unless metrics_address is off. When the configuration names the
 * address, a bind failure stops the start: an operator who asked for metrics is told at once,
 * not by a scraper's alert. The default address only warns when it cannot be bound: another
 * program (or another user) holding port 9464 must not keep vased from starting. */
static int setup_metrics(struct vased *d) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    d->metrics.started_at = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    if (!d->cfg.metrics_address || strcmp(d->cfg.metrics_address, "off") == 0) {
        log_info("Metrics endpoint off (metrics_address).");
        return 0;
    }
    int r = vase_metrics_http_new(d->cfg.metrics_address, render_metrics, d, &d->metrics_http);
    if ((r == -EADDRINUSE || r == -EACCES || r == -EADDRNOTAVAIL) && !metrics_address_given(d)) {
        snprintf(d->metrics_unavailable, sizeof(d->metrics_unavailable),
                 "the default metrics_address %s is not free (%s): a scrape there does not read "
                 "this vased",
                 d->cfg.metrics_address, strerror(-r));
        log_warning("No metrics endpoint: %s; set metrics_address to another address, or to off.",
                    d->metrics_unavailable);
        return 0;
    }
    if (r < 0)
        return r;
    log_info("Metrics on http://%s/metrics.", vase_metrics_http_address(d->metrics_http));
    return 0;
}

static int setup_evictor(struct vased *d) {
    long n = d->cfg.evictor_threads;
    if (n == 0) {
        n = sysconf(_SC_NPROCESSORS_ONLN);
        if (n < 1)
            n = 1;
        if (n > 256)
            n = 256;
    }
    int r = vase_evictor_new(d->zmq_ctx, (unsigned)n, &d->evictor);
    if (r < 0)
        return r;
    log_info("%ld evictor threads.", n);
    return 0;
}

/* Who may open a session, and who may change settings. */
static int setup_access(struct vased *d) {
    int r = vase_allow_parse(d->cfg.allow_users, d->cfg.allow_groups, &d->allow);
    if (r >= 0)
        r = vase_allow_parse("", d->cfg.admin_group, &d->admins);
    if (r < 0)
        log_oom();
    return r;
}

static int setup_registry(struct vased *d) {
    int r = vase_registry_new(vase_plan_run_free, &d->reg);
    if (r < 0)
        return log_oom();
    d->pending_settings = calloc(vase_settings_count, sizeof(*d->pending_settings));
    if (!d->pending_settings)
        return log_oom();
    return 0;
}

/* The sequences the previous daemon kept on the arenas kept with them (restore.h). */
static int setup_restore(struct vased *d) {
    return vase_restore_seqs(d);
}

static int setup_incarnation(struct vased *d) {
    if (getrandom(&d->incarnation, sizeof(d->incarnation), 0) != sizeof(d->incarnation))
        return log_error_errno(-errno, "getrandom() failed: %m");
    if (d->incarnation == 0) /* 0 means "not known yet" on the wire. */
        d->incarnation = 1;
    return 0;
}

int vase_setup_start(struct vased *d) {
    int r;
    if ((r = setup_incarnation(d)) < 0 || (r = setup_signals(d)) < 0 ||
        (r = setup_runtime_dir(d)) < 0 || (r = setup_listen_fds(d)) < 0 ||
        (r = check_stale_sockets(d)) < 0 || (r = setup_access(d)) < 0 ||
        (r = setup_arenas(d)) < 0 || (r = setup_registry(d)) < 0 || (r = setup_restore(d)) < 0 ||
        (r = setup_sockets(d)) < 0 || (r = setup_metrics(d)) < 0 || (r = setup_evictor(d)) < 0 ||
        (r = setup_timer(d)) < 0)
        return r;
    return 0;
}

void vase_setup_teardown(struct vased *d) {
    /* Plans first: threads read the arena and write plan pages. */
    d->evictor = vase_evictor_free(d->evictor);
    vase_clients_close_pending(d);
    vase_admitq_clear(&d->admitq);
    /* Closing the sessions is what tells clients we are gone. */
    d->reg = vase_registry_free(d->reg);
    for (size_t i = 0; d->pending_settings && i < vase_settings_count; i++)
        free(d->pending_settings[i]);
    free(d->pending_settings);
    d->pending_settings = NULL;
    if (d->session_fd >= 0) {
        close(d->session_fd);
        d->session_fd = -1;
        if (!d->session_activated)
            unlink(d->session_path);
    }
    d->metrics_http = vase_metrics_http_free(d->metrics_http);
    d->events = vase_events_free(d->events);
    if (d->router) {
        zmq_close(d->router);
        d->router = NULL;
    }
    if (d->zap) {
        zmq_close(d->zap);
        d->zap = NULL;
    }
    if (d->zmq_ctx) {
        zmq_ctx_term(d->zmq_ctx);
        d->zmq_ctx = NULL;
        /* ZeroMQ removes its ipc files when it unbinds, but not always on every version. */
        if (d->control_path)
            unlink(d->control_path);
        if (d->events_path)
            unlink(d->events_path);
    }
    /* The arenas last: no session is left that could still map them. */
    for (uint32_t i = 0; i < d->n_arenas; i++) {
        d->allocs[i] = vase_alloc_free(d->allocs[i]);
        d->arenas[i] = vase_arena_free(d->arenas[i]);
        vase_allow_done(&d->arena_allow[i]);
    }
    d->n_arenas = 0;
    if (d->timer_fd >= 0)
        close(d->timer_fd);
    if (d->signal_fd >= 0)
        close(d->signal_fd);
    if (d->runtime_dir_fd >= 0)
        close(d->runtime_dir_fd);
    d->timer_fd = d->signal_fd = d->runtime_dir_fd = -1;
    vase_allow_done(&d->allow);
    vase_allow_done(&d->admins);
    free(d->runtime_dir);
    free(d->session_path);
    free(d->control_path);
    free(d->events_path);
    free(d->control_endpoint);
    free(d->events_endpoint);
    vase_restore_done(d);
    vase_config_done(&d->cfg);
}
