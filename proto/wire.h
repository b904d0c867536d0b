/* SPDX-License-Identifier: MIT */
#pragma once

/* Envelope framing shared by vased, libvase and vasectl: size limits checked before
 * unpacking, version checks, and packing into freshly allocated buffers. */

#include <stddef.h>
#include <stdint.h>

#include "vase.pb-c.h"
#include "vase_errors.h"

#define VASE_WIRE_VERSION 2
/* Default and hard ceiling of one control message. */
#define VASE_WIRE_DEFAULT_MAX (16u << 20)
#define VASE_WIRE_HARD_MAX (256u << 20)

/* The vase codes carried in Error.code next to errno values are those of vase_errors.h. */

/*
 * Unpacks one envelope from buf. Returns 0 and *ret (free with vase__envelope__free_unpacked(,
 * NULL)); -EMSGSIZE if len exceeds max (nothing is parsed), -EBADMSG if it does not unpack,
 * -VASE_EPROTOVERSION if version is not VASE_WIRE_VERSION (*ret is still set then, so the
 * caller can echo the request id), -EINVAL if the envelope has no body.
 */
int vase_wire_unpack(const void *buf, size_t len, size_t max, Vase__Envelope **ret);

/* Packs e into a malloc'd buffer (*ret_buf, *ret_len). 0 or -ENOMEM. */
int vase_wire_pack(const Vase__Envelope *e, void **ret_buf, size_t *ret_len);

/* The name of an envelope's body ("open_seq", ...), for logs and errors. */
const char *vase_wire_body_name(const Vase__Envelope *e);

/*
 * Copies the text in, which a peer may have chosen, to out (out_len bytes, NUL included) with
 * every control character (C0 and DEL) written as \xNN, cut at a character boundary if out is
 * too small; UTF-8 passes. For logs and terminals: such text can then neither end a line (and
 * forge the next) nor send escape sequences. Returns the length written.
 */
size_t vase_wire_escape(const char *in, char *out, size_t out_len);
