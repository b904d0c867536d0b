/* SPDX-License-Identifier: MIT */

/*
 * The queue of parked opens (admitq.h): a singly linked FIFO with a tail pointer. Entries leave
 * it in three ways: admitted or refused by the retry that walks it in order (unlink), expired
 * (pop_expired), or dropped with their client. Invariants: n is the number of linked entries,
 * tail is the last one (NULL exactly when head is).
 */

#include <stdlib.h>

#include "admitq.h"

struct vase_admit_wait *vase_admit_wait_new(void) {
    return calloc(1, sizeof(struct vase_admit_wait));
}

void vase_admitq_push(struct vase_admitq *q, struct vase_admit_wait *w) {
    w->next = NULL;
    if (q->tail)
        q->tail->next = w;
    else
        q->head = w;
    q->tail = w;
    q->n++;
    q->gen++;
}

void vase_admitq_unlink(struct vase_admitq *q, struct vase_admit_wait *prev,
                        struct vase_admit_wait *w) {
    if (prev)
        prev->next = w->next;
    else
        q->head = w->next;
    if (q->tail == w)
        q->tail = prev;
    w->next = NULL;
    q->n--;
    q->gen++;
}

uint32_t vase_admitq_drop_client(struct vase_admitq *q, uint32_t client_id) {
    struct vase_admit_wait *prev = NULL, *w = q->head;
    uint32_t dropped = 0;
    while (w) {
        struct vase_admit_wait *next = w->next;
        if (w->client_id == client_id) {
            vase_admitq_unlink(q, prev, w);
            free(w);
            dropped++;
        } else {
            prev = w;
        }
        w = next;
    }
    return dropped;
}

uint32_t vase_admitq_count_client(const struct vase_admitq *q, uint32_t client_id) {
    uint32_t n = 0;
    for (const struct vase_admit_wait *w = q->head; w; w = w->next)
        n += w->client_id == client_id;
    return n;
}

uint32_t vase_admitq_count_uid(const struct vase_admitq *q, uid_t uid) {
    uint32_t n = 0;
    for (const struct vase_admit_wait *w = q->head; w; w = w->next)
        n += w->uid == uid;
    return n;
}

uint32_t vase_admitq_count_arena(const struct vase_admitq *q, uint32_t arena_id) {
    uint32_t n = 0;
    for (const struct vase_admit_wait *w = q->head; w; w = w->next)
        n += w->arena_id == arena_id;
    return n;
}

struct vase_admit_wait *vase_admitq_pop_expired(struct vase_admitq *q, double now) {
    struct vase_admit_wait *prev = NULL;
    for (struct vase_admit_wait *w = q->head; w; prev = w, w = w->next)
        if (w->deadline <= now) {
            vase_admitq_unlink(q, prev, w);
            return w;
        }
    return NULL;
}

double vase_admitq_next_deadline(const struct vase_admitq *q) {
    double first = 0;
    for (const struct vase_admit_wait *w = q->head; w; w = w->next)
        if (first == 0 || w->deadline < first)
            first = w->deadline;
    return first;
}

void vase_admitq_clear(struct vase_admitq *q) {
    while (q->head) {
        struct vase_admit_wait *w = q->head;
        vase_admitq_unlink(q, NULL, w);
        free(w);
    }
}
