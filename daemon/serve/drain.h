/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * Clients whose session closed while their process may still run GPU work. A session closes
 * before the driver has torn down the dead process's context, so kernels it queued could still
 * write into pages handed to another tenant. The pages of its sequences on device arenas are
 * therefore held until its process is gone (a pidfd opened when it connected, so that a reused
 * pid is never mistaken for it), and VASED_DRAIN_GRACE more; host arenas return at once, as does
 * everything of a process that closed its session and lives on (libvase unmaps the arenas before
 * it closes the session).
 */

#include <stdbool.h>
#include <sys/types.h>

struct vased;
struct vased_client;

/* How long held pages stay out after the process has exited: the driver tears a context down
 * as the process's device files close, before the kernel reports the exit; this covers a
 * teardown finished elsewhere (an MPS server). */
#define VASED_DRAIN_GRACE 1.0
/* How long they stay out when the process cannot be watched (no pidfd: a kernel before 5.3, a
 * peer in another pid namespace). */
#define VASED_DRAIN_FALLBACK 30.0

/* What a closed session's device pages wait for. */
enum vase_drain_verdict {
    VASE_DRAIN_RELEASE,   /* nothing: the process lives on (it unmapped first) or never mapped */
    VASE_DRAIN_WAIT_EXIT, /* the process is exiting (or cannot be read): its pidfd */
    VASE_DRAIN_EXITED,    /* the process has exited: the grace only */
    VASE_DRAIN_FALLBACK,  /* the process cannot be watched: VASED_DRAIN_FALLBACK */
};

/* Opens a pidfd (close-on-exec) for pid. 0 with *ret_fd, or -errno: -ESRCH (no such process),
 * -EINVAL (pid 0: the peer's pid is not visible here), -ENOSYS, -EPERM. */
int vase_drain_watch(pid_t pid, int *ret_fd);

/* Whether process pid, watched by pidfd (or -1 with pidfd_error from vase_drain_watch()), has
 * exited, is exiting (the kernel's PF_EXITING, read from /proc), or lives on. */
enum vase_drain_verdict vase_drain_judge(pid_t pid, int pidfd, int pidfd_error);

/*
 * Client c's session closed: if it has sequences on device arenas and its process may still
 * write them, decides until when (logged) and returns true; the caller then holds those
 * sequences (vase_registry_hold_seq()) and calls vase_drain_start(). False: release everything.
 */
bool vase_drain_must_hold(struct vased *d, struct vased_client *c);
/* Makes c, which holds sequences now, a draining client (vase_registry_drain_client()). */
void vase_drain_start(struct vased *d, struct vased_client *c);
/* The pidfd fd of draining client c became readable (its process exited): its pages return
 * after the grace. Nothing happens if c is no longer draining on fd. */
void vase_drain_on_exit(struct vased *d, struct vased_client *c, int fd, double now);
/* Releases the pages of every draining client whose time came at now. */
void vase_drain_tick(struct vased *d, double now);
