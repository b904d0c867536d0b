/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * What the daemon tells the event stream (events.c carries it): clients joining and leaving,
 * sequences opening and closing, evictions, memory pressure; and the info messages those events
 * and the listings of admin.c are built from.
 */

#include <stdbool.h>
#include <stdint.h>

#include "vase.pb-c.h"

struct vased;
struct vased_client;
struct vased_seq;

/* Fill info messages from registry objects (strings point into the objects). */
void vase_publish_arena_status(const struct vased *d, uint32_t i, Vase__ArenaStatus *ret);
void vase_publish_client_info(const struct vased *d, const struct vased_client *c,
                              Vase__ClientInfo *ret);
void vase_publish_seq_info(const struct vased_seq *s, Vase__SeqInfo *ret);

/* Publishes client_join / client_leave for c. */
void vase_publish_client(struct vased *d, const struct vased_client *c, bool join);
/* Publishes seq_open / seq_close for s. */
void vase_publish_seq(struct vased *d, const struct vased_seq *s, bool open);
/* Publishes the eviction event of a committed plan. */
void vase_publish_eviction(struct vased *d, Vase__EvictPlan *plan);
/* Publishes a pressure event for every arena whose free pages crossed 10% (or all when
 * force), and logs the crossings. */
void vase_publish_pressure(struct vased *d, bool force);
