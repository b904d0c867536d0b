/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * Replies on the control socket, shared by every request handler: one envelope to the peer that
 * asked, an Error naming the problem, Ok, and the repeated fields of listings.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "vase.pb-c.h"

struct vased;
struct vased_client;
struct vased_seq;

/* Where a reply goes: the ROUTER routing id and request id of the frame being answered, and the
 * kernel's credentials of the connection it came over. */
struct vase_reply_to {
    const void *id;
    size_t id_len;
    uint64_t request_id;
    bool admin;        /* an administrative request: its errors count in admin_errors_total */
    int body;          /* the request's envelope body number (metrics); 0: not readable */
    bool cred_known;   /* false: the transport did not say (never on ipc) */
    struct ucred cred; /* the kernel's, for the connection the frame came over */
};

/* Sends e (version, incarnation and request id filled in) to the peer. Never blocks: a reply to a
 * vanished peer is dropped. 0, or -ENOMEM (logged). */
int vase_reply_send(struct vased *d, const struct vase_reply_to *to, Vase__Envelope *e);

/* Sends an Error with code (a positive errno or vase code) and the formatted message, and counts
 * it (in admin_errors_total when to->admin, else errors_total). Returns -code, so a handler can
 * return it. */
int vase_reply_error(struct vased *d, const struct vase_reply_to *to, int code, const char *fmt,
                     ...) __attribute__((format(printf, 4, 5)));

/* Sends Ok. 0, or -ENOMEM (logged). */
int vase_reply_ok(struct vased *d, const struct vase_reply_to *to);

/*
 * The entries of a repeated message field in one zeroed allocation: the array of n pointers that
 * protobuf-c packs, then the n messages of size bytes they point to. The caller initialises each
 * message through its pointer and frees the array with free(). n may be 0. NULL when out of
 * memory.
 */
ProtobufCMessage **vase_reply_repeated_new(size_t n, size_t size);

/*
 * Sends a listing: the envelope's body is the reply message of body (ClientsReply, SeqsReply,
 * ConfigReply: one repeated field of messages), whose field holds the n entries of entries (made
 * by vase_reply_repeated_new()). Frees entries (not what the messages point to). 0, or -ENOMEM
 * (logged).
 */
int vase_reply_listing(struct vased *d, const struct vase_reply_to *to,
                       Vase__Envelope__BodyCase body, ProtobufCMessage **entries, size_t n);

/* Client c's sequence id, or NULL after replying ENOENT (no such sequence) or EPERM (another
 * client's) itself. */
struct vased_seq *vase_reply_own_seq(struct vased *d, struct vased_client *c,
                                     const struct vase_reply_to *to, uint32_t id);
