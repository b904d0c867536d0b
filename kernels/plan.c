/* SPDX-License-Identifier: MIT */

/*
 * Plans: from one layer's candidates to each KV head's ordered keep list (ALGORITHM.md,
 * "Policies"). A plan is computed into workspace memory and copied out only when every head
 * succeeded, so a caller never sees half a plan. Heads are independent, which is what lets
 * vase_plan() spread them over threads.
 */

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#include "internal.h"

int vase__plan_check(const struct vase_plan_input *in) {
    if (vase_params_check(&in->params, in->policy) < 0)
        return -EINVAL;
    uint32_t K = vase_plan_keep_count(&in->params);
    unsigned needs = vase_policy_needs(in->policy);
    const struct vase_view *k = &in->k, *v = &in->v;

    if (in->n < K || in->n > VASE_MAX_TOKENS || vase__protected(in) > K)
        return -EINVAL;
    /* The head count comes from k even for policies that read neither k nor v. */
    if (k->heads == 0 || k->heads > VASE_MAX_HEADS)
        return -EINVAL;
    if ((needs & VASE_NEEDS_K) && vase__view_check(k, in->n) < 0)
        return -EINVAL;
    if (needs & VASE_NEEDS_V) {
        if (vase__view_check(v, in->n) < 0 || v->heads != k->heads)
            return -EINVAL;
        if ((needs & VASE_NEEDS_K) && v->dim != k->dim)
            return -EINVAL;
    }
    if ((needs & VASE_NEEDS_Q) && !in->scores) {
        if (in->hq == 0 || in->hq % k->heads != 0 || in->hq > VASE_MAX_HEADS)
            return -EINVAL;
        if (vase__view_check(&in->q, in->params.window) < 0 || in->q.heads != in->hq ||
            in->q.dim != k->dim)
            return -EINVAL;
    }
    if ((needs & VASE_NEEDS_ACC) && !in->acc)
        return -EINVAL;
    return 0;
}

/* Checks everything a plan reads before any work is done: the shapes, and the injected normals,
 * which are on the host here. */
static int input_check(const struct vase_plan_input *in) {
    if (vase__plan_check(in) < 0)
        return -EINVAL;
    unsigned needs = vase_policy_needs(in->policy);
    if (needs & VASE_NEEDS_GAUSS) {
        uint32_t dim = (needs & VASE_NEEDS_K) ? in->k.dim : in->v.dim;
        if (in->gauss && !vase__all_finite(in->gauss, (size_t)dim * in->params.rank))
            return -EINVAL;
    }
    return 0;
}

/* Scratch needed by one head beyond the score functions' own buffers, and where its policy's
 * picks go: the plan is the protected prompt (vase__protected()), then the policy's K picks. */
struct head_bufs {
    float *s, *m, *draws;
    uint32_t *sort;
    uint8_t *mask; /* [n]: candidates no pick may take (the prompt, value-aware's reserved) */
    uint32_t *out; /* the plan after the protected prompt */
    uint32_t K;    /* the picks: vase_plan_keep_count() less the protected prompt */
};

static int head_bufs_get(struct vase_workspace *ws, uint32_t n, struct head_bufs *b) {
    b->s = vase__ws_get(ws, WS_S, (size_t)n * sizeof(float));
    b->m = vase__ws_get(ws, WS_M, (size_t)n * sizeof(float));
    b->draws = vase__ws_get(ws, WS_DRAWS, (size_t)n * sizeof(float));
    b->sort = vase__ws_get(ws, WS_SORT, 4 * (size_t)n * sizeof(uint32_t));
    b->mask = vase__ws_get(ws, WS_MASK, n);
    return b->s && b->m && b->draws && b->sort && b->mask ? 0 : -ENOMEM;
}

static int head_draws(const struct vase_plan_input *in, uint32_t head, float *draws) {
    if (in->exp_draws) {
        memcpy(draws, in->exp_draws + (size_t)head * in->n, (size_t)in->n * sizeof(float));
        return 0;
    }
    vase_rng_exp(&in->rng, head, draws, in->n);
    return 0;
}

/* out = topk(x, K) of the candidates not masked */
static int pick_top(const float *x, uint32_t n, const struct head_bufs *b, uint32_t K,
                    uint32_t *out) {
    return vase__select_top(x, b->mask, n, K, out, b->sort);
}

/* out = sample(w, K) of the candidates not masked: the exponential race over this head's
 * draws, its keys in keys [n]. */
static int pick_sampled(const struct vase_plan_input *in, uint32_t head, const float *w,
                        float *keys, struct head_bufs *b, uint32_t K, uint32_t *out) {
    head_draws(in, head, b->draws);
    int r = vase__race_keys(w, b->draws, in->n, keys);
    return r < 0 ? r : pick_top(keys, in->n, b, K, out);
}

/*
 * The value-aware policies: P = topk(m', n_large) with the sinks forced in when sink_rule is set,
 * then the rest from the attention score with P excluded, sampled or (range-attn) top-k.
 */
static int plan_value_aware(const struct vase_plan_input *in, uint32_t head,
                            struct vase_workspace *ws, struct head_bufs *b, bool sink_rule,
                            bool sampled) {
    uint32_t n = in->n, K = b->K;
    uint32_t n_large = in->params.n_large < K ? in->params.n_large : K;
    int r = vase_value_metric(&in->v, head, n, in->params.metric, b->m);
    if (r < 0)
        return r;
    if (sink_rule)
        for (uint32_t j = 0; j < in->params.n_sink && j < n; j++)
            b->m[j] = INFINITY;
    r = pick_top(b->m, n, b, n_large, b->out);
    if (r < 0 || n_large == K)
        return r;

    r = vase_score_attention(in, head, ws, b->s);
    if (r < 0)
        return r;
    for (uint32_t i = 0; i < n_large; i++)
        b->mask[b->out[i]] = 1;
    if (!sampled)
        return pick_top(b->s, n, b, K - n_large, b->out + n_large);

    float *keys = vase__ws_get(ws, WS_AUX, (size_t)n * sizeof(float));
    if (!keys)
        return -ENOMEM;
    return pick_sampled(in, head, b->s, keys, b, K - n_large, b->out + n_large);
}

/* keep = topk(c, K) with the sinks forced in; c is this head's row of the leverage that
 * vase_plan_heads() computed for all its heads in one pass. */
static int plan_leverage(const struct vase_plan_input *in, const float *lev, struct head_bufs *b) {
    uint32_t n = in->n;
    memcpy(b->s, lev, (size_t)n * sizeof(float));
    for (uint32_t j = 0; j < in->params.n_sink && j < n; j++)
        b->s[j] = 1.0f;
    return pick_top(b->s, n, b, b->K, b->out);
}

/* keep = topk(lambda s - (1 - lambda) red, K) */
static int plan_rkv(const struct vase_plan_input *in, uint32_t head, struct vase_workspace *ws,
                    struct head_bufs *b) {
    uint32_t n = in->n;
    float *red = vase__ws_get(ws, WS_M, (size_t)n * sizeof(float));
    if (!red)
        return -ENOMEM;
    int r = vase_score_attention(in, head, ws, b->s);
    if (r < 0)
        return r;
    r = vase_score_redundancy(&in->k, head, n, ws, red);
    if (r < 0)
        return r;
    float lambda = in->params.lambda;
    for (uint32_t j = 0; j < n; j++)
        b->s[j] = lambda * b->s[j] - (1.0f - lambda) * red[j];
    return pick_top(b->s, n, b, b->K, b->out);
}

/* The sinks (or the protected prompt, if longer) then the most recent candidates: the whole
 * keep, the prompt's entries included. */
static int plan_streaming(const struct vase_plan_input *in, uint32_t *keep) {
    uint32_t n = in->n, K = vase_plan_keep_count(&in->params);
    uint32_t head = vase__streaming_head(in->params.n_sink, vase__protected(in), K);
    for (uint32_t i = 0; i < K; i++)
        keep[i] = i < head ? i : n - (K - head) + (i - head);
    return 0;
}

/* The policy's picks, into b->out. */
static int plan_policy(const struct vase_plan_input *in, uint32_t head, struct vase_workspace *ws,
                       const float *lev, struct head_bufs *b) {
    uint32_t n = in->n;
    int r;

    switch (in->policy) {
    case VASE_POLICY_VASE_ATTNV:
        return plan_value_aware(in, head, ws, b, true, true);
    case VASE_POLICY_RANGE_SAMPLE_ATTN:
        return plan_value_aware(in, head, ws, b, false, true);
    case VASE_POLICY_RANGE_ATTN:
        return plan_value_aware(in, head, ws, b, false, false);
    case VASE_POLICY_VASE_DKV:
    case VASE_POLICY_CURDKV:
        return plan_leverage(in, lev, b);
    case VASE_POLICY_SNAPKV:
        r = vase_score_attention(in, head, ws, b->s);
        return r < 0 ? r : pick_top(b->s, n, b, b->K, b->out);
    case VASE_POLICY_RKV:
        return plan_rkv(in, head, ws, b);
    case VASE_POLICY_RANDOM:
        for (uint32_t j = 0; j < n; j++)
            b->s[j] = 1.0f;
        return pick_sampled(in, head, b->s, b->m, b, b->K, b->out);
    case VASE_POLICY_H2O: {
        const float *acc = in->acc + (size_t)head * n;
        if (!vase__all_finite(acc, n))
            return -EINVAL;
        return pick_top(acc, n, b, b->K, b->out);
    }
    case VASE_POLICY_ATTN_SAMPLE:
        r = vase_score_attention(in, head, ws, b->s);
        return r < 0 ? r : pick_sampled(in, head, b->s, b->m, b, b->K, b->out);
    case VASE_POLICY_EVICT_LARGE_RANGE:
        r = vase_value_metric(&in->v, head, n, in->params.metric, b->m);
        if (r < 0)
            return r;
        for (uint32_t j = 0; j < n; j++)
            b->m[j] = -b->m[j];
        return pick_top(b->m, n, b, b->K, b->out);
    default:
        return -EINVAL;
    }
}

/* One head's keep: the protected prompt in slot order, out of every pick, then the policy's. */
static int plan_one(const struct vase_plan_input *in, uint32_t head, struct vase_workspace *ws,
                    const float *lev, uint32_t *keep) {
    uint32_t n = in->n, prompt = vase__protected(in);
    struct head_bufs b;
    int r = head_bufs_get(ws, n, &b);
    if (r < 0)
        return r;
    if (in->policy == VASE_POLICY_STREAMING)
        return plan_streaming(in, keep);

    memset(b.mask, 0, n);
    for (uint32_t i = 0; i < prompt; i++) {
        keep[i] = i;
        b.mask[i] = 1;
    }
    b.out = keep + prompt;
    b.K = vase_plan_keep_count(&in->params) - prompt;
    return plan_policy(in, head, ws, lev, &b);
}

int vase_plan_heads(const struct vase_plan_input *in, uint32_t h0, uint32_t h1,
                    struct vase_workspace *ws, uint32_t *keep) {
    struct vase_workspace *own = NULL;
    int r;

    if (!in || !keep || input_check(in) < 0 || h0 >= h1 || h1 > in->k.heads)
        return -EINVAL;
    if (!ws) {
        r = vase_workspace_new(&own);
        if (r < 0)
            return r;
        ws = own;
    }

    uint32_t K = vase_plan_keep_count(&in->params);
    uint32_t *out = vase__ws_get(ws, WS_KEEP, (size_t)(h1 - h0) * K * sizeof(uint32_t));
    float *gm = NULL, *lev = NULL;
    r = -ENOMEM;
    if (!out)
        goto finish;

    unsigned needs = vase_policy_needs(in->policy);
    if (needs & VASE_NEEDS_GAUSS) {
        uint32_t dim = in->k.dim, rank = in->params.rank;
        gm = malloc((size_t)dim * rank * sizeof(float));
        lev = malloc((size_t)(h1 - h0) * in->n * sizeof(float));
        if (!gm || !lev)
            goto finish;
        /* CurDKV draws its sketch once per sequence and layer: the draws of round 0. */
        struct vase_rng rng = in->rng;
        if (in->policy == VASE_POLICY_CURDKV)
            rng.round = 0;
        vase_sketch(&rng, in->gauss, dim, rank, gm);
        r = vase__leverage_heads(&in->k, &in->v, h0, h1, in->n, gm, rank, ws, lev);
        if (r < 0)
            goto finish;
    }

    for (uint32_t h = h0; h < h1; h++) {
        r = plan_one(in, h, ws, lev ? lev + (size_t)(h - h0) * in->n : NULL,
                     out + (size_t)(h - h0) * K);
        if (r < 0)
            goto finish;
    }
    memcpy(keep, out, (size_t)(h1 - h0) * K * sizeof(uint32_t));
    r = 0;
finish:
    free(lev);
    free(gm);
    vase_workspace_free(own);
    return r;
}

struct plan_job {
    const struct vase_plan_input *in;
    uint32_t h0, h1;
    struct vase_workspace *ws;
    uint32_t *keep;
    bool started;
    int result;
};

static void *plan_thread(void *arg) {
    struct plan_job *j = arg;
    j->result = vase_plan_heads(j->in, j->h0, j->h1, j->ws, j->keep);
    return NULL;
}

int vase_plan(const struct vase_plan_input *in, unsigned nthreads, struct vase_workspace **ws,
              uint32_t *keep) {
    if (!in || !keep || nthreads == 0 || input_check(in) < 0)
        return -EINVAL;
    uint32_t heads = in->k.heads, K = vase_plan_keep_count(&in->params);
    if (nthreads > heads)
        nthreads = heads;
    if (nthreads == 1)
        return vase_plan_heads(in, 0, heads, ws ? ws[0] : NULL, keep);

    /* Heads go to threads in contiguous blocks; each block lands in a private buffer and
     * the plan is copied out only if every block succeeded. */
    uint32_t *tmp = malloc((size_t)heads * K * sizeof(uint32_t));
    struct plan_job *jobs = calloc(nthreads, sizeof(*jobs));
    pthread_t *tids = calloc(nthreads, sizeof(*tids));
    int r = -ENOMEM;
    if (!tmp || !jobs || !tids)
        goto out;

    for (unsigned t = 0; t < nthreads; t++) {
        jobs[t] = (struct plan_job){
            .in = in,
            .h0 = (uint32_t)((uint64_t)heads * t / nthreads),
            .h1 = (uint32_t)((uint64_t)heads * (t + 1) / nthreads),
            .ws = ws ? ws[t] : NULL,
        };
        jobs[t].keep = tmp + (size_t)jobs[t].h0 * K;
    }
    /* The calling thread takes the first block; a thread that cannot be created leaves its
     * block to the caller too. */
    for (unsigned t = 1; t < nthreads; t++)
        jobs[t].started = pthread_create(&tids[t], NULL, plan_thread, &jobs[t]) == 0;
    plan_thread(&jobs[0]);
    for (unsigned t = 1; t < nthreads; t++) {
        if (jobs[t].started)
            pthread_join(tids[t], NULL);
        else
            plan_thread(&jobs[t]);
    }
    r = 0;
    for (unsigned t = 0; t < nthreads && r == 0; t++)
        r = jobs[t].result;
    if (r == 0)
        memcpy(keep, tmp, (size_t)heads * K * sizeof(uint32_t));
out:
    free(tids);
    free(jobs);
    free(tmp);
    return r;
}
