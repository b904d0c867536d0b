/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The state snapshot's bytes (snapshot.c) and what restore.c keeps of one: the kept fds, the
 * snapshot read at start, its stop and arenas. Only restore.c and snapshot.c include it.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/arena.h"
#include "core/registry.h"
#include "state.h"
#include "vase.pb-c.h"

struct saved_arena {
    char name[VASE_MAX_NAME + 1];
    uint64_t bytes, granule_bytes;
};

struct vase_restore {
    int arena_fd[VASED_MAX_ARENAS]; /* kept by the store, passed at start; -1 */
    int state_fd;
    bool kept[VASED_MAX_ARENAS];   /* arena i runs on the kept memfd */
    bool stored[VASED_MAX_ARENAS]; /* arena i's memfd is in the store */
    /* The snapshot read at start, when it is valid: its bytes (the message packed, header
     * first: it is unpacked where it is read), its stop and its arenas. */
    uint8_t *snap;
    size_t snap_len;
    uint32_t n_arenas, n_seqs;
    uint64_t incarnation; /* of the vased that wrote it, and its stop id: the arenas' stamps */
    uint8_t stop_id[VASE_ARENA_STOP_ID_BYTES];
    struct saved_arena arenas[VASED_MAX_ARENAS];
    double restored_at; /* when the sequences were kept: restore_grace counts from it */
};

/* A sequence read back from the snapshot: what the registry takes, and its model's geometry. */
struct kept_seq {
    struct vased_seq_saved sv;
    struct vase_layout_geometry geo;
};

/* Reads all of the state memfd rs->state_fd into rs->snap and checks its header, then takes the
 * stop and the arenas of its message into rs. 0, or -errno with why. */
int vase_snapshot_read(struct vase_restore *rs, char *why, size_t why_size);
/* The message of the snapshot vase_snapshot_read() took; the caller frees it. NULL if it does
 * not unpack. */
Vase__Snapshot *vase_snapshot_unpack(const struct vase_restore *rs);
/* Sequence m of the snapshot into k (its pages pointing into m): whether it is valid, and in
 * *ret_kept whether its arena was kept (only then is its layout computed and checked); why
 * not in msg. */
bool vase_snapshot_seq_from_msg(const Vase__SnapshotSeq *m, const struct vased *d,
                                struct kept_seq *k, bool *ret_kept, char *msg, size_t msg_size);
/* Live sequence s as a SnapshotSeq; m points into s. */
void vase_snapshot_seq_to_msg(const struct vased_seq *s, Vase__SnapshotSeq *m);
/* The snapshot's bytes: the header, then snap packed, in *ret_buf (the caller frees it). 0 or
 * -ENOMEM, -EFBIG. */
int vase_snapshot_pack(const Vase__Snapshot *snap, uint8_t **ret_buf, size_t *ret_len);
/* A sealed memfd holding buf (len bytes) in *ret_fd. 0 or -errno. */
int vase_snapshot_memfd(const uint8_t *buf, size_t len, int *ret_fd);
