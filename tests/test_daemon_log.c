/* SPDX-License-Identifier: MIT */

/* The logger's escaping of control characters, its two line formats (journald's priority
 * prefixes, or a timestamp and the level) and the per-source rate limit. */

#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "../daemon/core/log.h"
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
    /* A multi-byte character is never split either. */
    vase_wire_escape("a\xc3\xaf", out, 3);
    assert_string_equal(out, "a");
}

/* What an 8-bit terminal or a bidi-aware one acts on, and what hides a difference between two
 * names, comes out escaped: the C1 controls raw and as UTF-8, format characters, separators. */
static void test_escape_c1_and_format(void **state) {
    (void)state;
    char out[256];
    /* A raw 0x9b is CSI on an 8-bit terminal; it is not UTF-8, so it is written as a byte. */
    vase_wire_escape("a\x9b"
                     "2Jb",
                     out, sizeof(out));
    assert_string_equal(out, "a\\x9b2Jb");
    /* U+009B, CSI as UTF-8. */
    vase_wire_escape("a\xc2\x9b"
                     "2Jb",
                     out, sizeof(out));
    assert_string_equal(out, "a\\u009b2Jb");
    /* U+202E (right-to-left override), U+200B (zero width space), U+2066 (isolate), U+FEFF,
     * U+2028 (line separator), U+E0041 (a tag character, beyond the BMP). */
    vase_wire_escape("x\xe2\x80\xae"
                     "evil\xe2\x80\x8by\xe2\x81\xa6\xef\xbb\xbf\xe2\x80\xa8"
                     "\xf3\xa0\x81\x81z",
                     out, sizeof(out));
    assert_string_equal(out, "x\\u202eevil\\u200by\\u2066\\ufeff\\u2028\\U000e0041z");
    /* Not UTF-8: a truncated sequence, an overlong '/', a surrogate; each byte escaped. */
    vase_wire_escape("\xe2\x80", out, sizeof(out));
    assert_string_equal(out, "\\xe2\\x80");
    vase_wire_escape("\xc0\xaf", out, sizeof(out));
    assert_string_equal(out, "\\xc0\\xaf");
    vase_wire_escape("\xed\xa0\x80", out, sizeof(out));
    assert_string_equal(out, "\\xed\\xa0\\x80");
    /* Printable characters around them pass: Latin, CJK, an emoji, U+00A0. */
    vase_wire_escape("\xc3\xa9\xe6\xbc\xa2\xf0\x9f\x98\x80\xc2\xa0", out, sizeof(out));
    assert_string_equal(out, "\xc3\xa9\xe6\xbc\xa2\xf0\x9f\x98\x80\xc2\xa0");
    /* Escaping escaped text changes nothing. */
    char twice[256];
    vase_wire_escape("\x1b\xc2\x9b\xe2\x80\xae\x9b", out, sizeof(out));
    vase_wire_escape(out, twice, sizeof(twice));
    assert_string_equal(twice, out);
    /* Every escape is cut whole: "\u202e" needs 6 bytes. */
    vase_wire_escape("ab\xe2\x80\xae", out, 8);
    assert_string_equal(out, "ab");
    assert_true(vase_wire_hidden_char(0x85));
    assert_true(vase_wire_hidden_char(0x202e));
    assert_false(vase_wire_hidden_char(0xa0));
    assert_false(vase_wire_hidden_char('a'));
}

/* A timer learns, once the interval is over, how many were held back, even with no message
 * after them; then the next message starts an interval of its own. */
static void test_ratelimit_flush(void **state) {
    (void)state;
    struct vase_ratelimit rl = {.interval = 10.0, .burst = 2};
    unsigned suppressed;
    assert_int_equal(vase_ratelimit_flush(&rl, 1.0), 0);
    for (int i = 0; i < 5; i++)
        vase_ratelimit_pass(&rl, 1.0 + i, &suppressed);
    assert_int_equal(vase_ratelimit_flush(&rl, 10.9), 0); /* the interval is not over */
    assert_int_equal(vase_ratelimit_flush(&rl, 11.0), 3);
    assert_int_equal(vase_ratelimit_flush(&rl, 30.0), 0); /* said once */
    assert_true(vase_ratelimit_pass(&rl, 30.0, &suppressed));
    assert_int_equal(suppressed, 0);
    assert_true(vase_ratelimit_pass(&rl, 30.5, &suppressed));
    assert_false(vase_ratelimit_pass(&rl, 31.0, &suppressed));
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

/* Runs log_info and log_warning_errno with stderr sent to a fresh file and returns what they
 * wrote (in buf). */
static const char *capture(char *buf, size_t size, bool journal) {
    char path[] = "/tmp/vase-test-log-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    assert_true(saved >= 0);
    assert_int_equal(dup2(fd, STDERR_FILENO), STDERR_FILENO);
    vase_log_set_journal(journal);
    log_info("hello %d", 42);
    assert_int_equal(log_warning_errno(-ENOENT, "gone: %m"), -ENOENT);
    fflush(stderr);
    vase_log_set_journal(false);
    assert_int_equal(dup2(saved, STDERR_FILENO), STDERR_FILENO);
    close(saved);
    ssize_t n = pread(fd, buf, size - 1, 0);
    assert_true(n >= 0);
    buf[n] = '\0';
    close(fd);
    return buf;
}

static void test_journal_format(void **state) {
    (void)state;
    char buf[512];
    assert_string_equal(capture(buf, sizeof(buf), true),
                        "<6>hello 42\n<4>gone: No such file or directory\n");
}

/* "2026-12-02 02:48:01.123 info: hello 42": the local time to the millisecond, then the level. */
static void test_timestamp_format(void **state) {
    (void)state;
    char buf[512], level[16], msg[64];
    int y, mo, d, h, mi, s, ms, used = 0;
    const char *p = capture(buf, sizeof(buf), false);
    for (int line = 0; line < 2; line++) {
        assert_int_equal(sscanf(p, "%4d-%2d-%2d %2d:%2d:%2d.%3d %15[a-z]: %63[^\n]\n%n", &y, &mo,
                                &d, &h, &mi, &s, &ms, level, msg, &used),
                         9);
        assert_true(y >= 2024 && mo >= 1 && mo <= 12 && d >= 1 && d <= 31 && h <= 23 && mi <= 59 &&
                    s <= 60 && ms >= 0 && ms <= 999);
        /* Fixed widths: "YYYY-MM-DD HH:MM:SS.mmm " is 24 characters. */
        assert_int_equal(p[4], '-');
        assert_int_equal(p[19], '.');
        assert_int_equal(p[23], ' ');
        assert_string_equal(level, line == 0 ? "info" : "warning");
        assert_string_equal(msg, line == 0 ? "hello 42" : "gone: No such file or directory");
        p += used;
    }
    assert_string_equal(p, "");
}

/* Only an fd whose device and inode are JOURNAL_STREAM's is journald's stream. */
static void test_journal_stream(void **state) {
    (void)state;
    int fds[2];
    struct stat st, other;
    char env[64];
    assert_int_equal(pipe(fds), 0);
    assert_int_equal(fstat(fds[1], &st), 0);
    snprintf(env, sizeof(env), "%llu:%llu", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino);
    assert_true(vase_log_is_journal_stream(env, fds[1]));
    /* The inherited variable of a process whose stderr now goes elsewhere. */
    int fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(fstat(fd, &other), 0);
    assert_true(other.st_ino != st.st_ino || other.st_dev != st.st_dev);
    assert_false(vase_log_is_journal_stream(env, fd));
    snprintf(env, sizeof(env), "%llu:%llu", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino + 1);
    assert_false(vase_log_is_journal_stream(env, fds[1]));
    snprintf(env, sizeof(env), "%llu:%llu", (unsigned long long)st.st_dev + 1,
             (unsigned long long)st.st_ino);
    assert_false(vase_log_is_journal_stream(env, fds[1]));
    /* Unset, malformed or trailing garbage. */
    assert_false(vase_log_is_journal_stream(NULL, fds[1]));
    snprintf(env, sizeof(env), "%llu:%llux", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino);
    assert_false(vase_log_is_journal_stream(env, fds[1]));
    snprintf(env, sizeof(env), "%llu", (unsigned long long)st.st_ino);
    assert_false(vase_log_is_journal_stream(env, fds[1]));
    assert_false(vase_log_is_journal_stream("", fds[1]));
    assert_false(vase_log_is_journal_stream(":", fds[1]));
    assert_false(vase_log_is_journal_stream("-1:-1", fds[1]));
    /* A closed fd is nobody's stream. */
    close(fds[0]);
    close(fds[1]);
    snprintf(env, sizeof(env), "%llu:%llu", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino);
    assert_false(vase_log_is_journal_stream(env, fds[1]));
    close(fd);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_escape),         cmocka_unit_test(test_escape_c1_and_format),
        cmocka_unit_test(test_ratelimit),      cmocka_unit_test(test_ratelimit_flush),
        cmocka_unit_test(test_journal_format), cmocka_unit_test(test_timestamp_format),
        cmocka_unit_test(test_journal_stream),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
