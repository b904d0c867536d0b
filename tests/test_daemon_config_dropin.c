/* SPDX-License-Identifier: MIT */

/* Unit tests of the configuration that lasts (daemon/config/config_dropin.c and the origins of
 * daemon/config/config.c): which drop-ins count and in what order, what vase_config_load() makes of
 * a main file, drop-ins and flags and where it says each value comes from, what a reload does to
 * each kind of value, and the file `config set --persist` writes, with write failures made by
 * wrapping write(2) and mkostemp(3). */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "../daemon/config/config.h"
#include "../daemon/core/log.h"
#include "log_capture.h"

/* ---- failures on demand ---- */

static int fail_write = 0;    /* errno the next write(2)s of the code under test fail with */
static int fail_mkostemp = 0; /* likewise for mkostemp(3) */

ssize_t __real_write(int fd, const void *buf, size_t n);
ssize_t __wrap_write(int fd, const void *buf, size_t n);
ssize_t __wrap_write(int fd, const void *buf, size_t n) {
    if (fail_write) {
        errno = fail_write;
        return -1;
    }
    return __real_write(fd, buf, n);
}

int __real_mkostemp(char *template, int flags);
int __wrap_mkostemp(char *template, int flags);
int __wrap_mkostemp(char *template, int flags) {
    if (fail_mkostemp) {
        errno = fail_mkostemp;
        return -1;
    }
    return __real_mkostemp(template, flags);
}

/* ---- helpers ---- */

static char tmp[64];

static int setup(void **state) {
    (void)state;
    snprintf(tmp, sizeof(tmp), "/tmp/vase-dropin-XXXXXX");
    return mkdtemp(tmp) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    fail_write = fail_mkostemp = 0;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
    return system(cmd) == 0 ? 0 : -1;
}

static void put(const char *name, const char *text) {
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", tmp, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
    /* vased refuses a file others can write, whatever this process's umask. */
    assert_int_equal(chmod(path, 0644), 0);
}

/* The path of name in tmp, in a static buffer (one of two, for two at once). */
static const char *at(const char *name) {
    static char bufs[2][PATH_MAX];
    static int i;
    i = !i;
    snprintf(bufs[i], sizeof(bufs[i]), "%s/%s", tmp, name);
    return bufs[i];
}

static void make_dir(const char *name) {
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", tmp, name);
    assert_int_equal(mkdir(path, 0755), 0);
    assert_int_equal(chmod(path, 0755), 0);
}

static const char *get_text(const char *name) {
    static char buf[8192];
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", tmp, name);
    FILE *f = fopen(path, "r");
    buf[0] = '\0';
    if (f) {
        buf[fread(buf, 1, sizeof(buf) - 1, f)] = '\0';
        fclose(f);
    }
    return buf;
}

/* The names in tmp/dir, sorted, joined by spaces. */
static const char *listing(const char *dir) {
    static char out[1024];
    char path[PATH_MAX], cmd[PATH_MAX + 64];
    snprintf(path, sizeof(path), "%s/%s", tmp, dir);
    snprintf(cmd, sizeof(cmd), "ls -A '%s' | LC_ALL=C sort | tr '\\n' ' '", path);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    out[fread(out, 1, sizeof(out) - 1, p)] = '\0';
    pclose(p);
    return out;
}

static const char *source_of(const struct vase_config *c, const char *key) {
    static char buf[PATH_MAX + 32];
    assert_int_equal(vase_config_source(c, vase_setting_find(key), buf, sizeof(buf)), 0);
    return buf;
}

static const char *value_of(const struct vase_config *c, const char *key) {
    static char buf[PATH_MAX + 1];
    assert_int_equal(vase_config_format(c, vase_setting_find(key), buf, sizeof(buf)), 0);
    return buf;
}

/* vase_config_load() of tmp/vased.conf with flags ("key", "value" pairs, NULL-ended). */
static int load(struct vase_config *c, const char *const *flags) {
    char conf[PATH_MAX];
    char *keys[8], *values[8];
    size_t n = 0;
    snprintf(conf, sizeof(conf), "%s/vased.conf", tmp);
    for (; flags && flags[2 * n]; n++) {
        keys[n] = (char *)flags[2 * n];
        values[n] = (char *)flags[2 * n + 1];
    }
    struct vase_cmdline cmd = {
        .config_path = conf, .n_overrides = n, .keys = keys, .values = values};
    log_capture_begin();
    int r = vase_config_load(c, &cmd);
    log_capture_end();
    return r;
}

static void expect(const struct vase_config *c, const char *key, const char *value,
                   const char *source) {
    char want[PATH_MAX + 64];
    if (strncmp(source, "file ", 5) == 0)
        snprintf(want, sizeof(want), "file %s/%s", tmp, source + 5);
    else
        snprintf(want, sizeof(want), "%s", source);
    assert_string_equal(value_of(c, key), value);
    assert_string_equal(source_of(c, key), want);
}

/* ---- which drop-ins ---- */

static void test_dropins_listed(void **state) {
    (void)state;
    char dir[PATH_MAX], **list;
    size_t n = 99;

    snprintf(dir, sizeof(dir), "%s/d", tmp);
    assert_int_equal(vase_config_dropins(dir, &list, &n), 0); /* missing: none */
    assert_int_equal(n, 0);
    assert_null(list);

    make_dir("d");
    put("d/b.conf", "");
    put("d/a.conf", "");
    put("d/B.conf", "");
    put("d/10-x.conf", "");
    put("d/.hidden.conf", "");
    put("d/c.conf~", "");
    put("d/d.conf.dpkg-old", "");
    put("d/.conf", "");
    assert_int_equal(vase_config_dropins(dir, &list, &n), 0);
    assert_int_equal(n, 4);
    const char *want[] = {"10-x.conf", "B.conf", "a.conf", "b.conf"}; /* bytewise */
    for (size_t i = 0; i < n; i++) {
        char path[PATH_MAX + 32];
        snprintf(path, sizeof(path), "%s/%s", dir, want[i]);
        assert_string_equal(list[i], path);
    }
    vase_config_dropins_free(list, n);

    /* A file where the directory should be is an error, not "no drop-ins". */
    snprintf(dir, sizeof(dir), "%s/d/a.conf", tmp);
    assert_int_equal(vase_config_dropins(dir, &list, &n), -ENOTDIR);
    assert_int_equal(vase_config_dropins(NULL, &list, &n), -EINVAL);
}

/* ---- loading and origins ---- */

static void test_load_origins(void **state) {
    (void)state;
    struct vase_config c;

    put("vased.conf", "[vased]\nmax_clients = 10\nstats_interval = 3\nlog_level = debug\n");
    make_dir("vased.conf.d");
    put("vased.conf.d/20-b.conf", "[vased]\nmax_clients = 20\n");
    put("vased.conf.d/10-a.conf", "[vased]\nmax_clients = 15\nadmission_wait_ms = 5\n");
    assert_int_equal(load(&c, (const char *const[]){"log-level", "notice", NULL}), 0);
    expect(&c, "max_clients", "20", "file vased.conf.d/20-b.conf");
    expect(&c, "admission_wait_ms", "5", "file vased.conf.d/10-a.conf");
    expect(&c, "stats_interval", "3", "file vased.conf");
    expect(&c, "log_level", "notice", "command line");
    expect(&c, "max_seqs_per_client", "1024", "default");
    char dropins[PATH_MAX];
    snprintf(dropins, sizeof(dropins), "%s/vased.conf.d", tmp);
    assert_string_equal(c.dropin_dir, dropins);
    /* The files' value stays known under a flag: a reload compares it. */
    assert_string_equal(c.origins[vase_setting_find("log_level") - vase_settings].file_value,
                        "debug");
    vase_config_set_origin(&c, vase_setting_find("max_clients"), VASE_CONFIG_FROM_RUNTIME, 42);
    expect(&c, "max_clients", "20", "runtime (uid 42)");
    vase_config_done(&c);

    /* --config-dir elsewhere; the drop-ins beside the main file are not read. */
    make_dir("other");
    put("other/x.conf", "[vased]\nmax_clients = 7\n");
    char other[PATH_MAX];
    snprintf(other, sizeof(other), "%s/other", tmp);
    assert_int_equal(load(&c, (const char *const[]){"config-dir", other, NULL}), 0);
    expect(&c, "max_clients", "7", "file other/x.conf");
    expect(&c, "admission_wait_ms", "0", "default");
    vase_config_done(&c);

    /* A broken drop-in fails the load, naming file and line. */
    put("vased.conf.d/15-bad.conf", "[vased]\nmax_clients = 10\nno_such_key = 1\n");
    char conf[PATH_MAX];
    snprintf(conf, sizeof(conf), "%s/vased.conf", tmp);
    struct vase_cmdline cmd = {.config_path = conf};
    log_capture_begin();
    assert_int_equal(vase_config_load(&c, &cmd), -EINVAL);
    const char *log = log_capture_end();
    char line[PATH_MAX + 64];
    snprintf(line, sizeof(line), "%s/vased.conf.d/15-bad.conf:3: unknown setting", tmp);
    assert_non_null(strstr(log, line));
    vase_config_done(&c);
}

/* ---- reloads ---- */

static void test_reload_setting(void **state) {
    (void)state;
    struct vase_config run, next;
    const struct vase_setting *mc = vase_setting_find("max_clients"),
                              *si = vase_setting_find("stats_interval"),
                              *ll = vase_setting_find("log_level");

    put("vased.conf", "[vased]\nstats_interval = 3\nlog_level = debug\n");
    assert_int_equal(load(&run, (const char *const[]){"log_level", "notice", NULL}), 0);
    /* Set at run time. */
    assert_int_equal(vase_config_set(&run, "max_clients", "12", VASE_CONFIG_RUNTIME), 0);
    vase_config_set_origin(&run, mc, VASE_CONFIG_FROM_RUNTIME, 7);
    assert_int_equal(vase_config_set(&run, "stats_interval", "4", VASE_CONFIG_RUNTIME), 0);
    vase_config_set_origin(&run, si, VASE_CONFIG_FROM_RUNTIME, 7);

    /* The files unchanged: both values set at run time stay. */
    assert_int_equal(load(&next, (const char *const[]){"log_level", "notice", NULL}), 0);
    log_capture_begin();
    assert_int_equal(vase_config_reload_setting(&run, &next, mc), 0);
    assert_int_equal(vase_config_reload_setting(&run, &next, si), 0);
    assert_int_equal(vase_config_reload_setting(&run, &next, ll), 0);
    const char *log = log_capture_end();
    assert_non_null(strstr(log, "Reload: max_clients keeps 12, set at run time by uid 7"));
    assert_non_null(strstr(log, "Reload: stats_interval keeps 4, set at run time by uid 7"));
    expect(&run, "max_clients", "12", "runtime (uid 7)");
    expect(&run, "stats_interval", "4", "runtime (uid 7)");
    expect(&run, "log_level", "notice", "command line");
    vase_config_done(&next);

    /* The files change stats_interval and log_level and add max_clients. */
    put("vased.conf", "[vased]\nstats_interval = 8\nmax_clients = 30\nlog_level = err\n");
    assert_int_equal(load(&next, (const char *const[]){"log_level", "notice", NULL}), 0);
    log_capture_begin();
    assert_int_equal(vase_config_reload_setting(&run, &next, mc), 1);
    assert_int_equal(vase_config_reload_setting(&run, &next, si), 1);
    assert_int_equal(vase_config_reload_setting(&run, &next, ll), 0); /* the flag wins */
    log = log_capture_end();
    char line[PATH_MAX + 64];
    snprintf(line, sizeof(line), "Reload: max_clients = 30 (was 12) from %s/vased.conf.", tmp);
    assert_non_null(strstr(log, line));
    expect(&run, "max_clients", "30", "file vased.conf");
    expect(&run, "stats_interval", "8", "file vased.conf");
    expect(&run, "log_level", "notice", "command line");
    vase_config_done(&next);

    /* max_clients removed from the file: back to the default. */
    put("vased.conf", "[vased]\nstats_interval = 8\nlog_level = err\n");
    assert_int_equal(load(&next, (const char *const[]){"log_level", "notice", NULL}), 0);
    log_capture_begin();
    assert_int_equal(vase_config_reload_setting(&run, &next, mc), 1);
    assert_non_null(strstr(log_capture_end(), "Reload: max_clients = 64 (was 30), the default"));
    expect(&run, "max_clients", "64", "default");
    /* Only runtime settings reload. */
    assert_int_equal(vase_config_reload_setting(&run, &next, vase_setting_find("arena")), -EINVAL);
    vase_config_done(&next);
    vase_config_done(&run);
}

/* ---- config set --persist ---- */

static void test_persist_file(void **state) {
    (void)state;
    const struct vase_setting *mc = vase_setting_find("max_clients"),
                              *aw = vase_setting_find("admission_wait_ms");
    char dir[PATH_MAX], *path = NULL;
    snprintf(dir, sizeof(dir), "%s/conf.d", tmp);

    /* The directory is made when missing; the file gets a header and the key. */
    assert_int_equal(vase_config_persist(dir, mc, "12", 5, 0, &path), 0);
    char want[PATH_MAX + 32];
    snprintf(want, sizeof(want), "%s/90-vasectl.conf", dir);
    assert_string_equal(path, want);
    free(path);
    assert_string_equal(get_text("conf.d/90-vasectl.conf"),
                        "# Written by `vasectl config set --persist`: each key below is the last "
                        "value persisted\n"
                        "# for it, with who set it and when in the comment above it. vased reads "
                        "this file after\n"
                        "# the main configuration file and the drop-ins named before it; a "
                        "drop-in named after it\n"
                        "# overrides it. vased rewrites it whole; edit it only in the same form.\n"
                        "\n"
                        "[vased]\n"
                        "\n"
                        "# max_clients: set by uid 5 at 1970-01-01 00:00:00 UTC\n"
                        "max_clients = 12\n");

    /* Another key is added, then the first replaced in place; comments go with their keys. */
    assert_int_equal(vase_config_persist(dir, aw, "250", 6, 60, &path), 0);
    free(path);
    assert_int_equal(vase_config_persist(dir, mc, "13", 7, 120, &path), 0);
    free(path);
    const char *text = get_text("conf.d/90-vasectl.conf");
    const char *tail = "\n[vased]\n"
                       "\n# admission_wait_ms: set by uid 6 at 1970-01-01 00:01:00 UTC\n"
                       "admission_wait_ms = 250\n"
                       "\n# max_clients: set by uid 7 at 1970-01-01 00:02:00 UTC\n"
                       "max_clients = 13\n";
    assert_non_null(strstr(text, tail));
    assert_string_equal(strstr(text, tail), tail);
    assert_string_equal(listing("conf.d"), "90-vasectl.conf ");

    /* It reads back as a drop-in. */
    struct vase_config c;
    put("vased.conf", "[vased]\nmax_clients = 40\n");
    assert_int_equal(load(&c, (const char *const[]){"config_dir", dir, NULL}), 0);
    expect(&c, "max_clients", "13", "file conf.d/90-vasectl.conf");
    vase_config_done(&c);

    /* Text this writer does not write is refused, and the file left as it was: a line that is
     * only the start of "[vased]", another section. */
    put("conf.d/90-vasectl.conf", "[\nmax_clients = 13\n");
    log_capture_begin();
    assert_int_equal(vase_config_persist(dir, mc, "14", 0, 0, &path), -EINVAL);
    assert_non_null(strstr(log_capture_end(), "90-vasectl.conf:1: only [vased] belongs"));
    assert_string_equal(get_text("conf.d/90-vasectl.conf"), "[\nmax_clients = 13\n");
    put("conf.d/90-vasectl.conf", "[vased]\nmax_clients = 13\n[arena x]\narena = host\n");
    log_capture_begin();
    assert_int_equal(vase_config_persist(dir, mc, "14", 0, 0, &path), -EINVAL);
    assert_non_null(strstr(log_capture_end(), "90-vasectl.conf:3: only [vased] belongs"));
    assert_string_equal(get_text("conf.d/90-vasectl.conf"),
                        "[vased]\nmax_clients = 13\n[arena x]\narena = host\n");
    /* A value the parser would not read back is refused too (a string with a comment in it). */
    put("conf.d/90-vasectl.conf", "[vased]\n");
    log_capture_begin();
    assert_int_equal(
        vase_config_persist(dir, vase_setting_find("allow_users"), "a ;b", 0, 0, &path), -EBADMSG);
    log_capture_end();
    assert_string_equal(get_text("conf.d/90-vasectl.conf"), "[vased]\n");
    assert_int_equal(vase_config_persist(dir, mc, "1\n2", 0, 0, &path), -EINVAL);
    assert_string_equal(listing("conf.d"), "90-vasectl.conf ");
}

static void test_persist_failures(void **state) {
    (void)state;
    const struct vase_setting *mc = vase_setting_find("max_clients");
    char dir[PATH_MAX], *path = NULL;
    snprintf(dir, sizeof(dir), "%s/conf.d", tmp);
    assert_int_equal(vase_config_persist(dir, mc, "12", 0, 0, &path), 0);
    free(path);
    path = NULL;
    char before[8192];
    snprintf(before, sizeof(before), "%s", get_text("conf.d/90-vasectl.conf"));

    /* A full disk: the old file stays, no temporary file is left behind. */
    fail_write = ENOSPC;
    assert_int_equal(vase_config_persist(dir, mc, "13", 0, 0, &path), -ENOSPC);
    fail_write = 0;
    assert_string_equal(get_text("conf.d/90-vasectl.conf"), before);
    assert_string_equal(listing("conf.d"), "90-vasectl.conf ");

    /* A read-only file system. */
    fail_mkostemp = EROFS;
    assert_int_equal(vase_config_persist(dir, mc, "13", 0, 0, &path), -EROFS);
    fail_mkostemp = 0;
    assert_string_equal(get_text("conf.d/90-vasectl.conf"), before);

    /* No directory and none can be made: a file is in the way. */
    put("file", "");
    snprintf(dir, sizeof(dir), "%s/file/conf.d", tmp);
    assert_int_equal(vase_config_persist(dir, mc, "13", 0, 0, &path), -ENOTDIR);
    assert_null(path);
}

/* ---- files vased does not trust ---- */

/* load() that must fail with r, its log naming tmp/name and saying why. */
static void expect_refused(const char *const *flags, int r, const char *name, const char *why) {
    struct vase_config c;
    char conf[PATH_MAX], *log;
    snprintf(conf, sizeof(conf), "%s/vased.conf", tmp);
    struct vase_cmdline cmd = {.config_path = conf};
    char *keys[2], *values[2];
    if (flags) {
        keys[0] = (char *)flags[0];
        values[0] = (char *)flags[1];
        cmd.keys = keys;
        cmd.values = values;
        cmd.n_overrides = 1;
    }
    log_capture_begin();
    int got = vase_config_load(&c, &cmd);
    log = (char *)log_capture_end();
    vase_config_done(&c);
    if (got != r || !strstr(log, at(name)) || !strstr(log, why))
        fail_msg("load: %d (expected %d), log \"%s\" (expected %s and \"%s\")", got, r, log,
                 at(name), why);
}

static void test_refused_files(void **state) {
    (void)state;
    struct vase_config c;

    put("vased.conf", "[vased]\nmax_clients = 10\n");
    make_dir("vased.conf.d");
    put("vased.conf.d/10-a.conf", "[vased]\nmax_clients = 11\n");
    assert_int_equal(load(&c, NULL), 0);
    expect(&c, "max_clients", "11", "file vased.conf.d/10-a.conf");
    vase_config_done(&c);

    /* A drop-in directory anyone can write: anyone could add allow_users. */
    assert_int_equal(chmod(at("vased.conf.d"), 0777), 0);
    expect_refused(NULL, -EPERM, "vased.conf.d (owner uid ",
                   "mode 0777): others than its owner can write it");
    assert_int_equal(chmod(at("vased.conf.d"), 01777), 0); /* sticky as /tmp: the same */
    expect_refused(NULL, -EPERM, "vased.conf.d", "others than its owner can write it");
    assert_int_equal(chmod(at("vased.conf.d"), 0775), 0); /* its group: the same */
    expect_refused(NULL, -EPERM, "vased.conf.d", "others than its owner can write it");
    assert_int_equal(chmod(at("vased.conf.d"), 0755), 0);

    /* A drop-in, or the main file, its group can write. */
    assert_int_equal(chmod(at("vased.conf.d/10-a.conf"), 0664), 0);
    expect_refused(NULL, -EPERM, "vased.conf.d/10-a.conf (owner uid ",
                   "mode 0664): others than its owner can write it");
    assert_int_equal(chmod(at("vased.conf.d/10-a.conf"), 0644), 0);
    assert_int_equal(chmod(at("vased.conf"), 0646), 0);
    expect_refused(NULL, -EPERM, "vased.conf (owner uid ",
                   "mode 0646): others than its owner can write it");
    assert_int_equal(chmod(at("vased.conf"), 0644), 0);

    /* A symlinked drop-in, to a file outside the directory or inside it: refused either way. */
    put("outside.conf", "[vased]\nallow_users = mallory\n");
    assert_int_equal(symlink(at("outside.conf"), at("vased.conf.d/20-link.conf")), 0);
    expect_refused(NULL, -ELOOP, "vased.conf.d/20-link.conf", "it is a symlink");
    assert_int_equal(unlink(at("vased.conf.d/20-link.conf")), 0);
    assert_int_equal(symlink("10-a.conf", at("vased.conf.d/20-link.conf")), 0);
    expect_refused(NULL, -ELOOP, "vased.conf.d/20-link.conf", "it is a symlink");
    assert_int_equal(unlink(at("vased.conf.d/20-link.conf")), 0);

    /* A FIFO, as a drop-in or as the main file: refused at once, never waited on (an open
     * that blocks is ended by SIGALRM, which fails the test). */
    alarm(20);
    assert_int_equal(mkfifo(at("vased.conf.d/30-fifo.conf"), 0644), 0);
    expect_refused(NULL, -EPERM, "vased.conf.d/30-fifo.conf", "not a regular file but a FIFO");
    assert_int_equal(unlink(at("vased.conf.d/30-fifo.conf")), 0);
    assert_int_equal(unlink(at("vased.conf")), 0);
    assert_int_equal(mkfifo(at("vased.conf"), 0644), 0);
    expect_refused(NULL, -EPERM, "vased.conf (owner uid ",
                   "mode 0644): not a regular file but a FIFO");
    alarm(0);
    assert_int_equal(unlink(at("vased.conf")), 0);
    put("vased.conf", "[vased]\nmax_clients = 10\n");

    /* A directory named by config_dir is checked as the default one is. */
    make_dir("other.d");
    assert_int_equal(chmod(at("other.d"), 0757), 0);
    expect_refused((const char *const[]){"config_dir", at("other.d")}, -EPERM, "other.d",
                   "others than its owner can write it");
    assert_int_equal(load(&c, NULL), 0);
    vase_config_done(&c);
}

/* Files of another user than root and this process's own: root chowns them (tests run as
 * root). */
static void test_refused_owner(void **state) {
    (void)state;
    if (geteuid() != 0)
        skip();
    put("vased.conf", "[vased]\n");
    make_dir("vased.conf.d");
    put("vased.conf.d/10-a.conf", "[vased]\nmax_clients = 11\n");
    assert_int_equal(chown(at("vased.conf.d/10-a.conf"), 4242, 4242), 0);
    expect_refused(NULL, -EPERM, "vased.conf.d/10-a.conf (owner uid 4242, mode 0644)",
                   "it belongs to another user than root and vased's own");
    assert_int_equal(chown(at("vased.conf.d/10-a.conf"), 0, 0), 0);
    assert_int_equal(chown(at("vased.conf.d"), 4242, 0), 0);
    expect_refused(NULL, -EPERM, "vased.conf.d (owner uid 4242, mode 0755)",
                   "it belongs to another user");
    assert_int_equal(chown(at("vased.conf"), 4242, 0), 0);
    expect_refused(NULL, -EPERM, "vased.conf (owner uid 4242, mode 0644)",
                   "it belongs to another user");
}

/* As packaged: /etc/vase/vased.conf root's, vased.conf.d and 90-vasectl.conf the daemon's user's
 * (tmpfiles and --persist make them so): accepted, at load and by the writer, for vased running
 * as that user (a child that becomes uid 4242). */
static void test_daemon_user_files(void **state) {
    (void)state;
    if (geteuid() != 0)
        skip();
    assert_int_equal(chmod(tmp, 0755), 0); /* the child must reach its files */
    put("vased.conf", "[vased]\nmax_clients = 10\n");
    make_dir("vased.conf.d");
    put("vased.conf.d/10-a.conf", "[vased]\nmax_clients = 11\n");
    assert_int_equal(chown(at("vased.conf.d"), 4242, 4242), 0);
    assert_int_equal(chown(at("vased.conf.d/10-a.conf"), 4242, 4242), 0);

    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* No cmocka assertion here: a failure is the exit status. */
        const struct vase_setting *mc = vase_setting_find("max_clients");
        struct vase_config c;
        char *path = NULL, v[32] = "";
        if (setgid(4242) < 0 || setuid(4242) < 0)
            _exit(2);
        if (load(&c, NULL) != 0 || vase_config_format(&c, mc, v, sizeof(v)) < 0 ||
            strcmp(v, "11") != 0)
            _exit(3);
        if (vase_config_persist(c.dropin_dir, mc, "12", 4242, 0, &path) != 0)
            _exit(4);
        free(path);
        vase_config_done(&c);
        if (load(&c, NULL) != 0 || vase_config_format(&c, mc, v, sizeof(v)) < 0 ||
            strcmp(v, "12") != 0)
            _exit(5);
        vase_config_done(&c);
        _exit(0);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    struct stat st;
    assert_int_equal(lstat(at("vased.conf.d/90-vasectl.conf"), &st), 0);
    assert_int_equal(st.st_uid, 4242);
    assert_int_equal(st.st_mode & 07777, 0644);
}

/* The writer refuses what a load would: it never reads through a symlink (copying its target's
 * settings into a file everyone may read), never waits on a FIFO, never writes into a directory
 * others can write; and the file stays as it was. */
static void test_persist_refused(void **state) {
    (void)state;
    const struct vase_setting *mc = vase_setting_find("max_clients");
    char *path = NULL, *log;
    int r;
    const char *dir = at("conf.d");
    char d[PATH_MAX];
    snprintf(d, sizeof(d), "%s", dir);

    make_dir("conf.d");
    put("secret.conf", "[vased]\nallow_users = mallory\n");
    assert_int_equal(chmod(at("secret.conf"), 0600), 0);
    assert_int_equal(symlink(at("secret.conf"), at("conf.d/90-vasectl.conf")), 0);
    log_capture_begin();
    r = vase_config_persist(d, mc, "12", 0, 0, &path);
    log = (char *)log_capture_end();
    assert_int_equal(r, -ELOOP);
    assert_non_null(strstr(log, at("conf.d/90-vasectl.conf")));
    assert_non_null(strstr(log, "it is a symlink"));
    assert_null(path);
    assert_string_equal(listing("conf.d"), "90-vasectl.conf ");
    assert_string_equal(get_text("secret.conf"), "[vased]\nallow_users = mallory\n");
    struct stat st;
    assert_int_equal(lstat(at("conf.d/90-vasectl.conf"), &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    assert_int_equal(unlink(at("conf.d/90-vasectl.conf")), 0);

    alarm(20); /* a blocked open would end the test here */
    assert_int_equal(mkfifo(at("conf.d/90-vasectl.conf"), 0644), 0);
    log_capture_begin();
    r = vase_config_persist(d, mc, "12", 0, 0, &path);
    log = (char *)log_capture_end();
    assert_int_equal(r, -EPERM);
    assert_non_null(strstr(log, "not a regular file but a FIFO"));
    alarm(0);
    assert_int_equal(unlink(at("conf.d/90-vasectl.conf")), 0);

    put("conf.d/90-vasectl.conf", "[vased]\nmax_clients = 3\n");
    assert_int_equal(chmod(at("conf.d/90-vasectl.conf"), 0666), 0);
    log_capture_begin();
    r = vase_config_persist(d, mc, "12", 0, 0, &path);
    log = (char *)log_capture_end();
    assert_int_equal(r, -EPERM);
    assert_non_null(strstr(log, "others than its owner can write it"));
    assert_int_equal(chmod(at("conf.d/90-vasectl.conf"), 0644), 0);

    assert_int_equal(chmod(d, 0777), 0);
    log_capture_begin();
    r = vase_config_persist(d, mc, "12", 0, 0, &path);
    log = (char *)log_capture_end();
    assert_int_equal(r, -EPERM);
    assert_non_null(strstr(log, "Refusing the drop-in directory"));
    assert_non_null(strstr(log, "mode 0777"));
    assert_string_equal(get_text("conf.d/90-vasectl.conf"), "[vased]\nmax_clients = 3\n");
    assert_string_equal(listing("conf.d"), "90-vasectl.conf ");
    assert_int_equal(chmod(d, 0755), 0);
    assert_int_equal(vase_config_persist(d, mc, "12", 0, 0, &path), 0);
    free(path);
}

/* /dev/null is an empty configuration and no file: nothing beside it is a drop-in directory,
 * unless config_dir names one. */
static void test_dev_null(void **state) {
    (void)state;
    struct vase_config c;
    struct vase_cmdline cmd = {.config_path = "/dev/null"};
    assert_int_equal(vase_config_load(&c, &cmd), 0);
    assert_null(c.dropin_dir);
    expect(&c, "max_clients", "64", "default");
    vase_config_done(&c);

    make_dir("d");
    put("d/1.conf", "[vased]\nmax_clients = 5\n");
    char *keys[] = {"config-dir"}, *values[] = {(char *)at("d")};
    cmd = (struct vase_cmdline){
        .config_path = "/dev/null", .n_overrides = 1, .keys = keys, .values = values};
    assert_int_equal(vase_config_load(&c, &cmd), 0);
    assert_string_equal(c.dropin_dir, at("d"));
    expect(&c, "max_clients", "5", "file d/1.conf");
    vase_config_done(&c);

    /* Another character device is no configuration. */
    cmd = (struct vase_cmdline){.config_path = "/dev/zero"};
    log_capture_begin();
    int r = vase_config_load(&c, &cmd);
    const char *log = log_capture_end();
    assert_int_equal(r, -EPERM);
    assert_non_null(strstr(log, "Refusing the configuration file /dev/zero (owner uid "));
    assert_non_null(strstr(log, "): not a regular file but a device"));
    vase_config_done(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_dropins_listed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_origins, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reload_setting, setup, teardown),
        cmocka_unit_test_setup_teardown(test_persist_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_persist_failures, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refused_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refused_owner, setup, teardown),
        cmocka_unit_test_setup_teardown(test_daemon_user_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_persist_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dev_null, setup, teardown),
    };
    /* Every message is logged inside a capture. */
    vase_log_set_max_level(LOG_INFO);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
