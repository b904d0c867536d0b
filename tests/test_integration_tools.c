/* SPDX-License-Identifier: MIT */

/*
 * Integration tests of the programs around vased, run as the user would run them against a
 * real daemon: vasectl (status, clients, seqs, config get/set, a setting that cannot change
 * while running, events while something happens, usage errors) and tests/replay_engine on
 * every trace_* case of the vectors make check runs ($VASE_VECTORS, which the Makefile sets, else
 * tests/vectors/reference, relative to the repository root where make check runs).
 */

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "integration/harness.h"

struct fixture {
    struct harness_fixture h; /* client 0: the engine of the tests that need one */
    struct vase_model *m;
    struct harness_proc p;
};

static int setup_with(void **state, const char *const *args) {
    int r = harness_fixture_setup(state, sizeof(struct fixture), args);
    struct fixture *f = *state;
    if (f)
        f->p.out_fd = -1;
    return r;
}

static int setup(void **state) {
    return setup_with(state, NULL);
}

/* A daemon that publishes events only when something happens (no periodic pressure events), so
 * that the first event a subscriber sees is one the test made. */
static int setup_quiet(void **state) {
    static const char *const args[] = {"--stats-interval=0", NULL};
    return setup_with(state, args);
}

/* The harness arena in granules of 1 MiB: pages of several sizes, each in granules of its own,
 * leave room unused where a division would count it. */
static int setup_size(void **state) {
    static const char *const args[] = {"--granule-bytes=1M", NULL};
    return setup_with(state, args);
}

static int teardown(void **state) {
    struct fixture *f = *state;
    if (f)
        harness_proc_free(&f->p);
    return harness_fixture_teardown(state);
}

/* ---- vasectl ---- */

/* Runs vasectl with args (NULL-terminated) and VASE_RUNTIME_DIR; returns its exit code, the
 * output in f->p.out (freed by the next call or the teardown). */
static int vasectl(struct fixture *f, const char *const *args) {
    char path[PATH_MAX];
    assert_int_equal(harness_program("vasectl", path, sizeof(path)), 0);
    const char *argv[16] = {path};
    size_t n = 1;
    for (; args[n - 1]; n++) {
        assert_true(n < 15);
        argv[n] = args[n - 1];
    }
    argv[n] = NULL;
    harness_proc_free(&f->p);
    int r = harness_run(&f->p, argv, &f->h.d, HARNESS_RUN_MS);
    if (r < 0)
        fail_msg("vasectl %s: %s\n%s", args[0], vase_strerror(r), f->p.out ? f->p.out : "");
    return r;
}

/* Runs vasectl and fails unless it exits 0. */
static const char *vasectl_ok(struct fixture *f, const char *const *args) {
    int r = vasectl(f, args);
    if (r != 0)
        fail_msg("vasectl %s %s exited %d:\n%s", args[0], args[1] ? args[1] : "", r, f->p.out);
    return f->p.out;
}

/* The unsigned number after "key": in JSON text; fails if the key is missing. */
static uint64_t json_number(const char *json, const char *key) {
    char quoted[64];
    snprintf(quoted, sizeof(quoted), "\"%s\"", key);
    const char *p = strstr(json, quoted);
    if (!p)
        fail_msg("no \"%s\" in %s", key, json);
    p += strlen(quoted);
    while (*p == ' ' || *p == ':')
        p++;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(p, &end, 10);
    if (end == p || errno)
        fail_msg("\"%s\" is not a number in %s", key, json);
    return v;
}

/* One JSON object on one line. */
static void assert_json_line(const char *out) {
    size_t n = strlen(out);
    if (n < 3 || out[0] != '{' || out[n - 1] != '\n' || out[n - 2] != '}' ||
        strchr(out, '\n') != out + n - 1)
        fail_msg("not one JSON object on one line:\n%s", out);
}

static void open_engine(struct fixture *f) {
    struct vase_geometry g = harness_geometry();
    assert_int_equal(harness_engine_open(&f->h.d, "tools-engine", &g, &f->h.c[0], &f->m), 0);
}

static void test_vasectl_status(void **state) {
    struct fixture *f = *state;
    open_engine(f);
    struct vase_seq_config cfg = harness_seq_config(VASE_POLICY_SNAPKV, 128, 32, 0, 0);
    cfg.label = "cmpl-tools-0123456789abcdef-7";
    struct vase_seq *s;
    assert_int_equal(vase_seq_open(f->h.c[0], f->m, &cfg, &s), 0);

    const char *out = vasectl_ok(f, (const char *const[]){"--json", "status", NULL});
    assert_json_line(out);
    /* 3 KV pages and a ring page of one granule each, and a plan page in a fifth. */
    assert_int_equal(json_number(out, "bytes_total"), HARNESS_ARENA_BYTES);
    assert_int_equal(json_number(out, "bytes_free"), HARNESS_ARENA_BYTES - 5 * HARNESS_PAGE_BYTES);
    assert_int_equal(json_number(out, "bytes_pages"), harness_seq_bytes(3, 1, 96));
    assert_int_equal(json_number(out, "granule_bytes"), HARNESS_PAGE_BYTES);
    assert_int_equal(json_number(out, "clients"), 1);
    assert_int_equal(json_number(out, "seqs"), 1);
    /* The planning queue, idle: no plan asked for. */
    assert_int_equal(json_number(out, "plans_queued"), 0);
    assert_int_equal(json_number(out, "plans_running"), 0);
    assert_int_equal(json_number(out, "clients_waiting"), 0);
    char inc[32];
    snprintf(inc, sizeof(inc), "\"0x%016llx\"", (unsigned long long)f->h.d.incarnation);
    if (!strstr(out, inc))
        fail_msg("no incarnation %s in %s", inc, out);

    out = vasectl_ok(f, (const char *const[]){"--json", "clients", NULL});
    assert_json_line(out);
    assert_non_null(strstr(out, "\"tools-engine\""));
    assert_int_equal(json_number(out, "client_id"), vase_client_id(f->h.c[0]));
    assert_int_equal(json_number(out, "bytes"), harness_seq_bytes(3, 1, 96));
    assert_int_equal(json_number(out, "plans_queued"), 0);

    out = vasectl_ok(f, (const char *const[]){"--json", "seqs", NULL});
    assert_json_line(out);
    assert_int_equal(json_number(out, "seq_id"), vase_seq_id(s));
    assert_non_null(strstr(out, "\"snapkv\""));
    assert_non_null(strstr(out, "\"model_name\":\"harness-small\""));
    assert_non_null(strstr(out, "\"label\":\"cmpl-tools-0123456789abcdef-7\""));
    assert_int_equal(json_number(out, "budget"), 128);
    assert_int_equal(json_number(out, "capacity"), 192);
    assert_int_equal(json_number(out, "pages"), 3);
    assert_int_equal(json_number(out, "block_tokens"), 64);

    /* The tables, for people: one line per sequence under a header. */
    out = vasectl_ok(f, (const char *const[]){"status", NULL});
    assert_non_null(strstr(out, "plans queued 0 (0 clients waiting, served in turn), running 0"));
    out = vasectl_ok(f, (const char *const[]){"seqs", NULL});
    assert_non_null(strstr(out, "snapkv"));
    /* The model by name, with its id; the label, its middle cut to fit the column. */
    if (!strstr(out, "  harness-small (1)  "))
        fail_msg("no model name in\n%s", out);
    if (!strstr(out, "ID  LABEL ") || !strstr(out, "  cmpl-tools...789abcdef-7  "))
        fail_msg("no label column in\n%s", out);
    char seq_id[16];
    snprintf(seq_id, sizeof(seq_id), "%u", vase_seq_id(s));
    out = vasectl_ok(f, (const char *const[]){"--json", "seq", seq_id, NULL});
    assert_json_line(out);
    assert_non_null(strstr(out, "\"label\":\"cmpl-tools-0123456789abcdef-7\""));
    out = vasectl_ok(f, (const char *const[]){"seq", seq_id, NULL});
    assert_non_null(strstr(out, "label       cmpl-tools-0123456789abcdef-7\n"));
    assert_non_null(strstr(out, "model       harness-small (1)\n"));
    assert_non_null(strstr(out, "prompt      0 tokens\n")); /* not protected */
    out = vasectl_ok(f, (const char *const[]){"clients", NULL});
    assert_non_null(strstr(out, "STATE"));
    assert_non_null(strstr(out, "tools-engine  connected"));
    out = vasectl_ok(f, (const char *const[]){"ping", NULL});
    assert_non_null(strstr(out, "pong"));

    assert_int_equal(vase_seq_close(s), 0);
    out = vasectl_ok(f, (const char *const[]){"--json", "status", NULL});
    assert_int_equal(json_number(out, "bytes_free"), HARNESS_ARENA_BYTES);
    assert_int_equal(json_number(out, "bytes_pages"), 0);
}

/* An elastic sequence in the listings: its range, the target it heads for, the status line
 * once it runs below its budget. */
static void test_vasectl_elastic(void **state) {
    struct fixture *f = *state;
    open_engine(f);
    struct vase_geometry g = harness_geometry();
    struct vase_seq_config cfg = harness_seq_config(VASE_POLICY_STREAMING, 704, 32, 0, 0);
    cfg.min_budget = 320;
    cfg.label = "elastic-7";
    struct vase_seq *s;
    /* Events, once vasectl is seen to follow them. */
    char path[PATH_MAX];
    struct harness_proc events = {.pid = 0};
    assert_int_equal(harness_program("vasectl", path, sizeof(path)), 0);
    assert_int_equal(
        harness_proc_start(&events, (const char *const[]){path, "events", NULL}, &f->h.d), 0);
    do {
        assert_int_equal(vase_seq_open(f->h.c[0], f->m, &cfg, &s), 0);
        assert_int_equal(vase_seq_close(s), 0);
    } while (harness_proc_wait_output(&events, "\n", 20) == -ETIMEDOUT);

    assert_int_equal(vase_seq_open(f->h.c[0], f->m, &cfg, &s), 0);
    const char *out = vasectl_ok(f, (const char *const[]){"seqs", NULL});
    assert_non_null(strstr(out, "704 (320..704)"));
    out = vasectl_ok(f, (const char *const[]){"--json", "seqs", NULL});
    assert_int_equal(json_number(out, "min_budget"), 320);
    assert_int_equal(json_number(out, "max_budget"), 704);

    assert_int_equal(vase_seq_set_budget(s, 320), 0);
    out = vasectl_ok(f, (const char *const[]){"seqs", NULL});
    assert_non_null(strstr(out, "704 (320..704) -> 320"));
    while (vase_seq_budget(s) != 320)
        assert_true(harness_append_tokens(s, &g, 1, 32, false) >= 0);
    assert_int_equal(vase_seq_flush(s), 0);
    char id[16];
    snprintf(id, sizeof(id), "%u", vase_seq_id(s));
    out = vasectl_ok(f, (const char *const[]){"seq", id, NULL});
    assert_non_null(strstr(out, "elastic     320 .. 704, weight 1, cap 320, target 320, changed 1 "
                                "times"));
    out = vasectl_ok(f, (const char *const[]){"status", NULL});
    assert_non_null(strstr(out, "elastic budgets: 1 sequences below their budget, 0 B to be "
                                "released at their next commit; 1 shrinks, 0 grows"));
    char line[96];
    snprintf(line, sizeof(line), "budget   seq %u client %u budget 704 -> 320 (cap) at round",
             vase_seq_id(s), vase_client_id(f->h.c[0]));
    assert_int_equal(harness_proc_wait_output(&events, line, HARNESS_WAIT_MS), 0);
    /* Lines of a sequence that has a label end with it: the budget change (written with its
     * line, whole), and the opens and closes. */
    const char *end = strchr(strstr(events.out, line), '\n');
    assert_non_null(end);
    assert_memory_equal(end - 16, " label elastic-7", 16);
    assert_non_null(strstr(events.out, "rounds 0 label elastic-7\n"));
    harness_proc_free(&events);
    assert_int_equal(vase_seq_close(s), 0);
}

static void test_vasectl_config(void **state) {
    struct fixture *f = *state;
    const char *out = vasectl_ok(f, (const char *const[]){"--json", "config", "get", NULL});
    assert_json_line(out);
    static const char *const keys[] = {"runtime_dir",       "arena_bytes", "granule_bytes",
                                       "max_message_bytes", "log_level",   "stats_interval"};
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        char quoted[64];
        snprintf(quoted, sizeof(quoted), "\"%s\"", keys[i]);
        if (!strstr(out, quoted))
            fail_msg("config get lacks %s:\n%s", keys[i], out);
    }
    /* One key: its bare value. */
    out = vasectl_ok(f, (const char *const[]){"config", "get", "granule_bytes", NULL});
    assert_string_equal(out, "64K\n");
    out = vasectl_ok(f, (const char *const[]){"config", "get", "runtime_dir", NULL});
    assert_memory_equal(out, f->h.d.dir, strlen(f->h.d.dir));

    /* A runtime setting changes and reads back ('-' and '_' are the same). */
    vasectl_ok(f, (const char *const[]){"config", "set", "stats-interval", "3", NULL});
    out = vasectl_ok(f, (const char *const[]){"config", "get", "stats_interval", NULL});
    assert_string_equal(out, "3\n");
    vasectl_ok(f, (const char *const[]){"config", "set", "log_level", "debug", NULL});
    out = vasectl_ok(f, (const char *const[]){"config", "get", "log_level", NULL});
    assert_string_equal(out, "debug\n");
    out = vasectl_ok(f, (const char *const[]){"config", "get", "elastic_policy", NULL});
    assert_string_equal(out, "proportional\n");
    vasectl_ok(f, (const char *const[]){"config", "set", "elastic-policy", "priority", NULL});
    out = vasectl_ok(f, (const char *const[]){"config", "get", "elastic_policy", NULL});
    assert_string_equal(out, "priority\n");
    assert_int_equal(
        vasectl(f, (const char *const[]){"config", "set", "elastic_policy", "fair", NULL}), 1);

    /* Refusals: exit 1 and a message naming the problem; nothing changes. */
    assert_int_equal(
        vasectl(f, (const char *const[]){"config", "set", "granule_bytes", "128K", NULL}), 1);
    if (!strstr(f->p.out, "granule_bytes"))
        fail_msg("the refusal does not name the setting:\n%s", f->p.out);
    out = vasectl_ok(f, (const char *const[]){"config", "get", "granule_bytes", NULL});
    assert_string_equal(out, "64K\n");
    assert_int_equal(vasectl(f, (const char *const[]){"config", "set", "max_clients", "0", NULL}),
                     1);
    assert_int_equal(
        vasectl(f, (const char *const[]){"config", "set", "stats_interval", "soon", NULL}), 1);
    assert_int_equal(vasectl(f, (const char *const[]){"config", "set", "no_such_key", "1", NULL}),
                     1);
    out = vasectl_ok(f, (const char *const[]){"config", "get", "stats_interval", NULL});
    assert_string_equal(out, "3\n");
    assert_int_equal(harness_config_set(&f->h.d, "granule_bytes", "128K"), -EPERM);
    assert_int_equal(harness_config_set(&f->h.d, "max_clients", "0"), -ERANGE);
    assert_int_equal(harness_config_set(&f->h.d, "stats_interval", "soon"), -EINVAL);
    /* Eight refusals, all an operator's: none counts as an engine's error. */
    out = vasectl_ok(f, (const char *const[]){"--json", "status", NULL});
    assert_int_equal(json_number(out, "admin_errors_total"), 8);
    assert_int_equal(json_number(out, "errors_total"), 0);
    assert_int_equal(vasectl(f, (const char *const[]){"seq", "4000000", NULL}), 1);
    out = vasectl_ok(f, (const char *const[]){"status", NULL});
    assert_non_null(strstr(out, "errors 0 (engines) and 9 (administrative)"));

    /* Under --json an error is one JSON object too, with its errno. */
    assert_int_equal(
        vasectl(f, (const char *const[]){"--json", "config", "set", "no_such_key", "1", NULL}), 1);
    assert_json_line(f->p.out);
    assert_non_null(strstr(f->p.out, "{\"error\":\"config set no_such_key: "));
    assert_int_equal(json_number(f->p.out, "errno"), ENOENT);
    assert_int_equal(vasectl(f, (const char *const[]){"frobnicate", "--json", NULL}), 2);
    assert_json_line(f->p.out);
    assert_int_equal(json_number(f->p.out, "errno"), EINVAL);
    assert_int_equal(vasectl(f, (const char *const[]){"--json", "--no-such-flag", NULL}), 2);
    assert_json_line(f->p.out);
    assert_non_null(strstr(f->p.out, "unknown option '--no-such-flag'"));
    assert_int_equal(vasectl(f, (const char *const[]){"--json=yes", "status", NULL}), 2);
    assert_non_null(strstr(f->p.out, "option '--json' takes no value"));
    assert_int_equal(vasectl(f, (const char *const[]){"--json", "-hz", NULL}), 0);
    assert_non_null(strstr(f->p.out, "Usage:"));
    assert_int_equal(vasectl(f, (const char *const[]){"--json", "-zh", NULL}), 2);
    assert_non_null(strstr(f->p.out, "unknown option '-z'"));

    /* Usage errors exit 2 before talking to anyone, with a pointer to the help. */
    assert_int_equal(vasectl(f, (const char *const[]){"frobnicate", NULL}), 2);
    assert_string_equal(f->p.out, "vasectl: unknown command 'frobnicate' (try 'vasectl --help')\n");
    assert_int_equal(vasectl(f, (const char *const[]){"--frobnicate", "status", NULL}), 2);
    assert_string_equal(f->p.out,
                        "vasectl: unknown option '--frobnicate' (try 'vasectl --help')\n");
    assert_int_equal(vasectl(f, (const char *const[]){"-z", NULL}), 2);
    assert_string_equal(f->p.out, "vasectl: unknown option '-z' (try 'vasectl --help')\n");
    assert_int_equal(vasectl(f, (const char *const[]){"status", "--timeout", NULL}), 2);
    assert_string_equal(f->p.out,
                        "vasectl: option '--timeout' needs a value (try 'vasectl --help')\n");
    assert_int_equal(vasectl(f, (const char *const[]){"config", "set", "x", NULL}), 2);
    assert_int_equal(vasectl(f, (const char *const[]){"--count=1", "status", NULL}), 2);
}

/* vasectl --version names its version, the daemon's (they are released together), and the
 * protocol version of the libvase it was built with. */
/*
 * vasectl size against the daemon itself: for each geometry and configuration, the bytes it
 * prints for one sequence are the bytes an open takes from the arena (Status, bytes_pages), and
 * the number of sequences it says fit is the number of opens the daemon admits before -ENOSPC,
 * in an arena of the same size and granule (1 MiB: a KV and a plan page never share one, so the
 * count is the allocator's, not the arena divided by a sequence's bytes; pages of 24 tokens
 * straddle granules).
 */
static void test_vasectl_size(void **state) {
    struct fixture *f = *state;
    static const struct {
        uint32_t block_tokens;
        enum vase_policy policy;
        uint32_t budget, window, prompt_len;
        const char *words[3]; /* the same, as vasectl's words */
    } cases[] = {
        {64,
         VASE_POLICY_VASE_ATTNV,
         128,
         32,
         0,
         {"block_tokens=64", "policy=vase-attnv", "budget=128"}},
        {16,
         VASE_POLICY_STREAMING,
         64,
         32,
         0,
         {"block_tokens=16", "policy=streaming", "budget=64"}},
        {24, VASE_POLICY_SNAPKV, 96, 32, 0, {"block_tokens=24", "policy=snapkv", "budget=96"}},
        {64, VASE_POLICY_H2O, 64, 32, 200, {"block_tokens=64", "policy=h2o", "budget=64"}},
    };
    enum { MOST = 512 };
    struct vase_seq *seqs[MOST];
    char arena[32];
    snprintf(arena, sizeof(arena), "arena_bytes=%" PRIu64, HARNESS_ARENA_BYTES);

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct vase_geometry g = harness_geometry();
        g.block_tokens = cases[i].block_tokens;
        struct vase_model *m;
        struct vase_client *c;
        assert_int_equal(harness_engine_open(&f->h.d, "size", &g, &c, &m), 0);
        struct vase_seq_config cfg = harness_seq_config(cases[i].policy, cases[i].budget,
                                                        cases[i].window, cases[i].prompt_len, 0);

        /* The words: the harness model, f32, and this case's pages and parameters. */
        char window[32], prompt[32];
        snprintf(window, sizeof(window), "window=%" PRIu32, cases[i].window);
        snprintf(prompt, sizeof(prompt), "prompt_len=%" PRIu32, cases[i].prompt_len);
        const char *args[] = {"--json",
                              "size",
                              "layers=2",
                              "q_heads=4",
                              "kv_heads=2",
                              "head_dim=32",
                              "dtype=f32",
                              cases[i].words[0],
                              cases[i].words[1],
                              cases[i].words[2],
                              window,
                              prompt,
                              arena,
                              "granule_bytes=1M",
                              NULL};
        const char *out = vasectl_ok(f, args);
        uint64_t seq_bytes = json_number(out, "seq_bytes"), fits = json_number(out, "seqs");

        assert_int_equal(vase_seq_open(c, m, &cfg, &seqs[0]), 0);
        struct harness_status st = harness_status_of(&f->h.d);
        if (st.bytes_pages != seq_bytes)
            fail_msg("case %zu: one open takes %" PRIu64 " bytes, vasectl size says %" PRIu64, i,
                     st.bytes_pages, seq_bytes);
        int n = 1 + harness_fill(c, m, cfg, seqs + 1, MOST - 1);
        print_message("case %zu: %" PRIu64 " bytes a sequence, %d sequences\n", i, seq_bytes, n);
        if ((uint64_t)n != fits)
            fail_msg("case %zu: the daemon admits %d sequences, vasectl size says %" PRIu64 "\n%s",
                     i, n, fits, out);
        harness_close_all(seqs, n);
        vase_disconnect(c);
        harness_assert_all_free(&f->h.d);
    }

    /* Bad words: usage errors (exit 2) that name the word, and the rule for parameters. */
    static const struct {
        const char *word, *why;
    } bad[] = {
        {"layers=x", "invalid layers 'x'"},
        {"layers=-1", "invalid layers '-1'"},
        {"colour=red", "unknown key 'colour'"},
        {"budget", "'budget' is not KEY=VALUE"},
        {"budget=100", "budget must be a multiple of window (budget 100, window 64"},
        {"arena_bytes=3K", "arena_bytes must be a multiple of granule_bytes"},
        {"dtype=f64", "invalid dtype 'f64'"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const char *args[] = {"size",        "layers=2",  "q_heads=4", "kv_heads=2",
                              "head_dim=32", bad[i].word, NULL};
        int r = vasectl(f, args);
        if (r != 2 || !strstr(f->p.out, bad[i].why))
            fail_msg("vasectl size %s: exit %d, want 2 and \"%s\":\n%s", bad[i].word, r, bad[i].why,
                     f->p.out);
    }
}

static void test_vasectl_version(void **state) {
    struct fixture *f = *state;
    char path[PATH_MAX], want[64];
    assert_int_equal(harness_program("vased", path, sizeof(path)), 0);
    struct harness_proc p = {.out_fd = -1};
    assert_int_equal(
        harness_run(&p, (const char *const[]){path, "--version", NULL}, NULL, HARNESS_RUN_MS), 0);
    char version[32];
    assert_int_equal(sscanf(p.out, "vased %31s", version), 1);
    harness_proc_free(&p);
    snprintf(want, sizeof(want), "vasectl %s (protocol %d)\n", version, VASE_PROTOCOL_VERSION);
    assert_string_equal(vasectl_ok(f, (const char *const[]){"--version", NULL}), want);
}

/* The VALUE of config set is taken as it is, also when it looks like an option (a negative
 * number), wherever the options are; "--" ends the options. A value out of range is the daemon's
 * refusal (exit 1), not a usage error (exit 2). */
static void test_vasectl_config_negative(void **state) {
    struct fixture *f = *state;
    vasectl_ok(f, (const char *const[]){"config", "set", "default_slack", "64", NULL});
    vasectl_ok(f, (const char *const[]){"config", "set", "default_slack", "-1", NULL});
    const char *out = vasectl_ok(f, (const char *const[]){"config", "get", "default_slack", NULL});
    assert_string_equal(out, "-1\n");

    out =
        vasectl_ok(f, (const char *const[]){"config", "set", "default_slack", "7", "--json", NULL});
    assert_json_line(out);
    out = vasectl_ok(f,
                     (const char *const[]){"--json", "config", "set", "default_slack", "-1", NULL});
    assert_json_line(out);
    assert_non_null(strstr(out, "\"-1\""));
    vasectl_ok(f, (const char *const[]){"config", "set", "default_slack", "9", NULL});
    vasectl_ok(f, (const char *const[]){"--", "config", "set", "default_slack", "-1", NULL});
    out = vasectl_ok(f, (const char *const[]){"config", "get", "default_slack", NULL});
    assert_string_equal(out, "-1\n");

    assert_int_equal(
        vasectl(f, (const char *const[]){"config", "set", "default_slack", "-2", NULL}), 1);
    if (!strstr(f->p.out, "default_slack"))
        fail_msg("the refusal does not name the setting:\n%s", f->p.out);
    /* Other words stay words and other options options. */
    assert_int_equal(vasectl(f, (const char *const[]){"config", "set", "-1", NULL}), 2);
    assert_int_equal(vasectl(f, (const char *const[]){"status", "-1", NULL}), 2);
    out = vasectl_ok(f, (const char *const[]){"config", "get", "default_slack", "--json", NULL});
    assert_json_line(out);
}

/* vasectl events --count=1 exits after the first event; events are made until it does, since
 * a subscriber misses what is published before its subscription is in place (nothing tells the
 * test when that is). */
static void test_vasectl_events(void **state) {
    struct fixture *f = *state;
    open_engine(f);
    char path[PATH_MAX];
    assert_int_equal(harness_program("vasectl", path, sizeof(path)), 0);
    const char *argv[] = {path, "--json", "events", "--count=1", NULL};
    assert_int_equal(harness_proc_start(&f->p, argv, &f->h.d), 0);

    struct vase_seq_config cfg = harness_seq_config(VASE_POLICY_STREAMING, 128, 32, 0, 0);
    double end = harness_now() + HARNESS_WAIT_MS / 1000.0;
    int r = -ETIMEDOUT;
    while (harness_now() < end) {
        struct vase_seq *s;
        assert_int_equal(vase_seq_open(f->h.c[0], f->m, &cfg, &s), 0);
        assert_int_equal(vase_seq_close(s), 0);
        r = harness_proc_wait_output(&f->p, "\n", 20);
        if (r != -ETIMEDOUT)
            break;
    }
    int status;
    assert_int_equal(harness_proc_finish(&f->p, HARNESS_RUN_MS, &status), 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("vasectl events exited with status 0x%x:\n%s", status, f->p.out);
    assert_json_line(f->p.out);
    assert_non_null(strstr(f->p.out, "\"topic\":\"seq\""));
    char inc[32];
    snprintf(inc, sizeof(inc), "\"0x%016llx\"", (unsigned long long)f->h.d.incarnation);
    assert_non_null(strstr(f->p.out, inc));
}

/* ---- replay_engine ---- */

static int compare_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every trace_* case of the vectors through the daemon: exit 0, one PASS line per case. */
static void test_replay_engine(void **state) {
    struct fixture *f = *state;
    const char *vectors = getenv("VASE_VECTORS");
    if (!vectors || !vectors[0])
        vectors = "tests/vectors/reference";
    DIR *dh = opendir(vectors);
    if (!dh)
        fail_msg("no test vectors at %s (%s); set VASE_VECTORS", vectors, strerror(errno));
    char *cases[64];
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(dh)) && n < 64)
        if (strncmp(de->d_name, "trace_", 6) == 0) {
            cases[n] = malloc(PATH_MAX);
            assert_non_null(cases[n]);
            snprintf(cases[n], PATH_MAX, "%s/%s", vectors, de->d_name);
            n++;
        }
    closedir(dh);
    if (n == 0)
        fail_msg("no trace_* case in %s", vectors);
    qsort(cases, n, sizeof(cases[0]), compare_names);

    char path[PATH_MAX], dir_arg[128];
    assert_int_equal(harness_program("tests/replay_engine", path, sizeof(path)), 0);
    snprintf(dir_arg, sizeof(dir_arg), "--runtime-dir=%s", f->h.d.dir);
    const char *argv[68] = {path, dir_arg};
    for (size_t i = 0; i < n; i++)
        argv[2 + i] = cases[i];
    argv[2 + n] = NULL;
    double t = harness_now();
    int r = harness_run(&f->p, argv, &f->h.d, HARNESS_RUN_MS);
    printf("replay_engine, %zu traces: %.2f s\n%s", n, harness_now() - t, f->p.out ? f->p.out : "");
    if (r != 0)
        fail_msg("replay_engine exited %d (%s)", r, r < 0 ? vase_strerror(r) : "");
    for (size_t i = 0; i < n; i++) {
        char line[PATH_MAX];
        snprintf(line, sizeof(line), "PASS %s\n", strrchr(cases[i], '/') + 1);
        if (!strstr(f->p.out, line))
            fail_msg("no \"%.*s\" line", (int)strlen(line) - 1, line);
        free(cases[i]);
    }
    char summary[64];
    snprintf(summary, sizeof(summary), "%zu passed, 0 failed", n);
    assert_non_null(strstr(f->p.out, summary));
    /* Everything the engine opened is closed again. */
    assert_int_equal(harness_wait_bytes_pages(&f->h.d, 0, HARNESS_WAIT_MS, NULL), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_vasectl_status, setup, teardown),
        cmocka_unit_test_setup_teardown(test_vasectl_elastic, setup, teardown),
        cmocka_unit_test_setup_teardown(test_vasectl_config, setup, teardown),
        cmocka_unit_test_setup_teardown(test_vasectl_config_negative, setup, teardown),
        cmocka_unit_test_setup_teardown(test_vasectl_version, setup, teardown),
        cmocka_unit_test_setup_teardown(test_vasectl_size, setup_size, teardown),
        cmocka_unit_test_setup_teardown(test_vasectl_events, setup_quiet, teardown),
        cmocka_unit_test_setup_teardown(test_replay_engine, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
