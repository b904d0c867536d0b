/* SPDX-License-Identifier: MIT */

/*
 * Policy names, reference mode names, what each policy reads, and the parameters of
 * ALGORITHM.md with their defaults and bounds. No arithmetic: the client library links this
 * without the scoring code.
 */

#include <errno.h>
#include <math.h>
#include <stdio.h>

#include "internal.h"
#include "vase_layout.h"

static const char *const policy_names[_VASE_POLICY_MAX] = {
    [VASE_POLICY_VASE_ATTNV] = "vase-attnv",
    [VASE_POLICY_VASE_DKV] = "vase-dkv",
    [VASE_POLICY_CURDKV] = "curdkv",
    [VASE_POLICY_SNAPKV] = "snapkv",
    [VASE_POLICY_RKV] = "rkv",
    [VASE_POLICY_STREAMING] = "streaming",
    [VASE_POLICY_RANDOM] = "random",
    [VASE_POLICY_H2O] = "h2o",
    [VASE_POLICY_ATTN_SAMPLE] = "attn-sample",
    [VASE_POLICY_RANGE_ATTN] = "range-attn",
    [VASE_POLICY_RANGE_SAMPLE_ATTN] = "range-sample-attn",
    [VASE_POLICY_EVICT_LARGE_RANGE] = "evict-large-range",
};

static const char *const metric_names[_VASE_METRIC_MAX] = {
    [VASE_METRIC_RANGE] = "range",
    [VASE_METRIC_L2] = "l2",
    [VASE_METRIC_VAR] = "var",
    [VASE_METRIC_ABSMAX] = "absmax",
};

/* The reference's mode names. */
static const struct {
    const char *mode;
    enum vase_policy policy;
    enum vase_metric metric;
} modes[] = {
    {"range_sink_sample_attn", VASE_POLICY_VASE_ATTNV, VASE_METRIC_RANGE},
    {"l2_sink_sample_attn", VASE_POLICY_VASE_ATTNV, VASE_METRIC_L2},
    {"var_sink_sample_attn", VASE_POLICY_VASE_ATTNV, VASE_METRIC_VAR},
    {"absmax_sink_sample_attn", VASE_POLICY_VASE_ATTNV, VASE_METRIC_ABSMAX},
    {"cur_resample_gauss", VASE_POLICY_VASE_DKV, VASE_METRIC_RANGE},
    {"cur_fixed_gauss", VASE_POLICY_CURDKV, VASE_METRIC_RANGE},
    {"attn", VASE_POLICY_SNAPKV, VASE_METRIC_RANGE},
    {"attn_rkv", VASE_POLICY_RKV, VASE_METRIC_RANGE},
    {"streaming", VASE_POLICY_STREAMING, VASE_METRIC_RANGE},
    {"random", VASE_POLICY_RANDOM, VASE_METRIC_RANGE},
    {"h2o", VASE_POLICY_H2O, VASE_METRIC_RANGE},
    {"attn_sample", VASE_POLICY_ATTN_SAMPLE, VASE_METRIC_RANGE},
    {"range_attn", VASE_POLICY_RANGE_ATTN, VASE_METRIC_RANGE},
    {"range_sample_attn", VASE_POLICY_RANGE_SAMPLE_ATTN, VASE_METRIC_RANGE},
    {"evict_large_range", VASE_POLICY_EVICT_LARGE_RANGE, VASE_METRIC_RANGE},
};

const char *vase_policy_to_string(enum vase_policy p) {
    return (unsigned)p < _VASE_POLICY_MAX ? policy_names[p] : NULL;
}

int vase_policy_from_string(const char *s, enum vase_policy *ret) {
    if (!s || !ret)
        return -EINVAL;
    for (unsigned i = 0; i < _VASE_POLICY_MAX; i++)
        if (strcmp(s, policy_names[i]) == 0) {
            *ret = (enum vase_policy)i;
            return 0;
        }
    return -EINVAL;
}

int vase_policy_from_mode(const char *mode, enum vase_policy *ret_policy,
                          enum vase_metric *ret_metric) {
    if (!mode || !ret_policy || !ret_metric)
        return -EINVAL;
    for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++)
        if (strcmp(mode, modes[i].mode) == 0) {
            *ret_policy = modes[i].policy;
            *ret_metric = modes[i].metric;
            return 0;
        }
    return -EINVAL;
}

const char *vase_metric_to_string(enum vase_metric m) {
    return (unsigned)m < _VASE_METRIC_MAX ? metric_names[m] : NULL;
}

int vase_metric_from_string(const char *s, enum vase_metric *ret) {
    if (!s || !ret)
        return -EINVAL;
    for (unsigned i = 0; i < _VASE_METRIC_MAX; i++)
        if (strcmp(s, metric_names[i]) == 0) {
            *ret = (enum vase_metric)i;
            return 0;
        }
    return -EINVAL;
}

unsigned vase_policy_needs(enum vase_policy p) {
    switch (p) {
    case VASE_POLICY_VASE_ATTNV:
    case VASE_POLICY_RANGE_SAMPLE_ATTN:
        return VASE_NEEDS_K | VASE_NEEDS_V | VASE_NEEDS_Q | VASE_NEEDS_EXP;
    case VASE_POLICY_VASE_DKV:
    case VASE_POLICY_CURDKV:
        return VASE_NEEDS_K | VASE_NEEDS_V | VASE_NEEDS_GAUSS;
    case VASE_POLICY_SNAPKV:
        return VASE_NEEDS_K | VASE_NEEDS_Q;
    case VASE_POLICY_RKV:
        return VASE_NEEDS_K | VASE_NEEDS_Q;
    case VASE_POLICY_STREAMING:
        return 0;
    case VASE_POLICY_RANDOM:
        return VASE_NEEDS_EXP;
    case VASE_POLICY_H2O:
        return VASE_NEEDS_ACC;
    case VASE_POLICY_ATTN_SAMPLE:
        return VASE_NEEDS_K | VASE_NEEDS_Q | VASE_NEEDS_EXP;
    case VASE_POLICY_RANGE_ATTN:
        return VASE_NEEDS_K | VASE_NEEDS_V | VASE_NEEDS_Q;
    case VASE_POLICY_EVICT_LARGE_RANGE:
        return VASE_NEEDS_V;
    default:
        return 0;
    }
}

struct vase_params vase_params_default(uint32_t budget) {
    return (struct vase_params){
        .budget = budget,
        .window = 64,
        .n_sink = 4,
        .n_large = budget / 4,
        .temperature = 1.0f,
        .rank = 20,
        .lambda = 0.5f,
        .smooth = 5,
        .metric = VASE_METRIC_RANGE,
    };
}

struct vase_params vase_params_at_budget(const struct vase_params *at_max, uint32_t budget) {
    struct vase_params p = *at_max;
    p.budget = budget;
    p.n_large = (uint32_t)((uint64_t)at_max->n_large * budget / at_max->budget);
    return p;
}

int vase_params_explain(const struct vase_params *p, enum vase_policy policy, char *msg,
                        size_t msg_size) {
    if (msg && msg_size)
        msg[0] = '\0';
    if (!p)
        return vase_layout_refuse(msg, msg_size, "no parameters");
    if ((unsigned)policy >= _VASE_POLICY_MAX)
        return vase_layout_refuse(msg, msg_size, "unknown policy %d", (int)policy);
    if (p->window == 0)
        return vase_layout_refuse(msg, msg_size, "window must be positive");
    if (p->budget <= p->window)
        return vase_layout_refuse(msg, msg_size,
                                  "budget must be larger than window (budget %u <= window %u)",
                                  p->budget, p->window);
    if (p->budget % p->window != 0)
        return vase_layout_refuse(
            msg, msg_size,
            "budget must be a multiple of window (budget %u, window %u; %u or %u "
            "would be)",
            p->budget, p->window, p->budget / p->window * p->window,
            (p->budget / p->window + 1) * p->window);
    if (p->budget > VASE_MAX_BUDGET)
        return vase_layout_refuse(msg, msg_size, "budget must be at most %u (budget %u)",
                                  VASE_MAX_BUDGET, p->budget);
    if (p->n_sink > p->budget)
        return vase_layout_refuse(msg, msg_size,
                                  "n_sink must not exceed budget (n_sink %u > budget %u)",
                                  p->n_sink, p->budget);
    if (p->n_large > p->budget)
        return vase_layout_refuse(msg, msg_size,
                                  "n_large must not exceed budget (n_large %u > budget %u)",
                                  p->n_large, p->budget);
    if (!(p->temperature > 0.0f) || !isfinite(p->temperature))
        return vase_layout_refuse(msg, msg_size,
                                  "temperature must be positive and finite (temperature %g)",
                                  (double)p->temperature);
    if (!(p->lambda >= 0.0f && p->lambda <= 1.0f))
        return vase_layout_refuse(msg, msg_size, "lambda must be in [0, 1] (lambda %g)",
                                  (double)p->lambda);
    if (p->smooth == 0 || p->smooth % 2 == 0 || p->smooth > VASE_MAX_SMOOTH)
        return vase_layout_refuse(msg, msg_size, "smooth must be odd, 1 .. %u (smooth %u)",
                                  VASE_MAX_SMOOTH, p->smooth);
    if (p->rank == 0 || p->rank > VASE_MAX_RANK)
        return vase_layout_refuse(msg, msg_size, "rank must be 1 .. %u (rank %u)", VASE_MAX_RANK,
                                  p->rank);
    if ((unsigned)p->metric >= _VASE_METRIC_MAX)
        return vase_layout_refuse(msg, msg_size, "unknown metric %d", (int)p->metric);
    if (p->protect_prompt > 1)
        return vase_layout_refuse(
            msg, msg_size, "protect_prompt must be 0 or 1 (protect_prompt %u)", p->protect_prompt);
    return 0;
}

int vase_params_explain_prompt(const struct vase_params *p, enum vase_policy policy,
                               uint32_t prompt_len, char *msg, size_t msg_size) {
    int r = vase_params_explain(p, policy, msg, msg_size);
    if (r < 0 || !p->protect_prompt || prompt_len <= p->budget - p->window)
        return r;
    /* Every plan keeps the whole prompt and the window: they must fit the budget together. */
    return vase_layout_refuse(msg, msg_size,
                              "protect_prompt needs prompt_len at most budget - window, so that "
                              "the prompt and the window fit the budget (prompt_len %u, budget "
                              "%u, window %u: at most %u)",
                              prompt_len, p->budget, p->window, p->budget - p->window);
}

int vase_params_check(const struct vase_params *p, enum vase_policy policy) {
    return vase_params_explain(p, policy, NULL, 0);
}

uint32_t vase_plan_keep_count(const struct vase_params *p) {
    return p->budget - p->window;
}
