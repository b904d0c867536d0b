/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The admission of opens (admission.c): fit, park, retry and expiry. Main thread only.
 */

#include <stddef.h>
#include <stdint.h>

struct vased;
struct vased_client;
struct vased_model;
struct vased_seq;
struct vased_seq_request;
struct vase_reply_to;

/* Opens a sequence of model m for client c as req asks, or parks the open for up to wait_ms
 * (0: no wait) when there is no room yet and it could fit the arena. Replies itself (the
 * SeqLayout, now or when a retry admits it; or an Error): 0, or the -code of the Error sent. */
int vase_admission_open(struct vased *d, struct vased_client *c, const struct vase_reply_to *p,
                        struct vased_model *m, const struct vased_seq_request *req,
                        uint32_t wait_ms);

/* -EDQUOT with the reason in why when c's uid has max_seqs_per_uid sequences open (root and the
 * daemon's uid are not capped), else 0. */
int vase_admission_uid_quota(const struct vased *d, const struct vased_client *c, char *why,
                             size_t why_size);

/* Sends the SeqLayout of the new (or reopened) sequence s to p, and tells the subscribers. */
void vase_admission_send_layout(struct vased *d, const struct vase_reply_to *p,
                                struct vased_seq *s);

/* Tries the parked opens again, in arrival order per arena, when the arena's used bytes changed
 * since one last did not fit; admits, or refuses for reasons other than room, each in turn,
 * stopping at the first one of an arena that still does not fit. Called by the loop after each
 * round of events. */
void vase_admission_retry(struct vased *d);
/* Refuses with ENOSPC every parked open whose wait has passed at now. */
void vase_admission_expire(struct vased *d, double now);
