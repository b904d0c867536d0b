/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * ZeroMQ's authentication hook (ZAP, ZeroMQ RFC 27) as vased uses it: libzmq asks, for every
 * connection to a socket that names a ZAP domain, whether to accept it, passing the peer's
 * address; on ipc that address ends with the kernel's ":uid:gid:pid" of the peer. The main
 * thread answers, so the decision uses the same allow-lists as the rest of the daemon.
 */

#include <stdbool.h>
#include <stddef.h>

#define VASE_ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define VASE_ZAP_DOMAIN_EVENTS "vase-events"

struct vase_zap_request {
    char request_id[64];
    size_t request_id_len;
    char domain[64];
    char address[256];
    bool well_formed; /* false: answered with 500 whatever the decision */
};

/* The REP socket libzmq sends its requests to, bound in zmq_ctx. 0 or -errno (logged). */
int vase_zap_open(void *zmq_ctx, void **ret);
/* Reads one request without blocking: 0, or -EAGAIN when none waits. Frames too long are cut
 * (well_formed false). Every request read must be answered with vase_zap_reply(). */
int vase_zap_recv(void *zap, struct vase_zap_request *ret);
/* Answers: 200 (allow) or 400 (refused); 500 for a request that was not well formed. */
void vase_zap_reply(void *zap, const struct vase_zap_request *req, bool allow);
