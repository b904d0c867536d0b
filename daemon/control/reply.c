/* SPDX-License-Identifier: MIT */

/*
 * Replies on the control socket. Every reply echoes the request id of the frame it answers and
 * carries the daemon's incarnation; sending never blocks the main loop (ROUTER_MANDATORY is off
 * and the socket has a bounded send timeout), so a peer that vanished or stopped reading costs a
 * dropped reply, nothing more. Error replies are counted: those to administrative requests in
 * admin_errors_total (an operator's typo is not an engine failure), the rest in errors_total.
 * Listings (clients, sequences, settings) are sent by one function whatever their message.
 */

#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <zmq.h>

#include "core/log.h"
#include "core/registry.h"
#include "reply.h"
#include "state.h"
#include "wire.h"

static void count_error(struct vased *d, const struct vase_reply_to *p) {
    unsigned type = vase_metrics_msg_index(p->body);
    if (p->admin) {
        d->admin_errors_total++;
        d->metrics.admin_errors[type]++;
    } else {
        d->errors_total++;
        d->metrics.engine_errors[type]++;
    }
}

/* A reply that cannot be packed for want of memory still gets an answer, an ENOMEM Error small
 * enough to pack on the stack, so that the peer is not left waiting for its timeout. */
static void send_enomem(struct vased *d, const struct vase_reply_to *p) {
    Vase__Error err = VASE__ERROR__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    uint8_t buf[128];

    err.code = ENOMEM;
    err.message = "out of memory";
    e.version = VASE_WIRE_VERSION;
    e.incarnation = d->incarnation;
    e.request_id = p->request_id;
    e.body_case = VASE__ENVELOPE__BODY_ERROR;
    e.error = &err;
    size_t len = vase__envelope__get_packed_size(&e);
    if (len > sizeof(buf))
        return;
    vase__envelope__pack(&e, buf);
    count_error(d, p);
    if (zmq_send(d->router, p->id, p->id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(d->router, buf, len, ZMQ_DONTWAIT) < 0)
        log_debug("Dropped an out-of-memory reply: %s", zmq_strerror(zmq_errno()));
}

int vase_reply_send(struct vased *d, const struct vase_reply_to *p, Vase__Envelope *e) {
    void *buf;
    size_t len;

    e->version = VASE_WIRE_VERSION;
    e->incarnation = d->incarnation;
    e->request_id = p->request_id;
    if (vase_wire_pack(e, &buf, &len) < 0) {
        send_enomem(d, p);
        return log_oom();
    }
    /* ROUTER_MANDATORY is off: a reply to a vanished peer is dropped, never blocks. */
    if (zmq_send(d->router, p->id, p->id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(d->router, buf, len, ZMQ_DONTWAIT) < 0)
        log_debug("Dropped a %s reply: %s", vase_wire_body_name(e), zmq_strerror(zmq_errno()));
    free(buf);
    return 0;
}

int vase_reply_error(struct vased *d, const struct vase_reply_to *p, int code, const char *fmt,
                     ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);

    Vase__Error err = VASE__ERROR__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    err.code = code;
    err.message = msg;
    e.body_case = VASE__ENVELOPE__BODY_ERROR;
    e.error = &err;
    count_error(d, p);
    log_debug("Error reply %d to request %llu: %s", code, (unsigned long long)p->request_id, msg);
    vase_reply_send(d, p, &e);
    return -code;
}

ProtobufCMessage **vase_reply_repeated_new(size_t n, size_t size) {
    size_t align = _Alignof(max_align_t), head, total;
    ProtobufCMessage **ptrs;

    /* The messages start at the first offset after the pointers that is aligned for anything. */
    if (__builtin_mul_overflow(n, sizeof(*ptrs), &head) ||
        __builtin_add_overflow(head, align - 1, &head))
        return NULL;
    head -= head % align;
    if (__builtin_mul_overflow(n, size, &total) || __builtin_add_overflow(total, head, &total))
        return NULL;
    ptrs = calloc(1, total ? total : 1);
    if (!ptrs)
        return NULL;
    for (size_t i = 0; i < n; i++)
        ptrs[i] = (ProtobufCMessage *)((char *)ptrs + head + i * size);
    return ptrs;
}

int vase_reply_listing(struct vased *d, const struct vase_reply_to *to,
                       Vase__Envelope__BodyCase body, ProtobufCMessage **entries, size_t n) {
    Vase__ClientsReply clients = VASE__CLIENTS_REPLY__INIT;
    Vase__SeqsReply seqs = VASE__SEQS_REPLY__INIT;
    Vase__ConfigReply config = VASE__CONFIG_REPLY__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;

    e.body_case = body;
    switch (body) {
    case VASE__ENVELOPE__BODY_CLIENTS_REPLY:
        clients.n_clients = n;
        clients.clients = (Vase__ClientInfo **)entries;
        e.clients_reply = &clients;
        break;
    case VASE__ENVELOPE__BODY_SEQS_REPLY:
        seqs.n_seqs = n;
        seqs.seqs = (Vase__SeqInfo **)entries;
        e.seqs_reply = &seqs;
        break;
    case VASE__ENVELOPE__BODY_CONFIG_REPLY:
        config.n_entries = n;
        config.entries = (Vase__ConfigEntry **)entries;
        e.config_reply = &config;
        break;
    default:
        assert(!"vase_reply_listing: not a listing reply");
        free(entries);
        return -EINVAL;
    }
    int r = vase_reply_send(d, to, &e);
    free(entries);
    return r;
}

int vase_reply_ok(struct vased *d, const struct vase_reply_to *p) {
    Vase__Ok ok = VASE__OK__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    e.body_case = VASE__ENVELOPE__BODY_OK;
    e.ok = &ok;
    return vase_reply_send(d, p, &e);
}

struct vased_seq *vase_reply_own_seq(struct vased *d, struct vased_client *c,
                                     const struct vase_reply_to *p, uint32_t id) {
    struct vased_seq *s;
    int r = vase_registry_get_seq(d->reg, c, id, &s);
    if (r < 0)
        vase_reply_error(d, p, -r, "no sequence %u", id);
    return r < 0 ? NULL : s;
}
