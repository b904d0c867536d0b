/* SPDX-License-Identifier: MIT */

/*
 * The Prometheus endpoint of a real vased under load: two engines' sequences evict (and stall:
 * they never poll, so every plan is waited for at a full cache), an open is refused for want of
 * room, an operator mistypes a setting and asks for a sequence that does not exist. Then a live
 * scrape must pass `promtool check metrics` (Debian's prometheus package) with no complaint and
 * carry the values the daemon's other views give: evictions equal to the rounds SeqInfo counts,
 * stalls and compaction time equal to what the engine reported, the refusal under "nospace", the
 * operator's mistakes under the administrative errors and not the engines', one info series per
 * sequence with its label when asked for (never by default). Counters never go
 * down between two scrapes; every metric family is documented in the table of docs/metrics.md
 * and every metric that table names is served. A second daemon on a taken port, or on an address
 * that does not parse, does not start and says why; with metrics off there is no endpoint.
 */

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "integration/harness.h"
#include "wire.h"

#define BUDGET 128
/* vased's connection limit of the metrics endpoint (daemon/serve/metrics_http.h). */
#define VASE_METRICS_TEST_CONNECTIONS 16
#define WINDOW 32
#define PROMPT 40
/* The model name, as the engine registers it and as the metrics must escape it. */
#define MODEL_NAME "qwen \"test\"\\model\n2"
#define MODEL_LABEL "model=\"qwen \\\"test\\\"\\\\model\\n2\""

struct fixture {
    struct harness_fixture h;
};

static int setup(void **state) {
    static const char *const args[] = {"--metrics-address=127.0.0.1:0", NULL};
    return harness_fixture_setup(state, sizeof(struct fixture), args);
}

/* With the series that name tenants (models, arenas) and sequences (their labels). */
static int setup_tenant(void **state) {
    static const char *const args[] = {"--metrics-address=127.0.0.1:0",
                                       "--metrics-tenant-labels=yes",
                                       "--metrics-sequence-labels=yes", NULL};
    return harness_fixture_setup(state, sizeof(struct fixture), args);
}

static int teardown(void **state) {
    return harness_fixture_teardown(state);
}

/* A metric that must be there; its value. */
static double metric(const char *text, const char *series) {
    double v = harness_metric(text, series);
    if (isnan(v))
        fail_msg("the scrape has no sample %s", series);
    return v;
}

/* The sum of every sample of family name (name{...} lines). */
static double metric_sum(const char *text, const char *name) {
    size_t n = strlen(name);
    double sum = 0;
    for (const char *line = text; *line;) {
        if (strncmp(line, name, n) == 0 && line[n] == '{') {
            const char *space = strstr(line, "} ");
            assert_non_null(space);
            sum += strtod(space + 2, NULL);
        }
        const char *nl = strchr(line, '\n');
        if (!nl)
            break;
        line = nl + 1;
    }
    return sum;
}

/* Runs `promtool check metrics` on text; it must exit 0 and print nothing. */
static void promtool_check(const struct harness_daemon *d, const char *text) {
    char path[PATH_MAX], cmd[PATH_MAX + 64];
    harness_daemon_path(d, "scrape.txt", path, sizeof(path));
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fputs(text, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
    snprintf(cmd, sizeof(cmd), "promtool check metrics <'%s'", path);
    const char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    struct harness_proc p;
    int r = harness_run(&p, argv, NULL, HARNESS_WAIT_MS);
    if (r != 0 || (p.out && p.out[0]))
        fail_msg("promtool check metrics (exit %d; `make deps` installs the prometheus package): "
                 "%s",
                 r, p.out ? p.out : "");
    harness_proc_free(&p);
}

/* Appends n tokens to each sequence, never polling: every plan is applied when a cache is full,
 * by an append that waits for it (a stall). */
static void decode(struct vase_seq **s, int n_seqs, const struct vase_geometry *g, int n) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n_seqs; j++)
            assert_true(harness_append_tokens(s[j], g, (uint32_t)j, 1, false) >= 0);
}

/* Applies the plans still pending, then waits until the daemon has taken every commit (its
 * SeqInfo counts the rounds the engine applied): the metrics then describe a quiet state. The
 * SeqInfo of each sequence into info[]. */
static void settle(const struct harness_daemon *d, struct vase_seq **s, int n_seqs,
                   Vase__Envelope **info) {
    for (int j = 0; j < n_seqs; j++) {
        assert_true(vase_seq_wait(s[j]) >= 0);
        for (int tries = 0;; tries++) {
            assert_int_equal(harness_get_seq(d, vase_seq_id(s[j]), &info[j]), 0);
            if (info[j]->seq_info->rounds == vase_seq_rounds(s[j]))
                break;
            vase__envelope__free_unpacked(info[j], NULL);
            if (tries > HARNESS_WAIT_MS / 10)
                fail_msg("the daemon did not see the commits of sequence %u", vase_seq_id(s[j]));
            harness_sleep_ms(10);
        }
    }
}

/* The table of docs/metrics.md lists every family the scrape has, and the daemon serves every
 * metric it lists. The table is the one of the section "Every metric", up to the next heading of
 * its level. */
static void check_doc_table(const char *text) {
    const char *build = getenv("VASE_BUILD_DIR");
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/../docs/metrics.md", build && build[0] ? build : "build");
    FILE *f = fopen(path, "r");
    if (!f)
        fail_msg("cannot read %s", path);
    static char doc[1 << 20];
    size_t len = fread(doc, 1, sizeof(doc) - 1, f);
    fclose(f);
    doc[len] = '\0';
    const char *section = strstr(doc, "\n## Every metric\n");
    assert_non_null(section);
    const char *end = strstr(section + 1, "\n## ");
    size_t section_len = end ? (size_t)(end - section) : strlen(section);

    int families = 0;
    for (const char *t = strstr(text, "# TYPE "); t; t = strstr(t + 1, "# TYPE ")) {
        char name[128], row[160];
        assert_int_equal(sscanf(t, "# TYPE %127s", name), 1);
        snprintf(row, sizeof(row), "\n| `%s` |", name);
        const char *hit = strstr(section, row);
        if (!hit || (size_t)(hit - section) > section_len)
            fail_msg("the metric %s is not in the table of docs/metrics.md", name);
        families++;
    }
    assert_true(families > 20);
    int rows = 0;
    for (const char *r = strstr(section, "\n| `vase_"); r && (size_t)(r - section) < section_len;
         r = strstr(r + 1, "\n| `vase_")) {
        char name[128], type[160];
        assert_int_equal(sscanf(r, "\n| `%127[a-z_]`", name), 1);
        snprintf(type, sizeof(type), "# TYPE %s ", name);
        if (!strstr(text, type))
            fail_msg("the table of docs/metrics.md lists %s, which the daemon does not serve",
                     name);
        rows++;
    }
    assert_int_equal(rows, families);
}

/* Every sample of a counter (and of a histogram) in before is there in after, not lower. */
static void check_monotonic(const char *before, const char *after) {
    for (const char *line = before; *line;) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        char series[512];
        const char *space = memchr(line, ' ', len);
        bool counter = false;
        if (line[0] != '#' && space && (size_t)(space - line) < sizeof(series)) {
            memcpy(series, line, (size_t)(space - line));
            series[space - line] = '\0';
            /* Its family's TYPE line: the name up to '{', less a histogram's suffix. */
            char family[256], type[300];
            snprintf(family, sizeof(family), "%.*s", (int)strcspn(series, "{"), series);
            snprintf(type, sizeof(type), "# TYPE %s counter\n", family);
            counter = strstr(before, type) != NULL;
            if (!counter) {
                static const char *const suffixes[] = {"_bucket", "_sum", "_count"};
                for (size_t i = 0; i < 3 && !counter; i++) {
                    size_t fl = strlen(family), sl = strlen(suffixes[i]);
                    if (fl > sl && strcmp(family + fl - sl, suffixes[i]) == 0) {
                        snprintf(type, sizeof(type), "# TYPE %.*s histogram\n", (int)(fl - sl),
                                 family);
                        counter = strstr(before, type) != NULL;
                    }
                }
            }
            if (counter) {
                double a = strtod(space + 1, NULL), b = harness_metric(after, series);
                if (!(b >= a))
                    fail_msg("%s went from %g to %g", series, a, b);
            }
        }
        if (!nl)
            break;
        line = nl + 1;
    }
}

static void test_scrape_under_load(void **state) {
    struct fixture *f = *state;
    const struct harness_daemon *d = &f->h.d;
    struct vase_geometry g = harness_geometry();
    g.name = MODEL_NAME;
    struct vase_client *c;
    struct vase_model *m;
    assert_int_equal(harness_engine_open(d, "metrics-engine", &g, &c, &m), 0);
    f->h.c[0] = c;

    struct vase_seq *s[2];
    struct vase_seq_config cfg[2] = {
        harness_seq_config(VASE_POLICY_STREAMING, BUDGET, WINDOW, PROMPT, VASE_MODE_ASYNC),
        harness_seq_config(VASE_POLICY_RANDOM, BUDGET, WINDOW, PROMPT, VASE_MODE_ASYNC)};
    cfg[0].label = "cmpl-metrics-0";
    cfg[1].label = "cmpl-metrics-1";
    for (int j = 0; j < 2; j++) {
        assert_int_equal(vase_seq_open(c, m, &cfg[j], &s[j]), 0);
        assert_true(harness_append_tokens(s[j], &g, (uint32_t)j, PROMPT, true) >= 0);
    }
    decode(s, 2, &g, 400);

    /* One open refused for want of room (the sequences that did fit are closed again). */
    struct vase_seq *fill[HARNESS_ARENA_PAGES];
    int filled = harness_fill(c, m, cfg[0], fill, HARNESS_ARENA_PAGES);
    harness_close_all(fill, filled);
    /* An operator's typo and a sequence that does not exist. */
    assert_int_equal(harness_config_set(d, "no_such_setting", "1"), -ENOENT);
    Vase__Envelope *reply;
    assert_int_equal(harness_get_seq(d, 999999, &reply), -ENOENT);
    vase__envelope__free_unpacked(reply, NULL);

    Vase__Envelope *info[2];
    settle(d, s, 2, info);
    char *resp;
    const char *text;
    assert_int_equal(harness_scrape(d, &resp, &text), 0);
    struct harness_status st = harness_status_of(d);
    promtool_check(d, text);

    /* Evictions and plans: what the daemon's SeqInfo counts, per policy. */
    static const char *const policies[] = {"streaming", "random"};
    uint64_t bytes = 0;
    for (int j = 0; j < 2; j++) {
        const Vase__SeqInfo *si = info[j]->seq_info;
        char series[128];
        assert_true(si->rounds >= 5);
        snprintf(series, sizeof(series), "vase_evictions_total{policy=\"%s\"}", policies[j]);
        assert_true(metric(text, series) == si->rounds);
        snprintf(series, sizeof(series), "vase_plan_seconds_count{policy=\"%s\"}", policies[j]);
        assert_true(metric(text, series) == si->rounds);
        snprintf(series, sizeof(series), "vase_plan_seconds_bucket{policy=\"%s\",le=\"+Inf\"}",
                 policies[j]);
        assert_true(metric(text, series) == si->rounds);

        /* The engine's counters: as libvase counted them, as SeqInfo shows them. */
        struct vase_seq_stats es;
        vase_seq_get_stats(s[j], &es);
        assert_true(es.stalls > 0);
        assert_int_equal(si->stalls, es.stalls);
        assert_true(si->stall_seconds == es.stall_seconds);
        assert_true(si->compact_seconds == es.compact_seconds);
        snprintf(series, sizeof(series), "vase_engine_stalls_total{policy=\"%s\"}", policies[j]);
        assert_true(metric(text, series) == (double)si->stalls);
        snprintf(series, sizeof(series), "vase_engine_stall_seconds_total{policy=\"%s\"}",
                 policies[j]);
        assert_true(fabs(metric(text, series) - si->stall_seconds) <= 1e-9 * si->stall_seconds);
        snprintf(series, sizeof(series), "vase_engine_compact_seconds_total{policy=\"%s\"}",
                 policies[j]);
        assert_true(fabs(metric(text, series) - si->compact_seconds) <= 1e-9 * si->compact_seconds);
        bytes += si->bytes;
    }
    assert_true(metric(text, "vase_evictions_total{policy=\"snapkv\"}") == 0);
    assert_true(metric_sum(text, "vase_evictions_total") == (double)st.evictions_total);
    assert_true(metric(text, "vase_engine_reports_ignored_total") == 0);

    /* Memory: the model's bytes under its escaped name, the arena's as Status reports them. */
    assert_true(metric(text, "vase_model_bytes{" MODEL_LABEL ",arena=\"0\"}") == (double)bytes);
    assert_true(
        metric(text, "vase_arena_pages_bytes{arena=\"0\",name=\"default\",kind=\"host\"}") ==
        (double)st.bytes_pages);
    assert_true(metric(text, "vase_arena_bytes{arena=\"0\",name=\"default\",kind=\"host\"}") ==
                (double)HARNESS_ARENA_BYTES);
    assert_true(metric(text, "vase_sequences") == 2);
    assert_true(metric(text, "vase_clients") == 1);
    assert_true(metric(text, "vase_opens_waiting") == 0);
    /* One info series per open sequence (those the fill opened are closed), with its model. */
    for (int j = 0; j < 2; j++) {
        char series[256];
        snprintf(series, sizeof(series),
                 "vase_sequence_info{seq=\"%u\",label=\"cmpl-metrics-%d\",arena=\"0\"," MODEL_LABEL
                 "}",
                 vase_seq_id(s[j]), j);
        assert_true(metric(text, series) == 1);
    }
    assert_true(metric_sum(text, "vase_sequence_info") == 2);

    /* The refusal, and the errors: the operator's apart from the engines'. */
    assert_true(metric(text, "vase_admission_refusals_total{reason=\"nospace\"}") == 1);
    assert_true(metric_sum(text, "vase_admission_refusals_total") == 1);
    assert_true(metric(text, "vase_errors_total{type=\"open_seq\"}") == 1);
    assert_true(metric(text, "vase_errors_total{type=\"config_set\"}") == 0);
    assert_true(metric(text, "vase_admin_errors_total{type=\"config_set\"}") == 1);
    assert_true(metric(text, "vase_admin_errors_total{type=\"get_seq\"}") == 1);
    assert_true(metric_sum(text, "vase_errors_total") == (double)st.errors_total);
    assert_true(metric_sum(text, "vase_admin_errors_total") == (double)st.admin_errors_total);
    assert_true(metric(text, "vase_requests_total{type=\"config_set\"}") == 1);
    assert_true(metric(text, "vase_requests_total{type=\"evict_commit\"}") >=
                info[0]->seq_info->rounds + info[1]->seq_info->rounds);
    assert_true(metric(text, "vase_events_dropped_total") == 0);
    assert_true(metric(text, "vase_events_published_total") > 0);

    char build_info[128];
    Vase__Status sreq = VASE__STATUS__INIT;
    Vase__Envelope *sr;
    assert_int_equal(harness_call(d, VASE__ENVELOPE__BODY_STATUS, &sreq, &sr), 0);
    snprintf(build_info, sizeof(build_info), "vase_build_info{version=\"%s\",protocol=\"%d\"}",
             sr->status_reply->version, VASE_WIRE_VERSION);
    vase__envelope__free_unpacked(sr, NULL);
    assert_true(metric(text, build_info) == 1);
    check_doc_table(text);

    /* More work; then no counter is lower than it was. */
    for (int j = 0; j < 2; j++)
        vase__envelope__free_unpacked(info[j], NULL);
    decode(s, 2, &g, 100);
    settle(d, s, 2, info);
    char *resp2;
    const char *text2;
    assert_int_equal(harness_scrape(d, &resp2, &text2), 0);
    check_monotonic(text, text2);
    assert_true(metric(text2, "vase_evictions_total{policy=\"streaming\"}") >
                metric(text, "vase_evictions_total{policy=\"streaming\"}"));
    promtool_check(d, text2);
    for (int j = 0; j < 2; j++)
        vase__envelope__free_unpacked(info[j], NULL);
    free(resp);
    free(resp2);

    /* Only GET and HEAD of /metrics. */
    char *other;
    assert_int_equal(harness_http(d, "GET", "/", &other), 0);
    assert_non_null(strstr(other, " 404 "));
    free(other);
    assert_int_equal(harness_http(d, "DELETE", "/metrics", &other), 0);
    assert_non_null(strstr(other, " 405 "));
    free(other);
    assert_int_equal(harness_http(d, "HEAD", "/metrics", &other), 0);
    assert_non_null(strstr(other, " 200 "));
    assert_null(strstr(other, "vase_build_info"));
    free(other);

    harness_close_all(s, 2);
}

/* Lines of text that start with prefix. */
static int count_lines(const char *text, const char *prefix) {
    int n = 0;
    size_t len = strlen(prefix);
    for (const char *line = text; line && *line;
         line = strchr(line, '\n'), line = line ? line + 1 : NULL)
        n += strncmp(line, prefix, len) == 0;
    return n;
}

/* By default the scrape names no tenant: no model name an engine registered, no arena name; the
 * arena series are there by number and kind. metrics_tenant_labels, set at run time, adds them;
 * model names the text format writes alike (cut at 128 bytes, or differing only in bytes that are
 * not UTF-8) then make one series, not two. */
static void test_tenant_labels(void **state) {
    struct fixture *f = *state;
    const struct harness_daemon *d = &f->h.d;
    struct vase_geometry g = harness_geometry();
    g.name = "tenant-7f3a-secret-model";
    struct vase_client *c;
    struct vase_model *m[5];
    assert_int_equal(harness_engine_open(d, "tenant-7f3a-engine", &g, &c, &m[0]), 0);
    f->h.c[0] = c;
    char long_a[201], long_b[201];
    memset(long_a, 'A', 200);
    memset(long_b, 'A', 200);
    long_a[200] = long_b[200] = '\0';
    long_a[150] = 'x';
    long_b[150] = 'y';
    const char *const names[] = {long_a, long_b, "tenant-7f3a-\xff", "tenant-7f3a-\xfe"};
    for (int i = 0; i < 4; i++) {
        struct vase_geometry gi = g;
        gi.name = names[i];
        assert_int_equal(vase_model_register(c, &gi, &m[1 + i]), 0);
    }
    struct vase_seq *s[5];
    struct vase_seq_config cfg =
        harness_seq_config(VASE_POLICY_STREAMING, 16, 8, 8, VASE_MODE_ASYNC);
    for (int i = 0; i < 5; i++)
        assert_int_equal(vase_seq_open(c, m[i], &cfg, &s[i]), 0);

    char *resp;
    const char *text;
    assert_int_equal(harness_scrape(d, &resp, &text), 0);
    promtool_check(d, text);
    if (strstr(text, "tenant-7f3a") || strstr(text, "AAAA") || strstr(text, "model=") ||
        strstr(text, "name=") || strstr(text, "vase_model_bytes"))
        fail_msg("the default scrape names a tenant:\n%s", text);
    assert_true(metric(text, "vase_arena_bytes{arena=\"0\",kind=\"host\"}") ==
                (double)HARNESS_ARENA_BYTES);
    assert_true(metric(text, "vase_sequences") == 5);
    free(resp);

    assert_int_equal(harness_config_set(d, "metrics_tenant_labels", "yes"), 0);
    assert_int_equal(harness_scrape(d, &resp, &text), 0);
    promtool_check(d, text);
    assert_true(metric(text, "vase_arena_bytes{arena=\"0\",name=\"default\",kind=\"host\"}") ==
                (double)HARNESS_ARENA_BYTES);
    assert_true(metric(text, "vase_model_bytes{model=\"tenant-7f3a-secret-model\",arena=\"0\"}") >=
                0);
    char series[300];
    snprintf(series, sizeof(series), "vase_model_bytes{model=\"%.128s\",arena=\"0\"} ", long_a);
    assert_int_equal(count_lines(text, series), 1);
    assert_int_equal(count_lines(text, "vase_model_bytes{model=\"tenant-7f3a-?\",arena=\"0\"} "),
                     1);
    assert_int_equal(count_lines(text, "vase_model_bytes{"), 3);
    free(resp);

    assert_int_equal(harness_config_set(d, "metrics_tenant_labels", "no"), 0);
    assert_int_equal(harness_scrape(d, &resp, &text), 0);
    assert_null(strstr(text, "tenant-7f3a"));
    free(resp);
    harness_close_all(s, 5);
}

/* By default no series is per sequence; metrics_sequence_labels, set at run time, adds one per
 * open sequence with its label ("" for none), its model only with metrics_tenant_labels too. */
static void test_sequence_labels(void **state) {
    struct fixture *f = *state;
    const struct harness_daemon *d = &f->h.d;
    struct vase_geometry g = harness_geometry();
    g.name = "tenant-5c1e-model";
    struct vase_client *c;
    struct vase_model *m;
    assert_int_equal(harness_engine_open(d, "labels-engine", &g, &c, &m), 0);
    f->h.c[0] = c;
    struct vase_seq *s[3];
    struct vase_seq_config cfg =
        harness_seq_config(VASE_POLICY_STREAMING, 16, 8, 8, VASE_MODE_ASYNC);
    static const char *const labels[3] = {"chatcmpl-5c1e:0/a@b+c=d.e_f-g", "req-2", NULL};
    for (int i = 0; i < 3; i++) {
        cfg.label = labels[i];
        assert_int_equal(vase_seq_open(c, m, &cfg, &s[i]), 0);
    }

    char *resp;
    const char *text;
    assert_int_equal(harness_scrape(d, &resp, &text), 0);
    if (strstr(text, "vase_sequence_info") || strstr(text, "5c1e") || strstr(text, "req-2"))
        fail_msg("the default scrape has series per sequence:\n%s", text);
    free(resp);

    assert_int_equal(harness_config_set(d, "metrics_sequence_labels", "yes"), 0);
    assert_int_equal(harness_scrape(d, &resp, &text), 0);
    promtool_check(d, text);
    assert_int_equal(count_lines(text, "vase_sequence_info{"), 3);
    for (int i = 0; i < 3; i++) {
        char series[160];
        snprintf(series, sizeof(series), "vase_sequence_info{seq=\"%u\",label=\"%s\",arena=\"0\"}",
                 vase_seq_id(s[i]), labels[i] ? labels[i] : "");
        assert_true(metric(text, series) == 1);
    }
    assert_null(strstr(text, "tenant-5c1e")); /* no model name: the tenant labels are off */
    free(resp);

    /* With the tenant labels the model; a closed sequence's series goes. */
    assert_int_equal(harness_config_set(d, "metrics_tenant_labels", "yes"), 0);
    assert_int_equal(vase_seq_close(s[2]), 0);
    assert_int_equal(harness_scrape(d, &resp, &text), 0);
    promtool_check(d, text);
    char series[160];
    snprintf(
        series, sizeof(series),
        "vase_sequence_info{seq=\"%u\",label=\"req-2\",arena=\"0\",model=\"tenant-5c1e-model\"}",
        vase_seq_id(s[1]));
    assert_true(metric(text, series) == 1);
    assert_int_equal(count_lines(text, "vase_sequence_info{"), 2);
    free(resp);

    assert_int_equal(harness_config_set(d, "metrics_sequence_labels", "no"), 0);
    assert_int_equal(harness_scrape(d, &resp, &text), 0);
    assert_null(strstr(text, "vase_sequence_info"));
    assert_null(strstr(text, "req-2"));
    free(resp);
    harness_close_all(s, 2);
}

static char log_text[1 << 16];

/* Whether d's log (read into log_text) says want. */
static bool log_has(const struct harness_daemon *d, const char *want);

/* The endpoint's address, as Status reports it. */
static struct sockaddr_in endpoint_of(const struct harness_daemon *d) {
    struct harness_status st = harness_status_of(d);
    const char *colon = strrchr(st.metrics_address, ':');
    assert_non_null(colon);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return sa;
}

/* A connection to sa from 127.0.0.host that sends nothing (connecting still, when the listen queue
 * is full: it completes when the daemon takes the queue). */
static int idle_from(const struct sockaddr_in *sa, int host) {
    struct sockaddr_in src = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000000u | host)};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&src, sizeof(src)), 0);
    int r = connect(fd, (const struct sockaddr *)sa, sizeof(*sa));
    assert_true(r == 0 || errno == EINPROGRESS);
    return fd;
}

/* Waits until the daemon has closed every one of fds (each reads end of file or an error). */
static void wait_closed(const int *fds, int n) {
    double end = harness_now() + HARNESS_WAIT_MS / 1000.0;
    for (int i = 0; i < n; i++)
        for (;;) {
            char c[64];
            ssize_t r = recv(fds[i], c, sizeof(c), MSG_DONTWAIT);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != ENOTCONN))
                break;
            if (harness_now() > end)
                fail_msg("the daemon kept idle metrics connection %d of %d open", i, n);
            harness_sleep_ms(20);
        }
}

static void close_all_fds(int *fds, int n) {
    for (int i = 0; i < n; i++)
        close(fds[i]);
}

/* Idle connections from several loopback addresses, left to the daemon, then closed by their
 * peers, then held by 64 addresses at once: after each the next scrape is answered (the endpoint
 * took them at its connection limit, 16, and once they were gone never ran again to take the
 * next), and the drops are counted and logged. */
static void test_idle_connections(void **state) {
    struct fixture *f = *state;
    const struct harness_daemon *d = &f->h.d;
    struct sockaddr_in sa = endpoint_of(d);
    enum { N = VASE_METRICS_TEST_CONNECTIONS, ADDRESSES = 64, HELD = ADDRESSES * 4 };
    static int fds[HELD];
    char *resp;
    const char *text;

    /* Sixteen from four addresses, dropped by the daemon when they send nothing. */
    for (int i = 0; i < N; i++)
        fds[i] = idle_from(&sa, 2 + i % 4);
    wait_closed(fds, N);
    close_all_fds(fds, N);
    assert_int_equal(harness_scrape(d, &resp, &text), 0);
    assert_true(metric(text, "vase_metrics_connections_dropped_total{reason=\"deadline\"}") >= N);
    free(resp);

    /* Sixteen more, closed by their peers. */
    for (int i = 0; i < N; i++)
        fds[i] = idle_from(&sa, 2 + i % 4);
    harness_sleep_ms(100);
    close_all_fds(fds, N);
    assert_int_equal(harness_scrape(d, &resp, &text), 0);
    free(resp);

    /* Four from each of 64 addresses, held while the scrape comes: the oldest make room. */
    for (int i = 0; i < HELD; i++) {
        fds[i] = idle_from(&sa, 2 + i % ADDRESSES);
        if (i % 8 == 7)
            harness_sleep_ms(2);
    }
    assert_int_equal(harness_scrape(d, &resp, &text), 0);
    assert_true(metric(text, "vase_metrics_connections_dropped_total{reason=\"evicted\"}") > 0);
    assert_true(metric(text, "vase_metrics_connections_dropped_total{reason=\"per_address\"}") ==
                0);
    promtool_check(d, text);
    free(resp);
    close_all_fds(fds, HELD);
    assert_int_equal(harness_scrape(d, &resp, &text), 0);
    free(resp);
    if (!log_has(d, "Metrics endpoint on 127.0.0.1:"))
        fail_msg("the drops were not logged:\n%s", log_text);
}

/* Whether d's log (read into log_text) says want. */
/* `vasectl status` of d, its output (stdout and stderr) in out. 0 or the exit status. */
static int run_vasectl_status(const struct harness_daemon *d, char *out, size_t size) {
    char prog[4096], cmd[8192];
    assert_int_equal(harness_program("vasectl", prog, sizeof(prog)), 0);
    snprintf(cmd, sizeof(cmd), "'%s' --runtime-dir='%s' status 2>&1", prog, d->dir);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, size - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static bool log_has(const struct harness_daemon *d, const char *want) {
    FILE *log = fopen(d->log, "r");
    assert_non_null(log);
    size_t n = fread(log_text, 1, sizeof(log_text) - 1, log);
    fclose(log);
    log_text[n] = '\0';
    return strstr(log_text, want) != NULL;
}

/* A daemon whose metrics_address cannot be bound does not start, and its log names the address;
 * one with metrics off has no endpoint. */
static void test_bind_errors(void **state) {
    struct fixture *f = *state;
    struct harness_status st = harness_status_of(&f->h.d);
    assert_true(strncmp(st.metrics_address, "127.0.0.1:", 10) == 0);

    char taken[96], want[160];
    snprintf(taken, sizeof(taken), "--metrics-address=%s", st.metrics_address);
    snprintf(want, sizeof(want),
             "Cannot listen for metrics on %s (metrics_address): Address "
             "already in use",
             st.metrics_address);
    static const char *const bogus = "--metrics-address=localhost:9464";
    const char *const *cases[] = {(const char *[]){taken, NULL}, (const char *[]){bogus, NULL}};
    const char *wants[] = {want, "metrics_address \"localhost:9464\" is not HOST:PORT"};
    for (int i = 0; i < 2; i++) {
        struct harness_daemon other = {0};
        assert_true(harness_daemon_start(&other, cases[i]) < 0);
        if (!log_has(&other, wants[i]))
            fail_msg("the log of a daemon started with %s does not say \"%s\":\n%s", cases[i][0],
                     wants[i], log_text);
        harness_daemon_free(&other);
    }

    /* Left to its default, an address another program holds only costs the endpoint: vased
     * starts, says so, and serves none. The test holds 127.0.0.1:9464 itself (or someone else
     * does). */
    int hold = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(hold >= 0);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(9464)};
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(hold, (struct sockaddr *)&sin, sizeof(sin)) == 0)
        assert_int_equal(listen(hold, 1), 0);
    else
        assert_int_equal(errno, EADDRINUSE);
    struct harness_daemon dflt = {.metrics_default = true};
    assert_int_equal(harness_daemon_start(&dflt, NULL), 0);
    st = harness_status_of(&dflt);
    assert_string_equal(st.metrics_address, "");
    if (!log_has(&dflt, "No metrics endpoint: the default metrics_address 127.0.0.1:9464 is "
                        "not free"))
        fail_msg("the log of a daemon on the default, taken address:\n%s", log_text);
    /* ... and the status says so, to vasectl status and systemd's STATUS= alike. */
    assert_non_null(strstr(st.metrics_unavailable, "127.0.0.1:9464 is not free (Address already "
                                                   "in use): a scrape there does not read this "
                                                   "vased"));
    char out[8192];
    assert_int_equal(run_vasectl_status(&dflt, out, sizeof(out)), 0);
    if (!strstr(out, "metrics NOT SERVED: the default metrics_address 127.0.0.1:9464 is not free"))
        fail_msg("vasectl status of a daemon on the default, taken address:\n%s", out);
    if (!log_has(&dflt, "<4>") && !log_has(&dflt, "warning: No metrics endpoint"))
        fail_msg("the endpoint's absence is not logged at warning:\n%s", log_text);
    harness_daemon_free(&dflt);
    close(hold);

    /* The harness's own default: off. */
    struct harness_daemon off = {0};
    assert_int_equal(harness_daemon_start(&off, NULL), 0);
    st = harness_status_of(&off);
    assert_string_equal(st.metrics_address, "");
    char *resp;
    assert_int_equal(harness_http(&off, "GET", "/metrics", &resp), -ENOTCONN);
    harness_daemon_free(&off);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_scrape_under_load, setup_tenant, teardown),
        cmocka_unit_test_setup_teardown(test_tenant_labels, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sequence_labels, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bind_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idle_connections, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
