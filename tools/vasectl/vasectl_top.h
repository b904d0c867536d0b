/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * What the two halves of `vasectl top` share: the samples vasectl_top.c takes of the daemon and
 * the view vasectl_top_view.c computes and renders from them (rates, models, sorting, the plain
 * frame and the JSON line), pure functions of samples in memory.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "vase_admin.h"

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

/*
 * Builds the view of cur, with the rates against prev (NULL, or a sample without replies:
 * none). The view borrows cur's replies. 0, or -ENOMEM (v is then empty).
 */
int vasectl_top_view_build(struct top_view *v, const struct top_sample *prev,
                           const struct top_sample *cur);
/* Frees what the view holds (not the samples) and empties it. */
void vasectl_top_view_clear(struct top_view *v);
/* Orders the sequences of v by ui's column and direction. */
void vasectl_top_sort(struct top_view *v, const struct top_ui *ui);
/* Applies a key of the live view to ui: s/S the next/previous column, r reverses, a column's
 * letter sorts by it. Returns whether the order changed. */
bool vasectl_top_key(struct top_ui *ui, int ch);
/* Writes the frame of v to f as plain text. 0 or -ENOMEM. */
int vasectl_top_render(FILE *f, const struct top_view *v, const struct top_ui *ui);
/* One sample as one JSON object on one line: the daemon's replies as they came, with the rates
 * and the models added. */
void vasectl_top_json(FILE *f, const struct top_view *v);
