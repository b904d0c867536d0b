/* SPDX-License-Identifier: MIT */

/* The logger's escaping of control characters and the per-source rate limit. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "../daemon/log.h"
#include "wire.h"

static void test_escape(void **state) {
    (void)state;
    char out[128];
    assert_int_equal(vase_wire_escape("plain name", out, sizeof(out)), 10);
    assert_string_equal(out, "plain name");
    vase_wire_escape("evil\n<0>vased: forged\r\x1b[2J\x7f", out, sizeof(out));
    assert_string_equal(out, "evil\\x0a<0>vased: forged\\x0d\\x1b[2J\\x7f");
    /* UTF-8 passes. */
    vase_wire_escape("na\xc3\xafve", out, sizeof(out));
    assert_string_equal(out, "na\xc3\xafve");
    /* Cut at a whole character: an escape is never split. */
    vase_wire_escape("ab\ncd", out, 6);
    assert_string_equal(out, "ab");
    vase_wire_escape("abcdef", out, 4);
    assert_string_equal(out, "abc");
    assert_int_equal(vase_wire_escape("x", out, 0), 0);
}

static void test_ratelimit(void **state) {
    (void)state;
    struct vase_ratelimit rl = {.interval = 10.0, .burst = 3};
    unsigned suppressed = 99;
    int passed = 0;
    for (int i = 0; i < 100; i++)
        passed += vase_ratelimit_pass(&rl, 100.0 + i * 0.01, &suppressed);
    assert_int_equal(passed, 3);
    assert_int_equal(suppressed, 0);
    /* The next interval reports what the last one held back, and lets a burst through. */
    assert_true(vase_ratelimit_pass(&rl, 110.5, &suppressed));
    assert_int_equal(suppressed, 97);
    assert_true(vase_ratelimit_pass(&rl, 110.6, &suppressed));
    assert_int_equal(suppressed, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_escape),
        cmocka_unit_test(test_ratelimit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
