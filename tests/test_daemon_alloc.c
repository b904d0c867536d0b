/* SPDX-License-Identifier: MIT */

/* Unit tests of daemon/alloc.c: all-or-nothing reservations, quotas, checked releases. */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../daemon/alloc.h"

/* n_free + used pages == num_pages, and the free stack holds exactly the unused pages. */
static void check_invariants(const struct vase_alloc *a) {
    uint32_t used = 0;
    uint8_t *seen = calloc(a->num_pages, 1);
    assert_non_null(seen);
    for (uint32_t p = 0; p < a->num_pages; p++)
        used += vase_alloc_is_used(a, p);
    assert_int_equal(used + a->n_free, a->num_pages);
    for (uint32_t i = 0; i < a->n_free; i++) {
        uint32_t p = a->free_stack[i];
        assert_true(p < a->num_pages);
        assert_false(vase_alloc_is_used(a, p));
        assert_false(seen[p]);
        seen[p] = 1;
    }
    free(seen);
}

static void test_new(void **state) {
    (void)state;
    struct vase_alloc *a = NULL;
    assert_int_equal(vase_alloc_new(0, &a), -EINVAL);
    assert_null(a);
    assert_int_equal(vase_alloc_new(8, &a), 0);
    assert_int_equal(a->n_free, 8);
    check_invariants(a);
    assert_null(vase_alloc_free(a));
    assert_null(vase_alloc_free(NULL));
}

static void test_reserve_release(void **state) {
    (void)state;
    struct vase_alloc *a;
    uint32_t pages[8], more[8], client = 0;
    assert_int_equal(vase_alloc_new(8, &a), 0);

    assert_int_equal(vase_alloc_reserve(a, 0, 0, &client, pages), -EINVAL);
    assert_int_equal(vase_alloc_reserve(a, 3, 0, &client, pages), 0);
    assert_int_equal(client, 3);
    assert_int_equal(a->n_free, 5);
    for (int i = 0; i < 3; i++)
        assert_true(vase_alloc_is_used(a, pages[i]));
    assert_int_not_equal(pages[0], pages[1]);
    assert_int_not_equal(pages[1], pages[2]);
    check_invariants(a);

    /* More than is free: nothing taken. */
    assert_int_equal(vase_alloc_reserve(a, 6, 0, &client, more), -ENOSPC);
    assert_int_equal(client, 3);
    assert_int_equal(a->n_free, 5);
    check_invariants(a);

    /* Exactly what is free. */
    assert_int_equal(vase_alloc_reserve(a, 5, 0, &client, more), 0);
    assert_int_equal(a->n_free, 0);
    assert_int_equal(vase_alloc_reserve(a, 1, 0, &client, more + 5), -ENOSPC);
    check_invariants(a);

    /* Releases are checked whole: a page not allocated, out of range or listed twice spoils
     * the call and nothing is released. */
    uint32_t bad[2] = {more[0], 99};
    assert_int_equal(vase_alloc_release(a, bad, 2, &client), -EINVAL);
    uint32_t dup[2] = {more[0], more[0]};
    assert_int_equal(vase_alloc_release(a, dup, 2, &client), -EINVAL);
    assert_int_equal(a->n_free, 0);
    assert_int_equal(client, 8);
    check_invariants(a);

    assert_int_equal(vase_alloc_release(a, more, 5, &client), 0);
    assert_int_equal(client, 3);
    assert_int_equal(vase_alloc_release(a, more, 1, &client), -EINVAL); /* double free */
    assert_int_equal(vase_alloc_release(a, pages, 3, &client), 0);
    assert_int_equal(client, 0);
    assert_int_equal(a->n_free, 8);
    /* The client cannot release more than it holds. */
    assert_int_equal(vase_alloc_reserve(a, 2, 0, &client, pages), 0);
    client = 1;
    assert_int_equal(vase_alloc_release(a, pages, 2, &client), -EINVAL);
    assert_int_equal(vase_alloc_release(a, pages, 2, NULL), 0);
    check_invariants(a);
    vase_alloc_free(a);
}

static void test_quota(void **state) {
    (void)state;
    struct vase_alloc *a;
    uint32_t pages[16], client = 0;
    assert_int_equal(vase_alloc_new(16, &a), 0);

    assert_int_equal(vase_alloc_reserve(a, 5, 4, &client, pages), -EDQUOT);
    assert_int_equal(vase_alloc_reserve(a, 3, 4, &client, pages), 0);
    assert_int_equal(vase_alloc_reserve(a, 2, 4, &client, pages + 3), -EDQUOT);
    assert_int_equal(client, 3);
    assert_int_equal(a->n_free, 13);
    assert_int_equal(vase_alloc_reserve(a, 1, 4, &client, pages + 3), 0);
    assert_int_equal(client, 4);
    /* The quota is checked before the free count: over both gives EDQUOT. */
    assert_int_equal(vase_alloc_reserve(a, 100, 4, &client, pages), -EDQUOT);
    /* Without a quota, the arena is the limit. */
    assert_int_equal(vase_alloc_reserve(a, 100, 0, &client, pages), -ENOSPC);
    /* A huge quota does not overflow. */
    assert_int_equal(vase_alloc_reserve(a, 12, UINT32_MAX, &client, pages + 4), 0);
    assert_int_equal(client, 16);
    assert_int_equal(vase_alloc_release(a, pages, 16, &client), 0);
    assert_int_equal(client, 0);
    check_invariants(a);
    vase_alloc_free(a);
}

static void test_random(void **state) {
    (void)state;
    struct vase_alloc *a;
    enum { N = 64, SLOTS = 16 };
    uint32_t held[SLOTS][N], n_held[SLOTS] = {0}, client = 0;
    assert_int_equal(vase_alloc_new(N, &a), 0);
    srand(7);
    for (int step = 0; step < 5000; step++) {
        int s = rand() % SLOTS;
        if (n_held[s]) {
            assert_int_equal(vase_alloc_release(a, held[s], n_held[s], &client), 0);
            n_held[s] = 0;
        } else {
            uint32_t n = 1 + (uint32_t)(rand() % 12), before = a->n_free, c0 = client;
            int r = vase_alloc_reserve(a, n, 40, &client, held[s]);
            if (r == 0) {
                n_held[s] = n;
                assert_int_equal(a->n_free, before - n);
            } else {
                assert_true(r == -ENOSPC || r == -EDQUOT);
                assert_int_equal(a->n_free, before);
                assert_int_equal(client, c0);
            }
        }
        if (step % 100 == 0)
            check_invariants(a);
    }
    for (int s = 0; s < SLOTS; s++)
        assert_int_equal(vase_alloc_release(a, held[s], n_held[s], &client), 0);
    assert_int_equal(client, 0);
    assert_int_equal(a->n_free, N);
    check_invariants(a);
    vase_alloc_free(a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_new),
        cmocka_unit_test(test_reserve_release),
        cmocka_unit_test(test_quota),
        cmocka_unit_test(test_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
