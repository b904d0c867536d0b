/* SPDX-License-Identifier: MIT */

/*
 * vasectl's output for people: aligned tables, byte counts and durations, and one line per
 * event. Every cell and name that a client chose is escaped before it reaches the terminal.
 */

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vasectl.h"

int vasectl_table_add(struct table *t, const char *fmt, ...) {
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        char **cells = realloc(t->cells, cap * sizeof(*cells));
        if (!cells)
            return -ENOMEM;
        t->cells = cells;
        t->cap = cap;
    }
    va_list ap;
    va_start(ap, fmt);
    int r = vasprintf(&t->cells[t->n], fmt, ap);
    va_end(ap);
    if (r < 0)
        return -ENOMEM;
    /* Names come from clients: control and format characters reach the terminal escaped
     * (vase_admin_escape(); escaping a name escaped already changes nothing). An escape takes
     * at most four bytes for each byte it replaces. */
    char *cell = t->cells[t->n];
    size_t len = strlen(cell);
    char *clean = malloc(4 * len + 1);
    if (!clean) {
        free(cell);
        return -ENOMEM;
    }
    vase_admin_escape(cell, clean, 4 * len + 1);
    free(cell);
    t->cells[t->n++] = clean;
    return 0;
}

void vasectl_table_print(const struct table *t) {
    vasectl_table_fprint(stdout, t);
}

void vasectl_table_fprint(FILE *f, const struct table *t) {
    size_t width[VASECTL_MAX_COLS] = {0};
    for (size_t c = 0; c < t->ncols; c++)
        width[c] = strlen(t->headers[c] + (t->headers[c][0] == '>'));
    for (size_t i = 0; i < t->n; i++) {
        size_t w = strlen(t->cells[i]);
        if (w > width[i % t->ncols])
            width[i % t->ncols] = w;
    }
    for (size_t row = 0; row <= t->n / t->ncols; row++) {
        if (row > 0 && (row - 1) * t->ncols >= t->n)
            break;
        for (size_t c = 0; c < t->ncols; c++) {
            const char *h = t->headers[c];
            bool right = h[0] == '>';
            const char *s = row == 0 ? h + right : t->cells[(row - 1) * t->ncols + c];
            bool last = c + 1 == t->ncols;
            if (right)
                fprintf(f, "%*s%s", (int)width[c], s, last ? "" : "  ");
            else if (last)
                fputs(s, f);
            else
                fprintf(f, "%-*s  ", (int)width[c], s);
        }
        fputc('\n', f);
    }
}

void vasectl_table_free(struct table *t) {
    for (size_t i = 0; i < t->n; i++)
        free(t->cells[i]);
    free(t->cells);
}

const char *vasectl_fmt_bytes(uint64_t b, char *buf, size_t size) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    unsigned u = 0;
    while (v >= 1024 && u + 1 < sizeof(units) / sizeof(units[0])) {
        v /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, size, "%" PRIu64 " B", b);
    else
        snprintf(buf, size, "%.1f %s", v, units[u]);
    return buf;
}

const char *vasectl_fmt_duration(double s, char *buf, size_t size) {
    if (!(s >= 0))
        s = 0;
    uint64_t t = (uint64_t)s;
    if (t >= 86400)
        snprintf(buf, size, "%" PRIu64 "d %02" PRIu64 "h %02" PRIu64 "m", t / 86400,
                 t % 86400 / 3600, t % 3600 / 60);
    else if (t >= 3600)
        snprintf(buf, size, "%" PRIu64 "h %02" PRIu64 "m %02" PRIu64 "s", t / 3600, t % 3600 / 60,
                 t % 60);
    else if (t >= 60)
        snprintf(buf, size, "%" PRIu64 "m %02" PRIu64 "s", t / 60, t % 60);
    else
        snprintf(buf, size, "%.1fs", s);
    return buf;
}

const char *vasectl_fmt_count(uint64_t n, char *buf, size_t size) {
    static const char *const units[] = {"", "k", "M", "G", "T", "P", "E"};
    if (n < 10000) {
        snprintf(buf, size, "%" PRIu64, n);
        return buf;
    }
    double v = (double)n;
    unsigned u = 0;
    /* 999950 would print as "1000.0k": such a value moves up a unit. */
    while (v >= 999.95 && u + 1 < sizeof(units) / sizeof(units[0])) {
        v /= 1000;
        u++;
    }
    snprintf(buf, size, "%.1f%s", v, units[u]);
    return buf;
}

const char *vasectl_fmt_ms(double s, char *buf, size_t size) {
    double ms = s >= 0 ? s * 1e3 : 0;
    /* Rounded first, so that 9.996 ms prints "10.0 ms", not "10.00 ms". */
    if (round(ms * 1000) / 1000 < 1)
        snprintf(buf, size, "%.3f ms", ms);
    else if (round(ms * 100) / 100 < 10)
        snprintf(buf, size, "%.2f ms", ms);
    else if (round(ms * 10) / 10 < 100)
        snprintf(buf, size, "%.1f ms", ms);
    else
        snprintf(buf, size, "%.0f ms", ms);
    return buf;
}

const char *vasectl_mode_name(Vase__Mode m) {
    return m == VASE__MODE__MODE_SYNC ? "sync" : "async";
}

const char *vasectl_fmt_label(const char *label, char *buf, size_t size) {
    enum { HEAD = 10, TAIL = VASECTL_LABEL_WIDTH - HEAD - 3 };
    char cut[VASECTL_LABEL_WIDTH + 1];
    size_t len = label ? strlen(label) : 0;
    if (len == 0)
        label = "-";
    else if (len > VASECTL_LABEL_WIDTH) {
        snprintf(cut, sizeof(cut), "%.*s...%s", HEAD, label, label + len - TAIL);
        label = cut;
    }
    vase_admin_escape(label, buf, size);
    return buf;
}

/* Ends an event's line: " label L" (whole, escaped) for a sequence that has one. */
static void print_label(const char *label) {
    char clean[4 * 64 + 1];
    if (label && *label) {
        vase_admin_escape(label, clean, sizeof(clean));
        printf(" label %s", clean);
    }
    putchar('\n');
}

void vasectl_print_event(const char *topic, const Vase__Event *ev, bool json) {
    if (json) {
        /* The Event's own fields, after the topic it came under. */
        fputs("{\"topic\":", stdout);
        vasectl_json_string(stdout, topic, strlen(topic));
        vasectl_json_fields(stdout, &ev->base, false);
        fputs("}\n", stdout);
        return;
    }

    char when[64];
    time_t secs = (time_t)ev->time;
    struct tm tm;
    if (localtime_r(&secs, &tm))
        strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
    else
        snprintf(when, sizeof(when), "%.3f", ev->time);
    printf("%s.%03d  %-8s ", when, (int)((ev->time - floor(ev->time)) * 1000), topic);

    switch (ev->body_case) {
    case VASE__EVENT__BODY_CLIENT_JOIN:
    case VASE__EVENT__BODY_CLIENT_LEAVE: {
        const Vase__ClientInfo *c =
            ev->body_case == VASE__EVENT__BODY_CLIENT_JOIN ? ev->client_join : ev->client_leave;
        char name[4 * 256 + 1];
        vase_admin_escape(c->name, name, sizeof(name));
        printf("%s client %" PRIu32 " '%s'",
               ev->body_case == VASE__EVENT__BODY_CLIENT_JOIN ? "join " : "leave", c->client_id,
               name);
        printf(" pid %" PRIu32 " uid %" PRIu32 " bytes %" PRIu64 "\n", c->pid, c->uid, c->bytes);
        break;
    }
    case VASE__EVENT__BODY_SEQ_OPEN:
    case VASE__EVENT__BODY_SEQ_CLOSE: {
        const Vase__SeqInfo *s =
            ev->body_case == VASE__EVENT__BODY_SEQ_OPEN ? ev->seq_open : ev->seq_close;
        printf("%s seq %" PRIu32 " client %" PRIu32 " %s %s budget %" PRIu32 " window %" PRIu32
               " pages %" PRIu32 " bytes %" PRIu64 " rounds %" PRIu32,
               ev->body_case == VASE__EVENT__BODY_SEQ_OPEN ? "open " : "close", s->seq_id,
               s->client_id, s->policy, vasectl_mode_name(s->mode), s->budget, s->window, s->pages,
               s->bytes, s->rounds);
        print_label(s->label);
        break;
    }
    case VASE__EVENT__BODY_EVICTION: {
        const Vase__EvictPlan *p = ev->eviction;
        printf("seq %" PRIu32 " round %" PRIu32 " len %" PRIu32 " candidates %" PRIu32
               " keep %" PRIu32 " plan %.3f ms\n",
               p->seq_id, p->round, p->len, p->n, p->keep, p->plan_seconds * 1e3);
        break;
    }
    case VASE__EVENT__BODY_BUDGET_CHANGE: {
        const Vase__BudgetChange *b = ev->budget_change;
        char reason[4 * 32 + 1];
        vase_admin_escape(b->reason, reason, sizeof(reason));
        printf("seq %" PRIu32 " client %" PRIu32 " budget %" PRIu32 " -> %" PRIu32
               " (%s) at round %" PRIu32,
               b->seq_id, b->client_id, b->old_budget, b->new_budget, reason, b->round);
        print_label(b->label);
        break;
    }
    case VASE__EVENT__BODY_PRESSURE: {
        const Vase__ArenaStatus *a = ev->pressure;
        printf("arena %" PRIu32 " \"%s\" (%s) %" PRIu64 " of %" PRIu64 " bytes free\n", a->id,
               a->name, a->kind, a->bytes_free, a->bytes_total);
        break;
    }
    default:
        printf("(event without a body)\n");
        break;
    }
}
