/* SPDX-License-Identifier: MIT */

/* Unit tests of daemon/config/config.c: the settings table, parsers, INI files (arena sections
 * included), flags, get/set, the memory check and the --dump-config round trip; and a few runs
 * of the real build/vased to see that main.c refuses what config.c reports. */

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "vased_path.h"
#include "../daemon/config/config.h"
#include "../daemon/core/log.h"

/* ---- helpers ---- */

/* What the code under test logs between capture_start() and capture_end() (errors and
 * warnings) lands in a temporary file instead of the test's stderr. */
static int saved_stderr = -1;
static FILE *captured;

static void capture_start(void) {
    fflush(stderr);
    captured = tmpfile();
    assert_non_null(captured);
    saved_stderr = dup(STDERR_FILENO);
    assert_true(saved_stderr >= 0);
    assert_int_equal(dup2(fileno(captured), STDERR_FILENO), STDERR_FILENO);
    vase_log_set_max_level(LOG_WARNING);
}

/* The captured messages, into buf. */
static void capture_end(char *buf, size_t len) {
    fflush(stderr);
    vase_log_set_max_level(LOG_EMERG);
    assert_int_equal(dup2(saved_stderr, STDERR_FILENO), STDERR_FILENO);
    close(saved_stderr);
    rewind(captured);
    size_t n = fread(buf, 1, len - 1, captured);
    buf[n] = '\0';
    fclose(captured);
}

/* vase_config_parse_string() with its messages in log. */
static int parse_logged(struct vase_config *c, const char *text, char *log, size_t len) {
    capture_start();
    int r = vase_config_parse_string(c, text);
    capture_end(log, len);
    return r;
}

/* Writes text to a fresh temporary file; its path into path (at least 64 bytes). */
static void write_temp(char *path, const char *text) {
    strcpy(path, "/tmp/test_daemon_config.XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    size_t n = strlen(text);
    assert_int_equal(write(fd, text, n), (ssize_t)n);
    close(fd);
}

/* The program's exit status when it ran, -1 when it was still running after 15 s (killed) or
 * died of a signal. */
static int run_vased(const char *const *args, char *out, size_t out_len) {
    char vased[4096], dir[] = "/tmp/test_daemon_config-rt-XXXXXX", rt[96];
    const char *argv[16];
    size_t argc = 0;
    int pipefd[2], status;

    if (test_vased_path(vased, sizeof(vased)) < 0)
        fail_msg("VASE_BUILD_DIR is not set and this program is not in BUILD/tests/");
    if (access(vased, X_OK) != 0)
        fail_msg("%s is missing: `make` builds it", vased);
    assert_non_null(mkdtemp(dir));
    /* A vased that starts after all serves a throw-away directory. */
    snprintf(rt, sizeof(rt), "--runtime-dir=%s", dir);
    argv[argc++] = vased;
    argv[argc++] = rt;
    argv[argc++] = "--metrics-address=off";
    for (size_t i = 0; args[i]; i++) {
        assert_true(argc + 2 < sizeof(argv) / sizeof(argv[0]));
        argv[argc++] = args[i];
    }
    argv[argc] = NULL;

    assert_int_equal(pipe2(pipefd, O_CLOEXEC), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(pipefd[1], STDERR_FILENO);
        dup2(pipefd[1], STDOUT_FILENO);
        execv(vased, (char *const *)argv);
        _exit(127);
    }
    close(pipefd[1]);

    size_t n = 0;
    bool killed = false;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        long left_ms =
            15000 - (now.tv_sec - start.tv_sec) * 1000 - (now.tv_nsec - start.tv_nsec) / 1000000;
        if (left_ms <= 0) {
            kill(pid, SIGKILL);
            killed = true;
            break;
        }
        struct pollfd pfd = {.fd = pipefd[0], .events = POLLIN};
        if (poll(&pfd, 1, (int)left_ms) <= 0)
            continue;
        char scratch[256];
        char *to = n + 1 < out_len ? out + n : scratch;
        size_t room = n + 1 < out_len ? out_len - 1 - n : sizeof(scratch);
        ssize_t k = read(pipefd[0], to, room);
        if (k <= 0)
            break; /* the program closed its output: it has ended */
        if (to != scratch)
            n += (size_t)k;
    }
    out[n] = '\0';
    close(pipefd[0]);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    char cleanup[256];
    snprintf(cleanup, sizeof(cleanup), "rm -rf '%s'", dir);
    assert_int_equal(system(cleanup), 0);
    if (killed || !WIFEXITED(status))
        return -1;
    return WEXITSTATUS(status);
}

/* ---- tests ---- */

static void test_defaults_valid(void **state) {
    (void)state;
    struct vase_config c;
    assert_int_equal(vase_config_init(&c), 0);
    assert_int_equal(vase_config_check(&c, NULL), 0);
    assert_string_equal(c.arena, "host");
    assert_int_equal(c.arena_bytes, 1u << 30);
    assert_int_equal(c.granule_bytes, 2u << 20);
    assert_int_equal(c.max_bytes_per_client, 0);
    assert_int_equal(c.log_level, LOG_INFO);
    assert_int_equal(c.default_slack, -1);
    assert_string_equal(c.runtime_dir, "");
    assert_string_equal(c.admin_group, "");
    assert_string_equal(c.arena_users, "");
    assert_string_equal(c.arena_groups, "");
    assert_int_equal(c.max_stats_bytes_per_client, 128u << 20);
    /* One uid's share: a quarter of max_clients' sessions, four clients' sequences, one
     * client's waiting opens, two clients' statistics. */
    assert_int_equal(c.max_sessions_per_uid, 16);
    assert_true(c.max_sessions_per_uid < c.max_clients);
    assert_int_equal(c.max_seqs_per_uid, 4096);
    assert_int_equal(c.max_waiting_opens_per_uid, 1024);
    assert_int_equal(c.max_stats_bytes_per_uid, 256u << 20);
    assert_null(c.extra_arenas);
    assert_int_equal(c.n_extra_arenas, 0);
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

    /* A bool: yes/no and the usual spellings, written back as yes or no; off by default. */
    assert_false(c.metrics_tenant_labels);
    static const char *const yes[] = {"yes", "true", "on", "1", "YES"}, *const no[] = {
                                                                            "no", "false", "off",
                                                                            "0", "Off"};
    for (size_t i = 0; i < 5; i++) {
        assert_int_equal(vase_config_set(&c, "metrics_tenant_labels", yes[i], VASE_CONFIG_RUNTIME),
                         0);
        assert_true(c.metrics_tenant_labels);
        assert_int_equal(vase_config_get(&c, "metrics-tenant-labels", &v), 0);
        assert_string_equal(v, "yes");
        free(v);
        assert_int_equal(vase_config_set(&c, "metrics_tenant_labels", no[i], 0), 0);
        assert_false(c.metrics_tenant_labels);
    }
    assert_int_equal(vase_config_get(&c, "metrics_tenant_labels", &v), 0);
    assert_string_equal(v, "no");
    free(v);
    assert_int_equal(vase_config_set(&c, "metrics_tenant_labels", "maybe", 0), -EINVAL);
    assert_int_equal(vase_config_set(&c, "metrics_tenant_labels", "", 0), -EINVAL);
    assert_int_equal(vase_config_set(&c, "metrics_tenant_labels", "2", 0), -EINVAL);
    assert_false(c.metrics_tenant_labels);
    assert_string_equal(vase_setting_type_name(VASE_SETTING_BOOL), "bool");
    /* metrics_sequence_labels: another such bool, off by default, changeable while running,
     * apart from metrics_tenant_labels. */
    assert_false(c.metrics_sequence_labels);
    assert_int_equal(vase_config_set(&c, "metrics_sequence_labels", "yes", VASE_CONFIG_RUNTIME), 0);
    assert_true(c.metrics_sequence_labels);
    assert_false(c.metrics_tenant_labels);
    assert_int_equal(c.max_clients, 8); /* unchanged by the failures */
    assert_int_equal(vase_config_set(&c, "no_such_thing", "1", 0), -ENOENT);
    assert_int_equal(vase_config_set(&c, "granule_bytes", "4M", VASE_CONFIG_RUNTIME), -EPERM);
    assert_int_equal(vase_config_set(&c, "arena", "host", VASE_CONFIG_RUNTIME), -EPERM);
    assert_int_equal(vase_config_set(&c, "runtime_dir", "/x", VASE_CONFIG_RUNTIME), -EPERM);
    assert_int_equal(c.granule_bytes, 2u << 20);
    assert_int_equal(vase_config_set(&c, "granule_bytes", "4M", 0), 0);
    assert_int_equal(c.granule_bytes, 4u << 20);
    assert_int_equal(vase_config_set(&c, "granule_bytes", "1K", 0), -ERANGE);
    /* The per-client quota is a size in bytes, with suffixes, up to 1 TiB. */
    assert_int_equal(vase_config_set(&c, "max_bytes_per_client", "24G", VASE_CONFIG_RUNTIME), 0);
    assert_int_equal(c.max_bytes_per_client, UINT64_C(24) << 30);
    assert_int_equal(vase_config_set(&c, "max_bytes_per_client", "2T", 0), -ERANGE);
    assert_int_equal(c.max_bytes_per_client, UINT64_C(24) << 30);
    assert_int_equal(vase_config_set(&c, "max_bytes_per_client", "0", 0), 0);
    assert_int_equal(c.max_bytes_per_client, 0);
    assert_int_equal(vase_config_set(&c, "log_level", "debug", VASE_CONFIG_RUNTIME), 0);
    assert_int_equal(c.log_level, LOG_DEBUG);
    assert_int_equal(vase_config_set(&c, "log_level", "loud", 0), -EINVAL);
    assert_int_equal(vase_config_set(&c, "default_slack", "-2", 0), -ERANGE);
    assert_int_equal(vase_config_set(&c, "default_slack", "128", 0), 0);
    assert_int_equal(vase_config_set(&c, "allow_users", "alice, 1000", 0), 0);

    /* The settings of issue 7: who administers, who uses the default arena, and the memory of
     * one client's attention statistics (0 is allowed and means none, 1T is the most). */
    assert_int_equal(vase_config_set(&c, "admin_group", "vase-admin", VASE_CONFIG_RUNTIME), -EPERM);
    assert_int_equal(vase_config_set(&c, "admin_group", "vase-admin", 0), 0);
    assert_string_equal(c.admin_group, "vase-admin");
    assert_int_equal(vase_config_set(&c, "arena_users", "alice", VASE_CONFIG_RUNTIME), -EPERM);
    assert_int_equal(vase_config_set(&c, "arena-groups", "tenants", VASE_CONFIG_RUNTIME), -EPERM);
    assert_int_equal(vase_config_set(&c, "arena_users", "alice", 0), 0);
    assert_int_equal(vase_config_set(&c, "arena_groups", "tenants", 0), 0);
    assert_string_equal(c.arena_users, "alice");
    assert_string_equal(c.arena_groups, "tenants");
    assert_int_equal(vase_config_set(&c, "max_stats_bytes_per_client", "64M", VASE_CONFIG_RUNTIME),
                     0);
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

    assert_int_equal(vase_config_get(&c, "granule_bytes", &v), 0);
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
    assert_int_equal(vase_config_set(&c, "granule_bytes", "1M", 0), 0);
    assert_int_equal(vase_config_check(&c, &msg), 0);
    assert_int_equal(vase_config_set(&c, "granule_bytes", "6144", 0), 0);
    assert_int_equal(vase_config_check(&c, &msg), -EINVAL); /* not a multiple of 4096 */
    assert_int_equal(vase_config_set(&c, "granule_bytes", "2M", 0), 0);
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
                                                  "max_bytes_per_client=100\n"
                                                  "allow_groups = vase video\n"),
                     0);
    assert_int_equal(c.arena_bytes, 512u << 20);
    assert_int_equal(c.max_bytes_per_client, 100);
    assert_string_equal(c.allow_groups, "vase video");
    assert_int_equal(vase_config_parse_string(&c, "[vased]\nmax_clients = 3\n"), 0);
    assert_int_equal(c.max_clients, 3);
    /* Blanks, indentation, a comment after a value, CRLF line ends, a UTF-8 BOM. */
    assert_int_equal(vase_config_parse_string(&c, "\xEF\xBB\xBF [ vased ] ; the daemon\r\n"
                                                  "\tstats_interval\t=  7 ; seconds\r\n"
                                                  "  socket_group = video\n"),
                     0);
    assert_int_equal(c.stats_interval, 7);
    assert_string_equal(c.socket_group, "video");

    assert_int_equal(vase_config_parse_string(&c, "[vased]\nmax_clients = many\n"), -EINVAL);
    assert_int_equal(vase_config_parse_string(&c, "[vased]\nmax_clients = 100000\n"), -ERANGE);
    assert_int_equal(vase_config_parse_string(&c, "[vased]\nfrobnicate = 1\n"), -EINVAL);
    assert_int_equal(vase_config_parse_string(&c, "[other]\nmax_clients = 5\n"), -EINVAL);
    assert_int_equal(vase_config_parse_string(&c, "[vased]\nthis line has no equals sign\n"),
                     -EINVAL);
    assert_int_equal(vase_config_parse_string(&c, "[vased]\ngranule_bytes = 12x\n"), -EINVAL);
    assert_int_equal(vase_config_parse_string(&c, "[vased\nmax_clients = 5\n"), -EINVAL);
    assert_int_equal(vase_config_parse_string(&c, "[vased] x\nmax_clients = 5\n"), -EINVAL);
    assert_int_equal(vase_config_parse_string(&c, "[vased]\n= 5\n"), -EINVAL);
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
    assert_int_equal(back.n_extra_arenas, c->n_extra_arenas);
    assert_true(vase_config_arenas_equal(c, &back));
    vase_config_done(&back);
    free(text);
}

static void test_dump_round_trip(void **state) {
    (void)state;
    struct vase_config c;
    assert_int_equal(vase_config_init(&c), 0);
    round_trip(&c);
    assert_int_equal(vase_config_set(&c, "arena_bytes", "1G", 0), 0);
    assert_int_equal(vase_config_set(&c, "granule_bytes", "12288", 0), 0);
    assert_int_equal(vase_config_set(&c, "allow_users", "root,1000", 0), 0);
    assert_int_equal(vase_config_set(&c, "runtime_dir", "/run/vase", 0), 0);
    assert_int_equal(vase_config_set(&c, "log_level", "debug", 0), 0);
    assert_int_equal(vase_config_set(&c, "default_slack", "-1", 0), 0);
    assert_int_equal(vase_config_set(&c, "admin_group", "wheel", 0), 0);
    assert_int_equal(vase_config_set(&c, "max_stats_bytes_per_client", "0", 0), 0);
    round_trip(&c);

    /* Arena sections are written back whole, each key spelled out. */
    assert_int_equal(vase_config_set(&c, "granule_bytes", "4M", 0), 0);
    assert_int_equal(vase_config_parse_string(&c, "[vased]\narena_users = alice\n"
                                                  "[arena bob]\narena = cuda:0\n"
                                                  "cuda_share = vmm\narena_bytes = 8G\n"
                                                  "users = bob, 1001\n"
                                                  "[arena t-2_x]\ngroups = tenants\n"),
                     0);
    assert_int_equal(c.n_extra_arenas, 2);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    assert_int_equal(vase_config_dump(&c, f), 0);
    fclose(f);
    assert_non_null(strstr(text, "\n[arena bob]\narena = cuda:0\ncuda_share = vmm\n"
                                 "arena_bytes = 8G\ngranule_bytes = 4M\nusers = bob, 1001\n"
                                 "groups =\n"));
    assert_non_null(strstr(text, "\n[arena t-2_x]\narena = host\ncuda_share = ipc\n"
                                 "arena_bytes = 1G\ngranule_bytes = 4M\nusers =\n"
                                 "groups = tenants\n"));
    free(text);
    assert_int_equal(vase_config_check(&c, NULL), 0);
    round_trip(&c);
    vase_config_done(&c);
}

static void test_cmdline(void **state) {
    (void)state;
    struct vase_cmdline cmd;
    char *argv1[] = {"vased",
                     "--runtime-dir=/tmp/r",
                     "--log_level",
                     "debug",
                     "--config=/nonexistent/vased.conf",
                     "--max-clients=9",
                     NULL};
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
    char *argv7[] = {"vased", "--granule-bytes=3", NULL};
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

/* ---- item 12 of issue 7: mistakes in the file are refused, with their lines ---- */

static void test_ini_key_before_section(void **state) {
    (void)state;
    struct vase_config c;
    char log[2048];
    assert_int_equal(vase_config_init(&c), 0);
    assert_int_equal(parse_logged(&c, "# settings\n\nmax_clients = 3\n[vased]\n", log, sizeof(log)),
                     -EINVAL);
    assert_non_null(strstr(log, "(string):3: \"max_clients\" comes before any section"));
    assert_int_equal(c.max_clients, 64);
    /* The same key under [vased] is fine. */
    assert_int_equal(parse_logged(&c, "# settings\n\n[vased]\nmax_clients = 3\n", log, sizeof(log)),
                     0);
    assert_int_equal(c.max_clients, 3);
    assert_string_equal(log, "");
    vase_config_done(&c);
}

static void test_ini_duplicates(void **state) {
    (void)state;
    struct vase_config c;
    char log[2048];
    assert_int_equal(vase_config_init(&c), 0);

    /* A key given twice, also when spelled with '-' once: both lines named. */
    assert_int_equal(parse_logged(&c,
                                  "[vased]\nmax_clients = 3\nlog_level = debug\n"
                                  "max-clients = 4\n",
                                  log, sizeof(log)),
                     -EEXIST);
    assert_non_null(strstr(log, "(string):4: max_clients given twice in [vased] (lines 2 and 4)"));
    /* Parsing stops at the duplicate: what came before it stays applied. */
    assert_int_equal(c.max_clients, 3);
    assert_int_equal(c.log_level, LOG_DEBUG);
    assert_int_equal(vase_config_parse_string(&c, "[vased]\nmax_clients = 5\nlog_level = info\n"),
                     0);
    assert_int_equal(c.max_clients, 5);

    /* The same key in two sections is no duplicate; twice in one arena section is. */
    assert_int_equal(parse_logged(&c,
                                  "[vased]\narena_bytes = 1G\n[arena a]\narena_bytes = 2G\n"
                                  "[arena b]\narena_bytes = 2G\n",
                                  log, sizeof(log)),
                     0);
    assert_int_equal(c.n_extra_arenas, 2);
    vase_config_done(&c);
    assert_int_equal(vase_config_init(&c), 0);
    assert_int_equal(parse_logged(&c, "[vased]\n[arena a]\nusers = x\n\ngroups = g\nusers = y\n",
                                  log, sizeof(log)),
                     -EEXIST);
    assert_non_null(strstr(log, "(string):6: users given twice in [arena a] (lines 3 and 6)"));
    assert_int_equal(c.n_extra_arenas, 0);

    /* A section given twice. */
    assert_int_equal(parse_logged(&c, "[vased]\nmax_clients = 6\n[vased]\nstats_interval = 1\n",
                                  log, sizeof(log)),
                     -EEXIST);
    assert_non_null(strstr(log, "(string):3: section [vased] given twice (lines 1 and 3)"));
    assert_int_equal(c.stats_interval, 10);
    assert_int_equal(
        parse_logged(&c, "[vased]\n[arena a]\n[arena b]\n[arena  a ]\n", log, sizeof(log)),
        -EEXIST);
    assert_non_null(strstr(log, "(string):4: arena \"a\" defined twice (lines 2 and 4)"));
    assert_int_equal(c.n_extra_arenas, 0);
    /* A second text may not redefine an arena of the first either. */
    assert_int_equal(vase_config_parse_string(&c, "[arena a]\n"), 0);
    assert_int_equal(vase_config_parse_string(&c, "[arena a]\n"), -EEXIST);
    assert_int_equal(c.n_extra_arenas, 1);
    vase_config_done(&c);
}

/* The libinih switches config.c sets: an indented line is not the continuation of the value
 * above it, a line too long for libinih's buffer is refused rather than split, and the
 * reader's own lines between the text's neither hide a section nor shift a line number. */
static void test_ini_libinih_switches(void **state) {
    (void)state;
    struct vase_config c;
    char log[2048];
    assert_int_equal(vase_config_init(&c), 0);
    assert_int_equal(vase_config_parse_string(&c, "[vased]\nmax_clients = 3\n  stats_interval = 4\n"
                                                  "\tlog_level = debug\n"),
                     0);
    assert_int_equal(c.max_clients, 3);
    assert_int_equal(c.stats_interval, 4);
    assert_int_equal(c.log_level, LOG_DEBUG);
    /* libinih also takes "key: value". */
    assert_int_equal(vase_config_parse_string(&c, "[vased]\nmax_clients: 5\n"), 0);
    assert_int_equal(c.max_clients, 5);

    /* "[]" is a section (an unknown one) on the first line too. */
    assert_int_equal(parse_logged(&c, "[]\n", log, sizeof(log)), -EINVAL);
    assert_non_null(strstr(log, "(string):1: unknown section []"));
    assert_int_equal(parse_logged(&c, "[vased];x\n", log, sizeof(log)), -EINVAL);
    assert_non_null(strstr(log, "(string):1: text after the section's ']'"));
    assert_int_equal(parse_logged(&c, "\n[vased]\nstats_interval\n", log, sizeof(log)), -EINVAL);
    assert_non_null(strstr(log, "(string):3: expected \"key = value\""));

    /* A value of PATH_MAX bytes fits on a line; a longer comment line does not. */
    size_t n = 20000;
    char *text = malloc(n + 64);
    assert_non_null(text);
    int k = snprintf(text, n + 64, "[vased]\nruntime_dir = ");
    memset(text + k, 'd', PATH_MAX);
    strcpy(text + k + PATH_MAX, "\n");
    assert_int_equal(vase_config_parse_string(&c, text), 0);
    assert_int_equal(strlen(c.runtime_dir), PATH_MAX);
    k = snprintf(text, n + 64, "[vased]\nmax_clients = 6\n# ");
    memset(text + k, 'c', n);
    strcpy(text + k + n, "\nstats_interval = 9\n");
    assert_int_equal(parse_logged(&c, text, log, sizeof(log)), -EINVAL);
    assert_non_null(strstr(log, "(string):3: a line longer than"));
    assert_int_equal(c.max_clients, 6);
    assert_int_equal(c.stats_interval, 4);
    free(text);
    vase_config_done(&c);
}

static void test_config_file_errors(void **state) {
    (void)state;
    struct vase_config c;
    struct vase_cmdline cmd = {0};
    char dir[] = "/tmp/test_daemon_config-dir-XXXXXX", path[64], log[2048];

    assert_non_null(mkdtemp(dir));
    assert_int_equal(vase_config_init(&c), 0);
    assert_int_equal(vase_config_parse_file(&c, dir), -EISDIR);
    assert_int_equal(vase_config_parse_file(&c, "/nonexistent/vased.conf"), -ENOENT);
    /* A read that fails after a successful open (address 0 of this process is not mapped). */
    assert_int_equal(vase_config_parse_file(&c, "/proc/self/mem"), -EIO);
    /* /dev/null is an empty configuration (make update-vased-conf reads it). */
    assert_int_equal(vase_config_parse_file(&c, "/dev/null"), 0);
    vase_config_done(&c);

    /* vase_config_load() refuses them all, and says which file and why. */
    cmd.config_path = dir;
    capture_start();
    assert_int_equal(vase_config_load(&c, &cmd), -EISDIR);
    capture_end(log, sizeof(log));
    vase_config_done(&c);
    assert_non_null(strstr(log, dir));
    assert_non_null(strstr(log, "Is a directory"));
    cmd.config_path = "/nonexistent/vased.conf";
    assert_int_equal(vase_config_load(&c, &cmd), -ENOENT);
    vase_config_done(&c);
    /* The default file may be missing (where this machine has none, that is checked here). */
    if (access(VASE_CONFIG_DEFAULT_PATH, F_OK) != 0 && errno == ENOENT) {
        assert_int_equal(vase_config_load(&c, NULL), 0);
        vase_config_done(&c);
    } else
        print_message("%s exists: its absence is not checked.\n", VASE_CONFIG_DEFAULT_PATH);

    /* A file its reader may not read. Root reads everything, so only other users see it. */
    write_temp(path, "[vased]\n");
    assert_int_equal(chmod(path, 0), 0);
    cmd.config_path = path;
    if (geteuid() != 0) {
        assert_int_equal(vase_config_load(&c, &cmd), -EACCES);
        vase_config_done(&c);
    }
    unlink(path);

    /* A file with a NUL byte is not a configuration file. */
    strcpy(path, "/tmp/test_daemon_config.XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "[vased]\n\0max_clients = 1\n", 26), 26);
    close(fd);
    assert_int_equal(vase_config_load(&c, &cmd), -EINVAL);
    vase_config_done(&c);
    unlink(path);
    rmdir(dir);
}

static void test_vased_refuses_bad_files(void **state) {
    (void)state;
    char out[65536], dir[] = "/tmp/test_daemon_config-dir-XXXXXX", path[64];
    assert_non_null(mkdtemp(dir));
    char config[128];
    snprintf(config, sizeof(config), "--config=%s", dir);

    const char *a1[] = {config, NULL};
    assert_int_equal(run_vased(a1, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "Is a directory"));
    const char *a2[] = {config, "--dump-config", NULL};
    assert_int_equal(run_vased(a2, out, sizeof(out)), 1);
    const char *a3[] = {"--config=/nonexistent/vased.conf", NULL};
    assert_int_equal(run_vased(a3, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "/nonexistent/vased.conf"));

    write_temp(path, "max_clients = 3\n[vased]\n");
    snprintf(config, sizeof(config), "--config=%s", path);
    const char *a4[] = {config, NULL};
    assert_int_equal(run_vased(a4, out, sizeof(out)), 1);
    assert_non_null(strstr(out, ":1: \"max_clients\" comes before any section"));
    unlink(path);
    write_temp(path, "[vased]\nmax_clients = 3\nmax_clients = 4\n");
    snprintf(config, sizeof(config), "--config=%s", path);
    const char *a5[] = {config, NULL};
    assert_int_equal(run_vased(a5, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "(lines 2 and 3)"));
    unlink(path);

    /* A FIFO, as a drop-in or as the main file, stops vased at once with the reason; it is
     * never opened for a read that waits for a writer (run_vased() gives up after 15 s). */
    char fifo[96], dir_arg[128];
    snprintf(fifo, sizeof(fifo), "%s/10-fifo.conf", dir);
    assert_int_equal(mkfifo(fifo, 0644), 0);
    snprintf(dir_arg, sizeof(dir_arg), "--config-dir=%s", dir);
    const char *a6[] = {"--config=/dev/null", dir_arg, NULL};
    assert_int_equal(run_vased(a6, out, sizeof(out)), 1);
    assert_non_null(strstr(out, fifo));
    assert_non_null(strstr(out, "not a regular file but a FIFO"));
    snprintf(config, sizeof(config), "--config=%s", fifo);
    const char *a7[] = {config, NULL};
    assert_int_equal(run_vased(a7, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "Refusing the configuration file"));
    assert_non_null(strstr(out, "not a regular file but a FIFO"));
    unlink(fifo);
    rmdir(dir);
}

/* ---- host arenas against the machine's memory ---- */

static void test_memory(void **state) {
    (void)state;
    struct vase_config c;
    const uint64_t M = UINT64_C(1) << 20;
    assert_int_equal(vase_config_init(&c), 0);

    /* The default arena, 1G, against machines of several sizes. */
    assert_int_equal(vase_config_host_arena_bytes(&c), 1024 * M);
    assert_int_equal(vase_config_check_memory(&c, 4096 * M), 0);
    assert_int_equal(vase_config_check_memory(&c, 1366 * M), 0); /* 74.96% */
    assert_int_equal(vase_config_check_memory(&c, 1365 * M), 1); /* 75.02%: a warning */
    assert_int_equal(vase_config_check_memory(&c, 1024 * M), 1); /* all of it */
    assert_int_equal(vase_config_check_memory(&c, 1023 * M), -ERANGE);
    assert_int_equal(vase_config_check_memory(&c, 0), -EINVAL);
    assert_int_equal(vase_config_check_memory(NULL, 1024 * M), -EINVAL);

    /* --arena-bytes=1T on a 23 GiB machine. */
    assert_int_equal(vase_config_set(&c, "arena_bytes", "1T", 0), 0);
    assert_int_equal(vase_config_check_memory(&c, UINT64_C(23) << 30), -ERANGE);
    /* A GPU arena takes no host memory. */
    assert_int_equal(vase_config_set(&c, "arena", "cuda:0", 0), 0);
    assert_int_equal(vase_config_host_arena_bytes(&c), 0);
    assert_int_equal(vase_config_check_memory(&c, UINT64_C(23) << 30), 0);

    /* Host arenas add up; GPU ones among them do not count. */
    assert_int_equal(vase_config_parse_string(&c, "[vased]\narena = host\narena_bytes = 256M\n"
                                                  "[arena a]\narena_bytes = 512M\n"
                                                  "[arena g]\narena = cuda:1\narena_bytes = 1T\n"
                                                  "[arena b]\n"),
                     0);
    assert_int_equal(vase_config_host_arena_bytes(&c), 1024 * M);
    assert_int_equal(vase_config_check_memory(&c, 4096 * M), 0);
    assert_int_equal(vase_config_check_memory(&c, 1300 * M), 1);
    assert_int_equal(vase_config_check_memory(&c, 1000 * M), -ERANGE);
    vase_config_done(&c);
}

static void test_vased_refuses_large_arena(void **state) {
    (void)state;
    char out[65536], path[64];
    long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
    assert_true(pages > 0 && page_size > 0);
    uint64_t phys = (uint64_t)pages * (uint64_t)page_size;
    /* Eight host arenas of at most 1T each: the most vased can be asked for. */
    uint64_t each = ((phys / 8) / (2u << 20) + 1) * (2u << 20);
    if (each > (UINT64_C(1) << 40))
        skip(); /* over 8T of memory: no configuration can exceed it */
    char text[1024];
    int n = snprintf(text, sizeof(text), "[vased]\narena_bytes = %llu\n", (unsigned long long)each);
    for (int i = 0; i < 7; i++)
        n += snprintf(text + n, sizeof(text) - (size_t)n, "[arena a%d]\n", i);
    write_temp(path, text);
    char config[96];
    snprintf(config, sizeof(config), "--config=%s", path);
    const char *args[] = {config, NULL};
    assert_int_equal(run_vased(args, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "more than the"));
    assert_non_null(strstr(out, "of memory of this machine"));
    /* A dump is not refused: it may be meant for another machine. */
    const char *dump[] = {config, "--dump-config", NULL};
    assert_int_equal(run_vased(dump, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "[arena a6]"));
    unlink(path);
}

/* ---- [arena NAME] sections ---- */

static void test_arena_sections(void **state) {
    (void)state;
    struct vase_config c;
    assert_int_equal(vase_config_init(&c), 0);
    /* An arena section before [vased] takes the [vased] values of the whole text. */
    assert_int_equal(vase_config_parse_string(&c, "[arena early]\nusers = carol\n"
                                                  "[vased]\narena_bytes = 1G\ngranule_bytes = 4M\n"
                                                  "cuda_share = vmm\narena_users = alice\n"
                                                  "arena_groups = staff\n"
                                                  "[arena bob]\narena = cuda:GPU-0a1b2c3d-0000-"
                                                  "1111-2222-333344445555\narena-bytes = 8G\n"
                                                  "granule_bytes = 1M\ncuda_share = ipc\n"
                                                  "users = bob\ngroups = bobs, 2000\n"),
                     0);
    assert_int_equal(c.n_extra_arenas, 2);
    const struct vase_arena_config *e = &c.extra_arenas[0], *b = &c.extra_arenas[1];
    assert_string_equal(e->name, "early");
    assert_string_equal(e->arena, "host");
    assert_string_equal(e->cuda_share, "vmm");
    assert_int_equal(e->arena_bytes, 1u << 30);
    assert_int_equal(e->granule_bytes, 4u << 20);
    assert_string_equal(e->users, "carol");
    /* The default arena's tenants are not another arena's. */
    assert_string_equal(e->groups, "");
    assert_string_equal(b->name, "bob");
    assert_string_equal(b->arena, "cuda:GPU-0a1b2c3d-0000-1111-2222-333344445555");
    assert_string_equal(b->cuda_share, "ipc");
    assert_int_equal(b->arena_bytes, UINT64_C(8) << 30);
    assert_int_equal(b->granule_bytes, 1u << 20);
    assert_string_equal(b->users, "bob");
    assert_string_equal(b->groups, "bobs, 2000");
    assert_string_equal(c.arena_users, "alice");
    assert_string_equal(c.arena_groups, "staff");
    assert_int_equal(vase_config_check(&c, NULL), 0);
    vase_config_done(&c);
    assert_null(c.extra_arenas);
    assert_int_equal(c.n_extra_arenas, 0);

    /* Names: 32 characters of [A-Za-z0-9_-] at most; "default" is the [vased] one's. */
    assert_int_equal(vase_config_init(&c), 0);
    assert_int_equal(vase_config_parse_string(&c, "[arena Abc-09_z]\n"
                                                  "[arena 0123456789abcdef0123456789ABCDEF]\n"),
                     0);
    assert_int_equal(c.n_extra_arenas, 2);
    assert_string_equal(c.extra_arenas[1].name, "0123456789abcdef0123456789ABCDEF");
    vase_config_done(&c);

    /* Seven sections, vased's most; the eighth is refused with its line. */
    char text[512], log[2048];
    int n = 0;
    for (int i = 0; i < 8; i++)
        n += snprintf(text + n, sizeof(text) - (size_t)n, "[arena t%d]\n", i);
    assert_int_equal(vase_config_init(&c), 0);
    assert_int_equal(parse_logged(&c, text, log, sizeof(log)), -E2BIG);
    assert_non_null(strstr(log, "(string):8: more than 7 [arena NAME] sections"));
    assert_int_equal(c.n_extra_arenas, 0);
    text[strlen(text) - strlen("[arena t7]\n")] = '\0';
    assert_int_equal(vase_config_parse_string(&c, text), 0);
    assert_int_equal(c.n_extra_arenas, VASE_CONFIG_MAX_EXTRA_ARENAS);
    assert_int_equal(vase_config_parse_string(&c, "[arena more]\n"), -E2BIG);
    assert_int_equal(vase_config_check(&c, NULL), 0);
    vase_config_done(&c);

    /* Command-line flags change the default arena only. */
    char path[64];
    write_temp(path, "[vased]\ngranule_bytes = 1M\n[arena x]\n");
    char config[96];
    snprintf(config, sizeof(config), "--config=%s", path);
    char *argv[] = {"vased", config, "--granule-bytes=4M", "--arena-bytes=1G", NULL};
    struct vase_cmdline cmd;
    assert_int_equal(vase_cmdline_parse(4, argv, &cmd), 0);
    assert_int_equal(vase_config_load(&c, &cmd), 0);
    assert_int_equal(c.granule_bytes, 4u << 20);
    assert_int_equal(c.arena_bytes, 1u << 30);
    assert_int_equal(c.n_extra_arenas, 1);
    assert_int_equal(c.extra_arenas[0].granule_bytes, 1u << 20);
    assert_int_equal(c.extra_arenas[0].arena_bytes, 1u << 30);
    vase_config_done(&c);
    vase_cmdline_done(&cmd);
    unlink(path);
}

static void test_arena_section_errors(void **state) {
    (void)state;
    static const struct {
        const char *text;
        int error;
        const char *log; /* part of the message */
    } cases[] = {
        {"[vased]\n[arena bob]\nuser = bob\n", -EINVAL,
         "(string):3: unknown key \"user\" in [arena bob]"},
        {"[vased]\n[arena bob]\nmax_clients = 3\n", -EINVAL,
         "(string):3: unknown key \"max_clients\" in [arena bob]"},
        {"[arena]\n", -EINVAL, "(string):1: bad arena name \"\""},
        {"[arena default]\n", -EINVAL, "(string):1: bad arena name \"default\""},
        {"[arena bob smith]\n", -EINVAL, "(string):1: bad arena name \"bob smith\""},
        {"[arena b.o.b]\n", -EINVAL, "(string):1: bad arena name \"b.o.b\""},
        {"[arena 0123456789abcdef0123456789abcdefX]\n", -EINVAL, "bad arena name"},
        {"[arenas]\n", -EINVAL, "(string):1: unknown section [arenas]"},
        {"[arena x]\narena_bytes = 2T\n", -ERANGE,
         "(string):2: bad value \"2T\" for arena_bytes in [arena x]"},
        {"[arena x]\narena_bytes = 32K\n", -ERANGE, "for arena_bytes in [arena x]"},
        {"[arena x]\ngranule_bytes = 1K\n", -ERANGE, "for granule_bytes in [arena x]"},
        {"[arena x]\ngranule_bytes = lots\n", -EINVAL, "for granule_bytes in [arena x]"},
        {"[arena x]\ngranule_bytes = 6144\n", -EINVAL,
         "(string):1: [arena x]: granule_bytes must be a multiple of 4096"},
        {"[vased]\n\n[arena x]\narena_bytes = 3M\n", -EINVAL,
         "(string):3: [arena x]: granule_bytes must divide arena_bytes"},
        {"[arena x]\narena_bytes = 2M\n", -EINVAL, "[arena x]: the arena must hold at least 2"},
        {"[arena x]\ncuda_share = nvlink\n", -EINVAL,
         "[arena x]: cuda_share must be \"ipc\" or \"vmm\""},
        /* An arena section's values inherited from [vased] are checked as its own. */
        {"[vased]\ngranule_bytes = 1M\narena_bytes = 1G\n[arena x]\narena_bytes = 1536K\n", -EINVAL,
         "[arena x]: granule_bytes must divide arena_bytes"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct vase_config c;
        char log[2048];
        assert_int_equal(vase_config_init(&c), 0);
        int r = parse_logged(&c, cases[i].text, log, sizeof(log));
        if (r != cases[i].error || !strstr(log, cases[i].log))
            fail_msg("case %zu (%s): %d, \"%s\"; expected %d, \"%s\"", i, cases[i].text, r, log,
                     cases[i].error, cases[i].log);
        assert_int_equal(c.n_extra_arenas, 0);
        assert_null(c.extra_arenas);
        vase_config_done(&c);
    }
}

/* vase_config_check() also holds for arenas put in the struct by other code than the parser. */
static void test_arena_check(void **state) {
    (void)state;
    struct vase_config c;
    const char *msg;
    assert_int_equal(vase_config_init(&c), 0);
    assert_int_equal(vase_config_parse_string(&c, "[arena a]\n[arena b]\n"), 0);
    assert_int_equal(vase_config_check(&c, &msg), 0);
    assert_null(msg);

    c.extra_arenas[1].granule_bytes = 3u << 20;
    assert_int_equal(vase_config_check(&c, &msg), -EINVAL);
    assert_string_equal(msg, "[arena b]: granule_bytes must divide arena_bytes");
    c.extra_arenas[1].granule_bytes = 2u << 20;
    c.extra_arenas[1].arena_bytes = UINT64_C(2) << 40;
    assert_int_equal(vase_config_check(&c, &msg), -EINVAL);
    assert_string_equal(msg, "[arena b]: arena_bytes or granule_bytes out of bounds");
    c.extra_arenas[1].arena_bytes = 256u << 20;
    free(c.extra_arenas[1].name);
    c.extra_arenas[1].name = strdup("a");
    assert_int_equal(vase_config_check(&c, &msg), -EINVAL);
    assert_string_equal(msg, "[arena a]: defined twice");
    free(c.extra_arenas[1].name);
    c.extra_arenas[1].name = strdup("default");
    assert_int_equal(vase_config_check(&c, &msg), -EINVAL);
    free(c.extra_arenas[1].name);
    c.extra_arenas[1].name = strdup("b");
    free(c.extra_arenas[1].cuda_share);
    c.extra_arenas[1].cuda_share = strdup("nvlink");
    assert_int_equal(vase_config_check(&c, &msg), -EINVAL);
    assert_string_equal(msg, "[arena b]: cuda_share must be \"ipc\" or \"vmm\"");
    free(c.extra_arenas[1].cuda_share);
    c.extra_arenas[1].cuda_share = NULL;
    assert_int_equal(vase_config_check(&c, &msg), -EINVAL);
    c.extra_arenas[1].cuda_share = strdup("ipc");
    assert_int_equal(vase_config_check(&c, &msg), 0);
    c.n_extra_arenas = VASE_CONFIG_MAX_EXTRA_ARENAS + 1; /* only the count is looked at first */
    assert_int_equal(vase_config_check(&c, &msg), -EINVAL);
    assert_string_equal(msg, "too many [arena NAME] sections");
    c.n_extra_arenas = 2;
    vase_config_done(&c);
}

/* What the SIGHUP reload compares: arena sections cannot change while vased runs. */
static void test_arenas_equal(void **state) {
    (void)state;
    static const char *const base = "[arena a]\nusers = alice\n[arena b]\narena = cuda:0\n";
    static const char *const changed[] = {
        "[arena a]\nusers = alice\n",                            /* one fewer */
        "[arena b]\narena = cuda:0\n[arena a]\nusers = alice\n", /* order */
        "[arena a]\nusers = alice\n[arena c]\narena = cuda:0\n", /* name */
        "[arena a]\nusers = alice\n[arena b]\narena = cuda:1\n", /* arena */
        "[arena a]\nusers = alice\n[arena b]\narena = cuda:0\ncuda_share = vmm\n",
        "[arena a]\nusers = alice\n[arena b]\narena = cuda:0\narena_bytes = 512M\n",
        "[arena a]\nusers = alice\n[arena b]\narena = cuda:0\ngranule_bytes = 4M\n",
        "[arena a]\nusers = bob\n[arena b]\narena = cuda:0\n",               /* users */
        "[arena a]\nusers = alice\ngroups = g\n[arena b]\narena = cuda:0\n", /* groups */
        "",                                                                  /* none */
    };
    struct vase_config a, b;
    assert_int_equal(vase_config_init(&a), 0);
    assert_int_equal(vase_config_parse_string(&a, base), 0);
    assert_int_equal(vase_config_init(&b), 0);
    assert_int_equal(vase_config_parse_string(&b, base), 0);
    assert_true(vase_config_arenas_equal(&a, &b));
    /* Settings of the [vased] section are not the arena sections' business. */
    assert_int_equal(vase_config_set(&b, "max_clients", "3", 0), 0);
    assert_true(vase_config_arenas_equal(&a, &b));
    vase_config_done(&b);
    for (size_t i = 0; i < sizeof(changed) / sizeof(changed[0]); i++) {
        assert_int_equal(vase_config_init(&b), 0);
        assert_int_equal(vase_config_parse_string(&b, changed[i]), 0);
        if (vase_config_arenas_equal(&a, &b) || vase_config_arenas_equal(&b, &a))
            fail_msg("case %zu: \"%s\" compares equal", i, changed[i]);
        vase_config_done(&b);
    }
    vase_config_done(&a);
    assert_int_equal(vase_config_init(&a), 0);
    assert_int_equal(vase_config_init(&b), 0);
    assert_true(vase_config_arenas_equal(&a, &b));
    vase_config_done(&a);
    vase_config_done(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_valid),
        cmocka_unit_test(test_parsers),
        cmocka_unit_test(test_set_get),
        cmocka_unit_test(test_check),
        cmocka_unit_test(test_ini),
        cmocka_unit_test(test_dump_round_trip),
        cmocka_unit_test(test_cmdline),
        cmocka_unit_test(test_ini_key_before_section),
        cmocka_unit_test(test_ini_duplicates),
        cmocka_unit_test(test_ini_libinih_switches),
        cmocka_unit_test(test_config_file_errors),
        cmocka_unit_test(test_vased_refuses_bad_files),
        cmocka_unit_test(test_memory),
        cmocka_unit_test(test_vased_refuses_large_arena),
        cmocka_unit_test(test_arena_sections),
        cmocka_unit_test(test_arena_section_errors),
        cmocka_unit_test(test_arena_check),
        cmocka_unit_test(test_arenas_equal),
    };
    /* The code under test logs its refusals; keep the output to the test results. */
    vase_log_set_max_level(LOG_EMERG);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
