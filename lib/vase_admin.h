/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * libvase's administrative API: what vasectl, or any monitoring tool, asks vased over the
 * control socket without opening a session. Every call is one request and one reply (the
 * daemon's own checks decide who may do what: PROTOCOL.md, "Who may do what").
 *
 * Replies are the protobuf-c messages of proto/vase.proto, as the generated vase.pb-c.h
 * declares them, not copies into other structs: the schema is already the documented contract
 * of every field (PROTOCOL.md), a tool can print any reply generically through its descriptor
 * (vasectl --json does), and a field added to the schema needs no change here. These structs are
 * part of libvase.so.2's ABI: a program reads their members at the offsets of the vase.pb-c.h it
 * was built with, which is safe only while messages gain fields at their end. vase.proto states
 * the rule, and `make check` fails when a field is inserted, reordered or removed against the
 * schema of the last release (proto/released/vase.proto). Each reply is the caller's: free it
 * with protobuf_c_message_free_unpacked(&reply->base, NULL). Strings in
 * replies were chosen by the daemon or by other clients (a client's name): escape them before
 * they reach a terminal (vase_admin_escape()).
 *
 * Errors: every fallible call returns >= 0 on success and a negative errno (or -VASE_E*) on
 * failure, and leaves ret_* untouched then; vase_admin_last_error() has the daemon's words for
 * a refused request. A call waits at most the handle's timeout for a reply (-ETIMEDOUT).
 *
 * Threads: a handle is for one thread at a time.
 */

#include <stddef.h>
#include <stdint.h>

#include "vase.h"
#include "vase.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

struct vase_admin;
struct vase_admin_events;

/*
 * `vasectl reload PID` sends vased SIGHUP with sigqueue(3) and this value (with
 * VASE_RELOAD_FROM_UNIT or'ed in when it runs as a systemd unit's ExecReload=, as
 * `systemctl reload vased` has it), so that vased's log names the command that asked instead of
 * only the uid it ran as. The kernel's sender uid and pid are logged as well; a plain kill -HUP
 * is logged by uid and pid alone.
 */
#define VASE_RELOAD_SIGVAL 0x76617300
#define VASE_RELOAD_FROM_UNIT 0x1

struct vase_admin_options {
    const char *runtime_dir; /* NULL: $VASE_RUNTIME_DIR, else /run/vase if it exists, else ./run */
    int timeout_ms;          /* bound on every wait for the daemon; 0: 5000 */
};

/* Creates a handle for the daemon of a runtime directory; connects nothing yet. 0 and *ret;
 * -EINVAL (NULL ret, negative timeout), -ENAMETOOLONG (the directory's name), -ENOMEM. */
int vase_admin_new(const struct vase_admin_options *opts, struct vase_admin **ret);
/* Closes the connections of a and frees it. Accepts NULL; returns NULL. */
struct vase_admin *vase_admin_free(struct vase_admin *a);

/* Connects to <runtime_dir>/control.sock. ZeroMQ itself would connect in the background and
 * only time out, so the usual reasons are found first: -ENOENT (no socket), -EACCES (no
 * permission), -ENOTSOCK; also -EALREADY (connected), -ENOMEM, other -errno of ZeroMQ. */
int vase_admin_connect(struct vase_admin *a);

/* The runtime directory and the control socket's path in it, for messages. Never NULL. */
const char *vase_admin_runtime_dir(const struct vase_admin *a);
const char *vase_admin_path(const struct vase_admin *a);
/* The handle's timeout in milliseconds. */
int vase_admin_timeout(const struct vase_admin *a);
/* Why the last call failed, in words: the daemon's message for a refused request, or what was
 * wrong with its reply; "" when there is nothing to add to vase_strerror(). Valid until the
 * next call on a. Never NULL. */
const char *vase_admin_last_error(const struct vase_admin *a);

/*
 * The requests. Each returns 0 and the reply in *ret (the caller's), or: -ENOTCONN (not
 * connected), -ETIMEDOUT (no reply within the timeout), -EPROTO (a reply of another kind), the
 * daemon's refusal as -errno (-EPERM, -ENOENT for an unknown sequence or setting, -EINVAL for
 * a value out of range, ...), -VASE_EPROTOVERSION, -ENOMEM. vase_admin_seqs() with client_id 0
 * lists every client's sequences; vase_admin_config_get() with key NULL lists every setting.
 */
int vase_admin_ping(struct vase_admin *a, uint64_t *ret_incarnation);
int vase_admin_status(struct vase_admin *a, Vase__StatusReply **ret);
int vase_admin_clients(struct vase_admin *a, Vase__ClientsReply **ret);
int vase_admin_seqs(struct vase_admin *a, uint32_t client_id, Vase__SeqsReply **ret);
int vase_admin_seq(struct vase_admin *a, uint32_t seq_id, Vase__SeqInfo **ret);
int vase_admin_config_get(struct vase_admin *a, const char *key, Vase__ConfigReply **ret);
/* Changes a runtime setting; the reply holds the setting as it now is (ConfigEntry.source
 * "runtime (uid N)"). A reload (SIGHUP) keeps the value unless the configuration files change
 * the key; a restart forgets it. */
int vase_admin_config_set(struct vase_admin *a, const char *key, const char *value,
                          Vase__ConfigReply **ret);
/* The same, and the daemon writes the value into its drop-in vased.conf.d/90-vasectl.conf, so
 * that it lasts across reloads and restarts (source "file PATH"). The value changes only if the
 * file was written: else the daemon's -errno of the write (-EACCES, -EROFS, -ENOSPC, ...),
 * -EPERM or -ELOOP (the daemon refused the directory or the file: writable by others, another
 * user's, a symlink, not a regular file), -ENOTSUP (the daemon has no drop-in directory: it was
 * started with --config=/dev/null and no --config-dir), and nothing changed. */
int vase_admin_config_persist(struct vase_admin *a, const char *key, const char *value,
                              Vase__ConfigReply **ret);

/*
 * Subscribes to the daemon's events (<runtime_dir>/events.sock), after a ping on a proves the
 * daemon is there and gives the subscription time to reach it. a must stay until the
 * subscription is freed. 0 and *ret; -ENOENT, -EACCES (the socket), the errors of
 * vase_admin_ping(), other -errno of ZeroMQ.
 */
int vase_admin_events_subscribe(struct vase_admin *a, struct vase_admin_events **ret);
struct vase_admin_events *vase_admin_events_free(struct vase_admin_events *ev);
/*
 * Waits up to the handle's timeout for the next event. 1, its topic (NUL-terminated, cut to
 * topic_size) and *ret (the caller's) on an event; 0 if none came, after a ping found the daemon
 * alive (a quiet stream and a dead daemon look alike to a subscriber); -EINTR if a signal
 * interrupted the wait; -EBADMSG for a malformed event (dropped; the next call goes on); the
 * errors of vase_admin_ping().
 */
int vase_admin_events_next(struct vase_admin_events *ev, char *topic, size_t topic_size,
                           Vase__Event **ret);

/* Copies text a peer chose to out (out_size bytes, NUL included) with every control character
 * (C0, DEL) and every byte that is not UTF-8 written as \xNN, and the C1 controls, format
 * characters (bidi overrides, zero-width characters) and the line and paragraph separators as
 * \uNNNN or \UNNNNNNNN; other UTF-8 passes. Cut at a character boundary if out is too small;
 * returns the length written. An out of 4 * strlen(in) + 1 bytes always holds the whole text.
 * Escaping escaped text changes nothing. For terminals and logs. */
size_t vase_admin_escape(const char *in, char *out, size_t out_size);

/* 1 if the Unicode code point cp is a control character (C0, DEL, C1), a format character
 * (general category Cf) or the line or paragraph separator: the characters vase_admin_escape()
 * writes as escapes; 0 otherwise. */
int vase_admin_hidden_char(uint32_t cp);

#ifdef __cplusplus
}
#endif
