/* SPDX-License-Identifier: MIT */

/*
 * Page allocation in granules (alloc.h). Invariants: owner[g] != 0 exactly when refs[g] > 0, and
 * refs[g] counts the allocated pages of class owner[g] - 1 that touch granule g; n_free_granules
 * counts the granules with owner 0; used_bytes sums the bytes of allocated pages. A reservation
 * that cannot complete releases what it took before returning, through the same path as a
 * release, so no error leaves a half-done operation behind (LESSONS.md: partial allocations
 * leaked in kvcached).
 *
 * Placement: a class first fills holes in the granules it owns, then pages that extend its
 * granules into free ones, then pages in wholly free granules, lowest address first; so classes
 * stay compact and a granule is shared by two classes only where they meet.
 */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"

int vase_alloc_new(uint64_t arena_bytes, uint64_t granule_bytes, struct vase_alloc **ret) {
    if (!ret || granule_bytes == 0 || arena_bytes == 0 || arena_bytes % granule_bytes != 0 ||
        arena_bytes / granule_bytes > INT32_MAX)
        return -EINVAL;
    struct vase_alloc *a = calloc(1, sizeof(*a));
    if (!a)
        return -ENOMEM;
    a->arena_bytes = arena_bytes;
    a->granule_bytes = granule_bytes;
    a->n_granules = (uint32_t)(arena_bytes / granule_bytes);
    a->n_free_granules = a->n_granules;
    a->owner = calloc(a->n_granules, sizeof(uint32_t));
    a->refs = calloc(a->n_granules, sizeof(uint32_t));
    if (!a->owner || !a->refs) {
        vase_alloc_free(a);
        return -ENOMEM;
    }
    *ret = a;
    return 0;
}

struct vase_alloc *vase_alloc_free(struct vase_alloc *a) {
    if (!a)
        return NULL;
    for (uint32_t i = 0; i < a->n_classes; i++)
        free(a->classes[i].used);
    free(a->classes);
    free(a->owner);
    free(a->refs);
    free(a);
    return NULL;
}

/* ---- bitmaps ---- */

static bool bit(const uint64_t *map, uint32_t i) {
    return (map[i / 64] >> (i % 64)) & 1u;
}

static void set_bit(uint64_t *map, uint32_t i, bool v) {
    if (v)
        map[i / 64] |= UINT64_C(1) << (i % 64);
    else
        map[i / 64] &= ~(UINT64_C(1) << (i % 64));
}

/* ---- classes ---- */

static struct vase_alloc_class *find_class(const struct vase_alloc *a, uint64_t unit,
                                           uint32_t *ret_index) {
    for (uint32_t i = 0; i < a->n_classes; i++)
        if (a->classes[i].unit == unit) {
            if (ret_index)
                *ret_index = i;
            return &a->classes[i];
        }
    return NULL;
}

/* The class of unit bytes, created if need be (its bitmap included). -ENOMEM, -EINVAL. */
static int get_class(struct vase_alloc *a, uint64_t unit, uint32_t *ret_index) {
    if (find_class(a, unit, ret_index))
        return 0;
    if (unit == 0 || unit > a->arena_bytes || a->arena_bytes / unit > INT32_MAX)
        return -EINVAL;
    uint32_t slot = a->n_classes;
    for (uint32_t i = 0; i < a->n_classes; i++)
        if (a->classes[i].unit == 0) {
            slot = i;
            break;
        }
    if (slot == a->n_classes) {
        struct vase_alloc_class *c =
            realloc(a->classes, ((size_t)a->n_classes + 1) * sizeof(*a->classes));
        if (!c)
            return -ENOMEM;
        a->classes = c;
        a->classes[slot] = (struct vase_alloc_class){0};
    }
    uint32_t n_units = (uint32_t)(a->arena_bytes / unit);
    uint64_t *used = calloc(((size_t)n_units + 63) / 64, sizeof(uint64_t));
    if (!used)
        return -ENOMEM;
    if (slot == a->n_classes)
        a->n_classes++;
    a->classes[slot] = (struct vase_alloc_class){.unit = unit, .n_units = n_units, .used = used};
    *ret_index = slot;
    return 0;
}

/* Drops a class that holds no page, so that page sizes no one uses cost nothing. */
static void put_class(struct vase_alloc *a, uint32_t ci) {
    struct vase_alloc_class *c = &a->classes[ci];
    if (c->n_used)
        return;
    free(c->used);
    *c = (struct vase_alloc_class){0};
}

/* ---- pages ---- */

static void page_granules(const struct vase_alloc *a, uint64_t unit, uint32_t p, uint32_t *g0,
                          uint32_t *g1) {
    uint64_t start = (uint64_t)p * unit;
    *g0 = (uint32_t)(start / a->granule_bytes);
    *g1 = (uint32_t)((start + unit - 1) / a->granule_bytes);
}

/* Where page p of class ci could go: -1 if a granule it touches belongs to another class (or
 * the page is taken), else the number of its granules class ci owns already and *ret_all says
 * whether that is all of them. */
static int page_fit(const struct vase_alloc *a, uint32_t ci, uint32_t p, bool *ret_all) {
    const struct vase_alloc_class *c = &a->classes[ci];
    if (bit(c->used, p))
        return -1;
    uint32_t g0, g1, owned = 0;
    page_granules(a, c->unit, p, &g0, &g1);
    for (uint32_t g = g0; g <= g1; g++) {
        if (a->owner[g] == ci + 1)
            owned++;
        else if (a->owner[g] != 0)
            return -1;
    }
    *ret_all = owned == g1 - g0 + 1;
    return (int)(owned > 1 ? 1 : owned);
}

static void take_page(struct vase_alloc *a, uint32_t ci, uint32_t p) {
    struct vase_alloc_class *c = &a->classes[ci];
    uint32_t g0, g1;
    page_granules(a, c->unit, p, &g0, &g1);
    for (uint32_t g = g0; g <= g1; g++) {
        if (a->refs[g]++ == 0) {
            a->owner[g] = ci + 1;
            a->n_free_granules--;
            c->granules++;
        }
    }
    set_bit(c->used, p, true);
    c->n_used++;
    a->used_bytes += c->unit;
}

static void drop_page(struct vase_alloc *a, uint32_t ci, uint32_t p) {
    struct vase_alloc_class *c = &a->classes[ci];
    uint32_t g0, g1;
    page_granules(a, c->unit, p, &g0, &g1);
    for (uint32_t g = g0; g <= g1; g++) {
        if (--a->refs[g] == 0) {
            a->owner[g] = 0;
            a->n_free_granules++;
            c->granules--;
        }
    }
    set_bit(c->used, p, false);
    c->n_used--;
    a->used_bytes -= c->unit;
}

/* Pages that touch granule g: [*lo, *hi). */
static void granule_pages(const struct vase_alloc *a, const struct vase_alloc_class *c, uint32_t g,
                          uint32_t *lo, uint32_t *hi) {
    uint64_t start = (uint64_t)g * a->granule_bytes, end = start + a->granule_bytes;
    uint64_t l = start / c->unit, h = (end + c->unit - 1) / c->unit;
    *lo = (uint32_t)l;
    *hi = (uint32_t)(h < c->n_units ? h : c->n_units);
}

/* Takes up to n pages of class ci in one placement tier (the file comment), writing them to
 * out; returns how many it took. Tier 0: pages inside owned granules; 1: pages touching an
 * owned granule (and free ones); 2: pages in free granules. Tiers 1 and 2 go on filling the
 * granules they claim before they move to the next one: a class of pages smaller than a granule
 * would otherwise claim a granule per page, and tier 2 would stop with room left in them. */
static uint32_t take_tier(struct vase_alloc *a, uint32_t ci, int tier, uint32_t n, uint32_t *out) {
    struct vase_alloc_class *c = &a->classes[ci];
    uint32_t taken = 0, claimed_end = 0; /* tier 2: granules [.., claimed_end) it claimed */
    for (uint32_t g = 0; g < a->n_granules && taken < n; g++) {
        bool claimed = tier == 2 && a->owner[g] == ci + 1 && g < claimed_end;
        if (a->owner[g] != (tier < 2 ? ci + 1 : 0) && !claimed)
            continue;
        uint32_t lo, hi;
        granule_pages(a, c, g, &lo, &hi);
        for (uint32_t p = lo; p < hi && taken < n; p++) {
            bool all;
            int owned = page_fit(a, ci, p, &all);
            bool ok = tier == 0 ? owned > 0 && all : tier == 1 ? owned > 0 : owned >= 0;
            if (!ok)
                continue;
            take_page(a, ci, p);
            out[taken++] = p;
            uint32_t g0, g1;
            page_granules(a, c->unit, p, &g0, &g1);
            if (g1 + 1 > claimed_end)
                claimed_end = g1 + 1;
        }
    }
    return taken;
}

static void release_taken(struct vase_alloc *a, const struct vase_alloc_req *reqs, size_t n_reqs,
                          size_t done, uint32_t partial) {
    for (size_t i = 0; i <= done && i < n_reqs; i++) {
        uint32_t ci, n = i < done ? reqs[i].n : partial;
        /* The failing part's class may be new and hold nothing: drop it too. */
        if (reqs[i].unit == 0 || !find_class(a, reqs[i].unit, &ci))
            continue;
        for (uint32_t k = 0; k < n; k++)
            drop_page(a, ci, reqs[i].ret[k]);
        put_class(a, ci);
    }
}

int vase_alloc_reserve(struct vase_alloc *a, const struct vase_alloc_req *reqs, size_t n_reqs,
                       uint64_t quota, uint64_t *client_bytes) {
    if (!a || (!reqs && n_reqs) || !client_bytes)
        return -EINVAL;
    uint64_t bytes = 0;
    for (size_t i = 0; i < n_reqs; i++) {
        if (reqs[i].n == 0)
            continue;
        if (reqs[i].unit == 0 || reqs[i].unit > a->arena_bytes ||
            a->arena_bytes / reqs[i].unit > INT32_MAX || (reqs[i].n && !reqs[i].ret))
            return -EINVAL;
        if (reqs[i].n > a->arena_bytes / reqs[i].unit)
            return -ENOSPC;
        bytes += reqs[i].unit * reqs[i].n; /* each term <= arena_bytes */
    }
    if (quota && (bytes > quota || *client_bytes > quota - bytes))
        return -EDQUOT;
    if (bytes > a->arena_bytes - a->used_bytes)
        return -ENOSPC;

    for (size_t i = 0; i < n_reqs; i++) {
        uint32_t ci, got = 0;
        if (reqs[i].n == 0)
            continue;
        int r = get_class(a, reqs[i].unit, &ci);
        if (r < 0) {
            release_taken(a, reqs, n_reqs, i, 0);
            return r;
        }
        for (int tier = 0; tier < 3 && got < reqs[i].n; tier++)
            got += take_tier(a, ci, tier, reqs[i].n - got, reqs[i].ret + got);
        if (got < reqs[i].n) {
            release_taken(a, reqs, n_reqs, i, got);
            return -ENOSPC;
        }
    }
    *client_bytes += bytes;
    return 0;
}

int vase_alloc_release(struct vase_alloc *a, uint64_t unit, const uint32_t *pages, uint32_t n,
                       uint64_t *client_bytes) {
    if (!a || (!pages && n))
        return -EINVAL;
    if (n == 0)
        return 0;
    uint32_t ci;
    struct vase_alloc_class *c = find_class(a, unit, &ci);
    if (!c)
        return -EINVAL;
    uint64_t bytes = unit * n;
    if (client_bytes && *client_bytes < bytes)
        return -EINVAL;
    /* Check first, clearing each bit so a page listed twice is caught; restore on error. */
    uint32_t i;
    int r = 0;
    for (i = 0; i < n; i++) {
        if (pages[i] >= c->n_units || !bit(c->used, pages[i])) {
            r = -EINVAL;
            break;
        }
        set_bit(c->used, pages[i], false);
    }
    while (i-- > 0)
        set_bit(c->used, pages[i], true);
    if (r < 0)
        return r;
    for (i = 0; i < n; i++)
        drop_page(a, ci, pages[i]);
    put_class(a, ci);
    if (client_bytes)
        *client_bytes -= bytes;
    return 0;
}

bool vase_alloc_is_used(const struct vase_alloc *a, uint64_t unit, uint32_t p) {
    const struct vase_alloc_class *c = a ? find_class(a, unit, NULL) : NULL;
    return c && p < c->n_units && bit(c->used, p);
}

uint64_t vase_alloc_free_bytes(const struct vase_alloc *a) {
    return (uint64_t)a->n_free_granules * a->granule_bytes;
}

uint64_t vase_alloc_held_bytes(const struct vase_alloc *a) {
    return a->arena_bytes - vase_alloc_free_bytes(a);
}

uint32_t vase_alloc_class_holes(const struct vase_alloc *a, uint64_t unit) {
    uint32_t ci, holes = 0;
    const struct vase_alloc_class *c = find_class(a, unit, &ci);
    if (!c)
        return 0;
    for (uint32_t g = 0; g < a->n_granules; g++) {
        if (a->owner[g] != ci + 1)
            continue;
        uint32_t lo, hi;
        granule_pages(a, c, g, &lo, &hi);
        for (uint32_t p = lo; p < hi; p++) {
            bool all;
            uint32_t g0, g1;
            page_granules(a, c->unit, p, &g0, &g1);
            /* Count each hole once: at the first granule it touches. */
            if (g0 == g && page_fit(a, ci, p, &all) > 0 && all)
                holes++;
        }
    }
    return holes;
}

int vase_alloc_check(const struct vase_alloc *a, char *msg, size_t msg_size) {
    uint32_t *refs = calloc(a->n_granules, sizeof(uint32_t));
    uint32_t *owner = calloc(a->n_granules, sizeof(uint32_t));
    uint64_t used_bytes = 0;
    int r = 0;
    if (!refs || !owner) {
        free(refs);
        free(owner);
        return -ENOMEM;
    }
    for (uint32_t ci = 0; ci < a->n_classes && r == 0; ci++) {
        const struct vase_alloc_class *c = &a->classes[ci];
        if (c->unit == 0)
            continue;
        uint32_t n = 0, granules = 0;
        for (uint32_t p = 0; p < c->n_units && r == 0; p++) {
            if (!bit(c->used, p))
                continue;
            n++;
            uint32_t g0, g1;
            page_granules(a, c->unit, p, &g0, &g1);
            for (uint32_t g = g0; g <= g1; g++) {
                if (owner[g] && owner[g] != ci + 1) {
                    snprintf(msg, msg_size, "granule %u holds pages of two sizes", g);
                    r = -EUCLEAN;
                    break;
                }
                if (owner[g] == 0)
                    granules++;
                owner[g] = ci + 1;
                refs[g]++;
            }
        }
        used_bytes += (uint64_t)n * c->unit;
        if (r == 0 && (n != c->n_used || granules != c->granules)) {
            snprintf(msg, msg_size,
                     "class of %llu bytes: %u pages and %u granules counted, %u "
                     "and %u recorded",
                     (unsigned long long)c->unit, n, granules, c->n_used, c->granules);
            r = -EUCLEAN;
        }
        if (r == 0 && n == 0) {
            snprintf(msg, msg_size, "empty class of %llu bytes kept", (unsigned long long)c->unit);
            r = -EUCLEAN;
        }
    }
    uint32_t free_granules = 0;
    for (uint32_t g = 0; g < a->n_granules && r == 0; g++) {
        free_granules += owner[g] == 0;
        if (owner[g] != a->owner[g] || refs[g] != a->refs[g]) {
            snprintf(msg, msg_size, "granule %u: owner %u refs %u counted, %u and %u recorded", g,
                     owner[g], refs[g], a->owner[g], a->refs[g]);
            r = -EUCLEAN;
        }
    }
    if (r == 0 && (free_granules != a->n_free_granules || used_bytes != a->used_bytes)) {
        snprintf(msg, msg_size,
                 "%u free granules and %llu bytes used counted, %u and %llu recorded",
                 free_granules, (unsigned long long)used_bytes, a->n_free_granules,
                 (unsigned long long)a->used_bytes);
        r = -EUCLEAN;
    }
    free(refs);
    free(owner);
    return r;
}
