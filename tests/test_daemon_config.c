/* SPDX-License-Identifier: MIT */

/* Unit tests of daemon/config.c: the settings table, parsers, INI files, flags, get/set and the
 * --dump-config round trip. */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "../daemon/config.h"
#include "../daemon/log.h"

static void test_defaults_valid(void **state) {
    (void)state;
    struct vase_config c;
    assert_int_equal(vase_config_init(&c), 0);
    assert_int_equal(vase_config_check(&c, NULL), 0);
    assert_string_equal(c.arena, "host");
    assert_int_equal(c.arena_bytes, 256u << 20);
    assert_int_equal(c.page_bytes, 2u << 20);
    assert_int_equal(c.max_pages_per_client, 0);
    assert_int_equal(c.log_level, LOG_INFO);
    assert_int_equal(c.default_slack, -1);
    assert_string_equal(c.runtime_dir, "");
    assert_string_equal(c.admin_group, "");
    assert_string_equal(c.arena_users, "");
    assert_string_equal(c.arena_groups, "");
    assert_int_equal(c.max_stats_bytes_per_client, 128u << 20);
    /* Every default parses and lies within its bounds, and every setting is documented. */
    for (size_t i = 0; i < vase_settings_count; i++) {
        const struct vase_setting *s = &vase_settings[i];
        assert_non_null(s->description);
        assert_true(strlen(s->description) > 10);
        assert_int_equal(vase_config_set(&c, s->name, s->def, 0), 0);
        assert_ptr_equal(vase_setting_find(s->name), s);
    }
    vase_config_done(&c);
    vase_config_done(&c); /* Twice is harmless. */
}

static void test_parsers(void **state) {
    (void)state;
    uint64_t u;
    int64_t i;
    assert_int_equal(vase_parse_u64("12", &u), 0);
    assert_int_equal(u, 12);
    assert_int_equal(vase_parse_u64("", &u), -EINVAL);
    assert_int_equal(vase_parse_u64("-1", &u), -EINVAL);
    assert_int_equal(vase_parse_u64(" 1", &u), -EINVAL);
    assert_int_equal(vase_parse_u64("1x", &u), -EINVAL);
    assert_int_equal(vase_parse_u64("18446744073709551616", &u), -ERANGE);
    assert_int_equal(vase_parse_u64(NULL, &u), -EINVAL);
    assert_int_equal(vase_parse_i64("-1", &i), 0);
    assert_int_equal(i, -1);
    assert_int_equal(vase_parse_i64("--1", &i), -EINVAL);
    assert_int_equal(vase_parse_i64("9223372036854775808", &i), -ERANGE);

    assert_int_equal(vase_parse_size("2M", &u), 0);
    assert_int_equal(u, 2u << 20);
    assert_int_equal(vase_parse_size("4096", &u), 0);
    assert_int_equal(u, 4096);
    assert_int_equal(vase_parse_size("1KiB", &u), 0);
    assert_int_equal(u, 1024);
    assert_int_equal(vase_parse_size("3g", &u), 0);
    assert_int_equal(u, 3ull << 30);
    assert_int_equal(vase_parse_size("1Q", &u), -EINVAL);
    assert_int_equal(vase_parse_size("1MX", &u), -EINVAL);
    assert_int_equal(vase_parse_size("M", &u), -EINVAL);
    assert_int_equal(vase_parse_size("17179869184G", &u), -ERANGE);

    char buf[32];
    vase_format_size(256u << 20, buf, sizeof(buf));
    assert_string_equal(buf, "256M");
    vase_format_size(1000, buf, sizeof(buf));
    assert_string_equal(buf, "1000");
    vase_format_size(0, buf, sizeof(buf));
    assert_string_equal(buf, "0");
    vase_format_size(3ull << 40, buf, sizeof(buf));
    assert_string_equal(buf, "3T");
}

static void test_set_get(void **state) {
    (void)state;
    struct vase_config c;
    char *v;
    assert_int_equal(vase_config_init(&c), 0);

    assert_int_equal(vase_config_set(&c, "max_clients", "7", 0), 0);
    assert_int_equal(c.max_clients, 7);
    assert_int_equal(vase_config_set(&c, "max-clients", "8", VASE_CONFIG_RUNTIME), 0);
    assert_int_equal(c.max_clients, 8);
    assert_int_equal(vase_config_set(&c, "max_clients", "0", 0), -ERANGE);
    assert_int_equal(vase_config_set(&c, "max_clients", "4097", 0), -ERANGE);
    assert_int_equal(vase_config_set(&c, "max_clients", "seven", 0), -EINVAL);
    assert_int_equal(c.max_clients, 8); /* unchanged by the failures */
    assert_int_equal(vase_config_set(&c, "no_such_thing", "1", 0), -ENOENT);
    assert_int_equal(vase_config_set(&c, "page_bytes", "4M", VASE_CONFIG_RUNTIME), -EPERM);
    assert_int_equal(vase_config_set(&c, "arena", "host", VASE_CONFIG_RUNTIME), -EPERM);
    assert_int_equal(vase_config_set(&c, "runtime_dir", "/x", VASE_CONFIG_RUNTIME), -EPERM);
    assert_int_equal(c.page_bytes, 2u << 20);
    assert_int_equal(vase_config_set(&c, "page_bytes", "4M", 0), 0);
    assert_int_equal(c.page_bytes, 4u << 20);
    assert_int_equal(vase_config_set(&c, "page_bytes", "1K", 0), -ERANGE);
    assert_int_equal(vase_config_set(&c, "log_level", "debug", VASE_CONFIG_RUNTIME), 0);
    assert_int_equal(c.log_level, LOG_DEBUG);
    assert_int_equal(vase_config_set(&c, "log_level", "loud", 0), -EINVAL);
    assert_int_equal(vase_config_set(&c, "default_slack", "-2", 0), -ERANGE);
    assert_int_equal(vase_config_set(&c, "default_slack", "128", 0), 0);
    assert_int_equal(vase_config_set(&c, "allow_users", "alice, 1000", 0), 0);

    /* The settings of issue 7: who administers, who uses the default arena, and the memory of
     * one client's attention statistics (0 is allowed and means none, 1T is the most). */
    assert_int_equal(vase_config_set(&c, "admin_group", "vase-admin", VASE_CONFIG_RUNTIME),
                     -EPERM);
    assert_int_equal(vase_config_set(&c, "admin_group", "vase-admin", 0), 0);
    assert_string_equal(c.admin_group, "vase-admin");
    assert_int_equal(vase_config_set(&c, "arena_users", "alice", VASE_CONFIG_RUNTIME), -EPERM);
    assert_int_equal(vase_config_set(&c, "arena-groups", "tenants", VASE_CONFIG_RUNTIME), -EPERM);
    assert_int_equal(vase_config_set(&c, "arena_users", "alice", 0), 0);
    assert_int_equal(vase_config_set(&c, "arena_groups", "tenants", 0), 0);
    assert_string_equal(c.arena_users, "alice");
    assert_string_equal(c.arena_groups, "tenants");
    assert_int_equal(
        vase_config_set(&c, "max_stats_bytes_per_client", "64M", VASE_CONFIG_RUNTIME), 0);
    assert_int_equal(c.max_stats_bytes_per_client, 64u << 20);
    assert_int_equal(vase_config_set(&c, "max-stats-bytes-per-client", "0", 0), 0);
    assert_int_equal(c.max_stats_bytes_per_client, 0);
    assert_int_equal(vase_config_set(&c, "max_stats_bytes_per_client", "1T", 0), 0);
    assert_int_equal(vase_config_set(&c, "max_stats_bytes_per_client", "1025G", 0), -ERANGE);
    assert_int_equal(vase_config_set(&c, "max_stats_bytes_per_client", "lots", 0), -EINVAL);
    assert_int_equal(c.max_stats_bytes_per_client, UINT64_C(1) << 40);
    assert_int_equal(vase_config_get(&c, "max_stats_bytes_per_client", &v), 0);
    assert_string_equal(v, "1T");
    free(v);
    assert_int_equal(vase_config_get(&c, "admin_group", &v), 0);
    assert_string_equal(v, "vase-admin");
    free(v);
    /* The runtime directory's description promises what vased.c enforces. */
    const struct vase_setting *rd = vase_setting_find("runtime_dir");
    assert_non_null(strstr(rd->description, "mode 0755"));
    assert_null(strstr(rd->description, "0770"));
    assert_non_null(strstr(rd->description, "symlink"));

    assert_int_equal(vase_config_get(&c, "page_bytes", &v), 0);
    assert_string_equal(v, "4M");
    free(v);
    assert_int_equal(vase_config_get(&c, "log-level", &v), 0);
    assert_string_equal(v, "debug");
    free(v);
    assert_int_equal(vase_config_get(&c, "allow_users", &v), 0);
    assert_string_equal(v, "alice, 1000");
    free(v);
    assert_int_equal(vase_config_get(&c, "default_slack", &v), 0);
    assert_string_equal(v, "128");
    free(v);
    assert_int_equal(vase_config_get(&c, "nope", &v), -ENOENT);
    vase_config_done(&c);
}

static void test_check(void **state) {
    (void)state;
    struct vase_config c;
    const char *msg = NULL;
    assert_int_equal(vase_config_init(&c), 0);
    assert_int_equal(vase_config_set(&c, "arena_bytes", "3M", 0), 0);
    assert_int_equal(vase_config_check(&c, &msg), -EINVAL);
    assert_non_null(msg);
    assert_int_equal(vase_config_set(&c, "page_bytes", "1M", 0), 0);
    assert_int_equal(vase_config_check(&c, &msg), 0);
    assert_int_equal(vase_config_set(&c, "page_bytes", "6144", 0), 0);
    assert_int_equal(vase_config_check(&c, &msg), -EINVAL); /* not a multiple of 4096 */
    assert_int_equal(vase_config_set(&c, "page_bytes", "2M", 0), 0);
    assert_int_equal(vase_config_set(&c, "arena_bytes", "2M", 0), 0);
    assert_int_equal(vase_config_check(&c, &msg), -EINVAL); /* one page is too few */
    vase_config_done(&c);
}

static void test_ini(void **state) {
    (void)state;
    struct vase_config c;
    assert_int_equal(vase_config_init(&c), 0);
    assert_int_equal(vase_config_parse_string(&c, "; comment\n# comment\n[vased]\n"
                                                  "arena_bytes = 512M\n"
                                                  "max_pages_per_client=100\n"
                                                  "allow_groups = vase video\n"),
                     0);
    assert_int_equal(c.arena_bytes, 512u << 20);
    assert_int_equal(c.max_pages_per_client, 100);
    assert_string_equal(c.allow_groups, "vase video");
    /* Keys before any section are accepted too. */
    assert_int_equal(vase_config_parse_string(&c, "max_clients = 3\n"), 0);
    assert_int_equal(c.max_clients, 3);

    assert_int_equal(vase_config_parse_string(&c, "[vased]\nmax_clients = many\n"), -EINVAL);
    assert_int_equal(vase_config_parse_string(&c, "[vased]\nmax_clients = 100000\n"), -ERANGE);
    assert_int_equal(vase_config_parse_string(&c, "[vased]\nfrobnicate = 1\n"), -EINVAL);
    assert_int_equal(vase_config_parse_string(&c, "[other]\nmax_clients = 5\n"), -EINVAL);
    assert_int_equal(vase_config_parse_string(&c, "[vased]\nthis line has no equals sign\n"),
                     -EINVAL);
    assert_int_equal(vase_config_parse_string(&c, "[vased]\npage_bytes = 12x\n"), -EINVAL);
    assert_int_equal(c.max_clients, 3);
    assert_int_equal(vase_config_parse_file(&c, "/nonexistent/vased.conf"), -ENOENT);

    char path[] = "/tmp/test_daemon_config.XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char text[] = "[vased]\nstats_interval = 42\nlog_level = warning\n";
    assert_int_equal(write(fd, text, sizeof(text) - 1), (ssize_t)sizeof(text) - 1);
    close(fd);
    assert_int_equal(vase_config_parse_file(&c, path), 0);
    assert_int_equal(c.stats_interval, 42);
    assert_int_equal(c.log_level, LOG_WARNING);
    unlink(path);
    vase_config_done(&c);
}

/* Dumps c, parses the dump into the defaults, and compares every setting. */
static void round_trip(const struct vase_config *c) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    assert_int_equal(vase_config_dump(c, f), 0);
    fclose(f);
    /* Every setting appears, documented. */
    for (size_t i = 0; i < vase_settings_count; i++)
        assert_non_null(strstr(text, vase_settings[i].name));
    assert_null(strstr(text, " \n")); /* no trailing blanks */

    struct vase_config back;
    assert_int_equal(vase_config_init(&back), 0);
    assert_int_equal(vase_config_parse_string(&back, text), 0);
    for (size_t i = 0; i < vase_settings_count; i++) {
        char a[4200], b[4200];
        vase_config_format(c, &vase_settings[i], a, sizeof(a));
        vase_config_format(&back, &vase_settings[i], b, sizeof(b));
        assert_string_equal(a, b);
    }
    vase_config_done(&back);
    free(text);
}

static void test_dump_round_trip(void **state) {
    (void)state;
    struct vase_config c;
    assert_int_equal(vase_config_init(&c), 0);
    round_trip(&c);
    assert_int_equal(vase_config_set(&c, "arena_bytes", "1G", 0), 0);
    assert_int_equal(vase_config_set(&c, "page_bytes", "12288", 0), 0);
    assert_int_equal(vase_config_set(&c, "allow_users", "root,1000", 0), 0);
    assert_int_equal(vase_config_set(&c, "runtime_dir", "/run/vase", 0), 0);
    assert_int_equal(vase_config_set(&c, "log_level", "debug", 0), 0);
    assert_int_equal(vase_config_set(&c, "default_slack", "-1", 0), 0);
    round_trip(&c);
    vase_config_done(&c);
}

static void test_cmdline(void **state) {
    (void)state;
    struct vase_cmdline cmd;
    char *argv1[] = {"vased", "--runtime-dir=/tmp/r", "--log_level", "debug",
                     "--config=/nonexistent/vased.conf", "--max-clients=9", NULL};
    assert_int_equal(vase_cmdline_parse(6, argv1, &cmd), 0);
    assert_string_equal(cmd.config_path, "/nonexistent/vased.conf");
    assert_int_equal(cmd.n_overrides, 3);
    assert_string_equal(cmd.keys[0], "runtime_dir");
    assert_string_equal(cmd.values[0], "/tmp/r");
    assert_string_equal(cmd.keys[1], "log_level");
    assert_string_equal(cmd.values[2], "9");
    struct vase_config c;
    /* The file named on the command line must exist. */
    assert_int_equal(vase_config_load(&c, &cmd), -ENOENT);
    vase_config_done(&c);
    /* An empty file: the command line's values land on the defaults. (A test machine may have
     * its own /etc/vase/vased.conf, so the default path is not used here.) */
    char path[] = "/tmp/test_daemon_config.XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    free(cmd.config_path);
    cmd.config_path = strdup(path);
    assert_int_equal(vase_config_load(&c, &cmd), 0);
    unlink(path);
    assert_string_equal(c.runtime_dir, "/tmp/r");
    assert_int_equal(c.log_level, LOG_DEBUG);
    assert_int_equal(c.max_clients, 9);
    vase_config_done(&c);
    vase_cmdline_done(&cmd);

    char *argv2[] = {"vased", "--bogus=1", NULL};
    assert_int_equal(vase_cmdline_parse(2, argv2, &cmd), -EINVAL);
    char *argv3[] = {"vased", "--help", NULL};
    assert_int_equal(vase_cmdline_parse(2, argv3, &cmd), 1);
    assert_true(cmd.help);
    vase_cmdline_done(&cmd);
    char *argv4[] = {"vased", "--dump-config", NULL};
    assert_int_equal(vase_cmdline_parse(2, argv4, &cmd), 1);
    assert_true(cmd.dump_config);
    vase_cmdline_done(&cmd);
    char *argv5[] = {"vased", "stray", NULL};
    assert_int_equal(vase_cmdline_parse(2, argv5, &cmd), -EINVAL);
    char *argv6[] = {"vased", "--max-clients", NULL};
    assert_int_equal(vase_cmdline_parse(2, argv6, &cmd), -EINVAL);

    /* A bad value is caught when the command line is applied. */
    char *argv7[] = {"vased", "--page-bytes=3", NULL};
    assert_int_equal(vase_cmdline_parse(2, argv7, &cmd), 0);
    assert_int_equal(vase_config_load(&c, &cmd), -ERANGE);
    vase_config_done(&c);
    vase_cmdline_done(&cmd);
    char *argv8[] = {"vased", "--arena-bytes=3M", NULL};
    assert_int_equal(vase_cmdline_parse(2, argv8, &cmd), 0);
    assert_int_equal(vase_config_load(&c, &cmd), -EINVAL);
    vase_config_done(&c);
    vase_cmdline_done(&cmd);

    /* --help lists every setting. */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    vase_config_help(f, "vased");
    fclose(f);
    for (size_t i = 0; i < vase_settings_count; i++)
        assert_non_null(strstr(text, vase_settings[i].name));
    free(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_valid), cmocka_unit_test(test_parsers),
        cmocka_unit_test(test_set_get),        cmocka_unit_test(test_check),
        cmocka_unit_test(test_ini),            cmocka_unit_test(test_dump_round_trip),
        cmocka_unit_test(test_cmdline),
    };
    /* The code under test logs its refusals; keep the output to the test results. */
    vase_log_set_max_level(LOG_EMERG);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
