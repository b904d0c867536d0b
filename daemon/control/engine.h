/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The requests by which an engine sets itself up and winds down, outside the eviction cycle:
 * RegisterModel, OpenSeq, CloseSeq.
 */

#include "vase.pb-c.h"

struct vased;
struct vased_client;
struct vase_reply_to;

/* Answers RegisterModel, OpenSeq or CloseSeq e of client c, whose session control.c has
 * checked. Replies itself; 0 or the -code of the Error sent. */
int vase_engine_handle(struct vased *d, struct vased_client *c, const struct vase_reply_to *to,
                       const Vase__Envelope *e);
