/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The vase-specific error codes, one definition for both ends of the protocol. The daemon puts
 * them in Error.code next to errno values (PROTOCOL.md, "Errors"); libvase returns them negated
 * like errno values, and vase_strerror() names them. They sit above every errno value, so the
 * two never collide. A public header: vase.h includes it, and so does proto/wire.h.
 */

#define VASE_EPROTOVERSION 1000 /* the peer speaks another protocol version */
#define VASE_ESTALE 1001        /* the daemon restarted: its incarnation changed */
