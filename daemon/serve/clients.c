/* SPDX-License-Identifier: MIT */

/*
 * Clients arriving and leaving. The allow-list decides when a connection is accepted, before the
 * peer holds anything; an admitted connection waits in a bounded pending slot (VASED_MAX_PENDING,
 * VASED_MAX_PENDING_PER_UID) for its hello, at most VASED_HELLO_TIMEOUT, and becomes a client with
 * the welcome, which describes and passes only the arenas it may use. The session is silent after
 * that; its closing is how the daemon learns the client is gone, and then its sequences close (or
 * wait for their plan in flight), its pages return and the leave is published. Refusals are
 * logged under one rate limit, since anyone who can reach the socket can cause them. Beyond
 * max_clients, the hello of a uid that has max_sessions_per_uid sessions open is refused, so
 * that one uid cannot take every session.
 */

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include "access.h"
#include "core/arena.h"
#include "clients.h"
#include "drain.h"
#include "core/log.h"
#include "publish.h"
#include "core/registry.h"
#include "core/session.h"
#include "state.h"
#include "wire.h"

static void drop_pending(struct vased *d, size_t i) {
    close(d->pending[i].fd);
    if (d->pending[i].pidfd >= 0)
        close(d->pending[i].pidfd);
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

/* Whether a session's beginning or end gets its log line: a burst per interval, then one line
 * that counts the rest, so a peer that connects in a loop cannot flood the journal. */
static bool churn_log_ok(struct vased *d) {
    unsigned suppressed;
    bool pass = vase_ratelimit_pass(&d->churn_log, vased_now(), &suppressed);
    if (suppressed)
        log_notice("%u more sessions began or ended in %.0f s without a log line each.", suppressed,
                   d->churn_log.interval);
    return pass;
}

bool vase_clients_log_ok(struct vased_client *c) {
    unsigned suppressed;
    bool pass = vase_ratelimit_pass(&c->log_limit, vased_now(), &suppressed);
    if (suppressed)
        log_notice("Client %u: %u more messages about it were suppressed in %.0f s.", c->id,
                   suppressed, c->log_limit.interval);
    return pass;
}

static int send_welcome(struct vased *d, struct vased_client *c) {
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
        info[n].granule_bytes = a->granule_bytes;
        info[n].granules = a->num_granules;
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
    if (r == -VASE_EPROTOVERSION)
        refuse(d, pend.fd, VASE_EPROTOVERSION,
               "protocol version %u is not supported (this daemon speaks %d)", e->version,
               VASE_WIRE_VERSION);
    else if (r == -EINVAL || (r == 0 && e->body_case != VASE__ENVELOPE__BODY_HELLO))
        refuse(d, pend.fd, EINVAL, "the first packet of a session must be a SessionHello");
    else if (r == -EBADMSG || r == -EMSGSIZE)
        refuse(d, pend.fd, -r, "the session packet is not a vase.Envelope");
    else if (r == -ENOMEM)
        refuse(d, pend.fd, ENOMEM, "out of memory");
    if (r < 0 || e->body_case != VASE__ENVELOPE__BODY_HELLO) {
        if (r < 0 && r != -ECONNRESET)
            log_debug_errno(r, "Session of pid %d dropped before its hello: %m",
                            (int)pend.cred.pid);
        vase__envelope__free_unpacked(e, NULL);
        drop_pending(d, i);
        return;
    }

    /* The allow-list was checked when the connection was accepted. */
    struct vased_uid_usage used = {0};
    bool capped = vase_access_uid_capped(d, pend.cred.uid);
    if (capped)
        vase_registry_uid_usage(d->reg, pend.cred.uid, &used);
    if (d->reg->n_clients >= d->cfg.max_clients) {
        refuse(d, pend.fd, EUSERS, "max_clients (%u) sessions are open", d->cfg.max_clients);
        r = -EUSERS;
    } else if (capped && used.sessions >= d->cfg.max_sessions_per_uid) {
        /* One uid's share: however many sessions it opens, others still get in. */
        refuse(d, pend.fd, EUSERS, "uid %u has max_sessions_per_uid (%u) sessions open",
               (unsigned)pend.cred.uid, d->cfg.max_sessions_per_uid);
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

    const char *name = e->hello->name ? e->hello->name : "";
    char *name_copy = strndup(name, VASE_MAX_NAME);
    struct vased_client *c;
    r = name_copy ? vase_registry_add_client(d->reg, pend.fd, &c) : -ENOMEM;
    if (r < 0) {
        free(name_copy);
        refuse(d, pend.fd, -r, "cannot register the client: %s", strerror(-r));
        vase__envelope__free_unpacked(e, NULL);
        drop_pending(d, i);
        return;
    }
    /* The registry owns the fds now. */
    d->pending[i] = d->pending[--d->n_pending];
    c->name = name_copy;
    c->pidfd = pend.pidfd;
    c->pidfd_error = pend.pidfd_error;
    c->pid = (uint32_t)pend.cred.pid;
    c->uid = pend.cred.uid;
    c->gid = pend.cred.gid;
    c->arenas = pend.peer.arenas;
    c->connected_at = vased_now();
    vase__envelope__free_unpacked(e, NULL);

    r = send_welcome(d, c);
    if (r < 0) {
        log_warning_errno(r, "Cannot welcome pid %u: %m", c->pid);
        /* Tell the peer why, if the socket still takes it: a wait for a welcome that will not
         * come would end only in its timeout. */
        vase_session_send_error(c->fd, d->incarnation, -r, "cannot send the welcome");
        vase_registry_remove_client(d->reg, c);
        return;
    }
    if (churn_log_ok(d))
        log_info("Client %u \"%s\" (pid %u, uid %u) connected.", c->id, c->name, c->pid,
                 (unsigned)c->uid);
    vase_publish_client(d, c, true);
}

/* Ends client c, whose session closed: its sequences close (those with a plan in flight keep their
 * pages until it finishes), its pages return, a client_leave event goes out. The pages of its
 * device sequences are held instead while its process may still write them (drain.h). */
static void drop_client(struct vased *d, struct vased_client *c) {
    uint64_t bytes = c->bytes;
    uint32_t waiting = 0, held = 0;
    bool hold = vase_drain_must_hold(d, c);
    uint32_t parked = vase_admitq_drop_client(&d->admitq, c->id);
    if (parked) {
        log_debug("Client %u: %u opens waiting for room dropped.", c->id, parked);
        /* Those behind them are tried again at the next retry. */
        for (uint32_t i = 0; i < VASED_MAX_ARENAS; i++)
            d->admit_free_seen[i] = UINT64_MAX;
    }
    vase_publish_client(d, c, false);
    while (c->seqs) {
        struct vased_seq *s = c->seqs;
        vase_publish_seq(d, s, false);
        if (hold && vase_arena_on_device(d->arenas[s->arena_id])) {
            vase_registry_hold_seq(d->reg, s);
            held++;
        } else if (vase_registry_close_seq(d->reg, d->allocs[s->arena_id], s) > 0) {
            waiting++;
        }
    }
    if (c->log_limit.suppressed)
        log_notice("Client %u: %u more messages about it were suppressed.", c->id,
                   c->log_limit.suppressed);
    if (churn_log_ok(d))
        log_info("Client %u \"%s\" (pid %u) disconnected; %llu bytes released%s%s.", c->id,
                 c->name ? c->name : "", c->pid, (unsigned long long)(bytes - c->bytes),
                 waiting ? " (those of sequences with a plan in flight when it finishes)" : "",
                 held ? ", those of its device sequences held while its process may use them" : "");
    if (held)
        vase_drain_start(d, c);
    else
        vase_registry_remove_client(d->reg, c);
    vase_publish_pressure(d, false);
}

static void on_client_fd(struct vased *d, struct vased_client *c, short revents) {
    char buf[256];
    ssize_t n = 0;

    if (revents & ZMQ_POLLIN)
        n = recv(c->fd, buf, sizeof(buf), MSG_DONTWAIT | MSG_TRUNC);
    if ((revents & ZMQ_POLLIN) && n > 0) {
        /* The session is silent after the welcome; a packet is ignored, not fatal. */
        if (vase_clients_log_ok(c))
            log_warning("Client %u sent %zd bytes on its session socket; ignored.", c->id, n);
        return;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    drop_client(d, c);
}

/*
 * A new connection: the allow-list decides at once, before the peer holds anything, so a uid
 * that may not open a session cannot occupy the slots of those who may; an admitted uid holds
 * at most VASED_MAX_PENDING_PER_UID slots while it says nothing. A client sends its hello
 * right after connecting, so it is usually read here and needs no slot for long.
 */
static void admit(struct vased *d, int fd, const struct ucred *cred) {
    struct vased_peer peer;
    if (vase_access_lookup(d, cred, &peer) < 0) {
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
    /* Watched from now on, before its pid could be reused: only where it may map device
     * memory, whose pages outlive its session until the process is gone (drain.h). */
    int pidfd = -1, pidfd_error = -EBADF;
    for (uint32_t i = 0; i < d->n_arenas; i++)
        if ((peer.arenas & (1u << i)) && vase_arena_on_device(d->arenas[i])) {
            pidfd_error = vase_drain_watch(cred->pid, &pidfd);
            /* Said once: it is the kernel's (or the pid namespace's) doing, the same for all. */
            if (pidfd_error < 0 && pidfd_error != -ESRCH && !d->unwatchable_logged) {
                log_full_errno(LOG_NOTICE, pidfd_error,
                               "Cannot watch the process of pid %d (%m); the pages of a GPU "
                               "client that cannot be watched are held for %.0f s after its "
                               "session ends.",
                               (int)cred->pid, VASED_DRAIN_FALLBACK);
                d->unwatchable_logged = true;
            }
            break;
        }
    d->pending[d->n_pending++] =
        (struct vased_pending){.fd = fd,
                               .pidfd = pidfd,
                               .pidfd_error = pidfd_error,
                               .cred = *cred,
                               .peer = peer,
                               .deadline = vased_now() + VASED_HELLO_TIMEOUT};
    on_pending(d, d->n_pending - 1);
}

void vase_clients_accept(struct vased *d) {
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

void vase_clients_on_pending(struct vased *d, int fd) {
    for (size_t j = 0; j < d->n_pending; j++)
        if (d->pending[j].fd == fd) {
            on_pending(d, j);
            return;
        }
}

void vase_clients_flush_logs(struct vased *d, double now) {
    unsigned n;
    if ((n = vase_ratelimit_flush(&d->churn_log, now)) > 0)
        log_notice("%u more sessions began or ended in %.0f s without a log line each.", n,
                   d->churn_log.interval);
    if ((n = vase_ratelimit_flush(&d->refuse_log, now)) > 0)
        log_notice("%u more sessions or connections were refused in %.0f s without a log line "
                   "each.",
                   n, d->refuse_log.interval);
}

void vase_clients_expire_pending(struct vased *d, double now) {
    for (size_t i = 0; i < d->n_pending;) {
        if (now >= d->pending[i].deadline) {
            if (churn_log_ok(d))
                log_notice("Session of pid %d sent no hello in %.0f s; closed.",
                           (int)d->pending[i].cred.pid, VASED_HELLO_TIMEOUT);
            drop_pending(d, i);
        } else {
            i++;
        }
    }
}

void vase_clients_close_pending(struct vased *d) {
    while (d->n_pending)
        drop_pending(d, d->n_pending - 1);
}

void vase_clients_on_session(struct vased *d, struct vased_client *c, int fd, short revents) {
    /* Still registered? (A client is only removed by its own session event.) */
    for (struct vased_client *o = d->reg->clients; o; o = o->next)
        if (o == c && o->fd == fd) {
            on_client_fd(d, c, revents);
            return;
        }
}
