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

/* Admission wait (admitq.h): tries the parked opens again, in arrival order per arena, when the
 * arena's used bytes changed since one last did not fit; admits, or refuses for reasons other
 * than room, each in turn, stopping at the first one of an arena that still does not fit.
 * Called by the loop after each round of events. */
void vase_engine_admit_retry(struct vased *d);
/* Refuses with ENOSPC every parked open whose wait has passed at now. */
void vase_engine_admit_expire(struct vased *d, double now);
