/* SPDX-License-Identifier: MIT */

/*
 * Configuration that lasts, against a real vased: a value set at run time survives a reload
 * (SIGHUP) unless the files change that key; flags win over files; drop-ins in
 * vased.conf.d (or --config-dir) are read in order at start and at every reload, and a broken
 * one is fatal at start and refused whole at a reload; `config set --persist` writes
 * vased.conf.d/90-vasectl.conf, which lasts across reloads and restarts, and is refused, changing
 * nothing, where the directory cannot be written; ConfigEntry.source says where each value comes
 * from. After a SIGHUP the tests wait for the daemon's log line that ends the reload, never for
 * time to pass.
 */

#include <errno.h>
#include <limits.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "integration/harness.h"
#include "vase_admin.h"

struct fixture {
    struct harness_fixture h;
    struct vase_admin *a;
    char conf[128];    /* the main file */
    char dropins[128]; /* its drop-in directory */
    struct harness_proc p;
};

static int connect_admin(struct fixture *f) {
    f->a = vase_admin_free(f->a);
    int r = vase_admin_new(&(struct vase_admin_options){.runtime_dir = f->h.d.dir}, &f->a);
    if (r == 0)
        r = vase_admin_connect(f->a);
    return r;
}

static int setup(void **state) {
    static const char *const args[] = {"--stats-interval=0", "--default-slack=5", NULL};
    int r = harness_fixture_setup(state, sizeof(struct fixture), args);
    if (r < 0)
        return r;
    struct fixture *f = *state;
    f->p.out_fd = -1; /* nothing to close until a program ran */
    harness_daemon_path(&f->h.d, "vased.conf", f->conf, sizeof(f->conf));
    harness_daemon_path(&f->h.d, "vased.conf.d", f->dropins, sizeof(f->dropins));
    if (mkdir(f->dropins, 0755) < 0)
        return -1;
    return connect_admin(f) < 0 ? -1 : 0;
}

static int teardown(void **state) {
    struct fixture *f = *state;
    if (f) {
        f->a = vase_admin_free(f->a);
        harness_proc_free(&f->p);
        /* The harness removes the runtime directory; make it removable. */
        chmod(f->dropins, 0755);
    }
    return harness_fixture_teardown(state);
}

/* Restarts the daemon on the same directory with args after the fixture's. */
static int restart(struct fixture *f, const char *const *args) {
    f->a = vase_admin_free(f->a);
    if (f->h.d.pid)
        assert_int_equal(harness_daemon_stop(&f->h.d, SIGTERM, NULL), 0);
    const char *argv[8] = {"--stats-interval=0", "--default-slack=5"};
    size_t n = 2;
    for (size_t i = 0; args && args[i]; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    int r = harness_daemon_start(&f->h.d, argv);
    if (r == 0)
        assert_int_equal(connect_admin(f), 0);
    return r;
}

static void write_text(const char *dir, const char *name, const char *text) {
    char path[256];
    snprintf(path, sizeof(path), "%s%s%s", dir, name ? "/" : "", name ? name : "");
    FILE *out = fopen(path, "w");
    assert_non_null(out);
    assert_int_equal(fputs(text, out) >= 0, 1);
    assert_int_equal(fclose(out), 0);
    /* vased refuses a file others can write, whatever this process's umask. */
    assert_int_equal(chmod(path, 0644), 0);
}

/* The whole of a small file, into buf; "" when it does not exist. */
static const char *read_text(const char *path, char *buf, size_t size) {
    FILE *in = fopen(path, "r");
    buf[0] = '\0';
    if (in) {
        size_t n = fread(buf, 1, size - 1, in);
        buf[n] = '\0';
        fclose(in);
    }
    return buf;
}

/* How many times needle occurs in the daemon's log. */
static size_t log_hits(const struct fixture *f, const char *needle) {
    static char text[1 << 20];
    size_t n = 0;
    read_text(f->h.d.log, text, sizeof(text));
    for (const char *p = text; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* Sends SIGHUP and waits until the daemon logged the end of that reload: done (0) or refused
 * (-EINVAL). */
static int reload(struct fixture *f) {
    size_t done = log_hits(f, "Configuration reloaded."),
           failed = log_hits(f, "Reload failed; keeping the running configuration.");
    assert_int_equal(kill(f->h.d.pid, SIGHUP), 0);
    double end = harness_now() + HARNESS_WAIT_MS / 1000.0;
    for (;;) {
        if (log_hits(f, "Configuration reloaded.") > done)
            return 0;
        if (log_hits(f, "Reload failed; keeping the running configuration.") > failed)
            return -EINVAL;
        if (harness_now() > end) {
            harness_daemon_dump_log(&f->h.d);
            fail_msg("no end of the reload in the log within %d ms", HARNESS_WAIT_MS);
        }
        harness_sleep_ms(10);
    }
}

/* Fails unless key's value and source are as expected (source "file NAME" for a file of the
 * test's runtime directory is given as NAME relative to it, after "file "; "runtime" stands for
 * "runtime (uid N)" with this process's uid). */
static void expect(struct fixture *f, const char *key, const char *value, const char *source) {
    Vase__ConfigReply *cr = NULL;
    char want[256];
    assert_int_equal(vase_admin_config_get(f->a, key, &cr), 0);
    assert_int_equal(cr->n_entries, 1);
    if (strncmp(source, "file ", 5) == 0)
        snprintf(want, sizeof(want), "file %s/%s", f->h.d.dir, source + 5);
    else if (strcmp(source, "runtime") == 0)
        snprintf(want, sizeof(want), "runtime (uid %u)", (unsigned)geteuid());
    else
        snprintf(want, sizeof(want), "%s", source);
    if (strcmp(cr->entries[0]->value, value) != 0 || strcmp(cr->entries[0]->source, want) != 0) {
        harness_daemon_dump_log(&f->h.d);
        fail_msg("%s = %s from \"%s\"; expected %s from \"%s\"", key, cr->entries[0]->value,
                 cr->entries[0]->source, value, want);
    }
    protobuf_c_message_free_unpacked(&cr->base, NULL);
}

static void expect_log(struct fixture *f, const char *needle, size_t times) {
    size_t n = log_hits(f, needle);
    if (n != times) {
        harness_daemon_dump_log(&f->h.d);
        fail_msg("\"%s\" %zu times in the log, expected %zu", needle, n, times);
    }
}

static int set(struct fixture *f, const char *key, const char *value, bool persist) {
    Vase__ConfigReply *cr = NULL;
    int r = persist ? vase_admin_config_persist(f->a, key, value, &cr)
                    : vase_admin_config_set(f->a, key, value, &cr);
    if (cr)
        protobuf_c_message_free_unpacked(&cr->base, NULL);
    return r;
}

/* ---- a value set at run time and the files ---- */

static void test_set_survives_reload(void **state) {
    struct fixture *f = *state;
    char line[256];

    expect(f, "max_clients", "64", "default");
    expect(f, "default_slack", "5", "command line");
    assert_int_equal(set(f, "max_clients", "12", false), 0);
    expect(f, "max_clients", "12", "runtime");

    /* The files say nothing new: the value set at run time stays, and the log says so. */
    assert_int_equal(reload(f), 0);
    expect(f, "max_clients", "12", "runtime");
    snprintf(line, sizeof(line), "Reload: max_clients keeps 12, set at run time by uid %u",
             (unsigned)geteuid());
    expect_log(f, line, 1);

    /* An edit of another key applies and leaves this one. */
    write_text(f->conf, NULL, "[vased]\nmax_seqs_per_client = 300\ndefault_slack = 9\n");
    assert_int_equal(reload(f), 0);
    expect(f, "max_clients", "12", "runtime");
    expect(f, "max_seqs_per_client", "300", "file vased.conf");
    snprintf(line, sizeof(line), "Reload: max_seqs_per_client = 300 (was 1024) from %s.", f->conf);
    expect_log(f, line, 1);
    /* A flag wins over the files, at a reload as at start. */
    expect(f, "default_slack", "5", "command line");

    /* An edit of this key wins over the value set at run time. */
    write_text(f->conf, NULL, "[vased]\nmax_seqs_per_client = 300\nmax_clients = 20\n");
    assert_int_equal(reload(f), 0);
    expect(f, "max_clients", "20", "file vased.conf");
    snprintf(line, sizeof(line), "Reload: max_clients = 20 (was 12) from %s.", f->conf);
    expect_log(f, line, 1);

    /* Set again, then the key removed from the file: back to the default. */
    assert_int_equal(set(f, "max_clients", "30", false), 0);
    write_text(f->conf, NULL, "[vased]\nmax_seqs_per_client = 300\n");
    assert_int_equal(reload(f), 0);
    expect(f, "max_clients", "64", "default");
    expect(f, "max_seqs_per_client", "300", "file vased.conf");
    expect_log(f, "Reload: max_clients = 64 (was 30), the default", 1);
}

/* ---- drop-ins ---- */

static void test_dropins(void **state) {
    struct fixture *f = *state;

    write_text(f->conf, NULL, "[vased]\nmax_clients = 40\nmax_seqs_per_client = 41\n");
    write_text(f->dropins, "20-b.conf", "[vased]\nmax_clients = 22\n");
    write_text(f->dropins, "10-a.conf", "[vased]\nmax_clients = 11\nadmission_wait_ms = 7\n");
    /* Not drop-ins: a dotfile, other suffixes; each would break the parse if read. */
    write_text(f->dropins, ".30-hidden.conf", "[vased]\nmax_clients = many\n");
    write_text(f->dropins, "40-notes.txt", "not a configuration file\n");
    write_text(f->dropins, "50-old.conf.bak", "not a configuration file\n");

    /* Read at a reload: in lexical order, later ones overriding earlier ones and the main
     * file. */
    assert_int_equal(reload(f), 0);
    expect(f, "max_clients", "22", "file vased.conf.d/20-b.conf");
    expect(f, "admission_wait_ms", "7", "file vased.conf.d/10-a.conf");
    expect(f, "max_seqs_per_client", "41", "file vased.conf");

    /* And at start. */
    assert_int_equal(restart(f, NULL), 0);
    expect(f, "max_clients", "22", "file vased.conf.d/20-b.conf");
    expect(f, "admission_wait_ms", "7", "file vased.conf.d/10-a.conf");

    /* A broken drop-in at a reload: refused whole, naming file and line; nothing changes, not
     * even what the other files changed. */
    write_text(f->dropins, "10-a.conf", "[vased]\nmax_clients = 11\nadmission_wait_ms = 8\n");
    write_text(f->dropins, "15-bad.conf", "[vased]\n\nmax_clients = lots\n");
    assert_int_equal(reload(f), -EINVAL);
    char line[256];
    snprintf(line, sizeof(line), "%s/15-bad.conf:3: bad value \"lots\" for max_clients",
             f->dropins);
    expect_log(f, line, 1);
    expect(f, "admission_wait_ms", "7", "file vased.conf.d/10-a.conf");
    expect(f, "max_clients", "22", "file vased.conf.d/20-b.conf");

    /* At start it is fatal, as a broken main file is. */
    assert_int_equal(restart(f, NULL), -ECHILD);
    expect_log(f, line, 2);

    /* --config-dir reads another directory instead. */
    char other[160], arg[200];
    harness_daemon_path(&f->h.d, "other.d", other, sizeof(other));
    assert_int_equal(mkdir(other, 0755), 0);
    write_text(other, "1.conf", "[vased]\nmax_clients = 33\n");
    snprintf(arg, sizeof(arg), "--config-dir=%s", other);
    assert_int_equal(restart(f, (const char *const[]){arg, NULL}), 0);
    expect(f, "max_clients", "33", "file other.d/1.conf");
    expect(f, "admission_wait_ms", "0", "default");
    expect(f, "config_dir", other, "command line");
}

/* ---- config set --persist ---- */

static void test_persist(void **state) {
    struct fixture *f = *state;
    char path[192], text[8192];
    snprintf(path, sizeof(path), "%s/90-vasectl.conf", f->dropins);

    write_text(f->conf, NULL, "[vased]\nmax_clients = 40\n");
    assert_int_equal(reload(f), 0);
    assert_int_equal(set(f, "max_clients", "13", true), 0);
    expect(f, "max_clients", "13", "file vased.conf.d/90-vasectl.conf");
    assert_int_equal(set(f, "admission_wait_ms", "250", true), 0);
    assert_int_equal(set(f, "max_clients", "14", true), 0);
    expect_log(f, "Setting max_clients changed from \"13\" to \"14\" and persisted in", 1);

    /* One line per key, the last value, the other keys kept, each with who and when. */
    read_text(path, text, sizeof(text));
    assert_non_null(strstr(text, "# Written by `vasectl config set --persist`"));
    assert_non_null(strstr(text, "\n[vased]\n"));
    assert_non_null(strstr(text, "\nadmission_wait_ms = 250\n"));
    assert_non_null(strstr(text, "\nmax_clients = 14\n"));
    assert_null(strstr(text, "max_clients = 13"));
    char who[64];
    snprintf(who, sizeof(who), "# max_clients: set by uid %u at ", (unsigned)geteuid());
    assert_non_null(strstr(text, who));
    snprintf(who, sizeof(who), "# admission_wait_ms: set by uid %u at ", (unsigned)geteuid());
    assert_non_null(strstr(text, who));

    /* A setting that cannot change at run time cannot be persisted either; nor one a flag gives
     * (the flag would win at the next start). */
    assert_int_equal(set(f, "granule_bytes", "128K", true), -EPERM);
    assert_int_equal(set(f, "default_slack", "7", true), -EBUSY);
    assert_non_null(strstr(vase_admin_last_error(f->a), "default_slack not changed: vased's "
                                                        "command line gives it (--default_slack)"));
    expect(f, "default_slack", "5", "command line");
    assert_null(strstr(read_text(path, text, sizeof(text)), "default_slack"));
    assert_null(strstr(read_text(path, text, sizeof(text)), "granule_bytes"));

    /* A drop-in read after 90-vasectl.conf that gives the key would win at the next reload:
     * refused, nothing changed. */
    write_text(f->dropins, "95-local.conf", "[vased]\nmax_models_per_client = 9\n");
    assert_int_equal(reload(f), 0);
    assert_int_equal(set(f, "max_models_per_client", "3", true), -EBUSY);
    assert_non_null(strstr(vase_admin_last_error(f->a), "95-local.conf gives it and is read after "
                                                        "90-vasectl.conf"));
    expect(f, "max_models_per_client", "9", "file vased.conf.d/95-local.conf");
    assert_null(strstr(read_text(path, text, sizeof(text)), "max_models_per_client"));
    assert_int_equal(set(f, "max_models_per_client", "3", false), 0);

    /* The drop-in is now the files' value: a reload keeps it; so does a restart. */
    assert_int_equal(reload(f), 0);
    expect(f, "max_clients", "14", "file vased.conf.d/90-vasectl.conf");
    assert_int_equal(restart(f, NULL), 0);
    expect(f, "max_clients", "14", "file vased.conf.d/90-vasectl.conf");
    expect(f, "admission_wait_ms", "250", "file vased.conf.d/90-vasectl.conf");

    /* vasectl: --persist, and the source in its output. */
    char prog[PATH_MAX];
    assert_int_equal(harness_program("vasectl", prog, sizeof(prog)), 0);
    const char *set_argv[] = {prog, "config", "set", "--persist", "max_seqs_per_client", "6", NULL};
    assert_int_equal(harness_run(&f->p, set_argv, &f->h.d, HARNESS_RUN_MS), 0);
    snprintf(text, sizeof(text), "max_seqs_per_client = 6 (file %s)", path);
    assert_non_null(strstr(f->p.out, text));
    harness_proc_free(&f->p);
    const char *json_argv[] = {prog, "--json", "config", "get", "max_seqs_per_client", NULL};
    assert_int_equal(harness_run(&f->p, json_argv, &f->h.d, HARNESS_RUN_MS), 0);
    snprintf(text, sizeof(text), "\"source\":\"file %s\"", path);
    assert_non_null(strstr(f->p.out, text));
    harness_proc_free(&f->p);
    const char *get_argv[] = {prog, "config", "get", NULL};
    assert_int_equal(harness_run(&f->p, get_argv, &f->h.d, HARNESS_RUN_MS), 0);
    assert_non_null(strstr(f->p.out, "SOURCE"));
    assert_non_null(strstr(f->p.out, "command line"));
    harness_proc_free(&f->p);
    const char *bad_argv[] = {prog, "--persist", "status", NULL};
    assert_int_equal(harness_run(&f->p, bad_argv, &f->h.d, HARNESS_RUN_MS), 2);
    assert_non_null(strstr(f->p.out, "--persist applies to 'config set' only"));
}

/* ---- files vased does not trust ---- */

/* A reload refuses, whole, a drop-in others can write, a symlinked drop-in and a FIFO (without
 * waiting on it), saying which file and why; the running configuration stays, and the daemon
 * still answers. */
static void test_reload_refuses_untrusted(void **state) {
    struct fixture *f = *state;
    char path[192], line[320];

    write_text(f->dropins, "10-a.conf", "[vased]\nmax_clients = 11\nallow_users = 4242\n");
    snprintf(path, sizeof(path), "%s/10-a.conf", f->dropins);
    assert_int_equal(chmod(path, 0666), 0);
    assert_int_equal(reload(f), -EINVAL);
    snprintf(line, sizeof(line),
             "Refusing the drop-in %s (owner uid %u, mode 0666): others than its owner can "
             "write it",
             path, (unsigned)geteuid());
    expect_log(f, line, 1);
    expect(f, "max_clients", "64", "default");
    expect(f, "allow_users", "", "default");

    /* Made safe, it applies. */
    assert_int_equal(chmod(path, 0644), 0);
    assert_int_equal(reload(f), 0);
    expect(f, "max_clients", "11", "file vased.conf.d/10-a.conf");

    /* A symlink to a file outside the directory. */
    char outside[192], link[192];
    harness_daemon_path(&f->h.d, "outside.conf", outside, sizeof(outside));
    write_text(outside, NULL, "[vased]\nmax_clients = 12\n");
    snprintf(link, sizeof(link), "%s/20-link.conf", f->dropins);
    assert_int_equal(symlink(outside, link), 0);
    assert_int_equal(reload(f), -EINVAL);
    snprintf(line, sizeof(line), "Refusing the drop-in %s: it is a symlink", link);
    expect_log(f, line, 1);
    expect(f, "max_clients", "11", "file vased.conf.d/10-a.conf");
    assert_int_equal(unlink(link), 0);

    /* A FIFO: refused at once; a reload that waited on it would never end. */
    snprintf(path, sizeof(path), "%s/30-fifo.conf", f->dropins);
    assert_int_equal(mkfifo(path, 0644), 0);
    assert_int_equal(reload(f), -EINVAL);
    snprintf(line, sizeof(line),
             "Refusing the drop-in %s (owner uid %u, mode 0644): not a regular "
             "file but a FIFO",
             path, (unsigned)geteuid());
    expect_log(f, line, 1);
    expect(f, "max_clients", "11", "file vased.conf.d/10-a.conf");
    assert_int_equal(unlink(path), 0);

    /* At start, the same refusals are fatal. */
    assert_int_equal(chmod(f->dropins, 0777), 0);
    assert_int_equal(restart(f, NULL), -ECHILD);
    snprintf(line, sizeof(line), "Refusing the drop-in directory %s (owner uid %u, mode 0777)",
             f->dropins, (unsigned)geteuid());
    expect_log(f, line, 1);
}

/* --config=/dev/null is no file: no drop-in directory beside it (/dev/vased.conf.d), so
 * --persist is refused with ENOTSUP and nothing is written; --config-dir gives one. */
static void test_persist_without_dropin_dir(void **state) {
    struct fixture *f = *state;
    struct stat st;
    bool had_dev_dir = stat("/dev/vased.conf.d", &st) == 0;

    assert_int_equal(restart(f, (const char *const[]){"--config=/dev/null", NULL}), 0);
    assert_int_equal(set(f, "max_clients", "15", true), -ENOTSUP);
    const char *why = vase_admin_last_error(f->a);
    if (!strstr(why, "max_clients not changed: vased has no drop-in directory to persist it in "
                     "(its configuration, /dev/null, is not a file"))
        fail_msg("error \"%s\"", why);
    expect(f, "max_clients", "64", "default");
    if (!had_dev_dir)
        assert_int_equal(stat("/dev/vased.conf.d", &st), -1);
    /* Without --persist the change is made. */
    assert_int_equal(set(f, "max_clients", "15", false), 0);
    expect(f, "max_clients", "15", "runtime");

    char arg[200], path[200];
    snprintf(arg, sizeof(arg), "--config-dir=%s", f->dropins);
    assert_int_equal(restart(f, (const char *const[]){"--config=/dev/null", arg, NULL}), 0);
    assert_int_equal(set(f, "max_clients", "16", true), 0);
    expect(f, "max_clients", "16", "file vased.conf.d/90-vasectl.conf");
    snprintf(path, sizeof(path), "%s/90-vasectl.conf", f->dropins);
    assert_int_equal(access(path, F_OK), 0);
}

/* The drop-in directory cannot be written: the value is not changed, and the error says why
 * and where. Root writes anywhere, so the daemon is restarted without CAP_DAC_OVERRIDE (dropped
 * from this process's bounding set, which vased inherits); this is the last test of the file. */
static void test_persist_unwritable(void **state) {
    struct fixture *f = *state;
    char path[192], text[512];
    snprintf(path, sizeof(path), "%s/90-vasectl.conf", f->dropins);

    if (geteuid() == 0) {
        if (prctl(PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, 0, 0, 0) < 0)
            fail_msg("cannot drop CAP_DAC_OVERRIDE to test an unwritable directory as root: %s",
                     strerror(errno));
    }
    assert_int_equal(chmod(f->dropins, 0555), 0);
    assert_int_equal(restart(f, NULL), 0);

    assert_int_equal(set(f, "max_clients", "15", true), -EACCES);
    snprintf(text, sizeof(text), "max_clients not changed: cannot persist it in %s: ", path);
    const char *why = vase_admin_last_error(f->a);
    if (!strstr(why, text))
        fail_msg("error \"%s\" lacks \"%s\"", why, text);
    expect(f, "max_clients", "64", "default");
    assert_int_equal(access(path, F_OK), -1);
    snprintf(text, sizeof(text), "Setting max_clients to \"15\" for uid %u not persisted in %s",
             (unsigned)geteuid(), path);
    expect_log(f, text, 1);
    /* Without --persist the same change is made. */
    assert_int_equal(set(f, "max_clients", "15", false), 0);
    expect(f, "max_clients", "15", "runtime");
}

/* The shipped vased.conf sets nothing: every key is written commented out with its default, so
 * that a daemon started with it says "default" for each, and an operator's own edit stands out
 * as "file". */
static void test_shipped_conf_sets_nothing(void **state) {
    struct fixture *f = *state;
    char src[4096], text[1 << 16], arg[300];
    const char *build = getenv("VASE_BUILD_DIR");
    assert_non_null(build);
    snprintf(src, sizeof(src), "%s/../systemd/vased.conf", build);
    read_text(src, text, sizeof(text));
    assert_non_null(strstr(text, "#max_clients = 64"));
    write_text(f->conf, NULL, text);
    snprintf(arg, sizeof(arg), "--config=%s", f->conf);
    assert_int_equal(restart(f, (const char *[]){arg, NULL}), 0);
    expect(f, "max_clients", "64", "default");
    expect(f, "log_level", "info", "default");
    expect(f, "max_seqs_per_uid", "4096", "default");
    /* Uncommented, a key is the file's. */
    char *at = strstr(text, "#max_clients = 64");
    memmove(at, at + 1, strlen(at + 1) + 1);
    write_text(f->conf, NULL, text);
    assert_int_equal(reload(f), 0);
    expect(f, "max_clients", "64", "file vased.conf");
}

/* A restart-only key the files change is not applied at a reload: the running value stays, the
 * log says so, and config get shows the file's value as pending until the files agree with the
 * running value again or vased restarts with it. */
static void test_restart_pending(void **state) {
    struct fixture *f = *state;
    Vase__ConfigReply *cr = NULL;

    assert_int_equal(vase_admin_config_get(f->a, "cuda_share", &cr), 0);
    assert_string_equal(cr->entries[0]->pending, "");
    char running[64];
    snprintf(running, sizeof(running), "%s", cr->entries[0]->value);
    protobuf_c_message_free_unpacked(&cr->base, NULL);
    const char *other = strcmp(running, "vmm") == 0 ? "ipc" : "vmm";
    char text[128];
    snprintf(text, sizeof(text), "[vased]\ncuda_share = %s\n", other);
    write_text(f->conf, NULL, text);
    assert_int_equal(reload(f), 0);
    expect_log(f, "cuda_share changed to", 1);
    assert_int_equal(vase_admin_config_get(f->a, "cuda_share", &cr), 0);
    assert_string_equal(cr->entries[0]->value, running);
    assert_string_equal(cr->entries[0]->pending, other);
    protobuf_c_message_free_unpacked(&cr->base, NULL);
    /* The whole table shows it too. */
    assert_int_equal(vase_admin_config_get(f->a, NULL, &cr), 0);
    size_t pending = 0;
    for (size_t i = 0; i < cr->n_entries; i++)
        pending += cr->entries[i]->pending[0] != '\0';
    assert_int_equal(pending, 1);
    protobuf_c_message_free_unpacked(&cr->base, NULL);

    /* The files back at the running value: nothing pending. */
    write_text(f->conf, NULL, "[vased]\n");
    assert_int_equal(reload(f), 0);
    assert_int_equal(vase_admin_config_get(f->a, "cuda_share", &cr), 0);
    assert_string_equal(cr->entries[0]->pending, "");
    protobuf_c_message_free_unpacked(&cr->base, NULL);

    /* Changed again, then a restart applies it and clears the mark. */
    write_text(f->conf, NULL, text);
    assert_int_equal(reload(f), 0);
    assert_int_equal(restart(f, NULL), 0);
    assert_int_equal(vase_admin_config_get(f->a, "cuda_share", &cr), 0);
    assert_string_equal(cr->entries[0]->value, other);
    assert_string_equal(cr->entries[0]->pending, "");
    protobuf_c_message_free_unpacked(&cr->base, NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_shipped_conf_sets_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_set_survives_reload, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restart_pending, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dropins, setup, teardown),
        cmocka_unit_test_setup_teardown(test_persist, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reload_refuses_untrusted, setup, teardown),
        cmocka_unit_test_setup_teardown(test_persist_without_dropin_dir, setup, teardown),
        /* Last: it drops a capability of this process for good. */
        cmocka_unit_test_setup_teardown(test_persist_unwritable, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
