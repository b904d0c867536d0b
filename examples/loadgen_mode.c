/* SPDX-License-Identifier: MIT */

/*
 * One mode of loadgen from start to end: it connects the engines, starts the sampler thread
 * (which owns the administrative handle and records the arena's status every --sample-ms),
 * starts a thread per arrival at its time, joins them all, and checks that the arena is empty
 * afterwards.
 */

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loadgen.h"

double since(const struct mode_run *m) {
    return now_seconds() - m->start;
}

/* ---- the sampler ------------------------------------------------------------------------- */

static int take_sample(struct mode_run *m) {
    Vase__StatusReply *st;
    int r = vase_admin_status(m->admin, &st);

    if (r < 0)
        return r;
    if (st->n_arenas < 1) {
        protobuf_c_message_free_unpacked(&st->base, NULL);
        return -EPROTO;
    }
    const Vase__ArenaStatus *a = st->arenas[0];
    struct sample x = {
        .t = since(m),
        .bytes_total = a->bytes_total,
        .bytes_free = a->bytes_free,
        .bytes_pages = a->bytes_pages,
        .bytes_reclaiming = st->bytes_reclaiming,
        .seqs = st->seqs,
        .opens_waiting = st->opens_waiting,
        .seqs_shrunk = st->seqs_shrunk,
        .shrinks = st->budget_shrinks_total,
        .grows = st->budget_grows_total,
        .tokens = atomic_load(&m->g.tokens),
        .running = atomic_load(&m->g.running),
        .waiting = atomic_load(&m->g.waiting),
    };
    protobuf_c_message_free_unpacked(&st->base, NULL);
    int decoding = atomic_load(&m->g.decoding);
    x.budget_frac = decoding > 0 ? (double)atomic_load(&m->g.budget_ppm) / 1e6 / decoding : NAN;
    atomic_store(&m->g.free_bytes, x.bytes_free);
    if (m->n_samples == m->cap_samples) {
        size_t ncap = m->cap_samples ? 2 * m->cap_samples : 1024;
        struct sample *p = realloc(m->samples, ncap * sizeof(*p));

        if (!p)
            return -ENOMEM;
        m->samples = p;
        m->cap_samples = ncap;
    }
    m->samples[m->n_samples++] = x;
    return 0;
}

static void *sampler(void *arg) {
    struct mode_run *m = arg;
    double next = now_seconds();

    while (atomic_load(&m->sampling)) {
        int r = take_sample(m);

        if (r < 0 && m->sampler_err == 0) {
            m->sampler_err = r;
            fprintf(stderr, "loadgen: %s: status from vased failed: %s %s\n", m->name,
                    vase_strerror(r), vase_admin_last_error(m->admin));
        }
        next += arg_sample_ms * 1e-3;
        sleep_until(next);
    }
    return NULL;
}

/* ---- a mode, start to end ------------------------------------------------------------------ */

/* Waits up to 10 s for the arena to hold no sequence and no page (closes are handled by the
 * daemon's main loop in order, so this is quick). 0, -EBUSY if it does not empty, -errno. */
static int check_empty(struct mode_run *m) {
    double deadline = now_seconds() + 10;
    int r;

    for (;;) {
        Vase__StatusReply *st;

        r = vase_admin_status(m->admin, &st);
        if (r < 0)
            return r;
        bool empty = st->seqs == 0 && st->opens_waiting == 0 && st->n_arenas > 0 &&
                     st->arenas[0]->bytes_pages == 0 &&
                     st->arenas[0]->bytes_free == st->arenas[0]->bytes_total;
        if (!empty && now_seconds() > deadline)
            fprintf(stderr,
                    "loadgen: %s: the arena is not empty after the run: %u sequences, %u opens "
                    "waiting, %" PRIu64 " bytes in pages, %" PRIu64 " of %" PRIu64 " free\n",
                    m->name, st->seqs, st->opens_waiting,
                    st->n_arenas ? st->arenas[0]->bytes_pages : 0,
                    st->n_arenas ? st->arenas[0]->bytes_free : 0,
                    st->n_arenas ? st->arenas[0]->bytes_total : 0);
        protobuf_c_message_free_unpacked(&st->base, NULL);
        if (empty)
            return 0;
        if (now_seconds() > deadline)
            return -EBUSY;
        sleep_until(now_seconds() + 0.05);
    }
}

/* Starts a thread per arrival at its time, until the schedule or --duration ends. */
static void dispatch(struct mode_run *m, struct job *jobs, uint64_t *ret_tokens) {
    pthread_attr_t attr;

    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    for (size_t i = 0; i < m->n && !stop_requested; i++) {
        struct job *j = &jobs[i];

        sleep_until(m->start + m->recs[i].a->t);
        if (stop_requested)
            break;
        *j = (struct job){.run = m, .rec = &m->recs[i]};
        if (atomic_load(&m->g.inflight) >= (int)arg_max_inflight) {
            m->recs[i].outcome = OUT_GENERATOR;
            continue;
        }
        atomic_fetch_add(&m->g.inflight, 1);
        int r = pthread_create(&j->thread, &attr, serve, j);
        if (r != 0) {
            atomic_fetch_sub(&m->g.inflight, 1);
            m->recs[i].outcome = OUT_GENERATOR;
            m->recs[i].err = r;
            continue;
        }
        j->started = true;
    }
    pthread_attr_destroy(&attr);
    sleep_until(m->start + arg_duration);
    *ret_tokens = atomic_load(&m->g.tokens);
}

/* Runs one mode; the records, samples and checks stay in m. 0, or -errno when the run could not
 * be made at all (a connection, memory, threads). */
int run_mode(struct mode_run *m, const struct arrival *sched, size_t n,
             uint64_t *ret_window_tokens) {
    struct job *jobs;
    pthread_t sampler_thread;
    int r;

    m->recs = calloc(n ? n : 1, sizeof(*m->recs));
    jobs = calloc(n ? n : 1, sizeof(*jobs));
    if (!m->recs || !jobs) {
        free(jobs);
        return -ENOMEM;
    }
    m->n = n;
    for (size_t i = 0; i < n; i++)
        m->recs[i] = (struct seq_rec){.a = &sched[i]};
    r = vase_admin_new(&(struct vase_admin_options){.runtime_dir = arg_runtime_dir}, &m->admin);
    if (r >= 0)
        r = vase_admin_connect(m->admin);
    if (r < 0) {
        fprintf(stderr, "loadgen: cannot reach vased's control socket: %s\n", vase_strerror(r));
        goto out;
    }
    r = connect_engines(m);
    if (r < 0)
        goto out;

    m->start = now_seconds();
    atomic_store(&m->sampling, true);
    r = -pthread_create(&sampler_thread, NULL, sampler, m);
    if (r < 0) {
        fprintf(stderr, "loadgen: cannot start the sampler thread: %s\n", strerror(-r));
        goto out;
    }
    dispatch(m, jobs, ret_window_tokens);
    for (size_t i = 0; i < n; i++)
        if (jobs[i].started)
            pthread_join(jobs[i].thread, NULL);
    /* A few samples of the emptied arena close the series. */
    sleep_until(now_seconds() + 3 * arg_sample_ms * 1e-3);
    atomic_store(&m->sampling, false);
    pthread_join(sampler_thread, NULL);
    disconnect_engines(m);
    r = check_empty(m);
    m->empty = r == 0;
    if (r == -EBUSY)
        r = 0;
    else if (r < 0)
        fprintf(stderr, "loadgen: %s: status from vased failed: %s\n", m->name, vase_strerror(r));
out:
    disconnect_engines(m);
    m->admin = vase_admin_free(m->admin);
    free(jobs);
    return r;
}
