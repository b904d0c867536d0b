/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The opens waiting for room (admission wait): an OpenSeq that found its arena full and asked
 * to wait is parked here, in arrival order, with what its reply needs. The queue owns its entries
 * and copies everything they need (no pointer into a protobuf message or into a client), so a
 * client that goes away only has to drop its entries by id.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "registry.h"

/* The longest admission wait a request or the admission_wait_ms setting may ask for. */
#define VASE_ADMIT_MAX_WAIT_MS 600000u
/* Routing ids longer than this are not parked (ZeroMQ's are at most 255 bytes). */
#define VASE_ADMIT_MAX_ROUTING_ID 255u

struct vase_admit_wait {
    struct vase_admit_wait *next;
    uint32_t client_id, arena_id, model_id;
    uid_t uid; /* the client's */
    struct vased_seq_request req;
    uint64_t bytes;      /* its footprint */
    uint64_t page_bytes; /* its model's KV page */
    uint32_t wait_ms;
    double deadline; /* CLOCK_MONOTONIC seconds */
    /* Where the reply goes (struct vase_reply_to, copied). */
    uint8_t routing_id[VASE_ADMIT_MAX_ROUTING_ID];
    size_t routing_id_len;
    uint64_t request_id;
    bool cred_known;
    struct ucred cred;
};

struct vase_admitq {
    struct vase_admit_wait *head, *tail;
    uint32_t n;
    uint64_t gen; /* counts every change */
};

/* A zeroed entry (calloc), or NULL when out of memory. */
struct vase_admit_wait *vase_admit_wait_new(void);

/* Appends w (the queue owns it from now on). */
void vase_admitq_push(struct vase_admitq *q, struct vase_admit_wait *w);
/* Unlinks w, whose predecessor is prev (NULL: w is the head); the caller owns w again. */
void vase_admitq_unlink(struct vase_admitq *q, struct vase_admit_wait *prev,
                        struct vase_admit_wait *w);
/* Frees every entry of client_id; the number freed. */
uint32_t vase_admitq_drop_client(struct vase_admitq *q, uint32_t client_id);
/* Entries of client_id. */
uint32_t vase_admitq_count_client(const struct vase_admitq *q, uint32_t client_id);
/* Entries of the clients of uid. */
uint32_t vase_admitq_count_uid(const struct vase_admitq *q, uid_t uid);
/* Entries for arena_id. */
uint32_t vase_admitq_count_arena(const struct vase_admitq *q, uint32_t arena_id);
/* Unlinks and returns the first entry whose deadline is at or before now (the caller owns it),
 * NULL if none. */
struct vase_admit_wait *vase_admitq_pop_expired(struct vase_admitq *q, double now);
/* The earliest deadline, or 0 when the queue is empty. */
double vase_admitq_next_deadline(const struct vase_admitq *q);
/* Frees every entry. */
void vase_admitq_clear(struct vase_admitq *q);
