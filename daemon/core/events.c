/* SPDX-License-Identifier: MIT */

/*
 * Event publishing. Invariants: events carry a strictly increasing event_seq per
 * incarnation, so a subscriber sees gaps (PUB drops messages for slow subscribers rather than
 * block the daemon); publishing never blocks the main loop.
 */

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "events.h"
#include "log.h"
#include "zap.h"

struct vase_events {
    void *pub;
    uint64_t incarnation;
    uint64_t seq;
    uint64_t dropped; /* events numbered but not sent */
};

int vase_events_new(void *zmq_ctx, const char *endpoint, uint64_t incarnation,
                    struct vase_events **ret) {
    int zero = 0, r;
    struct vase_events *ev = calloc(1, sizeof(*ev));
    if (!ev)
        return log_oom();
    ev->incarnation = incarnation;
    ev->pub = zmq_socket(zmq_ctx, ZMQ_PUB);
    if (!ev->pub) {
        r = log_error_errno(-zmq_errno(), "Failed to create the events socket: %m");
        goto free_events;
    }
    zmq_setsockopt(ev->pub, ZMQ_LINGER, &zero, sizeof(zero));
    /* Events name every client and sequence: the ZAP handler decides who may subscribe. */
    if (zmq_setsockopt(ev->pub, ZMQ_ZAP_DOMAIN, VASE_ZAP_DOMAIN_EVENTS,
                       strlen(VASE_ZAP_DOMAIN_EVENTS)) < 0) {
        r = log_error_errno(-zmq_errno(), "Failed to configure the events socket: %m");
        goto free_events;
    }
    if (zmq_bind(ev->pub, endpoint) < 0) {
        r = log_error_errno(-zmq_errno(), "Failed to bind %s: %m", endpoint);
        goto free_events;
    }
    *ret = ev;
    return 0;

free_events:
    vase_events_free(ev);
    return r;
}

struct vase_events *vase_events_free(struct vase_events *ev) {
    if (!ev)
        return NULL;
    if (ev->pub)
        zmq_close(ev->pub);
    free(ev);
    return NULL;
}

int vase_events_publish(struct vase_events *ev, const char *topic, Vase__Event *e) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    e->incarnation = ev->incarnation;
    e->event_seq = ++ev->seq;
    e->time = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;

    size_t len = vase__event__get_packed_size(e);
    void *buf = malloc(len ? len : 1);
    if (!buf) {
        ev->dropped++;
        return -ENOMEM;
    }
    vase__event__pack(e, buf);
    int r = 0;
    if (zmq_send(ev->pub, topic, strlen(topic), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(ev->pub, buf, len, ZMQ_DONTWAIT) < 0)
        r = -zmq_errno();
    free(buf);
    if (r < 0) {
        ev->dropped++;
        log_debug_errno(r, "Dropped a %s event: %m", topic);
    }
    return r;
}

uint64_t vase_events_count(const struct vase_events *ev) {
    return ev->seq;
}

uint64_t vase_events_dropped(const struct vase_events *ev) {
    return ev->dropped;
}
