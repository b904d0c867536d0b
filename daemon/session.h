/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The session socket: AF_UNIX SOCK_SEQPACKET at RUNTIME/session.sock. A client's identity comes
 * from SO_PEERCRED and is checked against the allow-list; the welcome carries the arena file
 * descriptors with SCM_RIGHTS; the socket then stays open for the client's life, so the kernel
 * tells the daemon when a client dies. This module has the socket primitives and the allow-list;
 * vased.c drives the handshake.
 */

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "vase.pb-c.h"

/* Largest session packet accepted (a SessionHello is tiny). */
#define VASE_SESSION_MAX_PACKET (64u << 10)

struct vase_allow {
    uid_t *uids;
    size_t n_uids;
    gid_t *gids;
    size_t n_gids;
};

/*
 * Parses allow_users and allow_groups (names or numeric ids, separated by commas or blanks)
 * into *ret. Names that do not resolve are logged and left out (denying more, never less).
 * 0 or -ENOMEM.
 */
int vase_allow_parse(const char *users, const char *groups, struct vase_allow *ret);
void vase_allow_done(struct vase_allow *a);

/*
 * The access decision, with no system calls: 0 if a peer with uid, primary gid and
 * supplementary groups[0..n_groups) may open a session, -EPERM otherwise. Root and self_uid
 * (the daemon's own user) are always admitted; with both lists empty no one else is.
 */
int vase_allow_check(const struct vase_allow *a, uid_t self_uid, uid_t uid, gid_t gid,
                     const gid_t *groups, size_t n_groups);

/* The supplementary groups of uid (getgrouplist of its user name), malloc'd into *ret.
 * 0 (possibly with *ret_n 0 for a uid with no passwd entry) or -ENOMEM. */
int vase_session_peer_groups(uid_t uid, gid_t gid, gid_t **ret, size_t *ret_n);

/*
 * Prepares path for binding: 0 if nothing is there or a stale socket (no one listening) was
 * removed; -EADDRINUSE if something answers on it (another live daemon); -EEXIST if it is not a
 * socket. type is SOCK_SEQPACKET (session) or SOCK_STREAM (ZeroMQ ipc).
 */
int vase_session_probe(const char *path, int type);

/* A non-blocking, close-on-exec SEQPACKET listener at path. 0 or -errno. */
int vase_session_listen(const char *path, int *ret_fd);
/* Accepts one connection (SOCK_CLOEXEC|SOCK_NONBLOCK) and reads its SO_PEERCRED. 0, -EAGAIN,
 * or -errno. */
int vase_session_accept(int listen_fd, int *ret_fd, struct ucred *ret_cred);

/* Receives one envelope. -EAGAIN (nothing yet), -ECONNRESET (peer closed), -EMSGSIZE,
 * -EBADMSG, -VASE_WIRE_EPROTOVERSION (*ret set), -EINVAL (no body; *ret set). */
int vase_session_recv(int fd, Vase__Envelope **ret);
/* Sends one envelope with fds attached (SCM_RIGHTS), without blocking. 0 or -errno. */
int vase_session_send(int fd, const Vase__Envelope *e, const int *fds, size_t n_fds);
/* Sends an Error envelope (code: positive errno or vase code). 0 or -errno. */
int vase_session_send_error(int fd, uint64_t incarnation, int code, const char *message);
