/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The event stream: a ZeroMQ PUB socket at ipc://RUNTIME/events.sock. Each event is two
 * frames, a topic ("client", "seq", "evict", "pressure") and a packed vase.Event.
 */

#include <stdint.h>

#include "vase.pb-c.h"

struct vase_events;

/* Binds a PUB socket at endpoint. 0 or -errno, logged. */
int vase_events_new(void *zmq_ctx, const char *endpoint, uint64_t incarnation,
                    struct vase_events **ret);
struct vase_events *vase_events_free(struct vase_events *ev);

/* Publishes e under topic, filling its incarnation, sequence number and time. Never blocks
 * (PUB drops for slow subscribers). 0 or -errno. */
int vase_events_publish(struct vase_events *ev, const char *topic, Vase__Event *e);
uint64_t vase_events_count(const struct vase_events *ev);
/* Events numbered but not sent (out of memory, or the socket refused them); ZeroMQ's own drops
 * for a slow subscriber are not seen here (the subscriber sees a gap in event_seq). */
uint64_t vase_events_dropped(const struct vase_events *ev);
