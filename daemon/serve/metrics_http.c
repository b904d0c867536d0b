/* SPDX-License-Identifier: MIT */

/*
 * The metrics endpoint: libmicrohttpd in external polling mode with epoll, on a listening socket
 * this file binds (so a bind failure names the address, and port 0 reports the port it got) and
 * accepts from itself: MHD gets each connection through MHD_add_connection() and never sees the
 * listener. The main loop polls one fd, an epoll set holding the listener and MHD's own epoll fd;
 * the render callback runs inside vase_metrics_http_run(), on the main thread, so it may read the
 * daemon's state without a lock.
 *
 * Why the accept is ours: anyone on the host can connect (and bind 127.0.0.2 and up), so the
 * endpoint must not depend on its clients' good behaviour. Left to itself, MHD takes its listener
 * out of its epoll set at the connection limit and puts it back only from inside MHD_run(); once
 * the connections at the limit went away, nothing made the fd ready or asked for a timeout, MHD
 * was never run again and the endpoint stayed deaf (closed peers in its listen queue, in
 * CLOSE-WAIT) until a restart. Here every connection has a slot: a connection gets
 * VASE_METRICS_HTTP_REQUEST_MS to send a complete request (again after each response it keeps
 * the connection for), or it is shut down and MHD closes it at its next run; at the connection
 * limit (or at an address's limit) the oldest connection still without a complete request is
 * dropped for the newcomer, so idle, slow or garbage connections from any number of addresses
 * keep a scrape out for no longer than that deadline. Only when every slot is answering a request
 * younger than the deadline does the newcomer wait in the listen queue, and then the timeout asks
 * for a run when the oldest one passes it. Each drop and refusal is counted
 * (vase_metrics_connections_dropped_total) and logged, rate-limited.
 */

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include "config/config.h"
#include "core/log.h"
#include "metrics_http.h"

/* A connection's slot. Live (counted against the limits): WAITING and ANSWERING. A DROPPED one
 * was shut down and waits for MHD to close it (NOTIFY_CLOSED frees the slot); it no longer counts,
 * which is why there are twice as many slots as connections allowed. */
enum slot_state {
    SLOT_FREE,
    SLOT_ADDING,    /* in MHD_add_connection(), before MHD's NOTIFY_STARTED */
    SLOT_WAITING,   /* no complete request yet (since its accept or its last response) */
    SLOT_ANSWERING, /* a request's headers are in; its response is not taken yet */
    SLOT_DROPPED,
};

struct slot {
    enum slot_state state;
    int fd;       /* the connection's socket, MHD's; only shut down here, never closed */
    double since; /* CLOCK_MONOTONIC seconds: accepted, request in, or last response done */
    struct sockaddr_storage peer;
};

#define SLOTS (2 * VASE_METRICS_HTTP_CONNECTIONS)
/* Connections accepted per run: those of one batch are then read (their requests taken) before
 * the next batch may drop the oldest that still have none. */
#define ACCEPT_BATCH (VASE_METRICS_HTTP_CONNECTIONS / 2)
/* After accept() failed for want of fds or memory, the listener rests this long. */
#define ACCEPT_BACKOFF_S 0.1
#define DROP_LOG_INTERVAL 10.0
#define DROP_LOG_BURST 5u

struct vase_metrics_http {
    struct MHD_Daemon *mhd;
    int listen_fd, mhd_fd;
    int epoll_fd;        /* the fd polled: listen_fd (while listening) and mhd_fd */
    bool listening;      /* listen_fd is in epoll_fd */
    bool due;            /* a deadline asked for a run after the next poll whatever the fds say */
    double accept_after; /* 0, or the end of a rest after accept() failed */
    struct slot slots[SLOTS];
    struct slot *adding; /* the slot MHD's NOTIFY_STARTED belongs to */
    uint64_t dropped[_VASE_METRICS_DROP_MAX];
    struct vase_ratelimit drop_log;
    vase_metrics_render_fn render;
    void *userdata;
    char address[64];
};

const char *vase_metrics_drop_to_string(enum vase_metrics_drop reason) {
    static const char *const names[_VASE_METRICS_DROP_MAX] = {
        [VASE_METRICS_DROP_DEADLINE] = "deadline",
        [VASE_METRICS_DROP_EVICTED] = "evicted",
        [VASE_METRICS_DROP_PER_ADDRESS] = "per_address",
        [VASE_METRICS_DROP_TIMEOUT] = "timeout",
        [VASE_METRICS_DROP_ERROR] = "error",
    };
    return (unsigned)reason < _VASE_METRICS_DROP_MAX ? names[reason] : NULL;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int vase_metrics_http_parse(const char *address, struct sockaddr_storage *ret, socklen_t *ret_len) {
    char host[INET6_ADDRSTRLEN + 1];
    const char *port;
    bool bracketed = address && address[0] == '[';
    size_t n;
    uint64_t p;

    if (!address)
        return -EINVAL;
    if (bracketed) {
        const char *close = strchr(address, ']');
        if (!close || close[1] != ':')
            return -EINVAL;
        n = (size_t)(close - address - 1);
        address++;
        port = close + 2;
    } else {
        const char *colon = strrchr(address, ':');
        if (!colon)
            return -EINVAL;
        n = (size_t)(colon - address);
        port = colon + 1;
    }
    if (n == 0 || n >= sizeof(host) || vase_parse_u64(port, &p) < 0 || p > 65535)
        return -EINVAL;
    memcpy(host, address, n);
    host[n] = '\0';

    struct sockaddr_storage ss = {0};
    struct sockaddr_in *in4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
    if (!bracketed && inet_pton(AF_INET, host, &in4->sin_addr) == 1) {
        in4->sin_family = AF_INET;
        in4->sin_port = htons((uint16_t)p);
        *ret_len = sizeof(*in4);
    } else if (bracketed && inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((uint16_t)p);
        *ret_len = sizeof(*in6);
    } else {
        return -EINVAL;
    }
    *ret = ss;
    return 0;
}

/* "HOST:PORT" of a bound socket. */
static void format_address(const struct sockaddr_storage *ss, char *out, size_t out_len) {
    char host[INET6_ADDRSTRLEN];
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
        snprintf(out, out_len, "[%s]:%u", host, (unsigned)ntohs(in6->sin6_port));
    } else {
        const struct sockaddr_in *in4 = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &in4->sin_addr, host, sizeof(host));
        snprintf(out, out_len, "%s:%u", host, (unsigned)ntohs(in4->sin_port));
    }
}

static int bind_listener(const char *address, struct sockaddr_storage *ss, socklen_t len,
                         int *ret_fd) {
    int one = 1, r;
    int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return log_error_errno(-errno, "Cannot make the metrics socket for %s: %m", address);
    if (ss->ss_family == AF_INET6)
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, (struct sockaddr *)ss, len) < 0 || listen(fd, 64) < 0) {
        r = -errno;
        close(fd);
        return log_error_errno(r, "Cannot listen for metrics on %s (metrics_address): %m", address);
    }
    socklen_t got = sizeof(*ss);
    if (getsockname(fd, (struct sockaddr *)ss, &got) < 0) {
        r = -errno;
        close(fd);
        return log_error_errno(r, "getsockname() of the metrics socket failed: %m");
    }
    *ret_fd = fd;
    return 0;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    char msg[256];
    (void)cls;
    vsnprintf(msg, sizeof(msg), fmt, ap);
    msg[strcspn(msg, "\n")] = '\0';
    log_debug("metrics endpoint: %s", msg);
}

static enum MHD_Result respond_text(struct MHD_Connection *conn, unsigned status, const char *text,
                                    const char *allow) {
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_PERSISTENT);
    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
    if (allow)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allow);
    enum MHD_Result r = MHD_queue_response(conn, status, resp);
    MHD_destroy_response(resp);
    return r;
}

/* ---- connections ---- */

static bool slot_live(const struct slot *s) {
    return s->state == SLOT_WAITING || s->state == SLOT_ANSWERING;
}

static bool same_address(const struct sockaddr_storage *a, const struct sockaddr_storage *b) {
    if (a->ss_family != b->ss_family)
        return false;
    if (a->ss_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                      &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr)) == 0;
    return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
           ((const struct sockaddr_in *)b)->sin_addr.s_addr;
}

/* Live connections, from peer's address only when peer is not NULL. */
static unsigned live_count(const struct vase_metrics_http *h, const struct sockaddr_storage *peer) {
    unsigned n = 0;
    for (size_t i = 0; i < SLOTS; i++)
        n += slot_live(&h->slots[i]) && (!peer || same_address(&h->slots[i].peer, peer));
    return n;
}

/* Whether s may be dropped for a newcomer: it has not sent a complete request, or it has had the
 * request deadline to take its response. */
static bool evictable(const struct slot *s, double now) {
    return s->state == SLOT_WAITING ||
           (s->state == SLOT_ANSWERING && now - s->since >= VASE_METRICS_HTTP_REQUEST_MS / 1000.0);
}

/* The oldest evictable connection (from peer's address when not NULL), or NULL. */
static struct slot *pick_victim(struct vase_metrics_http *h, const struct sockaddr_storage *peer,
                                double now) {
    struct slot *v = NULL;
    for (size_t i = 0; i < SLOTS; i++) {
        struct slot *s = &h->slots[i];
        if (evictable(s, now) && (!peer || same_address(&s->peer, peer)) &&
            (!v || s->since < v->since))
            v = s;
    }
    return v;
}

static struct slot *free_slot(struct vase_metrics_http *h) {
    for (size_t i = 0; i < SLOTS; i++)
        if (h->slots[i].state == SLOT_FREE)
            return &h->slots[i];
    return NULL;
}

/* Counts a drop or refusal and logs it, at most DROP_LOG_BURST lines per DROP_LOG_INTERVAL: anyone
 * who can connect can make us drop. error: accept()'s or MHD's, for VASE_METRICS_DROP_ERROR. */
static void note_drop(struct vase_metrics_http *h, enum vase_metrics_drop reason, int error,
                      const struct sockaddr_storage *peer, double now) {
    char who[64] = "", why[256];
    unsigned suppressed;

    h->dropped[reason]++;
    bool pass = vase_ratelimit_pass(&h->drop_log, now, &suppressed);
    if (suppressed)
        log_notice("Metrics endpoint on %s: %u more connections dropped or refused in %.0f s "
                   "without a log line each.",
                   h->address, suppressed, h->drop_log.interval);
    if (!pass)
        return;
    if (peer)
        format_address(peer, who, sizeof(who));
    switch (reason) {
    case VASE_METRICS_DROP_DEADLINE:
        snprintf(why, sizeof(why),
                 "dropped the connection from %s: no complete request within %d ms", who,
                 VASE_METRICS_HTTP_REQUEST_MS);
        break;
    case VASE_METRICS_DROP_EVICTED:
        snprintf(why, sizeof(why),
                 "dropped the connection from %s, which had sent no complete request, for a newer "
                 "one (at most %d connections, %d from one address)",
                 who, VASE_METRICS_HTTP_CONNECTIONS, VASE_METRICS_HTTP_PER_IP);
        break;
    case VASE_METRICS_DROP_PER_ADDRESS:
        snprintf(why, sizeof(why),
                 "refused a connection from %s: %d connections from that address are answering "
                 "requests",
                 who, VASE_METRICS_HTTP_PER_IP);
        break;
    case VASE_METRICS_DROP_TIMEOUT:
        snprintf(why, sizeof(why),
                 "dropped the connection from %s: its response was not taken within %d s", who,
                 VASE_METRICS_HTTP_TIMEOUT_S);
        break;
    default:
        log_warning_errno(error, "Metrics endpoint on %s: cannot take a connection%s%s: %m",
                          h->address, peer ? " from " : "", who);
        return;
    }
    log_notice("Metrics endpoint on %s: %s.", h->address, why);
}

/* Shuts s's socket down: MHD sees the hang-up and closes the connection at its next run. */
static void drop(struct vase_metrics_http *h, struct slot *s, enum vase_metrics_drop reason,
                 double now) {
    (void)shutdown(s->fd, SHUT_RDWR);
    s->state = SLOT_DROPPED;
    note_drop(h, reason, 0, &s->peer, now);
}

/* Drops the connections past a deadline. Returns how many. */
static int expire(struct vase_metrics_http *h, double now) {
    int n = 0;
    for (size_t i = 0; i < SLOTS; i++) {
        struct slot *s = &h->slots[i];
        if (s->state == SLOT_WAITING && now - s->since >= VASE_METRICS_HTTP_REQUEST_MS / 1000.0)
            drop(h, s, VASE_METRICS_DROP_DEADLINE, now), n++;
        else if (s->state == SLOT_ANSWERING && now - s->since >= VASE_METRICS_HTTP_TIMEOUT_S)
            drop(h, s, VASE_METRICS_DROP_TIMEOUT, now), n++;
    }
    return n;
}

static void set_listening(struct vase_metrics_http *h, bool on) {
    if (on == h->listening)
        return;
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = h->listen_fd};
    if (epoll_ctl(h->epoll_fd, on ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, h->listen_fd, &ev) < 0) {
        /* Cannot happen with fds we own; the timeout polls again rather than lose the listener. */
        log_warning_errno(-errno, "Metrics endpoint on %s: epoll_ctl() of the listener: %m",
                          h->address);
        return;
    }
    h->listening = on;
}

/* Whether a newcomer can have a slot now: a free slot, and a connection below the limit or one to
 * drop for it. */
static bool have_room(struct vase_metrics_http *h, double now) {
    if (!free_slot(h)) {
        /* Dropped connections MHD has not closed yet fill the table: let it close them. */
        MHD_run(h->mhd);
        if (!free_slot(h))
            return false;
    }
    return live_count(h, NULL) < VASE_METRICS_HTTP_CONNECTIONS || pick_victim(h, NULL, now);
}

/* Accepts up to ACCEPT_BATCH connections and hands them to MHD, making room as it goes. Returns
 * whether anything changed (accepted, dropped or refused); *ret_full is set when a connection may
 * be waiting that there is no room for. */
static bool accept_some(struct vase_metrics_http *h, double now, bool *ret_full) {
    bool changed = false;
    *ret_full = false;
    for (int n = 0; n < ACCEPT_BATCH; n++) {
        if (!have_room(h, now)) {
            *ret_full = true;
            break;
        }
        struct sockaddr_storage peer = {0};
        socklen_t len = sizeof(peer);
        int fd =
            accept4(h->listen_fd, (struct sockaddr *)&peer, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            /* Out of fds or memory: the connection stays queued; rest, rather than spin. */
            note_drop(h, VASE_METRICS_DROP_ERROR, -errno, NULL, now);
            h->accept_after = now + ACCEPT_BACKOFF_S;
            *ret_full = true;
            return true;
        }
        changed = true;
        if (live_count(h, &peer) >= VASE_METRICS_HTTP_PER_IP) {
            struct slot *v = pick_victim(h, &peer, now);
            if (!v) {
                close(fd);
                note_drop(h, VASE_METRICS_DROP_PER_ADDRESS, 0, &peer, now);
                continue;
            }
            drop(h, v, VASE_METRICS_DROP_EVICTED, now);
        }
        if (live_count(h, NULL) >= VASE_METRICS_HTTP_CONNECTIONS) {
            /* have_room() found one, and a drop above only made more room. */
            struct slot *v = pick_victim(h, NULL, now);
            if (v)
                drop(h, v, VASE_METRICS_DROP_EVICTED, now);
        }
        struct slot *s = free_slot(h);
        if (!s) { /* have_room() found one; nothing since took it */
            close(fd);
            note_drop(h, VASE_METRICS_DROP_ERROR, -ENOBUFS, &peer, now);
            continue;
        }
        *s = (struct slot){.state = SLOT_ADDING, .fd = fd, .since = now, .peer = peer};
        h->adding = s;
        /* MHD takes the socket, and closes it even when it fails. */
        enum MHD_Result r = MHD_add_connection(h->mhd, fd, (struct sockaddr *)&peer, len);
        int e = errno;
        h->adding = NULL;
        if (r != MHD_YES) {
            if (s->state == SLOT_ADDING)
                *s = (struct slot){.state = SLOT_FREE, .fd = -1};
            note_drop(h, VASE_METRICS_DROP_ERROR, -e, &peer, now);
        }
    }
    return changed;
}

/* MHD's NOTIFY_CONNECTION: a connection's slot is bound to it at its start and freed at its
 * close. */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
    struct vase_metrics_http *h = cls;
    (void)conn;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        struct slot *s = h->adding;
        *socket_context = s;
        if (s)
            s->state = SLOT_WAITING;
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        struct slot *s = *socket_context;
        if (s)
            *s = (struct slot){.state = SLOT_FREE, .fd = -1};
        *socket_context = NULL;
    }
}

static struct slot *slot_of(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return info ? info->socket_context : NULL;
}

/* MHD's NOTIFY_COMPLETED: a response was sent (or the request failed). A connection MHD keeps
 * (HTTP/1.1) is waiting again, and has the deadline again for its next request. */
static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)con_cls;
    (void)toe;
    struct slot *s = slot_of(conn);
    if (s && s->state == SLOT_ANSWERING) {
        s->state = SLOT_WAITING;
        s->since = now_s();
    }
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
    struct vase_metrics_http *h = cls;
    (void)version;
    (void)upload;
    (void)upload_size;
    (void)con_cls;

    /* The request's headers are in: the connection is no longer one to drop for a newcomer. */
    struct slot *s = slot_of(conn);
    if (s && s->state == SLOT_WAITING) {
        s->state = SLOT_ANSWERING;
        s->since = now_s();
    }
    if (strcmp(url, "/metrics") != 0)
        return respond_text(conn, MHD_HTTP_NOT_FOUND, "Not found: vased serves /metrics.\n", NULL);
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return respond_text(conn, MHD_HTTP_METHOD_NOT_ALLOWED,
                            "Method not allowed: /metrics takes GET and HEAD.\n", "GET, HEAD");

    struct vase_metrics_buf b = {0};
    int r = h->render(h->userdata, &b);
    if (r < 0) {
        free(b.data);
        log_warning_errno(r, "Cannot render the metrics: %m");
        return respond_text(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "Cannot render the metrics.\n",
                            NULL);
    }
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(b.len, b.data ? b.data : (void *)"", MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(b.data);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, VASE_METRICS_HTTP_CONTENT_TYPE);
    enum MHD_Result q = MHD_queue_response(conn, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    return q;
}

int vase_metrics_http_new(const char *address, vase_metrics_render_fn render, void *userdata,
                          struct vase_metrics_http **ret) {
    struct sockaddr_storage ss;
    socklen_t len;
    int r;

    if (vase_metrics_http_parse(address, &ss, &len) < 0)
        return log_error_errno(-EINVAL,
                               "metrics_address \"%s\" is not HOST:PORT with an IPv4 address or a "
                               "bracketed IPv6 one ([::1]:9464), or \"off\"",
                               address);
    struct vase_metrics_http *h = calloc(1, sizeof(*h));
    if (!h)
        return log_oom();
    h->render = render;
    h->userdata = userdata;
    h->listen_fd = h->mhd_fd = h->epoll_fd = -1;
    h->drop_log = (struct vase_ratelimit){.interval = DROP_LOG_INTERVAL, .burst = DROP_LOG_BURST};
    for (size_t i = 0; i < SLOTS; i++)
        h->slots[i] = (struct slot){.state = SLOT_FREE, .fd = -1};
    if ((r = bind_listener(address, &ss, len, &h->listen_fd)) < 0)
        goto free_http;
    format_address(&ss, h->address, sizeof(h->address));

    /* MHD's own limits stand behind ours: it never refuses what we hand it. */
    h->mhd = MHD_start_daemon(MHD_USE_EPOLL | MHD_USE_ERROR_LOG | MHD_USE_NO_LISTEN_SOCKET, 0, NULL,
                              NULL, on_request, h, MHD_OPTION_CONNECTION_LIMIT, (unsigned)SLOTS,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)VASE_METRICS_HTTP_TIMEOUT_S,
                              MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(32 << 10),
                              MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
                              MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
                              MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_END);
    if (!h->mhd) {
        r = log_error_errno(-ENOMEM, "Cannot start the metrics endpoint on %s: %m", h->address);
        goto free_http;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->mhd, MHD_DAEMON_INFO_EPOLL_FD);
    if (!info || info->epoll_fd < 0) {
        r = log_error_errno(-ENOTSUP, "The metrics endpoint on %s has no epoll fd: %m", h->address);
        goto free_http;
    }
    h->mhd_fd = info->epoll_fd;
    h->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    if (h->epoll_fd < 0) {
        r = log_error_errno(-errno, "Cannot make the metrics endpoint's epoll fd: %m");
        goto free_http;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = h->mhd_fd};
    if (epoll_ctl(h->epoll_fd, EPOLL_CTL_ADD, h->mhd_fd, &ev) < 0) {
        r = log_error_errno(-errno, "Cannot poll the metrics endpoint: %m");
        goto free_http;
    }
    set_listening(h, true);
    if (!h->listening) {
        r = -EIO;
        goto free_http;
    }
    *ret = h;
    return 0;

free_http:
    vase_metrics_http_free(h);
    return r;
}

struct vase_metrics_http *vase_metrics_http_free(struct vase_metrics_http *h) {
    if (!h)
        return NULL;
    /* MHD closes its connections and its epoll fd; the listener and the outer epoll fd are ours. */
    if (h->mhd)
        MHD_stop_daemon(h->mhd);
    if (h->epoll_fd >= 0)
        close(h->epoll_fd);
    if (h->listen_fd >= 0)
        close(h->listen_fd);
    free(h);
    return NULL;
}

const char *vase_metrics_http_address(const struct vase_metrics_http *h) {
    return h->address;
}

int vase_metrics_http_fd(const struct vase_metrics_http *h) {
    return h->epoll_fd;
}

uint64_t vase_metrics_http_dropped(const struct vase_metrics_http *h,
                                   enum vase_metrics_drop reason) {
    return h && (unsigned)reason < _VASE_METRICS_DROP_MAX ? h->dropped[reason] : 0;
}

long vase_metrics_http_timeout(struct vase_metrics_http *h, long timeout_ms) {
    MHD_UNSIGNED_LONG_LONG ms;
    double now = now_s(), next = 0;
    h->due = MHD_get_timeout(h->mhd, &ms) == MHD_YES;
    if (h->due)
        next = now + (double)ms / 1000.0;
    /* The deadlines of our own: a request's, a response's, and, while the listener rests, when a
     * slot could be had again (an answering connection becomes one to drop). */
    for (size_t i = 0; i < SLOTS; i++) {
        const struct slot *s = &h->slots[i];
        double t;
        if (s->state == SLOT_WAITING)
            t = s->since + VASE_METRICS_HTTP_REQUEST_MS / 1000.0;
        else if (s->state == SLOT_ANSWERING && !h->listening &&
                 s->since + VASE_METRICS_HTTP_REQUEST_MS / 1000.0 > now)
            t = s->since + VASE_METRICS_HTTP_REQUEST_MS / 1000.0;
        else if (s->state == SLOT_ANSWERING)
            t = s->since + VASE_METRICS_HTTP_TIMEOUT_S;
        else
            continue;
        if (!h->due || t < next)
            next = t;
        h->due = true;
    }
    if (h->accept_after > 0) {
        if (!h->due || h->accept_after < next)
            next = h->accept_after;
        h->due = true;
    }
    if (!h->due)
        return timeout_ms;
    double left = (next - now) * 1000.0;
    /* Rounded up: a wake-up before the deadline would find nothing to do, and poll again. */
    long t = left <= 0 ? 0 : left >= (double)LONG_MAX ? LONG_MAX : (long)left + 1;
    return timeout_ms < 0 || t < timeout_ms ? t : timeout_ms;
}

void vase_metrics_http_run(struct vase_metrics_http *h, bool ready) {
    double now = now_s();
    bool changed = false, full = false;
    if (ready || h->due)
        MHD_run(h->mhd);
    changed = expire(h, now) > 0;
    if (h->accept_after > 0 && now >= h->accept_after)
        h->accept_after = 0;
    if (h->accept_after == 0 && (ready || !h->listening))
        changed = accept_some(h, now, &full) || changed;
    else if (h->accept_after > 0)
        full = true;
    /* The listener rests while there is no room (the newcomers wait in its queue, and the timeout
     * wakes us when an answering connection may be dropped), never longer. */
    set_listening(h, !full);
    /* Close what was dropped, and read the newcomers' requests before the next batch. */
    if (changed)
        MHD_run(h->mhd);
    h->due = false;
}
