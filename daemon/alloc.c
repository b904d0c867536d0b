/* SPDX-License-Identifier: MIT */

/*
 * Page allocation. Invariants: a page is either on the free stack or marked used, never both;
 * n_free + (pages marked used) == num_pages; a reservation checks everything before it takes
 * anything, and a release checks everything before it returns anything, so no error leaves a
 * half-done operation behind (LESSONS.md: partial allocations leaked in kvcached).
 */

#include <errno.h>
#include <stdlib.h>

#include "alloc.h"

int vase_alloc_new(uint32_t num_pages, struct vase_alloc **ret) {
    if (num_pages == 0 || !ret)
        return -EINVAL;
    struct vase_alloc *a = calloc(1, sizeof(*a));
    if (!a)
        return -ENOMEM;
    a->num_pages = num_pages;
    a->free_stack = malloc((size_t)num_pages * sizeof(uint32_t));
    if (!a->free_stack)
        goto free_alloc;
    a->used = calloc(num_pages, 1);
    if (!a->used)
        goto free_alloc;
    /* Lowest page numbers on top, so a fresh daemon hands out 0, 1, 2...: easier to read. */
    for (uint32_t i = 0; i < num_pages; i++)
        a->free_stack[i] = num_pages - 1 - i;
    a->n_free = num_pages;
    *ret = a;
    return 0;

free_alloc:
    vase_alloc_free(a);
    return -ENOMEM;
}

struct vase_alloc *vase_alloc_free(struct vase_alloc *a) {
    if (!a)
        return NULL;
    free(a->free_stack);
    free(a->used);
    free(a);
    return NULL;
}

int vase_alloc_reserve(struct vase_alloc *a, uint32_t n, uint32_t quota, uint32_t *client_pages,
                       uint32_t *ret_pages) {
    if (!a || !client_pages || !ret_pages || n == 0)
        return -EINVAL;
    if (quota && (n > quota || *client_pages > quota - n))
        return -EDQUOT;
    if (n > a->n_free)
        return -ENOSPC;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t p = a->free_stack[--a->n_free];
        a->used[p] = 1;
        ret_pages[i] = p;
    }
    *client_pages += n;
    return 0;
}

int vase_alloc_release(struct vase_alloc *a, const uint32_t *pages, uint32_t n,
                       uint32_t *client_pages) {
    if (!a || (!pages && n))
        return -EINVAL;
    if (client_pages && *client_pages < n)
        return -EINVAL;
    /* Check first, marking with 2 so a page listed twice is caught; undo the marks on error. */
    uint32_t i;
    int r = 0;
    for (i = 0; i < n; i++) {
        uint32_t p = pages[i];
        if (p >= a->num_pages || a->used[p] != 1) {
            r = -EINVAL;
            break;
        }
        a->used[p] = 2;
    }
    if (r < 0) {
        while (i-- > 0)
            a->used[pages[i]] = 1;
        return r;
    }
    for (i = 0; i < n; i++) {
        a->used[pages[i]] = 0;
        a->free_stack[a->n_free++] = pages[i];
    }
    if (client_pages)
        *client_pages -= n;
    return 0;
}

bool vase_alloc_is_used(const struct vase_alloc *a, uint32_t p) {
    return a && p < a->num_pages && a->used[p];
}
