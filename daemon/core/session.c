/* SPDX-License-Identifier: MIT */

/*
 * Session sockets and the allow-list. Invariants: every descriptor is close-on-exec and
 * non-blocking; sends use MSG_NOSIGNAL, so a client that vanished costs an error, not a
 * SIGPIPE; a packet larger than VASE_SESSION_MAX_PACKET is refused, not parsed. Who may open a
 * session is decided in allow.c.
 */

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "log.h"
#include "session.h"
#include "wire.h"

static int fill_addr(const char *path, struct sockaddr_un *sa, socklen_t *len) {
    size_t n = strlen(path);
    if (n >= sizeof(sa->sun_path))
        return -ENAMETOOLONG;
    *sa = (struct sockaddr_un){.sun_family = AF_UNIX};
    memcpy(sa->sun_path, path, n + 1);
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
    return 0;
}

int vase_session_probe(const char *path, int type) {
    struct stat st;
    struct sockaddr_un sa;
    socklen_t salen;
    int r = fill_addr(path, &sa, &salen);
    if (r < 0)
        return r;
    if (lstat(path, &st) < 0)
        return errno == ENOENT ? 0 : -errno;
    if (!S_ISSOCK(st.st_mode))
        return -EEXIST;

    int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    r = connect(fd, (struct sockaddr *)&sa, salen);
    int e = errno;
    close(fd);
    if (r == 0)
        return -EADDRINUSE;
    if (e != ECONNREFUSED)
        return -e;
    /* No one listens: a daemon died without cleaning up. */
    if (unlink(path) < 0 && errno != ENOENT)
        return -errno;
    return 0;
}

int vase_session_listen(const char *path, int *ret_fd) {
    struct sockaddr_un sa;
    socklen_t salen;
    int r = fill_addr(path, &sa, &salen);
    if (r < 0)
        return r;
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -errno;
    if (bind(fd, (struct sockaddr *)&sa, salen) < 0 || listen(fd, 128) < 0) {
        r = -errno;
        close(fd);
        return r;
    }
    *ret_fd = fd;
    return 0;
}

int vase_session_adopt(int fd, const char *path) {
    if (sd_is_socket_unix(fd, SOCK_SEQPACKET, 1, NULL, 0) <= 0)
        return -ENOTSOCK;
    if (sd_is_socket_unix(fd, SOCK_SEQPACKET, 1, path, 0) <= 0)
        return -EADDRNOTAVAIL;
    /* Inherited without either flag: the loop never blocks in accept(), and engines or the
     * programs vased may start must not inherit the listener. */
    int fl = fcntl(fd, F_GETFL);
    int fdfl = fcntl(fd, F_GETFD);
    if (fl < 0 || fdfl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ||
        fcntl(fd, F_SETFD, fdfl | FD_CLOEXEC) < 0)
        return -errno;
    return 0;
}

int vase_session_accept(int listen_fd, int *ret_fd, struct ucred *ret_cred) {
    int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0)
        return -errno;
    socklen_t len = sizeof(*ret_cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, ret_cred, &len) < 0) {
        int r = -errno;
        close(fd);
        return r;
    }
    *ret_fd = fd;
    return 0;
}

int vase_session_recv(int fd, Vase__Envelope **ret) {
    uint8_t *buf = malloc(VASE_SESSION_MAX_PACKET);
    if (!buf)
        return -ENOMEM;
    ssize_t n = recv(fd, buf, VASE_SESSION_MAX_PACKET, MSG_TRUNC | MSG_DONTWAIT);
    int r;
    if (n < 0)
        r = -errno;
    else if (n == 0)
        r = -ECONNRESET;
    else if ((size_t)n > VASE_SESSION_MAX_PACKET)
        r = -EMSGSIZE;
    else
        r = vase_wire_unpack(buf, (size_t)n, VASE_SESSION_MAX_PACKET, ret);
    free(buf);
    return r;
}

int vase_session_send(int fd, const Vase__Envelope *e, const int *fds, size_t n_fds) {
    void *buf;
    size_t len;
    int r = vase_wire_pack(e, &buf, &len);
    if (r < 0)
        return r;

    struct iovec iov = {.iov_base = buf, .iov_len = len};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int) * 16)];
    } control;
    if (n_fds > 16) {
        free(buf);
        return -EINVAL;
    }
    if (n_fds) {
        memset(&control, 0, sizeof(control));
        mh.msg_control = control.buf;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * n_fds);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * n_fds);
        memcpy(CMSG_DATA(cm), fds, sizeof(int) * n_fds);
    }
    ssize_t n = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    r = n < 0 ? -errno : (size_t)n != len ? -EIO : 0;
    free(buf);
    return r;
}

int vase_session_send_error(int fd, uint64_t incarnation, int code, const char *message) {
    Vase__Error err = VASE__ERROR__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    err.code = code;
    err.message = (char *)message;
    e.version = VASE_WIRE_VERSION;
    e.incarnation = incarnation;
    e.body_case = VASE__ENVELOPE__BODY_ERROR;
    e.error = &err;
    return vase_session_send(fd, &e, NULL, 0);
}
