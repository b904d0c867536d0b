/* SPDX-License-Identifier: MIT */

/* vasectl's numbers for people: byte counts, counts and milliseconds rounded to a few digits;
 * and sequence labels cut to their column. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

/* vasectl's own files, compiled into the test: they are not part of libvase, which the client
 * tests link. */
#include "../tools/vasectl/vasectl_json.c"
#include "../tools/vasectl/vasectl_print.c"

/* Exact below 10000, then one decimal; 999950 is "1.0M", never "1000.0k". */
static void test_fmt_count(void **state) {
    (void)state;
    static const struct {
        uint64_t n;
        const char *want;
    } cases[] = {
        {0, "0"},          {9999, "9999"},          {10000, "10.0k"},
        {12345, "12.3k"},  {999949, "999.9k"},      {999950, "1.0M"},
        {4567890, "4.6M"}, {7000000000ULL, "7.0G"}, {UINT64_MAX, "18.4E"},
    };
    char b[32];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        assert_string_equal(vasectl_fmt_count(cases[i].n, b, sizeof(b)), cases[i].want);
}

static void test_fmt_ms(void **state) {
    (void)state;
    static const struct {
        double s;
        const char *want;
    } cases[] = {
        {0, "0.000 ms"},        {-1, "0.000 ms"},       {0.000123, "0.123 ms"},
        {0.0009996, "1.00 ms"}, {0.0012345, "1.23 ms"}, {0.009996, "10.0 ms"},
        {0.012345, "12.3 ms"},  {0.09996, "100 ms"},    {1.2346, "1235 ms"},
    };
    char b[32];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        assert_string_equal(vasectl_fmt_ms(cases[i].s, b, sizeof(b)), cases[i].want);
    /* Bytes, the third kind of number vasectl rounds. */
    assert_string_equal(vasectl_fmt_bytes(512, b, sizeof(b)), "512 B");
    assert_string_equal(vasectl_fmt_bytes(1536, b, sizeof(b)), "1.5 KiB");
    assert_string_equal(vasectl_fmt_bytes(3ULL << 30, b, sizeof(b)), "3.0 GiB");
}

/* A label as a table shows it: "-" for none, whole up to 24 bytes, else both ends around
 * "...", escaped. */
static void test_fmt_label(void **state) {
    (void)state;
    static const struct {
        const char *label, *want;
    } cases[] = {
        {"", "-"},
        {"cmpl-1", "cmpl-1"},
        {"abcdefghijklmnopqrstuvwx", "abcdefghijklmnopqrstuvwx"},
        {"abcdefghijklmnopqrstuvwxy", "abcdefghij...opqrstuvwxy"},
        {"chatcmpl-8f2c1d0e9b7a4c3d2e1f0a9b8c7d6e5f-0", "chatcmpl-8...b8c7d6e5f-0"},
        {"req\x1b[2J", "req\\x1b[2J"},
    };
    char b[4 * VASECTL_LABEL_WIDTH + 1];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        assert_string_equal(vasectl_fmt_label(cases[i].label, b, sizeof(b)), cases[i].want);
    assert_string_equal(vasectl_fmt_label(NULL, b, sizeof(b)), "-");
    assert_int_equal(strlen(vasectl_fmt_label(cases[4].label, b, sizeof(b))), VASECTL_LABEL_WIDTH);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fmt_count),
        cmocka_unit_test(test_fmt_ms),
        cmocka_unit_test(test_fmt_label),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
