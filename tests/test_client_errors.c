/* SPDX-License-Identifier: MIT */

/*
 * Tests of lib/errors.c: vase_strerror() names errno values whichever sign they come with,
 * names the two vase codes, never returns NULL, and returns static strings (the same pointer
 * every time, from any thread).
 */

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "vase.h"

static void test_errno_values(void **state) {
    (void)state;
    assert_string_equal(vase_strerror(-ENOENT), "No such file or directory");
    assert_string_equal(vase_strerror(ENOENT), "No such file or directory");
    assert_string_equal(vase_strerror(-ECONNRESET), "Connection reset by peer");
    assert_string_equal(vase_strerror(-ENOSPC), "No space left on device");
    assert_string_equal(vase_strerror(-EDQUOT), "Disk quota exceeded");
    assert_string_equal(vase_strerror(-EINVAL), "Invalid argument");
    assert_string_equal(vase_strerror(0), "Success");
}

static void test_vase_codes(void **state) {
    (void)state;
    assert_string_equal(vase_strerror(-VASE_ESTALE),
                        "vased restarted (stale incarnation); reconnect");
    assert_string_equal(vase_strerror(VASE_ESTALE), vase_strerror(-VASE_ESTALE));
    assert_string_equal(vase_strerror(-VASE_EPROTOVERSION),
                        "vased speaks another protocol version");
}

static void test_unknown_codes(void **state) {
    (void)state;
    assert_string_equal(vase_strerror(-4000), "Unknown error");
    assert_string_equal(vase_strerror(INT_MIN), "Unknown error");
    assert_string_equal(vase_strerror(INT_MAX), "Unknown error");
}

static void *name_in_thread(void *arg) {
    (void)arg;
    return (void *)vase_strerror(-EAGAIN);
}

static void test_static_strings(void **state) {
    (void)state;
    const char *a = vase_strerror(-EAGAIN);
    pthread_t t;
    void *b;
    assert_int_equal(pthread_create(&t, NULL, name_in_thread, NULL), 0);
    assert_int_equal(pthread_join(t, &b), 0);
    /* A static table entry, not a per-thread buffer. */
    assert_ptr_equal(a, b);
    assert_ptr_equal(vase_strerror(-ETIMEDOUT), vase_strerror(ETIMEDOUT));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_errno_values),
        cmocka_unit_test(test_vase_codes),
        cmocka_unit_test(test_unknown_codes),
        cmocka_unit_test(test_static_strings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
