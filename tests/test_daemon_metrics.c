/* SPDX-License-Identifier: MIT */

/*
 * Unit tests of daemon/serve/metrics.c and daemon/serve/metrics_http.c: label escaping and its
 * length limit, the sample and histogram lines of the text format, the plan-time buckets, the
 * refusal reasons, the address parser, and the HTTP endpoint driven the way the main loop drives it
 * (one thread: the render callback must run on the caller's), with its 404, 405, HEAD and bind
 * errors.
 */

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "../daemon/serve/metrics.h"
#include "../daemon/serve/metrics_http.h"

/* ---- escaping ---- */

static void expect_escape(const char *in, const char *want) {
    char out[VASE_METRICS_LABEL_MAX * 2 + 1];
    size_t n = vase_metrics_escape(in, out, sizeof(out));
    assert_string_equal(out, want);
    assert_int_equal(n, strlen(want));
}

static void test_escape(void **state) {
    (void)state;
    expect_escape("qwen3-4b", "qwen3-4b");
    expect_escape("", "");
    expect_escape("a\"b", "a\\\"b");
    expect_escape("a\\b", "a\\\\b");
    expect_escape("a\nb", "a\\nb");
    /* UTF-8 stays; bytes that are not UTF-8 become '?'. */
    expect_escape("mod\xc3\xa8le", "mod\xc3\xa8le");
    expect_escape("a\xff"
                  "b",
                  "a?b");
    expect_escape("a\xc3", "a?");
    expect_escape("\xc0\xaf", "??");      /* overlong '/' */
    expect_escape("\xed\xa0\x80", "???"); /* a surrogate */
}

static void test_escape_limit(void **state) {
    (void)state;
    char in[VASE_METRICS_LABEL_MAX * 2 + 8], want[VASE_METRICS_LABEL_MAX + 1];
    /* Plain bytes: cut at the limit. */
    memset(in, 'x', sizeof(in) - 1);
    in[sizeof(in) - 1] = '\0';
    memset(want, 'x', VASE_METRICS_LABEL_MAX);
    want[VASE_METRICS_LABEL_MAX] = '\0';
    expect_escape(in, want);
    /* A two-byte character across the limit is dropped whole, not cut in half. */
    memset(in, 'x', VASE_METRICS_LABEL_MAX - 1);
    strcpy(in + VASE_METRICS_LABEL_MAX - 1, "\xc3\xa8tail");
    want[VASE_METRICS_LABEL_MAX - 1] = '\0';
    expect_escape(in, want);
    /* Quotes at the limit: escaped, so the output grows, but the input is cut at the limit. */
    memset(in, '"', sizeof(in) - 1);
    in[sizeof(in) - 1] = '\0';
    char out[VASE_METRICS_LABEL_MAX * 2 + 1];
    assert_int_equal(vase_metrics_escape(in, out, sizeof(out)), 2 * VASE_METRICS_LABEL_MAX);
    /* A small output buffer is never overrun and never ends in half an escape. */
    char small[4];
    assert_int_equal(vase_metrics_escape("a\"bc", small, sizeof(small)), 3);
    assert_string_equal(small, "a\\\"");
    assert_int_equal(vase_metrics_escape("\"\"", small, 3), 2);
    assert_string_equal(small, "\\\"");
}

/* ---- lines ---- */

static void test_lines(void **state) {
    (void)state;
    struct vase_metrics_buf b = {0};
    struct vase_metrics_label l[] = {{"model", "a\"b\nc"}, {"arena", "0"}};
    vase_metrics_family(&b, "vase_x_bytes", "gauge", "Some bytes.");
    vase_metrics_sample(&b, "vase_x_bytes", l, 2, 1073741824.0);
    vase_metrics_sample(&b, "vase_x_bytes", NULL, 0, 0.25);
    vase_metrics_sample(&b, "vase_x_bytes", NULL, 0, INFINITY);
    vase_metrics_sample(&b, "vase_x_bytes", NULL, 0, NAN);
    assert_int_equal(b.error, 0);
    assert_string_equal(b.data, "# HELP vase_x_bytes Some bytes.\n"
                                "# TYPE vase_x_bytes gauge\n"
                                "vase_x_bytes{model=\"a\\\"b\\nc\",arena=\"0\"} 1073741824\n"
                                "vase_x_bytes 0.25\n"
                                "vase_x_bytes +Inf\n"
                                "vase_x_bytes NaN\n");
    assert_int_equal(b.len, strlen(b.data));
    free(b.data);
}

static void test_histogram(void **state) {
    (void)state;
    struct vase_metrics_buf b = {0};
    const double bounds[] = {0.001, 0.5};
    const uint64_t counts[] = {2, 0, 1}; /* per bucket; the last is above 0.5 */
    struct vase_metrics_label l = {"policy", "snapkv"};
    vase_metrics_histogram(&b, "vase_p_seconds", &l, 1, bounds, counts, 2, 1.5);
    assert_int_equal(b.error, 0);
    assert_string_equal(b.data, "vase_p_seconds_bucket{policy=\"snapkv\",le=\"0.001\"} 2\n"
                                "vase_p_seconds_bucket{policy=\"snapkv\",le=\"0.5\"} 2\n"
                                "vase_p_seconds_bucket{policy=\"snapkv\",le=\"+Inf\"} 3\n"
                                "vase_p_seconds_sum{policy=\"snapkv\"} 1.5\n"
                                "vase_p_seconds_count{policy=\"snapkv\"} 3\n");
    free(b.data);
}

static void test_observe_plan(void **state) {
    (void)state;
    struct vase_metrics m = {0};
    vase_metrics_observe_plan(&m, VASE_POLICY_SNAPKV, 0.00005); /* below the first bound */
    vase_metrics_observe_plan(&m, VASE_POLICY_SNAPKV, 0.0001);  /* on it: le is inclusive */
    vase_metrics_observe_plan(&m, VASE_POLICY_SNAPKV, 0.003);
    vase_metrics_observe_plan(&m, VASE_POLICY_SNAPKV, 60);  /* above 10 s: +Inf */
    vase_metrics_observe_plan(&m, VASE_POLICY_SNAPKV, NAN); /* counted as 0 */
    vase_metrics_observe_plan(&m, _VASE_POLICY_MAX, 1);     /* no such policy: ignored */
    const struct vase_metrics_policy *p = &m.policy[VASE_POLICY_SNAPKV];
    assert_int_equal(p->evictions, 5);
    assert_int_equal(p->plan_buckets[0], 3);
    assert_int_equal(p->plan_buckets[5], 1); /* 0.0025 < 0.003 <= 0.005 */
    assert_int_equal(p->plan_buckets[VASE_METRICS_PLAN_BUCKETS], 1);
    assert_true(fabs(p->plan_seconds - 60.00315) < 1e-9);
    assert_int_equal(m.policy[VASE_POLICY_STREAMING].evictions, 0);
    assert_true(vase_metrics_plan_bounds[0] == 0.0001);
    assert_true(vase_metrics_plan_bounds[VASE_METRICS_PLAN_BUCKETS - 1] == 10);
}

static void test_refusal_of(void **state) {
    (void)state;
    assert_int_equal(vase_metrics_refusal_of(-ENOSPC), VASE_METRICS_REFUSAL_NOSPACE);
    assert_int_equal(vase_metrics_refusal_of(-EDQUOT), VASE_METRICS_REFUSAL_QUOTA);
    assert_int_equal(vase_metrics_refusal_of(-ETIMEDOUT), VASE_METRICS_REFUSAL_TIMEOUT);
    assert_int_equal(vase_metrics_refusal_of(-EINVAL), VASE_METRICS_REFUSAL_INVALID);
    assert_int_equal(vase_metrics_refusal_of(-ENOENT), VASE_METRICS_REFUSAL_INVALID);
    assert_int_equal(vase_metrics_refusal_of(-ENOMEM), VASE_METRICS_REFUSAL_OTHER);
}

/* ---- addresses ---- */

static void test_parse(void **state) {
    (void)state;
    struct sockaddr_storage ss;
    socklen_t len;
    assert_int_equal(vase_metrics_http_parse("127.0.0.1:9464", &ss, &len), 0);
    assert_int_equal(ss.ss_family, AF_INET);
    assert_int_equal(len, sizeof(struct sockaddr_in));
    assert_int_equal(ntohs(((struct sockaddr_in *)&ss)->sin_port), 9464);
    assert_int_equal(vase_metrics_http_parse("[::1]:0", &ss, &len), 0);
    assert_int_equal(ss.ss_family, AF_INET6);
    assert_int_equal(len, sizeof(struct sockaddr_in6));
    assert_int_equal(ntohs(((struct sockaddr_in6 *)&ss)->sin6_port), 0);
    assert_int_equal(vase_metrics_http_parse("0.0.0.0:65535", &ss, &len), 0);

    static const char *const bad[] = {"",
                                      "off",
                                      "127.0.0.1",
                                      "127.0.0.1:",
                                      ":9464",
                                      "::1:9464",
                                      "[::1]9464",
                                      "[::1]:",
                                      "[127.0.0.1]:80",
                                      "localhost:9464",
                                      "1.2.3.4:65536",
                                      "1.2.3.4:-1",
                                      "1.2.3.4:0x10",
                                      "[::1:80",
                                      NULL};
    for (size_t i = 0; bad[i]; i++)
        if (vase_metrics_http_parse(bad[i], &ss, &len) != -EINVAL)
            fail_msg("\"%s\" was accepted", bad[i]);
    assert_int_equal(vase_metrics_http_parse(NULL, &ss, &len), -EINVAL);
}

/* ---- the endpoint, driven as the main loop drives it ---- */

struct render_state {
    pthread_t caller;
    int calls;
    bool on_caller; /* every call ran on the thread that drives the endpoint */
    int fail;       /* return this instead of rendering */
};

static int render(void *userdata, struct vase_metrics_buf *b) {
    struct render_state *rs = userdata;
    rs->calls++;
    rs->on_caller = rs->on_caller && pthread_equal(pthread_self(), rs->caller);
    if (rs->fail)
        return rs->fail;
    vase_metrics_family(b, "vase_test_total", "counter", "A test.");
    vase_metrics_sample(b, "vase_test_total", NULL, 0, 7);
    return 0;
}

/* "127.0.0.1:PORT" of h as a socket address. */
static struct sockaddr_in address_of(const struct vase_metrics_http *h) {
    struct sockaddr_storage ss;
    socklen_t len;
    assert_int_equal(vase_metrics_http_parse(vase_metrics_http_address(h), &ss, &len), 0);
    return *(struct sockaddr_in *)&ss;
}

/* The bound on every wait of these tests: far beyond any deadline of the endpoint. */
#define WAIT_S 30.0

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One round of the main loop: poll the endpoint's fd (and fd, when not -1, for events) for at most
 * the endpoint's timeout or wait_ms, then run it. Returns fd's revents. */
static short loop_once(struct vase_metrics_http *h, int fd, short events, long wait_ms) {
    struct pollfd p[2] = {{.fd = vase_metrics_http_fd(h), .events = POLLIN},
                          {.fd = fd, .events = events}};
    long timeout = vase_metrics_http_timeout(h, wait_ms);
    assert_true(poll(p, fd >= 0 ? 2 : 1, (int)timeout) >= 0);
    vase_metrics_http_run(h, p[0].revents != 0);
    return fd >= 0 ? p[1].revents : 0;
}

/* Sends request from a socket bound to source (NULL: any) and runs the endpoint until the response
 * is complete (the server closes an HTTP/1.0 connection after it), for at most WAIT_S; the
 * response into buf ("" when none came). */
static void exchange_from(struct vase_metrics_http *h, const char *source, const char *request,
                          char *buf, size_t size) {
    struct sockaddr_in sa = address_of(h);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    assert_true(fd >= 0);
    if (source) {
        struct sockaddr_in src = {.sin_family = AF_INET};
        assert_int_equal(inet_pton(AF_INET, source, &src.sin_addr), 1);
        assert_int_equal(bind(fd, (struct sockaddr *)&src, sizeof(src)), 0);
    }
    int r = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
    assert_true(r == 0 || errno == EINPROGRESS);
    size_t len = 0, sent = 0, want = strlen(request);
    for (double end = now_s() + WAIT_S; now_s() < end;) {
        short ev = loop_once(h, fd, POLLIN | (sent < want ? POLLOUT : 0), 100);
        if (sent < want && (ev & POLLOUT)) {
            ssize_t n = write(fd, request + sent, want - sent);
            if (n > 0)
                sent += (size_t)n;
        }
        if (ev & (POLLIN | POLLHUP | POLLERR)) {
            ssize_t n = read(fd, buf + len, size - len - 1);
            if (n == 0 || (n < 0 && errno != EAGAIN))
                break;
            if (n > 0)
                len += (size_t)n;
        }
    }
    buf[len] = '\0';
    close(fd);
}

static void exchange(struct vase_metrics_http *h, const char *request, char *buf, size_t size) {
    exchange_from(h, NULL, request, buf, size);
}

static void test_endpoint(void **state) {
    (void)state;
    struct render_state rs = {.caller = pthread_self(), .on_caller = true};
    struct vase_metrics_http *h;
    char buf[4096];

    assert_int_equal(vase_metrics_http_new("127.0.0.1:0", render, &rs, &h), 0);
    const char *addr = vase_metrics_http_address(h);
    assert_true(strncmp(addr, "127.0.0.1:", 10) == 0);
    assert_int_not_equal(strcmp(addr, "127.0.0.1:0"), 0); /* the port bound, not 0 */

    exchange(h, "GET /metrics HTTP/1.0\r\n\r\n", buf, sizeof(buf));
    assert_true(strncmp(buf, "HTTP/1.0 200", 12) == 0 || strncmp(buf, "HTTP/1.1 200", 12) == 0);
    assert_non_null(strstr(buf, "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
    assert_non_null(strstr(buf, "\r\n\r\n# HELP vase_test_total A test.\n"));
    assert_non_null(strstr(buf, "\nvase_test_total 7\n"));
    assert_int_equal(rs.calls, 1);

    exchange(h, "HEAD /metrics HTTP/1.0\r\n\r\n", buf, sizeof(buf));
    assert_non_null(strstr(buf, " 200 "));
    assert_null(strstr(buf, "vase_test_total"));

    exchange(h, "GET /other HTTP/1.0\r\n\r\n", buf, sizeof(buf));
    assert_non_null(strstr(buf, " 404 "));
    exchange(h, "POST /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n", buf, sizeof(buf));
    assert_non_null(strstr(buf, " 405 "));
    assert_non_null(strstr(buf, "Allow: GET, HEAD\r\n"));

    rs.fail = -ENOMEM;
    exchange(h, "GET /metrics HTTP/1.0\r\n\r\n", buf, sizeof(buf));
    assert_non_null(strstr(buf, " 500 "));
    assert_int_equal(rs.calls, 3); /* GET, HEAD, failed GET; never for 404 or 405 */
    assert_true(rs.on_caller);

    /* The port is taken now: a second endpoint on it fails with the bind's error. */
    struct vase_metrics_http *h2 = NULL;
    char taken[64];
    snprintf(taken, sizeof(taken), "%s", addr);
    assert_int_equal(vase_metrics_http_new(taken, render, &rs, &h2), -EADDRINUSE);
    assert_null(h2);
    assert_int_equal(vase_metrics_http_new("bogus", render, &rs, &h2), -EINVAL);
    assert_null(vase_metrics_http_free(h));
    assert_null(vase_metrics_http_free(NULL));
}

/* Runs the endpoint until it has nothing left to do: every connect accepted (or refused) and
 * every closed connection dropped. Bounded by rounds, not time. */
static void drive(struct vase_metrics_http *h) {
    for (int round = 0; round < 50; round++) {
        struct pollfd p = {.fd = vase_metrics_http_fd(h), .events = POLLIN};
        int ready = poll(&p, 1, round < 5 ? 100 : 0);
        vase_metrics_http_run(h, ready > 0);
        if (ready == 0 && round >= 5)
            break;
    }
}

/* Connected sockets to h that the endpoint has not closed: each is read without waiting, and
 * one that reads end of file (or an error) was closed. */
static int count_open(struct vase_metrics_http *h, const int *fds, int n) {
    int open = 0;
    drive(h);
    for (int i = 0; i < n; i++) {
        char c;
        ssize_t r = recv(fds[i], &c, 1, MSG_DONTWAIT);
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            open++;
    }
    return open;
}

/* Idle connections from one address beyond VASE_METRICS_HTTP_PER_IP close the oldest of that
 * address at once, and the endpoint still answers when the idle ones are gone. */
static void test_endpoint_flood(void **state) {
    (void)state;
    struct render_state rs = {.caller = pthread_self(), .on_caller = true};
    struct vase_metrics_http *h;
    enum { N = 3 * VASE_METRICS_HTTP_PER_IP };
    int fds[N];
    assert_int_equal(vase_metrics_http_new("127.0.0.1:0", render, &rs, &h), 0);
    struct sockaddr_in sa = address_of(h);
    for (int i = 0; i < N; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        assert_true(fds[i] >= 0);
        assert_int_equal(connect(fds[i], (struct sockaddr *)&sa, sizeof(sa)), 0);
    }
    assert_int_equal(count_open(h, fds, N), VASE_METRICS_HTTP_PER_IP);
    assert_int_equal(rs.calls, 0);
    /* Each beyond the address's share dropped the oldest of that address to make room. */
    assert_int_equal(vase_metrics_http_dropped(h, VASE_METRICS_DROP_EVICTED),
                     N - VASE_METRICS_HTTP_PER_IP);
    for (int i = 0; i < N; i++)
        close(fds[i]);
    drive(h);
    char buf[4096];
    exchange(h, "GET /metrics HTTP/1.0\r\n\r\n", buf, sizeof(buf));
    assert_non_null(strstr(buf, " 200 "));
    vase_metrics_http_free(h);
}

/* A socket connected (or connecting: a full listen queue answers later) to h from 127.0.0.host. */
static int connect_from(const struct vase_metrics_http *h, int host) {
    struct sockaddr_in sa = address_of(h);
    struct sockaddr_in src = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000000u | host)};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&src, sizeof(src)), 0);
    int r = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
    assert_true(r == 0 || errno == EINPROGRESS);
    return fd;
}

/* Runs the endpoint until the server has closed every one of fds (each reads end of file or an
 * error), for at most WAIT_S. Returns how many it left open. */
static int wait_closed(struct vase_metrics_http *h, const int *fds, int n) {
    bool *closed = calloc((size_t)n, sizeof(*closed));
    int left = n;
    assert_non_null(closed);
    for (double end = now_s() + WAIT_S; left > 0 && now_s() < end;) {
        loop_once(h, -1, 0, 50);
        for (int i = 0; i < n; i++) {
            char c[64];
            ssize_t r = closed[i] ? 1 : recv(fds[i], c, sizeof(c), MSG_DONTWAIT);
            if (!closed[i] &&
                (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != ENOTCONN)))
                closed[i] = true, left--;
        }
    }
    free(closed);
    return left;
}

/* The wedge: connections from four addresses fill the endpoint (16, 4 from each) and then go away
 * all at once, their peers closed; the endpoint must answer the next scrape. libmicrohttpd left
 * to its own accept took its listener out at the limit and never ran again to put it back. */
static void test_endpoint_closed_at_limit(void **state) {
    (void)state;
    struct render_state rs = {.caller = pthread_self(), .on_caller = true};
    struct vase_metrics_http *h;
    enum { N = VASE_METRICS_HTTP_CONNECTIONS };
    int fds[N];
    char buf[4096];
    assert_int_equal(vase_metrics_http_new("127.0.0.1:0", render, &rs, &h), 0);
    for (int i = 0; i < N; i++)
        fds[i] = connect_from(h, 2 + i % (N / VASE_METRICS_HTTP_PER_IP));
    assert_int_equal(count_open(h, fds, N), N);
    for (int i = 0; i < N; i++)
        close(fds[i]);
    drive(h);
    exchange(h, "GET /metrics HTTP/1.0\r\n\r\n", buf, sizeof(buf));
    assert_non_null(strstr(buf, " 200 "));

    /* Again, the connections left to the deadline this time: all dropped together, counted. */
    for (int i = 0; i < N; i++)
        fds[i] = connect_from(h, 2 + i % (N / VASE_METRICS_HTTP_PER_IP));
    assert_int_equal(wait_closed(h, fds, N), 0);
    for (int i = 0; i < N; i++)
        close(fds[i]);
    assert_int_equal(vase_metrics_http_dropped(h, VASE_METRICS_DROP_DEADLINE), N);
    exchange(h, "GET /metrics HTTP/1.0\r\n\r\n", buf, sizeof(buf));
    assert_non_null(strstr(buf, " 200 "));
    assert_int_equal(rs.calls, 2);
    vase_metrics_http_free(h);
}

/* 64 addresses, 4 idle connections each, held open: a scrape gets in at once (the oldest idle
 * connection makes room for it), and every idle one is dropped by its deadline. */
static void test_endpoint_idle_flood(void **state) {
    (void)state;
    struct render_state rs = {.caller = pthread_self(), .on_caller = true};
    struct vase_metrics_http *h;
    enum { ADDRESSES = 64, N = ADDRESSES * VASE_METRICS_HTTP_PER_IP };
    static int fds[N];
    char buf[4096];
    assert_int_equal(vase_metrics_http_new("127.0.0.1:0", render, &rs, &h), 0);
    /* As fast as the endpoint takes them: a batch, then a round of the loop. */
    for (int i = 0; i < N; i++) {
        fds[i] = connect_from(h, 2 + i % ADDRESSES);
        if (i % 8 == 7)
            loop_once(h, -1, 0, 50);
    }
    drive(h);
    exchange(h, "GET /metrics HTTP/1.0\r\n\r\n", buf, sizeof(buf));
    assert_non_null(strstr(buf, " 200 "));
    assert_true(vase_metrics_http_dropped(h, VASE_METRICS_DROP_EVICTED) > 0);
    assert_int_equal(vase_metrics_http_dropped(h, VASE_METRICS_DROP_PER_ADDRESS), 0);
    /* The deadline closes all that are left, the ones the listen queue held back included. */
    assert_int_equal(wait_closed(h, fds, N), 0);
    assert_true(vase_metrics_http_dropped(h, VASE_METRICS_DROP_DEADLINE) > 0);
    assert_int_equal(vase_metrics_http_dropped(h, VASE_METRICS_DROP_EVICTED) +
                         vase_metrics_http_dropped(h, VASE_METRICS_DROP_DEADLINE),
                     N);
    for (int i = 0; i < N; i++)
        close(fds[i]);
    vase_metrics_http_free(h);
}

/* A request that never ends (slow), bytes that are no request line (garbage), and a kept-alive
 * HTTP/1.1 connection after its response: the poll timeout asks for a run by the request deadline,
 * not by libmicrohttpd's idle timeout, and none outlives it. */
static void test_endpoint_slow_and_garbage(void **state) {
    (void)state;
    struct render_state rs = {.caller = pthread_self(), .on_caller = true};
    struct vase_metrics_http *h;
    int fds[3];
    assert_int_equal(vase_metrics_http_new("127.0.0.1:0", render, &rs, &h), 0);
    fds[0] = connect_from(h, 2);
    fds[1] = connect_from(h, 3);
    fds[2] = connect_from(h, 4);
    drive(h);
    static const char *const sends[] = {"GET /metr", "\x16\x03\x01\x02\x00\x01\x00\x01\xfc",
                                        "GET /metrics HTTP/1.1\r\nHost: vase\r\n\r\n"};
    for (int i = 0; i < 3; i++)
        assert_int_equal(write(fds[i], sends[i], strlen(sends[i])), (ssize_t)strlen(sends[i]));
    /* The kept-alive one's response, whole (its length is in the headers). */
    char resp[4096];
    size_t len = 0;
    for (double end = now_s() + WAIT_S; now_s() < end;) {
        loop_once(h, -1, 0, 50);
        ssize_t n = recv(fds[2], resp + len, sizeof(resp) - len - 1, MSG_DONTWAIT);
        if (n > 0)
            len += (size_t)n;
        resp[len] = '\0';
        const char *body = strstr(resp, "\r\n\r\n");
        if (body && strstr(body, "\nvase_test_total 7\n"))
            break;
    }
    assert_non_null(strstr(resp, "HTTP/1.1 200 "));
    assert_int_equal(rs.calls, 1);
    long t = vase_metrics_http_timeout(h, -1);
    assert_true(t >= 0 && t <= VASE_METRICS_HTTP_REQUEST_MS + 1);
    assert_int_equal(wait_closed(h, fds, 3), 0);
    /* libmicrohttpd closes the garbage itself, at once; the other two reach the deadline. */
    assert_int_equal(vase_metrics_http_dropped(h, VASE_METRICS_DROP_DEADLINE), 2);
    assert_int_equal(vase_metrics_http_timeout(h, -1), -1); /* nothing left to wait for */
    for (int i = 0; i < 3; i++)
        close(fds[i]);
    vase_metrics_http_free(h);
}

/* [::1] where the machine has IPv6 loopback (the address reported in brackets); elsewhere the
 * bind's error. */
static void test_endpoint_ipv6(void **state) {
    (void)state;
    int probe = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in6 lo = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    bool have = probe >= 0 && bind(probe, (struct sockaddr *)&lo, sizeof(lo)) == 0;
    if (probe >= 0)
        close(probe);
    struct render_state rs = {.caller = pthread_self(), .on_caller = true};
    struct vase_metrics_http *h = NULL;
    int r = vase_metrics_http_new("[::1]:0", render, &rs, &h);
    if (!have) {
        print_message("no IPv6 loopback here: [::1] must be refused\n");
        assert_true(r == -EADDRNOTAVAIL || r == -EAFNOSUPPORT);
        assert_null(h);
        return;
    }
    assert_int_equal(r, 0);
    assert_true(strncmp(vase_metrics_http_address(h), "[::1]:", 6) == 0);
    vase_metrics_http_free(h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_escape),
        cmocka_unit_test(test_escape_limit),
        cmocka_unit_test(test_lines),
        cmocka_unit_test(test_histogram),
        cmocka_unit_test(test_observe_plan),
        cmocka_unit_test(test_refusal_of),
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_endpoint),
        cmocka_unit_test(test_endpoint_flood),
        cmocka_unit_test(test_endpoint_closed_at_limit),
        cmocka_unit_test(test_endpoint_idle_flood),
        cmocka_unit_test(test_endpoint_slow_and_garbage),
        cmocka_unit_test(test_endpoint_ipv6),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
