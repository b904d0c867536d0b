/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The session socket: AF_UNIX SOCK_SEQPACKET at RUNTIME/session.sock. A client's identity comes
 * from SO_PEERCRED and is checked against the allow-list (allow.h); the welcome carries the arena
 * file descriptors with SCM_RIGHTS; the socket then stays open for the client's life, so the kernel
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

/*
 * Prepares path for binding: 0 if nothing is there or a stale socket (no one listening) was
 * removed; -EADDRINUSE if something answers on it (another live daemon); -EEXIST if it is not a
 * socket. type is SOCK_SEQPACKET (session) or SOCK_STREAM (ZeroMQ ipc).
 */
int vase_session_probe(const char *path, int type);

/* A non-blocking, close-on-exec SEQPACKET listener at path. 0 or -errno. */
int vase_session_listen(const char *path, int *ret_fd);
/*
 * Takes over a listener that systemd passed (socket activation): it must be an AF_UNIX
 * SOCK_SEQPACKET socket that listens (-ENOTSOCK otherwise) bound to path (-EADDRNOTAVAIL
 * otherwise); it is made close-on-exec and non-blocking. 0 or -errno; the fd stays the caller's
 * either way.
 */
int vase_session_adopt(int fd, const char *path);
/* Accepts one connection (SOCK_CLOEXEC|SOCK_NONBLOCK) and reads its SO_PEERCRED. 0, -EAGAIN,
 * or -errno. */
int vase_session_accept(int listen_fd, int *ret_fd, struct ucred *ret_cred);

/* Receives one envelope. -EAGAIN (nothing yet), -ECONNRESET (peer closed), -EMSGSIZE,
 * -EBADMSG, -VASE_EPROTOVERSION (*ret set), -EINVAL (no body; *ret set). */
int vase_session_recv(int fd, Vase__Envelope **ret);
/* Sends one envelope with fds attached (SCM_RIGHTS), without blocking. 0 or -errno. */
int vase_session_send(int fd, const Vase__Envelope *e, const int *fds, size_t n_fds);
/* Sends an Error envelope (code: positive errno or vase code). 0 or -errno. */
int vase_session_send_error(int fd, uint64_t incarnation, int code, const char *message);
