/* SPDX-License-Identifier: MIT */

/*
 * Page allocation in granules (alloc.h). Invariants: owner[g] != 0 exactly when refs[g] > 0, and
 * refs[g] counts the allocated pages of class owner[g] - 1 that touch granule g; starts[g] those
 * of them that start in g; n_free_granules counts the granules with owner 0; used_bytes sums the
 * bytes of allocated pages; a leaf of a class's bitmap exists exactly while it has a page
 * allocated. A reservation that cannot complete releases what it took before returning, through
 * the same path as a release, so no error leaves a half-done operation behind
 * (docs/ARCHITECTURE.md, "One budget, several engines").
 *
 * Placement: a class first fills holes in the granules it owns, then takes pages that extend
 * its granules into free ones, then pages from the free granules on, lowest address first; so
 * classes stay compact and a granule is shared by two classes only where they meet. Every pass
 * skips the granules in which no free page starts, so the work of a reservation grows with the
 * pages it takes and the granules of the arena, not with the pages a class holds.
 */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"

#define LEAF_BITS 65536u
#define LEAF_WORDS (LEAF_BITS / 64)

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
    a->starts = calloc(a->n_granules, sizeof(uint32_t));
    if (!a->owner || !a->refs || !a->starts) {
        vase_alloc_free(a);
        return -ENOMEM;
    }
    *ret = a;
    return 0;
}

static void class_clear(struct vase_alloc_class *c) {
    for (uint32_t i = 0; c->leaves && i < c->n_leaves; i++)
        free(c->leaves[i]);
    free(c->leaves);
    free(c->leaf_used);
    *c = (struct vase_alloc_class){0};
}

struct vase_alloc *vase_alloc_free(struct vase_alloc *a) {
    if (!a)
        return NULL;
    for (uint32_t i = 0; i < a->n_classes; i++)
        class_clear(&a->classes[i]);
    free(a->classes);
    free(a->owner);
    free(a->refs);
    free(a->starts);
    free(a);
    return NULL;
}

/* ---- bitmaps ---- */

static bool bit(const struct vase_alloc_class *c, uint32_t i) {
    const uint64_t *leaf = c->leaves[i / LEAF_BITS];
    uint32_t j = i % LEAF_BITS;
    return leaf && ((leaf[j / 64] >> (j % 64)) & 1u);
}

/* Sets or clears bit i, whose leaf must exist. */
static void set_bit(struct vase_alloc_class *c, uint32_t i, bool v) {
    uint64_t *leaf = c->leaves[i / LEAF_BITS];
    uint32_t j = i % LEAF_BITS;
    if (v)
        leaf[j / 64] |= UINT64_C(1) << (j % 64);
    else
        leaf[j / 64] &= ~(UINT64_C(1) << (j % 64));
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

static bool unit_valid(const struct vase_alloc *a, uint64_t unit) {
    return unit > 0 && unit <= a->arena_bytes && a->arena_bytes / unit <= VASE_ALLOC_MAX_UNITS;
}

/* The class of unit bytes, created if need be. -ENOMEM, -EINVAL. */
static int get_class(struct vase_alloc *a, uint64_t unit, uint32_t *ret_index) {
    if (find_class(a, unit, ret_index))
        return 0;
    if (!unit_valid(a, unit))
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
    uint32_t n_leaves = (n_units + LEAF_BITS - 1) / LEAF_BITS; /* <= 1024 */
    struct vase_alloc_class c = {
        .unit = unit,
        .n_units = n_units,
        .leaves = calloc(n_leaves, sizeof(uint64_t *)),
        .leaf_used = calloc(n_leaves, sizeof(uint32_t)),
        .n_leaves = n_leaves,
    };
    if (!c.leaves || !c.leaf_used) {
        class_clear(&c);
        return -ENOMEM;
    }
    if (slot == a->n_classes)
        a->n_classes++;
    a->classes[slot] = c;
    *ret_index = slot;
    return 0;
}

/* Drops a class that holds no page, so that page sizes no one uses cost nothing. */
static void put_class(struct vase_alloc *a, uint32_t ci) {
    if (a->classes[ci].n_used == 0)
        class_clear(&a->classes[ci]);
}

/* ---- pages ---- */

static void page_granules(const struct vase_alloc *a, uint64_t unit, uint32_t p, uint32_t *g0,
                          uint32_t *g1) {
    uint64_t start = (uint64_t)p * unit;
    *g0 = (uint32_t)(start / a->granule_bytes);
    *g1 = (uint32_t)((start + unit - 1) / a->granule_bytes);
}

/* Where page p of class ci could go: -1 if it is taken or a granule it touches belongs to
 * another class, else the number of its granules class ci owns already (capped at 1), and
 * *ret_all says whether that is all of them. */
static int page_fit(const struct vase_alloc *a, uint32_t ci, uint32_t p, bool *ret_all) {
    const struct vase_alloc_class *c = &a->classes[ci];
    if (bit(c, p))
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
    return owned > 0 ? 1 : 0;
}

/* Takes page p (page_fit() >= 0). 0, or -ENOMEM when its bitmap leaf cannot be had. */
static int take_page(struct vase_alloc *a, uint32_t ci, uint32_t p) {
    struct vase_alloc_class *c = &a->classes[ci];
    uint32_t l = p / LEAF_BITS;
    if (!c->leaves[l] && !(c->leaves[l] = calloc(LEAF_WORDS, sizeof(uint64_t))))
        return -ENOMEM;
    uint32_t g0, g1;
    page_granules(a, c->unit, p, &g0, &g1);
    for (uint32_t g = g0; g <= g1; g++) {
        if (a->refs[g]++ == 0) {
            a->owner[g] = ci + 1;
            a->n_free_granules--;
            c->granules++;
        }
    }
    a->starts[g0]++;
    set_bit(c, p, true);
    c->leaf_used[l]++;
    c->n_used++;
    a->used_bytes += c->unit;
    return 0;
}

static void drop_page(struct vase_alloc *a, uint32_t ci, uint32_t p) {
    struct vase_alloc_class *c = &a->classes[ci];
    uint32_t g0, g1, l = p / LEAF_BITS;
    page_granules(a, c->unit, p, &g0, &g1);
    for (uint32_t g = g0; g <= g1; g++) {
        if (--a->refs[g] == 0) {
            a->owner[g] = 0;
            a->n_free_granules++;
            c->granules--;
        }
    }
    a->starts[g0]--;
    set_bit(c, p, false);
    if (--c->leaf_used[l] == 0) {
        free(c->leaves[l]);
        c->leaves[l] = NULL;
    }
    c->n_used--;
    a->used_bytes -= c->unit;
}

/* Pages that start in granule g: [*lo, *hi). */
static void granule_starts(const struct vase_alloc *a, const struct vase_alloc_class *c, uint32_t g,
                           uint32_t *lo, uint32_t *hi) {
    uint64_t start = (uint64_t)g * a->granule_bytes, end = start + a->granule_bytes;
    uint64_t l = (start + c->unit - 1) / c->unit, h = (end + c->unit - 1) / c->unit;
    *lo = (uint32_t)(l < c->n_units ? l : c->n_units);
    *hi = (uint32_t)(h < c->n_units ? h : c->n_units);
}

/* Takes page p into out[*taken] if it fits the tier's rule (the file comment): tier 0, inside
 * owned granules; 1, touching an owned granule; 2, anywhere not another class's. */
static int try_page(struct vase_alloc *a, uint32_t ci, int tier, uint32_t p, uint32_t *out,
                    uint32_t *taken) {
    bool all;
    int owned = page_fit(a, ci, p, &all);
    if (owned < 0 || (tier == 0 && !(owned > 0 && all)) || (tier == 1 && owned == 0))
        return 0;
    int r = take_page(a, ci, p);
    if (r < 0)
        return r;
    out[(*taken)++] = p;
    return 0;
}

/* Tier 1 at granule g: only the pages that cross g's edges can reach into a free granule. */
static int try_edges(struct vase_alloc *a, uint32_t ci, uint32_t g, uint32_t n, uint32_t *out,
                     uint32_t *taken) {
    const struct vase_alloc_class *c = &a->classes[ci];
    uint32_t lo, hi;
    granule_starts(a, c, g, &lo, &hi);
    uint64_t first = (uint64_t)g * a->granule_bytes / c->unit;
    int r = 0;
    if (first < c->n_units)
        r = try_page(a, ci, 1, (uint32_t)first, out, taken);
    if (r == 0 && *taken < n && hi > lo && hi - 1 != first)
        r = try_page(a, ci, 1, hi - 1, out, taken);
    return r;
}

/* Takes up to n pages of class ci in one placement tier, writing them to out; *ret_taken says
 * how many it took. 0 or -ENOMEM (what was taken is in out). */
static int take_tier(struct vase_alloc *a, uint32_t ci, int tier, uint32_t n, uint32_t *out,
                     uint32_t *ret_taken) {
    const struct vase_alloc_class *c = &a->classes[ci];
    uint32_t taken = 0;
    int r = 0;
    for (uint32_t g = 0; g < a->n_granules && taken < n && r == 0; g++) {
        uint32_t owner = a->owner[g], lo, hi;
        if (tier < 2 ? owner != ci + 1 : owner != 0 && owner != ci + 1)
            continue;
        if (tier == 1) {
            r = try_edges(a, ci, g, n, out, &taken);
            continue;
        }
        granule_starts(a, c, g, &lo, &hi);
        if (a->starts[g] == hi - lo)
            continue; /* every page that starts here is taken */
        for (uint32_t p = lo; p < hi && taken < n && r == 0; p++)
            r = try_page(a, ci, tier, p, out, &taken);
    }
    *ret_taken = taken;
    return r;
}

static void release_taken(struct vase_alloc *a, const struct vase_alloc_req *reqs, size_t n_reqs,
                          size_t done, uint32_t partial) {
    for (size_t i = 0; i <= done && i < n_reqs; i++) {
        uint32_t ci, n = i < done ? reqs[i].n : partial;
        if (reqs[i].n == 0 || !find_class(a, reqs[i].unit, &ci))
            continue;
        for (uint32_t k = 0; k < n; k++)
            drop_page(a, ci, reqs[i].ret[k]);
        put_class(a, ci);
    }
}

/* The bytes of a reservation, its parts checked. 0, -EINVAL or -ENOSPC (a part larger than the
 * arena). */
static int reserve_bytes(const struct vase_alloc *a, const struct vase_alloc_req *reqs,
                         size_t n_reqs, uint64_t *ret) {
    uint64_t bytes = 0;
    for (size_t i = 0; i < n_reqs; i++) {
        if (reqs[i].n == 0)
            continue;
        if (!unit_valid(a, reqs[i].unit) || !reqs[i].ret)
            return -EINVAL;
        if (reqs[i].n > a->arena_bytes / reqs[i].unit)
            return -ENOSPC;
        bytes += reqs[i].unit * reqs[i].n; /* each term <= arena_bytes */
    }
    *ret = bytes;
    return 0;
}

/* Takes part i of a reservation whole, tier by tier. 0, or -ENOSPC/-ENOMEM with *ret_got pages
 * of it taken. */
static int reserve_part(struct vase_alloc *a, const struct vase_alloc_req *req, uint32_t *ret_got) {
    uint32_t ci, got = 0;
    int r = get_class(a, req->unit, &ci);
    for (int tier = 0; r == 0 && tier < 3 && got < req->n; tier++) {
        uint32_t t;
        r = take_tier(a, ci, tier, req->n - got, req->ret + got, &t);
        got += t;
    }
    *ret_got = got;
    return r == 0 && got < req->n ? -ENOSPC : r;
}

int vase_alloc_reserve(struct vase_alloc *a, const struct vase_alloc_req *reqs, size_t n_reqs,
                       uint64_t quota, uint64_t *client_bytes) {
    uint64_t bytes;
    if (!a || (!reqs && n_reqs) || !client_bytes)
        return -EINVAL;
    int r = reserve_bytes(a, reqs, n_reqs, &bytes);
    if (r < 0)
        return r;
    if (quota && (bytes > quota || *client_bytes > quota - bytes))
        return -EDQUOT;
    if (bytes > a->arena_bytes - a->used_bytes)
        return -ENOSPC;
    for (size_t i = 0; i < n_reqs; i++) {
        uint32_t got;
        if (reqs[i].n == 0)
            continue;
        r = reserve_part(a, &reqs[i], &got);
        if (r < 0) {
            release_taken(a, reqs, n_reqs, i, got);
            return r;
        }
    }
    *client_bytes += bytes;
    return 0;
}

/* Extends the pending run [*run_off, *run_off + *run_len) by [off, off + len), or emits it and
 * starts another. */
static void unheld_run(uint64_t off, uint64_t len, uint64_t *run_off, uint64_t *run_len,
                       void (*fn)(void *, uint64_t, uint64_t), void *ctx) {
    if (len == 0)
        return;
    if (*run_len && *run_off + *run_len == off) {
        *run_len += len;
        return;
    }
    if (*run_len)
        fn(ctx, *run_off, *run_len);
    *run_off = off;
    *run_len = len;
}

void vase_alloc_each_unheld(const struct vase_alloc *a,
                            void (*fn)(void *ctx, uint64_t off, uint64_t len), void *ctx) {
    uint64_t run_off = 0, run_len = 0;
    for (uint32_t g = 0; g < a->n_granules; g++) {
        uint64_t start = (uint64_t)g * a->granule_bytes, end = start + a->granule_bytes;
        if (a->owner[g] == 0) {
            unheld_run(start, a->granule_bytes, &run_off, &run_len, fn, ctx);
            continue;
        }
        /* An owned granule: the gaps between its class's allocated pages that touch it. */
        const struct vase_alloc_class *c = &a->classes[a->owner[g] - 1];
        uint64_t at = start;
        for (uint64_t p = start / c->unit; p * c->unit < end && p < c->n_units; p++) {
            if (!bit(c, (uint32_t)p))
                continue;
            uint64_t lo = p * c->unit, hi = lo + c->unit;
            if (lo < at)
                lo = at;
            if (hi > end)
                hi = end;
            if (lo > at)
                unheld_run(at, lo - at, &run_off, &run_len, fn, ctx);
            if (hi > at)
                at = hi;
        }
        unheld_run(at, end - at, &run_off, &run_len, fn, ctx);
    }
    if (run_len)
        fn(ctx, run_off, run_len);
}

void vase_alloc_set_release_hook(struct vase_alloc *a,
                                 void (*fn)(void *ctx, uint64_t off, uint64_t len), void *ctx) {
    a->on_release = fn;
    a->release_ctx = ctx;
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
    /* Check first, clearing each bit so a page listed twice is caught; restore on error. The
     * leaves stay: only drop_page() frees them. */
    uint32_t i;
    int r = 0;
    for (i = 0; i < n; i++) {
        if (pages[i] >= c->n_units || !bit(c, pages[i])) {
            r = -EINVAL;
            break;
        }
        set_bit(c, pages[i], false);
    }
    while (i-- > 0)
        set_bit(c, pages[i], true);
    if (r < 0)
        return r;
    /* The hook sees runs of adjacent pages as one range. */
    for (i = 0; a->on_release && i < n;) {
        uint32_t j = i + 1;
        while (j < n && pages[j] == pages[j - 1] + 1)
            j++;
        a->on_release(a->release_ctx, (uint64_t)pages[i] * unit, (uint64_t)(j - i) * unit);
        i = j;
    }
    for (i = 0; i < n; i++)
        drop_page(a, ci, pages[i]);
    put_class(a, ci);
    if (client_bytes)
        *client_bytes -= bytes;
    return 0;
}

int vase_alloc_claim(struct vase_alloc *a, uint64_t unit, const uint32_t *pages, uint32_t n,
                     uint64_t *client_bytes) {
    uint32_t ci, k = 0;
    bool all;
    if (n == 0)
        return 0;
    if (!pages || !unit_valid(a, unit))
        return -EINVAL;
    int r = get_class(a, unit, &ci);
    for (; r == 0 && k < n; k++) {
        if (pages[k] >= a->classes[ci].n_units || page_fit(a, ci, pages[k], &all) < 0)
            r = -EEXIST;
        else
            r = take_page(a, ci, pages[k]);
        if (r < 0)
            break;
    }
    if (r < 0) {
        while (k-- > 0)
            drop_page(a, ci, pages[k]);
        if (find_class(a, unit, &ci))
            put_class(a, ci);
        return r;
    }
    if (client_bytes)
        *client_bytes += unit * n;
    return 0;
}

bool vase_alloc_is_used(const struct vase_alloc *a, uint64_t unit, uint32_t p) {
    const struct vase_alloc_class *c = a ? find_class(a, unit, NULL) : NULL;
    return c && p < c->n_units && bit(c, p);
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
        granule_starts(a, c, g, &lo, &hi);
        for (uint32_t p = lo; p < hi; p++) {
            bool all;
            if (page_fit(a, ci, p, &all) > 0 && all)
                holes++;
        }
    }
    return holes;
}

/* The counts of the granules, recomputed from the classes' bitmaps. */
struct recount {
    uint32_t *owner, *refs, *starts;
};

static int recount_class(const struct vase_alloc *a, uint32_t ci, struct recount *rc, char *msg,
                         size_t msg_size) {
    const struct vase_alloc_class *c = &a->classes[ci];
    uint32_t n = 0, granules = 0;
    for (uint32_t l = 0; l < c->n_leaves; l++) {
        uint32_t in_leaf = 0;
        for (uint32_t p = l * LEAF_BITS; p < c->n_units && p < (l + 1) * LEAF_BITS; p++) {
            if (!bit(c, p))
                continue;
            in_leaf++;
            uint32_t g0, g1;
            page_granules(a, c->unit, p, &g0, &g1);
            rc->starts[g0]++;
            for (uint32_t g = g0; g <= g1; g++) {
                if (rc->owner[g] && rc->owner[g] != ci + 1) {
                    snprintf(msg, msg_size, "granule %u holds pages of two sizes", g);
                    return -EUCLEAN;
                }
                if (rc->owner[g] == 0)
                    granules++;
                rc->owner[g] = ci + 1;
                rc->refs[g]++;
            }
        }
        if (in_leaf != c->leaf_used[l] || (in_leaf == 0) != (c->leaves[l] == NULL)) {
            snprintf(msg, msg_size, "class of %llu bytes, leaf %u: %u pages counted, %u recorded",
                     (unsigned long long)c->unit, l, in_leaf, c->leaf_used[l]);
            return -EUCLEAN;
        }
        n += in_leaf;
    }
    if (n != c->n_used || granules != c->granules) {
        snprintf(msg, msg_size,
                 "class of %llu bytes: %u pages and %u granules counted, %u and %u recorded",
                 (unsigned long long)c->unit, n, granules, c->n_used, c->granules);
        return -EUCLEAN;
    }
    if (n == 0) {
        snprintf(msg, msg_size, "empty class of %llu bytes kept", (unsigned long long)c->unit);
        return -EUCLEAN;
    }
    return 0;
}

int vase_alloc_check(const struct vase_alloc *a, char *msg, size_t msg_size) {
    struct recount rc = {
        .owner = calloc(a->n_granules, sizeof(uint32_t)),
        .refs = calloc(a->n_granules, sizeof(uint32_t)),
        .starts = calloc(a->n_granules, sizeof(uint32_t)),
    };
    uint64_t used_bytes = 0;
    int r = 0;
    if (!rc.owner || !rc.refs || !rc.starts)
        r = -ENOMEM;
    for (uint32_t ci = 0; ci < a->n_classes && r == 0; ci++) {
        if (a->classes[ci].unit == 0)
            continue;
        r = recount_class(a, ci, &rc, msg, msg_size);
        used_bytes += (uint64_t)a->classes[ci].n_used * a->classes[ci].unit;
    }
    uint32_t free_granules = 0;
    for (uint32_t g = 0; g < a->n_granules && r == 0; g++) {
        free_granules += rc.owner[g] == 0;
        if (rc.owner[g] != a->owner[g] || rc.refs[g] != a->refs[g] ||
            rc.starts[g] != a->starts[g]) {
            snprintf(msg, msg_size,
                     "granule %u: owner %u refs %u starts %u counted, %u, %u and %u recorded", g,
                     rc.owner[g], rc.refs[g], rc.starts[g], a->owner[g], a->refs[g], a->starts[g]);
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
    free(rc.owner);
    free(rc.refs);
    free(rc.starts);
    return r;
}
