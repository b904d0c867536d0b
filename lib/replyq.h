/* SPDX-License-Identifier: MIT */
#pragma once

/* The queue of replies that arrived while the client waited for another one. Replies are
 * matched by request id; the queue owns the unpacked envelopes it holds. */

#include <stddef.h>
#include <stdint.h>

#include "vase.pb-c.h"

/* Hard bound on replies kept: one per open sequence is the most the client ever expects. */
#define VASE__REPLYQ_MAX 65536

struct vase__replyq {
    Vase__Envelope **items; /* in arrival order */
    size_t n, cap;
};

/* Takes ownership of e. 0; -ENOBUFS when VASE__REPLYQ_MAX replies are held, -ENOMEM (e is freed
 * in both cases, so the caller never has to). */
int vase__replyq_push(struct vase__replyq *q, Vase__Envelope *e);
/* Removes the reply with request id id and hands it to the caller; NULL if none. */
Vase__Envelope *vase__replyq_take(struct vase__replyq *q, uint64_t request_id);
/* Whether a reply for request_id is queued. */
int vase__replyq_has(const struct vase__replyq *q, uint64_t request_id);
/* Frees the reply for request_id if one is queued (its requester gave up on it). */
void vase__replyq_drop(struct vase__replyq *q, uint64_t request_id);
/* Frees every queued reply and the queue's storage; the queue is empty and reusable after. */
void vase__replyq_clear(struct vase__replyq *q);
