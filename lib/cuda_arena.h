/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * libvase's CUDA side, behind a header with no CUDA types: mapping device arenas (cuda-ipc,
 * cuda-vmm) once per process, stream synchronisation, copies, and compaction on the engine's
 * stream. lib/cuda.c implements it when libvase is built with CUDA; lib/nocuda.c refuses
 * every call with -EOPNOTSUPP otherwise. (The header is not called cuda.h: with -Iclient that
 * name would hide the toolkit's <cuda.h>.)
 *
 * Every function that touches a device makes the arena's device current for the call and
 * restores the caller's current device before it returns. CUDA failures are -errno: -ENOMEM
 * (allocation), -EINVAL (invalid value), -ENODEV (no device, no driver, no device with the
 * arena's UUID), -EBUSY (the device's compute mode does not let processes share it),
 * -EOPNOTSUPP (no CUDA in this build, or a driver without the VMM API), -EIO (anything else).
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct vase__arena;
struct vase_layout;
struct vase_plan_layout;

/*
 * Maps device arena a for this process, or takes another reference on the mapping this process
 * already has for (a->id, incarnation): a legacy IPC handle may be opened only once per process,
 * and a cache keyed by address would mistake a new allocation for an old one
 * (docs/ARCHITECTURE.md, "Memory that other processes have mapped"). Sets
 * a->map (device address), a->device and a->mapping; a cuda-vmm fd is closed once imported.
 * On failure msg (msg_len bytes) says why, for vase_last_error(). Thread-safe.
 */
int vase__cuda_map(struct vase__arena *a, uint64_t incarnation, char *msg, size_t msg_len);
/* Drops a's reference; the last one unmaps and closes the handle. Clears a->map and
 * a->mapping. Call before the session socket closes. */
void vase__cuda_unmap(struct vase__arena *a);

/* Waits for all work queued on stream (NULL: the legacy default stream) of device. */
int vase__cuda_sync(int device, void *stream);
/* Copies n bytes host to device (to_device) or device to host on stream, and waits for it. */
int vase__cuda_copy(int device, void *stream, void *dst, const void *src, size_t n, bool to_device);

/*
 * A sequence's device state: its block table (room for max_pages entries, the first n_pages
 * copied from table), a [heads][K] keep-list scratch and the
 * compaction kernel's scratch (scratch_bytes: vase_compact_cuda_scratch_bytes() of the largest
 * move one layer's K or V can make), in one allocation made at the open, so that applying a
 * plan allocates nothing. The table is copied to the device at once (waited for); afterwards
 * it only loses entries at its end, or gains them there when an elastic budget grows back
 * (vase__cuda_seq_set_table(), on the sequence's stream), so the device copy stays current for
 * the engine's kernels. The memory comes from mapping m's pool, on a stream of libvase's own (the
 * open waits for that stream only), and is freed on the sequence's stream
 * (vase__cuda_seq_set_stream()) without waiting; on a device without memory pools, from
 * cudaMalloc() and back by cudaFree(), which synchronises the device. Two events mark points of the
 * sequence's stream (vase__cuda_seq_mark()).
 */
struct vase__cuda_seq;
struct vase__cuda_mapping;
int vase__cuda_seq_new(struct vase__cuda_mapping *m, const uint32_t *table, size_t n_pages,
                       size_t max_pages, size_t keep_entries, size_t scratch_bytes,
                       struct vase__cuda_seq **ret);
/* The device copy of the block table. */
const uint32_t *vase__cuda_seq_table(const struct vase__cuda_seq *cs);
/* Copies entries [from, n) of the host block table to the device copy, on stream (ordered
 * before the engine's later kernels; the host table may change once this returns). n is at most
 * the pages of the open. 0, -EINVAL or -errno of the runtime. */
int vase__cuda_seq_set_table(struct vase__cuda_seq *cs, void *stream, const uint32_t *table,
                             size_t from, size_t n);
/* The stream the sequence's memory is freed on: the engine's for the sequence. */
void vase__cuda_seq_set_stream(struct vase__cuda_seq *cs, void *stream);
/* Frees the sequence's device memory, ordered after the work queued on its stream. */
struct vase__cuda_seq *vase__cuda_seq_free(struct vase__cuda_seq *cs);

/* Points of a sequence's stream that the stream-ordered cycle waits for without blocking. */
enum vase__cuda_mark {
    VASE__CUDA_COMPACTED, /* the last compaction enqueued by vase__cuda_compact(ordered) */
    VASE__CUDA_WRITTEN,   /* the engine's writes before an eviction request */
    VASE__CUDA_MARKS,
};
/* Records mark on stream (after the work queued on it so far). 0 or -errno. */
int vase__cuda_seq_mark(struct vase__cuda_seq *cs, void *stream, enum vase__cuda_mark mark);
/* Whether the work before mark has completed on the device: 1 yes (also when it was never
 * recorded), 0 not yet; wait: blocks the host until it has (never 0). -errno. */
int vase__cuda_seq_reached(struct vase__cuda_seq *cs, enum vase__cuda_mark mark, bool wait);

/* One eviction plan to apply on the device. */
struct vase__cuda_compact {
    const struct vase_layout *layout;
    void *arena_base;      /* device */
    const uint32_t *pages; /* the block table (host), n_pages entries */
    size_t n_pages;
    const uint32_t *plan_pages; /* host */
    const struct vase_plan_layout *plan;
    uint32_t keep, n, len;
};

/*
 * Applies a plan on stream through the device copy of the block table: for each layer its keep
 * lists copied device to device from the plan pages into the keep scratch, and
 * vase_compact_cuda() of its K and V in the sequence's scratch (nothing is allocated). Then,
 * host order (!ordered): waits for the stream, so that the commit that follows may release
 * pages the compaction read; stream order: records VASE__CUDA_COMPACTED after the compaction
 * and returns without waiting; the commit must wait for that mark. Returns the new length,
 * -EPROTO if the kernel refused the arguments (a move larger than the scratch included), or a
 * CUDA failure (the stream is then waited for); the sequence's memory may be half compacted
 * after a failure.
 */
int vase__cuda_compact(struct vase__cuda_seq *cs, void *stream, const struct vase__cuda_compact *c,
                       bool ordered);
