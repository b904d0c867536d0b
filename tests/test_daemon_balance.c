/* SPDX-License-Identifier: MIT */

/* Unit tests of daemon/core/balance.c, the targets of elastic budgets: no deficit leaves every
 * sequence at its cap; the targets release at least the deficit, in whole windows, within
 * [min, cap]; proportional shares by weight, priority empties the lowest weight first; a deficit
 * the minimums cannot cover changes nobody; pages a sequence releases anyway (a long prompt's)
 * count; and the policy names. */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "../daemon/core/balance.h"

#define PAGE 4096u

/* A sequence of window 64, slack 64, 16-token pages, holding the steady state of max. */
static struct vase_balance_seq seq(uint32_t min, uint32_t max, uint32_t weight) {
    struct vase_balance_seq s = {.min = min,
                                 .cap = max,
                                 .max = max,
                                 .window = 64,
                                 .slack = 64,
                                 .block_tokens = 16,
                                 .weight = weight,
                                 .page_bytes = PAGE};
    s.n_pages = (max + 64 + 64 + 15) / 16;
    return s;
}

static uint64_t released(const struct vase_balance_seq *v, size_t n) {
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += vase_balance_release(&v[i], v[i].target);
    return total;
}

static void assert_valid(const struct vase_balance_seq *v, size_t n) {
    for (size_t i = 0; i < n; i++) {
        assert_true(v[i].target >= v[i].min);
        assert_true(v[i].target <= v[i].cap);
        assert_int_equal(v[i].target % v[i].window, 0);
    }
}

static void test_release(void **state) {
    (void)state;
    struct vase_balance_seq s = seq(512, 1024, 1);
    /* 1024 + 128 slots: 72 pages held; at 512, 40 pages kept. */
    assert_int_equal(s.n_pages, 72);
    assert_int_equal(vase_balance_release(&s, 1024), 0);
    assert_int_equal(vase_balance_release(&s, 512), 32 * PAGE);
    assert_int_equal(vase_balance_release(&s, 960), 4 * PAGE);
}

static void test_no_deficit_means_caps(void **state) {
    (void)state;
    struct vase_balance_seq v[3] = {seq(512, 1024, 1), seq(256, 1024, 3), seq(1024, 1024, 1)};
    v[1].cap = 768;
    for (int p = 0; p < _VASE_ELASTIC_POLICY_MAX; p++) {
        assert_int_equal(vase_balance(v, 3, 0, (enum vase_elastic_policy)p), 0);
        assert_int_equal(v[0].target, 1024);
        assert_int_equal(v[1].target, 768);
        assert_int_equal(v[2].target, 1024);
    }
}

static void test_proportional_equal_share(void **state) {
    (void)state;
    struct vase_balance_seq v[4];
    for (int i = 0; i < 4; i++)
        v[i] = seq(256, 1024, 1);
    /* 4 * 16 pages: each gives 16 pages, 1024 -> 768. */
    assert_int_equal(vase_balance(v, 4, 64 * PAGE, VASE_ELASTIC_PROPORTIONAL), 1);
    assert_valid(v, 4);
    for (int i = 0; i < 4; i++)
        assert_int_equal(v[i].target, 768);
    assert_true(released(v, 4) >= 64 * PAGE);
    /* One page more: everyone goes one window further, not one sequence alone. */
    assert_int_equal(vase_balance(v, 4, 65 * PAGE, VASE_ELASTIC_PROPORTIONAL), 1);
    for (int i = 0; i < 4; i++)
        assert_int_equal(v[i].target, 704);
}

static void test_proportional_weights(void **state) {
    (void)state;
    struct vase_balance_seq v[2] = {seq(128, 2048, 1), seq(128, 2048, 3)};
    assert_int_equal(vase_balance(v, 2, 64 * PAGE, VASE_ELASTIC_PROPORTIONAL), 1);
    assert_valid(v, 2);
    assert_true(released(v, 2) >= 64 * PAGE);
    /* The heavier keeps three times the fraction, up to its cap. */
    assert_true(v[1].target > v[0].target);
    assert_true(v[1].target == 2048 || v[1].target + 192 >= 3 * v[0].target);
    assert_true(v[1].target <= 3 * v[0].target + 192);
}

static void test_minimums_hold(void **state) {
    (void)state;
    struct vase_balance_seq v[3] = {seq(960, 1024, 1), seq(256, 1024, 1), seq(1024, 1024, 1)};
    /* Everything the first two can give: 4 + 48 pages. */
    assert_int_equal(vase_balance(v, 3, 52 * PAGE, VASE_ELASTIC_PROPORTIONAL), 1);
    assert_int_equal(v[0].target, 960);
    assert_int_equal(v[1].target, 256);
    assert_int_equal(v[2].target, 1024); /* not elastic: never moves */
}

static void test_impossible_changes_nobody(void **state) {
    (void)state;
    struct vase_balance_seq v[2] = {seq(512, 1024, 1), seq(512, 1024, 5)};
    for (int p = 0; p < _VASE_ELASTIC_POLICY_MAX; p++) {
        assert_int_equal(vase_balance(v, 2, 64 * PAGE + 1, (enum vase_elastic_policy)p), -ENOSPC);
        assert_int_equal(v[0].target, 1024);
        assert_int_equal(v[1].target, 1024);
    }
    assert_int_equal(vase_balance(NULL, 0, 1, VASE_ELASTIC_PROPORTIONAL), -ENOSPC);
}

static void test_priority_lowest_weight_first(void **state) {
    (void)state;
    struct vase_balance_seq v[3] = {seq(256, 1024, 1), seq(256, 1024, 1), seq(256, 1024, 2)};
    /* The two of weight 1 can give 96 pages: 40 is theirs alone, shared equally. */
    assert_int_equal(vase_balance(v, 3, 40 * PAGE, VASE_ELASTIC_PRIORITY), 1);
    assert_valid(v, 3);
    assert_int_equal(v[2].target, 1024);
    assert_int_equal(v[0].target, v[1].target);
    assert_true(released(v, 3) >= 40 * PAGE);
    /* 100 pages: weight 1 at its minimums, weight 2 gives the rest. */
    assert_int_equal(vase_balance(v, 3, 100 * PAGE, VASE_ELASTIC_PRIORITY), 1);
    assert_int_equal(v[0].target, 256);
    assert_int_equal(v[1].target, 256);
    assert_true(v[2].target < 1024 && v[2].target >= 256);
    assert_true(released(v, 3) >= 100 * PAGE);
    /* 90 pages: still weight 1's alone under priority; proportional takes from all three. */
    assert_int_equal(vase_balance(v, 3, 90 * PAGE, VASE_ELASTIC_PRIORITY), 1);
    assert_int_equal(v[2].target, 1024);
    assert_int_equal(vase_balance(v, 3, 90 * PAGE, VASE_ELASTIC_PROPORTIONAL), 1);
    assert_true(v[2].target < 1024);
    assert_true(v[2].target > v[0].target);
}

static void test_surplus_counts(void **state) {
    (void)state;
    /* A long prompt: 100 pages held where the steady state needs 72; 28 go back anyway. */
    struct vase_balance_seq v[2] = {seq(512, 1024, 1), seq(512, 1024, 1)};
    v[0].n_pages = 100;
    assert_int_equal(vase_balance(v, 2, 28 * PAGE, VASE_ELASTIC_PROPORTIONAL), 1);
    assert_int_equal(v[0].target, 1024);
    assert_int_equal(v[1].target, 1024);
}

static void test_random_invariants(void **state) {
    (void)state;
    uint64_t x = 0x9e3779b97f4a7c15u;
    for (int round = 0; round < 2000; round++) {
        struct vase_balance_seq v[8];
        size_t n = 1 + round % 8;
        uint64_t most = 0;
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            uint32_t W = 16u << (x % 3), max = W * (2 + (uint32_t)(x >> 8) % 60);
            uint32_t min = W * (1 + (uint32_t)(x >> 20) % (max / W - 1) + 0);
            if (min > max)
                min = max;
            v[i] = seq(min, max, 1 + (uint32_t)(x >> 32) % 4);
            v[i].window = W;
            v[i].block_tokens = 1u << ((x >> 40) % 6);
            v[i].cap = min + W * ((uint32_t)(x >> 44) % ((max - min) / W + 1));
            v[i].n_pages = (max + W + 64 + v[i].block_tokens - 1) / v[i].block_tokens;
            most += vase_balance_release(&v[i], v[i].min);
        }
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint64_t deficit = most ? x % (most + most / 4 + 1) : 0;
        enum vase_elastic_policy p = (enum vase_elastic_policy)(round % 2);
        int r = vase_balance(v, n, deficit, p);
        assert_valid(v, n);
        if (deficit == 0) {
            assert_int_equal(r, 0);
        } else if (deficit > most) {
            assert_int_equal(r, -ENOSPC);
            for (size_t i = 0; i < n; i++)
                assert_int_equal(v[i].target, v[i].cap);
        } else {
            assert_int_equal(r, 1);
            assert_true(released(v, n) >= deficit);
        }
    }
}

static void test_policy_names(void **state) {
    (void)state;
    assert_string_equal(vase_elastic_policy_to_string(VASE_ELASTIC_PROPORTIONAL), "proportional");
    assert_string_equal(vase_elastic_policy_to_string(VASE_ELASTIC_PRIORITY), "priority");
    assert_null(vase_elastic_policy_to_string(_VASE_ELASTIC_POLICY_MAX));
    assert_null(vase_elastic_policy_to_string(-1));
    assert_int_equal(vase_elastic_policy_from_string("priority"), VASE_ELASTIC_PRIORITY);
    assert_int_equal(vase_elastic_policy_from_string("proportional"), VASE_ELASTIC_PROPORTIONAL);
    assert_int_equal(vase_elastic_policy_from_string("Priority"), -EINVAL);
    assert_int_equal(vase_elastic_policy_from_string(NULL), -EINVAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_release),
        cmocka_unit_test(test_no_deficit_means_caps),
        cmocka_unit_test(test_proportional_equal_share),
        cmocka_unit_test(test_proportional_weights),
        cmocka_unit_test(test_minimums_hold),
        cmocka_unit_test(test_impossible_changes_nobody),
        cmocka_unit_test(test_priority_lowest_weight_first),
        cmocka_unit_test(test_surplus_counts),
        cmocka_unit_test(test_random_invariants),
        cmocka_unit_test(test_policy_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
