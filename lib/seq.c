/* SPDX-License-Identifier: MIT */

/*
 * Sequences: open and close, the block table and ring pages a sequence holds, and the budget
 * the engine caps. The views and pointers into the arena a sequence hands the engine, its CUDA
 * stream and the convenience copies are seq_view.c's. The eviction cycle that runs on a
 * sequence (append, plans, compaction, commit) is cycle.c's; this file owns the sequence's
 * memory, and cycle.c and push.c call into it (never the other way round) to copy a new block
 * table and drop the engine's draws.
 *
 * Invariant: the block table (pages) changes only when a commit's reply arrives (cycle.c), the
 * ring pages never after the open; both are checked against the arena before they are kept.
 */

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "wire.h"

_Static_assert(VASE_SEQ_LABEL_MAX == VASE_WIRE_LABEL_MAX, "one rule of labels for both ends");

void vase__seq_clear_draws(struct vase_seq *s) {
    free(s->exp_draws);
    free(s->gauss);
    s->exp_draws = s->gauss = NULL;
    s->n_exp = s->n_gauss = 0;
}

struct vase_seq *vase__seq_free(struct vase_seq *s) {
    if (!s)
        return NULL;
    vase__seq_clear_draws(s);
    vase__cuda_seq_free(s->cuda);
    free(s->pages);
    free(s->ring_pages);
    free(s->plan_pages);
    free(s);
    return NULL;
}

/* Copies a page list after checking every page lies inside the arena: below limit, the pages
 * of that size the arena holds. */
int vase__seq_copy_pages(const uint32_t *src, size_t n, uint64_t limit, uint32_t **ret) {
    for (size_t i = 0; i < n; i++)
        if (src[i] >= limit)
            return -EPROTO;
    uint32_t *p = malloc((n ? n : 1) * sizeof(*p));
    if (!p)
        return -ENOMEM;
    if (n)
        memcpy(p, src, n * sizeof(*p));
    *ret = p;
    return 0;
}

static void unlink_seq(struct vase_seq *s) {
    for (struct vase_seq **p = &s->client->seqs; *p; p = &(*p)->next)
        if (*p == s) {
            *p = s->next;
            return;
        }
}

static int close_remote(struct vase_client *c, uint32_t id) {
    Vase__CloseSeq cs = VASE__CLOSE_SEQ__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    Vase__Envelope *reply;

    cs.seq_id = id;
    e.body_case = VASE__ENVELOPE__BODY_CLOSE_SEQ;
    e.close_seq = &cs;
    int r = vase__client_call(c, &e, VASE__ENVELOPE__BODY_OK, &reply);
    if (r < 0)
        return r;
    vase__envelope__free_unpacked(reply, NULL);
    return 0;
}

/* Checks a SeqLayout against what was asked and what the model's layout allows. An elastic open
 * may start below its budget (not below min_budget); a daemon without elastic budgets answers
 * with no range (0), which only a plain open fits. */
static int check_layout(const struct vase_model *m, const struct vase_seq_config *cfg,
                        const Vase__SeqLayout *sl) {
    const struct vase_layout *l = &m->layout;
    uint32_t max = cfg->params.budget, W = cfg->params.window;
    uint32_t min = cfg->min_budget ? cfg->min_budget : max;
    struct vase_plan_layout plan;

    if (sl->window != W || (sl->max_budget ? sl->max_budget : sl->budget) != max ||
        sl->budget < min || sl->budget > max || sl->budget % W || sl->keep != sl->budget - W)
        return -EPROTO;
    if (sl->min_budget != min && !(sl->min_budget == 0 && min == max))
        return -EPROTO;
    if (cfg->slack >= 0 && sl->slack != (uint32_t)cfg->slack)
        return -EPROTO;
    /* Exactly the pages vase_layout.h prescribes for the budget it starts with, no more and no
     * fewer; the plan area is the one of the budget asked for. */
    uint32_t blocks = vase_layout_blocks_for(
        l, vase_layout_open_slots(cfg->prompt_len, sl->budget, sl->window, sl->slack));
    if (sl->n_pages != blocks || sl->capacity != (uint64_t)blocks * l->block_tokens)
        return -EPROTO;
    if (vase_layout_plans(l, max - W, &plan, NULL, 0) < 0 ||
        sl->plans_per_page != plan.plans_per_page || sl->plan_page_bytes != plan.plan_page_bytes ||
        sl->n_plan_pages != plan.plan_pages)
        return -EPROTO;
    uint32_t ring = vase_policy_needs(cfg->policy) & VASE_NEEDS_Q
                        ? vase_layout_ring_pages(l, sl->window, NULL)
                        : 0;
    if (sl->n_ring_pages != ring || (vase_policy_needs(cfg->policy) & VASE_NEEDS_Q && ring == 0))
        return -EPROTO;
    return 0;
}

/* Copies the label of cfg (checked: at most VASE_SEQ_LABEL_MAX bytes; the bound holds whatever
 * the caller's string became since) into buf and points cfg at the copy, so that a configuration
 * libvase keeps never refers to the caller's string. */
static void keep_label(struct vase_seq_config *cfg, char buf[VASE_SEQ_LABEL_MAX + 1]) {
    const char *label = cfg->label ? cfg->label : "";
    size_t n = strnlen(label, VASE_SEQ_LABEL_MAX);
    memcpy(buf, label, n);
    buf[n] = '\0';
    cfg->label = buf;
}

static int seq_from_layout(struct vase_model *m, const struct vase_seq_config *cfg,
                           const Vase__SeqLayout *sl, struct vase_seq **ret) {
    int r;

    struct vase_seq *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    *s = (struct vase_seq){
        .client = m->client,
        .model = m,
        .id = sl->seq_id,
        .cfg = *cfg,
        .has_resume_token = sl->resume_token.len == sizeof(s->resume_token),
        .policy = cfg->policy,
        .mode = cfg->mode,
        .budget = sl->budget,
        .min_budget = sl->min_budget ? sl->min_budget : sl->budget,
        .max_budget = cfg->params.budget,
        .window = sl->window,
        .keep = sl->keep,
        .slack = sl->slack,
        .prompt_len = cfg->prompt_len,
        .capacity = sl->capacity,
        .n_pages = sl->n_pages,
        .n_ring_pages = sl->n_ring_pages,
        .n_plan_pages = sl->n_plan_pages,
    };
    if (s->has_resume_token)
        memcpy(s->resume_token, sl->resume_token.data, sizeof(s->resume_token));
    keep_label(&s->cfg, s->label);
    const struct vase_layout *l = &m->layout;
    uint64_t size = l->arena_bytes;
    uint32_t max_keep = cfg->params.budget - sl->window;
    vase_layout_plans(l, max_keep, &s->plan, NULL, 0); /* checked by check_layout() */
    /* The most pages it will hold: those of the budget asked for. */
    s->max_pages = vase_layout_blocks_for(
        l, vase_layout_open_slots(cfg->prompt_len, cfg->params.budget, sl->window, sl->slack));
    if ((r = vase__seq_copy_pages(sl->pages, sl->n_pages, l->num_blocks, &s->pages)) < 0 ||
        (r = vase__seq_copy_pages(sl->ring_pages, sl->n_ring_pages,
                                  vase_layout_units(size, l->ring_page_bytes), &s->ring_pages)) <
            0 ||
        (r = vase__seq_copy_pages(sl->plan_pages, sl->n_plan_pages,
                                  vase_layout_units(size, s->plan.plan_page_bytes),
                                  &s->plan_pages)) < 0) {
        vase__seq_free(s);
        return r;
    }
    /* The block table never holds more pages than those of the budget asked for, so neither
     * does its device copy; and no move of one layer's K or V is larger than their capacity:
     * the new length K + len - n is at most len, n below len. */
    size_t row_bytes = (size_t)l->head_dim * vase_dtype_size(l->dtype);
    uint32_t most = s->max_pages * l->block_tokens;
    if (vase__arena_on_device(m->arena) &&
        (r = vase__cuda_seq_new(
             m->arena->mapping, s->pages, sl->n_pages, s->max_pages, (size_t)l->kv_heads * max_keep,
             vase_compact_cuda_scratch_bytes(l->kv_heads, row_bytes, most, most), &s->cuda)) < 0) {
        vase__seq_free(s);
        return r;
    }
    *ret = s;
    return 0;
}

/* An OpenSeq as sent: the messages it points into. */
struct open_msg {
    Vase__SeqParams params;
    Vase__OpenSeq open;
    Vase__Envelope e;
};

/* Checks the configuration vase_seq_open() (what: its name) got. 0 or -EINVAL with the reason
 * for vase_last_error(). Lock held. */
static int config_check(struct vase_client *c, const struct vase_seq_config *cfg,
                        const char *what) {
    char why[256];
    if (vase_params_explain_prompt(&cfg->params, cfg->policy, cfg->prompt_len, why, sizeof(why)) <
        0) {
        const char *policy = vase_policy_to_string(cfg->policy);
        return vase__client_fail(c, -EINVAL, "%s: invalid parameters for policy %s: %s", what,
                                 policy ? policy : "(unknown)", why);
    }
    /* The wire carries them as int32 (-1 asks for the default). */
    if (cfg->params.n_sink > INT32_MAX || cfg->params.n_large > INT32_MAX)
        return vase__client_fail(c, -EINVAL, "%s: n_sink %u, n_large %u (want at most %d each)",
                                 what, cfg->params.n_sink, cfg->params.n_large, INT32_MAX);
    uint32_t W = cfg->params.window;
    if (cfg->min_budget &&
        (cfg->min_budget > cfg->params.budget || cfg->min_budget <= W || cfg->min_budget % W))
        return vase__client_fail(c, -EINVAL,
                                 "%s: min_budget %u must be a multiple of window %u, above it "
                                 "and at most budget %u",
                                 what, cfg->min_budget, W, cfg->params.budget);
    /* The protected prompt must fit every budget the sequence may be lowered to. */
    if (cfg->min_budget && cfg->params.protect_prompt && cfg->prompt_len > cfg->min_budget - W)
        return vase__client_fail(c, -EINVAL,
                                 "%s: protect_prompt needs prompt_len at most min_budget - window "
                                 "(prompt_len %u, min_budget %u, window %u: at most %u)",
                                 what, cfg->prompt_len, cfg->min_budget, W, cfg->min_budget - W);
    if (cfg->weight > VASE_MAX_WEIGHT)
        return vase__client_fail(c, -EINVAL, "%s: weight %u (want 0 .. %u)", what, cfg->weight,
                                 VASE_MAX_WEIGHT);
    if (cfg->admission_wait_ms < -1 || cfg->admission_wait_ms > VASE_MAX_ADMISSION_WAIT_MS)
        return vase__client_fail(c, -EINVAL,
                                 "%s: admission_wait_ms %d (want -1 for the daemon's default, or "
                                 "0 .. %d)",
                                 what, (int)cfg->admission_wait_ms, VASE_MAX_ADMISSION_WAIT_MS);
    if ((cfg->mode != VASE_MODE_ASYNC && cfg->mode != VASE_MODE_SYNC) || cfg->slack < -1)
        return vase__client_fail(c, -EINVAL,
                                 "%s: mode %d, slack %d (want a mode of enum vase_mode, slack "
                                 ">= -1)",
                                 what, (int)cfg->mode, (int)cfg->slack);
    /* The daemon applies the same rule (proto/wire.c); refused here, nothing is sent. */
    if (cfg->label && vase_wire_label_check(cfg->label, why, sizeof(why)) < 0)
        return vase__client_fail(c, -EINVAL, "%s: %s", what, why);
    return 0;
}

/* Checks what vase_seq_open() (what: its name) got and fills o with the request. 0 or -errno
 * with the reason for vase_last_error(). Lock held. */
static int open_begin(struct vase_client *c, struct vase_model *m,
                      const struct vase_seq_config *cfg, const void *ret, const char *what,
                      struct open_msg *o) {
    if (!m || !cfg || !ret || m->client != c)
        return vase__client_fail(c, -EINVAL, "%s: %s", what,
                                 m && m->client != c ? "the model is another client's"
                                                     : "no model, configuration or result pointer");
    int r = config_check(c, cfg, what);
    if (r < 0)
        return r;
    if (c->dead)
        return c->dead;
    /* Every parameter is sent explicitly, so the daemon's defaults never decide silently. */
    vase__seq_params__init(&o->params);
    vase__open_seq__init(&o->open);
    vase__envelope__init(&o->e);
    o->params.policy = (char *)vase_policy_to_string(cfg->policy);
    o->params.budget = cfg->params.budget;
    o->params.window = cfg->params.window;
    o->params.n_sink = (int32_t)cfg->params.n_sink;
    o->params.n_large = (int32_t)cfg->params.n_large;
    o->params.temperature = cfg->params.temperature;
    o->params.rank = cfg->params.rank;
    o->params.lambda = cfg->params.lambda;
    o->params.smooth = cfg->params.smooth;
    o->params.metric = (char *)vase_metric_to_string(cfg->params.metric);
    o->params.protect_prompt = cfg->params.protect_prompt != 0;
    o->open.model_id = m->id;
    o->open.params = &o->params;
    o->open.prompt_len = cfg->prompt_len;
    o->open.seed = cfg->seed;
    o->open.mode = cfg->mode == VASE_MODE_SYNC ? VASE__MODE__MODE_SYNC : VASE__MODE__MODE_ASYNC;
    o->open.slack = cfg->slack;
    o->open.admission_wait_ms = cfg->admission_wait_ms;
    o->open.min_budget = cfg->min_budget;
    o->open.weight = cfg->weight;
    o->open.label = (char *)(cfg->label ? cfg->label : "");
    o->e.body_case = VASE__ENVELOPE__BODY_OPEN_SEQ;
    o->e.open_seq = &o->open;
    return 0;
}

/* How long the reply to an open may take: as long as the admission wait allows, and the usual
 * timeout after that; the daemon's default is not known here, so -1 allows for the longest. */
static int open_timeout_ms(const struct vase_client *c, const struct vase_seq_config *cfg) {
    int wait_ms = cfg->admission_wait_ms < 0 ? VASE_MAX_ADMISSION_WAIT_MS : cfg->admission_wait_ms;
    int timeout_ms = vase__chan_timeout(c->chan);
    return timeout_ms > INT_MAX - wait_ms ? INT_MAX : timeout_ms + wait_ms;
}

/* The sequence of a SeqLayout, checked and linked into the client; on failure the daemon's
 * sequence is closed again. Lock held. */
static int open_finish(struct vase_client *c, struct vase_model *m,
                       const struct vase_seq_config *cfg, const Vase__SeqLayout *sl,
                       struct vase_seq **ret) {
    struct vase_seq *s;
    int r = check_layout(m, cfg, sl);
    if (r == 0)
        r = seq_from_layout(m, cfg, sl, &s);
    if (r < 0) {
        /* The daemon reserved pages for a sequence we will not use: give them back. Whatever
         * that says, the reason of this failure is what vase_last_error() tells. */
        (void)close_remote(c, sl->seq_id);
        if (r == -EPROTO)
            vase__client_fail(c, r,
                              "the daemon's layout of the new sequence does not fit what "
                              "was asked or the arena (PROTOCOL.md, \"Layouts are checked\")");
        else
            c->last_error[0] = '\0';
        return r;
    }
    s->next = c->seqs;
    c->seqs = s;
    *ret = s;
    return 0;
}

int vase_seq_open(struct vase_client *c, struct vase_model *m, const struct vase_seq_config *cfg,
                  struct vase_seq **ret) {
    Vase__Envelope *reply = NULL;
    struct open_msg o;

    if (!c)
        return -EINVAL;
    vase__client_lock(c);
    int r = open_begin(c, m, cfg, ret, "vase_seq_open", &o);
    if (r < 0)
        goto out;
    int timeout_ms = open_timeout_ms(c, cfg);
    r = cfg->admission_wait_ms == 0
            ? vase__client_call_wait(c, &o.e, VASE__ENVELOPE__BODY_SEQ_LAYOUT, timeout_ms, &reply)
            : vase__client_call_unlocked(c, &o.e, VASE__ENVELOPE__BODY_SEQ_LAYOUT, timeout_ms,
                                         &reply);
    if (r == 0)
        r = open_finish(c, m, cfg, reply->seq_layout, ret);
out:
    if (reply)
        vase__envelope__free_unpacked(reply, NULL);
    pthread_mutex_unlock(&c->lock);
    return r;
}

/* ---- reopen after a daemon restart ---- */

static bool same_pages(const uint32_t *a, size_t na, const uint32_t *b, size_t nb) {
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof(*a)) == 0);
}

/* Whether the daemon's kept sequence is exactly old: the same pages, budget and evictions (a
 * commit the old daemon never saw would have moved old on). */
static bool reopen_matches(const struct vase_seq *old, const struct vase_seq *s,
                           const Vase__SeqLayout *sl) {
    return s->id == old->id && same_pages(s->pages, s->n_pages, old->pages, old->n_pages) &&
           same_pages(s->ring_pages, s->n_ring_pages, old->ring_pages, old->n_ring_pages) &&
           same_pages(s->plan_pages, s->n_plan_pages, old->plan_pages, old->n_plan_pages) &&
           s->budget == old->budget && s->keep == old->keep && sl->rounds == old->rounds &&
           sl->len <= old->len && old->len <= s->capacity;
}

static bool geometry_equal(const struct vase_layout *a, const struct vase_layout *b) {
    return a->layers == b->layers && a->q_heads == b->q_heads && a->kv_heads == b->kv_heads &&
           a->head_dim == b->head_dim && a->dtype == b->dtype && a->block_tokens == b->block_tokens;
}

/* The reopened sequence from the daemon's layout: the new mapping, old's progress. Lock held. */
static int reopen_finish(struct vase_client *c, struct vase_model *m, const struct vase_seq *old,
                         const Vase__SeqLayout *sl, struct vase_seq **ret) {
    struct vase_seq *s;
    int r = seq_from_layout(m, &old->cfg, sl, &s);
    if (r == 0 && !reopen_matches(old, s, sl)) {
        s = vase__seq_free(s);
        r = -EPROTO;
    }
    if (r < 0) {
        (void)close_remote(c, sl->seq_id);
        if (r == -EPROTO)
            return vase__client_fail(c, r,
                                     "the daemon kept sequence %u in another state than this "
                                     "one (pages, budget or evictions differ): open it again",
                                     old->id);
        c->last_error[0] = '\0';
        return r;
    }
    s->len = old->len;
    s->position = old->position;
    s->rounds = old->rounds;
    s->stats = old->stats;
    s->next = c->seqs;
    c->seqs = s;
    *ret = s;
    return 0;
}

int vase_seq_reopen(struct vase_model *m, const struct vase_seq *old, struct vase_seq **ret) {
    Vase__Envelope *reply = NULL;
    struct open_msg o;

    if (!m || !old || !ret)
        return -EINVAL;
    struct vase_client *c = m->client;
    vase__client_lock(c);
    int r = 0;
    if (old->client == c || !old->has_resume_token || !old->model ||
        !geometry_equal(&m->layout, &old->model->layout)) {
        r = vase__client_fail(c, -EINVAL, "vase_seq_reopen: %s",
                              old->client == c ? "the sequence is this client's already"
                              : !old->has_resume_token
                                  ? "the daemon that opened it gave no resume token"
                                  : "the model's geometry is not the sequence's");
        goto out;
    }
    r = open_begin(c, m, &old->cfg, ret, "vase_seq_reopen", &o);
    if (r < 0)
        goto out;
    o.open.resume_seq = old->id;
    o.open.resume_token = (ProtobufCBinaryData){.len = sizeof(old->resume_token),
                                                .data = (uint8_t *)old->resume_token};
    o.open.admission_wait_ms = 0;
    r = vase__client_call(c, &o.e, VASE__ENVELOPE__BODY_SEQ_LAYOUT, &reply);
    if (r == 0)
        r = reopen_finish(c, m, old, reply->seq_layout, ret);
out:
    if (reply)
        vase__envelope__free_unpacked(reply, NULL);
    pthread_mutex_unlock(&c->lock);
    return r;
}

/* ---- opens that do not block ---- */

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Unlinks o from its client's opens. Lock held. */
static void open_unlink(struct vase_open *o) {
    for (struct vase_open **p = &o->client->opens; *p; p = &(*p)->next)
        if (*p == o) {
            *p = o->next;
            return;
        }
}

int vase_seq_open_async(struct vase_client *c, struct vase_model *m,
                        const struct vase_seq_config *cfg, struct vase_open **ret) {
    struct open_msg msg;
    uint64_t id;

    if (!c)
        return -EINVAL;
    vase__client_lock(c);
    int r = open_begin(c, m, cfg, ret, "vase_seq_open_async", &msg);
    if (r < 0)
        goto out;
    struct vase_open *o = calloc(1, sizeof(*o));
    if (!o) {
        r = -ENOMEM;
        goto out;
    }
    r = vase__client_check(c, vase__chan_send(c->chan, &msg.e, &id));
    if (r < 0) {
        free(o);
        goto out;
    }
    *o = (struct vase_open){.client = c,
                            .model = m,
                            .cfg = *cfg,
                            .id = id,
                            .deadline_ms = now_ms() + open_timeout_ms(c, cfg),
                            .next = c->opens};
    keep_label(&o->cfg, o->label);
    c->opens = o;
    *ret = o;
out:
    pthread_mutex_unlock(&c->lock);
    return r;
}

int vase_open_poll(struct vase_open *o, struct vase_seq **ret_seq) {
    Vase__Envelope *reply = NULL;

    if (!o || !ret_seq)
        return -EINVAL;
    struct vase_client *c = o->client;
    vase__client_lock(c);
    int r = c->dead;
    if (r == 0) {
        r = vase__client_check(c, vase__chan_wait(c->chan, o->id, 0, &reply));
        if (r == -EAGAIN && now_ms() >= o->deadline_ms)
            r = vase__client_fail(c, -ETIMEDOUT, "no answer to the open within %d ms",
                                  open_timeout_ms(c, &o->cfg));
    }
    if (r == -EAGAIN) {
        pthread_mutex_unlock(&c->lock);
        return 0;
    }
    if (r == 0) {
        Vase__Envelope *layout = NULL;
        r = vase__chan_reply(c->chan, reply, VASE__ENVELOPE__BODY_SEQ_LAYOUT, &layout);
        r = r < 0 ? vase__client_done(c, r)
                  : open_finish(c, o->model, &o->cfg, layout->seq_layout, ret_seq);
        if (layout)
            vase__envelope__free_unpacked(layout, NULL);
    }
    /* Over, one way or the other; an open that timed out is closed should it be admitted
     * later (vase__client_unclaimed()). */
    open_unlink(o);
    if (r == -ETIMEDOUT)
        vase__client_abandon_open(c, o->id);
    free(o);
    pthread_mutex_unlock(&c->lock);
    return r < 0 ? r : 1;
}

void vase_open_cancel(struct vase_open *o) {
    if (!o)
        return;
    struct vase_client *c = o->client;
    pthread_mutex_lock(&c->lock);
    open_unlink(o);
    vase__client_abandon_open(c, o->id);
    free(o);
    pthread_mutex_unlock(&c->lock);
}

int vase_seq_close(struct vase_seq *s) {
    if (!s)
        return 0;
    struct vase_client *c = s->client;
    int r;

    vase__client_lock(c);
    unlink_seq(s);
    /* The daemon may hand the pages on as soon as it has the close: a compaction still queued
     * (stream order) must have run. A wait for that one event, not for the device. */
    if (s->cuda)
        (void)vase__cuda_seq_reached(s->cuda, VASE__CUDA_COMPACTED, true);
    if (s->pending && !s->request_queued)
        vase__chan_drop(c->chan, s->pending_id);
    if (s->commit_pending)
        vase__chan_drop(c->chan, s->commit_id);
    r = c->dead ? c->dead : close_remote(c, s->id);
    vase__seq_free(s);
    pthread_mutex_unlock(&c->lock);
    return r;
}

/* ---- getters ---- */

#define SEQ_GETTER(type, name, expr)                                                               \
    type vase_seq_##name(const struct vase_seq *s) {                                               \
        if (!s)                                                                                    \
            return 0;                                                                              \
        pthread_mutex_lock(&s->client->lock);                                                      \
        type v = (expr);                                                                           \
        pthread_mutex_unlock(&s->client->lock);                                                    \
        return v;                                                                                  \
    }

SEQ_GETTER(uint32_t, id, s->id)
SEQ_GETTER(uint32_t, len, s->len)
SEQ_GETTER(uint32_t, capacity, s->capacity)
SEQ_GETTER(uint64_t, position, s->position)
SEQ_GETTER(uint32_t, rounds, s->rounds)
SEQ_GETTER(uint32_t, budget, s->budget)
SEQ_GETTER(uint32_t, min_budget, s->min_budget)

const char *vase_seq_label(const struct vase_seq *s) {
    /* Written once, at the open: no lock needed to read it. */
    return s ? s->label : "";
}

int vase_seq_set_budget(struct vase_seq *s, uint32_t budget) {
    Vase__SetBudget sb = VASE__SET_BUDGET__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    Vase__Envelope *reply;

    if (!s)
        return -EINVAL;
    struct vase_client *c = s->client;
    vase__client_lock(c);
    int r = 0;
    if (budget < s->min_budget || budget > s->max_budget || budget % s->window) {
        r = vase__client_fail(c, -EINVAL,
                              "vase_seq_set_budget: %u must be a multiple of window %u in "
                              "[min_budget %u, %u]",
                              budget, s->window, s->min_budget, s->max_budget);
        goto out;
    }
    r = s->client->dead;
    if (r < 0)
        goto out;
    sb.seq_id = s->id;
    sb.budget = budget;
    e.body_case = VASE__ENVELOPE__BODY_SET_BUDGET;
    e.set_budget = &sb;
    r = vase__client_call(c, &e, VASE__ENVELOPE__BODY_OK, &reply);
    if (r == 0)
        vase__envelope__free_unpacked(reply, NULL);
out:
    pthread_mutex_unlock(&c->lock);
    return r;
}

void vase_seq_get_stats(const struct vase_seq *s, struct vase_seq_stats *ret) {
    if (!s || !ret)
        return;
    pthread_mutex_lock(&s->client->lock);
    *ret = s->stats;
    pthread_mutex_unlock(&s->client->lock);
}
