/* SPDX-License-Identifier: MIT */

/*
 * Unit tests of daemon/core/alloc.c: reservations over several page sizes that are all-or-nothing,
 * byte quotas, checked releases, pages at multiples of their size, granules owned by one size
 * at a time and returned as soon as their last page goes, holes reused before new granules; and
 * sequences of several real models churning in one large arena through the registry, with the
 * invariants checked throughout and the packing measured. The allocator only keeps books, so a
 * large arena costs no memory here.
 */

#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../daemon/core/alloc.h"
#include "../daemon/core/registry.h"

#define KIB (UINT64_C(1) << 10)
#define MIB (UINT64_C(1) << 20)
#define GIB (UINT64_C(1) << 30)

/* The allocator's own check of its books. */
static void check_books(const struct vase_alloc *a) {
    char msg[256] = "";
    int r = vase_alloc_check(a, msg, sizeof(msg));
    if (r != 0)
        fail_msg("vase_alloc_check: %d: %s", r, msg);
}

/* Everything an operation could change, to show that a refused one changed nothing. */
struct snapshot {
    uint64_t used_bytes, client_bytes;
    uint32_t n_free_granules, n_granules, n_classes;
    uint32_t *owner, *refs;
    struct vase_alloc_class *classes;
};

static void snap(const struct vase_alloc *a, uint64_t client_bytes, struct snapshot *s) {
    *s = (struct snapshot){
        .used_bytes = a->used_bytes,
        .client_bytes = client_bytes,
        .n_free_granules = a->n_free_granules,
        .n_granules = a->n_granules,
        .n_classes = a->n_classes,
        .owner = malloc(a->n_granules * sizeof(uint32_t)),
        .refs = malloc(a->n_granules * sizeof(uint32_t)),
        .classes = malloc((a->n_classes + 1) * sizeof(*a->classes)),
    };
    assert_non_null(s->owner);
    assert_non_null(s->refs);
    assert_non_null(s->classes);
    memcpy(s->owner, a->owner, a->n_granules * sizeof(uint32_t));
    memcpy(s->refs, a->refs, a->n_granules * sizeof(uint32_t));
    if (a->n_classes) /* classes is NULL before the first class */
        memcpy(s->classes, a->classes, a->n_classes * sizeof(*a->classes));
}

/* Asserts that a and client_bytes are as in s, and frees s. The granules' owners and reference
 * counts are compared whole; the bitmaps are not, but vase_alloc_check() recomputes those counts
 * from them. */
static void same_as(const struct vase_alloc *a, uint64_t client_bytes, struct snapshot *s) {
    assert_int_equal(a->used_bytes, s->used_bytes);
    assert_int_equal(client_bytes, s->client_bytes);
    assert_int_equal(a->n_free_granules, s->n_free_granules);
    assert_memory_equal(a->owner, s->owner, a->n_granules * sizeof(uint32_t));
    assert_memory_equal(a->refs, s->refs, a->n_granules * sizeof(uint32_t));
    /* A class made for the refused request is gone again (its slot may remain, unused). */
    for (uint32_t i = 0; i < a->n_classes; i++) {
        const struct vase_alloc_class *c = &a->classes[i];
        if (i >= s->n_classes) {
            assert_int_equal(c->unit, 0);
            continue;
        }
        assert_int_equal(c->unit, s->classes[i].unit);
        assert_int_equal(c->n_used, s->classes[i].n_used);
        assert_int_equal(c->granules, s->classes[i].granules);
    }
    free(s->owner);
    free(s->refs);
    free(s->classes);
}

/* The class of unit bytes, or NULL. */
static const struct vase_alloc_class *class_of(const struct vase_alloc *a, uint64_t unit,
                                               uint32_t *ret_index) {
    for (uint32_t i = 0; i < a->n_classes; i++)
        if (a->classes[i].unit == unit) {
            *ret_index = i;
            return &a->classes[i];
        }
    return NULL;
}

/* No class is left and every granule is free. */
static void all_free(const struct vase_alloc *a) {
    assert_int_equal(a->used_bytes, 0);
    assert_int_equal(a->n_free_granules, a->n_granules);
    assert_int_equal(vase_alloc_free_bytes(a), a->arena_bytes);
    assert_int_equal(vase_alloc_held_bytes(a), 0);
    for (uint32_t i = 0; i < a->n_classes; i++) {
        assert_int_equal(a->classes[i].unit, 0);
        assert_int_equal(a->classes[i].n_used, 0);
    }
    check_books(a);
}

/* Each page of unit bytes in pages[0 .. n) lies at [p * unit, (p + 1) * unit), inside the arena,
 * in granules that the page's class owns. */
static void pages_in_place(const struct vase_alloc *a, uint64_t unit, const uint32_t *pages,
                           uint32_t n) {
    uint32_t ci = 0;
    assert_non_null(class_of(a, unit, &ci));
    for (uint32_t i = 0; i < n; i++) {
        uint64_t start = (uint64_t)pages[i] * unit, end = start + unit;
        assert_true(end <= a->arena_bytes);
        assert_true(vase_alloc_is_used(a, unit, pages[i]));
        for (uint64_t g = start / a->granule_bytes; g <= (end - 1) / a->granule_bytes; g++) {
            assert_int_equal(a->owner[g], ci + 1);
            assert_true(a->refs[g] > 0);
        }
    }
}

static void test_new(void **state) {
    (void)state;
    struct vase_alloc *a = NULL;
    assert_int_equal(vase_alloc_new(0, 64 * KIB, &a), -EINVAL);
    assert_int_equal(vase_alloc_new(MIB, 0, &a), -EINVAL);
    assert_int_equal(vase_alloc_new(MIB + 4 * KIB, 64 * KIB, &a), -EINVAL);
    assert_int_equal(vase_alloc_new(MIB, 64 * KIB, NULL), -EINVAL);
    assert_null(a);
    assert_int_equal(vase_alloc_new(MIB, 64 * KIB, &a), 0);
    assert_int_equal(a->n_granules, 16);
    assert_int_equal(vase_alloc_free_bytes(a), MIB);
    assert_int_equal(vase_alloc_held_bytes(a), 0);
    all_free(a);
    assert_null(vase_alloc_free(a));
    assert_null(vase_alloc_free(NULL));
}

static void test_reserve_release(void **state) {
    (void)state;
    struct vase_alloc *a;
    uint64_t client = 0;
    uint32_t kv[4], plan[3];
    assert_int_equal(vase_alloc_new(MIB, 64 * KIB, &a), 0);
    struct vase_alloc_req parts[2] = {
        {.unit = 64 * KIB, .n = 4, .ret = kv},
        {.unit = 4 * KIB, .n = 3, .ret = plan},
    };
    assert_int_equal(vase_alloc_reserve(a, parts, 2, 0, &client), 0);
    assert_int_equal(client, 4 * 64 * KIB + 3 * 4 * KIB);
    assert_int_equal(a->used_bytes, client);
    /* Four granules of KV pages, one granule of plan pages. */
    assert_int_equal(vase_alloc_held_bytes(a), 5 * 64 * KIB);
    assert_int_equal(vase_alloc_free_bytes(a), 11 * 64 * KIB);
    pages_in_place(a, 64 * KIB, kv, 4);
    pages_in_place(a, 4 * KIB, plan, 3);
    for (uint32_t i = 0; i < 4; i++)
        for (uint32_t j = 0; j < i; j++)
            assert_int_not_equal(kv[i], kv[j]);
    check_books(a);

    /* Parts of no pages take nothing and need no buffer; an empty request is a success. */
    struct vase_alloc_req none = {.unit = 0, .n = 0, .ret = NULL};
    assert_int_equal(vase_alloc_reserve(a, &none, 1, 0, &client), 0);
    assert_int_equal(vase_alloc_reserve(a, NULL, 0, 0, &client), 0);
    assert_int_equal(client, 4 * 64 * KIB + 3 * 4 * KIB);

    assert_int_equal(vase_alloc_release(a, 64 * KIB, kv, 4, &client), 0);
    assert_int_equal(client, 3 * 4 * KIB);
    assert_false(vase_alloc_is_used(a, 64 * KIB, kv[0]));
    assert_int_equal(vase_alloc_release(a, 4 * KIB, plan, 3, NULL), 0);
    assert_int_equal(client, 3 * 4 * KIB); /* NULL: nobody is charged */
    assert_int_equal(vase_alloc_release(a, 4 * KIB, plan, 0, NULL), 0);
    all_free(a);
    vase_alloc_free(a);
}

/* Claims take exactly the pages named (a sequence kept across a restart), or none of them. */
static void test_claim(void **state) {
    (void)state;
    struct vase_alloc *a;
    uint64_t client = 0;
    assert_int_equal(vase_alloc_new(MIB, 64 * KIB, &a), 0);
    const uint32_t kv[3] = {7, 2, 9}, plan[2] = {1, 0};
    assert_int_equal(vase_alloc_claim(a, 64 * KIB, kv, 3, &client), 0);
    assert_int_equal(vase_alloc_claim(a, 4 * KIB, plan, 2, NULL), 0);
    assert_int_equal(client, 3 * 64 * KIB);
    for (uint32_t i = 0; i < 3; i++)
        assert_true(vase_alloc_is_used(a, 64 * KIB, kv[i]));
    assert_true(vase_alloc_is_used(a, 4 * KIB, 0) && vase_alloc_is_used(a, 4 * KIB, 1));
    check_books(a);
    uint64_t used = a->used_bytes;

    /* Taken already, listed twice, outside the arena, in a granule of another size: nothing of
     * the claim is taken, even the pages before the bad one. */
    const uint32_t again[2] = {3, 7}, twice[2] = {4, 4}, outside[2] = {5, 16}, other[1] = {32};
    assert_int_equal(vase_alloc_claim(a, 64 * KIB, again, 2, &client), -EEXIST);
    assert_int_equal(vase_alloc_claim(a, 64 * KIB, twice, 2, &client), -EEXIST);
    assert_int_equal(vase_alloc_claim(a, 64 * KIB, outside, 2, &client), -EEXIST);
    assert_int_equal(vase_alloc_claim(a, 4 * KIB, other, 1, &client), -EEXIST); /* granule 2 */
    assert_int_equal(vase_alloc_claim(a, 0, kv, 1, &client), -EINVAL);
    assert_false(vase_alloc_is_used(a, 64 * KIB, 3));
    assert_false(vase_alloc_is_used(a, 64 * KIB, 4));
    assert_false(vase_alloc_is_used(a, 64 * KIB, 5));
    assert_int_equal(a->used_bytes, used);
    assert_int_equal(client, 3 * 64 * KIB);
    check_books(a);

    /* Claimed pages are released like reserved ones, and a reservation goes around them. */
    uint32_t got[13];
    uint64_t other_client = 0;
    struct vase_alloc_req rest = {.unit = 64 * KIB, .n = 13, .ret = got};
    /* 12 granules are free */
    assert_int_equal(vase_alloc_reserve(a, &rest, 1, 0, &other_client), -ENOSPC);
    rest.n = 12;
    assert_int_equal(vase_alloc_reserve(a, &rest, 1, 0, &other_client), 0);
    assert_int_equal(vase_alloc_release(a, 64 * KIB, got, 12, &other_client), 0);
    assert_int_equal(vase_alloc_release(a, 64 * KIB, kv, 3, &client), 0);
    assert_int_equal(vase_alloc_release(a, 4 * KIB, plan, 2, NULL), 0);
    assert_int_equal(client, 0);
    all_free(a);
    vase_alloc_free(a);
}

/* -EINVAL for bad arguments; -EDQUOT checked before anything else; -ENOSPC; nothing taken. */
static void test_refusals(void **state) {
    (void)state;
    struct vase_alloc *a;
    uint64_t client = 0;
    uint32_t p[32];
    struct snapshot s;
    assert_int_equal(vase_alloc_new(MIB, 64 * KIB, &a), 0);

    struct vase_alloc_req r = {.unit = 0, .n = 1, .ret = p};
    snap(a, client, &s);
    assert_int_equal(vase_alloc_reserve(a, &r, 1, 0, &client), -EINVAL);
    r = (struct vase_alloc_req){.unit = 2 * MIB, .n = 1, .ret = p}; /* larger than the arena */
    assert_int_equal(vase_alloc_reserve(a, &r, 1, 0, &client), -EINVAL);
    r = (struct vase_alloc_req){.unit = 4 * KIB, .n = 1, .ret = NULL};
    assert_int_equal(vase_alloc_reserve(a, &r, 1, 0, &client), -EINVAL);
    assert_int_equal(vase_alloc_reserve(a, &r, 1, 0, NULL), -EINVAL);
    same_as(a, client, &s);
    check_books(a);

    /* 17 pages of 64 KiB: more than the arena holds. */
    r = (struct vase_alloc_req){.unit = 64 * KIB, .n = 17, .ret = p};
    snap(a, client, &s);
    assert_int_equal(vase_alloc_reserve(a, &r, 1, 0, &client), -ENOSPC);
    same_as(a, client, &s);
    check_books(a);

    /* The quota counts the client's holding plus the request, in bytes; exactly at it passes. */
    r = (struct vase_alloc_req){.unit = 64 * KIB, .n = 4, .ret = p};
    assert_int_equal(vase_alloc_reserve(a, &r, 1, 4 * 64 * KIB, &client), 0);
    r = (struct vase_alloc_req){.unit = 4 * KIB, .n = 1, .ret = p + 4};
    snap(a, client, &s);
    assert_int_equal(vase_alloc_reserve(a, &r, 1, 4 * 64 * KIB + 4 * KIB - 1, &client), -EDQUOT);
    same_as(a, client, &s);
    check_books(a);
    /* Over quota and over the arena at once: the quota is checked first. */
    r = (struct vase_alloc_req){.unit = 64 * KIB, .n = 16, .ret = p + 4};
    snap(a, client, &s);
    assert_int_equal(vase_alloc_reserve(a, &r, 1, 8 * 64 * KIB, &client), -EDQUOT);
    assert_int_equal(vase_alloc_reserve(a, &r, 1, 0, &client), -ENOSPC);
    same_as(a, client, &s);
    check_books(a);
    /* A holding above a (lowered) quota refuses everything but leaves the holding alone. */
    r = (struct vase_alloc_req){.unit = 4 * KIB, .n = 1, .ret = p + 4};
    assert_int_equal(vase_alloc_reserve(a, &r, 1, 64 * KIB, &client), -EDQUOT);
    assert_int_equal(client, 4 * 64 * KIB);

    /* The arena full to the byte: one more byte's worth of anything is refused. */
    r = (struct vase_alloc_req){.unit = 64 * KIB, .n = 12, .ret = p + 4};
    assert_int_equal(vase_alloc_reserve(a, &r, 1, 0, &client), 0);
    assert_int_equal(vase_alloc_free_bytes(a), 0);
    r = (struct vase_alloc_req){.unit = 4 * KIB, .n = 1, .ret = p + 16};
    snap(a, client, &s);
    assert_int_equal(vase_alloc_reserve(a, &r, 1, 0, &client), -ENOSPC);
    same_as(a, client, &s);
    check_books(a);
    assert_int_equal(vase_alloc_release(a, 64 * KIB, p, 16, &client), 0);
    assert_int_equal(client, 0);
    all_free(a);
    vase_alloc_free(a);
}

/* A reservation whose last part cannot be placed gives back what its first parts took. */
static void test_all_or_nothing(void **state) {
    (void)state;
    struct vase_alloc *a;
    uint64_t client = 0;
    uint32_t full[16], odd[8], small[2], big[1], mid[3];
    struct snapshot s;
    assert_int_equal(vase_alloc_new(MIB, 64 * KIB, &a), 0);

    /* Every other granule held: 8 free granules, no two adjacent. */
    struct vase_alloc_req r = {.unit = 64 * KIB, .n = 16, .ret = full};
    assert_int_equal(vase_alloc_reserve(a, &r, 1, 0, &client), 0);
    for (uint32_t i = 0; i < 8; i++)
        odd[i] = 2 * i + 1;
    assert_int_equal(vase_alloc_release(a, 64 * KIB, odd, 8, &client), 0);
    assert_int_equal(vase_alloc_free_bytes(a), 8 * 64 * KIB);
    check_books(a);

    /* 2 pages of 32 KiB fit in a free granule, 3 of 48 KiB in two granules, but no page of
     * 128 KiB finds two adjacent free granules: the bytes fit, the placement does not. */
    struct vase_alloc_req parts[3] = {
        {.unit = 32 * KIB, .n = 2, .ret = small},
        {.unit = 48 * KIB, .n = 3, .ret = mid},
        {.unit = 128 * KIB, .n = 1, .ret = big},
    };
    snap(a, client, &s);
    assert_int_equal(vase_alloc_reserve(a, parts, 3, 0, &client), -ENOSPC);
    same_as(a, client, &s);
    check_books(a);
    assert_int_equal(vase_alloc_class_holes(a, 32 * KIB), 0);
    /* The same first parts alone succeed, so it was the last part that undid them. */
    assert_int_equal(vase_alloc_reserve(a, parts, 2, 0, &client), 0);
    pages_in_place(a, 32 * KIB, small, 2);
    pages_in_place(a, 48 * KIB, mid, 3);
    check_books(a);
    assert_int_equal(vase_alloc_release(a, 32 * KIB, small, 2, &client), 0);
    assert_int_equal(vase_alloc_release(a, 48 * KIB, mid, 3, &client), 0);

    /* With granules 1 .. 9 free, the whole reservation goes through; the page of 128 KiB lies
     * at a multiple of 128 KiB, in two granules of its own. */
    uint32_t even[4] = {2, 4, 6, 8};
    assert_int_equal(vase_alloc_release(a, 64 * KIB, even, 4, &client), 0);
    assert_int_equal(vase_alloc_reserve(a, parts, 3, 0, &client), 0);
    pages_in_place(a, 32 * KIB, small, 2);
    pages_in_place(a, 48 * KIB, mid, 3);
    pages_in_place(a, 128 * KIB, big, 1);
    assert_true(big[0] >= 1 && big[0] <= 4); /* granules 2 .. 9 */
    check_books(a);
    vase_alloc_free(a);
}

/* A release that names a page not held, or one page twice, releases nothing. */
static void test_release_refusals(void **state) {
    (void)state;
    struct vase_alloc *a;
    uint64_t client = 0;
    uint32_t p[4];
    struct snapshot s;
    assert_int_equal(vase_alloc_new(MIB, 64 * KIB, &a), 0);
    struct vase_alloc_req r = {.unit = 16 * KIB, .n = 4, .ret = p};
    assert_int_equal(vase_alloc_reserve(a, &r, 1, 0, &client), 0);

    uint32_t unheld[3] = {p[0], p[1], 40};
    uint32_t twice[3] = {p[2], p[3], p[2]};
    uint32_t beyond[2] = {p[0], 64}; /* 64 pages of 16 KiB in the arena: 64 is past the end */
    snap(a, client, &s);
    assert_int_equal(vase_alloc_release(a, 16 * KIB, unheld, 3, &client), -EINVAL);
    assert_int_equal(vase_alloc_release(a, 16 * KIB, twice, 3, &client), -EINVAL);
    assert_int_equal(vase_alloc_release(a, 16 * KIB, beyond, 2, &client), -EINVAL);
    /* A size nobody holds, a client charged less than the pages. */
    assert_int_equal(vase_alloc_release(a, 32 * KIB, p, 1, &client), -EINVAL);
    uint64_t poor = 16 * KIB;
    assert_int_equal(vase_alloc_release(a, 16 * KIB, p, 2, &poor), -EINVAL);
    assert_int_equal(poor, 16 * KIB);
    assert_int_equal(vase_alloc_release(a, 16 * KIB, NULL, 1, &client), -EINVAL);
    same_as(a, client, &s);
    check_books(a);
    for (uint32_t i = 0; i < 4; i++)
        assert_true(vase_alloc_is_used(a, 16 * KIB, p[i]));

    assert_int_equal(vase_alloc_release(a, 16 * KIB, p, 4, &client), 0);
    /* Released once: a second release of the same pages is refused. */
    snap(a, client, &s);
    assert_int_equal(vase_alloc_release(a, 16 * KIB, p, 1, &client), -EINVAL);
    same_as(a, client, &s);
    check_books(a);
    all_free(a);
    vase_alloc_free(a);
}

/* The release hook: each run of adjacent released pages once, as its byte range, before the
 * pages can be reserved again; refused releases call it for none. */
struct hook_log {
    uint64_t off[8], len[8];
    int n;
};

static void record_release(void *ctx, uint64_t off, uint64_t len) {
    struct hook_log *h = ctx;
    assert_true(h->n < 8);
    h->off[h->n] = off;
    h->len[h->n] = len;
    h->n++;
}

static void test_release_hook(void **state) {
    (void)state;
    struct vase_alloc *a;
    struct hook_log h = {0};
    uint64_t client = 0;
    uint32_t p[4];
    assert_int_equal(vase_alloc_new(MIB, 64 * KIB, &a), 0);
    vase_alloc_set_release_hook(a, record_release, &h);
    struct vase_alloc_req r = {.unit = 16 * KIB, .n = 4, .ret = p};
    assert_int_equal(vase_alloc_reserve(a, &r, 1, 0, &client), 0);
    assert_int_equal(h.n, 0);
    uint32_t twice[2] = {p[0], p[0]};
    assert_int_equal(vase_alloc_release(a, 16 * KIB, twice, 2, &client), -EINVAL);
    assert_int_equal(h.n, 0);
    /* p[0], p[1] adjacent (one range), then p[3] alone. */
    uint32_t some[3] = {p[0], p[1], p[3]};
    assert_int_equal(p[1], p[0] + 1);
    assert_int_not_equal(p[3], p[1] + 1);
    assert_int_equal(vase_alloc_release(a, 16 * KIB, some, 3, &client), 0);
    assert_int_equal(h.n, 2);
    assert_int_equal(h.off[0], (uint64_t)p[0] * 16 * KIB);
    assert_int_equal(h.len[0], 32 * KIB);
    assert_int_equal(h.off[1], (uint64_t)p[3] * 16 * KIB);
    assert_int_equal(h.len[1], 16 * KIB);
    /* No hook: releases as before. */
    vase_alloc_set_release_hook(a, NULL, NULL);
    assert_int_equal(vase_alloc_release(a, 16 * KIB, &p[2], 1, &client), 0);
    assert_int_equal(h.n, 2);
    all_free(a);
    vase_alloc_free(a);
}

/* The bytes no allocated page covers, coalesced and in order: a free arena is one run; with
 * pages of two sizes held, the runs are the complement of those pages. */
static void test_each_unheld(void **state) {
    (void)state;
    struct vase_alloc *a;
    struct hook_log h = {0};
    uint64_t client = 0;
    uint32_t kv[2], small[1];
    assert_int_equal(vase_alloc_new(MIB, 64 * KIB, &a), 0);
    vase_alloc_each_unheld(a, record_release, &h);
    assert_int_equal(h.n, 1);
    assert_int_equal(h.off[0], 0);
    assert_int_equal(h.len[0], MIB);
    struct vase_alloc_req r[2] = {{.unit = 96 * KIB, .n = 2, .ret = kv},
                                  {.unit = 16 * KIB, .n = 1, .ret = small}};
    assert_int_equal(vase_alloc_reserve(a, r, 2, 0, &client), 0);
    uint64_t covered = 0;
    h.n = 0;
    vase_alloc_each_unheld(a, record_release, &h);
    assert_true(h.n >= 1);
    for (int i = 0; i < h.n; i++) {
        /* In order, not touching each other, and never over a held page. */
        if (i > 0)
            assert_true(h.off[i] > h.off[i - 1] + h.len[i - 1]);
        for (uint64_t b = h.off[i]; b < h.off[i] + h.len[i]; b += 4 * KIB) {
            for (int k = 0; k < 2; k++)
                assert_false(b >= kv[k] * 96 * KIB && b < (kv[k] + 1) * 96 * KIB);
            assert_false(b >= small[0] * 16 * KIB && b < (small[0] + 1) * 16 * KIB);
        }
        covered += h.len[i];
    }
    assert_int_equal(covered, MIB - 2 * 96 * KIB - 16 * KIB);
    assert_int_equal(vase_alloc_release(a, 96 * KIB, kv, 2, &client), 0);
    assert_int_equal(vase_alloc_release(a, 16 * KIB, small, 1, &client), 0);
    all_free(a);
    vase_alloc_free(a);
}

/* Page i of size U lies at i * U, also for sizes that do not divide a granule; two sizes never
 * share a granule. */
static void test_alignment_and_classes(void **state) {
    (void)state;
    struct vase_alloc *a;
    uint64_t client = 0;
    const uint64_t units[3] = {48 * KIB, 40 * KIB, 100 * KIB};
    uint32_t p[3][5];
    assert_int_equal(vase_alloc_new(2 * MIB, 64 * KIB, &a), 0);
    for (int round = 0; round < 2; round++)
        for (int u = 0; u < 3; u++) {
            /* Interleaved requests, so that the classes meet. */
            uint32_t *out = p[u] + (round ? 3 : 0);
            struct vase_alloc_req r = {.unit = units[u], .n = round ? 2 : 3, .ret = out};
            assert_int_equal(vase_alloc_reserve(a, &r, 1, 0, &client), 0);
            check_books(a);
        }
    assert_int_equal(client, 5 * (48 + 40 + 100) * KIB);
    /* Which granules each class's pages touch, computed from the indices alone. */
    uint8_t *who = calloc(a->n_granules, 1);
    assert_non_null(who);
    for (int u = 0; u < 3; u++) {
        pages_in_place(a, units[u], p[u], 5);
        for (int i = 0; i < 5; i++) {
            uint64_t start = p[u][i] * units[u], end = start + units[u];
            for (uint64_t g = start / a->granule_bytes; g <= (end - 1) / a->granule_bytes; g++) {
                assert_true(who[g] == 0 || who[g] == u + 1);
                who[g] = (uint8_t)(u + 1);
            }
        }
    }
    /* The granules held are exactly those the pages touch. */
    uint32_t touched = 0;
    for (uint32_t g = 0; g < a->n_granules; g++) {
        touched += who[g] != 0;
        assert_int_equal(who[g] != 0, a->owner[g] != 0);
    }
    assert_int_equal(vase_alloc_held_bytes(a), touched * a->granule_bytes);
    free(who);

    /* vase_alloc_check notices a granule given to two sizes. */
    char msg[256] = "";
    uint32_t g = (uint32_t)(p[0][0] * units[0] / a->granule_bytes), saved = a->owner[g];
    a->owner[g] = saved % 3 + 1;
    assert_int_equal(vase_alloc_check(a, msg, sizeof(msg)), -EUCLEAN);
    a->owner[g] = saved;
    check_books(a);
    vase_alloc_free(a);
}

/* A granule goes back to the free pool with its last page; the holes of a class are filled
 * before it takes a new granule. */
static void test_granules_return_and_holes(void **state) {
    (void)state;
    struct vase_alloc *a;
    uint64_t client = 0;
    uint32_t p[8], q[2];
    assert_int_equal(vase_alloc_new(MIB, 64 * KIB, &a), 0);
    struct vase_alloc_req r = {.unit = 16 * KIB, .n = 8, .ret = p}; /* two granules */
    assert_int_equal(vase_alloc_reserve(a, &r, 1, 0, &client), 0);
    assert_int_equal(vase_alloc_held_bytes(a), 2 * 64 * KIB);
    assert_int_equal(vase_alloc_class_holes(a, 16 * KIB), 0);

    /* Two holes, one in each granule: no granule comes free, and the holes are reused. */
    uint32_t gone[2] = {p[1], p[6]};
    assert_int_equal(vase_alloc_release(a, 16 * KIB, gone, 2, &client), 0);
    assert_int_equal(vase_alloc_held_bytes(a), 2 * 64 * KIB);
    assert_int_equal(vase_alloc_class_holes(a, 16 * KIB), 2);
    r = (struct vase_alloc_req){.unit = 16 * KIB, .n = 2, .ret = q};
    assert_int_equal(vase_alloc_reserve(a, &r, 1, 0, &client), 0);
    assert_true((q[0] == gone[0] && q[1] == gone[1]) || (q[0] == gone[1] && q[1] == gone[0]));
    assert_int_equal(vase_alloc_held_bytes(a), 2 * 64 * KIB);
    assert_int_equal(vase_alloc_class_holes(a, 16 * KIB), 0);
    check_books(a);

    /* The pages of the first granule one by one: it comes free with the last of them. */
    uint32_t first[4], n_first = 0, g0 = p[0] * 16 * KIB / (64 * KIB);
    uint32_t now[8] = {p[0], q[0], p[2], p[3], p[4], p[5], q[1], p[7]};
    for (uint32_t i = 0; i < 8; i++)
        if (now[i] * 16 * KIB / (64 * KIB) == g0)
            first[n_first++] = now[i];
    assert_int_equal(n_first, 4);
    for (uint32_t i = 0; i < 4; i++) {
        assert_int_equal(vase_alloc_held_bytes(a), 2 * 64 * KIB);
        assert_int_equal(a->owner[g0] != 0, 1);
        assert_int_equal(vase_alloc_release(a, 16 * KIB, first + i, 1, &client), 0);
        check_books(a);
    }
    assert_int_equal(a->owner[g0], 0);
    assert_int_equal(vase_alloc_held_bytes(a), 64 * KIB);
    /* Its pages are not holes of the class any more: the granule is free for any size. */
    assert_int_equal(vase_alloc_class_holes(a, 16 * KIB), 0);
    uint32_t other;
    r = (struct vase_alloc_req){.unit = 64 * KIB, .n = 1, .ret = &other};
    assert_int_equal(vase_alloc_reserve(a, &r, 1, 0, &client), 0);
    assert_int_equal(other, g0);
    check_books(a);
    vase_alloc_free(a);
}

/* A reservation of pages smaller than a granule fills each granule it claims before it claims
 * the next, also when its pages straddle granules. */
static void test_small_pages_pack(void **state) {
    (void)state;
    struct vase_alloc *a;
    uint64_t client = 0;
    uint32_t p[72], q[16];
    assert_int_equal(vase_alloc_new(MIB, 64 * KIB, &a), 0);
    struct vase_alloc_req r = {.unit = 8 * KIB, .n = 60, .ret = p};
    assert_int_equal(vase_alloc_reserve(a, &r, 1, 0, &client), 0);
    assert_int_equal(vase_alloc_held_bytes(a), 8 * 64 * KIB); /* ceil(60 / 8) granules */
    assert_int_equal(vase_alloc_class_holes(a, 8 * KIB), 4);
    pages_in_place(a, 8 * KIB, p, 60);
    /* Pages of 24 KiB straddle granules. From granule 8 (byte 512 Ki) on, the first page at a
     * multiple of 24 KiB starts at 528 Ki: 16 pages end at 912 Ki, in granule 14. */
    r = (struct vase_alloc_req){.unit = 24 * KIB, .n = 16, .ret = q};
    assert_int_equal(vase_alloc_reserve(a, &r, 1, 0, &client), 0);
    assert_int_equal(vase_alloc_held_bytes(a), 15 * 64 * KIB);
    pages_in_place(a, 24 * KIB, q, 16);
    for (uint32_t i = 0; i < 16; i++)
        assert_int_equal(q[i], 22 + i);
    /* Pages of 8 KiB fit in the 4 holes of their class and the free granule 15, not in the
     * rest of granule 14, which pages of 24 KiB hold: 12 pages, not 13. */
    r = (struct vase_alloc_req){.unit = 8 * KIB, .n = 13, .ret = p + 60};
    assert_int_equal(vase_alloc_reserve(a, &r, 1, 0, &client), -ENOSPC);
    r.n = 12;
    assert_int_equal(vase_alloc_reserve(a, &r, 1, 0, &client), 0);
    assert_int_equal(vase_alloc_free_bytes(a), 0);
    pages_in_place(a, 8 * KIB, p, 72);
    check_books(a);
    vase_alloc_free(a);
}

/* ---- many models in one arena ---- */

/*
 * A 16 GiB arena in granules of 2 MiB (8192 granules). A reservation scans the granules, and the
 * test runs under valgrind too: a larger arena only makes it slower, the prompts are sized so
 * that 20 to 200 sequences of each model fit.
 */
#define CHURN_ARENA (16 * GIB)
#define CHURN_GRANULE (2 * MIB)
#define CHURN_OPS 10000u
#define CHURN_SEED UINT64_C(0x5eed0fa110c)
#define MAX_LIVE 4096u

struct model_spec {
    const char *name;
    struct vase_layout_geometry g;
    uint32_t budget, window, prompt_min, prompt_max;
};

/* Real geometries (the small ones are Llama-3.2-1B and Qwen2.5-0.5B, whose pages of 256 tokens
 * are several granules and no multiple of one) with every block size and dtype mixed; each
 * model's sequences keep one plan size (budget - window), so KV, ring and plan pages make
 * classes of many sizes, some of which do not divide a granule. */
static const struct model_spec models[] = {
    {"qwen3-4b", {36, 32, 8, 128, VASE_DTYPE_F16, 1}, 1024, 32, 64, 8192},
    {"llama-3-8b", {32, 32, 8, 128, VASE_DTYPE_BF16, 16}, 2048, 64, 256, 8192},
    {"qwen3-14b", {40, 40, 8, 128, VASE_DTYPE_BF16, 64}, 2048, 64, 1024, 6144},
    {"llama-3.2-1b", {16, 32, 8, 64, VASE_DTYPE_F32, 256}, 1024, 128, 16, 4096},
    {"qwen2.5-0.5b", {24, 14, 2, 64, VASE_DTYPE_F32, 256}, 1024, 64, 16, 4096},
    {"qwen3-14b-256", {40, 40, 8, 128, VASE_DTYPE_BF16, 256}, 1024, 64, 16, 2048},
};
#define N_MODELS (sizeof(models) / sizeof(models[0]))

static uint64_t rng_next(uint64_t *s) {
    /* xorshift64* */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * UINT64_C(2685821657736338717);
}

static uint32_t rng_below(uint64_t *s, uint32_t n) {
    return (uint32_t)(rng_next(s) % n);
}

struct churn {
    struct vase_registry *reg;
    struct vase_alloc *alloc;
    struct vased_client *client;
    struct vased_model *m[N_MODELS];
    struct vased_seq *live[MAX_LIVE];
    uint32_t n_live;
    uint64_t refused, opened, closed, shrunk;
};

static void churn_init(struct churn *c) {
    char msg[256];
    *c = (struct churn){0};
    assert_int_equal(vase_registry_new(NULL, &c->reg), 0);
    assert_int_equal(vase_alloc_new(CHURN_ARENA, CHURN_GRANULE, &c->alloc), 0);
    assert_int_equal(vase_registry_add_client(c->reg, -1, &c->client), 0);
    for (size_t i = 0; i < N_MODELS; i++) {
        struct vase_layout l;
        int r = vase_layout_compute(&models[i].g, CHURN_ARENA, &l, msg, sizeof(msg));
        if (r != 0)
            fail_msg("%s: %s", models[i].name, msg);
        assert_int_equal(
            vase_registry_add_model(c->reg, c->client, models[i].name, 0, &l, &c->m[i]), 0);
    }
}

static struct vased_seq_request churn_request(size_t model, uint32_t prompt) {
    struct vased_seq_request req = {
        .policy = VASE_POLICY_VASE_ATTNV, .prompt_len = prompt, .slack = models[model].window};
    req.params = vase_params_default(models[model].budget);
    req.params.window = models[model].window;
    return req;
}

/* The books after any operation: free + held is the arena, pages fit in what is held, and the
 * client is charged exactly the bytes its live sequences hold. */
static void churn_books(const struct churn *c) {
    const struct vase_alloc *a = c->alloc;
    uint64_t bytes = 0;
    assert_int_equal(vase_alloc_free_bytes(a) + vase_alloc_held_bytes(a), a->arena_bytes);
    assert_true(a->used_bytes <= vase_alloc_held_bytes(a));
    for (uint32_t i = 0; i < c->n_live; i++)
        bytes += vase_registry_seq_bytes(c->live[i]);
    assert_int_equal(bytes, a->used_bytes);
    assert_int_equal(c->client->bytes, a->used_bytes);
    assert_int_equal(c->client->n_seqs, c->n_live);
}

/* Opens a sequence of model with a prompt; on refusal checks that nothing changed. 1 opened,
 * 0 refused. */
static int churn_open(struct churn *c, size_t model, uint32_t prompt, bool full_check) {
    struct vased_seq_request req = churn_request(model, prompt);
    struct vased_seq_footprint fp;
    struct vased_seq *s = NULL;
    struct snapshot before;
    char msg[256];

    assert_true(c->n_live < MAX_LIVE);
    assert_int_equal(vase_registry_footprint(&c->m[model]->layout, &req, &fp, msg, sizeof(msg)), 0);
    if (full_check)
        snap(c->alloc, c->client->bytes, &before);
    uint64_t used = c->alloc->used_bytes, free_bytes = vase_alloc_free_bytes(c->alloc);
    int r = vase_registry_open_seq(c->reg, c->alloc, c->client, c->m[model], &req, UINT32_MAX, 0,
                                   &s, msg, sizeof(msg));
    if (r == 0) {
        if (full_check) {
            free(before.owner);
            free(before.refs);
            free(before.classes);
        }
        assert_int_equal(vase_registry_seq_bytes(s), fp.bytes);
        assert_int_equal(c->alloc->used_bytes, used + fp.bytes);
        c->live[c->n_live++] = s;
        c->opened++;
        return 1;
    }
    if (r != -ENOSPC)
        fail_msg("open %s prompt %u: %d %s", models[model].name, prompt, r, msg);
    assert_int_equal(c->alloc->used_bytes, used);
    assert_int_equal(vase_alloc_free_bytes(c->alloc), free_bytes);
    if (full_check)
        same_as(c->alloc, c->client->bytes, &before);
    c->refused++;
    return 0;
}

static void churn_close(struct churn *c, uint32_t i) {
    assert_int_equal(vase_registry_close_seq(c->reg, c->alloc, c->live[i]), 0);
    c->live[i] = c->live[--c->n_live];
    c->closed++;
}

/* Closes everything: every granule comes back and no class is left. */
static void churn_done(struct churn *c) {
    while (c->n_live)
        churn_close(c, c->n_live - 1);
    churn_books(c);
    all_free(c->alloc);
    vase_registry_free(c->reg);
    vase_alloc_free(c->alloc);
}

/* Each model alone in the empty arena admits nearly as many sequences as fit by bytes. */
static void test_packing_alone(void **state) {
    (void)state;
    for (size_t m = 0; m < N_MODELS; m++) {
        struct churn c;
        char msg[256];
        struct vased_seq_footprint fp;
        uint32_t prompt = (models[m].prompt_min + models[m].prompt_max) / 2;
        struct vased_seq_request req = churn_request(m, prompt);

        churn_init(&c);
        assert_int_equal(vase_registry_footprint(&c.m[m]->layout, &req, &fp, msg, sizeof(msg)), 0);
        uint64_t ideal = CHURN_ARENA / fp.bytes;
        uint32_t admitted = 0;
        while (churn_open(&c, m, prompt, false))
            admitted++;
        churn_books(&c);
        check_books(c.alloc);
        print_message("packing %-10s alone: page %8" PRIu64 " B, ring %8" PRIu64
                      " B, plan %8" PRIu64 " B; %" PRIu64 " B a sequence; %u admitted of %" PRIu64
                      " by bytes (%.1f%%); %.1f%% of the arena in pages, %.1f%% held\n",
                      models[m].name, c.m[m]->layout.page_bytes, c.m[m]->layout.ring_page_bytes,
                      fp.plan.plan_page_bytes, fp.bytes, admitted, ideal,
                      100.0 * admitted / (double)ideal,
                      100.0 * c.alloc->used_bytes / (double)CHURN_ARENA,
                      100.0 * vase_alloc_held_bytes(c.alloc) / (double)CHURN_ARENA);
        assert_true(ideal >= 10);
        assert_true((uint64_t)admitted * 100 >= ideal * 95);
        assert_true(admitted <= ideal);
        churn_done(&c);
    }
}

/*
 * A seeded random churn of opens, closes and shrinks of sequences of every model. Phases of
 * 1000 operations alternate between mostly closing and mostly opening (the arena fills up and
 * opens are refused), the last one opening. After every operation the books balance; the
 * allocator's own check runs every 100 operations; every refused open leaves the allocator as it
 * was. Then, with the churn's sequences still open, sequences of random models are opened until one
 * is refused and the share of the arena in pages is reported.
 */
static void test_churn(void **state) {
    (void)state;
    struct churn c;
    uint64_t rng = CHURN_SEED;
    uint64_t per_model[N_MODELS] = {0};

    churn_init(&c);
    for (uint32_t op = 0; op < CHURN_OPS; op++) {
        uint32_t open_pct = (op / 1000) % 2 == 0 ? 35 : 70;
        uint32_t dice = rng_below(&rng, 100);
        if (c.n_live == 0 || dice < open_pct) {
            size_t m = rng_below(&rng, N_MODELS);
            uint32_t span = models[m].prompt_max - models[m].prompt_min + 1;
            uint32_t prompt = models[m].prompt_min + rng_below(&rng, span);
            per_model[m] += churn_open(&c, m, prompt, true);
        } else if (dice < open_pct + 5) {
            /* After its first eviction a sequence keeps only its steady slots. */
            struct vased_seq *s = c.live[rng_below(&rng, c.n_live)];
            uint32_t keep = vase_layout_blocks_for(
                &s->layout, vase_layout_steady_slots(s->params.budget, s->params.window, s->slack));
            uint64_t before = vase_registry_seq_bytes(s);
            bool surplus = keep < s->n_pages;
            int r = vase_registry_shrink_seq(s, c.alloc, keep);
            assert_int_equal(r, surplus ? 1 : 0);
            if (r == 1) {
                assert_int_equal(s->n_pages, keep);
                assert_true(vase_registry_seq_bytes(s) < before);
                c.shrunk++;
            } else
                assert_int_equal(vase_registry_seq_bytes(s), before);
        } else {
            churn_close(&c, rng_below(&rng, c.n_live));
        }
        churn_books(&c);
        if (op % 100 == 99)
            check_books(c.alloc);
    }
    check_books(c.alloc);
    char by_model[256] = "";
    for (size_t m = 0, len = 0; m < N_MODELS; m++)
        len += (size_t)snprintf(by_model + len, sizeof(by_model) - len, "%s%s %" PRIu64,
                                m ? ", " : "", models[m].name, per_model[m]);
    print_message("churn: %u operations: %" PRIu64 " opened (%s), %" PRIu64 " refused, %" PRIu64
                  " closed, %" PRIu64 " shrunk; %u open at the end\n",
                  CHURN_OPS, c.opened, by_model, c.refused, c.closed, c.shrunk, c.n_live);
    /* The seed makes every model open and the arena refuse: the test exercised what it claims. */
    for (size_t m = 0; m < N_MODELS; m++)
        assert_true(per_model[m] > 0);
    assert_true(c.refused > 0);

    /* Fill up behind the churn's survivors. */
    uint32_t survivors = c.n_live, added = 0;
    for (;;) {
        size_t m = rng_below(&rng, N_MODELS);
        uint32_t span = models[m].prompt_max - models[m].prompt_min + 1;
        if (!churn_open(&c, m, models[m].prompt_min + rng_below(&rng, span), true))
            break;
        added++;
    }
    churn_books(&c);
    check_books(c.alloc);
    print_message("churn: after it, %u more sequences fit beside its %u; pages of sequences fill "
                  "%.1f%% of the arena, granules held %.1f%%, %" PRIu64 " MiB free\n",
                  added, survivors, 100.0 * c.alloc->used_bytes / (double)CHURN_ARENA,
                  100.0 * vase_alloc_held_bytes(c.alloc) / (double)CHURN_ARENA,
                  vase_alloc_free_bytes(c.alloc) / MIB);
    churn_done(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_new),
        cmocka_unit_test(test_reserve_release),
        cmocka_unit_test(test_claim),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_all_or_nothing),
        cmocka_unit_test(test_release_refusals),
        cmocka_unit_test(test_release_hook),
        cmocka_unit_test(test_each_unheld),
        cmocka_unit_test(test_alignment_and_classes),
        cmocka_unit_test(test_granules_return_and_holes),
        cmocka_unit_test(test_small_pages_pack),
        cmocka_unit_test(test_packing_alone),
        cmocka_unit_test(test_churn),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
