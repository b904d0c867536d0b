/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * Arenas: the memory the daemon owns and shares with engines, one per device. A backend
 * (host now, CUDA later) sits behind struct vase_arena_ops: create the memory, export it to a
 * client, destroy it. Every backend also gives the daemon a mapping it can read (the evictor's
 * views) and write (plan pages).
 */

#include <stdint.h>

struct vase_arena;

struct vase_arena_ops {
    const char *share; /* "memfd", "cuda-ipc" or "cuda-vmm": how clients get at the memory */
    /* Allocates a->size bytes and fills a->map (and backend state). 0 or -errno, logged. */
    int (*create)(struct vase_arena *a);
    /* The fd a client receives with SCM_RIGHTS (owned by the arena: the caller must not close
     * it), or -1 when the backend shares by handle. 0 or -errno. */
    int (*export_fd)(const struct vase_arena *a, int *ret_fd);
    /* Frees what create made; safe on a half-created arena. */
    void (*destroy)(struct vase_arena *a);
};

struct vase_arena {
    uint32_t id;
    char *kind; /* "host" or "cuda:N" */
    const struct vase_arena_ops *ops;
    uint64_t size;
    uint64_t page_bytes;
    uint32_t num_pages;
    void *map; /* the whole arena, readable and writable by the daemon */
    int fd;    /* host: the memfd; -1 otherwise */
    void *backend;
};

/*
 * Creates arena id from spec ("host", "cuda:N"), size bytes cut into pages of page_bytes (which
 * must divide size and be a multiple of 4096). -EINVAL for a bad spec or geometry,
 * -EOPNOTSUPP for CUDA in this build, -errno of the backend. Logs the reason.
 */
int vase_arena_new(uint32_t id, const char *spec, uint64_t size, uint64_t page_bytes,
                   struct vase_arena **ret);
struct vase_arena *vase_arena_free(struct vase_arena *a);

/* Address of page p in the daemon's mapping. p < num_pages. */
void *vase_arena_page(const struct vase_arena *a, uint32_t p);

/* The host backend, exposed for tests. */
extern const struct vase_arena_ops vase_arena_host_ops;
