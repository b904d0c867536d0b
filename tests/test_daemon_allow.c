/* SPDX-License-Identifier: MIT */

/* Unit tests of daemon/core/allow.c: the allow-list decision, parsing, and a peer's groups. */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "../daemon/core/allow.h"

static void test_allow_check(void **state) {
    (void)state;
    uid_t self = 990;
    struct vase_allow none = {0};
    /* Both lists empty: root and the daemon's own user only. */
    assert_int_equal(vase_allow_check(&none, self, 0, 0, NULL, 0), 0);
    assert_int_equal(vase_allow_check(&none, self, self, 5, NULL, 0), 0);
    assert_int_equal(vase_allow_check(&none, self, 1000, 1000, NULL, 0), -EPERM);
    gid_t g990[] = {990};
    assert_int_equal(vase_allow_check(&none, self, 1000, 1000, g990, 1), -EPERM);

    uid_t uids[] = {1000, 1001};
    gid_t gids[] = {50, 60};
    struct vase_allow a = {.uids = uids, .n_uids = 2, .gids = gids, .n_gids = 2};
    assert_int_equal(vase_allow_check(&a, self, 1001, 7, NULL, 0), 0);  /* listed user */
    assert_int_equal(vase_allow_check(&a, self, 2000, 60, NULL, 0), 0); /* primary group */
    gid_t sup[] = {3, 4, 50};
    assert_int_equal(vase_allow_check(&a, self, 2000, 7, sup, 3), 0); /* supplementary */
    assert_int_equal(vase_allow_check(&a, self, 2000, 7, sup, 2), -EPERM);
    assert_int_equal(vase_allow_check(&a, self, 2000, 7, NULL, 0), -EPERM);
    /* Root and the daemon's user are admitted whatever the lists say. */
    assert_int_equal(vase_allow_check(&a, self, 0, 0, NULL, 0), 0);
    assert_int_equal(vase_allow_check(&a, self, self, 1, NULL, 0), 0);

    struct vase_allow only_groups = {.gids = gids, .n_gids = 1};
    assert_int_equal(vase_allow_check(&only_groups, self, 1000, 50, NULL, 0), 0);
    assert_int_equal(vase_allow_check(&only_groups, self, 1000, 60, NULL, 0), -EPERM);
}

static void test_allow_parse(void **state) {
    (void)state;
    struct vase_allow a;
    assert_int_equal(vase_allow_parse("1000, 1001\troot", "root 5,,6", &a), 0);
    assert_int_equal(a.n_uids, 3);
    assert_int_equal(a.uids[0], 1000);
    assert_int_equal(a.uids[1], 1001);
    assert_int_equal(a.uids[2], 0);
    assert_int_equal(a.n_gids, 3);
    assert_int_equal(a.gids[0], 0);
    assert_int_equal(a.gids[1], 5);
    assert_int_equal(a.gids[2], 6);
    vase_allow_done(&a);

    /* Unknown names are left out: the list denies more, never less. */
    assert_int_equal(vase_allow_parse("no-such-user-xyz", "no-such-group-xyz", &a), 0);
    assert_int_equal(a.n_uids, 0);
    assert_int_equal(a.n_gids, 0);
    vase_allow_done(&a);
    assert_int_equal(vase_allow_parse("", NULL, &a), 0);
    assert_int_equal(a.n_uids + a.n_gids, 0);
    vase_allow_done(&a);
}

static void test_peer_groups(void **state) {
    (void)state;
    gid_t *g = NULL;
    size_t n = 0;
    assert_int_equal(vase_allow_peer_groups(0, 0, &g, &n), 0);
    assert_true(n >= 1); /* root is in its own primary group at least */
    bool has0 = false;
    for (size_t i = 0; i < n; i++)
        has0 |= g[i] == 0;
    assert_true(has0);
    free(g);
    /* A uid without a passwd entry has no supplementary groups. */
    assert_int_equal(vase_allow_peer_groups(4000000000u, 1, &g, &n), 0);
    assert_int_equal(n, 0);
    free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allow_check),
        cmocka_unit_test(test_allow_parse),
        cmocka_unit_test(test_peer_groups),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
