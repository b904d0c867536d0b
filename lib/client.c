/* SPDX-License-Identifier: MIT */

/*
 * The client: one session, one control channel, the models and sequences opened through them,
 * and one mutex that serialises every call. The client owns its models and sequences; freeing
 * it frees them. Once the daemon is seen to be gone or restarted, the client is dead and every
 * call returns that error without touching a socket: its memory is valid only for the
 * incarnation that handed it out (docs/ARCHITECTURE.md, "Liveness").
 */

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "wire.h"

#define DEFAULT_TIMEOUT_MS 5000

int vase__client_check(struct vase_client *c, int r) {
    if (r == -ECONNRESET || r == -VASE_ESTALE)
        c->dead = r;
    return r;
}

void vase__client_lock(struct vase_client *c) {
    pthread_mutex_lock(&c->lock);
    c->last_error[0] = '\0';
}

int vase__client_fail(struct vase_client *c, int r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->last_error, sizeof(c->last_error), fmt, ap);
    va_end(ap);
    return r;
}

int vase__client_refused(struct vase_client *c, const Vase__Error *err) {
    vase_wire_escape(err && err->message ? err->message : "", c->last_error, sizeof(c->last_error));
    return vase__client_check(c, vase__error_code(err));
}

int vase__client_done(struct vase_client *c, int r) {
    r = vase__client_check(c, r);
    if (r < 0)
        snprintf(c->last_error, sizeof(c->last_error), "%s", vase__chan_last_error(c->chan));
    return r;
}

int vase__client_call(struct vase_client *c, Vase__Envelope *e, Vase__Envelope__BodyCase expect,
                      Vase__Envelope **ret) {
    return vase__client_done(c, vase__chan_call(c->chan, e, expect, ret));
}

int vase__client_call_wait(struct vase_client *c, Vase__Envelope *e,
                           Vase__Envelope__BodyCase expect, int timeout_ms, Vase__Envelope **ret) {
    return vase__client_done(c, vase__chan_call_wait(c->chan, e, expect, timeout_ms, ret));
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int vase__client_call_unlocked(struct vase_client *c, Vase__Envelope *e,
                               Vase__Envelope__BodyCase expect, int timeout_ms,
                               Vase__Envelope **ret) {
    Vase__Envelope *reply = NULL;
    uint64_t id;

    int r = vase__chan_send(c->chan, e, &id);
    if (r < 0)
        return vase__client_done(c, r);
    /* Whichever thread reads the reply keeps it for this one (vase__client_unclaimed()). */
    struct vase__waiting w = {.id = id, .next = c->waiting};
    c->waiting = &w;
    int64_t deadline = now_ms() + (timeout_ms < 0 ? vase__chan_timeout(c->chan) : timeout_ms);
    for (;;) {
        r = vase__chan_wait(c->chan, id, 0, &reply);
        if (r != -EAGAIN)
            break;
        if (now_ms() >= deadline) {
            r = -ETIMEDOUT;
            break;
        }
        pthread_mutex_unlock(&c->lock);
        poll(NULL, 0, VASE__UNLOCKED_POLL_MS);
        pthread_mutex_lock(&c->lock);
    }
    for (struct vase__waiting **p = &c->waiting; *p; p = &(*p)->next)
        if (*p == &w) {
            *p = w.next;
            break;
        }
    if (r < 0) {
        vase__chan_drop(c->chan, id);
        return vase__client_done(c, r);
    }
    return vase__client_done(c, vase__chan_reply(c->chan, reply, expect, ret));
}

void vase__client_note_stats(struct vase_client *c, uint64_t request_id, uint32_t seq_id) {
    c->stats_ids[c->stats_next] = request_id;
    c->stats_seqs[c->stats_next] = seq_id;
    c->stats_next = (c->stats_next + 1) % VASE__STATS_RING;
}

bool vase__client_unclaimed(void *userdata, const Vase__Envelope *e) {
    struct vase_client *c = userdata;

    for (const struct vase__waiting *w = c->waiting; w; w = w->next)
        if (w->id == e->request_id)
            return true;
    for (const struct vase_open *o = c->opens; o; o = o->next)
        if (o->id == e->request_id)
            return true;
    for (struct vase__abandoned **p = &c->abandoned; *p; p = &(*p)->next) {
        struct vase__abandoned *a = *p;
        if (a->id != e->request_id)
            continue;
        /* Admitted after all: the sequence goes back at once (its Ok is not waited for). */
        if (e->body_case == VASE__ENVELOPE__BODY_SEQ_LAYOUT && e->seq_layout) {
            Vase__CloseSeq cs = VASE__CLOSE_SEQ__INIT;
            Vase__Envelope close = VASE__ENVELOPE__INIT;
            cs.seq_id = e->seq_layout->seq_id;
            close.body_case = VASE__ENVELOPE__BODY_CLOSE_SEQ;
            close.close_seq = &cs;
            (void)vase__client_check(c, vase__chan_send(c->chan, &close, NULL));
        }
        *p = a->next;
        free(a);
        return false;
    }
    for (struct vase_seq *s = c->seqs; s; s = s->next)
        if ((s->pending && s->pending_id == e->request_id) ||
            (s->commit_pending && s->commit_id == e->request_id))
            return true;
    if (e->body_case != VASE__ENVELOPE__BODY_ERROR || e->request_id == 0)
        return false;
    /* A refused stats push: the sequence learns of it on its next call. */
    int err = vase__error_code(e->error);
    vase__client_check(c, err);
    for (size_t i = 0; i < VASE__STATS_RING; i++) {
        if (c->stats_ids[i] != e->request_id)
            continue;
        for (struct vase_seq *s = c->seqs; s; s = s->next)
            if (s->id == c->stats_seqs[i] && s->deferred_error == 0) {
                s->deferred_error = err;
                vase_wire_escape(e->error && e->error->message ? e->error->message : "",
                                 s->deferred_message, sizeof(s->deferred_message));
            }
        break;
    }
    return false;
}

void vase__client_abandon_open(struct vase_client *c, uint64_t id) {
    /* Out of memory, the sequence, if admitted, stays the client's until it disconnects. */
    struct vase__abandoned *a = malloc(sizeof(*a));
    if (!a)
        return;
    *a = (struct vase__abandoned){.id = id, .next = c->abandoned};
    c->abandoned = a;
}

void vase__client_free_objects(struct vase_client *c) {
    while (c->opens) {
        struct vase_open *o = c->opens;
        c->opens = o->next;
        free(o);
    }
    while (c->abandoned) {
        struct vase__abandoned *a = c->abandoned;
        c->abandoned = a->next;
        free(a);
    }
    while (c->seqs) {
        struct vase_seq *s = c->seqs;
        c->seqs = s->next;
        vase__seq_free(s);
    }
    while (c->models) {
        struct vase_model *m = c->models;
        c->models = m->next;
        vase__model_free(m);
    }
}

int vase_connect(const struct vase_connect_options *opts, struct vase_client **ret) {
    struct vase_connect_options o = opts ? *opts : (struct vase_connect_options){0};
    char dir[4096];
    int r;

    if (!ret || o.timeout_ms < 0)
        return -EINVAL;
    if (o.timeout_ms == 0)
        o.timeout_ms = DEFAULT_TIMEOUT_MS;
    if (!o.name)
        o.name = program_invocation_short_name;
    r = vase__runtime_dir(o.runtime_dir, dir, sizeof(dir));
    if (r < 0)
        return r;

    struct vase_client *c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    c->timeout_ms = o.timeout_ms;
    vase__session_init(&c->session);
    r = -pthread_mutex_init(&c->lock, NULL);
    if (r < 0)
        goto fail_client;

    r = vase__session_open(dir, o.name, o.timeout_ms, &c->session);
    if (r < 0)
        goto fail_lock;

    struct vase__chan_options co = {
        .endpoint = c->session.control_endpoint,
        .routing_id = c->session.token,
        .routing_id_len = c->session.token_len,
        .timeout_ms = o.timeout_ms,
        .max_message_bytes = c->session.max_message_bytes,
        .session_fd = c->session.fd,
        .unclaimed = vase__client_unclaimed,
        .userdata = c,
    };
    r = vase__chan_new(&co, &c->chan);
    if (r < 0)
        goto fail_session;
    vase__chan_set_incarnation(c->chan, c->session.incarnation);

    /* The session proves who we are; a Ping proves the control path works before the engine
     * relies on it. */
    r = vase_ping(c);
    if (r < 0)
        goto fail_chan;
    *ret = c;
    return 0;

fail_chan:
    vase__chan_free(c->chan);
fail_session:
    vase__session_close(&c->session);
fail_lock:
    pthread_mutex_destroy(&c->lock);
fail_client:
    free(c);
    return r;
}

struct vase_client *vase_disconnect(struct vase_client *c) {
    if (!c)
        return NULL;
    /* The daemon ends every sequence of a client whose session closes, so no CloseSeq is sent:
     * the local state is freed, the arenas unmapped, and then the session closed. */
    vase__chan_free(c->chan);
    vase__client_free_objects(c);
    vase__session_close(&c->session);
    pthread_mutex_destroy(&c->lock);
    free(c);
    return NULL;
}

uint64_t vase_client_incarnation(const struct vase_client *c) {
    return c ? c->session.incarnation : 0;
}

uint32_t vase_client_id(const struct vase_client *c) {
    return c ? c->session.client_id : 0;
}

const char *vase_last_error(struct vase_client *c) {
    return c ? c->last_error : "";
}

int vase__client_ping(struct vase_client *c) {
    Vase__Ping ping = VASE__PING__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    Vase__Envelope *reply;
    uint8_t payload[8];

    if (c->dead)
        return c->dead;
    /* A payload unique to this ping, so an echo of another one cannot pass for it. */
    uint64_t tag = ++c->pings;
    memcpy(payload, &tag, sizeof(payload));
    ping.payload = (ProtobufCBinaryData){.len = sizeof(payload), .data = payload};
    e.body_case = VASE__ENVELOPE__BODY_PING;
    e.ping = &ping;
    int r = vase__client_call(c, &e, VASE__ENVELOPE__BODY_PONG, &reply);
    if (r < 0)
        return r;
    if (reply->pong->payload.len != sizeof(payload) ||
        memcmp(reply->pong->payload.data, payload, sizeof(payload)) != 0)
        r = -EPROTO;
    vase__envelope__free_unpacked(reply, NULL);
    return r;
}

int vase_ping(struct vase_client *c) {
    if (!c)
        return -EINVAL;
    vase__client_lock(c);
    int r = vase__client_ping(c);
    pthread_mutex_unlock(&c->lock);
    return r;
}
