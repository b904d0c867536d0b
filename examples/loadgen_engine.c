/* SPDX-License-Identifier: MIT */

/*
 * loadgen's engines: three synthetic models of different page sizes, one client each, and the
 * thread that serves one arrival on its engine: it opens the sequence with an admission wait,
 * writes and appends its prompt, decodes it to its length at the simulated step time, publishes
 * its budget and headroom into the mode's gauges, and closes it, recording all of it in its own
 * struct seq_rec.
 */

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "loadgen.h"

const struct model_spec models[N_MODELS] = {
    /* 32 KiB pages of 16 tokens. */
    {"small", 4, 8, 2, 64, VASE_DTYPE_BF16, 16, 512, 64, VASE_POLICY_VASE_DKV, 0.5},
    /* 256 KiB pages of 32 tokens. */
    {"wide", 4, 16, 4, 128, VASE_DTYPE_F16, 32, 768, 64, VASE_POLICY_STREAMING, 0.3},
    /* 512 KiB pages of 256 tokens. */
    {"long", 2, 4, 1, 128, VASE_DTYPE_F32, 256, 1024, 128, VASE_POLICY_STREAMING, 0.2},
};

/* Distinct K/V rows per engine; a token's rows are picked by a hash of (sequence, slot, layer). */
#define ROW_POOL 64u

uint32_t min_budget_of(const struct model_spec *s, double frac) {
    uint32_t w = s->window, m = (uint32_t)(frac * s->budget) / w * w;

    return m <= w ? 2 * w : m;
}

/* KV pages a sequence of s holds in its steady state at budget b (the daemon's
 * vase_layout_steady_slots with the default slack of one window). */
static uint64_t pages_at(const struct engine *e, uint32_t b) {
    return (b + 2 * e->spec->window + e->tpp - 1) / e->tpp;
}

static void fill_rows(struct engine *e, uint64_t seed) {
    const struct model_spec *s = e->spec;
    size_t n = (size_t)ROW_POOL * s->kv_heads * s->head_dim;
    uint64_t rng = seed;

    for (size_t i = 0; i < n; i++) {
        float x = (float)(2.0 * uniform(&rng) - 1.0);

        if (s->dtype == VASE_DTYPE_F32)
            ((float *)e->rows)[i] = x;
        else if (s->dtype == VASE_DTYPE_F16)
            ((uint16_t *)e->rows)[i] = vase_f32_to_f16(x);
        else
            ((uint16_t *)e->rows)[i] = vase_f32_to_bf16(x);
    }
}

static const void *row_for(const struct engine *e, uint64_t seq, uint32_t slot, uint32_t layer) {
    uint64_t h = seq * 0x100000001b3ull ^ ((uint64_t)slot << 20) ^ layer;

    return (const char *)e->rows + (size_t)(mix(&h) % ROW_POOL) * e->row_bytes;
}

/* K and V of tokens slot .. slot + n - 1 of every layer. */
static int write_tokens(const struct engine *e, struct vase_seq *s, uint64_t key, uint32_t slot,
                        uint32_t n) {
    for (uint32_t i = slot; i < slot + n; i++)
        for (uint32_t l = 0; l < e->spec->layers; l++) {
            int r = vase_seq_write_kv(s, l, i, row_for(e, key, i, l), row_for(e, ~key, i, l));

            if (r < 0)
                return r;
        }
    return 0;
}

/* Publishes a sequence's budget fraction and headroom into the gauges, replacing what it
 * published before (*ppm, *head). */
static void publish(struct mode_run *m, const struct engine *e, struct vase_seq *s, uint64_t *ppm,
                    uint64_t *head) {
    uint64_t p = s ? (uint64_t)vase_seq_budget(s) * 1000000 / e->spec->budget : 0;
    /* Only a sequence that has evicted plans every window tokens: one before its first eviction
     * cannot release anything until its length passes its budget. */
    uint64_t now = s && vase_seq_rounds(s) > 0 ? vase_seq_capacity(s) / e->tpp : 0;
    uint64_t floor = s ? pages_at(e, vase_seq_min_budget(s)) : 0;
    uint64_t h = now > floor ? (now - floor) * e->page_bytes : 0;

    atomic_fetch_add(&m->g.budget_ppm, p - *ppm);
    if ((p > 0) != (*ppm > 0))
        atomic_fetch_add(&m->g.decoding, p > 0 ? 1 : -1);
    atomic_fetch_add(&m->g.headroom[e - m->engines], h - *head);
    *ppm = p;
    *head = h;
}

/* Decodes an admitted sequence to its length (or until interrupted). */
static int decode(struct mode_run *m, const struct engine *e, struct seq_rec *rec,
                  struct vase_seq *s, const char **ret_what) {
    uint64_t key = (uint64_t)(rec - m->recs) + 1, ppm = 0, head = 0;
    double sum = 0;
    int r;

    *ret_what = "writing the prompt";
    r = write_tokens(e, s, key, 0, rec->a->prompt);
    if (r >= 0 && (*ret_what = "vase_seq_append() of the prompt"))
        r = vase_seq_append(s, rec->a->prompt);
    rec->budget_min = vase_seq_budget(s);
    for (uint32_t i = 0; r >= 0 && i < rec->a->length && !stop_requested; i++) {
        *ret_what = "vase_seq_wait()";
        if (vase_seq_len(s) >= vase_seq_capacity(s) && (r = vase_seq_wait(s)) < 0)
            break;
        *ret_what = "vase_seq_write_kv()";
        if ((r = write_tokens(e, s, key, vase_seq_len(s), 1)) < 0)
            break;
        *ret_what = "vase_seq_append()";
        if ((r = vase_seq_append(s, 1)) < 0)
            break;
        *ret_what = "vase_seq_poll()";
        if ((r = vase_seq_poll(s)) < 0)
            break;
        uint32_t b = vase_seq_budget(s);
        sum += b;
        if (b < rec->budget_min)
            rec->budget_min = b;
        rec->tokens++;
        atomic_fetch_add(&m->g.tokens, 1);
        publish(m, e, s, &ppm, &head);
        sleep_until(now_seconds() + arg_step_ms * 1e-3);
    }
    publish(m, e, NULL, &ppm, &head);
    rec->budget_mean = rec->tokens ? sum / (double)rec->tokens : rec->budget;
    return r < 0 ? r : 0;
}

void *serve(void *arg) {
    struct job *job = arg;
    struct mode_run *m = job->run;
    struct seq_rec *rec = job->rec;
    const struct engine *e = &m->engines[rec->a->engine];
    const struct model_spec *spec = e->spec;
    struct vase_seq_config cfg = {
        .policy = spec->policy,
        .params = vase_params_default(spec->budget),
        .prompt_len = rec->a->prompt,
        .seed = (uint64_t)(rec - m->recs) + 1,
        .mode = VASE_MODE_ASYNC,
        .slack = -1,
        .admission_wait_ms = (int32_t)arg_admission_wait_ms,
        .min_budget = m->min_frac > 0 ? min_budget_of(spec, m->min_frac) : 0,
    };
    struct vase_seq *s = NULL;
    int r;

    cfg.params.window = spec->window;
    atomic_fetch_add(&m->g.waiting, 1);
    rec->open_s = since(m);
    r = vase_seq_open(e->client, e->model, &cfg, &s);
    rec->admitted_s = since(m);
    atomic_fetch_sub(&m->g.waiting, 1);
    if (r < 0) {
        uint64_t need = pages_at(e, spec->budget) * e->page_bytes;
        uint64_t free_bytes = atomic_load(&m->g.free_bytes);

        rec->outcome = r == -ENOSPC ? OUT_ENOSPC : OUT_REFUSED;
        rec->err = -r;
        rec->fit_free = r == -ENOSPC && free_bytes >= need;
        rec->roomy =
            r == -ENOSPC && atomic_load(&m->g.headroom[rec->a->engine]) + free_bytes >= need;
        goto out;
    }
    rec->outcome = OUT_ADMITTED;
    rec->seq_id = vase_seq_id(s);
    rec->budget = vase_seq_budget(s);
    rec->min_budget = vase_seq_min_budget(s);
    atomic_fetch_add(&m->g.running, 1);
    const char *what;
    r = decode(m, e, rec, s, &what);
    if (r < 0) {
        /* The client's last error may be another thread's by now; it is printed as a hint. */
        rec->failed = true;
        rec->err = -r;
        fprintf(stderr,
                "loadgen: %s: sequence %u of %s: %s failed after %" PRIu64 " tokens: %s "
                "(len %u, capacity %u, budget %u, rounds %u; the client's last error: %s)\n",
                m->name, rec->seq_id, spec->name, what, rec->tokens, vase_strerror(r),
                vase_seq_len(s), vase_seq_capacity(s), vase_seq_budget(s), vase_seq_rounds(s),
                vase_last_error(e->client));
    }
    struct vase_seq_stats st;
    vase_seq_get_stats(s, &st);
    rec->evictions = st.evictions;
    rec->budget_changes = st.budget_changes;
    r = vase_seq_close(s);
    if (r < 0 && !rec->failed) {
        rec->failed = true;
        rec->err = -r;
        fprintf(stderr, "loadgen: %s: closing sequence %u failed: %s\n", m->name, rec->seq_id,
                vase_strerror(r));
    }
    rec->closed_s = since(m);
    atomic_fetch_sub(&m->g.running, 1);
out:
    atomic_fetch_sub(&m->g.inflight, 1);
    return NULL;
}

void disconnect_engines(struct mode_run *m) {
    for (size_t i = 0; i < N_MODELS; i++) {
        m->engines[i].client = vase_disconnect(m->engines[i].client);
        free(m->engines[i].rows);
        m->engines[i].rows = NULL;
    }
}

int connect_engines(struct mode_run *m) {
    for (size_t i = 0; i < N_MODELS; i++) {
        struct engine *e = &m->engines[i];
        const struct model_spec *s = &models[i];
        char name[64];
        int r;

        *e = (struct engine){.spec = s};
        e->row_bytes = (size_t)s->kv_heads * s->head_dim * vase_dtype_size(s->dtype);
        e->rows = malloc(ROW_POOL * e->row_bytes);
        if (!e->rows)
            return -ENOMEM;
        fill_rows(e, (uint64_t)arg_seed + i);
        snprintf(name, sizeof(name), "loadgen-%.24s-%.24s", m->name, s->name);
        r = vase_connect(
            &(struct vase_connect_options){.runtime_dir = arg_runtime_dir, .name = name},
            &e->client);
        if (r < 0) {
            fprintf(stderr, "loadgen: cannot connect to vased: %s\n", vase_strerror(r));
            return r;
        }
        r = vase_model_register(e->client,
                                &(struct vase_geometry){
                                    .name = s->name,
                                    .layers = s->layers,
                                    .q_heads = s->q_heads,
                                    .kv_heads = s->kv_heads,
                                    .head_dim = s->head_dim,
                                    .dtype = s->dtype,
                                    .block_tokens = s->block_tokens,
                                },
                                &e->model);
        if (r < 0) {
            fprintf(stderr, "loadgen: registering model %s failed: %s (%s)\n", s->name,
                    vase_strerror(r), vase_last_error(e->client));
            return r;
        }
        e->tpp = vase_model_tokens_per_page(e->model);
        e->page_bytes = vase_model_page_bytes(e->model);
    }
    return 0;
}
