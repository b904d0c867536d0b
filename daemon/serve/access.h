/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * Who may do what, decided from the credentials the kernel gave for a connection (SO_PEERCRED on
 * the session socket, libzmq's peer address on the control and event sockets), never from
 * anything a message says.
 */

#include <stdbool.h>
#include <sys/socket.h>

struct vased;
struct vased_peer;
struct vased_client;
struct vased_seq;

/* What the peer with cred may do: allowed by allow_users/allow_groups, admin, and the arenas it
 * may use. 0 or -ENOMEM; *ret is untouched on failure. */
int vase_access_lookup(const struct vased *d, const struct ucred *cred, struct vased_peer *ret);

/* Whether a listing shows client c / sequence s to who: admins see everything; others their own
 * uid's clients and sequences, and those in the arenas they may use (which they could read
 * anyway). */
/* Whether the per-uid caps (max_sessions_per_uid, max_seqs_per_uid, max_waiting_opens_per_uid,
 * max_stats_bytes_per_uid) apply to uid: to every uid but root and the daemon's own, who may
 * change those caps anyway. */
bool vase_access_uid_capped(const struct vased *d, uid_t uid);

bool vase_access_client_visible(const struct vased_peer *who, const struct vased_client *c);
bool vase_access_seq_visible(const struct vased_peer *who, const struct vased_seq *s);
