/* SPDX-License-Identifier: MIT */
#pragma once

/* Envelope framing shared by vased, libvase and vasectl: size limits checked before
 * unpacking, version checks, and packing into freshly allocated buffers. */

#include <stdbool.h>
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
/* True for the requests any peer may send (Ping, Status, List*, GetSeq, Config*): the
 * administrative ones. */
bool vase_wire_is_admin(Vase__Envelope__BodyCase body);
/* True for the bodies a peer may send to vased at all (requests); replies and events are not. */
bool vase_wire_is_request(Vase__Envelope__BodyCase body);

/*
 * Copies the text in, which a peer may have chosen, to out (out_len bytes, NUL included) with
 * every character a terminal or a reader could be fooled by escaped: C0 controls and DEL as
 * \xNN, bytes that are not UTF-8 as \xNN each, C1 controls, format characters (bidi
 * overrides, zero-width characters: vase_wire_hidden_char()) and the line and paragraph
 * separators as \uNNNN or \UNNNNNNNN. Other UTF-8 passes. The result is cut at a character
 * boundary if out is too small. For logs and terminals: such text can then neither end a line
 * (and forge the next), nor send escape sequences, nor show one name as another. Escaping
 * escaped text changes nothing. Returns the length written.
 */
size_t vase_wire_escape(const char *in, char *out, size_t out_len);

/* The length of the valid UTF-8 sequence at p (at most avail bytes) with its code point in
 * *ret_cp, or 0 (*ret_cp untouched) if there is none: a stray or truncated byte, an overlong
 * form, a surrogate or a value past U+10FFFF. */
size_t vase_wire_utf8_len(const unsigned char *p, size_t avail, uint32_t *ret_cp);

/* Whether cp is a control character (C0, DEL, C1), a format character (general category Cf)
 * or the line or paragraph separator: the characters vase_wire_escape() writes as escapes. */
bool vase_wire_hidden_char(uint32_t cp);

/* The longest sequence label (OpenSeq.label), in bytes. */
#define VASE_WIRE_LABEL_MAX 64u
/* The bytes a label may hold besides ASCII letters and digits. */
#define VASE_WIRE_LABEL_PUNCT "._:/@+=-"

/*
 * Checks a sequence label (OpenSeq.label) against the one rule both ends apply: "" (no label), or
 * 1 .. VASE_WIRE_LABEL_MAX bytes, each an ASCII letter, digit or one of VASE_WIRE_LABEL_PUNCT.
 * Such a label needs no quoting or escaping in a log line, a table, a JSON string or a metrics
 * label, and cannot pass for two names. 0, or -EINVAL with the reason in why (why_size bytes;
 * may be NULL): a byte is named by its offset and hex value and never copied, since the label
 * may hold anything a peer sent. Reads at most VASE_WIRE_LABEL_MAX + 1 bytes of label, so a
 * char[VASE_WIRE_LABEL_MAX + 1] need not be terminated.
 */
int vase_wire_label_check(const char *label, char *why, size_t why_size);
