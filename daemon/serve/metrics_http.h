/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The HTTP endpoint of the metrics (libmicrohttpd), driven by the daemon's main loop: it has no
 * thread of its own. The loop polls vase_metrics_http_fd() with the others, bounds its wait by
 * vase_metrics_http_timeout(), and calls vase_metrics_http_run() when the fd is readable; the
 * render callback therefore runs on the main thread. GET and HEAD of /metrics only.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "metrics.h"

/* Connections at once, in all and from one address; how long a connection may take to send a
 * complete request (from its accept, or from the end of the response before), and to take a
 * response. A connection past its deadline is dropped, and at a limit the oldest one still without
 * a complete request makes room for the newcomer: a flood of idle connections cannot hold the main
 * loop, grow the daemon, or keep a scraper out for longer than VASE_METRICS_HTTP_REQUEST_MS. */
#define VASE_METRICS_HTTP_CONNECTIONS 16
#define VASE_METRICS_HTTP_PER_IP 4
#define VASE_METRICS_HTTP_REQUEST_MS 2000
#define VASE_METRICS_HTTP_TIMEOUT_S 10
#define VASE_METRICS_HTTP_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

struct vase_metrics_http;

/* Why a connection was dropped or refused (vase_metrics_connections_dropped_total{reason}). */
enum vase_metrics_drop {
    VASE_METRICS_DROP_DEADLINE,    /* no complete request within VASE_METRICS_HTTP_REQUEST_MS */
    VASE_METRICS_DROP_EVICTED,     /* the oldest without a request, for a newcomer at a limit */
    VASE_METRICS_DROP_PER_ADDRESS, /* refused: its address had VASE_METRICS_HTTP_PER_IP busy */
    VASE_METRICS_DROP_TIMEOUT,     /* its response not taken within VASE_METRICS_HTTP_TIMEOUT_S */
    VASE_METRICS_DROP_ERROR,       /* accept() or libmicrohttpd failed (out of fds or memory) */
    _VASE_METRICS_DROP_MAX,
};

/* "deadline", "evicted", "per_address", "timeout", "error"; NULL out of range. */
const char *vase_metrics_drop_to_string(enum vase_metrics_drop reason);

/* Renders the body of a scrape into b; 0 or -errno (the scrape is answered 500). */
typedef int (*vase_metrics_render_fn)(void *userdata, struct vase_metrics_buf *b);

/*
 * Parses "HOST:PORT" (an IPv4 literal, or an IPv6 literal in brackets: "[::1]:9464"; port 0 to
 * 65535) into *ret and *ret_len. 0 or -EINVAL.
 */
int vase_metrics_http_parse(const char *address, struct sockaddr_storage *ret, socklen_t *ret_len);

/*
 * Binds address (as vase_metrics_http_parse() takes it) and serves render(userdata) at /metrics.
 * Logs and returns -EINVAL for an address that does not parse, the bind's -errno (-EADDRINUSE,
 * -EACCES, -EADDRNOTAVAIL) naming the address, or -ENOMEM.
 */
int vase_metrics_http_new(const char *address, vase_metrics_render_fn render, void *userdata,
                          struct vase_metrics_http **ret);
struct vase_metrics_http *vase_metrics_http_free(struct vase_metrics_http *h);

/* The address bound, "127.0.0.1:41234" or "[::1]:9464" (port 0 replaced by the one given). */
const char *vase_metrics_http_address(const struct vase_metrics_http *h);
/* The fd to poll for input (an epoll fd holding the listener and the connections). */
int vase_metrics_http_fd(const struct vase_metrics_http *h);
/* timeout_ms (-1: none) shortened to the next deadline of a connection (or of libmicrohttpd). */
long vase_metrics_http_timeout(struct vase_metrics_http *h, long timeout_ms);
/* Accepts, reads and answers whatever is ready when the fd polled readable (ready) or the last
 * timeout asked for it, and drops the connections past their deadlines; never blocks. Call it
 * after every poll. */
void vase_metrics_http_run(struct vase_metrics_http *h, bool ready);
/* Connections dropped or refused so far, for reason; 0 for h NULL. */
uint64_t vase_metrics_http_dropped(const struct vase_metrics_http *h,
                                   enum vase_metrics_drop reason);
