/* SPDX-License-Identifier: MIT */

/* Unit tests of daemon/core/session.c: stale-socket detection and the SEQPACKET handshake
 * primitives with SCM_RIGHTS. */

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "../daemon/core/log.h"
#include "../daemon/core/session.h"
#include "wire.h"

static void tmp_path(char *buf, size_t len, const char *name) {
    snprintf(buf, len, "/tmp/test_daemon_session.%d.%s", (int)getpid(), name);
    unlink(buf);
}

static void test_probe(void **state) {
    (void)state;
    char path[108];
    tmp_path(path, sizeof(path), "probe");
    assert_int_equal(vase_session_probe(path, SOCK_SEQPACKET), 0); /* nothing there */

    int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(vase_session_probe(path, SOCK_SEQPACKET), -EEXIST); /* not a socket */
    unlink(path);

    /* A live listener answers. */
    int lfd;
    assert_int_equal(vase_session_listen(path, &lfd), 0);
    assert_int_equal(vase_session_probe(path, SOCK_SEQPACKET), -EADDRINUSE);
    /* A socket file no one listens on any more is stale and removed. */
    close(lfd);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(vase_session_probe(path, SOCK_SEQPACKET), 0);
    assert_int_equal(stat(path, &st), -1);
    assert_int_equal(errno, ENOENT);

    char longp[200];
    memset(longp, 'a', sizeof(longp) - 1);
    longp[sizeof(longp) - 1] = '\0';
    assert_int_equal(vase_session_probe(longp, SOCK_STREAM), -ENAMETOOLONG);
    assert_int_equal(vase_session_listen(longp, &lfd), -ENAMETOOLONG);
}

static int connect_to(const char *path) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    return fd;
}

/* A listener passed by systemd is taken only if it is the session socket vased would make. */
static void test_adopt(void **state) {
    (void)state;
    char path[108], other[108];
    tmp_path(path, sizeof(path), "adopt");
    tmp_path(other, sizeof(other), "adopt-other");
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);

    /* As systemd passes it: blocking, inherited across exec. */
    int lfd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    assert_true(lfd >= 0);
    assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(vase_session_adopt(lfd, path), -ENOTSOCK); /* bound, not listening */
    assert_int_equal(listen(lfd, 8), 0);
    assert_int_equal(vase_session_adopt(lfd, other), -EADDRNOTAVAIL);
    assert_int_equal(vase_session_adopt(lfd, path), 0);
    assert_true(fcntl(lfd, F_GETFL) & O_NONBLOCK);
    assert_true(fcntl(lfd, F_GETFD) & FD_CLOEXEC);
    int sfd;
    struct ucred cred;
    assert_int_equal(vase_session_accept(lfd, &sfd, &cred), -EAGAIN);
    close(lfd);
    unlink(path);

    /* A stream socket at the right path, and a file that is no socket, are refused. */
    int stream = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_true(stream >= 0);
    assert_int_equal(bind(stream, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(stream, 8), 0);
    assert_int_equal(vase_session_adopt(stream, path), -ENOTSOCK);
    close(stream);
    unlink(path);
    int file = open("/dev/null", O_RDONLY | O_CLOEXEC);
    assert_true(file >= 0);
    assert_int_equal(vase_session_adopt(file, path), -ENOTSOCK);
    close(file);
}

static void test_handshake(void **state) {
    (void)state;
    char path[108];
    int lfd, sfd, cfd;
    struct ucred cred;
    Vase__Envelope *e = NULL;
    void *buf;
    size_t len;

    tmp_path(path, sizeof(path), "hs");
    assert_int_equal(vase_session_listen(path, &lfd), 0);
    assert_true(fcntl(lfd, F_GETFD) & FD_CLOEXEC);
    assert_int_equal(vase_session_accept(lfd, &sfd, &cred), -EAGAIN); /* non-blocking */
    cfd = connect_to(path);
    assert_int_equal(vase_session_accept(lfd, &sfd, &cred), 0);
    assert_true(fcntl(sfd, F_GETFD) & FD_CLOEXEC);
    assert_true(fcntl(sfd, F_GETFL) & O_NONBLOCK);
    assert_int_equal(cred.uid, getuid());
    assert_int_equal(cred.pid, getpid());

    assert_int_equal(vase_session_recv(sfd, &e), -EAGAIN); /* nothing yet */

    Vase__SessionHello hello = VASE__SESSION_HELLO__INIT;
    Vase__Envelope he = VASE__ENVELOPE__INIT;
    hello.name = "test";
    he.version = VASE_WIRE_VERSION;
    he.body_case = VASE__ENVELOPE__BODY_HELLO;
    he.hello = &hello;
    assert_int_equal(vase_wire_pack(&he, &buf, &len), 0);
    assert_int_equal(send(cfd, buf, len, 0), (ssize_t)len);
    free(buf);
    assert_int_equal(vase_session_recv(sfd, &e), 0);
    assert_int_equal(e->body_case, VASE__ENVELOPE__BODY_HELLO);
    assert_string_equal(e->hello->name, "test");
    vase__envelope__free_unpacked(e, NULL);

    /* Garbage, another version, an oversized packet. */
    assert_int_equal(send(cfd, "\xff\xff\xff", 3, 0), 3);
    assert_int_equal(vase_session_recv(sfd, &e), -EBADMSG);
    he.version = VASE_WIRE_VERSION + 1;
    assert_int_equal(vase_wire_pack(&he, &buf, &len), 0);
    assert_int_equal(send(cfd, buf, len, 0), (ssize_t)len);
    free(buf);
    e = NULL;
    assert_int_equal(vase_session_recv(sfd, &e), -VASE_EPROTOVERSION);
    assert_non_null(e);
    vase__envelope__free_unpacked(e, NULL);
    size_t big = VASE_SESSION_MAX_PACKET + 100;
    char *junk = calloc(1, big);
    assert_non_null(junk);
    int sndbuf = 1 << 20;
    setsockopt(cfd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
    if (send(cfd, junk, big, 0) == (ssize_t)big)
        assert_int_equal(vase_session_recv(sfd, &e), -EMSGSIZE);
    free(junk);

    /* The welcome carries an fd; the client maps what the daemon wrote. */
    int mfd = memfd_create("t", MFD_CLOEXEC);
    assert_true(mfd >= 0);
    assert_int_equal(ftruncate(mfd, 4096), 0);
    assert_int_equal(pwrite(mfd, "arena", 6, 0), 6);
    Vase__SessionWelcome w = VASE__SESSION_WELCOME__INIT;
    Vase__Envelope we = VASE__ENVELOPE__INIT;
    w.client_id = 9;
    we.version = VASE_WIRE_VERSION;
    we.body_case = VASE__ENVELOPE__BODY_WELCOME;
    we.welcome = &w;
    assert_int_equal(vase_session_send(sfd, &we, &mfd, 1), 0);
    close(mfd);

    char rbuf[4096];
    char cbuf[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {.iov_base = rbuf, .iov_len = sizeof(rbuf)};
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
    ssize_t n = recvmsg(cfd, &mh, MSG_CMSG_CLOEXEC);
    assert_true(n > 0);
    assert_int_equal(vase_wire_unpack(rbuf, (size_t)n, sizeof(rbuf), &e), 0);
    assert_int_equal(e->welcome->client_id, 9);
    vase__envelope__free_unpacked(e, NULL);
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    assert_non_null(cm);
    assert_int_equal(cm->cmsg_type, SCM_RIGHTS);
    int got;
    memcpy(&got, CMSG_DATA(cm), sizeof(int));
    char *map = mmap(NULL, 4096, PROT_READ, MAP_SHARED, got, 0);
    assert_true(map != MAP_FAILED);
    assert_string_equal(map, "arena");
    munmap(map, 4096);
    close(got);

    assert_int_equal(vase_session_send_error(sfd, 77, EPERM, "no"), 0);
    n = recv(cfd, rbuf, sizeof(rbuf), 0);
    assert_true(n > 0);
    assert_int_equal(vase_wire_unpack(rbuf, (size_t)n, sizeof(rbuf), &e), 0);
    assert_int_equal(e->error->code, EPERM);
    assert_int_equal(e->incarnation, 77);
    vase__envelope__free_unpacked(e, NULL);

    /* The client goes away: the daemon sees the close. */
    close(cfd);
    assert_int_equal(vase_session_recv(sfd, &e), -ECONNRESET);
    /* Sending to a closed peer is an error, not SIGPIPE. */
    assert_true(vase_session_send_error(sfd, 0, EPERM, "gone") < 0);
    close(sfd);
    close(lfd);
    unlink(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_probe),
        cmocka_unit_test(test_adopt),
        cmocka_unit_test(test_handshake),
    };
    vase_log_set_max_level(LOG_EMERG);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
