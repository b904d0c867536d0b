/* SPDX-License-Identifier: MIT */

/*
 * Plans on the GPU: the policies of ALGORITHM.md for all KV heads of one layer, the same plan
 * as vase_plan() for the same inputs and seed (plan.c is the reference; this file follows its
 * control flow policy by policy, so that the same data is read and checked). Also the
 * workspace (the error mapping and vase_cuda_available() are runtime_cuda.cu's).
 *
 * A plan is built in workspace memory. Every kernel that meets a NaN or Inf in what the policy
 * reads (or a value plan.c would reject) raises a device flag; the last kernel copies the plan
 * to the caller's keep only if the flag is still clear, and the call then reads the flag back
 * and synchronises the stream. So keep is written completely or not at all, and when the call
 * returns the plan is complete in device memory.
 *
 * Selection is one stable sort per KV head of the 32-bit keys of select.c (select_cuda.cu); the
 * keys are built here, by keys_kernel(), from the score each policy ranks by.
 */

#include <errno.h>
#include <stdlib.h>

#include "internal_cuda.cuh"

/* ---- Workspace ---- */

extern "C" int vase_cuda_workspace_new(struct vase_cuda_workspace **ret) {
    if (!ret)
        return -EINVAL;
    struct vase_cuda_workspace *ws =
        (struct vase_cuda_workspace *)calloc(1, sizeof(struct vase_cuda_workspace));
    if (!ws)
        return -ENOMEM;
    int r = vase__cuda_errno(cudaGetDevice(&ws->device));
    if (r < 0)
        goto free_ws;
    r = vase__cuda_errno(cudaMallocHost((void **)&ws->host_flag, sizeof(int)));
    if (r < 0)
        goto free_ws;
    *ret = ws;
    return 0;
free_ws:
    free(ws);
    return r;
}

extern "C" struct vase_cuda_workspace *vase_cuda_workspace_free(struct vase_cuda_workspace *ws) {
    if (!ws)
        return NULL;
    int prev = -1;
    /* The buffers belong to the workspace's device; free them there. */
    if (cudaGetDevice(&prev) == cudaSuccess && prev != ws->device)
        (void)cudaSetDevice(ws->device);
    for (unsigned i = 0; i < _CWS_MAX; i++)
        if (ws->buf[i])
            (void)cudaFree(ws->buf[i]);
    if (ws->host_flag)
        (void)cudaFreeHost(ws->host_flag);
    if (prev >= 0 && prev != ws->device)
        (void)cudaSetDevice(prev);
    (void)cudaGetLastError();
    free(ws);
    return NULL;
}

int vase__cws_get(struct vase_cuda_workspace *ws, enum cws_slot slot, size_t bytes, void **ret) {
    if (bytes == 0)
        bytes = 256;
    if (ws->size[slot] >= bytes) {
        *ret = ws->buf[slot];
        return 0;
    }
    /* Grow by half again, so buffers sized by a growing n are not reallocated every call. No
     * kernel of this workspace is in flight here: calls acquire buffers before they launch and
     * synchronise before they return. */
    size_t want = bytes + bytes / 2;
    want = (want + 255) & ~(size_t)255;
    void *p = NULL;
    int r = vase__cuda_errno(cudaMalloc(&p, want));
    if (r < 0)
        return r;
    if (ws->buf[slot])
        (void)cudaFree(ws->buf[slot]);
    ws->buf[slot] = p;
    ws->size[slot] = want;
    *ret = p;
    return 0;
}

int vase__cuda_enter(struct vase_cuda_workspace **ws, struct vase_cuda_workspace **own) {
    int dev = -1, r;

    *own = NULL;
    (void)cudaGetLastError(); /* errors of earlier, unrelated calls are not ours to report */
    r = vase__cuda_errno(cudaGetDevice(&dev));
    if (r < 0)
        return r;
    if (!*ws) {
        r = vase_cuda_workspace_new(own);
        if (r < 0)
            return r;
        *ws = *own;
    }
    if ((*ws)->device != dev)
        return -EINVAL;
    void *flag;
    return vase__cws_get(*ws, CWS_FLAG, sizeof(int), &flag);
}

int vase__cuda_finish(struct vase_cuda_workspace *ws, cudaStream_t stream, int launched) {
    int r = launched;
    if (r == 0)
        r = vase__cuda_errno(cudaMemcpyAsync(ws->host_flag, ws->buf[CWS_FLAG], sizeof(int),
                                             cudaMemcpyDeviceToHost, stream));
    /* Synchronise even after a failed launch: what was queued uses the workspace's buffers. */
    int s = vase__cuda_errno(cudaStreamSynchronize(stream));
    if (r == 0)
        r = s;
    if (r == 0 && *ws->host_flag)
        r = -EINVAL;
    return r;
}

/* ---- Keys ---- */

enum key_mode {
    KEY_TOPK,           /* x */
    KEY_TOPK_SINKS_INF, /* x, +Inf for the sinks (vase-attnv's P) */
    KEY_NEG,            /* -x (evict-large-range) */
    KEY_FINITE,         /* x, which must be finite (h2o's acc) */
    KEY_LEVERAGE,       /* x / tot[h] where tot[h] > 0, 1 for the sinks */
    KEY_RKV,            /* lambda x - (1 - lambda) y / tot[h] */
    KEY_RACE,           /* the race key x / E (0 where x is 0) */
    KEY_RACE_ONE,       /* the race key 1 / E (random) */
};

struct key_args {
    int mode;
    const float *x;     /* [Hkv][n] */
    const float *y;     /* [Hkv][n], KEY_RKV: exp of the redundancy */
    const float *tot;   /* [Hkv], KEY_LEVERAGE and KEY_RKV */
    const float *draws; /* [Hkv][n] injected Exp(1) draws, or NULL for the Philox ones */
    struct vase_rng rng;
    uint32_t n_sink;
    float lambda;
    uint32_t prompt;        /* candidates [0, prompt) are excluded: the protected prompt */
    const uint8_t *exclude; /* [Hkv][n], or NULL */
};

/* Grid (ceil(n / 256), Hkv), 256 threads, one candidate each: keys [Hkv][n] = desc_key() of the
 * policy's score (KEY_EXCLUDED where excluded, the protected prompt included), vals [Hkv][n] =
 * the candidate. The race checks every weight and draw as vase__race_keys() does, excluded
 * candidates included. */
static __global__ void keys_kernel(struct key_args a, uint32_t n, uint32_t *keys, uint32_t *vals,
                                   int *flag) {
    uint32_t j = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y;
    if (j >= n)
        return;
    size_t i = (size_t)h * n + j;
    float key;

    switch (a.mode) {
    case KEY_TOPK:
        key = a.x[i];
        break;
    case KEY_TOPK_SINKS_INF:
        key = j < a.n_sink ? INFINITY : a.x[i];
        break;
    case KEY_NEG:
        key = -a.x[i];
        break;
    case KEY_FINITE:
        key = a.x[i];
        if (!finite_f(key))
            raise_flag(flag);
        break;
    case KEY_LEVERAGE: {
        float t = a.tot[h];
        key = a.x[i];
        if (t > 0.0f)
            key /= t;
        if (j < a.n_sink)
            key = 1.0f;
        break;
    }
    case KEY_RKV: {
        float red = a.y[i] / a.tot[h];
        key = a.lambda * a.x[i] - (1.0f - a.lambda) * red;
        break;
    }
    default: {
        float w = a.mode == KEY_RACE_ONE ? 1.0f : a.x[i];
        float e = a.draws ? a.draws[i] : exp_draw(a.rng, h, j);
        if (!(w >= 0.0f) || w == INFINITY || !(e >= 0.0f))
            raise_flag(flag);
        key = w == 0.0f ? 0.0f : w / e;
        break;
    }
    }
    keys[i] = j < a.prompt || (a.exclude && a.exclude[i]) ? KEY_EXCLUDED : desc_key(key);
    vals[i] = j;
}

/* Grid (ceil(m / 256), Hkv), 256 threads: mask [Hkv][n] = 1 at the first m entries of each
 * head's keep [Hkv][K]. */
static __global__ void mask_kernel(const uint32_t *keep, uint32_t K, uint32_t m, uint32_t n,
                                   uint8_t *mask) {
    uint32_t i = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y;
    if (i < m)
        mask[(size_t)h * n + keep[(size_t)h * K + i]] = 1;
}

/* Grid (ceil(K / 256), Hkv), 256 threads: StreamingLLM's keep [Hkv][K], the sinks (or the
 * protected prompt, if longer) then the most recent candidates. */
static __global__ void streaming_kernel(uint32_t n, uint32_t K, uint32_t sinks, uint32_t *keep) {
    uint32_t i = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y;
    if (i < K)
        keep[(size_t)h * K + i] = i < sinks ? i : n - (K - sinks) + (i - sinks);
}

/* Grid (ceil(prompt / 256), Hkv), 256 threads: the protected prompt at the head of each keep
 * [Hkv][K], in slot order. */
static __global__ void prompt_kernel(uint32_t K, uint32_t prompt, uint32_t *keep) {
    uint32_t i = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y;
    if (i < prompt)
        keep[(size_t)h * K + i] = i;
}

/* Grid ceil(count / 256) capped, 256 threads, grid-stride: dst [count] = src unless the flag is
 * raised, in which case nothing is written. */
static __global__ void commit_kernel(const uint32_t *src, uint64_t count, const int *flag,
                                     uint32_t *dst) {
    if (*flag)
        return;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < count;
         i += (uint64_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

/* ---- Plans ---- */

/* input_check() of plan.c less the checks of data, which the kernels do on the device, plus the
 * device's alignment rule for the views the policy reads. */
static int input_check(const struct vase_plan_input *in) {
    if (vase__plan_check(in) < 0)
        return -EINVAL;
    unsigned needs = vase_policy_needs(in->policy);
    if ((needs & VASE_NEEDS_K) && !dview_aligned(&in->k))
        return -EINVAL;
    if ((needs & VASE_NEEDS_V) && !dview_aligned(&in->v))
        return -EINVAL;
    if ((needs & VASE_NEEDS_Q) && !in->scores && !dview_aligned(&in->q))
        return -EINVAL;
    return 0;
}

static bool value_aware(enum vase_policy p) {
    return p == VASE_POLICY_VASE_ATTNV || p == VASE_POLICY_RANGE_SAMPLE_ATTN ||
           p == VASE_POLICY_RANGE_ATTN;
}

/* What one call needs, worked out before anything is launched. */
struct plan_ctx {
    const struct vase_plan_input *in;
    struct vase_cuda_workspace *ws;
    cudaStream_t stream;
    uint32_t heads, n, K, n_large;
    uint32_t prompt; /* the protected prompt, keep[0 .. prompt) of every head */
    uint32_t pick;   /* K - prompt: what the policy chooses, after the prompt */
    bool metric, attention, sort;
    int *flag;
    uint32_t *keep; /* CWS_KEEP */
};

/* Acquires every buffer the policy uses. */
static int plan_reserve(struct plan_ctx *c) {
    const struct vase_plan_input *in = c->in;
    struct vase_cuda_workspace *ws = c->ws;
    size_t hn = (size_t)c->heads * c->n;
    void *p;
    int r;

    if ((r = vase__cws_get(ws, CWS_KEEP, (size_t)c->heads * c->K * sizeof(uint32_t), &p)) < 0)
        return r;
    c->keep = (uint32_t *)p;
    if (c->sort && ((r = vase__cws_get(ws, CWS_KEYS, hn * sizeof(uint32_t), &p)) < 0 ||
                    (r = vase__cws_get(ws, CWS_VALS, hn * sizeof(uint32_t), &p)) < 0 ||
                    (r = vase__cuda_sort_reserve(ws, c->heads, c->n)) < 0))
        return r;
    if (c->metric && (r = vase__cws_get(ws, CWS_M, hn * sizeof(float), &p)) < 0)
        return r;
    if (c->attention && ((r = vase__cws_get(ws, CWS_S, hn * sizeof(float), &p)) < 0 ||
                         (r = vase__cuda_scores_reserve(in, ws)) < 0))
        return r;
    if (value_aware(in->policy) && c->attention && (r = vase__cws_get(ws, CWS_MASK, hn, &p)) < 0)
        return r;
    if (in->policy == VASE_POLICY_RKV &&
        ((r = vase__cws_get(ws, CWS_M, hn * sizeof(float), &p)) < 0 ||
         (r = vase__cws_get(ws, CWS_AUX, hn * sizeof(float), &p)) < 0 ||
         (r = vase__cws_get(ws, CWS_KN, hn * in->k.dim * sizeof(float), &p)) < 0 ||
         (r = vase__cws_get(ws, CWS_DSUM, (size_t)c->heads * in->k.dim * sizeof(double), &p)) < 0 ||
         (r = vase__cws_get(ws, CWS_TOT, c->heads * sizeof(float), &p)) < 0))
        return r;
    if ((vase_policy_needs(in->policy) & VASE_NEEDS_GAUSS) &&
        ((r = vase__cws_get(ws, CWS_GM, (size_t)in->k.dim * in->params.rank * sizeof(float), &p)) <
             0 ||
         (r = vase__cws_get(ws, CWS_M, hn * sizeof(float), &p)) < 0 ||
         (r = vase__cws_get(ws, CWS_TOT, c->heads * sizeof(float), &p)) < 0))
        return r;
    return 0;
}

/* Keys from a, then the first m of each head into keep[h * K + off ..]. */
static int select_keys(const struct plan_ctx *c, const struct key_args *a, uint32_t m,
                       uint32_t off) {
    uint32_t *keys = (uint32_t *)c->ws->buf[CWS_KEYS], *vals = (uint32_t *)c->ws->buf[CWS_VALS];

    /* Grid (ceil(n / 256), Hkv). The keys are built even when m is 0: they check the draws. */
    keys_kernel<<<dim3(blocks_for(c->n, 256), c->heads), 256, 0, c->stream>>>(*a, c->n, keys, vals,
                                                                              c->flag);
    CUDA_LAUNCHED();
    return vase__cuda_sort_take(c->ws, c->stream, keys, vals, c->heads, c->n, m, c->keep, c->K,
                                off);
}

static struct key_args key_args_of(const struct vase_plan_input *in, int mode, const float *x) {
    struct key_args a;
    a.mode = mode;
    a.x = x;
    a.y = NULL;
    a.tot = NULL;
    a.draws = in->exp_draws;
    a.rng = in->rng;
    a.n_sink = in->params.n_sink;
    a.lambda = in->params.lambda;
    a.prompt = vase__protected(in);
    a.exclude = NULL;
    return a;
}

/* plan_value_aware() of plan.c. */
static int plan_value_aware(const struct plan_ctx *c, bool sink_rule, bool sampled) {
    const struct vase_plan_input *in = c->in;
    float *m = (float *)c->ws->buf[CWS_M];
    int r;

    r = vase__cuda_metric(&in->v, c->heads, c->n, in->params.metric, c->stream, m, c->flag);
    if (r < 0)
        return r;
    struct key_args a = key_args_of(in, sink_rule ? KEY_TOPK_SINKS_INF : KEY_TOPK, m);
    r = select_keys(c, &a, c->n_large, c->prompt);
    if (r < 0 || c->n_large == c->pick)
        return r;

    float *s = (float *)c->ws->buf[CWS_S];
    uint8_t *mask = (uint8_t *)c->ws->buf[CWS_MASK];
    r = vase__cuda_scores(in, c->ws, c->stream, s, c->flag);
    if (r < 0)
        return r;
    CUDA_TRY(cudaMemsetAsync(mask, 0, (size_t)c->heads * c->n, c->stream));
    if (c->n_large > 0) {
        /* Grid (ceil(n_large / 256), Hkv). */
        mask_kernel<<<dim3(blocks_for(c->n_large, 256), c->heads), 256, 0, c->stream>>>(
            c->keep + c->prompt, c->K, c->n_large, c->n, mask);
        CUDA_LAUNCHED();
    }
    a = key_args_of(in, sampled ? KEY_RACE : KEY_TOPK, s);
    a.exclude = mask;
    return select_keys(c, &a, c->pick - c->n_large, c->prompt + c->n_large);
}

/* plan_policy() of plan.c, for all heads at once. */
static int plan_launch(const struct plan_ctx *c) {
    const struct vase_plan_input *in = c->in;
    struct vase_cuda_workspace *ws = c->ws;
    float *s = (float *)ws->buf[CWS_S], *m = (float *)ws->buf[CWS_M];
    float *tot = (float *)ws->buf[CWS_TOT];
    struct key_args a;
    int r;

    switch (in->policy) {
    case VASE_POLICY_VASE_ATTNV:
        return plan_value_aware(c, true, true);
    case VASE_POLICY_RANGE_SAMPLE_ATTN:
        return plan_value_aware(c, false, true);
    case VASE_POLICY_RANGE_ATTN:
        return plan_value_aware(c, false, false);
    case VASE_POLICY_VASE_DKV:
    case VASE_POLICY_CURDKV: {
        /* CurDKV draws its sketch once per sequence and layer: the draws of round 0. */
        struct vase_rng rng = in->rng;
        if (in->policy == VASE_POLICY_CURDKV)
            rng.round = 0;
        float *gm = (float *)ws->buf[CWS_GM];
        r = vase__cuda_sketch(in->gauss, &rng, in->k.dim, in->params.rank, c->stream, gm, c->flag);
        if (r == 0)
            r = vase__cuda_leverage(&in->k, &in->v, c->heads, c->n, gm, in->params.rank, c->stream,
                                    m, tot, c->flag);
        if (r < 0)
            return r;
        a = key_args_of(in, KEY_LEVERAGE, m);
        a.tot = tot;
        return select_keys(c, &a, c->pick, c->prompt);
    }
    case VASE_POLICY_SNAPKV:
        r = vase__cuda_scores(in, ws, c->stream, s, c->flag);
        if (r < 0)
            return r;
        a = key_args_of(in, KEY_TOPK, s);
        return select_keys(c, &a, c->pick, c->prompt);
    case VASE_POLICY_RKV: {
        float *e = (float *)ws->buf[CWS_AUX];
        r = vase__cuda_scores(in, ws, c->stream, s, c->flag);
        if (r < 0)
            return r;
        r = vase__cuda_redundancy(&in->k, c->heads, c->n, (float *)ws->buf[CWS_KN],
                                  (double *)ws->buf[CWS_DSUM], m, c->stream, e, tot, c->flag);
        if (r < 0)
            return r;
        a = key_args_of(in, KEY_RKV, s);
        a.y = e;
        a.tot = tot;
        return select_keys(c, &a, c->pick, c->prompt);
    }
    case VASE_POLICY_STREAMING: {
        uint32_t sinks = vase__streaming_head(in->params.n_sink, c->prompt, c->K);
        /* Grid (ceil(K / 256), Hkv). */
        streaming_kernel<<<dim3(blocks_for(c->K, 256), c->heads), 256, 0, c->stream>>>(
            c->n, c->K, sinks, c->keep);
        CUDA_LAUNCHED();
        return 0;
    }
    case VASE_POLICY_RANDOM:
        a = key_args_of(in, KEY_RACE_ONE, NULL);
        return select_keys(c, &a, c->pick, c->prompt);
    case VASE_POLICY_H2O:
        a = key_args_of(in, KEY_FINITE, in->acc);
        return select_keys(c, &a, c->pick, c->prompt);
    case VASE_POLICY_ATTN_SAMPLE:
        r = vase__cuda_scores(in, ws, c->stream, s, c->flag);
        if (r < 0)
            return r;
        a = key_args_of(in, KEY_RACE, s);
        return select_keys(c, &a, c->pick, c->prompt);
    case VASE_POLICY_EVICT_LARGE_RANGE:
        r = vase__cuda_metric(&in->v, c->heads, c->n, in->params.metric, c->stream, m, c->flag);
        if (r < 0)
            return r;
        a = key_args_of(in, KEY_NEG, m);
        return select_keys(c, &a, c->pick, c->prompt);
    default:
        return -EINVAL;
    }
}

/* plan_one() of plan.c: the protected prompt leads every head's keep (streaming writes its whole
 * keep itself). */
static int plan_prompt(const struct plan_ctx *c) {
    if (c->prompt == 0 || c->in->policy == VASE_POLICY_STREAMING)
        return 0;
    /* Grid (ceil(prompt / 256), Hkv). */
    prompt_kernel<<<dim3(blocks_for(c->prompt, 256), c->heads), 256, 0, c->stream>>>(
        c->K, c->prompt, c->keep);
    CUDA_LAUNCHED();
    return 0;
}

extern "C" int vase_plan_cuda(const struct vase_plan_input *in, struct vase_cuda_workspace *ws,
                              void *stream, uint32_t *keep) {
    struct vase_cuda_workspace *own = NULL;
    struct plan_ctx c;
    int r;

    if (!in || !keep || input_check(in) < 0)
        return -EINVAL;
    enum vase_policy p = in->policy;
    c.in = in;
    c.stream = (cudaStream_t)stream;
    c.heads = in->k.heads;
    c.n = in->n;
    c.K = vase_plan_keep_count(&in->params);
    c.prompt = vase__protected(in);
    c.pick = c.K - c.prompt;
    c.n_large = in->params.n_large < c.pick ? in->params.n_large : c.pick;
    c.metric = value_aware(p) || p == VASE_POLICY_EVICT_LARGE_RANGE;
    c.attention = p == VASE_POLICY_SNAPKV || p == VASE_POLICY_RKV || p == VASE_POLICY_ATTN_SAMPLE ||
                  (value_aware(p) && c.n_large < c.pick);
    c.sort = p != VASE_POLICY_STREAMING;
    /* vase_value_metric() refuses the variance of a single element. */
    if (c.metric && in->params.metric == VASE_METRIC_VAR && in->v.dim < 2)
        return -EINVAL;

    r = vase__cuda_enter(&ws, &own);
    if (r < 0)
        goto out;
    c.ws = ws;
    c.flag = (int *)ws->buf[CWS_FLAG];
    r = plan_reserve(&c);
    if (r < 0)
        goto out;

    r = vase__cuda_errno(cudaMemsetAsync(c.flag, 0, sizeof(int), c.stream));
    if (r == 0)
        r = plan_prompt(&c);
    if (r == 0)
        r = plan_launch(&c);
    if (r == 0) {
        uint64_t count = (uint64_t)c.heads * c.K;
        /* Grid ceil(count / 256), at most 65535 blocks (grid-stride beyond). */
        unsigned blocks = blocks_for(count, 256);
        if (blocks > 65535)
            blocks = 65535;
        commit_kernel<<<blocks, 256, 0, c.stream>>>(c.keep, count, c.flag, keep);
        r = vase__cuda_errno(cudaGetLastError());
    }
    r = vase__cuda_finish(ws, c.stream, r);
out:
    vase_cuda_workspace_free(own);
    return r;
}
