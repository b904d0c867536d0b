/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The page allocator of one arena: which pages are free. Reservations are all-or-nothing
 * against the free count and a client's quota; releases check that every page was allocated.
 * Only the main thread touches an allocator.
 */

#include <stdbool.h>
#include <stdint.h>

struct vase_alloc {
    uint32_t num_pages;
    uint32_t n_free;
    uint32_t *free_stack; /* free_stack[0 .. n_free) are the free pages */
    uint8_t *used;        /* used[p]: page p is allocated */
};

/* An allocator of num_pages pages (>= 1), all free. 0, -EINVAL or -ENOMEM. */
int vase_alloc_new(uint32_t num_pages, struct vase_alloc **ret);
struct vase_alloc *vase_alloc_free(struct vase_alloc *a);

/*
 * Takes n pages into ret_pages[0..n). *client_pages is the client's current holding and is
 * increased by n; quota 0 means none. -EDQUOT if the client would hold more than quota (checked
 * first: it is the client's own limit), -ENOSPC if fewer than n pages are free, -EINVAL for
 * n == 0. On failure nothing is taken and *client_pages is unchanged.
 */
int vase_alloc_reserve(struct vase_alloc *a, uint32_t n, uint32_t quota, uint32_t *client_pages,
                       uint32_t *ret_pages);

/*
 * Returns pages[0..n) to the free pool and decreases *client_pages (may be NULL) by n. -EINVAL,
 * and nothing released, if any page is out of range, not allocated, or listed twice.
 */
int vase_alloc_release(struct vase_alloc *a, const uint32_t *pages, uint32_t n,
                       uint32_t *client_pages);

/* True if page p is allocated. */
bool vase_alloc_is_used(const struct vase_alloc *a, uint32_t p);
