/* SPDX-License-Identifier: MIT */

/*
 * The view of `vasectl top`: what a frame shows, computed from two samples of the daemon. Rates
 * (evictions and stalls per second, of the daemon and of each sequence) are the differences of
 * the counters of two samples divided by the time between them; a sequence seen once, or a
 * daemon that restarted between the two (another incarnation), has none yet ("-"). The
 * sequences are grouped by model and sorted by a column; the frame is rendered as plain text or
 * as one JSON line. Everything here is a pure function of samples in memory (it borrows their
 * replies), so that tests run it on fixed samples; taking samples and the terminal are
 * vasectl_top.c's.
 */

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vase.h"
#include "vase_admin.h"
#include "vasectl.h"
#include "vasectl_top.h"

static const struct {
    const char *header; /* '>': right-aligned */
    char key;           /* the key that sorts by it, besides s/S; 0: none */
    bool descending;    /* numbers that matter most when large come first */
} top_cols[N_COLS] = {
    [COL_ID] = {">ID", 'i', false},        [COL_CLIENT] = {">CLIENT", 'c', false},
    [COL_MODEL] = {"MODEL", 0, false},     [COL_POLICY] = {"POLICY", 0, false},
    [COL_BUDGET] = {">BUDGET", 'b', true}, [COL_LEN] = {">LEN/CAP", 'l', true},
    [COL_MEMORY] = {">MEMORY", 'm', true}, [COL_EVICT] = {">EVICT/S", 'e', true},
    [COL_PLAN] = {">PLAN", 'p', true},     [COL_STALLS] = {">STALLS/S", 't', true},
    [COL_STATE] = {"STATE", 0, false},
};

/* ---- rates, models, sorting ---- */

/* The rate of a counter between two samples dt seconds apart; -1 if it is not known (no
 * interval, or a counter that went back: another daemon, another sequence). */
static double top_rate(uint64_t now, uint64_t before, double dt) {
    if (!(dt > 0) || now < before)
        return -1;
    return (double)(now - before) / dt;
}

static int cmp_seq_id(const void *a, const void *b) {
    uint32_t x = (*(const Vase__SeqInfo *const *)a)->seq_id;
    uint32_t y = (*(const Vase__SeqInfo *const *)b)->seq_id;
    return (x > y) - (x < y);
}

void vasectl_top_view_clear(struct top_view *v) {
    free(v->seqs);
    free(v->models);
    *v = (struct top_view){0};
}

static void add_to_model(struct top_view *v, const struct top_seq *s) {
    const Vase__SeqInfo *i = s->info;
    const char *name = i->model_name ? i->model_name : "";
    struct top_model *m = NULL;

    for (size_t k = 0; k < v->n_models && !m; k++) {
        struct top_model *c = &v->models[k];
        if (*name ? strcmp(c->name, name) == 0 : !*c->name && c->model_id == i->model_id)
            m = c;
    }
    if (!m) {
        m = &v->models[v->n_models++];
        *m = (struct top_model){.name = name, .model_id = i->model_id, .evictions = -1};
    }
    m->seqs++;
    m->bytes += i->bytes;
    if (s->evictions >= 0)
        m->evictions = (m->evictions < 0 ? 0 : m->evictions) + s->evictions;
}

static int cmp_model(const void *a, const void *b) {
    const struct top_model *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes < y->bytes ? 1 : -1;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->model_id > y->model_id) - (x->model_id < y->model_id);
}

/*
 * Builds the view of cur, with the rates against prev (NULL, or a sample without replies:
 * none). The view borrows cur's replies. 0, or -ENOMEM (v is then empty).
 */
int vasectl_top_view_build(struct top_view *v, const struct top_sample *prev,
                           const struct top_sample *cur) {
    const Vase__SeqInfo **before = NULL;
    size_t n = cur->seqs ? cur->seqs->n_seqs : 0, n_before = 0;
    double dt = -1;

    vasectl_top_view_clear(v);
    v->cur = cur;
    v->evictions = -1;
    if (prev && prev->status && prev->seqs && cur->status &&
        prev->status->incarnation == cur->status->incarnation) {
        dt = cur->when - prev->when;
        v->evictions = top_rate(cur->status->evictions_total, prev->status->evictions_total, dt);
        n_before = prev->seqs->n_seqs;
    }
    v->seqs = calloc(n ? n : 1, sizeof(*v->seqs));
    v->models = calloc(n ? n : 1, sizeof(*v->models));
    if (n_before)
        before = malloc(n_before * sizeof(*before));
    if (!v->seqs || !v->models || (n_before && !before)) {
        free(before);
        vasectl_top_view_clear(v);
        return -ENOMEM;
    }
    for (size_t k = 0; k < n_before; k++)
        before[k] = prev->seqs->seqs[k];
    qsort(before, n_before, sizeof(*before), cmp_seq_id);

    for (size_t k = 0; k < n; k++) {
        const Vase__SeqInfo *i = cur->seqs->seqs[k];
        struct top_seq *s = &v->seqs[v->n_seqs++];
        const Vase__SeqInfo *const *p =
            n_before ? bsearch(&i, before, n_before, sizeof(*before), cmp_seq_id) : NULL;
        *s = (struct top_seq){.info = i, .evictions = -1, .stalls = -1};
        if (p) {
            s->evictions = top_rate(i->rounds, (*p)->rounds, dt);
            s->stalls = top_rate(i->stalls, (*p)->stalls, dt);
        }
        add_to_model(v, s);
    }
    free(before);
    qsort(v->models, v->n_models, sizeof(*v->models), cmp_model);
    return 0;
}

static int cmp_num(double x, double y) {
    return (x > y) - (x < y);
}

static int cmp_str(const char *x, const char *y) {
    return strcmp(x ? x : "", y ? y : "");
}

/* Compares two sequences by one column, in the column's natural (ascending) order. */
static int cmp_col(const struct top_seq *a, const struct top_seq *b, enum top_col col) {
    const Vase__SeqInfo *x = a->info, *y = b->info;
    switch (col) {
    case COL_ID:
        return cmp_num(x->seq_id, y->seq_id);
    case COL_CLIENT:
        return cmp_num(x->client_id, y->client_id);
    case COL_MODEL: {
        int c = cmp_str(x->model_name, y->model_name);
        return c ? c : cmp_num(x->model_id, y->model_id);
    }
    case COL_POLICY:
        return cmp_str(x->policy, y->policy);
    case COL_BUDGET:
        return cmp_num(x->budget, y->budget);
    case COL_LEN:
        return cmp_num(x->len, y->len);
    case COL_MEMORY:
        return cmp_num((double)x->bytes, (double)y->bytes);
    case COL_EVICT:
        return cmp_num(a->evictions, b->evictions);
    case COL_PLAN:
        return cmp_num(x->last_plan_seconds, y->last_plan_seconds);
    case COL_STALLS:
        return cmp_num(a->stalls, b->stalls);
    case COL_STATE:
    default:
        return cmp_str(x->state, y->state);
    }
}

/* The direction a column sorts in now: true when largest first. */
static bool top_descending(const struct top_ui *ui) {
    return top_cols[ui->sort].descending != ui->reverse;
}

static int cmp_seq(const void *a, const void *b, void *arg) {
    const struct top_ui *ui = arg;
    int c = cmp_col(a, b, ui->sort);
    if (top_descending(ui))
        c = -c;
    /* Equal rows keep one order from frame to frame. */
    return c ? c : cmp_col(a, b, COL_ID);
}

void vasectl_top_sort(struct top_view *v, const struct top_ui *ui) {
    qsort_r(v->seqs, v->n_seqs, sizeof(*v->seqs), cmp_seq, (void *)ui);
}

/* Applies a key of the live view to ui: s/S the next/previous column, r reverses, a column's
 * letter sorts by it. Returns whether the order changed. */
bool vasectl_top_key(struct top_ui *ui, int ch) {
    if (ch == 's' || ch == 'S') {
        ui->sort = (enum top_col)((ui->sort + (ch == 's' ? 1 : N_COLS - 1)) % N_COLS);
        ui->reverse = false;
        return true;
    }
    if (ch == 'r') {
        ui->reverse = !ui->reverse;
        return true;
    }
    for (int c = 0; c < N_COLS; c++)
        if (top_cols[c].key && top_cols[c].key == ch) {
            ui->sort = (enum top_col)c;
            ui->reverse = false;
            return true;
        }
    return false;
}

/* ---- rendering ---- */

/* A rate for people: "-" when not known, "2.5" below 100, then rounded like counts. */
static const char *fmt_rate(double r, char *buf, size_t size) {
    if (r < 0)
        snprintf(buf, size, "-");
    else if (r < 99.95)
        snprintf(buf, size, "%.1f", r);
    else
        vasectl_fmt_count((uint64_t)llround(r), buf, size);
    return buf;
}

static const char *col_name(enum top_col c) {
    return top_cols[c].header + (top_cols[c].header[0] == '>');
}

/* A model's label: its name, or "#ID" when it has none. */
static const char *model_name(const char *name, uint32_t id, char *buf, size_t size) {
    if (name && *name)
        vase_admin_escape(name, buf, size);
    else
        snprintf(buf, size, "#%" PRIu32, id);
    return buf;
}

static int add_arena(struct table *t, const Vase__ArenaStatus *a) {
    char b1[32], b2[32], b3[32], bar[16];
    double used =
        a->bytes_total ? (double)(a->bytes_total - a->bytes_free) / (double)a->bytes_total : 0;
    size_t filled = (size_t)llround(used * 10);
    int r;

    for (size_t k = 0; k < 10; k++)
        bar[k] = k < filled ? '#' : '.';
    bar[10] = 0;
    if ((r = vasectl_table_add(t, "%" PRIu32, a->id)) < 0 ||
        (r = vasectl_table_add(t, "%s", a->name)) < 0 ||
        (r = vasectl_table_add(t, "%s", a->kind)) < 0 ||
        (r = vasectl_table_add(t, "%s", vasectl_fmt_bytes(a->bytes_total, b1, sizeof(b1)))) < 0 ||
        (r = vasectl_table_add(t, "%s", vasectl_fmt_bytes(a->bytes_free, b2, sizeof(b2)))) < 0 ||
        (r = vasectl_table_add(t, "%s", vasectl_fmt_bytes(a->bytes_pages, b3, sizeof(b3)))) < 0)
        return r;
    return vasectl_table_add(t, "[%s] %5.1f%%", bar, used * 100);
}

static int add_client(struct table *t, const Vase__ClientInfo *c) {
    char name[4 * 256 + 1], b[32];
    int r;

    vase_admin_escape(c->name, name, sizeof(name));
    if ((r = vasectl_table_add(t, "%" PRIu32, c->client_id)) < 0 ||
        (r = vasectl_table_add(t, "%s", name)) < 0 ||
        (r = vasectl_table_add(t, "%s", c->state && *c->state ? c->state : "connected")) < 0 ||
        (r = vasectl_table_add(t, "%" PRIu32, c->pid)) < 0 ||
        (r = vasectl_table_add(t, "%" PRIu32, c->uid)) < 0 ||
        (r = vasectl_table_add(t, "%" PRIu32, c->seqs)) < 0)
        return r;
    return vasectl_table_add(t, "%s", vasectl_fmt_bytes(c->bytes, b, sizeof(b)));
}

static int add_model(struct table *t, const struct top_model *m) {
    char name[4 * 256 + 1], b[32], e[32];
    int r;

    if ((r = vasectl_table_add(t, "%s", model_name(m->name, m->model_id, name, sizeof(name)))) <
            0 ||
        (r = vasectl_table_add(t, "%" PRIu32, m->seqs)) < 0 ||
        (r = vasectl_table_add(t, "%s", vasectl_fmt_bytes(m->bytes, b, sizeof(b)))) < 0)
        return r;
    return vasectl_table_add(t, "%s", fmt_rate(m->evictions, e, sizeof(e)));
}

static int add_seq(struct table *t, const struct top_seq *s) {
    const Vase__SeqInfo *i = s->info;
    char name[4 * 256 + 1], b[32], e[32], p[32], st[32];
    int r;

    if ((r = vasectl_table_add(t, "%" PRIu32, i->seq_id)) < 0 ||
        (r = vasectl_table_add(t, "%" PRIu32, i->client_id)) < 0 ||
        (r = vasectl_table_add(t, "%s",
                               model_name(i->model_name, i->model_id, name, sizeof(name)))) < 0 ||
        (r = vasectl_table_add(t, "%s", i->policy)) < 0 ||
        (r = vasectl_table_add(t, "%" PRIu32, i->budget)) < 0 ||
        (r = vasectl_table_add(t, "%" PRIu32 "/%" PRIu32, i->len, i->capacity)) < 0 ||
        (r = vasectl_table_add(t, "%s", vasectl_fmt_bytes(i->bytes, b, sizeof(b)))) < 0 ||
        (r = vasectl_table_add(t, "%s", fmt_rate(s->evictions, e, sizeof(e)))) < 0 ||
        (r = vasectl_table_add(t, "%s", vasectl_fmt_ms(i->last_plan_seconds, p, sizeof(p)))) < 0 ||
        (r = vasectl_table_add(t, "%s", fmt_rate(s->stalls, st, sizeof(st)))) < 0)
        return r;
    return vasectl_table_add(t, "%s", i->state);
}

/* Prints t (or, when it has no rows, empty), then a blank line. shown rows of total were
 * added: the rest are counted on a line of their own. */
static void print_section(FILE *f, const struct table *t, const char *empty, size_t shown,
                          size_t total) {
    if (t->n)
        vasectl_table_fprint(f, t);
    else
        fprintf(f, "%s\n", empty);
    if (shown < total)
        fprintf(f, "(%zu more)\n", total - shown);
    fputc('\n', f);
}

/* How many of n rows a table of the client or model section shows. */
static size_t rows_of(const struct top_ui *ui, size_t n) {
    return ui->max_rows && n > ui->max_rows ? ui->max_rows : n;
}

/* Writes the frame of v to f as plain text. 0 or -ENOMEM. */
int vasectl_top_render(FILE *f, const struct top_view *v, const struct top_ui *ui) {
    const Vase__StatusReply *s = v->cur->status;
    const Vase__ClientsReply *cr = v->cur->clients;
    struct table arenas = {.ncols = 7,
                           .headers = {">ARENA", "NAME", "KIND", ">SIZE", ">FREE", ">IN PAGES",
                                       "USED"}},
                 clients = {.ncols = 7,
                            .headers = {">CLIENT", "NAME", "STATE", ">PID", ">UID", ">SEQS",
                                        ">MEMORY"}},
                 models = {.ncols = 4, .headers = {"MODEL", ">SEQS", ">MEMORY", ">EVICT/S"}},
                 seqs = {.ncols = N_COLS};
    char up[32], total[32], rate[32], iv[32];
    size_t n_clients = cr ? cr->n_clients : 0;
    int r = 0;

    for (int c = 0; c < N_COLS; c++)
        seqs.headers[c] = top_cols[c].header;
    snprintf(iv, sizeof(iv), "%g", ui->interval);
    /* The daemon's words reach a terminal: control characters escaped, as in the tables. */
    char text[1024], version[128];
    if (s) {
        vase_admin_escape(s->version, version, sizeof(version));
        fprintf(f,
                "vased %s, up %s, clients %" PRIu32 ", seqs %" PRIu32 ", opens waiting %" PRIu32
                ", evictions %s (%s/s)\n",
                version, vasectl_fmt_duration(s->uptime_seconds, up, sizeof(up)), s->clients,
                s->seqs, s->opens_waiting,
                vasectl_fmt_count(s->evictions_total, total, sizeof(total)),
                fmt_rate(v->evictions, rate, sizeof(rate)));
    }
    fprintf(f, "sorted by %s, %s; every %ss%s\n", col_name(ui->sort),
            top_descending(ui) ? "descending" : "ascending", iv,
            ui->keys ? "; keys: s/S column, r reverse, e p t m b l i c sort by, q quit" : "");
    if (ui->error) {
        vase_admin_escape(ui->error, text, sizeof(text));
        fprintf(f, "error: %s\n", text);
    }
    fputc('\n', f);
    if (!s)
        return 0;

    for (size_t k = 0; k < s->n_arenas && r == 0; k++)
        r = add_arena(&arenas, s->arenas[k]);
    for (size_t k = 0; k < rows_of(ui, n_clients) && r == 0; k++)
        r = add_client(&clients, cr->clients[k]);
    for (size_t k = 0; k < rows_of(ui, v->n_models) && r == 0; k++)
        r = add_model(&models, &v->models[k]);
    for (size_t k = 0; k < v->n_seqs && r == 0; k++)
        r = add_seq(&seqs, &v->seqs[k]);
    if (r == 0) {
        print_section(f, &arenas, "no arena is open to this uid", 0, 0);
        print_section(f, &clients, "no clients", rows_of(ui, n_clients), n_clients);
        if (v->n_models)
            print_section(f, &models, "", rows_of(ui, v->n_models), v->n_models);
        if (v->n_seqs)
            vasectl_table_fprint(f, &seqs);
        else
            fputs("no sequences\n", f);
    }
    vasectl_table_free(&arenas);
    vasectl_table_free(&clients);
    vasectl_table_free(&models);
    vasectl_table_free(&seqs);
    return r;
}

static void json_rate(FILE *f, const char *name, double r) {
    fprintf(f, ",\"%s\":", name);
    if (r < 0)
        fputs("null", f);
    else
        fprintf(f, "%.6g", r);
}

/* One sample as one JSON object on one line: the daemon's replies as they came, with the rates
 * and the models added. */
void vasectl_top_json(FILE *f, const struct top_view *v) {
    const struct top_sample *s = v->cur;

    fputs("{\"status\":{", f);
    vasectl_json_fields(f, &s->status->base, true);
    fputc('}', f);
    json_rate(f, "evictions_per_second", v->evictions);
    fputs(",\"clients\":[", f);
    for (size_t k = 0; k < s->clients->n_clients; k++) {
        fputs(k ? ",{" : "{", f);
        vasectl_json_fields(f, &s->clients->clients[k]->base, true);
        fputc('}', f);
    }
    fputs("],\"models\":[", f);
    for (size_t k = 0; k < v->n_models; k++) {
        const struct top_model *m = &v->models[k];
        fputs(k ? ",{\"model_name\":" : "{\"model_name\":", f);
        vasectl_json_string(f, m->name, strlen(m->name));
        fprintf(f, ",\"model_id\":%" PRIu32 ",\"seqs\":%" PRIu32 ",\"bytes\":%" PRIu64, m->model_id,
                m->seqs, m->bytes);
        json_rate(f, "evictions_per_second", m->evictions);
        fputc('}', f);
    }
    fputs("],\"seqs\":[", f);
    for (size_t k = 0; k < v->n_seqs; k++) {
        fputs(k ? ",{" : "{", f);
        vasectl_json_fields(f, &v->seqs[k].info->base, true);
        json_rate(f, "evictions_per_second", v->seqs[k].evictions);
        json_rate(f, "stalls_per_second", v->seqs[k].stalls);
        fputc('}', f);
    }
    fputs("]}\n", f);
}
