/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * Host arenas kept across a restart through systemd's file descriptor store
 * (FileDescriptorStoreMax= in vased.service). Each host arena's memfd is stored as
 * "arena-N" when it is made; a clean stop (SIGTERM) stores a sealed memfd "state" with a
 * snapshot of the sequences on those arenas. At the next start systemd hands them back
 * (LISTEN_FDS, LISTEN_FDNAMES): an arena whose configuration is unchanged keeps its memfd, its
 * contents included, and the snapshot's sequences go back on the registry's restored list with
 * their pages, waiting for their engines to reopen them (OpenSeq.resume_seq) within
 * restore_grace seconds. The snapshot is bound to the memory it describes: the stop stamps each
 * kept arena's memfd (arena.h, the stamp page) with its vased's incarnation and a random stop id
 * that the snapshot records too, and an arena is taken back only when the two agree (the stamp
 * is then cleared). Anything that does not match (a snapshot of another stop, a memfd that is
 * not the arena's), a missing snapshot (a crash) or a corrupt one discards what was kept, with
 * the reason logged. CUDA arenas are never kept: their memory belongs to the process that
 * allocated it.
 */

#include <stddef.h>
#include <stdint.h>

#include "core/arena.h"

struct vased;
struct vased_client;
struct vased_model;
struct vased_seq;

/* Snapshot format version, in the header before the Snapshot message of proto/vase.proto (4: the
 * first that is one); a snapshot of another is discarded. Fields added to the message keep it. */
#define VASE_RESTORE_VERSION 4u

/* An fd systemd passed under name: taken (1) if it is one the store kept ("arena-N",
 * "state"), else 0 (the caller's). -ENOMEM. */
int vase_restore_take_fd(struct vased *d, int fd, const char *name);

/* Reads the kept snapshot, if any, before the arenas are made. Logs why it is discarded when
 * it is; never fails the start for it. 0 or -ENOMEM. */
int vase_restore_load(struct vased *d);

/*
 * Arena i as configured (vase_arena_new()'s arguments): the kept memfd when the snapshot says
 * it is this arena, else a new arena, whose memfd (host) is given to the store. 0 or what
 * vase_arena_new() returns.
 */
int vase_restore_arena(struct vased *d, uint32_t i, const char *name, const char *spec,
                       enum vase_cuda_share share, uint64_t bytes, uint64_t granule_bytes,
                       struct vase_arena **ret);

/* After the registry and allocators exist: the snapshot's sequences of kept arenas back on the
 * restored list; the kept fds nobody uses are removed from the store. 0 or -ENOMEM. */
int vase_restore_seqs(struct vased *d);

/*
 * Reopen: client c takes restored sequence id with its model m. -ENOENT (no such sequence
 * waits), -EPERM (wrong token or another uid), -EINVAL (m's arena or geometry differs, or the
 * request's policy, budget or window); the reason in msg. 0 and *ret: the sequence is c's.
 */
int vase_restore_reopen(struct vased *d, struct vased_client *c, struct vased_model *m, uint32_t id,
                        const uint8_t *token, size_t token_len, enum vase_policy policy,
                        uint32_t budget, uint32_t window, struct vased_seq **ret, char *msg,
                        size_t msg_size);

/* A clean stop: stores the snapshot of every sequence on a kept host arena. */
void vase_restore_save(struct vased *d);

/* The timer: frees the restored sequences left when restore_grace has passed. */
void vase_restore_tick(struct vased *d, double now);

/* Bytes the restored sequences hold. */
uint64_t vase_restore_bytes(const struct vased *d);

/* Closes what is left; safe on a partial start. */
void vase_restore_done(struct vased *d);
