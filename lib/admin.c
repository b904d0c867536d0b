/* SPDX-License-Identifier: MIT */

/*
 * The administrative API (vase_admin.h): a control channel without a session, one request and
 * one reply per call, and the event subscription. A handle owns its channel and the words of
 * its last failure; a subscription owns its ZeroMQ context and SUB socket and borrows the
 * handle for the pings that tell a quiet stream from a dead daemon. Replies are detached from
 * their envelope and handed over whole, so the caller never sees the envelope.
 */

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "chan.h"
#include "session.h"
#include "vase_admin.h"
#include "wire.h"

#define DEFAULT_TIMEOUT_MS 5000

struct vase_admin {
    char dir[PATH_MAX];
    char path[PATH_MAX + 32]; /* control.sock */
    int timeout_ms;
    struct vase__chan *chan;
    char error[512];
};

struct vase_admin_events {
    struct vase_admin *admin;
    void *zctx;
    void *sub;
};

int vase_admin_new(const struct vase_admin_options *opts, struct vase_admin **ret) {
    int timeout = opts ? opts->timeout_ms : 0;

    if (!ret || timeout < 0)
        return -EINVAL;
    struct vase_admin *a = calloc(1, sizeof(*a));
    if (!a)
        return -ENOMEM;
    int r = vase__runtime_dir(opts ? opts->runtime_dir : NULL, a->dir, sizeof(a->dir));
    if (r < 0 ||
        (size_t)snprintf(a->path, sizeof(a->path), "%s/control.sock", a->dir) >= sizeof(a->path)) {
        free(a);
        return -ENAMETOOLONG;
    }
    a->timeout_ms = timeout ? timeout : DEFAULT_TIMEOUT_MS;
    *ret = a;
    return 0;
}

struct vase_admin *vase_admin_free(struct vase_admin *a) {
    if (!a)
        return NULL;
    vase__chan_free(a->chan);
    free(a);
    return NULL;
}

const char *vase_admin_runtime_dir(const struct vase_admin *a) {
    return a ? a->dir : "";
}

const char *vase_admin_path(const struct vase_admin *a) {
    return a ? a->path : "";
}

int vase_admin_timeout(const struct vase_admin *a) {
    return a ? a->timeout_ms : 0;
}

const char *vase_admin_last_error(const struct vase_admin *a) {
    return a ? a->error : "";
}

static int fail(struct vase_admin *a, int r, const char *fmt, ...) {
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(a->error, sizeof(a->error), fmt, ap);
    va_end(ap);
    return r;
}

/* The ipc:// endpoint of a socket of the runtime directory, through its real path (ZeroMQ's
 * ipc names are limited and relative ones depend on the working directory). */
static int endpoint_of(const struct vase_admin *a, const char *sock, char *buf, size_t size) {
    char path[PATH_MAX + 32], abs[PATH_MAX];
    struct stat st;

    snprintf(path, sizeof(path), "%s/%s", a->dir, sock);
    if (stat(path, &st) < 0 || access(path, R_OK | W_OK) < 0)
        return -errno;
    if (!S_ISSOCK(st.st_mode))
        return -ENOTSOCK;
    const char *dir = realpath(a->dir, abs) ? abs : a->dir;
    if ((size_t)snprintf(buf, size, "ipc://%s/%s", dir, sock) >= size)
        return -ENAMETOOLONG;
    return 0;
}

int vase_admin_connect(struct vase_admin *a) {
    char endpoint[PATH_MAX + 64];

    if (!a)
        return -EINVAL;
    a->error[0] = 0;
    if (a->chan)
        return -EALREADY;
    int r = endpoint_of(a, "control.sock", endpoint, sizeof(endpoint));
    if (r < 0)
        return r;
    struct vase__chan_options o = {
        .endpoint = endpoint,
        .timeout_ms = a->timeout_ms,
        .session_fd = -1,
    };
    return vase__chan_new(&o, &a->chan);
}

/* One request, one reply of body case expect, with the reason of a failure in a->error. */
static int call(struct vase_admin *a, Vase__Envelope *e, Vase__Envelope__BodyCase expect,
                Vase__Envelope **ret) {
    Vase__Envelope *reply;
    uint64_t id;

    a->error[0] = 0;
    if (!a->chan)
        return -ENOTCONN;
    int r = vase__chan_send(a->chan, e, &id);
    if (r == 0)
        r = vase__chan_wait(a->chan, id, -1, &reply);
    if (r < 0)
        return r;
    if (reply->body_case == VASE__ENVELOPE__BODY_ERROR) {
        r = vase__error_code(reply->error);
        fail(a, r, "%s", reply->error->message ? reply->error->message : "");
        vase__envelope__free_unpacked(reply, NULL);
        return r;
    }
    if (reply->body_case != expect) {
        fail(a, 0, "unexpected reply '%s' from vased", vase_wire_body_name(reply));
        vase__envelope__free_unpacked(reply, NULL);
        return -EPROTO;
    }
    *ret = reply;
    return 0;
}

/* Sends e and takes the reply body of case expect, at offset body in the envelope, out of its
 * envelope (which is freed) into *ret. */
static int request(struct vase_admin *a, Vase__Envelope *e, Vase__Envelope__BodyCase expect,
                   size_t body, void **ret) {
    Vase__Envelope *reply;
    int r = call(a, e, expect, &reply);

    if (r < 0)
        return r;
    void **slot = (void **)((char *)reply + body);
    *ret = *slot;
    *slot = NULL;
    reply->body_case = VASE__ENVELOPE__BODY__NOT_SET;
    vase__envelope__free_unpacked(reply, NULL);
    return 0;
}

#define REQUEST(a, e, expect, field, ret)                                                          \
    request(a, e, expect, offsetof(Vase__Envelope, field), (void **)(ret))

int vase_admin_ping(struct vase_admin *a, uint64_t *ret_incarnation) {
    Vase__Ping ping = VASE__PING__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    Vase__Envelope *reply;

    if (!a)
        return -EINVAL;
    e.body_case = VASE__ENVELOPE__BODY_PING;
    e.ping = &ping;
    int r = call(a, &e, VASE__ENVELOPE__BODY_PONG, &reply);
    if (r < 0)
        return r;
    if (ret_incarnation)
        *ret_incarnation = reply->incarnation;
    vase__envelope__free_unpacked(reply, NULL);
    return 0;
}

int vase_admin_status(struct vase_admin *a, Vase__StatusReply **ret) {
    Vase__Status st = VASE__STATUS__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;

    if (!a || !ret)
        return -EINVAL;
    e.body_case = VASE__ENVELOPE__BODY_STATUS;
    e.status = &st;
    return REQUEST(a, &e, VASE__ENVELOPE__BODY_STATUS_REPLY, status_reply, ret);
}

int vase_admin_clients(struct vase_admin *a, Vase__ClientsReply **ret) {
    Vase__ListClients lc = VASE__LIST_CLIENTS__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;

    if (!a || !ret)
        return -EINVAL;
    e.body_case = VASE__ENVELOPE__BODY_LIST_CLIENTS;
    e.list_clients = &lc;
    return REQUEST(a, &e, VASE__ENVELOPE__BODY_CLIENTS_REPLY, clients_reply, ret);
}

int vase_admin_seqs(struct vase_admin *a, uint32_t client_id, Vase__SeqsReply **ret) {
    Vase__ListSeqs ls = VASE__LIST_SEQS__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;

    if (!a || !ret)
        return -EINVAL;
    ls.client_id = client_id;
    e.body_case = VASE__ENVELOPE__BODY_LIST_SEQS;
    e.list_seqs = &ls;
    return REQUEST(a, &e, VASE__ENVELOPE__BODY_SEQS_REPLY, seqs_reply, ret);
}

int vase_admin_seq(struct vase_admin *a, uint32_t seq_id, Vase__SeqInfo **ret) {
    Vase__GetSeq gs = VASE__GET_SEQ__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;

    if (!a || !ret)
        return -EINVAL;
    gs.seq_id = seq_id;
    e.body_case = VASE__ENVELOPE__BODY_GET_SEQ;
    e.get_seq = &gs;
    return REQUEST(a, &e, VASE__ENVELOPE__BODY_SEQ_INFO, seq_info, ret);
}

int vase_admin_config_get(struct vase_admin *a, const char *key, Vase__ConfigReply **ret) {
    Vase__ConfigGet cg = VASE__CONFIG_GET__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;

    if (!a || !ret)
        return -EINVAL;
    cg.key = (char *)(key ? key : "");
    e.body_case = VASE__ENVELOPE__BODY_CONFIG_GET;
    e.config_get = &cg;
    return REQUEST(a, &e, VASE__ENVELOPE__BODY_CONFIG_REPLY, config_reply, ret);
}

static int config_set(struct vase_admin *a, const char *key, const char *value, bool persist,
                      Vase__ConfigReply **ret) {
    Vase__ConfigSet cs = VASE__CONFIG_SET__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;

    if (!a || !key || !value || !ret)
        return -EINVAL;
    cs.key = (char *)key;
    cs.value = (char *)value;
    cs.persist = persist;
    e.body_case = VASE__ENVELOPE__BODY_CONFIG_SET;
    e.config_set = &cs;
    return REQUEST(a, &e, VASE__ENVELOPE__BODY_CONFIG_REPLY, config_reply, ret);
}

int vase_admin_config_set(struct vase_admin *a, const char *key, const char *value,
                          Vase__ConfigReply **ret) {
    return config_set(a, key, value, false, ret);
}

int vase_admin_config_persist(struct vase_admin *a, const char *key, const char *value,
                              Vase__ConfigReply **ret) {
    return config_set(a, key, value, true, ret);
}

int vase_admin_events_subscribe(struct vase_admin *a, struct vase_admin_events **ret) {
    char endpoint[PATH_MAX + 64];
    int zero = 0, r;

    if (!a || !ret)
        return -EINVAL;
    a->error[0] = 0;
    r = endpoint_of(a, "events.sock", endpoint, sizeof(endpoint));
    if (r < 0)
        return r;
    struct vase_admin_events *ev = calloc(1, sizeof(*ev));
    if (!ev)
        return -ENOMEM;
    ev->admin = a;
    ev->zctx = zmq_ctx_new();
    if (!ev->zctx) {
        r = -errno;
        goto fail;
    }
    ev->sub = zmq_socket(ev->zctx, ZMQ_SUB);
    if (!ev->sub || zmq_setsockopt(ev->sub, ZMQ_LINGER, &zero, sizeof(zero)) < 0 ||
        zmq_setsockopt(ev->sub, ZMQ_SUBSCRIBE, "", 0) < 0 || zmq_connect(ev->sub, endpoint) < 0) {
        r = -errno;
        fail(a, r, "cannot subscribe to %s: %s", endpoint, zmq_strerror(-r));
        goto fail;
    }
    /* PUB/SUB alone would wait silently for ever: a ping proves the daemon is there, and its
     * round trip gives the subscription time to reach the publisher. */
    r = vase_admin_ping(a, NULL);
    if (r < 0)
        goto fail;
    *ret = ev;
    return 0;
fail:
    vase_admin_events_free(ev);
    return r;
}

struct vase_admin_events *vase_admin_events_free(struct vase_admin_events *ev) {
    if (!ev)
        return NULL;
    if (ev->sub)
        zmq_close(ev->sub);
    if (ev->zctx)
        zmq_ctx_term(ev->zctx);
    free(ev);
    return NULL;
}

/* Receives one event's frames (topic, body, and drops any further ones). 1 if both came, 0 if
 * only a topic did, -1 if nothing could be read after all. */
static int recv_frames(void *sub, zmq_msg_t *topic, zmq_msg_t *body) {
    if (zmq_msg_recv(topic, sub, ZMQ_DONTWAIT) < 0)
        return -1;
    bool two = zmq_msg_more(topic) && zmq_msg_recv(body, sub, ZMQ_DONTWAIT) >= 0;
    bool more = two && zmq_msg_more(body);
    while (more) {
        zmq_msg_t extra;
        zmq_msg_init(&extra);
        more = zmq_msg_recv(&extra, sub, ZMQ_DONTWAIT) >= 0 && zmq_msg_more(&extra);
        zmq_msg_close(&extra);
    }
    return two;
}

int vase_admin_events_next(struct vase_admin_events *ev, char *topic, size_t topic_size,
                           Vase__Event **ret) {
    zmq_pollitem_t item;
    zmq_msg_t t, b;
    int r;

    if (!ev || !topic || topic_size == 0 || !ret)
        return -EINVAL;
    ev->admin->error[0] = 0;
    item = (zmq_pollitem_t){.socket = ev->sub, .events = ZMQ_POLLIN};
    r = zmq_poll(&item, 1, ev->admin->timeout_ms);
    if (r < 0)
        return -errno;
    if (r == 0) {
        r = vase_admin_ping(ev->admin, NULL);
        return r < 0 ? r : 0;
    }
    zmq_msg_init(&t);
    zmq_msg_init(&b);
    Vase__Event *e = NULL;
    int frames = recv_frames(ev->sub, &t, &b);
    if (frames < 0) {
        /* Nothing to read after all (a spurious wake-up): no event, no error. */
        r = 0;
    } else if (frames == 1 && zmq_msg_size(&b) <= VASE_WIRE_DEFAULT_MAX &&
               (e = vase__event__unpack(NULL, zmq_msg_size(&b), zmq_msg_data(&b)))) {
        size_t n = zmq_msg_size(&t) < topic_size ? zmq_msg_size(&t) : topic_size - 1;
        memcpy(topic, zmq_msg_data(&t), n);
        topic[n] = 0;
        *ret = e;
        r = 1;
    } else
        r = fail(ev->admin, -EBADMSG, "dropped a malformed event");
    zmq_msg_close(&t);
    zmq_msg_close(&b);
    return r;
}

size_t vase_admin_escape(const char *in, char *out, size_t out_size) {
    return vase_wire_escape(in, out, out_size);
}

int vase_admin_hidden_char(uint32_t cp) {
    return vase_wire_hidden_char(cp);
}
