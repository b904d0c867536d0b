/* SPDX-License-Identifier: MIT */

/*
 * The control protocol's front door: frame checks, who may send what, and dispatch to the
 * handlers of PROTOCOL.md (engine.c: models and sequences; cycle.c: the eviction cycle; admin.c:
 * status, listings, settings), which reply through reply.c.
 * Invariants: every frame gets at most one reply, an Error naming the problem when it is
 * refused (AttnStats: only then); no input can crash the daemon or make it allocate more than
 * the configured limits allow; an unpacked envelope is freed in the function that unpacked it
 * and nothing keeps pointers into it (the evictor gets copies); a refused request changes
 * nothing.
 */

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "serve/access.h"
#include "admin.h"
#include "serve/clients.h"
#include "control.h"
#include "cycle.h"
#include "engine.h"
#include "core/log.h"
#include "core/registry.h"
#include "reply.h"
#include "state.h"
#include "wire.h"

/* ---- frame checks (pure) ---- */

static int set_error(struct vase_control_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int set_error(struct vase_control_error *err, int code, const char *fmt, ...) {
    va_list ap;
    err->code = code;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
    return -code;
}

int vase_control_unpack(const void *buf, size_t len, size_t max, Vase__Envelope **ret,
                        struct vase_control_error *err) {
    Vase__Envelope *e = NULL;

    *err = (struct vase_control_error){0};
    int r = vase_wire_unpack(buf, len, max, &e);
    switch (r) {
    case 0:
        break;
    case -EMSGSIZE:
        return set_error(err, EMSGSIZE, "message of %zu bytes exceeds max_message_bytes (%zu)", len,
                         max);
    case -EBADMSG:
        return set_error(err, EBADMSG, "message of %zu bytes is not a vase.Envelope", len);
    case -VASE_EPROTOVERSION:
        err->request_id = e->request_id;
        set_error(err, VASE_EPROTOVERSION,
                  "protocol version %u is not supported (this "
                  "daemon speaks version %d)",
                  e->version, VASE_WIRE_VERSION);
        vase__envelope__free_unpacked(e, NULL);
        return -VASE_EPROTOVERSION;
    case -EINVAL:
        err->request_id = e ? e->request_id : 0;
        vase__envelope__free_unpacked(e, NULL);
        return set_error(err, EINVAL, "envelope has no body");
    default:
        return set_error(err, -r, "message cannot be read");
    }
    if (!vase_wire_is_request(e->body_case)) {
        err->request_id = e->request_id;
        set_error(err, EINVAL, "%s is not a request", vase_wire_body_name(e));
        vase__envelope__free_unpacked(e, NULL);
        return -EINVAL;
    }
    *ret = e;
    return 0;
}

int vase_control_check_peer(const Vase__Envelope *e, uint64_t incarnation, bool has_session,
                            uint64_t *last_client_seq, uint64_t *ret_lost,
                            struct vase_control_error *err) {
    bool admin = vase_wire_is_admin(e->body_case);

    if (ret_lost)
        *ret_lost = 0;
    *err = (struct vase_control_error){.request_id = e->request_id};
    if (e->incarnation != incarnation && !(admin && e->incarnation == 0))
        return set_error(err, VASE_ESTALE,
                         "stale incarnation %016llx (the daemon is %016llx: it restarted; "
                         "reconnect)",
                         (unsigned long long)e->incarnation, (unsigned long long)incarnation);
    if (!admin && !has_session)
        return set_error(err, ENOTCONN,
                         "%s needs a session: this routing id is not the token "
                         "of a live session",
                         vase_wire_body_name(e));
    if (has_session && last_client_seq) {
        if (e->client_seq <= *last_client_seq)
            return set_error(err, EPROTO,
                             "client_seq %llu is not above the last one (%llu): "
                             "replayed or reordered message",
                             (unsigned long long)e->client_seq,
                             (unsigned long long)*last_client_seq);
        if (e->client_seq != *last_client_seq + 1 && *last_client_seq != 0 && ret_lost)
            *ret_lost = e->client_seq - *last_client_seq - 1;
        *last_client_seq = e->client_seq;
    }
    return 0;
}

int vase_control_peer_cred(const char *peer_address, struct ucred *ret) {
    /* libzmq reads SO_PEERCRED when an ipc connection is accepted and appends ":uid:gid:pid"
     * to the peer's address; what comes before is not ours to interpret. */
    uint64_t v[3];
    const char *end = peer_address ? peer_address + strlen(peer_address) : NULL;
    if (!end)
        return -ENODATA;
    for (int i = 2; i >= 0; i--) {
        const char *colon = end;
        while (colon > peer_address && colon[-1] != ':')
            colon--;
        if (colon == peer_address || colon == end || end - colon > 20)
            return -ENODATA;
        char num[21];
        memcpy(num, colon, (size_t)(end - colon));
        num[end - colon] = '\0';
        if (vase_parse_u64(num, &v[i]) < 0 || v[i] > (i == 2 ? INT32_MAX : UINT32_MAX - 1))
            return -ENODATA;
        end = colon - 1;
    }
    *ret = (struct ucred){.uid = (uid_t)v[0], .gid = (gid_t)v[1], .pid = (pid_t)v[2]};
    return 0;
}

enum vase_control_access vase_control_access_of(Vase__Envelope__BodyCase body) {
    switch (body) {
    case VASE__ENVELOPE__BODY_PING:
    case VASE__ENVELOPE__BODY_STATUS:
    case VASE__ENVELOPE__BODY_CONFIG_GET:
        return VASE_CONTROL_ACCESS_ANY;
    case VASE__ENVELOPE__BODY_LIST_CLIENTS:
    case VASE__ENVELOPE__BODY_LIST_SEQS:
    case VASE__ENVELOPE__BODY_GET_SEQ:
        return VASE_CONTROL_ACCESS_ALLOWED;
    case VASE__ENVELOPE__BODY_CONFIG_SET:
        return VASE_CONTROL_ACCESS_ADMIN;
    default:
        return VASE_CONTROL_ACCESS_SESSION;
    }
}

int vase_control_open(void *zmq_ctx, const char *endpoint, uint64_t max_message_bytes, void **ret) {
    int zero = 0, timeout = 100;
    /* Frames up to twice the limit arrive and get an EMSGSIZE reply; anything larger is cut off
     * by ZeroMQ itself (the peer is disconnected, no reply), so no peer can make us buffer
     * more. */
    int64_t cut = 2 * (int64_t)max_message_bytes + (64 << 10);
    int r;
    void *s = zmq_socket(zmq_ctx, ZMQ_ROUTER);
    if (!s)
        return log_error_errno(-zmq_errno(), "Failed to create the control socket: %m");
    if (zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero)) < 0 ||
        zmq_setsockopt(s, ZMQ_SNDTIMEO, &timeout, sizeof(timeout)) < 0 ||
        zmq_setsockopt(s, ZMQ_ROUTER_MANDATORY, &zero, sizeof(zero)) < 0 ||
        zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &cut, sizeof(cut)) < 0) {
        r = log_error_errno(-zmq_errno(), "Failed to configure the control socket: %m");
        goto close_socket;
    }
    if (zmq_bind(s, endpoint) < 0) {
        r = log_error_errno(-zmq_errno(), "Failed to bind %s: %m", endpoint);
        goto close_socket;
    }
    *ret = s;
    return 0;

close_socket:
    zmq_close(s);
    return r;
}

/* ---- replies and dispatch ---- */

static int reply_control_error(struct vased *d, const struct vase_reply_to *p,
                               const struct vase_control_error *err) {
    struct vase_reply_to q = *p;
    q.request_id = err->request_id;
    return vase_reply_error(d, &q, err->code, "%s", err->message);
}

/*
 * Whether the peer may send e, from the kernel's credentials of its connection (p->cred) and
 * nothing the message says; replies the refusal itself. *who is filled for the requests whose
 * answer depends on the peer.
 */
static bool authorize(struct vased *d, struct vased_client *c, const struct vase_reply_to *p,
                      const Vase__Envelope *e, struct vased_peer *who) {
    enum vase_control_access need = vase_control_access_of(e->body_case);
    *who = (struct vased_peer){0};
    if (need == VASE_CONTROL_ACCESS_SESSION) {
        /* The token routes the request to the client; the connection must also be its uid's,
         * so a token that leaked does not let another user act as the client. */
        if (!p->cred_known || p->cred.uid != c->uid) {
            vase_reply_error(d, p, EPERM, "%s on the session of uid %u came from uid %u",
                             vase_wire_body_name(e), (unsigned)c->uid, (unsigned)p->cred.uid);
            return false;
        }
        return true;
    }
    /* Ping and ConfigGet depend on no one's rights; the rest look the peer's groups up. */
    bool needs_peer =
        need != VASE_CONTROL_ACCESS_ANY || e->body_case == VASE__ENVELOPE__BODY_STATUS;
    if (needs_peer && p->cred_known && vase_access_lookup(d, &p->cred, who) < 0) {
        vase_reply_error(d, p, ENOMEM, "out of memory");
        return false;
    }
    if (need == VASE_CONTROL_ACCESS_ALLOWED && !who->allowed && !who->admin) {
        vase_reply_error(d, p, EPERM,
                         "%s needs a uid that allow_users/allow_groups admit (uid %u "
                         "is not)",
                         vase_wire_body_name(e), (unsigned)p->cred.uid);
        return false;
    }
    if (need == VASE_CONTROL_ACCESS_ADMIN && !who->admin) {
        vase_reply_error(d, p, EPERM,
                         "changing settings needs root, the daemon's user (uid %u) or "
                         "a member of admin_group; uid %u is none of them",
                         (unsigned)d->self_uid, (unsigned)p->cred.uid);
        return false;
    }
    return true;
}

static int dispatch(struct vased *d, struct vased_client *c, const struct vase_reply_to *p,
                    const Vase__Envelope *e) {
    struct vased_peer who;
    if (!authorize(d, c, p, e, &who))
        return -EPERM;
    switch (e->body_case) {
    case VASE__ENVELOPE__BODY_REGISTER_MODEL:
    case VASE__ENVELOPE__BODY_OPEN_SEQ:
    case VASE__ENVELOPE__BODY_CLOSE_SEQ:
    case VASE__ENVELOPE__BODY_SET_BUDGET:
        return vase_engine_handle(d, c, p, e);
    case VASE__ENVELOPE__BODY_EVICT_REQUEST:
    case VASE__ENVELOPE__BODY_EVICT_COMMIT:
    case VASE__ENVELOPE__BODY_ATTN_STATS:
        return vase_cycle_handle(d, c, p, e);
    default:
        if (vase_wire_is_admin(e->body_case))
            return vase_admin_handle(d, p, e, &who);
        return vase_reply_error(d, p, EINVAL, "%s is not a request", vase_wire_body_name(e));
    }
}

static int handle_frame(struct vased *d, const void *id, size_t id_len, const void *buf, size_t len,
                        bool extra_frames, const char *peer_address) {
    struct vase_reply_to p = {.id = id, .id_len = id_len};
    p.cred_known = vase_control_peer_cred(peer_address, &p.cred) == 0;
    if (!p.cred_known)
        p.cred = (struct ucred){.uid = (uid_t)-1, .gid = (gid_t)-1, .pid = -1};
    struct vase_control_error err;
    Vase__Envelope *e = NULL;

    d->requests_total++;
    if (extra_frames) {
        d->metrics.requests[0]++;
        return vase_reply_error(d, &p, EBADMSG, "a control message is one frame; got several");
    }
    if (vase_control_unpack(buf, len, d->cfg.max_message_bytes, &e, &err) < 0) {
        d->metrics.requests[0]++;
        return reply_control_error(d, &p, &err);
    }

    struct vased_client *c = vase_registry_find_token(d->reg, id, id_len);
    uint64_t lost;
    p.request_id = e->request_id;
    p.admin = vase_wire_is_admin(e->body_case);
    p.body = e->body_case;
    d->metrics.requests[vase_metrics_msg_index(e->body_case)]++;
    if (vase_control_check_peer(e, d->incarnation, c != NULL, c ? &c->last_client_seq : NULL, &lost,
                                &err) < 0) {
        reply_control_error(d, &p, &err);
    } else {
        if (lost && vase_clients_log_ok(c))
            log_notice("Client %u: client_seq jumped to %llu, %llu messages lost.", c->id,
                       (unsigned long long)e->client_seq, (unsigned long long)lost);
        dispatch(d, c, &p, e);
    }
    vase__envelope__free_unpacked(e, NULL);
    return 0;
}

static bool has_more(void *socket) {
    int more = 0;
    size_t sz = sizeof(more);
    return zmq_getsockopt(socket, ZMQ_RCVMORE, &more, &sz) == 0 && more;
}

void vase_control_process(struct vased *d) {
    /* A bounded batch, so that sessions, signals and plan results are not starved. */
    for (int i = 0; i < 256; i++) {
        zmq_msg_t id, body;
        zmq_msg_init(&id);
        if (zmq_msg_recv(&id, d->router, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&id);
            return;
        }
        if (!has_more(d->router)) { /* A ROUTER always prefixes the routing id; be safe. */
            zmq_msg_close(&id);
            continue;
        }
        zmq_msg_init(&body);
        if (zmq_msg_recv(&body, d->router, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&body);
            zmq_msg_close(&id);
            continue;
        }
        bool extra = false;
        while (has_more(d->router)) {
            zmq_msg_t junk;
            zmq_msg_init(&junk);
            if (zmq_msg_recv(&junk, d->router, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&junk);
                break;
            }
            zmq_msg_close(&junk);
            extra = true;
        }
        handle_frame(d, zmq_msg_data(&id), zmq_msg_size(&id), zmq_msg_data(&body),
                     zmq_msg_size(&body), extra, zmq_msg_gets(&body, "Peer-Address"));
        zmq_msg_close(&body);
        zmq_msg_close(&id);
    }
}
