/* SPDX-License-Identifier: MIT */

/*
 * The control channel. One DEALER per client; every request gets a fresh request id and client
 * sequence number, and carries the daemon's incarnation once it is known. Only one thread uses
 * a channel at a time (the client's mutex, or vasectl's single thread), so a wait may read any
 * reply: the one it waits for is returned, others are sorted by the owner's callback into the
 * reply queue or dropped. Every wait is bounded by a deadline and, for engines, also ends as
 * soon as the session socket closes: a dead daemon is reported at once, not after the timeout.
 */

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <zmq.h>

#include "chan.h"
#include "vase.h"
#include "wire.h"

struct vase__chan {
    void *zctx;
    void *sock;
    int session_fd;
    int timeout_ms;
    size_t max_message_bytes;
    uint64_t incarnation;
    uint64_t last_client_seq;
    uint64_t last_request_id;
    /* The highest request id a reply has arrived for: the daemon handles a peer's requests in
     * order, so every request up to it has been handled. */
    uint64_t answered;
    vase__chan_unclaimed_fn unclaimed;
    void *userdata;
    struct vase__replyq queue;
    /* The message of the Error that answered the last vase__chan_call(), "" if none did: the
     * errno alone ("Invalid argument") rarely says what was wrong. */
    char last_error[256];
};

static int set_int(void *sock, int option, int value) {
    return zmq_setsockopt(sock, option, &value, sizeof(value)) < 0 ? -errno : 0;
}

int vase__chan_new(const struct vase__chan_options *o, struct vase__chan **ret) {
    int r;

    if (!o || !ret || !o->endpoint || o->timeout_ms <= 0 ||
        (o->routing_id && (o->routing_id_len == 0 || o->routing_id_len > 255)))
        return -EINVAL;

    struct vase__chan *ch = calloc(1, sizeof(*ch));
    if (!ch)
        return -ENOMEM;
    ch->session_fd = o->session_fd;
    ch->timeout_ms = o->timeout_ms;
    ch->max_message_bytes = o->max_message_bytes ? o->max_message_bytes : VASE_WIRE_DEFAULT_MAX;
    if (ch->max_message_bytes > VASE_WIRE_HARD_MAX)
        ch->max_message_bytes = VASE_WIRE_HARD_MAX;
    ch->unclaimed = o->unclaimed;
    ch->userdata = o->userdata;

    ch->zctx = zmq_ctx_new();
    if (!ch->zctx) {
        r = -errno;
        goto fail_chan;
    }
    ch->sock = zmq_socket(ch->zctx, ZMQ_DEALER);
    if (!ch->sock) {
        r = -errno;
        goto fail_ctx;
    }
    /* Linger 0: a message the daemon never took is dropped at close instead of holding the
     * process at exit (docs/ARCHITECTURE.md, "Liveness"). */
    if ((r = set_int(ch->sock, ZMQ_LINGER, 0)) < 0 ||
        (r = set_int(ch->sock, ZMQ_SNDTIMEO, o->timeout_ms)) < 0 ||
        (r = set_int(ch->sock, ZMQ_RCVTIMEO, o->timeout_ms)) < 0 ||
        (r = set_int(ch->sock, ZMQ_CONNECT_TIMEOUT, o->timeout_ms)) < 0)
        goto fail_sock;
    if (o->routing_id &&
        zmq_setsockopt(ch->sock, ZMQ_ROUTING_ID, o->routing_id, o->routing_id_len) < 0) {
        r = -errno;
        goto fail_sock;
    }
    if (zmq_connect(ch->sock, o->endpoint) < 0) {
        r = -errno;
        goto fail_sock;
    }
    *ret = ch;
    return 0;

fail_sock:
    zmq_close(ch->sock);
fail_ctx:
    zmq_ctx_term(ch->zctx);
fail_chan:
    free(ch);
    /* ZeroMQ reports its own failures with its own codes (EFSM, ETERM, ...): keep the errno
     * range honest for vase_strerror(). */
    return r < 0 && -r < 1000 ? r : -EPROTO;
}

struct vase__chan *vase__chan_free(struct vase__chan *ch) {
    if (!ch)
        return NULL;
    vase__replyq_clear(&ch->queue);
    if (ch->sock)
        zmq_close(ch->sock);
    if (ch->zctx)
        zmq_ctx_term(ch->zctx);
    free(ch);
    return NULL;
}

void vase__chan_set_incarnation(struct vase__chan *ch, uint64_t incarnation) {
    ch->incarnation = incarnation;
}

uint64_t vase__chan_incarnation(const struct vase__chan *ch) {
    return ch->incarnation;
}

int vase__chan_timeout(const struct vase__chan *ch) {
    return ch->timeout_ms;
}

int vase__chan_send(struct vase__chan *ch, Vase__Envelope *e, uint64_t *ret_request_id) {
    void *buf;
    size_t len;

    e->version = VASE_WIRE_VERSION;
    e->incarnation = ch->incarnation;
    e->client_seq = ch->last_client_seq + 1;
    e->request_id = ch->last_request_id + 1;
    int r = vase_wire_pack(e, &buf, &len);
    if (r < 0)
        return r;
    if (len > ch->max_message_bytes) {
        free(buf);
        return -EMSGSIZE;
    }
    for (;;) {
        if (zmq_send(ch->sock, buf, len, 0) >= 0) {
            r = 0;
            break;
        }
        if (errno == EINTR)
            continue;
        r = errno == EAGAIN ? -ETIMEDOUT : -ECONNRESET;
        break;
    }
    free(buf);
    if (r < 0)
        return r;
    /* Only a message that left counts: the daemon reads a gap in client_seq as a loss. */
    ch->last_client_seq = e->client_seq;
    ch->last_request_id = e->request_id;
    if (ret_request_id)
        *ret_request_id = e->request_id;
    return 0;
}

bool vase__session_closed(int session_fd) {
    char buf[512];

    if (session_fd < 0)
        return false;
    for (;;) {
        /* The daemon keeps the session silent after the welcome; whatever it might still send
         * (a farewell before it closes) is read and dropped, so the socket never stays
         * readable and a wait never spins on it. */
        ssize_t n = recv(session_fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n > 0)
            continue;
        if (n == 0)
            return true;
        if (errno == EINTR)
            continue;
        return errno != EAGAIN && errno != EWOULDBLOCK;
    }
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Receives one message without blocking. 1 and *ret, 0 if nothing has arrived, -errno. */
static int recv_one(struct vase__chan *ch, Vase__Envelope **ret) {
    zmq_msg_t msg;
    int r;

    zmq_msg_init(&msg);
    for (;;) {
        if (zmq_msg_recv(&msg, ch->sock, ZMQ_DONTWAIT) >= 0)
            break;
        if (errno == EINTR)
            continue;
        r = errno == EAGAIN ? 0 : -ECONNRESET;
        zmq_msg_close(&msg);
        return r;
    }
    bool multipart = zmq_msg_more(&msg);
    Vase__Envelope *e = NULL;
    r = multipart
            ? -EBADMSG
            : vase_wire_unpack(zmq_msg_data(&msg), zmq_msg_size(&msg), ch->max_message_bytes, &e);
    zmq_msg_close(&msg);
    /* A reply is exactly one frame; the rest of a multi-frame message is read and dropped so
     * the next receive starts at a message boundary. */
    while (multipart) {
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, ch->sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&msg);
            break;
        }
        multipart = zmq_msg_more(&msg);
        zmq_msg_close(&msg);
    }
    if (r < 0) {
        if (e)
            vase__envelope__free_unpacked(e, NULL);
        return r;
    }
    /* Only ids this channel handed out count: a reply that echoes another can prove nothing. */
    if (e->request_id > ch->answered && e->request_id <= ch->last_request_id)
        ch->answered = e->request_id;
    *ret = e;
    return 1;
}

uint64_t vase__chan_answered(const struct vase__chan *ch) {
    return ch->answered;
}

const char *vase__chan_last_error(const struct vase__chan *ch) {
    return ch->last_error;
}

/* Hands a reply nobody waits for to the owner's callback, then queues or frees it. */
static int sort_unclaimed(struct vase__chan *ch, Vase__Envelope *e) {
    if (ch->unclaimed && !ch->unclaimed(ch->userdata, e)) {
        vase__envelope__free_unpacked(e, NULL);
        return 0;
    }
    return vase__replyq_push(&ch->queue, e);
}

int vase__chan_wait(struct vase__chan *ch, uint64_t request_id, int timeout_ms,
                    Vase__Envelope **ret) {
    if (timeout_ms < 0)
        timeout_ms = ch->timeout_ms;
    int64_t deadline = now_ms() + timeout_ms;

    for (;;) {
        Vase__Envelope *e = vase__replyq_take(&ch->queue, request_id);
        if (e) {
            *ret = e;
            return 0;
        }
        /* Read everything that is there before sleeping: a reply queued behind others must not
         * wait for another wake-up. */
        int r = recv_one(ch, &e);
        if (r < 0)
            return r;
        if (r > 0) {
            if (e->request_id == request_id) {
                *ret = e;
                return 0;
            }
            r = sort_unclaimed(ch, e);
            if (r < 0)
                return r;
            continue;
        }
        if (vase__session_closed(ch->session_fd))
            return -ECONNRESET;
        int64_t left = deadline - now_ms();
        if (left <= 0)
            return timeout_ms == 0 ? -EAGAIN : -ETIMEDOUT;

        zmq_pollitem_t items[2] = {
            {.socket = ch->sock, .events = ZMQ_POLLIN},
            {.socket = NULL, .fd = ch->session_fd, .events = ZMQ_POLLIN},
        };
        int n = zmq_poll(items, ch->session_fd >= 0 ? 2 : 1, (long)left);
        if (n < 0 && errno != EINTR)
            return -ECONNRESET;
        /* Whatever woke us (a reply, the session closing, a signal) is examined at the top of
         * the loop. */
    }
}

int vase__chan_drain(struct vase__chan *ch) {
    for (;;) {
        Vase__Envelope *e;
        int r = recv_one(ch, &e);
        if (r < 0)
            return r;
        if (r == 0)
            break;
        r = sort_unclaimed(ch, e);
        if (r < 0)
            return r;
    }
    return vase__session_closed(ch->session_fd) ? -ECONNRESET : 0;
}

void vase__chan_drop(struct vase__chan *ch, uint64_t request_id) {
    vase__replyq_drop(&ch->queue, request_id);
}

int vase__error_code(const Vase__Error *err) {
    if (!err)
        return -EPROTO;
    /* errno values and the codes of vase_errors.h, which both ends share, come back negated. */
    if (err->code > 0 && err->code < 4096)
        return -err->code;
    return -EPROTO;
}

int vase__chan_call(struct vase__chan *ch, Vase__Envelope *e, Vase__Envelope__BodyCase expect,
                    Vase__Envelope **ret) {
    return vase__chan_call_wait(ch, e, expect, -1, ret);
}

int vase__chan_call_wait(struct vase__chan *ch, Vase__Envelope *e, Vase__Envelope__BodyCase expect,
                         int timeout_ms, Vase__Envelope **ret) {
    uint64_t id;
    Vase__Envelope *reply;

    ch->last_error[0] = '\0';
    int r = vase__chan_send(ch, e, &id);
    if (r < 0)
        return r;
    r = vase__chan_wait(ch, id, timeout_ms, &reply);
    if (r < 0)
        return r;
    return vase__chan_reply(ch, reply, expect, ret);
}

int vase__chan_reply(struct vase__chan *ch, Vase__Envelope *reply, Vase__Envelope__BodyCase expect,
                     Vase__Envelope **ret) {
    int r;
    ch->last_error[0] = '\0';
    if (reply->body_case == VASE__ENVELOPE__BODY_ERROR) {
        if (reply->error && reply->error->message)
            /* The daemon's words, bounded and escaped: they reach terminals and logs. */
            vase_wire_escape(reply->error->message, ch->last_error, sizeof(ch->last_error));
        r = vase__error_code(reply->error);
        vase__envelope__free_unpacked(reply, NULL);
        return r;
    }
    if (reply->body_case != expect) {
        vase__envelope__free_unpacked(reply, NULL);
        return -EPROTO;
    }
    *ret = reply;
    return 0;
}
