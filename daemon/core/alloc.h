/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The allocator of one arena. The arena is cut into granules (granule_bytes); pages of many
 * sizes are carved from them: a model's KV pages (its page_bytes), query ring pages and plan
 * pages. A page of size U has an index i and lies at bytes [i * U, (i + 1) * U) of the arena, so
 * the kernels address it as block i of a tensor with block stride U. Pages of one size form a
 * class; a granule belongs to at most one class at a time (the granules a class owns are those
 * its pages touch, and only pages of that class go into them), and goes back to the free pool as
 * soon as no page touches it. A page may straddle granules; the only memory lost to carving is
 * where granules of two classes meet.
 *
 * Reservations are all-or-nothing over several sizes at once and charged in bytes against a
 * client's quota; releases check every page before they return any. Only the main thread
 * touches an allocator.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vase_layout.h"

/* Most pages of one size an arena may hold, the layout's bound: it also bounds a class's books. */
#define VASE_ALLOC_MAX_UNITS ((uint32_t)VASE_LAYOUT_MAX_UNITS)

struct vase_alloc_class {
    uint64_t unit;       /* page bytes; 0: the slot is unused */
    uint32_t n_units;    /* floor(arena_bytes / unit), at most VASE_ALLOC_MAX_UNITS */
    uint64_t **leaves;   /* bitmap of allocated pages in leaves of 2^16 bits, each allocated
                          * while it holds an allocated page: memory follows use, not size */
    uint32_t *leaf_used; /* allocated pages per leaf */
    uint32_t n_leaves;
    uint32_t n_used;   /* pages allocated */
    uint32_t granules; /* granules this class owns */
};

struct vase_alloc {
    uint64_t arena_bytes, granule_bytes;
    uint32_t n_granules;
    uint32_t n_free_granules;
    uint32_t *owner;  /* owner[g]: class index + 1, or 0 if granule g is free */
    uint32_t *refs;   /* refs[g]: allocated pages that touch granule g */
    uint32_t *starts; /* starts[g]: allocated pages that start in granule g */
    struct vase_alloc_class *classes;
    uint32_t n_classes;  /* slots in classes[], some unused */
    uint64_t used_bytes; /* bytes of all allocated pages */
    /* Called with each run of released bytes before they can be reserved again
     * (vase_alloc_set_release_hook); NULL: none. */
    void (*on_release)(void *ctx, uint64_t off, uint64_t len);
    void *release_ctx;
};

/* One part of a reservation: n pages of unit bytes, their indices written to ret[0 .. n). */
struct vase_alloc_req {
    uint64_t unit;
    uint32_t n;
    uint32_t *ret;
};

/*
 * Has fn(ctx, off, len) called by vase_alloc_release() for every run of contiguous bytes it
 * releases, before they can be reserved again (vased zeroes them there: arena.h,
 * vase_arena_clear()). fn NULL: no hook.
 */
void vase_alloc_set_release_hook(struct vase_alloc *a,
                                 void (*fn)(void *ctx, uint64_t off, uint64_t len), void *ctx);

/*
 * Calls fn(ctx, off, len) for every run of the arena's bytes that no allocated page covers, in
 * order and coalesced: what vased zeroes in a kept arena once the kept sequences have claimed
 * their pages (restore.h), since the previous daemon may have left bytes there it never released.
 */
void vase_alloc_each_unheld(const struct vase_alloc *a,
                            void (*fn)(void *ctx, uint64_t off, uint64_t len), void *ctx);

/* An allocator of arena_bytes in granules of granule_bytes (which must divide it), all free.
 * 0, -EINVAL or -ENOMEM. */
int vase_alloc_new(uint64_t arena_bytes, uint64_t granule_bytes, struct vase_alloc **ret);
struct vase_alloc *vase_alloc_free(struct vase_alloc *a);

/*
 * Takes every part of reqs[0 .. n_reqs) or nothing. *client_bytes is the client's holding and
 * grows by the bytes taken; quota 0 means none. -EDQUOT if the client would hold more than quota
 * (checked first), -ENOSPC if the arena has no room for all of it, -ENOMEM, -EINVAL (a unit of
 * 0 or larger than the arena, or more than VASE_ALLOC_MAX_UNITS pages of it). On failure nothing
 * is taken and *client_bytes is unchanged.
 */
int vase_alloc_reserve(struct vase_alloc *a, const struct vase_alloc_req *reqs, size_t n_reqs,
                       uint64_t quota, uint64_t *client_bytes);

/*
 * Returns pages[0 .. n) of unit bytes to the free pool and decreases *client_bytes (may be NULL)
 * by their bytes. -EINVAL, and nothing released, if any page is not allocated or listed twice.
 */
int vase_alloc_release(struct vase_alloc *a, uint64_t unit, const uint32_t *pages, uint32_t n,
                       uint64_t *client_bytes);

/*
 * Takes exactly pages[0 .. n) of unit bytes (a sequence kept across a restart: restore.h) and
 * adds their bytes to *client_bytes (may be NULL). -EEXIST, and nothing taken, if a page is
 * outside the arena, taken already (listed twice included) or in a granule of another size;
 * -EINVAL, -ENOMEM.
 */
int vase_alloc_claim(struct vase_alloc *a, uint64_t unit, const uint32_t *pages, uint32_t n,
                     uint64_t *client_bytes);
/* True if page p of unit bytes is allocated. */
bool vase_alloc_is_used(const struct vase_alloc *a, uint64_t unit, uint32_t p);
/* Bytes of the free granules: what any new page size can still use. */
uint64_t vase_alloc_free_bytes(const struct vase_alloc *a);
/* Bytes of the granules some class owns: arena_bytes - free bytes. */
uint64_t vase_alloc_held_bytes(const struct vase_alloc *a);
/* Pages of unit bytes the allocator could still hand out without taking a free granule (the
 * holes of that class). */
uint32_t vase_alloc_class_holes(const struct vase_alloc *a, uint64_t unit);

/*
 * Recomputes every count from the bitmaps and checks the invariants: each granule's owner and
 * reference count match the pages that touch it, free + held granules = all, used_bytes matches.
 * 0, or -EUCLEAN with the first broken invariant in msg. For tests and debugging: O(arena).
 */
int vase_alloc_check(const struct vase_alloc *a, char *msg, size_t msg_size);
