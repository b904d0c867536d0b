/* SPDX-License-Identifier: MIT */

/*
 * Draining clients (drain.h). A client's process is watched from its connection on: the pidfd is
 * opened when the session is accepted, with the pid SO_PEERCRED gave, so that the process
 * watched is the one that connected even if its pid is reused later. When the session closes,
 * the process is asked how it stands: exited (the pidfd is readable), exiting (PF_EXITING in
 * /proc/PID/stat: the kernel closes a dying process's files, its session among them, before it
 * reports the exit), or alive. Only a dying process may still have GPU work queued on its pages;
 * a living one closed its session through libvase, which unmaps the arenas first. The pages of a
 * dying process's device sequences stay held (charged to it, out of the free pool) until its
 * pidfd reports the exit, and VASED_DRAIN_GRACE more; the main loop polls the pidfds, its timer
 * releases what is due. Invariant: a draining client's pidfd is open exactly while release_at is
 * 0 and it has one.
 */

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/arena.h"
#include "drain.h"
#include "core/log.h"
#include "publish.h"
#include "core/registry.h"
#include "state.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

/* include/linux/sched.h: set when the task has begun to exit. */
#define PF_EXITING 0x00000004u

int vase_drain_watch(pid_t pid, int *ret_fd) {
    if (pid <= 0)
        return -EINVAL;
    /* A pidfd is always close-on-exec. */
    long fd = syscall(SYS_pidfd_open, pid, 0);
    if (fd < 0)
        return -errno;
    *ret_fd = (int)fd;
    return 0;
}

static bool exited(int pidfd) {
    struct pollfd p = {.fd = pidfd, .events = POLLIN};
    return poll(&p, 1, 0) > 0;
}

/* 1 if process pid is exiting or a zombie, 0 if it runs, -errno if /proc cannot tell. */
static int exiting(pid_t pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    int e = errno;
    close(fd);
    if (n <= 0)
        return n < 0 ? -e : -EIO;
    buf[n] = '\0';
    /* "pid (comm) state ppid pgrp session tty_nr tpgid flags ...": comm may hold anything. */
    const char *rp = strrchr(buf, ')');
    char state;
    unsigned flags;
    if (!rp || sscanf(rp + 1, " %c %*d %*d %*d %*d %*d %u", &state, &flags) != 2)
        return -EBADMSG;
    return state == 'Z' || state == 'X' || (flags & PF_EXITING) ? 1 : 0;
}

enum vase_drain_verdict vase_drain_judge(pid_t pid, int pidfd, int pidfd_error) {
    if (pidfd < 0)
        /* Gone before it was welcomed: it never had the arenas. */
        return pidfd_error == -ESRCH ? VASE_DRAIN_RELEASE : VASE_DRAIN_FALLBACK;
    if (exited(pidfd))
        return VASE_DRAIN_EXITED;
    int r = exiting(pid);
    if (r != 0)
        /* Exiting, or /proc cannot tell (it may hide other users' processes): the exit. */
        return VASE_DRAIN_WAIT_EXIT;
    /* The pidfd was not readable before /proc was read: pid was still this process then. */
    return exited(pidfd) ? VASE_DRAIN_EXITED : VASE_DRAIN_RELEASE;
}

bool vase_drain_must_hold(struct vased *d, struct vased_client *c) {
    bool on_device = false;
    for (const struct vased_seq *s = c->seqs; s && !on_device; s = s->next)
        on_device = vase_arena_on_device(d->arenas[s->arena_id]);
    if (!on_device)
        return false;

    double now = vased_now();
    switch (vase_drain_judge((pid_t)c->pid, c->pidfd, c->pidfd_error)) {
    case VASE_DRAIN_RELEASE:
        if (c->pidfd < 0)
            log_info("Client %u (pid %u) was gone before it was welcomed; nothing to hold.", c->id,
                     c->pid);
        return false;
    case VASE_DRAIN_WAIT_EXIT:
        c->release_at = 0;
        log_info("Client %u (pid %u) is exiting: its device pages are held until the process "
                 "is gone.",
                 c->id, c->pid);
        return true;
    case VASE_DRAIN_EXITED:
        c->release_at = now + VASED_DRAIN_GRACE;
        log_info("Client %u (pid %u) has exited: its device pages return in %.0f s.", c->id, c->pid,
                 VASED_DRAIN_GRACE);
        return true;
    case VASE_DRAIN_FALLBACK:
        c->release_at = now + VASED_DRAIN_FALLBACK;
        log_warning_errno(c->pidfd_error,
                          "Client %u (pid %u): its process cannot be watched (%m); its device "
                          "pages are held for %.0f s.",
                          c->id, c->pid, VASED_DRAIN_FALLBACK);
        return true;
    }
    return false;
}

void vase_drain_start(struct vased *d, struct vased_client *c) {
    /* The pidfd stays open only while the exit is awaited. */
    if (c->release_at != 0 && c->pidfd >= 0) {
        close(c->pidfd);
        c->pidfd = -1;
    }
    vase_registry_drain_client(d->reg, c);
}

void vase_drain_on_exit(struct vased *d, struct vased_client *c, int fd, double now) {
    for (struct vased_client *o = d->reg->draining; o; o = o->next)
        if (o == c && o->pidfd == fd && o->release_at == 0) {
            close(c->pidfd);
            c->pidfd = -1;
            c->release_at = now + VASED_DRAIN_GRACE;
            log_info("Client %u (pid %u) has exited: its %llu held bytes return in %.0f s.", c->id,
                     c->pid, (unsigned long long)c->bytes, VASED_DRAIN_GRACE);
            return;
        }
}

void vase_drain_tick(struct vased *d, double now) {
    struct vased_client *next;
    bool released = false;
    for (struct vased_client *c = d->reg->draining; c; c = next) {
        next = c->next;
        if (c->release_at == 0 || now < c->release_at)
            continue;
        uint32_t id = c->id, pid = c->pid;
        uint64_t bytes = vase_registry_release_client(d->reg, d->allocs, c);
        log_info("Client %u (pid %u): %llu held bytes released.", id, pid,
                 (unsigned long long)bytes);
        released = true;
    }
    if (released)
        vase_publish_pressure(d, false);
}
