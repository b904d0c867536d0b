/* SPDX-License-Identifier: MIT */

/*
 * The session socket. It carries exactly one exchange, hello and welcome (with the arenas' file
 * descriptors), and then stays open and silent: its closing is how each side learns that the
 * other is gone. The welcome is copied out field by field and the unpacked message freed at
 * once; the arenas are mapped shared and read/write, since the engine writes K, V and queries
 * into them. Device arenas are described here and mapped by cuda.c on first use. Arenas are
 * unmapped before the socket closes, so the daemon never sees a session end while this process
 * still maps its memory.
 */

#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "chan.h"
#include "cuda_arena.h"
#include "session.h"
#include "vase.h"
#include "wire.h"

/* Bound on the welcome packet: a few hundred bytes per arena. */
#define WELCOME_MAX (64u << 10)

int vase__runtime_dir(const char *dir, char *buf, size_t size) {
    struct stat st;

    if (!dir) {
        const char *env = getenv("VASE_RUNTIME_DIR");
        if (env && *env)
            dir = env;
        else if (stat("/run/vase", &st) == 0 && S_ISDIR(st.st_mode))
            dir = "/run/vase";
        else
            dir = "./run";
    }
    int n = snprintf(buf, size, "%s", dir);
    if (n < 0 || (size_t)n >= size)
        return -ENAMETOOLONG;
    return 0;
}

void vase__session_init(struct vase__session *s) {
    *s = (struct vase__session){.fd = -1};
}

bool vase__arena_on_device(const struct vase__arena *a) {
    return a->share && strcmp(a->share, "memfd") != 0;
}

void vase__session_close(struct vase__session *s) {
    for (size_t i = 0; i < s->n_arenas; i++) {
        struct vase__arena *a = &s->arenas[i];
        if (a->mapping)
            vase__cuda_unmap(a);
        else if (a->map)
            munmap(a->map, (size_t)a->size_bytes);
        if (a->fd >= 0)
            close(a->fd);
        free(a->name);
        free(a->kind);
        free(a->share);
        free(a->device_uuid);
    }
    free(s->arenas);
    if (s->fd >= 0)
        close(s->fd);
    free(s->control_endpoint);
    free(s->events_endpoint);
    vase__session_init(s);
}

static int connect_socket(const char *runtime_dir, int *ret_fd) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};

    int n = snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/session.sock", runtime_dir);
    if (n < 0 || (size_t)n >= sizeof(sa.sun_path))
        return -ENAMETOOLONG;
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        int r = -errno;
        close(fd);
        return r;
    }
    *ret_fd = fd;
    return 0;
}

static int send_hello(int fd, const char *name) {
    Vase__SessionHello hello = VASE__SESSION_HELLO__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    void *buf;
    size_t len;

    hello.name = (char *)name;
    hello.pid = (uint32_t)getpid();
    e.version = VASE_WIRE_VERSION;
    e.body_case = VASE__ENVELOPE__BODY_HELLO;
    e.hello = &hello;
    int r = vase_wire_pack(&e, &buf, &len);
    if (r < 0)
        return r;
    ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);
    r = n < 0 ? -errno : (size_t)n != len ? -EPROTO : 0;
    free(buf);
    return r;
}

/* Waits up to timeout_ms for fd to become readable. 0, -ETIMEDOUT or -errno. */
static int wait_readable(int fd, int timeout_ms) {
    struct pollfd pfd = {.fd = fd, .events = POLLIN};

    for (;;) {
        int r = poll(&pfd, 1, timeout_ms);
        if (r > 0)
            return 0;
        if (r == 0)
            return -ETIMEDOUT;
        if (errno != EINTR)
            return -errno;
    }
}

/* Moves the fds of msg's SCM_RIGHTS messages into fds (at most VASE__MAX_ARENAS; those beyond
 * are closed at once) and returns how many it kept. */
static size_t take_fds(struct msghdr *msg, int *fds) {
    size_t nfds = 0;

    for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; i++) {
            int x;
            memcpy(&x, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            if (nfds < VASE__MAX_ARENAS)
                fds[nfds++] = x;
            else
                close(x);
        }
    }
    return nfds;
}

/* Unpacks the welcome packet. 0 and *ret_e; -VASE_EPROTOVERSION for another version; -EPROTO
 * for anything else that is not a welcome envelope. Nothing is left to free on failure. */
static int unpack_welcome(const void *buf, size_t len, Vase__Envelope **ret_e) {
    int r = vase_wire_unpack(buf, len, WELCOME_MAX, ret_e);

    if (r >= 0)
        return 0;
    /* Only a size or parse failure leaves no envelope behind. */
    if (r != -EBADMSG && r != -EMSGSIZE)
        vase__envelope__free_unpacked(*ret_e, NULL);
    return r == -VASE_EPROTOVERSION ? r : -EPROTO;
}

/* Receives the welcome packet and the fds riding on it. On success *ret_e and the fds are the
 * caller's; on failure every received fd is closed. */
static int recv_welcome(int fd, int timeout_ms, void *buf, Vase__Envelope **ret_e, int *fds,
                        size_t *ret_nfds) {
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int) * VASE__MAX_ARENAS)];
    } control;
    struct iovec iov = {.iov_base = buf, .iov_len = WELCOME_MAX};
    struct msghdr msg = {
        .msg_iov = &iov,
        .msg_iovlen = 1,
        .msg_control = control.buf,
        .msg_controllen = sizeof(control.buf),
    };
    size_t nfds;
    ssize_t n;
    int r;

    r = wait_readable(fd, timeout_ms);
    if (r < 0)
        return r;
    do
        n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    /* A daemon that refuses us at once closes with our hello unread, and the kernel reports
     * that as ECONNRESET before the Error packet queued for us; the report is given once, so
     * the next read finds the packet, which says why. */
    if (n < 0 && errno == ECONNRESET)
        n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0)
        return errno == EPIPE || errno == EAGAIN ? -ECONNRESET : -errno;

    nfds = take_fds(&msg, fds);
    if (n == 0)
        r = -ECONNRESET;
    else if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC))
        r = -EPROTO;
    else
        r = unpack_welcome(buf, (size_t)n, ret_e);
    if (r < 0) {
        for (size_t i = 0; i < nfds; i++)
            close(fds[i]);
        return r;
    }
    *ret_nfds = nfds;
    return 0;
}

static bool share_has_fd(const char *share) {
    return strcmp(share, "memfd") == 0 || strcmp(share, "cuda-vmm") == 0;
}

/* Copies one arena's description and, for a memfd, maps it. fd is consumed: closed here, or
 * kept in a for a cuda-vmm arena (imported when the arena is first used). */
static int take_arena(const Vase__ArenaInfo *info, int fd, struct vase__arena *a) {
    struct stat st;
    int r = 0;

    a->id = info->id;
    a->granule_bytes = info->granule_bytes;
    a->granules = info->granules;
    a->size_bytes = info->size_bytes;
    a->fd = -1;
    a->device = -1;
    a->name = strdup(info->name);
    a->kind = strdup(info->kind);
    a->share = strdup(info->share);
    a->device_uuid = strdup(info->device_uuid);
    if (!a->name || !a->kind || !a->share || !a->device_uuid) {
        r = -ENOMEM;
        goto out;
    }
    if (a->granule_bytes == 0 || a->granules == 0 ||
        a->size_bytes / a->granule_bytes != a->granules || a->size_bytes % a->granule_bytes != 0 ||
        a->size_bytes > SIZE_MAX) {
        r = -EPROTO;
        goto out;
    }
    if (strcmp(a->share, "cuda-ipc") == 0 || strcmp(a->share, "cuda-vmm") == 0) {
        /* A device arena names its GPU; a legacy IPC handle is exactly 64 bytes. */
        bool ipc = strcmp(a->share, "cuda-ipc") == 0;
        if (!a->device_uuid[0] ||
            (ipc ? info->ipc_handle.len != sizeof(a->ipc_handle) : info->ipc_handle.len != 0)) {
            r = -EPROTO;
            goto out;
        }
        memcpy(a->ipc_handle, info->ipc_handle.data, info->ipc_handle.len);
        a->ipc_handle_len = info->ipc_handle.len;
        if (!ipc) {
            a->fd = fd;
            fd = -1;
        }
        goto out;
    }
    /* An arena this library does not know how to use is listed but not mapped; models cannot
     * be registered on it. */
    if (strcmp(a->share, "memfd") != 0)
        goto out;
    if (fstat(fd, &st) < 0) {
        r = -errno;
        goto out;
    }
    if (st.st_size < 0 || (uint64_t)st.st_size < a->size_bytes) {
        r = -EPROTO;
        goto out;
    }
    void *p = mmap(NULL, (size_t)a->size_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        r = -errno;
        goto out;
    }
    a->map = p;
out:
    if (fd >= 0)
        close(fd);
    return r;
}

/* Copies the welcome into s and maps its arenas; closes every fd, used or not. */
static int take_welcome(const Vase__Envelope *e, int *fds, size_t nfds, struct vase__session *s) {
    const Vase__SessionWelcome *w = e->welcome;
    size_t next_fd = 0, need = 0;
    int r = 0;

    for (size_t i = 0; i < w->n_arenas; i++)
        need += share_has_fd(w->arenas[i]->share);
    if (w->n_arenas > VASE__MAX_ARENAS || need != nfds || w->token.len == 0 ||
        w->token.len > sizeof(s->token) || !*w->control_endpoint) {
        r = -EPROTO;
        goto out;
    }
    s->client_id = w->client_id;
    s->incarnation = e->incarnation;
    memcpy(s->token, w->token.data, w->token.len);
    s->token_len = w->token.len;
    s->max_message_bytes = w->max_message_bytes;
    s->control_endpoint = strdup(w->control_endpoint);
    s->events_endpoint = strdup(w->events_endpoint);
    s->arenas = calloc(w->n_arenas ? w->n_arenas : 1, sizeof(*s->arenas));
    if (!s->control_endpoint || !s->events_endpoint || !s->arenas) {
        r = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < w->n_arenas; i++) {
        int fd = share_has_fd(w->arenas[i]->share) ? fds[next_fd++] : -1;
        s->n_arenas = i + 1;
        r = take_arena(w->arenas[i], fd, &s->arenas[i]);
        if (r < 0)
            goto out;
    }
out:
    /* take_arena() closed the fds it was given; close the rest. */
    for (size_t i = next_fd; i < nfds; i++)
        close(fds[i]);
    return r;
}

int vase__session_open(const char *runtime_dir, const char *name, int timeout_ms,
                       struct vase__session *s) {
    int fds[VASE__MAX_ARENAS];
    size_t nfds = 0;
    Vase__Envelope *e = NULL;
    int r;

    vase__session_init(s);
    void *buf = malloc(WELCOME_MAX);
    if (!buf)
        return -ENOMEM;
    r = connect_socket(runtime_dir, &s->fd);
    if (r < 0)
        goto fail_buf;
    r = send_hello(s->fd, name);
    /* A daemon that refuses may close before it reads the hello; its Error is still waiting in
     * our receive queue, and it says more than EPIPE does. */
    if (r < 0 && r != -EPIPE && r != -ECONNRESET)
        goto fail_session;
    r = recv_welcome(s->fd, timeout_ms, buf, &e, fds, &nfds);
    if (r < 0)
        goto fail_session;
    if (e->body_case == VASE__ENVELOPE__BODY_ERROR)
        r = vase__error_code(e->error);
    else if (e->body_case != VASE__ENVELOPE__BODY_WELCOME)
        r = -EPROTO;
    if (r < 0) {
        for (size_t i = 0; i < nfds; i++)
            close(fds[i]);
        goto fail_envelope;
    }
    r = take_welcome(e, fds, nfds, s);
    if (r < 0)
        goto fail_envelope;
    vase__envelope__free_unpacked(e, NULL);
    free(buf);
    return 0;

fail_envelope:
    vase__envelope__free_unpacked(e, NULL);
fail_session:
    vase__session_close(s);
fail_buf:
    free(buf);
    return r;
}
