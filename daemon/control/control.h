/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The control socket: a ZeroMQ ROUTER at ipc://RUNTIME/control.sock. Frames are checked
 * (size before unpacking, version, body, incarnation, session, client_seq) by pure functions
 * that the tests call without sockets, then authorized and dispatched to the handlers of
 * PROTOCOL.md (engine.h, cycle.h, admin.h).
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "vase.pb-c.h"

struct vased;

/* An error reply to be sent: a positive errno or vase code, and what was wrong. */
struct vase_control_error {
    int code;
    uint64_t request_id;
    char message[256];
};

/*
 * Checks and unpacks one frame: -EMSGSIZE if len > max (before anything is parsed), -EBADMSG
 * if it does not unpack, -VASE_EPROTOVERSION for another version, -EINVAL for no body or a
 * body that is not a request. On failure *err says what to reply (request_id echoed where the
 * frame could be read) and nothing is returned in *ret; on success *ret must be freed with
 * vase__envelope__free_unpacked().
 */
int vase_control_unpack(const void *buf, size_t len, size_t max, Vase__Envelope **ret,
                        struct vase_control_error *err);

/*
 * The peer checks of PROTOCOL.md "Control" for an unpacked envelope: incarnation (0 or the
 * daemon's for admin requests, the daemon's for the others: VASE_ESTALE), a live session
 * for engine requests (ENOTCONN; has_session false), and for a peer with a session a client_seq
 * larger than *last_client_seq (EPROTO), which is then advanced; *ret_lost (may be NULL) is how
 * many client_seq values were skipped (0 without a gap). 0, or -code with *err filled. Nothing
 * is logged here: a peer decides how often this runs.
 */
int vase_control_check_peer(const Vase__Envelope *e, uint64_t incarnation, bool has_session,
                            uint64_t *last_client_seq, uint64_t *ret_lost,
                            struct vase_control_error *err);

/*
 * The credentials of the process at the other end of an ipc connection, from the "Peer-Address"
 * property of a message received on it: libzmq takes them from SO_PEERCRED and appends
 * ":uid:gid:pid". 0, or -ENODATA if the address does not end that way.
 */
int vase_control_peer_cred(const char *peer_address, struct ucred *ret);

/* Who may send a request, decided from the kernel's credentials of the connection, never from
 * anything in the message. */
enum vase_control_access {
    VASE_CONTROL_ACCESS_ANY,     /* anyone who can open the socket: Ping, Status, ConfigGet */
    VASE_CONTROL_ACCESS_ALLOWED, /* a uid the allow-list admits: ListClients, ListSeqs, GetSeq */
    VASE_CONTROL_ACCESS_ADMIN,   /* root, the daemon's user, admin_group: ConfigSet */
    VASE_CONTROL_ACCESS_SESSION, /* the client whose token routes it, from its own uid */
};
enum vase_control_access vase_control_access_of(Vase__Envelope__BodyCase body);

/* Creates and binds the ROUTER (linger 0, bounded send timeout, ROUTER_MANDATORY off, inbound
 * size cut off at max_message_bytes plus a margin). 0 or -errno, logged. */
int vase_control_open(void *zmq_ctx, const char *endpoint, uint64_t max_message_bytes, void **ret);

/* Handles the messages waiting on the ROUTER (a bounded number per call): each is checked,
 * authorized and passed to its handler, or refused with an Error. */
void vase_control_process(struct vased *d);
