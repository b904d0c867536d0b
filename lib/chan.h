/* SPDX-License-Identifier: MIT */
#pragma once

/* The control channel: a ZeroMQ DEALER to vased's ROUTER carrying one Envelope per frame,
 * request ids, client sequence numbers, the incarnation, bounded waits, the reply queue and
 * (for engines) the liveness of the session socket. libvase and vasectl both use it. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "replyq.h"
#include "vase.pb-c.h"

struct vase__chan;

/* Decides what happens to a reply nobody is waiting for: return true to keep it in the reply
 * queue, false to have it freed. It may look at e but must not keep pointers into it. */
typedef bool (*vase__chan_unclaimed_fn)(void *userdata, const Vase__Envelope *e);

struct vase__chan_options {
    const char *endpoint;   /* "ipc:///run/vase/control.sock" */
    const void *routing_id; /* NULL: ZeroMQ picks one (vasectl) */
    size_t routing_id_len;
    int timeout_ms;                    /* > 0 */
    size_t max_message_bytes;          /* 0: VASE_WIRE_DEFAULT_MAX */
    int session_fd;                    /* -1: none; else watched in every wait, not owned */
    vase__chan_unclaimed_fn unclaimed; /* NULL: keep every unclaimed reply */
    void *userdata;
};

/* Creates the ZeroMQ context and the connected DEALER. 0 and *ret, or -errno. */
int vase__chan_new(const struct vase__chan_options *o, struct vase__chan **ret);
/* Closes the socket (linger 0) and the context; accepts NULL; returns NULL. */
struct vase__chan *vase__chan_free(struct vase__chan *ch);

/* The incarnation stamped on every request (0 until set). */
void vase__chan_set_incarnation(struct vase__chan *ch, uint64_t incarnation);
uint64_t vase__chan_incarnation(const struct vase__chan *ch);
int vase__chan_timeout(const struct vase__chan *ch);

/*
 * Sends e (its body set by the caller) after filling version, incarnation, client_seq and a
 * fresh request_id, returned in *ret_request_id (may be NULL). e stays the caller's. 0,
 * -EMSGSIZE (larger than the daemon accepts), -ETIMEDOUT (the send queue stayed full),
 * -ECONNRESET (the session socket closed), -ENOMEM.
 */
int vase__chan_send(struct vase__chan *ch, Vase__Envelope *e, uint64_t *ret_request_id);

/*
 * Waits for the reply to request_id, until timeout_ms from now (0: only what has already
 * arrived; < 0: the channel's timeout). Replies to other requests go through the unclaimed
 * callback into the reply queue. Returns 0 and *ret (the caller frees it with
 * vase__envelope__free_unpacked), -EAGAIN when timeout_ms is 0 and it has not arrived,
 * -ETIMEDOUT, -ECONNRESET (the session socket closed), -EBADMSG/-VASE_EPROTOVERSION for a
 * reply that does not unpack, -EINTR never (signals restart the wait).
 */
int vase__chan_wait(struct vase__chan *ch, uint64_t request_id, int timeout_ms,
                    Vase__Envelope **ret);
/* Receives whatever has arrived without blocking, sorting it as vase__chan_wait() does. 0 or
 * the errors of vase__chan_wait() other than -EAGAIN/-ETIMEDOUT. */
int vase__chan_drain(struct vase__chan *ch);
/* The highest request id whose reply has been received (0: none yet), whether a wait took it or
 * it was sorted as unclaimed. The daemon handles one peer's requests in the order they were
 * sent (PROTOCOL.md), so every request up to this id has been handled. */
uint64_t vase__chan_answered(const struct vase__chan *ch);
/* Forgets a queued reply to request_id, if any. */
void vase__chan_drop(struct vase__chan *ch, uint64_t request_id);

/* The message of the Error that answered the last vase__chan_call() ("" if that call got
 * another reply or none). Replies that other waits receive do not change it. Valid until the
 * next vase__chan_call(). */
const char *vase__chan_last_error(const struct vase__chan *ch);

/* Maps an Error body to a negative return: errno values negated, 1000 and 1001 to
 * -VASE_EPROTOVERSION and -VASE_ESTALE, anything else to -EPROTO. */
int vase__error_code(const Vase__Error *err);

/*
 * Sends e and waits for its reply, which must have body case expect (or be an Error, returned
 * as vase__error_code()). 0 and *ret (caller frees), -EPROTO for a reply of another kind, or
 * the errors of vase__chan_send()/vase__chan_wait().
 */
int vase__chan_call(struct vase__chan *ch, Vase__Envelope *e, Vase__Envelope__BodyCase expect,
                    Vase__Envelope **ret);
/* vase__chan_call() whose wait for the reply lasts timeout_ms (< 0: the channel's timeout). */
int vase__chan_call_wait(struct vase__chan *ch, Vase__Envelope *e, Vase__Envelope__BodyCase expect,
                         int timeout_ms, Vase__Envelope **ret);
/* The end of a call whose reply arrived: an Error becomes its code (its message kept for
 * vase__chan_last_error()), another body than expect -EPROTO; reply is freed unless returned. */
int vase__chan_reply(struct vase__chan *ch, Vase__Envelope *reply, Vase__Envelope__BodyCase expect,
                     Vase__Envelope **ret);

/* Whether the peer behind session_fd has closed it (checked without blocking). */
bool vase__session_closed(int session_fd);
