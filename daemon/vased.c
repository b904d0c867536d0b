/* SPDX-License-Identifier: MIT */

/*
 * The daemon's life: staged start-up, the main loop, shutdown. The main thread owns every
 * piece of state in struct vased and is the only thread that touches the registry, the
 * allocators and the sockets other than the evictor's; it sleeps in one zmq_poll() over the
 * control ROUTER, the evictor's results, the session listener and sessions, a signalfd and a
 * timerfd, and never computes a plan. Start-up stages undo themselves on failure, and the
 * teardown releases in reverse order, arenas last: nothing frees memory a client may still
 * map while its session is open.
 */

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "arena.h"
#include "control.h"
#include "events.h"
#include "evictor.h"
#include "log.h"
#include "vased.h"
#include "wire.h"
#include "zap.h"

double vased_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- events ---- */

void vased_publish_seq(struct vased *d, const struct vase_seq *s, bool open) {
    Vase__SeqInfo info;
    Vase__Event e = VASE__EVENT__INIT;
    vase_control_seq_info(s, &info);
    e.body_case = open ? VASE__EVENT__BODY_SEQ_OPEN : VASE__EVENT__BODY_SEQ_CLOSE;
    if (open)
        e.seq_open = &info;
    else
        e.seq_close = &info;
    vase_events_publish(d->events, "seq", &e);
}

static void publish_client(struct vased *d, const struct vase_client *c, bool join) {
    Vase__ClientInfo info;
    Vase__Event e = VASE__EVENT__INIT;
    vase_control_client_info(d, c, &info);
    e.body_case = join ? VASE__EVENT__BODY_CLIENT_JOIN : VASE__EVENT__BODY_CLIENT_LEAVE;
    if (join)
        e.client_join = &info;
    else
        e.client_leave = &info;
    vase_events_publish(d->events, "client", &e);
}

void vased_check_pressure(struct vased *d, bool force) {
    for (uint32_t i = 0; i < d->n_arenas; i++) {
        const struct vase_alloc *a = d->allocs[i];
        bool low = (uint64_t)a->n_free * 10 < a->num_pages;
        if (!force && low == d->pressure_low[i])
            continue;
        if (low != d->pressure_low[i])
            log_full_errno(low ? LOG_WARNING : LOG_INFO, 0,
                           "Arena %u: %u of %u pages free (%s 10%%).", i, a->n_free,
                           a->num_pages, low ? "below" : "back above");
        d->pressure_low[i] = low;

        Vase__ArenaStatus as = VASE__ARENA_STATUS__INIT;
        Vase__Event e = VASE__EVENT__INIT;
        as.id = d->arenas[i]->id;
        as.name = (char *)d->arena_names[i];
        as.kind = d->arenas[i]->kind;
        as.page_bytes = d->arenas[i]->page_bytes;
        as.pages_total = a->num_pages;
        as.pages_free = a->n_free;
        e.body_case = VASE__EVENT__BODY_PRESSURE;
        e.pressure = &as;
        vase_events_publish(d->events, "pressure", &e);
    }
}

static void update_status(struct vased *d, bool force) {
    char status[256];
    uint64_t free_pages = 0, total = 0;
    for (uint32_t i = 0; i < d->n_arenas; i++) {
        free_pages += d->allocs[i]->n_free;
        total += d->allocs[i]->num_pages;
    }
    snprintf(status, sizeof(status), "%u clients, %u sequences, %llu/%llu pages free%s",
             d->reg->n_clients, d->reg->n_seqs, (unsigned long long)free_pages,
             (unsigned long long)total, d->stopping ? ", stopping" : "");
    if (!force && strcmp(status, d->last_status) == 0)
        return;
    memcpy(d->last_status, status, sizeof(status));
    sd_notifyf(0, "STATUS=%s", status);
}

/* ---- settings ---- */

int vased_apply_setting(struct vased *d, const char *key) {
    const struct vase_setting *s = vase_setting_find(key);
    if (!s)
        return -ENOENT;
    if (strcmp(s->name, "log_level") == 0) {
        vase_log_set_max_level(d->cfg.log_level);
    } else if (strcmp(s->name, "allow_users") == 0 || strcmp(s->name, "allow_groups") == 0) {
        /* Sessions already open stay open; the new lists decide from the next connection. */
        struct vase_allow a;
        int r = vase_allow_parse(d->cfg.allow_users, d->cfg.allow_groups, &a);
        if (r < 0)
            return log_error_errno(r, "Cannot apply the new allow-list, keeping the old: %m");
        vase_allow_done(&d->allow);
        d->allow = a;
    }
    /* Everything else is read where it is used. */
    return 0;
}

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
    for (size_t i = 0; i < vase_settings_count; i++) {
        const struct vase_setting *s = &vase_settings[i];
        char old[PATH_MAX + 1], now[PATH_MAX + 1];
        vase_config_format(&d->cfg, s, old, sizeof(old));
        vase_config_format(&nc, s, now, sizeof(now));
        if (strcmp(old, now) == 0)
            continue;
        if (!s->runtime) {
            log_warning("%s changed to \"%s\" in the configuration; restart vased to apply it.",
                        s->name, now);
            continue;
        }
        r = vase_config_set(&d->cfg, s->name, now, 0);
        if (r < 0) {
            log_error_errno(r, "Cannot set %s to \"%s\": %m", s->name, now);
            continue;
        }
        vased_apply_setting(d, s->name);
        log_info("Reload: %s = %s (was %s).", s->name, now, old);
    }
    vase_config_done(&nc);
}

/* ---- sessions ---- */

static void drop_pending(struct vased *d, size_t i) {
    close(d->pending[i].fd);
    d->pending[i] = d->pending[--d->n_pending];
}

static void refuse(struct vased *d, int fd, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void refuse(struct vased *d, int fd, int code, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    unsigned suppressed;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    /* Anyone who can reach the socket can make us refuse: a flood of refusals is summarised. */
    bool pass = vase_ratelimit_pass(&d->refuse_log, vased_now(), &suppressed);
    if (suppressed)
        log_notice("%u more sessions were refused in %.0f s without a log line each.", suppressed,
                   d->refuse_log.interval);
    if (pass)
        log_notice("Session refused: %s", msg);
    vase_session_send_error(fd, d->incarnation, code, msg);
}

bool vased_client_log_ok(struct vase_client *c) {
    unsigned suppressed;
    bool pass = vase_ratelimit_pass(&c->log_limit, vased_now(), &suppressed);
    if (suppressed)
        log_notice("Client %u: %u more messages about it were suppressed in %.0f s.", c->id,
                   suppressed, c->log_limit.interval);
    return pass;
}

static int send_welcome(struct vased *d, struct vase_client *c) {
    Vase__ArenaInfo info[VASED_MAX_ARENAS], *ptrs[VASED_MAX_ARENAS];
    int fds[VASED_MAX_ARENAS];
    size_t n_fds = 0;

    size_t n = 0;
    /* Only the arenas this client may use: an arena is a trust domain (whoever maps it can
     * read and write all of it), so the others are neither described nor sent. */
    for (uint32_t i = 0; i < d->n_arenas; i++) {
        const struct vase_arena *a = d->arenas[i];
        if (!(c->arenas & (1u << i)))
            continue;
        vase__arena_info__init(&info[n]);
        info[n].id = a->id;
        info[n].name = (char *)d->arena_names[i];
        info[n].kind = a->kind;
        info[n].page_bytes = a->page_bytes;
        info[n].num_pages = a->num_pages;
        info[n].size_bytes = a->size;
        info[n].share = (char *)a->ops->share;
        if (a->ipc_handle_len) {
            info[n].ipc_handle.data = (uint8_t *)a->ipc_handle;
            info[n].ipc_handle.len = a->ipc_handle_len;
        }
        info[n].device_uuid = (char *)a->device_uuid;
        ptrs[n] = &info[n];
        n++;
        int fd;
        if (a->ops->export_fd && a->ops->export_fd(a, &fd) == 0)
            fds[n_fds++] = fd;
    }
    Vase__SessionWelcome w = VASE__SESSION_WELCOME__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    w.client_id = c->id;
    w.token.data = c->token;
    w.token.len = sizeof(c->token);
    w.n_arenas = n;
    w.arenas = ptrs;
    w.control_endpoint = d->control_endpoint;
    w.events_endpoint = d->events_endpoint;
    w.max_message_bytes = (uint32_t)d->cfg.max_message_bytes;
    e.version = VASE_WIRE_VERSION;
    e.incarnation = d->incarnation;
    e.body_case = VASE__ENVELOPE__BODY_WELCOME;
    e.welcome = &w;
    return vase_session_send(c->fd, &e, fds, n_fds);
}

/* A pending session said something: the hello, or anything else (refused). */
static void on_pending(struct vased *d, size_t i) {
    struct vased_pending pend = d->pending[i];
    Vase__Envelope *e = NULL;
    int r = vase_session_recv(pend.fd, &e);

    if (r == -EAGAIN)
        return;
    if (r == -VASE_WIRE_EPROTOVERSION)
        refuse(d, pend.fd, VASE_WIRE_EPROTOVERSION,
               "protocol version %u is not supported (this daemon speaks %d)", e->version,
               VASE_WIRE_VERSION);
    else if (r == -EINVAL || (r == 0 && e->body_case != VASE__ENVELOPE__BODY_HELLO))
        refuse(d, pend.fd, EINVAL, "the first packet of a session must be a SessionHello");
    else if (r == -EBADMSG || r == -EMSGSIZE)
        refuse(d, pend.fd, -r, "the session packet is not a vase.Envelope");
    if (r < 0 || e->body_case != VASE__ENVELOPE__BODY_HELLO) {
        if (r < 0 && r != -ECONNRESET)
            log_debug_errno(r, "Session of pid %d dropped before its hello: %m",
                            (int)pend.cred.pid);
        vase__envelope__free_unpacked(e, NULL);
        drop_pending(d, i);
        return;
    }

    /* The allow-list was checked when the connection was accepted. */
    if (d->reg->n_clients >= d->cfg.max_clients) {
        refuse(d, pend.fd, EUSERS, "max_clients (%u) sessions are open", d->cfg.max_clients);
        r = -EUSERS;
    } else if (d->stopping) {
        refuse(d, pend.fd, ESHUTDOWN, "the daemon is shutting down");
        r = -ESHUTDOWN;
    }
    if (r < 0) {
        vase__envelope__free_unpacked(e, NULL);
        drop_pending(d, i);
        return;
    }

    struct vase_client *c;
    r = vase_registry_add_client(d->reg, pend.fd, &c);
    if (r < 0) {
        refuse(d, pend.fd, -r, "cannot register the client: %s", strerror(-r));
        vase__envelope__free_unpacked(e, NULL);
        drop_pending(d, i);
        return;
    }
    /* The registry owns the fd now. */
    d->pending[i] = d->pending[--d->n_pending];
    const char *name = e->hello->name ? e->hello->name : "";
    c->name = strndup(name, VASE_MAX_NAME);
    c->pid = (uint32_t)pend.cred.pid;
    c->uid = pend.cred.uid;
    c->gid = pend.cred.gid;
    c->arenas = pend.peer.arenas;
    c->connected_at = vased_now();
    vase__envelope__free_unpacked(e, NULL);

    r = send_welcome(d, c);
    if (r < 0 || !c->name) {
        log_warning_errno(r, "Cannot welcome pid %u: %m", c->pid);
        vase_registry_remove_client(d->reg, c);
        return;
    }
    log_info("Client %u \"%s\" (pid %u, uid %u) connected.", c->id, c->name, c->pid,
             (unsigned)c->uid);
    publish_client(d, c, true);
}

void vased_drop_client(struct vased *d, struct vase_client *c) {
    uint32_t pages = c->pages, waiting = 0;
    publish_client(d, c, false);
    while (c->seqs) {
        struct vase_seq *s = c->seqs;
        vased_publish_seq(d, s, false);
        if (vase_registry_close_seq(d->reg, d->allocs[s->arena_id], s) > 0)
            waiting++;
    }
    if (c->log_limit.suppressed)
        log_notice("Client %u: %u more messages about it were suppressed.", c->id,
                   c->log_limit.suppressed);
    log_info("Client %u \"%s\" (pid %u) disconnected; %u pages released%s.", c->id,
             c->name ? c->name : "", c->pid, pages,
             waiting ? " (those of sequences with a plan in flight when it finishes)" : "");
    vase_registry_remove_client(d->reg, c);
    vased_check_pressure(d, false);
}

static void on_client_fd(struct vased *d, struct vase_client *c, short revents) {
    char buf[256];
    ssize_t n = 0;

    if (revents & ZMQ_POLLIN)
        n = recv(c->fd, buf, sizeof(buf), MSG_DONTWAIT | MSG_TRUNC);
    if ((revents & ZMQ_POLLIN) && n > 0) {
        /* The session is silent after the welcome; a packet is ignored, not fatal. */
        if (vased_client_log_ok(c))
            log_warning("Client %u sent %zd bytes on its session socket; ignored.", c->id, n);
        return;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    vased_drop_client(d, c);
}

int vased_peer_lookup(const struct vased *d, const struct ucred *cred, struct vased_peer *ret) {
    gid_t *groups = NULL;
    size_t n = 0;
    int r = vase_session_peer_groups(cred->uid, cred->gid, &groups, &n);
    if (r < 0)
        return r;
    struct vased_peer p = {.uid = cred->uid};
    p.allowed = vase_allow_check(&d->allow, d->self_uid, cred->uid, cred->gid, groups, n) == 0;
    p.admin = vase_allow_check(&d->admins, d->self_uid, cred->uid, cred->gid, groups, n) == 0;
    for (uint32_t i = 0; p.allowed && i < d->n_arenas; i++)
        if (d->arena_open[i] || vase_allow_check(&d->arena_allow[i], d->self_uid, cred->uid,
                                                 cred->gid, groups, n) == 0)
            p.arenas |= 1u << i;
    free(groups);
    *ret = p;
    return 0;
}

/*
 * A new connection: the allow-list decides at once, before the peer holds anything, so a uid
 * that may not open a session cannot occupy the slots of those who may; an admitted uid holds
 * at most VASED_MAX_PENDING_PER_UID slots while it says nothing. A client sends its hello
 * right after connecting, so it is usually read here and needs no slot for long.
 */
static void admit(struct vased *d, int fd, const struct ucred *cred) {
    struct vased_peer peer;
    if (vased_peer_lookup(d, cred, &peer) < 0) {
        refuse(d, fd, ENOMEM, "out of memory");
        close(fd);
        return;
    }
    if (!peer.allowed || !peer.arenas) {
        refuse(d, fd, EPERM, "uid %u (gid %u, pid %d) is not allowed %s", (unsigned)cred->uid,
               (unsigned)cred->gid, (int)cred->pid,
               !peer.allowed ? "by allow_users/allow_groups" : "to use any arena");
        close(fd);
        return;
    }
    size_t same_uid = 0;
    for (size_t i = 0; i < d->n_pending; i++)
        same_uid += d->pending[i].cred.uid == cred->uid;
    if (same_uid >= VASED_MAX_PENDING_PER_UID || d->n_pending >= VASED_MAX_PENDING) {
        refuse(d, fd, EAGAIN, "too many sessions %sare connecting at once; try again",
               same_uid >= VASED_MAX_PENDING_PER_UID ? "of this uid " : "");
        close(fd);
        return;
    }
    d->pending[d->n_pending++] = (struct vased_pending){
        .fd = fd, .cred = *cred, .peer = peer, .deadline = vased_now() + VASED_HELLO_TIMEOUT};
    on_pending(d, d->n_pending - 1);
}

static void on_listener(struct vased *d) {
    for (int i = 0; i < 64; i++) {
        int fd;
        struct ucred cred;
        int r = vase_session_accept(d->session_fd, &fd, &cred);
        if (r == -EAGAIN || r == -EINTR)
            return;
        if (r < 0) {
            log_warning_errno(r, "accept() on the session socket failed: %m");
            return;
        }
        admit(d, fd, &cred);
    }
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
    /* Stop accepting: close the listener and remove its name. */
    if (d->session_fd >= 0) {
        close(d->session_fd);
        d->session_fd = -1;
        unlink(d->session_path);
    }
    if (d->evictions_in_flight == 0)
        d->quit = true;
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
            log_info("SIGHUP: reloading the configuration.");
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

    for (size_t i = 0; i < d->n_pending;) {
        if (now >= d->pending[i].deadline) {
            log_notice("Session of pid %d sent no hello in %.0f s; closed.",
                       (int)d->pending[i].cred.pid, VASED_HELLO_TIMEOUT);
            drop_pending(d, i);
        } else {
            i++;
        }
    }
    if (d->watchdog_usec && now - d->last_watchdog >= (double)d->watchdog_usec / 2e6) {
        sd_notify(0, "WATCHDOG=1");
        d->last_watchdog = now;
    }
    if (d->cfg.stats_interval && now - d->last_stats >= d->cfg.stats_interval) {
        d->last_stats = now;
        update_status(d, true);
        vased_check_pressure(d, true);
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
            vase_control_plan_done(d, run);
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
                     vased_peer_lookup(d, &cred, &peer) == 0 &&
                     (peer.admin || (peer.allowed && (peer.arenas & all) == all));
        vase_zap_reply(d->zap, &req, allow);
        if (!allow) {
            unsigned suppressed;
            bool pass = vase_ratelimit_pass(&d->refuse_log, vased_now(), &suppressed);
            if (suppressed)
                log_notice("%u more connections were refused in %.0f s without a log line "
                           "each.", suppressed, d->refuse_log.interval);
            if (pass)
                log_notice("Events subscription refused to %s: it needs every arena.",
                           req.address);
        }
    }
}

/* ---- main loop ---- */

enum { ITEM_ROUTER, ITEM_EVICTOR, ITEM_SIGNAL, ITEM_TIMER, ITEM_ZAP, ITEM_FIXED };

static int main_loop(struct vased *d) {
    zmq_pollitem_t *items = NULL;
    struct vase_client **owners = NULL;
    size_t cap = 0;
    int r = 0;

    while (!d->quit) {
        size_t need = ITEM_FIXED + 1 + d->n_pending + d->reg->n_clients;
        if (need > cap) {
            size_t ncap = need * 2;
            zmq_pollitem_t *ni = realloc(items, ncap * sizeof(*ni));
            if (!ni) {
                r = log_oom();
                break;
            }
            items = ni;
            struct vase_client **no = realloc(owners, ncap * sizeof(*no));
            if (!no) {
                r = log_oom();
                break;
            }
            owners = no;
            cap = ncap;
        }
        size_t n = 0;
        items[n++] = (zmq_pollitem_t){.socket = d->router, .events = ZMQ_POLLIN};
        items[n++] =
            (zmq_pollitem_t){.socket = vase_evictor_socket(d->evictor), .events = ZMQ_POLLIN};
        items[n++] = (zmq_pollitem_t){.fd = d->signal_fd, .events = ZMQ_POLLIN};
        items[n++] = (zmq_pollitem_t){.fd = d->timer_fd, .events = ZMQ_POLLIN};
        items[n++] = (zmq_pollitem_t){.socket = d->zap, .events = ZMQ_POLLIN};
        size_t listener = SIZE_MAX, pending0 = n;
        if (d->session_fd >= 0) {
            listener = n;
            items[n++] = (zmq_pollitem_t){.fd = d->session_fd, .events = ZMQ_POLLIN};
            pending0 = n;
        }
        size_t n_pending = d->n_pending;
        int pending_fds[VASED_MAX_PENDING];
        for (size_t i = 0; i < n_pending; i++) {
            pending_fds[i] = d->pending[i].fd;
            items[n++] = (zmq_pollitem_t){.fd = d->pending[i].fd, .events = ZMQ_POLLIN};
        }
        size_t clients0 = n;
        for (struct vase_client *c = d->reg->clients; c; c = c->next) {
            owners[n - clients0] = c;
            items[n++] = (zmq_pollitem_t){.fd = c->fd, .events = ZMQ_POLLIN};
        }

        if (zmq_poll(items, (int)n, -1) < 0) {
            if (zmq_errno() == EINTR)
                continue;
            r = log_error_errno(-zmq_errno(), "zmq_poll() failed: %m");
            break;
        }
        if (items[ITEM_SIGNAL].revents)
            on_signal(d);
        if (items[ITEM_TIMER].revents)
            on_timer(d);
        if (items[ITEM_EVICTOR].revents)
            on_evictor(d);
        if (items[ITEM_ZAP].revents)
            on_zap(d);
        if (items[ITEM_ROUTER].revents)
            vase_control_process(d);
        /* Pending sessions and clients by fd: the handlers above may have changed the lists,
         * so find each again rather than trust an index. */
        for (size_t i = 0; i < n_pending; i++) {
            if (!items[pending0 + i].revents)
                continue;
            for (size_t j = 0; j < d->n_pending; j++)
                if (d->pending[j].fd == pending_fds[i]) {
                    on_pending(d, j);
                    break;
                }
        }
        for (size_t i = clients0; i < n; i++) {
            if (!items[i].revents)
                continue;
            struct vase_client *c = owners[i - clients0];
            /* Still registered? (A client is only removed by its own session event.) */
            for (struct vase_client *o = d->reg->clients; o; o = o->next)
                if (o == c && o->fd == items[i].fd) {
                    on_client_fd(d, c, items[i].revents);
                    break;
                }
        }
        if (listener != SIZE_MAX && d->session_fd >= 0 && items[listener].revents)
            on_listener(d);
    }
    free(items);
    free(owners);
    return r;
}

/* ---- start-up stages ---- */

/*
 * The main thread's id, for forward_signal(). Libraries may start threads before main() runs
 * (OpenBLAS does, from a constructor) with every signal unblocked; the kernel may hand them a
 * process-directed SIGTERM, whose default action would kill us. Their copy of the signal is
 * redirected to the main thread, which blocks it, so it waits for the signalfd.
 */
static volatile pid_t main_tid;

static void forward_signal(int sig) {
    int saved = errno;
    if (main_tid > 0)
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
    struct sigaction sa = {.sa_handler = forward_signal, .sa_flags = SA_RESTART};
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
        return log_error_errno(-errno, "Cannot open the runtime directory %s%s: %m", dir,
                               errno == ELOOP || errno == ENOTDIR ? " (a symlink or not a directory)"
                                                                  : "");
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
        return log_error_errno(-EPERM, "Refusing the runtime directory %s (owner uid %u, mode "
                               "%04o): %s; whoever can write it could replace the sockets.",
                               dir, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777), why);
    }
    d->runtime_dir_fd = fd;
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

static bool blank(const char *s) {
    return !s || s[strspn(s, " \t,")] == '\0';
}

/* One arena: its memory, its allocator and who may use it. */
static int add_arena(struct vased *d, const char *name, const char *spec, const char *cuda_share,
                     uint64_t bytes, uint64_t page_bytes, const char *users, const char *groups) {
    uint32_t i = d->n_arenas;
    enum vase_cuda_share share;
    int r = vase_cuda_share_from_string(cuda_share, &share);
    if (r < 0)
        return log_error_errno(r, "Arena %s: cuda_share=\"%s\": expected \"ipc\" or \"vmm\".",
                               name, cuda_share);
    r = vase_arena_new(i, spec, share, bytes, page_bytes, &d->arenas[i]);
    if (r < 0)
        return r;
    d->n_arenas++;
    d->arena_names[i] = name;
    r = vase_alloc_new(d->arenas[i]->num_pages, &d->allocs[i]);
    if (r < 0)
        return log_oom();
    /* An arena that names no one is open to every allowed peer; one whose names do not
     * resolve is open to no one but root and the daemon's user (denying more, never less). */
    d->arena_open[i] = blank(users) && blank(groups);
    if (vase_allow_parse(users, groups, &d->arena_allow[i]) < 0)
        return log_oom();
    log_info("Arena %u \"%s\" (%s%s%s, shared as %s): %llu bytes, %u pages of %llu bytes; for %s%s%s%s.",
             i, name, d->arenas[i]->kind, d->arenas[i]->device_uuid[0] ? ", " : "",
             d->arenas[i]->device_uuid, d->arenas[i]->ops->share,
             (unsigned long long)d->arenas[i]->size, d->arenas[i]->num_pages,
             (unsigned long long)d->arenas[i]->page_bytes,
             d->arena_open[i] ? "every allowed peer" : "users: ", d->arena_open[i] ? "" : users,
             d->arena_open[i] ? "" : "; groups: ", d->arena_open[i] ? "" : groups);
    return 0;
}

static int setup_arenas(struct vased *d) {
    const struct vase_config *c = &d->cfg;
    int r = add_arena(d, "default", c->arena, c->cuda_share, c->arena_bytes, c->page_bytes,
                      c->arena_users, c->arena_groups);
    for (size_t i = 0; r >= 0 && i < c->n_extra_arenas; i++) {
        const struct vase_arena_config *a = &c->extra_arenas[i];
        r = add_arena(d, a->name, a->arena, a->cuda_share, a->arena_bytes, a->page_bytes,
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
            return log_error_errno(-ENOENT, "socket_group: no group \"%s\".",
                                   d->cfg.socket_group);
        gid = gr->gr_gid;
    }
    const char *name = strrchr(path, '/');
    name = name ? name + 1 : path;
    if (fchownat(d->runtime_dir_fd, name, (uid_t)-1, gid, AT_SYMLINK_NOFOLLOW) < 0)
        return log_error_errno(-errno, "Cannot give %s to group %s: %m", path,
                               d->cfg.socket_group);
    return 0;
}

static int probe(const char *path, int type) {
    int r = vase_session_probe(path, type);
    if (r == -EADDRINUSE)
        return log_error_errno(r, "Another vased is running on %s; refusing to start.", path);
    if (r == -EEXIST)
        return log_error_errno(r, "%s exists and is not a socket; refusing to replace it.",
                               path);
    if (r < 0)
        return log_error_errno(r, "Cannot check %s: %m", path);
    return 0;
}

/* A live daemon answers on its sockets; a dead one left files no one listens on. Checked
 * before anything big is allocated. */
static int check_stale_sockets(struct vased *d) {
    int r;
    if ((r = probe(d->session_path, SOCK_SEQPACKET)) < 0 ||
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
    if (r >= 0) {
        r = vase_session_listen(d->session_path, &d->session_fd);
        if (r < 0)
            log_error_errno(r, "Cannot listen on %s: %m", d->session_path);
    }
    umask(old);
    if (r < 0)
        return r;
    if ((r = set_socket_group(d, d->session_path)) < 0 ||
        (r = set_socket_group(d, d->control_path)) < 0 ||
        (r = set_socket_group(d, d->events_path)) < 0)
        return r;
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

static void teardown(struct vased *d) {
    /* Plans first: threads read the arena and write plan pages. */
    d->evictor = vase_evictor_free(d->evictor);
    while (d->n_pending)
        drop_pending(d, d->n_pending - 1);
    /* Closing the sessions is what tells clients we are gone. */
    d->reg = vase_registry_free(d->reg);
    if (d->session_fd >= 0) {
        close(d->session_fd);
        d->session_fd = -1;
        unlink(d->session_path);
    }
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
    vase_config_done(&d->cfg);
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
    d->started_at = vased_now();
    vase_log_set_max_level(d->cfg.log_level);

    if (getrandom(&d->incarnation, sizeof(d->incarnation), 0) != sizeof(d->incarnation)) {
        r = log_error_errno(-errno, "getrandom() failed: %m");
        goto finish;
    }
    if (d->incarnation == 0) /* 0 means "not known yet" on the wire. */
        d->incarnation = 1;

    if ((r = setup_signals(d)) < 0 || (r = setup_runtime_dir(d)) < 0 ||
        (r = check_stale_sockets(d)) < 0)
        goto finish;
    r = vase_allow_parse(d->cfg.allow_users, d->cfg.allow_groups, &d->allow);
    if (r >= 0)
        r = vase_allow_parse("", d->cfg.admin_group, &d->admins);
    if (r < 0) {
        log_oom();
        goto finish;
    }
    if ((r = setup_arenas(d)) < 0)
        goto finish;
    r = vase_registry_new(&d->reg);
    if (r < 0) {
        log_oom();
        goto finish;
    }
    if ((r = setup_sockets(d)) < 0 || (r = setup_evictor(d)) < 0 || (r = setup_timer(d)) < 0)
        goto finish;

    log_info("vased %s ready in %s (incarnation %016llx).", VASED_VERSION, d->runtime_dir,
             (unsigned long long)d->incarnation);
    update_status(d, true);
    sd_notify(0, "READY=1");
    d->last_watchdog = d->last_stats = vased_now();
    vased_check_pressure(d, true);

    r = main_loop(d);
    if (!d->stopping)
        sd_notify(0, "STOPPING=1");
    log_info("vased stopped (%llu requests, %llu evictions).",
             (unsigned long long)d->requests_total, (unsigned long long)d->evictions_total);
finish:
    teardown(d);
    free(d);
    return r;
}
