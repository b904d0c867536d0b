/* SPDX-License-Identifier: MIT */

/*
 * An engine's models and sequences. RegisterModel checks the geometry against the arena and the
 * client's rights and answers with the layout both ends compute the same way; OpenSeq applies
 * PROTOCOL.md's defaults to the parameters, checks every bound, and hands the open to
 * admission.c (all or nothing, at once or after a wait), which answers with its pages; CloseSeq
 * returns them, or leaves them to the plan in flight (registry.c). Opening and closing publish
 * their events and may change the memory pressure.
 */

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "serve/access.h"
#include "core/admitq.h"
#include "core/alloc.h"
#include "core/arena.h"
#include "core/balance.h"
#include "serve/elastic.h"
#include "admission.h"
#include "engine.h"
#include "core/log.h"
#include "serve/publish.h"
#include "core/registry.h"
#include "reply.h"
#include "serve/restore.h"
#include "state.h"
#include "wire.h"

static int handle_register_model(struct vased *d, struct vased_client *c,
                                 const struct vase_reply_to *p, const Vase__RegisterModel *req) {
    const Vase__ModelGeometry *g = req->geometry;
    if (!g)
        return vase_reply_error(d, p, EINVAL, "register_model has no geometry");
    if (c->n_models >= d->cfg.max_models_per_client)
        return vase_reply_error(d, p, EDQUOT, "client has %u models (max_models_per_client)",
                                c->n_models);
    if (g->arena_id >= d->n_arenas)
        return vase_reply_error(d, p, EINVAL, "no arena %u (this daemon has %u)", g->arena_id,
                                d->n_arenas);
    if (!(c->arenas & (1u << g->arena_id)))
        return vase_reply_error(d, p, EPERM, "arena %u (\"%s\") is not open to uid %u", g->arena_id,
                                d->arena_names[g->arena_id], (unsigned)c->uid);
    if (strlen(g->name) > VASE_MAX_NAME)
        return vase_reply_error(d, p, EINVAL, "model name longer than %u bytes", VASE_MAX_NAME);
    if ((unsigned)g->dtype >= _VASE_DTYPE_MAX)
        return vase_reply_error(d, p, EINVAL, "unknown dtype %d", (int)g->dtype);

    struct vase_layout_geometry geo = {
        .layers = g->layers,
        .q_heads = g->q_heads,
        .kv_heads = g->kv_heads,
        .head_dim = g->head_dim,
        .dtype = (enum vase_dtype)g->dtype,
        .block_tokens = g->block_tokens,
    };
    struct vase_layout layout;
    char msg[256];
    int r = vase_layout_compute(&geo, d->arenas[g->arena_id]->size, &layout, msg, sizeof(msg));
    if (r < 0)
        return vase_reply_error(d, p, -r, "bad geometry for arena %u: %s", g->arena_id, msg);

    struct vased_model *m;
    r = vase_registry_add_model(d->reg, c, g->name, g->arena_id, &layout, &m);
    if (r < 0)
        return vase_reply_error(d, p, -r, "cannot register the model: %s", strerror(-r));
    log_info("Client %u registered model %u \"%s\": %u layers, %u/%u heads, dim %u, %s, "
             "%u tokens per page of %llu bytes.",
             c->id, m->id, m->name, layout.layers, layout.q_heads, layout.kv_heads, layout.head_dim,
             vase_dtype_to_string(layout.dtype), layout.block_tokens,
             (unsigned long long)layout.page_bytes);

    Vase__ModelLayout ml = VASE__MODEL_LAYOUT__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    ml.model_id = m->id;
    ml.block_tokens = layout.block_tokens;
    ml.page_bytes = layout.page_bytes;
    ml.layer_stride = layout.layer_stride;
    ml.kv_stride = layout.kv_stride;
    ml.token_stride = layout.token_stride;
    ml.head_stride = layout.head_stride;
    ml.ring_rows_per_page = layout.ring_rows_per_page;
    ml.ring_layer_stride = layout.ring_layer_stride;
    ml.ring_row_stride = layout.ring_row_stride;
    ml.ring_page_bytes = layout.ring_page_bytes;
    ml.num_blocks = layout.num_blocks;
    e.body_case = VASE__ENVELOPE__BODY_MODEL_LAYOUT;
    e.model_layout = &ml;
    vase_reply_send(d, p, &e);
    return 0;
}

/* The policy sp names, PROTOCOL.md's default when none. Reference mode names
 * ("range_sink_sample_attn", ...) imply a value metric too: *ret_metric, and *ret_implied is
 * set. 0 or -EINVAL with *msg. */
static int policy_from(const Vase__SeqParams *sp, enum vase_policy *ret,
                       enum vase_metric *ret_metric, bool *ret_implied, const char **msg) {
    *ret_implied = false;
    if (sp->policy[0] == '\0') {
        *ret = VASE_POLICY_VASE_ATTNV;
        return 0;
    }
    if (vase_policy_from_string(sp->policy, ret) >= 0)
        return 0;
    if (vase_policy_from_mode(sp->policy, ret, ret_metric) < 0) {
        *msg = "unknown policy";
        return -EINVAL;
    }
    *ret_implied = true;
    return 0;
}

/* The parameters of sp over the defaults for its budget (metric: the one sp names, else the
 * one the policy's mode name implied, if any), checked for policy. 0 or -EINVAL with *msg (which
 * may point into why[0 .. why_size): the rule broken, with its values). */
static int params_from(const Vase__SeqParams *sp, enum vase_policy policy, bool implied,
                       enum vase_metric implied_metric, struct vase_params *ret, const char **msg,
                       char *why, size_t why_size) {
    if (sp->budget == 0) {
        *msg = "budget must be set";
        return -EINVAL;
    }
    struct vase_params p = vase_params_default(sp->budget);
    if (sp->window)
        p.window = sp->window;
    if (sp->n_sink < -1 || sp->n_large < -1) {
        *msg = "n_sink and n_large must be >= 0, or -1 for the default";
        return -EINVAL;
    }
    if (sp->n_sink >= 0)
        p.n_sink = (uint32_t)sp->n_sink;
    if (sp->n_large >= 0)
        p.n_large = (uint32_t)sp->n_large;
    if (sp->temperature != 0.0f)
        p.temperature = sp->temperature;
    if (sp->rank)
        p.rank = sp->rank;
    if (sp->lambda >= 0.0f || isnan(sp->lambda))
        p.lambda = sp->lambda;
    if (sp->smooth)
        p.smooth = sp->smooth;
    p.protect_prompt = sp->protect_prompt != 0;
    if (sp->metric[0]) {
        if (vase_metric_from_string(sp->metric, &p.metric) < 0) {
            *msg = "unknown metric (range, l2, var, absmax)";
            return -EINVAL;
        }
    } else if (implied) {
        p.metric = implied_metric;
    }
    if (vase_params_explain(&p, policy, why, why_size) < 0) {
        *msg = why;
        return -EINVAL;
    }
    *ret = p;
    return 0;
}

/* The budget range and weight of an OpenSeq (p: its parameters, checked): the parameters must
 * stay valid at min_budget, n_large scaled with the budget (vase_params_at_budget()), and a
 * protected prompt fit it (at the budget too, then). 0 or -EINVAL with *msg (which may point
 * into why[0 .. why_size)). */
static int elastic_from(const Vase__OpenSeq *o, const struct vase_params *p,
                        struct vased_seq_request *ret, const char **msg, char *why,
                        size_t why_size) {
    uint32_t min = o->min_budget ? o->min_budget : p->budget;
    if (min > p->budget || min <= p->window || min % p->window != 0) {
        *msg = "min_budget must be a multiple of window, above it and at most budget";
        return -EINVAL;
    }
    struct vase_params at_min = vase_params_at_budget(p, min);
    char rule[224];
    if (vase_params_explain_prompt(&at_min, ret->policy, o->prompt_len, rule, sizeof(rule)) < 0) {
        snprintf(why, why_size, "%s%s", min < p->budget ? "at min_budget: " : "", rule);
        *msg = why;
        return -EINVAL;
    }
    if (o->weight > VASE_MAX_WEIGHT) {
        *msg = "weight must be 0 (default 1) .. 1000";
        return -EINVAL;
    }
    ret->min_budget = min;
    ret->weight = o->weight ? o->weight : 1;
    return 0;
}

/* SeqParams with PROTOCOL.md's defaults applied, checked. 0 or -EINVAL with *msg (which may
 * point into why[0 .. why_size)). */
static int seq_request_from(const struct vased *d, const Vase__OpenSeq *o,
                            struct vased_seq_request *ret, const char **msg, char *why,
                            size_t why_size) {
    const Vase__SeqParams *sp = o->params;
    enum vase_metric implied = VASE_METRIC_RANGE;
    bool has_implied;
    struct vase_params p;

    if (!sp) {
        *msg = "open_seq has no params (budget is required)";
        return -EINVAL;
    }
    *ret = (struct vased_seq_request){0};
    if (policy_from(sp, &ret->policy, &implied, &has_implied, msg) < 0 ||
        params_from(sp, ret->policy, has_implied, implied, &p, msg, why, why_size) < 0)
        return -EINVAL;
    if (o->mode != VASE__MODE__MODE_ASYNC && o->mode != VASE__MODE__MODE_SYNC) {
        *msg = "unknown mode";
        return -EINVAL;
    }
    if (o->prompt_len > VASE_MAX_TOKENS) {
        *msg = "prompt_len too large";
        return -EINVAL;
    }
    int64_t slack = o->slack;
    if (slack < -1) {
        *msg = "slack must be >= 0, or -1 for the default";
        return -EINVAL;
    }
    if (slack == -1)
        slack = d->cfg.default_slack >= 0 ? d->cfg.default_slack : (int64_t)p.window;
    if (slack > (int64_t)VASE_MAX_BUDGET) {
        *msg = "slack too large";
        return -EINVAL;
    }
    uint64_t most = (uint64_t)(o->prompt_len > p.budget ? o->prompt_len : p.budget) + p.window +
                    (uint64_t)slack;
    if (most > VASE_MAX_TOKENS) {
        *msg = "max(prompt_len, budget) + window + slack exceeds the kernels' token limit";
        return -EINVAL;
    }
    ret->params = p;
    if (elastic_from(o, &p, ret, msg, why, why_size) < 0)
        return -EINVAL;
    /* The peer's label goes into replies, events, metrics and logs: the rule keeps it to bytes
     * none of them must escape, and the reason never repeats a byte it refuses. */
    const char *label = o->label ? o->label : "";
    if (vase_wire_label_check(label, why, why_size) < 0) {
        *msg = why;
        return -EINVAL;
    }
    memcpy(ret->label, label, strlen(label) + 1);
    ret->prompt_len = o->prompt_len;
    ret->seed = o->seed;
    ret->mode = (uint32_t)o->mode;
    ret->slack = (uint32_t)slack;
    return 0;
}

/* The admission wait an OpenSeq asks for, in ms, the default applied. 0 or -EINVAL. */
static int admission_wait_from(const struct vased *d, const Vase__OpenSeq *o, uint32_t *ret) {
    if (o->admission_wait_ms < -1 || o->admission_wait_ms > (int32_t)VASE_ADMIT_MAX_WAIT_MS)
        return -EINVAL;
    *ret = o->admission_wait_ms == -1 ? d->cfg.admission_wait_ms : (uint32_t)o->admission_wait_ms;
    return 0;
}

/* A sequence the previous daemon kept (restore.h), taken over by the engine that had it: the
 * same id, pages, budgets and counts, so its KV data stays valid. */
static int handle_reopen(struct vased *d, struct vased_client *c, const struct vase_reply_to *p,
                         struct vased_model *m, const Vase__OpenSeq *o,
                         const struct vased_seq_request *req) {
    if (c->n_seqs >= d->cfg.max_seqs_per_client)
        return vase_reply_error(d, p, EDQUOT,
                                "cannot reopen sequence %u: the client has max_seqs_per_client "
                                "(%u) sequences open",
                                o->resume_seq, d->cfg.max_seqs_per_client);
    struct vased_seq *s;
    char msg[256];
    int r = vase_admission_uid_quota(d, c, msg, sizeof(msg));
    if (r < 0)
        return vase_reply_error(d, p, -r, "cannot reopen sequence %u: %s", o->resume_seq, msg);
    r = vase_restore_reopen(d, c, m, o->resume_seq, o->resume_token.data, o->resume_token.len,
                            req->policy, req->params.budget, req->params.window, &s, msg,
                            sizeof(msg));
    if (r < 0)
        return vase_reply_error(d, p, -r, "cannot reopen: %s", msg);
    log_info("Client %u (uid %u) reopened sequence %u on its kept pages: len %u, %u evictions.",
             c->id, (unsigned)c->uid, s->id, s->len, s->rounds);
    vase_admission_send_layout(d, p, s);
    return 0;
}

static int open_seq(struct vased *d, struct vased_client *c, const struct vase_reply_to *p,
                    const Vase__OpenSeq *o) {
    struct vased_model *m;
    int r = vase_registry_get_model(d->reg, c, o->model_id, &m);
    if (r < 0)
        return vase_reply_error(d, p, -r, "no model %u", o->model_id);

    struct vased_seq_request req;
    const char *msg = NULL;
    char params_why[256];
    r = seq_request_from(d, o, &req, &msg, params_why, sizeof(params_why));
    if (r < 0)
        return vase_reply_error(d, p, EINVAL, "bad open_seq: %s", msg);
    if (o->resume_seq)
        return handle_reopen(d, c, p, m, o, &req);
    uint32_t wait_ms;
    if (admission_wait_from(d, o, &wait_ms) < 0)
        return vase_reply_error(d, p, EINVAL,
                                "bad open_seq: admission_wait_ms %d (want -1 for the default, "
                                "or 0 .. %u)",
                                o->admission_wait_ms, VASE_ADMIT_MAX_WAIT_MS);

    return vase_admission_open(d, c, p, m, &req, wait_ms);
}

/* An open, its refusal counted by reason (metrics). */
static int handle_open_seq(struct vased *d, struct vased_client *c, const struct vase_reply_to *p,
                           const Vase__OpenSeq *o) {
    int r = open_seq(d, c, p, o);
    if (r < 0)
        d->metrics.refusals[vase_metrics_refusal_of(r)]++;
    return r;
}

static int handle_close_seq(struct vased *d, struct vased_client *c, const struct vase_reply_to *p,
                            const Vase__CloseSeq *req) {
    struct vased_seq *s = vase_reply_own_seq(d, c, p, req->seq_id);
    if (!s)
        return 0;
    vase_publish_seq(d, s, false);
    vase_registry_close_seq(d->reg, d->allocs[s->arena_id], s);
    vase_reply_ok(d, p);
    vase_publish_pressure(d, false);
    return 0;
}

static int handle_set_budget(struct vased *d, struct vased_client *c, const struct vase_reply_to *p,
                             const Vase__SetBudget *req) {
    struct vased_seq *s = vase_reply_own_seq(d, c, p, req->seq_id);
    if (!s)
        return 0;
    uint32_t W = s->params.window;
    if (req->budget < s->min_budget || req->budget > s->max_budget || req->budget % W != 0)
        return vase_reply_error(d, p, EINVAL,
                                "set_budget: budget %u of sequence %u must be a multiple of "
                                "window %u in [min_budget %u, budget %u]",
                                req->budget, s->id, W, s->min_budget, s->max_budget);
    log_debug("Client %u: cap of sequence %u %u -> %u.", c->id, s->id, s->cap_budget, req->budget);
    vase_elastic_set_cap(d, s, req->budget);
    vase_reply_ok(d, p);
    return 0;
}

int vase_engine_handle(struct vased *d, struct vased_client *c, const struct vase_reply_to *p,
                       const Vase__Envelope *e) {
    switch (e->body_case) {
    case VASE__ENVELOPE__BODY_REGISTER_MODEL:
        return handle_register_model(d, c, p, e->register_model);
    case VASE__ENVELOPE__BODY_OPEN_SEQ:
        return handle_open_seq(d, c, p, e->open_seq);
    case VASE__ENVELOPE__BODY_CLOSE_SEQ:
        return handle_close_seq(d, c, p, e->close_seq);
    case VASE__ENVELOPE__BODY_SET_BUDGET:
        return handle_set_budget(d, c, p, e->set_budget);
    default:
        return vase_reply_error(d, p, EINVAL, "%s is not a request", vase_wire_body_name(e));
    }
}
