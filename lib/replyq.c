/* SPDX-License-Identifier: MIT */

/*
 * The reply queue. A client waits for one reply at a time, but the daemon answers in its own
 * order: an EvictPlan for an asynchronous request may arrive while the client waits for a
 * CommitReply of another sequence. Such replies wait here, keyed by request id, until their
 * requester takes them. The queue is small (at most one reply per open sequence in practice),
 * so a linear scan beats any index; arrival order is kept so that takes are deterministic.
 */

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "replyq.h"

int vase__replyq_push(struct vase__replyq *q, Vase__Envelope *e) {
    if (q->n >= VASE__REPLYQ_MAX) {
        vase__envelope__free_unpacked(e, NULL);
        return -ENOBUFS;
    }
    if (q->n == q->cap) {
        size_t cap = q->cap ? q->cap * 2 : 8;
        Vase__Envelope **items = realloc(q->items, cap * sizeof(*items));
        if (!items) {
            vase__envelope__free_unpacked(e, NULL);
            return -ENOMEM;
        }
        q->items = items;
        q->cap = cap;
    }
    q->items[q->n++] = e;
    return 0;
}

static size_t find(const struct vase__replyq *q, uint64_t request_id) {
    for (size_t i = 0; i < q->n; i++)
        if (q->items[i]->request_id == request_id)
            return i;
    return SIZE_MAX;
}

Vase__Envelope *vase__replyq_take(struct vase__replyq *q, uint64_t request_id) {
    size_t i = find(q, request_id);
    if (i == SIZE_MAX)
        return NULL;
    Vase__Envelope *e = q->items[i];
    memmove(q->items + i, q->items + i + 1, (q->n - i - 1) * sizeof(*q->items));
    q->n--;
    return e;
}

int vase__replyq_has(const struct vase__replyq *q, uint64_t request_id) {
    return find(q, request_id) != SIZE_MAX;
}

void vase__replyq_drop(struct vase__replyq *q, uint64_t request_id) {
    Vase__Envelope *e = vase__replyq_take(q, request_id);
    if (e)
        vase__envelope__free_unpacked(e, NULL);
}

void vase__replyq_clear(struct vase__replyq *q) {
    for (size_t i = 0; i < q->n; i++)
        vase__envelope__free_unpacked(q->items[i], NULL);
    free(q->items);
    *q = (struct vase__replyq){0};
}
