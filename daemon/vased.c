/* SPDX-License-Identifier: MIT */

/*
 * The daemon's life: start-up (setup.c), the main loop, shutdown. The main thread owns every
 * piece of state in struct vased and is the only thread that touches the registry, the
 * allocators and the sockets other than the evictor's; it sleeps in one zmq_poll() over the
 * control ROUTER, the evictor's results, the session listener and sessions, the pidfds of
 * draining clients (drain.h), a signalfd and a timerfd, and never computes a plan. The loop
 * only calls down: control.c, cycle.c, clients.c and the others take the state and never call
 * back into this file. It stops on SIGTERM, or by itself when a sticky CUDA error lost the GPU
 * context (exit status VASED_EXIT_DEVICE_LOST, so that systemd restarts vased).
 */

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "serve/access.h"
#include "control/admin.h"
#include "control/admission.h"
#include "core/alloc.h"
#include "serve/clients.h"
#include "control/control.h"
#include "control/cycle.h"
#include "serve/drain.h"
#include "serve/elastic.h"
#include "control/engine.h"
#include "plan/evictor.h"
#include "core/log.h"
#include "serve/metrics_http.h"
#include "serve/publish.h"
#include "serve/restore.h"
#include "vase_admin.h"
#include "setup.h"
#include "vased.h"
#include "core/zap.h"

static void update_status(struct vased *d, bool force) {
    char status[256];
    uint64_t free_bytes = 0, total = 0;
    for (uint32_t i = 0; i < d->n_arenas; i++) {
        free_bytes += vase_alloc_free_bytes(d->allocs[i]);
        total += d->allocs[i]->arena_bytes;
    }
    char draining[96] = "";
    if (d->reg->n_draining)
        snprintf(draining, sizeof(draining), ", %u draining (%llu MiB held)", d->reg->n_draining,
                 (unsigned long long)(vase_registry_draining_bytes(d->reg) >> 20));
    snprintf(status, sizeof(status), "%u clients, %u sequences, %llu MiB of %llu MiB free%s%s%s",
             d->reg->n_clients, d->reg->n_seqs, (unsigned long long)(free_bytes >> 20),
             (unsigned long long)(total >> 20), draining,
             d->metrics_unavailable[0] ? ", no metrics (default port taken)" : "",
             d->stopping ? ", stopping" : "");
    if (!force && strcmp(status, d->last_status) == 0)
        return;
    memcpy(d->last_status, status, sizeof(status));
    sd_notifyf(0, "STATUS=%s", status);
}

/* ---- settings ---- */

static void reload(struct vased *d) {
    struct vase_config nc;
    int r = vase_config_load(&nc, d->cmdline);
    if (r < 0) {
        log_error("Reload failed; keeping the running configuration.");
        vase_config_done(&nc);
        return;
    }
    if (!vase_config_arenas_equal(&d->cfg, &nc))
        log_warning("The [arena NAME] sections changed in the configuration; restart vased to "
                    "apply them.");
    /* Settings that cannot change while running only warn; the others follow the files where
     * the files changed them and keep what ConfigSet made of them where not. */
    for (size_t i = 0; i < vase_settings_count; i++) {
        const struct vase_setting *s = &vase_settings[i];
        if (s->runtime) {
            r = vase_config_reload_setting(&d->cfg, &nc, s);
            if (r < 0)
                log_error_errno(r, "Cannot reload %s: %m", s->name);
            else if (r > 0)
                vase_admin_apply_setting(d, s->name);
            continue;
        }
        char old[PATH_MAX + 1], now[PATH_MAX + 1];
        vase_config_format(&d->cfg, s, old, sizeof(old));
        vase_config_format(&nc, s, now, sizeof(now));
        bool changed = strcmp(old, now) != 0;
        if (changed)
            log_warning("%s changed to \"%s\" in the configuration; restart vased to apply it.",
                        s->name, now);
        /* What vasectl config get shows as pending (a failed copy shows none). */
        if (d->pending_settings) {
            free(d->pending_settings[i]);
            d->pending_settings[i] = changed ? strdup(now) : NULL;
        }
    }
    log_info("Configuration reloaded.");
    vase_config_done(&nc);
}

/* ---- signals and timer ---- */

static void begin_shutdown(struct vased *d) {
    if (d->stopping) {
        log_notice("Second termination signal: stopping now.");
        d->quit = true;
        return;
    }
    log_info("Shutting down: %u plans in flight.", d->evictions_in_flight);
    sd_notify(0, "STOPPING=1");
    d->stopping = true;
    d->stop_deadline = vased_now() + d->cfg.shutdown_timeout;
    /* Stop accepting: close the listener and remove its name, unless systemd made it: then its
     * copy keeps queueing engines for the next start. */
    if (d->session_fd >= 0) {
        close(d->session_fd);
        d->session_fd = -1;
        if (!d->session_activated)
            unlink(d->session_path);
    }
    if (d->evictions_in_flight == 0)
        d->quit = true;
}

/* Who asked for a reload: the kernel's sender uid and pid, and the command where vasectl reload
 * sent it (vase_admin.h). systemd does not tell a unit who ran `systemctl reload`; its
 * ExecReload= runs as the unit's user. */
static void log_sighup(const struct signalfd_siginfo *si) {
    uint32_t v = (uint32_t)si->ssi_int;
    bool marked =
        si->ssi_code == SI_QUEUE && (v & ~(uint32_t)VASE_RELOAD_FROM_UNIT) == VASE_RELOAD_SIGVAL;
    if (marked && (v & VASE_RELOAD_FROM_UNIT))
        log_notice(
            "SIGHUP from systemctl reload (the unit's ExecReload=, vasectl reload as uid %u, "
            "pid %d): reloading the configuration.",
            (unsigned)si->ssi_uid, (int)si->ssi_pid);
    else if (marked)
        log_notice("SIGHUP from vasectl reload by uid %u (pid %d): reloading the configuration.",
                   (unsigned)si->ssi_uid, (int)si->ssi_pid);
    else
        log_notice("SIGHUP from uid %u (pid %d): reloading the configuration.",
                   (unsigned)si->ssi_uid, (int)si->ssi_pid);
}

static void on_signal(struct vased *d) {
    struct signalfd_siginfo si;
    while (read(d->signal_fd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
        switch (si.ssi_signo) {
        case SIGTERM:
        case SIGINT:
            begin_shutdown(d);
            break;
        case SIGHUP:
            log_sighup(&si);
            reload(d);
            break;
        default:
            break;
        }
    }
}

static void on_timer(struct vased *d) {
    uint64_t ticks;
    double now = vased_now();
    if (read(d->timer_fd, &ticks, sizeof(ticks)) < 0 && errno != EAGAIN)
        log_debug_errno(-errno, "timerfd read: %m");

    vase_clients_expire_pending(d, now);
    vase_clients_flush_logs(d, now);
    vase_restore_tick(d, now);
    vase_drain_tick(d, now); /* parked opens expire after every round of the main loop */
    if (d->watchdog_usec && now - d->last_watchdog >= (double)d->watchdog_usec / 2e6) {
        sd_notify(0, "WATCHDOG=1");
        d->last_watchdog = now;
    }
    if (d->cfg.stats_interval && now - d->last_stats >= d->cfg.stats_interval) {
        d->last_stats = now;
        update_status(d, true);
        vase_publish_pressure(d, true);
    } else {
        update_status(d, false);
    }
    if (d->stopping && (d->evictions_in_flight == 0 || now >= d->stop_deadline)) {
        if (d->evictions_in_flight)
            log_warning("shutdown_timeout passed with %u plans in flight; stopping anyway.",
                        d->evictions_in_flight);
        d->quit = true;
    }
}

static void on_evictor(struct vased *d) {
    for (;;) {
        struct vase_plan_run *run;
        int r = vase_evictor_receive(d->evictor, &run);
        if (r < 0)
            break;
        if (r > 0)
            vase_cycle_plan_done(d, run);
    }
    if (d->stopping && d->evictions_in_flight == 0)
        d->quit = true;
}

/*
 * libzmq asks whether a peer may subscribe to the events: they name every client and sequence
 * of every arena, so only a peer that may use every arena gets them (admins always).
 */
static void on_zap(struct vased *d) {
    uint32_t all = d->n_arenas >= 32 ? UINT32_MAX : (1u << d->n_arenas) - 1;
    for (int i = 0; i < 64; i++) {
        struct vase_zap_request req;
        if (vase_zap_recv(d->zap, &req) < 0)
            return;
        struct ucred cred;
        struct vased_peer peer = {0};
        bool allow = req.well_formed && strcmp(req.domain, VASE_ZAP_DOMAIN_EVENTS) == 0 &&
                     vase_control_peer_cred(req.address, &cred) == 0 &&
                     vase_access_lookup(d, &cred, &peer) == 0 &&
                     (peer.admin || (peer.allowed && (peer.arenas & all) == all));
        vase_zap_reply(d->zap, &req, allow);
        if (!allow) {
            unsigned suppressed;
            bool pass = vase_ratelimit_pass(&d->refuse_log, vased_now(), &suppressed);
            if (suppressed)
                log_notice("%u more connections were refused in %.0f s without a log line "
                           "each.",
                           suppressed, d->refuse_log.interval);
            if (pass)
                log_notice("Events subscription refused to %s: it needs every arena.", req.address);
        }
    }
}

/* ---- main loop ---- */

/* What one zmq_poll() watches: the fixed items, the session listener while it is open, pending
 * sessions and clients' sessions. Handlers may change those lists, so pending sessions are found
 * again by fd and clients by pointer and fd, never by index. */
struct poll_set {
    zmq_pollitem_t *items;
    struct vased_client **owners; /* of items[clients0..n) */
    size_t cap, n;
    size_t listener; /* SIZE_MAX: no listener */
    size_t pending0, n_pending, clients0;
    size_t drain0; /* items[drain0..n): pidfds of draining clients awaiting their exit */
};

enum { ITEM_ROUTER, ITEM_EVICTOR, ITEM_SIGNAL, ITEM_TIMER, ITEM_ZAP, ITEM_METRICS, ITEM_FIXED };
/* How soon the loop tries again to grow a poll set it could not grow. */
#define POLL_RETRY_MS 100

static int poll_set_reserve(struct poll_set *ps, size_t need) {
    if (need <= ps->cap)
        return 0;
    size_t ncap = need * 2;
    zmq_pollitem_t *ni = realloc(ps->items, ncap * sizeof(*ni));
    if (!ni)
        return log_oom();
    ps->items = ni;
    struct vased_client **no = realloc(ps->owners, ncap * sizeof(*no));
    if (!no)
        return log_oom();
    ps->owners = no;
    ps->cap = ncap;
    return 0;
}

/*
 * Fills the set with as many items as it has room for, the fixed ones first: the daemon must
 * keep answering control requests and signals when it cannot grow the set. Returns 0 when
 * every item is in, 1 when some sessions were left out (the caller polls again soon, when the
 * set may grow).
 */
static int poll_set_fill(struct vased *d, struct poll_set *ps) {
    size_t need = ITEM_FIXED + 1 + d->n_pending + d->reg->n_clients + d->reg->n_draining;
    bool short_of_room = poll_set_reserve(ps, need) < 0;
    size_t cap = ps->cap;
    zmq_pollitem_t *items = ps->items;
    size_t n = 0;
    if (cap < ITEM_FIXED) {
        ps->n = 0;
        ps->listener = SIZE_MAX;
        ps->pending0 = ps->clients0 = ps->drain0 = 0;
        ps->n_pending = 0;
        return 1;
    }
    items[n++] = (zmq_pollitem_t){.socket = d->router, .events = ZMQ_POLLIN};
    items[n++] = (zmq_pollitem_t){.socket = vase_evictor_socket(d->evictor), .events = ZMQ_POLLIN};
    items[n++] = (zmq_pollitem_t){.fd = d->signal_fd, .events = ZMQ_POLLIN};
    items[n++] = (zmq_pollitem_t){.fd = d->timer_fd, .events = ZMQ_POLLIN};
    items[n++] = (zmq_pollitem_t){.socket = d->zap, .events = ZMQ_POLLIN};
    /* The metrics endpoint's epoll fd; with metrics off, an item that watches nothing. */
    if (d->metrics_http)
        items[n++] =
            (zmq_pollitem_t){.fd = vase_metrics_http_fd(d->metrics_http), .events = ZMQ_POLLIN};
    else
        items[n++] = (zmq_pollitem_t){.fd = d->signal_fd, .events = 0};
    ps->listener = SIZE_MAX;
    if (d->session_fd >= 0 && n < cap) {
        ps->listener = n;
        items[n++] = (zmq_pollitem_t){.fd = d->session_fd, .events = ZMQ_POLLIN};
    }
    ps->pending0 = n;
    for (size_t i = 0; i < d->n_pending && n < cap; i++)
        items[n++] = (zmq_pollitem_t){.fd = d->pending[i].fd, .events = ZMQ_POLLIN};
    ps->n_pending = n - ps->pending0;
    ps->clients0 = n;
    for (struct vased_client *c = d->reg->clients; c && n < cap; c = c->next) {
        ps->owners[n - ps->clients0] = c;
        items[n++] = (zmq_pollitem_t){.fd = c->fd, .events = ZMQ_POLLIN};
    }
    ps->drain0 = n;
    for (struct vased_client *c = d->reg->draining; c && n < cap; c = c->next)
        if (c->pidfd >= 0 && c->release_at == 0) {
            ps->owners[n - ps->clients0] = c;
            items[n++] = (zmq_pollitem_t){.fd = c->pidfd, .events = ZMQ_POLLIN};
        }
    ps->n = n;
    return short_of_room ? 1 : 0;
}

/* Pending sessions, clients' sessions, exits of draining clients, then new connections. */
static void poll_set_sessions(struct vased *d, const struct poll_set *ps) {
    for (size_t i = ps->pending0; i < ps->pending0 + ps->n_pending; i++)
        if (ps->items[i].revents)
            vase_clients_on_pending(d, ps->items[i].fd);
    for (size_t i = ps->drain0; i < ps->n; i++)
        if (ps->items[i].revents)
            vase_drain_on_exit(d, ps->owners[i - ps->clients0], ps->items[i].fd, vased_now());
    for (size_t i = ps->clients0; i < ps->drain0; i++)
        if (ps->items[i].revents)
            vase_clients_on_session(d, ps->owners[i - ps->clients0], ps->items[i].fd,
                                    ps->items[i].revents);
    if (ps->listener != SIZE_MAX && d->session_fd >= 0 && ps->items[ps->listener].revents)
        vase_clients_accept(d);
}

/* The poll timeout shortened to wake up when the first parked open's wait passes. */
static long admit_timeout(const struct vased *d, long timeout_ms) {
    double first = vase_admitq_next_deadline(&d->admitq);
    if (first == 0)
        return timeout_ms;
    double left = (first - vased_now()) * 1000.0;
    long ms = left <= 0 ? 0 : (long)left + 1;
    return timeout_ms < 0 || ms < timeout_ms ? ms : timeout_ms;
}

static int main_loop(struct vased *d) {
    struct poll_set ps = {.items = NULL};
    int r = 0;

    while (!d->quit) {
        /* Out of memory for the whole set: poll what fits, and try again shortly. */
        long timeout_ms = poll_set_fill(d, &ps) > 0 ? POLL_RETRY_MS : -1;
        timeout_ms = admit_timeout(d, timeout_ms);
        if (d->metrics_http)
            timeout_ms = vase_metrics_http_timeout(d->metrics_http, timeout_ms);
        if (zmq_poll(ps.items, (int)ps.n, timeout_ms) < 0) {
            if (zmq_errno() == EINTR)
                continue;
            r = log_error_errno(-zmq_errno(), "zmq_poll() failed: %m");
            break;
        }
        if (ps.n == 0)
            continue;
        if (ps.items[ITEM_SIGNAL].revents)
            on_signal(d);
        if (ps.items[ITEM_TIMER].revents)
            on_timer(d);
        if (ps.items[ITEM_EVICTOR].revents)
            on_evictor(d);
        if (ps.items[ITEM_ZAP].revents)
            on_zap(d);
        if (ps.items[ITEM_ROUTER].revents)
            vase_control_process(d);
        if (d->metrics_http)
            vase_metrics_http_run(d->metrics_http, ps.items[ITEM_METRICS].revents != 0);
        poll_set_sessions(d, &ps);
        /* Whatever this round released (closes, dead clients, reaped plans, drains) may admit
         * parked opens; and a wait that passed is answered now, not at the next tick. */
        if (d->admitq.n) {
            vase_admission_expire(d, vased_now());
            vase_admission_retry(d);
        }
        /* Then the budgets: lowered for the opens still waiting, back up when none waits. */
        vase_elastic_rebalance(d);
    }
    free(ps.items);
    free(ps.owners);
    return r < 0 ? r : d->exit_error;
}

int vased_exit_status(int r) {
    /* EX_SOFTWARE: a failure the daemon cannot recover from in this process; systemd's
     * Restart=on-failure restarts it, as it does for any non-zero status. */
    if (r == -ENOTRECOVERABLE)
        return VASED_EXIT_DEVICE_LOST;
    return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}

int vased_run(struct vase_config *cfg, const struct vase_cmdline *cmdline) {
    struct vased *d = calloc(1, sizeof(*d));
    int r;

    if (!d)
        return log_oom();
    /* The daemon takes the configuration over; the caller's copy is left empty. */
    d->cfg = *cfg;
    *cfg = (struct vase_config){0};
    d->cmdline = cmdline;
    d->session_fd = d->signal_fd = d->timer_fd = d->runtime_dir_fd = -1;
    d->self_uid = geteuid();
    d->refuse_log = (struct vase_ratelimit){.interval = VASED_REFUSE_LOG_INTERVAL,
                                            .burst = VASED_REFUSE_LOG_BURST};
    d->churn_log = (struct vase_ratelimit){.interval = VASED_CHURN_LOG_INTERVAL,
                                           .burst = VASED_CHURN_LOG_BURST};
    d->started_at = vased_now();
    vase_log_set_max_level(d->cfg.log_level);

    r = vase_setup_start(d);
    if (r < 0)
        goto finish;

    log_info("vased %s ready in %s (incarnation %016llx).", VASED_VERSION, d->runtime_dir,
             (unsigned long long)d->incarnation);
    update_status(d, true);
    sd_notify(0, "READY=1");
    d->last_watchdog = d->last_stats = vased_now();
    vase_publish_pressure(d, true);

    r = main_loop(d);
    if (!d->stopping)
        sd_notify(0, "STOPPING=1");
    else if (r == 0)
        vase_restore_save(d); /* a clean stop: the sequences survive it with their arenas */
    if (r == -ENOTRECOVERABLE)
        log_error("vased stopped: its CUDA context is lost (%llu requests, %llu evictions); exit "
                  "status %d.",
                  (unsigned long long)d->requests_total, (unsigned long long)d->evictions_total,
                  VASED_EXIT_DEVICE_LOST);
    else
        log_info("vased stopped (%llu requests, %llu evictions).",
                 (unsigned long long)d->requests_total, (unsigned long long)d->evictions_total);
finish:
    vase_setup_teardown(d);
    free(d);
    return r;
}
