/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The administrative requests of PROTOCOL.md: Ping, Status, ListClients, ListSeqs, GetSeq,
 * ConfigGet, ConfigSet; and the side effects of a changed runtime setting.
 */

#include "vase.pb-c.h"

struct vased;
struct vased_peer;
struct vase_reply_to;

/* Answers the administrative request e (vase_wire_is_admin()) of a peer that control.c has
 * authorized; who is what that peer may see. Replies itself; 0 or the -code of the Error sent. */
int vase_admin_handle(struct vased *d, const struct vase_reply_to *to, const Vase__Envelope *e,
                      const struct vased_peer *who);

/* Applies the side effects of a changed runtime setting key (log level, allow-lists); the rest
 * are read where they are used. 0, -ENOENT for no such setting, or -ENOMEM (logged; the old
 * allow-list stays). */
int vase_admin_apply_setting(struct vased *d, const char *key);
