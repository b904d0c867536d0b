/* SPDX-License-Identifier: MIT */

/*
 * vasectl top: a live view of a daemon, built from samples of Status, ListClients and ListSeqs
 * taken one interval apart. Rates (evictions and stalls per second, of the daemon and of each
 * sequence) are the differences of the counters of two samples divided by the time between
 * them; a sequence seen once, or a daemon that restarted between the two (another
 * incarnation), has none yet ("-"). Each frame is rendered as plain text into memory first;
 * the live view then cuts it to the terminal's size and draws it on the alternate screen with
 * ANSI escape sequences, and the plain output writes it as it is. The pure parts (rates,
 * sorting, rendering) work on samples in memory, so that tests run them on fixed samples.
 *
 * The terminal: stdin in non-canonical mode without echo (signals stay on, so Ctrl-C is a
 * SIGINT), the alternate screen, the cursor hidden; all restored before vasectl_top() returns,
 * whatever ended the view ('q', SIGINT, SIGTERM, SIGHUP, an error).
 */

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "vase.h"
#include "vase_admin.h"
#include "vasectl.h"

/* One sample of the daemon: the three replies and when they came (CLOCK_MONOTONIC). */
struct top_sample {
    double when;
    Vase__StatusReply *status;
    Vase__ClientsReply *clients;
    Vase__SeqsReply *seqs;
};

/* The columns of the sequence table, each one a sort key. */
enum top_col {
    COL_ID,
    COL_CLIENT,
    COL_MODEL,
    COL_POLICY,
    COL_BUDGET,
    COL_LEN,
    COL_MEMORY,
    COL_EVICT,
    COL_PLAN,
    COL_STALLS,
    COL_STATE,
    N_COLS,
};

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

/* A sequence of the current sample with its rates; < 0: not known yet. */
struct top_seq {
    const Vase__SeqInfo *info; /* borrowed from the sample */
    double evictions;
    double stalls;
};

/* The sequences of one model, by name (or by id when it has none). */
struct top_model {
    const char *name; /* borrowed from the sample; "" when it has none */
    uint32_t model_id;
    uint32_t seqs;
    uint64_t bytes;
    double evictions; /* < 0: not known for any of its sequences */
};

/* What a frame shows: the current sample and what was computed from it and the one before. */
struct top_view {
    const struct top_sample *cur;
    double evictions; /* the daemon's per second; < 0: not known yet */
    struct top_seq *seqs;
    size_t n_seqs;
    struct top_model *models;
    size_t n_models;
};

/* How a frame is drawn. */
struct top_ui {
    enum top_col sort;
    bool reverse;      /* against the column's first direction */
    size_t max_rows;   /* rows of the client and model tables; 0: all */
    bool keys;         /* the live view's line of keys */
    double interval;   /* seconds */
    const char *error; /* why the last sample failed, or NULL */
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

static void top_view_clear(struct top_view *v) {
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
static int top_view_build(struct top_view *v, const struct top_sample *prev,
                          const struct top_sample *cur) {
    const Vase__SeqInfo **before = NULL;
    size_t n = cur->seqs ? cur->seqs->n_seqs : 0, n_before = 0;
    double dt = -1;

    top_view_clear(v);
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
        top_view_clear(v);
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

static void top_sort(struct top_view *v, const struct top_ui *ui) {
    qsort_r(v->seqs, v->n_seqs, sizeof(*v->seqs), cmp_seq, (void *)ui);
}

/* Applies a key of the live view to ui: s/S the next/previous column, r reverses, a column's
 * letter sorts by it. Returns whether the order changed. */
static bool top_key(struct top_ui *ui, int ch) {
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
static int top_render(FILE *f, const struct top_view *v, const struct top_ui *ui) {
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
static void top_json(FILE *f, const struct top_view *v) {
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

/* ---- samples ---- */

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sample_clear(struct top_sample *s) {
    if (s->status)
        protobuf_c_message_free_unpacked(&s->status->base, NULL);
    if (s->clients)
        protobuf_c_message_free_unpacked(&s->clients->base, NULL);
    if (s->seqs)
        protobuf_c_message_free_unpacked(&s->seqs->base, NULL);
    *s = (struct top_sample){0};
}

/* Why request what failed with r, in err: the daemon's words when it gave some. Returns r. */
static int describe(struct vase_admin *a, const char *what, int r, char *err, size_t size) {
    const char *why = vase_admin_last_error(a);

    if (r == -ETIMEDOUT)
        snprintf(err, size, "cannot reach vased at %s: no reply within %d ms", vase_admin_path(a),
                 vase_admin_timeout(a));
    else if (*why)
        snprintf(err, size, "%s: %s (%s)", what, why, vase_strerror(r));
    else
        snprintf(err, size, "%s: %s", what, vase_strerror(r));
    return r;
}

/* Takes a sample into *ret (cleared first). 0, or -errno with the reason in err. */
static int sample_take(struct vase_admin *a, struct top_sample *ret, char *err, size_t size) {
    struct top_sample s = {0};
    int r;

    sample_clear(ret);
    if ((r = vase_admin_status(a, &s.status)) < 0)
        return describe(a, "status", r, err, size);
    if ((r = vase_admin_clients(a, &s.clients)) < 0) {
        sample_clear(&s);
        return describe(a, "clients", r, err, size);
    }
    if ((r = vase_admin_seqs(a, 0, &s.seqs)) < 0) {
        sample_clear(&s);
        return describe(a, "seqs", r, err, size);
    }
    s.when = now_seconds();
    *ret = s;
    return 0;
}

/* ---- plain output ---- */

static int run_plain(struct vase_admin *a, const struct vasectl_top_options *o, char *err,
                     size_t size) {
    struct top_sample samples[2] = {{.when = 0}, {.when = 0}};
    struct top_view v = {0};
    struct top_ui ui = {.sort = COL_EVICT, .interval = o->interval};
    long long n = o->iterations >= 0 ? o->iterations : 2;
    int r = 0;

    for (long long k = 0; k < n; k++) {
        struct top_sample *cur = &samples[k % 2], *prev = &samples[(k + 1) % 2];
        if (k > 0) {
            double t = o->interval;
            struct timespec ts = {.tv_sec = (time_t)t, .tv_nsec = (long)((t - floor(t)) * 1e9)};
            while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
                ;
        }
        if ((r = sample_take(a, cur, err, size)) < 0)
            break;
        if ((r = top_view_build(&v, k > 0 ? prev : NULL, cur)) < 0) {
            snprintf(err, size, "top: %s", vase_strerror(r));
            break;
        }
        top_sort(&v, &ui);
        if (o->json)
            top_json(stdout, &v);
        else {
            if (k > 0)
                putchar('\n');
            if ((r = top_render(stdout, &v, &ui)) < 0) {
                snprintf(err, size, "top: %s", vase_strerror(r));
                break;
            }
        }
        fflush(stdout);
    }
    top_view_clear(&v);
    sample_clear(&samples[0]);
    sample_clear(&samples[1]);
    return r;
}

/* ---- the live view ---- */

static volatile sig_atomic_t got_quit, got_winch;

static void on_quit(int sig) {
    (void)sig;
    got_quit = 1;
}

static void on_winch(int sig) {
    (void)sig;
    got_winch = 1;
}

/* The terminal as it was, to put back. */
struct term {
    bool raw;
    struct termios saved;
    struct sigaction old[4];
    sigset_t old_mask;
};

static const int term_signals[4] = {SIGINT, SIGTERM, SIGHUP, SIGWINCH};

static int term_enter(struct term *t) {
    sigset_t block;

    sigemptyset(&block);
    for (int k = 0; k < 4; k++) {
        struct sigaction sa = {.sa_handler = term_signals[k] == SIGWINCH ? on_winch : on_quit};
        sigemptyset(&sa.sa_mask);
        sigaction(term_signals[k], &sa, &t->old[k]);
        sigaddset(&block, term_signals[k]);
    }
    /* Delivered only inside ppoll(), so that none is lost between a check and the wait. */
    sigprocmask(SIG_BLOCK, &block, &t->old_mask);
    got_quit = got_winch = 0;

    if (isatty(STDIN_FILENO)) {
        struct termios raw;
        if (tcgetattr(STDIN_FILENO, &t->saved) < 0)
            return -errno;
        raw = t->saved;
        raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
        raw.c_cc[VMIN] = 0;
        raw.c_cc[VTIME] = 0;
        if (tcsetattr(STDIN_FILENO, TCSAFLUSH, &raw) < 0)
            return -errno;
        t->raw = true;
    }
    /* The alternate screen, the cursor hidden, the screen cleared. */
    fputs("\x1b[?1049h\x1b[?25l\x1b[H\x1b[2J", stdout);
    fflush(stdout);
    return 0;
}

static void term_leave(struct term *t) {
    fputs("\x1b[?25h\x1b[?1049l", stdout);
    fflush(stdout);
    if (t->raw)
        tcsetattr(STDIN_FILENO, TCSAFLUSH, &t->saved);
    for (int k = 0; k < 4; k++)
        sigaction(term_signals[k], &t->old[k], NULL);
    sigprocmask(SIG_SETMASK, &t->old_mask, NULL);
}

static void term_size(unsigned *rows, unsigned *cols) {
    struct winsize ws;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row && ws.ws_col) {
        *rows = ws.ws_row;
        *cols = ws.ws_col;
    } else {
        *rows = 24;
        *cols = 80;
    }
}

/* The bytes of the first cols columns of line (len bytes): UTF-8 continuation bytes take
 * none. */
static size_t top_cut(const char *line, size_t len, unsigned cols) {
    size_t k = 0;
    unsigned used = 0;
    for (; k < len; k++) {
        if (((unsigned char)line[k] & 0xc0) == 0x80)
            continue;
        if (used == cols)
            break;
        used++;
    }
    return k;
}

/* Draws text, lines cut to the terminal's size, over the screen from its top left corner. */
static void draw(const char *text, unsigned rows, unsigned cols) {
    const char *p = text;
    unsigned row = 0;

    fputs("\x1b[H", stdout);
    while (*p && row < rows) {
        size_t len = strcspn(p, "\n");
        fputs("\x1b[2K", stdout);
        fwrite(p, 1, top_cut(p, len, cols), stdout);
        p += len + (p[len] == '\n');
        if (++row < rows)
            fputs("\r\n", stdout);
    }
    if (row < rows)
        fputs("\x1b[J", stdout);
    fflush(stdout);
}

/* Renders v and draws it. 0 or -ENOMEM. */
static int redraw(const struct top_view *v, struct top_ui *ui) {
    char *text = NULL;
    size_t len = 0;
    unsigned rows, cols;
    FILE *f = open_memstream(&text, &len);
    int r;

    if (!f)
        return -ENOMEM;
    term_size(&rows, &cols);
    /* The clients and models leave at least half the screen to the sequences. */
    ui->max_rows = rows / 4 > 2 ? rows / 4 - 2 : 1;
    r = top_render(f, v, ui);
    if (fclose(f) != 0 && r == 0)
        r = -ENOMEM;
    if (r == 0)
        draw(text, rows, cols);
    free(text);
    return r;
}

/* A sample for the live view, reconnecting first when the last one failed (*a NULL). */
static int live_sample(struct vase_admin **a, const struct vasectl_top_options *o,
                       struct top_sample *s, char *err, size_t size) {
    int r;

    if (!*a) {
        if ((r = vase_admin_new(&o->admin, a)) < 0) {
            snprintf(err, size, "top: %s", vase_strerror(r));
            return r;
        }
        if ((r = vase_admin_connect(*a)) < 0) {
            snprintf(err, size, "cannot reach vased at %s: %s", vase_admin_path(*a),
                     vase_strerror(r));
            *a = vase_admin_free(*a);
            return r;
        }
    }
    r = sample_take(*a, s, err, size);
    /* A fresh connection next time: the daemon may come back as another process. */
    if (r < 0)
        *a = vase_admin_free(*a);
    return r;
}

/* The live view between two frames: the last two samples, the view of the newer, how it is
 * drawn, the terminal to put back. */
struct live {
    struct top_sample samples[2], *cur, *prev;
    struct top_view v;
    struct top_ui ui;
    struct term t;
    char why[1024]; /* why the last sample failed; "" if it did not */
    long long taken;
    double next; /* when the next sample is due */
};

/* What live_tick() returns when the samples asked for are all taken. */
#define LIVE_DONE 2

/* Takes the sample that is due, if one is, and builds its view. 1: the frame changed, 0: no
 * sample was due, LIVE_DONE, or -ENOMEM. A sample that failed shows as the frame's error. */
static int live_tick(struct live *l, struct vase_admin **a, const struct vasectl_top_options *o) {
    double t0 = now_seconds();
    struct top_sample s = {0};

    if (t0 < l->next)
        return 0;
    if (o->iterations >= 0 && l->taken >= o->iterations)
        return LIVE_DONE;
    if (live_sample(a, o, &s, l->why, sizeof(l->why)) == 0) {
        sample_clear(l->prev);
        *l->prev = *l->cur;
        *l->cur = s;
        l->why[0] = 0;
        int r = top_view_build(&l->v, l->prev, l->cur);
        if (r < 0)
            return r;
    }
    l->ui.error = l->why[0] ? l->why : NULL;
    l->taken++;
    l->next += o->interval;
    if (l->next < t0)
        l->next = t0 + o->interval;
    return 1;
}

/* Reads the keys pressed and applies them to ui; 'q', or input that ended, sets got_quit.
 * Returns whether the order changed (and the view goes on). */
static bool live_keys(struct top_ui *ui) {
    char keys[64];
    ssize_t n = read(STDIN_FILENO, keys, sizeof(keys));
    bool changed = false;

    if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN))
        got_quit = 1; /* end of input: nobody can press 'q' any more */
    for (ssize_t j = 0; j < n; j++) {
        if (keys[j] == 'q')
            got_quit = 1;
        else
            changed |= top_key(ui, keys[j]);
    }
    return changed && !got_quit;
}

/* Waits until the next sample is due, a key is pressed or a signal comes. Returns whether a key
 * changed the order. */
static bool live_wait(struct live *l) {
    double wait = l->next - now_seconds();
    if (wait < 0)
        wait = 0;
    struct timespec ts = {.tv_sec = (time_t)wait, .tv_nsec = (long)((wait - floor(wait)) * 1e9)};
    struct pollfd pfd = {.fd = STDIN_FILENO, .events = POLLIN};
    int k = ppoll(&pfd, l->t.raw ? 1 : 0, &ts, &l->t.old_mask);

    if (k > 0 && (pfd.revents & (POLLHUP | POLLERR | POLLNVAL))) {
        got_quit = 1; /* the terminal is gone */
        return false;
    }
    return k > 0 && (pfd.revents & POLLIN) && live_keys(&l->ui);
}

/* Sorts the view as ui says and draws it. 0 or -ENOMEM. */
static int live_redraw(struct live *l) {
    top_sort(&l->v, &l->ui);
    return redraw(&l->v, &l->ui);
}

static int run_live(struct vase_admin **a, const struct vasectl_top_options *o, char *err,
                    size_t size) {
    struct live l = {
        .ui = {.sort = COL_EVICT, .interval = o->interval, .keys = true},
        .next = now_seconds(),
    };
    int r;

    l.cur = &l.samples[0];
    l.prev = &l.samples[1];
    l.v.cur = l.cur;
    if ((r = term_enter(&l.t)) < 0) {
        term_leave(&l.t);
        snprintf(err, size, "top: cannot set up the terminal: %s", strerror(-r));
        return r;
    }
    while (!got_quit && r == 0) {
        int due = live_tick(&l, a, o);
        if (due == LIVE_DONE)
            break;
        if (due < 0) {
            r = due;
            break;
        }
        if (got_winch) {
            got_winch = 0;
            due = 1;
        }
        if (due)
            r = live_redraw(&l);
        if (r == 0 && live_wait(&l))
            r = live_redraw(&l);
    }
    term_leave(&l.t);
    if (r < 0)
        snprintf(err, size, "top: %s", vase_strerror(r));
    top_view_clear(&l.v);
    sample_clear(&l.samples[0]);
    sample_clear(&l.samples[1]);
    return r;
}

int vasectl_top(struct vase_admin **a, const struct vasectl_top_options *o, char *err,
                size_t err_size) {
    if (!o->json && isatty(STDOUT_FILENO))
        return run_live(a, o, err, err_size);
    return run_plain(*a, o, err, err_size);
}
