/* SPDX-License-Identifier: MIT */

/*
 * What loadgen reports of its runs: each mode's summary (outcomes, admission waits, throughput,
 * the arena's occupancy, the budgets the sequences ran with, and whether the run is consistent),
 * its CSV files (the sampler's series, one row per sequence), and the Markdown table that
 * compares the modes, on stdout and in --out.
 */

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loadgen.h"

static const char *const outcome_names[] = {"none", "admitted", "enospc", "refused", "generator"};

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

/* The q-quantile (nearest rank) of n values, sorted in place; NAN for none. */
static double quantile(double *v, size_t n, double q) {
    if (n == 0)
        return NAN;
    qsort(v, n, sizeof(*v), cmp_double);
    size_t k = (size_t)ceil(q * (double)n);
    return v[k > 0 ? k - 1 : 0];
}

/* Counts one sequence's record into s; its admission wait goes to waits and its mean budget
 * fraction to fracs (each NULL when it could not be allocated). */
static void count_rec(const struct seq_rec *r, struct summary *s, double *waits, double *fracs,
                      size_t *n_fracs) {
    switch (r->outcome) {
    case OUT_ADMITTED:
        s->admitted++;
        if (waits)
            waits[s->admitted - 1] = (r->admitted_s - r->open_s) * 1e3;
        s->failed += r->failed;
        s->unfinished += r->tokens != r->a->length;
        s->tokens += r->tokens;
        if (r->closed_s > s->last_close)
            s->last_close = r->closed_s;
        if (fracs && r->tokens > 0)
            fracs[(*n_fracs)++] = r->budget_mean / r->budget;
        if ((double)r->budget_min / r->budget < s->frac_lowest)
            s->frac_lowest = (double)r->budget_min / r->budget;
        break;
    case OUT_ENOSPC:
        s->enospc++;
        s->roomy += r->roomy;
        s->fit_free += r->fit_free;
        break;
    case OUT_REFUSED:
        s->refused++;
        break;
    case OUT_GENERATOR:
        s->generator++;
        break;
    case OUT_NONE:
        break;
    }
}

/* The first arrival finds the arena empty, so some sequence is always admitted; a refusal other
 * than ENOSPC (a quota, an invalid configuration) is a failure of the run. */
static bool consistent(const struct summary *s) {
    return s->admitted + s->enospc + s->refused + s->generator == s->arrived &&
           (s->admitted > 0 || s->arrived == 0) && s->refused == 0 && s->failed == 0 &&
           (stop_requested || s->unfinished == 0);
}

/* The quantiles of the admission waits and of the budget fractions (NAN where none). */
static void summarize_quantiles(struct summary *s, double *waits, double *fracs, size_t n_fracs) {
    s->wait_max = waits && s->admitted ? quantile(waits, s->admitted, 1.0) : NAN;
    s->wait_p50 = waits ? quantile(waits, s->admitted, 0.5) : NAN;
    s->wait_p99 = waits ? quantile(waits, s->admitted, 0.99) : NAN;
    s->frac_mean = 0;
    for (size_t i = 0; i < n_fracs; i++)
        s->frac_mean += fracs[i] / (double)n_fracs;
    s->frac_p10 = fracs ? quantile(fracs, n_fracs, 0.1) : NAN;
    s->frac_min = fracs && n_fracs ? quantile(fracs, n_fracs, 0) : NAN;
}

/* What the sampler saw: the arena's occupancy while arrivals came, the most sequences running
 * and shrunk at once, and the daemon's budget changes over the run. */
static void summarize_samples(const struct mode_run *m, struct summary *s) {
    size_t n_window = 0;

    for (size_t i = 0; i < m->n_samples; i++) {
        const struct sample *x = &m->samples[i];
        double occ = x->bytes_total ? (double)x->bytes_pages / (double)x->bytes_total : 0;

        if (x->running > s->running_max)
            s->running_max = x->running;
        if (x->seqs_shrunk > s->shrunk_max)
            s->shrunk_max = x->seqs_shrunk;
        if (x->t > arg_duration)
            continue;
        s->occupancy_mean += occ;
        n_window++;
        if (occ > s->occupancy_max)
            s->occupancy_max = occ;
    }
    if (n_window)
        s->occupancy_mean /= (double)n_window;
    if (m->n_samples) {
        s->shrinks = m->samples[m->n_samples - 1].shrinks - m->samples[0].shrinks;
        s->grows = m->samples[m->n_samples - 1].grows - m->samples[0].grows;
    }
}

void summarize(struct mode_run *m, uint64_t window_tokens, struct summary *ret) {
    struct summary s = {.arrived = m->n, .frac_lowest = 1};
    double *waits = calloc(m->n + 1, sizeof(double)), *fracs = calloc(m->n + 1, sizeof(double));
    size_t n_fracs = 0;

    for (size_t i = 0; i < m->n; i++)
        count_rec(&m->recs[i], &s, waits, fracs, &n_fracs);
    s.consistent = consistent(&s);
    summarize_quantiles(&s, waits, fracs, n_fracs);
    s.window_tps = (double)window_tokens / arg_duration;
    s.total_tps = s.last_close > 0 ? (double)s.tokens / s.last_close : 0;
    summarize_samples(m, &s);
    free(waits);
    free(fracs);
    *ret = s;
}

static FILE *open_out(const char *kind, const char *mode) {
    char path[4096];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s%s%s.csv", arg_out, kind, mode ? "_" : "", mode ? mode : "");
    f = fopen(path, "we");
    if (!f)
        fprintf(stderr, "loadgen: cannot write %s: %s\n", path, strerror(errno));
    return f;
}

int write_csvs(const struct mode_run *m) {
    FILE *f = open_out("occupancy", m->name);
    int r = 0;

    if (!f)
        return -errno;
    fprintf(f, "t,bytes_total,bytes_free,bytes_pages,bytes_reclaiming,seqs,opens_waiting,"
               "seqs_shrunk,budget_shrinks,budget_grows,tokens,running,waiting,budget_frac\n");
    for (size_t i = 0; i < m->n_samples; i++) {
        const struct sample *x = &m->samples[i];

        fprintf(f,
                "%.3f,%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%u,%u,%u,%" PRIu64 ",%" PRIu64
                ",%" PRIu64 ",%d,%d,%.4f\n",
                x->t, x->bytes_total, x->bytes_free, x->bytes_pages, x->bytes_reclaiming, x->seqs,
                x->opens_waiting, x->seqs_shrunk, x->shrinks, x->grows, x->tokens, x->running,
                x->waiting, x->budget_frac);
    }
    if (fclose(f) != 0)
        r = -errno;
    f = open_out("seqs", m->name);
    if (!f)
        return -errno;
    fprintf(f, "arrival_s,engine,burst,prompt,length,outcome,errno,failed,roomy,fit_free,seq_id,"
               "budget,min_budget,budget_mean,budget_min,wait_ms,closed_s,tokens,evictions,"
               "budget_changes\n");
    for (size_t i = 0; i < m->n; i++) {
        const struct seq_rec *x = &m->recs[i];
        bool opened =
            x->outcome == OUT_ADMITTED || x->outcome == OUT_ENOSPC || x->outcome == OUT_REFUSED;

        fprintf(f,
                "%.3f,%s,%d,%u,%u,%s,%d,%d,%d,%d,%u,%u,%u,%.1f,%u,%.1f,%.3f,%" PRIu64 ",%" PRIu64
                ",%" PRIu64 "\n",
                x->a->t, models[x->a->engine].name, x->a->burst, x->a->prompt, x->a->length,
                outcome_names[x->outcome], x->err, x->failed, x->roomy, x->fit_free, x->seq_id,
                x->budget, x->min_budget, x->budget_mean, x->budget_min,
                opened ? (x->admitted_s - x->open_s) * 1e3 : 0.0, x->closed_s, x->tokens,
                x->evictions, x->budget_changes);
    }
    if (fclose(f) != 0 && r == 0)
        r = -errno;
    return r;
}

/* One row of the table: a label and a printf format applied to each mode's value. */
#define ROW(label, fmt, ...)                                                                       \
    do {                                                                                           \
        fprintf(f, "| %s |", label);                                                               \
        for (size_t i_ = 0; i_ < n; i_++) {                                                        \
            const struct summary *s = &sums[i_];                                                   \
            (void)s;                                                                               \
            fprintf(f, " " fmt " |", __VA_ARGS__);                                                 \
        }                                                                                          \
        fprintf(f, "\n");                                                                          \
    } while (0)

/* A fraction as %g prints it, in a static buffer (one caller at a time). */
static const char *fmt_frac(double x) {
    static char buf[32];

    snprintf(buf, sizeof(buf), "%g", x);
    return buf;
}

static void print_table(FILE *f, struct mode_run *runs, const struct summary *sums, size_t n) {
    fprintf(f, "| %u arrivals in %.0f s, seed %.0f |", (unsigned)sums[0].arrived, arg_duration,
            arg_seed);
    for (size_t i = 0; i < n; i++)
        fprintf(f, " %s |", runs[i].name);
    fprintf(f, "\n|---|");
    for (size_t i = 0; i < n; i++)
        fprintf(f, "---:|");
    fprintf(f, "\n");
    ROW("min_budget / budget", "%s", runs[i_].min_frac > 0 ? fmt_frac(runs[i_].min_frac) : "-");
    ROW("admitted", "%zu (%.0f%%)", s->admitted,
        s->arrived ? 100.0 * (double)s->admitted / (double)s->arrived : 0.0);
    if (runs[0].min_frac == 0 && sums[0].admitted > 0)
        ROW("admitted / static's", "%.2fx", (double)s->admitted / (double)sums[0].admitted);
    ROW("refused: no room within the admission wait (ENOSPC)", "%zu", s->enospc);
    ROW("... of which room could have been made for (see below)", "%zu", s->roomy);
    ROW("... of which the free granules alone would have held (see below)", "%zu", s->fit_free);
    ROW("refused: other errors", "%zu", s->refused);
    ROW("admitted, then a call on the sequence failed", "%zu", s->failed);
    ROW("not opened (generator's thread limit)", "%zu", s->generator);
    ROW("admission wait of admitted opens, p50 / p99 / max (ms)", "%.0f / %.0f / %.0f", s->wait_p50,
        s->wait_p99, s->wait_max);
    ROW("decoded tokens/s while arrivals came", "%.0f", s->window_tps);
    ROW("decoded tokens, all / per second until the last close", "%" PRIu64 " / %.0f", s->tokens,
        s->total_tps);
    ROW("arena in pages of sequences, mean / max while arrivals came", "%.0f%% / %.0f%%",
        100 * s->occupancy_mean, 100 * s->occupancy_max);
    ROW("sequences running at once, max (sampled)", "%d", s->running_max);
    ROW("budget lowered / raised (daemon's counts)", "%" PRIu64 " / %" PRIu64, s->shrinks,
        s->grows);
    ROW("sequences below their budget at once, max (sampled)", "%u", s->shrunk_max);
    ROW("budget run with / opened with, per sequence: mean, p10, min", "%.2f, %.2f, %.2f",
        s->frac_mean, s->frac_p10, s->frac_min);
    ROW("lowest budget any sequence ran with / its opened budget", "%.2f", s->frac_lowest);
    fprintf(f,
            "\nRoom could have been made for a refused open when, at its refusal, the arena's "
            "free granules (the latest sample, up to %g ms old) and the KV pages that the "
            "sequences of its model which had started evicting held above their minimums "
            "added up to its KV pages; the free granules alone would have held it when they "
            "alone did. Budgets are per decoded token of each sequence.\n",
            arg_sample_ms);
}

int write_table(struct mode_run *runs, const struct summary *sums, size_t n) {
    char path[4096];
    FILE *f;

    print_table(stdout, runs, sums, n);
    snprintf(path, sizeof(path), "%s/table.md", arg_out);
    f = fopen(path, "we");
    if (!f) {
        fprintf(stderr, "loadgen: cannot write %s: %s\n", path, strerror(errno));
        return -errno;
    }
    print_table(f, runs, sums, n);
    return fclose(f) != 0 ? -errno : 0;
}
