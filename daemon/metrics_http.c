/* SPDX-License-Identifier: MIT */

/*
 * The metrics endpoint: libmicrohttpd in external polling mode with epoll, on a listening socket
 * this file binds (so a bind failure names the address, and port 0 reports the port it got).
 * The main loop owns it like any other fd; the render callback runs inside
 * vase_metrics_http_run(), on the main thread, so it may read the daemon's state without a lock.
 * Connections are bounded in number, per address and in idle time, and each holds little memory,
 * so scrapers cannot hold the loop or grow the daemon.
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
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "metrics_http.h"

struct vase_metrics_http {
    struct MHD_Daemon *mhd;
    int epoll_fd;
    bool due; /* MHD asked to run after the next poll whatever its fds say */
    vase_metrics_render_fn render;
    void *userdata;
    char address[64];
};

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

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
    struct vase_metrics_http *h = cls;
    (void)version;
    (void)upload;
    (void)upload_size;
    (void)con_cls;

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
    int fd = -1, r;

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
    h->epoll_fd = -1;
    if ((r = bind_listener(address, &ss, len, &fd)) < 0)
        goto free_http;
    format_address(&ss, h->address, sizeof(h->address));

    unsigned flags =
        MHD_USE_EPOLL | MHD_USE_ERROR_LOG | (ss.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    h->mhd =
        MHD_start_daemon(flags, 0, NULL, NULL, on_request, h, MHD_OPTION_LISTEN_SOCKET, fd,
                         MHD_OPTION_CONNECTION_LIMIT, (unsigned)VASE_METRICS_HTTP_CONNECTIONS,
                         MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)VASE_METRICS_HTTP_PER_IP,
                         MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)VASE_METRICS_HTTP_TIMEOUT_S,
                         MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(32 << 10),
                         MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_END);
    if (!h->mhd) {
        close(fd);
        r = log_error_errno(-ENOMEM, "Cannot start the metrics endpoint on %s: %m", h->address);
        goto free_http;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->mhd, MHD_DAEMON_INFO_EPOLL_FD);
    if (!info || info->epoll_fd < 0) {
        r = log_error_errno(-ENOTSUP, "The metrics endpoint on %s has no epoll fd: %m", h->address);
        goto free_http;
    }
    h->epoll_fd = info->epoll_fd;
    *ret = h;
    return 0;

free_http:
    vase_metrics_http_free(h);
    return r;
}

struct vase_metrics_http *vase_metrics_http_free(struct vase_metrics_http *h) {
    if (!h)
        return NULL;
    /* MHD closes the listening socket it was given, and its epoll fd. */
    if (h->mhd)
        MHD_stop_daemon(h->mhd);
    free(h);
    return NULL;
}

const char *vase_metrics_http_address(const struct vase_metrics_http *h) {
    return h->address;
}

int vase_metrics_http_fd(const struct vase_metrics_http *h) {
    return h->epoll_fd;
}

long vase_metrics_http_timeout(struct vase_metrics_http *h, long timeout_ms) {
    MHD_UNSIGNED_LONG_LONG ms;
    h->due = MHD_get_timeout(h->mhd, &ms) == MHD_YES;
    if (!h->due)
        return timeout_ms;
    long t = ms > (MHD_UNSIGNED_LONG_LONG)LONG_MAX ? LONG_MAX : (long)ms;
    return timeout_ms < 0 || t < timeout_ms ? t : timeout_ms;
}

void vase_metrics_http_run(struct vase_metrics_http *h, bool ready) {
    if (ready || h->due)
        MHD_run(h->mhd);
    h->due = false;
}
