/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * Arenas: the memory the daemon owns and shares with engines, one per device. A backend sits
 * behind struct vase_arena_ops: create the memory, export it to a client, destroy it. Every
 * backend also gives the daemon a mapping it can read (the planners' views) and write (plan
 * pages): host memory for the host backend, a device address for the CUDA backends. Arenas
 * only hold memory; plans over them are computed by a planner (planner.h), chosen by whether
 * the memory is on a device. No CUDA type appears here: the CUDA backends live in
 * arena_cuda.c, or arena_nocuda.c in a build without CUDA, which refuses every CUDA arena.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct vase_arena;

/* How a CUDA arena is shared with clients (the cuda_share setting). */
enum vase_cuda_share {
    VASE_CUDA_SHARE_IPC = 0, /* cudaMalloc + legacy CUDA IPC handle: share "cuda-ipc" */
    VASE_CUDA_SHARE_VMM,     /* cuMemCreate + POSIX fd over SCM_RIGHTS: share "cuda-vmm" */
};

/* "ipc" / "vmm" to the enum. 0 or -EINVAL. */
int vase_cuda_share_from_string(const char *s, enum vase_cuda_share *ret);

struct vase_arena_ops {
    const char *share; /* "memfd", "cuda-ipc" or "cuda-vmm": how clients get at the memory */
    /* Allocates a->size bytes and fills a->map (and backend state). 0 or -errno, logged. */
    int (*create)(struct vase_arena *a);
    /* The fd a client receives with SCM_RIGHTS (owned by the arena: the caller must not close
     * it), or -1 when the backend shares by handle. 0 or -errno. */
    int (*export_fd)(const struct vase_arena *a, int *ret_fd);
    /* Frees what create made; safe on a half-created arena. */
    void (*destroy)(struct vase_arena *a);
    /* Zeroes bytes [off, off + len) of the arena, complete when it returns (a device's memset
     * waited for). 0 or -errno, logged. */
    int (*clear)(struct vase_arena *a, uint64_t off, uint64_t len);
    /* Whether the memory is on a device (only device code and CUDA copies may touch map), so
     * that the CUDA planner, not the CPU's, plans over it (planner.h). */
    bool on_device;
};

#define VASE_ARENA_IPC_HANDLE_MAX 64 /* CUDA_IPC_HANDLE_SIZE */
#define VASE_ARENA_UUID_MAX 48       /* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" and a NUL */

struct vase_arena {
    uint32_t id;
    char *kind; /* "host", "cuda:N" or "cuda:GPU-<uuid>", as configured */
    const struct vase_arena_ops *ops;
    uint64_t size;
    uint64_t granule_bytes; /* the allocator's unit (alloc.h) */
    uint32_t num_granules;
    void *map; /* the whole arena, readable and writable by the daemon (a device address for
                * CUDA arenas: only device code and CUDA copies may touch it) */
    int fd;    /* host: the memfd; cuda-vmm: the exported POSIX fd; -1 otherwise */
    void *backend;
    /* CUDA arenas: the device (ordinal in this process), its UUID as nvidia-smi prints it
     * (ArenaInfo.device_uuid), and the legacy IPC handle of the allocation (cuda-ipc). */
    int device;
    char device_uuid[VASE_ARENA_UUID_MAX];
    uint8_t ipc_handle[VASE_ARENA_IPC_HANDLE_MAX];
    size_t ipc_handle_len;
};

/*
 * Creates arena id from spec ("host", "cuda:N" or "cuda:GPU-<uuid>"), size bytes managed in
 * granules of granule_bytes (which must divide size and be a multiple of 4096); share chooses how a
 * CUDA arena is shared (ignored for host). -EINVAL for a bad spec or geometry, -EOPNOTSUPP for CUDA
 * in a build without it, -ENODEV (no such device, no driver), -EBUSY (the device's compute
 * mode forbids sharing it), -ENOMEM, -ENOTRECOVERABLE (a sticky CUDA error: the process's context
 * is lost), -EIO (other CUDA failures). Logs the reason.
 */
int vase_arena_new(uint32_t id, const char *spec, enum vase_cuda_share share, uint64_t size,
                   uint64_t granule_bytes, struct vase_arena **ret);
/*
 * A host arena on memfd fd, one a previous vased made and systemd's fd store kept (restore.h):
 * its contents are kept. On success the arena owns fd; on failure it stays the caller's.
 * -EBADFD (not a memfd sealed as host arenas are), -EMEDIUMTYPE (its size is not size and the
 * stamp page), -EINVAL (geometry), -ENOMEM, or mmap()'s -errno. Logs nothing: the caller says
 * why it is discarded. Whether the memory is the one a snapshot describes is the stamp's to say.
 */
int vase_arena_adopt_host(uint32_t id, int fd, uint64_t size, uint64_t granule_bytes,
                          struct vase_arena **ret);
struct vase_arena *vase_arena_free(struct vase_arena *a);

/*
 * The stamp page. A host arena's memfd is one page longer than the arena: clients are told the
 * arena's size (ArenaInfo.size_bytes) and map that much; the page past it is the daemon's. A
 * clean stop writes there which vased stopped with the memory and a random identity of that
 * stop, and records the same in its snapshot (restore.h); the next start takes the memory back
 * only when the two agree, and clears the stamp, so that a snapshot of another stop or a memfd
 * that is not the arena's is discarded, and one pair cannot be taken back twice. A client holds
 * the fd and can read or write the page, but what it reads before the stop is nothing the next
 * stop writes, and what it writes after can only have the memory discarded.
 */
#define VASE_ARENA_STAMP_PAGE 4096u
#define VASE_ARENA_STOP_ID_BYTES 16

struct vase_arena_stamp {
    uint32_t arena_id;    /* the arena's place among the arenas */
    uint64_t incarnation; /* the vased that stopped with it */
    uint8_t stop_id[VASE_ARENA_STOP_ID_BYTES];
};

/* Host arenas only (-EOPNOTSUPP otherwise). Writes st; 0 or -errno (-EIO for a short write). */
int vase_arena_write_stamp(const struct vase_arena *a, const struct vase_arena_stamp *st);
/* Reads the stamp into *ret: 0, -ENOMSG when the page holds none (a new or cleared arena, a
 * blank memfd), or -errno. */
int vase_arena_read_stamp(const struct vase_arena *a, struct vase_arena_stamp *ret);
/* Zeroes the stamp page's stamp: 0 or -errno. */
int vase_arena_clear_stamp(const struct vase_arena *a);

/*
 * Zeroes bytes [off, off + len) of the arena (bounds checked: -EINVAL), before the allocator
 * hands them to another sequence: a sequence never reads what another one wrote. 0 or -errno.
 */
int vase_arena_clear(struct vase_arena *a, uint64_t off, uint64_t len);

/* vase_arena_clear() with arena a void pointer, as the allocator's hooks call it (alloc.h):
 * a failure is logged. */
void vase_arena_zero(void *arena, uint64_t off, uint64_t len);

/* Address of byte offset off in the daemon's mapping (a device address for CUDA arenas). */
void *vase_arena_at(const struct vase_arena *a, uint64_t off);
/* Whether the arena's memory is on a device (its plans are computed there: planner.h). */
bool vase_arena_on_device(const struct vase_arena *a);

/* The host backend, exposed for tests. */
extern const struct vase_arena_ops vase_arena_host_ops;
/* The CUDA backends (arena_cuda.c; arena_nocuda.c refuses them), exposed for tests. */
extern const struct vase_arena_ops vase_arena_cuda_ipc_ops;
extern const struct vase_arena_ops vase_arena_cuda_vmm_ops;
/* Whether this build has the CUDA backends (false: arena_nocuda.c). */
extern const bool vase_arena_have_cuda;
