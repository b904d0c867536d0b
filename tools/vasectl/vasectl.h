/* SPDX-License-Identifier: MIT */
#pragma once

/* The pieces of vasectl shared by its files: JSON output (vasectl_json.c), the output for
 * people (vasectl_print.c), errors (vasectl.c) and the commands that show the daemon's answers
 * (vasectl_show.c). vasectl sees libvase only through its public headers. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "vase_admin.h"

/* Writes s (len bytes) as a JSON string: quotes, backslashes and control characters escaped,
 * invalid UTF-8 replaced by U+FFFD. */
void vasectl_json_string(FILE *f, const char *s, size_t len);
/* Writes m's fields as members of a JSON object ("name":value, ...), a comma first unless
 * first. */
void vasectl_json_fields(FILE *f, const ProtobufCMessage *m, bool first);
/* Writes m as one JSON object and a newline to stdout. */
void vasectl_json_line(const ProtobufCMessage *m);

#define VASECTL_MAX_COLS 20

/* Rows of formatted cells, printed with every column as wide as its widest cell. A header that
 * starts with '>' marks a right-aligned (numeric) column. */
struct table {
    size_t ncols;
    const char *headers[VASECTL_MAX_COLS];
    char **cells;
    size_t n, cap;
};

/* Adds the next cell, control characters replaced by '?'. 0 or -ENOMEM. */
int vasectl_table_add(struct table *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void vasectl_table_print(const struct table *t);
void vasectl_table_fprint(FILE *f, const struct table *t);
/* Frees the cells (not t). */
void vasectl_table_free(struct table *t);

/* "512 B", "1.5 GiB"; "3d 04h 05m", "1.5s"; counts exact below 10000, then "12.3k", "4.6M",
 * "7.0G", "1.2T"; seconds as milliseconds with three significant digits, "0.123 ms", "12.3 ms",
 * "123 ms", "1234 ms": into buf, which is returned. */
const char *vasectl_fmt_bytes(uint64_t b, char *buf, size_t size);
const char *vasectl_fmt_duration(double s, char *buf, size_t size);
const char *vasectl_fmt_count(uint64_t n, char *buf, size_t size);
const char *vasectl_fmt_ms(double s, char *buf, size_t size);
/* "sync" or "async". */
const char *vasectl_mode_name(Vase__Mode m);

/* The widest label a table shows (vasectl_fmt_label()). */
#define VASECTL_LABEL_WIDTH 24
/* A sequence's label (SeqInfo.label, at most 64 bytes) for a table cell: "-" when it has none;
 * one longer than VASECTL_LABEL_WIDTH keeps its first 10 and last 11 bytes around "...", since
 * request ids tend to differ at either end (a random middle, a counter at the end). Escaped
 * (vase_admin_escape()): the daemon's rule keeps labels to plain ASCII, but vasectl may talk to
 * another daemon. Into buf (size bytes, at least VASECTL_LABEL_WIDTH * 4 + 1), which is
 * returned. */
const char *vasectl_fmt_label(const char *label, char *buf, size_t size);

/* Reports an error on stderr: a "vasectl: " line, or under --json one JSON object (vasectl.c).
 * Returns -abs(error), so that callers can return it. */
int vasectl_fail(int error, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Reports failed call what (vasectl_fail()): the daemon's own words when it gave some. Returns
 * -abs(r). */
int vasectl_report(struct vase_admin *a, const char *what, int r);

/*
 * The commands that show what the daemon says (vasectl_show.c): `status`, `clients`, `seqs
 * [CLIENT_ID]` (0: every client's), `seq ID`, `config get [KEY]` (NULL: every setting), as
 * tables for people or, with json, one JSON document. 0, or -errno after reporting it.
 */
int vasectl_show_status(struct vase_admin *a, bool json);
int vasectl_show_clients(struct vase_admin *a, bool json);
int vasectl_show_seqs(struct vase_admin *a, uint32_t client_id, bool json);
int vasectl_show_seq(struct vase_admin *a, uint32_t id, bool json);
int vasectl_show_config(struct vase_admin *a, const char *key, bool json);

/* One event: a JSON object with its topic first, or a line for people. */
void vasectl_print_event(const char *topic, const Vase__Event *ev, bool json);

/*
 * `vasectl size KEY=VALUE...` (vasectl_size.c): prints what one sequence of the geometry and
 * parameters the words give costs, and how many fit an arena; no daemon involved. 0, or -errno
 * with the reason in err (err_size bytes).
 */
int vasectl_size(char **words, int n, bool json, char *err, size_t err_size);

/* ---- vasectl top (vasectl_top.c) ---- */

struct vasectl_top_options {
    /* How to reach the daemon again after it went away (the live view reconnects). */
    struct vase_admin_options admin;
    double interval;      /* seconds between two samples */
    long long iterations; /* samples to take; -1: until 'q' in a terminal, else 2 */
    bool json;            /* one JSON object per sample, never the live view */
};

/*
 * Runs `vasectl top` on *a, a connected handle: the live view when stdout is a terminal (and
 * not json), else one plain text (or JSON) snapshot per sample. The live view replaces *a with
 * a new handle when the daemon went away and answers again; *a stays the caller's to free.
 * 0, or -errno with the reason in err (err_size bytes): a failed request outside the live view
 * (which shows the error and retries), the terminal, -ENOMEM.
 */
int vasectl_top(struct vase_admin **a, const struct vasectl_top_options *o, char *err,
                size_t err_size);
