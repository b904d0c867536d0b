/* SPDX-License-Identifier: MIT */

/*
 * compare_kernels: the CUDA kernels against the CPU reference, on random inputs read the way
 * the daemon reads them: K and V in the paged arena layout ([K,V][token][kv_head][dim] per page,
 * padded page strides) behind shuffled block tables, the queries in a paged ring of 2W slots
 * starting at a random slot, in float32, float16 and bfloat16, for every policy and value
 * metric, at the Qwen3-4B geometry and at small odd ones.
 *
 * What must agree, and how exactly:
 *  - plans whose scores the GPU sums in the CPU's order (streaming, random, h2o,
 *    evict-large-range, vase-dkv, curdkv, and every attention policy given pushed scores):
 *    the same keep lists, entry for entry;
 *  - the windowed attention score, which the CPU sums through OpenBLAS: within float rounding
 *    (relative 1e-3 of the score plus 1e-6 of the head's largest); and then, exactly, the GPU
 *    plan against the CPU plan given the GPU's scores (so the selection is checked bit for
 *    bit), and the GPU plan against the CPU's own plan up to near-ties: wherever they differ,
 *    the GPU's list must still be a valid ranking of the CPU's keys within 1e-4 relative;
 *  - NaN or Inf in what a policy reads: -EINVAL from both, and the GPU's keep untouched; data
 *    a policy does not read does not matter;
 *  - the scores themselves where the GPU sums in the CPU's order (value metrics, leverage: bit
 *    for bit; redundancy: within 4 ulp, the CPU's expf not being correctly rounded) and the
 *    Philox draws (bit for bit, but for a rare last-bit difference of the double
 *    transcendentals);
 *  - compaction: the whole arena byte for byte after vase_compact() and vase_compact_cuda(); an
 *    invalid plan moves nothing.
 *
 * Output: a FAIL line with context for each mismatch, a summary line per section, and a last
 * line "compare_kernels: N checks, N failed". Exit status 0 only if nothing failed and every
 * section ran. --quick runs fewer trials.
 */

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "vase_kernels.h"

/* ---- plumbing ---------------------------------------------------------------------------- */

static unsigned long checks, failures;
static bool verbose;
static uint32_t max_budget = UINT32_MAX; /* geometries with a larger budget are skipped */
static const char *only_geom;            /* --geom: this geometry alone */
static int only_policy = -1;             /* --policy: this policy alone */

static void cuda_check(cudaError_t e, const char *what, int line) {
    if (e != cudaSuccess) {
        fprintf(stderr, "compare_kernels:%d: %s: %s\n", line, what, cudaGetErrorString(e));
        exit(2);
    }
}
#define CU(call) cuda_check((call), #call, __LINE__)

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "compare_kernels: out of memory\n");
        exit(2);
    }
    return p;
}

static void *dmalloc(size_t n) {
    void *p = NULL;
    CU(cudaMalloc(&p, n ? n : 1));
    return p;
}

/*
 * Uploads wait for the device: a cudaMemcpy() from pageable memory may return before its DMA
 * is done, and the kernels under test run on a non-blocking stream, which does not wait for the
 * legacy default stream the copies go to.
 */
static void *to_dev(const void *src, size_t n) {
    void *p = dmalloc(n);
    CU(cudaMemcpy(p, src, n, cudaMemcpyHostToDevice));
    CU(cudaDeviceSynchronize());
    return p;
}

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...) {
    va_list ap;
    failures++;
    printf("FAIL ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

/* splitmix64: the test data's generator. */
static uint64_t rng_state = 0x5eed;
static uint64_t rnd(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static uint32_t rnd_below(uint32_t n) {
    return n ? (uint32_t)(rnd() % n) : 0;
}
static double rnd_unit(void) {
    return ((rnd() >> 11) + 0.5) * 0x1p-53;
}
static float rnd_normal(void) {
    return (float)(sqrt(-2.0 * log(rnd_unit())) * cos(6.283185307179586 * rnd_unit()));
}

static void shuffle(uint32_t *a, uint32_t n) {
    for (uint32_t i = n; i > 1; i--) {
        uint32_t j = rnd_below(i), t = a[i - 1];
        a[i - 1] = a[j];
        a[j] = t;
    }
}

/* ---- paged tensors ----------------------------------------------------------------------- */

/*
 * One layer's pages on the host and their copy on the device: each page holds `blocks` blocks
 * of [tpp][heads][dim] (2 for K and V, 1 for the query ring), then pad bytes. The block table
 * maps the logical pages to a shuffled subset of more physical pages.
 */
struct paged {
    enum vase_dtype dtype;
    uint32_t tpp, heads, dim, blocks, pages, phys;
    size_t es, block_bytes, page_bytes, bytes;
    uint8_t *host;
    uint8_t *dev;
    uint32_t *table, *dtable;
};

static void paged_init(struct paged *p, enum vase_dtype dt, uint32_t rows, uint32_t tpp,
                       uint32_t heads, uint32_t dim, uint32_t blocks) {
    static const unsigned pads[] = {0, 2, 4, 16, 64};
    *p = (struct paged){.dtype = dt, .tpp = tpp, .heads = heads, .dim = dim, .blocks = blocks};
    p->es = vase_dtype_size(dt);
    p->block_bytes = (size_t)tpp * heads * dim * p->es;
    p->page_bytes = blocks * p->block_bytes + pads[rnd_below(5)] * p->es;
    p->pages = (rows + tpp - 1) / tpp;
    p->phys = p->pages + 1 + rnd_below(3);
    p->bytes = p->phys * p->page_bytes;
    p->host = xmalloc(p->bytes);
    for (size_t i = 0; i < p->bytes; i++)
        p->host[i] = (uint8_t)rnd(); /* garbage between the rows: nobody may read it */
    uint32_t *perm = xmalloc(p->phys * sizeof(uint32_t));
    for (uint32_t i = 0; i < p->phys; i++)
        perm[i] = i;
    shuffle(perm, p->phys);
    p->table = xmalloc(p->pages * sizeof(uint32_t));
    memcpy(p->table, perm, p->pages * sizeof(uint32_t));
    free(perm);
    p->dev = dmalloc(p->bytes);
    p->dtable = to_dev(p->table, p->pages * sizeof(uint32_t));
}

static void paged_upload(struct paged *p) {
    CU(cudaMemcpy(p->dev, p->host, p->bytes, cudaMemcpyHostToDevice));
    CU(cudaDeviceSynchronize());
}

static void paged_free(struct paged *p) {
    free(p->host);
    free(p->table);
    CU(cudaFree(p->dev));
    CU(cudaFree(p->dtable));
}

/* The host view of block b; dev_view() gives the same view on the device. */
static struct vase_view host_view(const struct paged *p, uint32_t b) {
    return (struct vase_view){
        .base = p->host + b * p->block_bytes,
        .pages = p->table,
        .tokens_per_page = p->tpp,
        .heads = p->heads,
        .dim = p->dim,
        .dtype = p->dtype,
        .page_stride = (int64_t)p->page_bytes,
        .token_stride = (int64_t)((size_t)p->heads * p->dim * p->es),
        .head_stride = (int64_t)((size_t)p->dim * p->es),
    };
}

static struct vase_view dev_view(const struct paged *p, const struct vase_view *hv) {
    struct vase_view v = *hv;
    v.base = p->dev + ((uint8_t *)hv->base - p->host);
    v.pages = p->dtable;
    return v;
}

static void store(void *dst, enum vase_dtype dt, float x) {
    if (dt == VASE_DTYPE_F32) {
        memcpy(dst, &x, 4);
    } else {
        uint16_t h = dt == VASE_DTYPE_F16 ? vase_f32_to_f16(x) : vase_f32_to_bf16(x);
        memcpy(dst, &h, 2);
    }
}

static void put(const struct vase_view *v, uint32_t row, uint32_t head, uint32_t d, float x) {
    store((uint8_t *)vase_view_row(v, row, head) + d * vase_dtype_size(v->dtype), v->dtype, x);
}

/* Rows [0, rows) of every head: normal values times scale, a few rows much larger, and a few
 * exact copies of other rows (ties in every score that reads only the row). */
static void fill(const struct vase_view *v, uint32_t rows, float scale) {
    size_t rb = (size_t)v->dim * vase_dtype_size(v->dtype);
    for (uint32_t h = 0; h < v->heads; h++) {
        for (uint32_t r = 0; r < rows; r++) {
            float s = rnd_below(50) == 0 ? 8.0f * scale : scale;
            for (uint32_t d = 0; d < v->dim; d++)
                put(v, r, h, d, s * rnd_normal());
        }
        for (uint32_t c = 0; c < rows / 30; c++) {
            uint32_t a = rnd_below(rows), b = rnd_below(rows);
            memcpy(vase_view_row(v, a, h), vase_view_row(v, b, h), rb);
        }
    }
}

/* ---- one plan case ----------------------------------------------------------------------- */

struct geom {
    const char *name;
    uint32_t hq, hkv, dim, budget, window, tpp, extra;
    unsigned trials;
    bool defaults; /* keep the default parameters (the model geometries) */
};

static const struct geom geoms[] = {
    {"qwen3-4b", 32, 8, 128, 4096, 64, 16, 64, 1, true},
    {"odd-a", 6, 3, 40, 96, 16, 7, 40, 4, false},
    {"odd-b", 4, 4, 17, 40, 8, 5, 30, 4, false},
    {"odd-c", 10, 2, 72, 320, 32, 32, 200, 3, false},
    {"tiny", 1, 1, 3, 12, 4, 3, 9, 6, false},
    {"wide-window", 2, 1, 64, 300, 100, 64, 150, 3, false},
    {"d256", 8, 1, 256, 200, 40, 13, 70, 3, false},
    {"d2-g3", 3, 1, 2, 30, 10, 4, 10, 4, false},
};

static bool geom_wanted(const struct geom *g) {
    return g->budget <= max_budget && (!only_geom || strcmp(only_geom, g->name) == 0);
}

struct variant {
    enum vase_policy policy;
    enum vase_metric metric;
};

static const struct variant variants[] = {
    {VASE_POLICY_VASE_ATTNV, VASE_METRIC_RANGE},
    {VASE_POLICY_VASE_ATTNV, VASE_METRIC_L2},
    {VASE_POLICY_VASE_ATTNV, VASE_METRIC_VAR},
    {VASE_POLICY_VASE_ATTNV, VASE_METRIC_ABSMAX},
    {VASE_POLICY_VASE_DKV, VASE_METRIC_RANGE},
    {VASE_POLICY_CURDKV, VASE_METRIC_RANGE},
    {VASE_POLICY_SNAPKV, VASE_METRIC_RANGE},
    {VASE_POLICY_RKV, VASE_METRIC_RANGE},
    {VASE_POLICY_STREAMING, VASE_METRIC_RANGE},
    {VASE_POLICY_RANDOM, VASE_METRIC_RANGE},
    {VASE_POLICY_H2O, VASE_METRIC_RANGE},
    {VASE_POLICY_ATTN_SAMPLE, VASE_METRIC_RANGE},
    {VASE_POLICY_RANGE_ATTN, VASE_METRIC_RANGE},
    {VASE_POLICY_RANGE_SAMPLE_ATTN, VASE_METRIC_RANGE},
    {VASE_POLICY_EVICT_LARGE_RANGE, VASE_METRIC_RANGE},
    {VASE_POLICY_EVICT_LARGE_RANGE, VASE_METRIC_L2},
    {VASE_POLICY_EVICT_LARGE_RANGE, VASE_METRIC_VAR},
    {VASE_POLICY_EVICT_LARGE_RANGE, VASE_METRIC_ABSMAX},
};

static bool uses_attention(enum vase_policy p) {
    return p == VASE_POLICY_VASE_ATTNV || p == VASE_POLICY_SNAPKV || p == VASE_POLICY_RKV ||
           p == VASE_POLICY_ATTN_SAMPLE || p == VASE_POLICY_RANGE_ATTN ||
           p == VASE_POLICY_RANGE_SAMPLE_ATTN;
}

static bool value_aware(enum vase_policy p) {
    return p == VASE_POLICY_VASE_ATTNV || p == VASE_POLICY_RANGE_ATTN ||
           p == VASE_POLICY_RANGE_SAMPLE_ATTN;
}

/* Everything of one case, on the host and on the device. */
struct pcase {
    char name[192];
    struct paged kv, qr;
    struct vase_plan_input hin, din;         /* host and device pointers */
    float *acc, *scores, *draws, *gauss;     /* host, or NULL */
    float *dacc, *dscores, *ddraws, *dgauss; /* device copies */
    uint32_t K, heads;
};

static void case_free(struct pcase *c) {
    paged_free(&c->kv);
    paged_free(&c->qr);
    free(c->acc);
    free(c->scores);
    free(c->draws);
    free(c->gauss);
    cudaFree(c->dacc);
    cudaFree(c->dscores);
    cudaFree(c->ddraws);
    cudaFree(c->dgauss);
}

/* Values from a small set: many exact ties. */
static float *quantised(size_t count, bool zeros) {
    float *x = xmalloc(count * sizeof(float));
    for (size_t i = 0; i < count; i++)
        x[i] = (float)rnd_below(zeros ? 12 : 11) / 8.0f + (zeros ? 0.0f : 0.125f);
    return x;
}

static float *exp_draws(size_t count) {
    float *x = xmalloc(count * sizeof(float));
    for (size_t i = 0; i < count; i++)
        x[i] = (float)(-log(rnd_unit()));
    return x;
}

static void case_sync(struct pcase *c) {
    paged_upload(&c->kv);
    paged_upload(&c->qr);
    size_t hn = (size_t)c->heads * c->hin.n * sizeof(float);
    size_t dr = (size_t)c->hin.k.dim * c->hin.params.rank * sizeof(float);
    if (c->acc)
        CU(cudaMemcpy(c->dacc, c->acc, hn, cudaMemcpyHostToDevice));
    if (c->scores)
        CU(cudaMemcpy(c->dscores, c->scores, hn, cudaMemcpyHostToDevice));
    if (c->draws)
        CU(cudaMemcpy(c->ddraws, c->draws, hn, cudaMemcpyHostToDevice));
    if (c->gauss)
        CU(cudaMemcpy(c->dgauss, c->gauss, dr, cudaMemcpyHostToDevice));
    CU(cudaDeviceSynchronize());
}

/* A random case of a geometry, dtype and variant. push_scores: attention from pushed scores. */
static void case_make(struct pcase *c, const struct geom *g, enum vase_dtype dt,
                      const struct variant *va, bool push_scores) {
    memset(c, 0, sizeof(*c));
    struct vase_params p = vase_params_default(g->budget);
    p.window = g->window;
    p.metric = va->metric;
    if (!g->defaults) {
        static const uint32_t smooths[] = {1, 3, 5, 7}, ranks[] = {20, 1, 7, 13, 8};
        static const float temps[] = {1.0f, 0.5f, 2.0f};
        p.smooth = smooths[rnd_below(4)];
        p.temperature = temps[rnd_below(3)];
        p.rank = ranks[rnd_below(5)];
        p.n_sink = rnd_below(3) == 0 ? rnd_below(3) : 4;
        p.lambda = rnd_below(2) ? 0.5f : 0.25f;
        switch (rnd_below(5)) {
        case 0:
            p.n_large = 0;
            break;
        case 1:
            p.n_large = g->budget - g->window; /* all of K */
            break;
        case 2:
            p.n_large = g->budget; /* more than K: clamped */
            break;
        default:
            p.n_large = g->budget / 4;
        }
    }
    if (p.smooth > VASE_MAX_SMOOTH)
        p.smooth = 5;
    uint32_t K = vase_plan_keep_count(&p), n;
    switch (g->defaults ? 3 : rnd_below(5)) {
    case 0:
        n = K;
        break;
    case 1:
        n = K + 1;
        break;
    case 2:
        n = g->budget;
        break;
    default:
        n = g->budget + rnd_below(g->extra + 1);
    }
    /* A protected prompt of 0 .. K slots, now and then (ALGORITHM.md, protect_prompt). */
    uint32_t prompt = 0;
    if (!g->defaults && rnd_below(4) == 0) {
        p.protect_prompt = 1;
        prompt = rnd_below(K + 1);
    }
    uint32_t len = n + g->window;
    c->K = K;
    c->heads = g->hkv;

    paged_init(&c->kv, dt, len, g->tpp, g->hkv, g->dim, 2);
    paged_init(&c->qr, dt, 2 * g->window, g->tpp, g->hq, g->dim, 1);
    struct vase_view k = host_view(&c->kv, 0), v = host_view(&c->kv, 1), q = host_view(&c->qr, 0);
    fill(&k, len, 1.0f);
    fill(&v, len, 1.0f);
    fill(&q, 2 * g->window, 1.0f);
    q.ring = 2 * g->window;
    q.first = rnd_below(q.ring);

    struct vase_rng rng = {.seed = rnd(),
                           .sequence = (uint32_t)rnd(),
                           .layer = rnd_below(64),
                           .round = rnd_below(100)};
    unsigned needs = vase_policy_needs(va->policy);
    size_t hn = (size_t)g->hkv * n;
    if (needs & VASE_NEEDS_ACC) {
        c->acc = quantised(hn, true);
        c->dacc = dmalloc(hn * sizeof(float));
    }
    if (push_scores) {
        c->scores = quantised(hn, true);
        c->dscores = dmalloc(hn * sizeof(float));
    }
    if ((needs & VASE_NEEDS_EXP) && rnd_below(4) == 0) {
        c->draws = exp_draws(hn);
        c->ddraws = dmalloc(hn * sizeof(float));
    }
    if ((needs & VASE_NEEDS_GAUSS) && rnd_below(4) == 0) {
        size_t count = (size_t)g->dim * p.rank;
        c->gauss = xmalloc(count * sizeof(float));
        for (size_t i = 0; i < count; i++)
            c->gauss[i] = rnd_normal();
        c->dgauss = dmalloc(count * sizeof(float));
    }

    c->hin = (struct vase_plan_input){
        .policy = va->policy,
        .params = p,
        .n = n,
        .hq = g->hq,
        .k = k,
        .v = v,
        .q = q,
        .acc = c->acc,
        .scores = c->scores,
        .rng = rng,
        .exp_draws = c->draws,
        .gauss = c->gauss,
        .prompt_len = prompt,
    };
    c->din = c->hin;
    c->din.k = dev_view(&c->kv, &k);
    c->din.v = dev_view(&c->kv, &v);
    c->din.q = dev_view(&c->qr, &q);
    c->din.acc = c->dacc;
    c->din.scores = c->dscores;
    c->din.exp_draws = c->ddraws;
    c->din.gauss = c->dgauss;
    case_sync(c);

    snprintf(c->name, sizeof(c->name),
             "%s %s %s/%s%s n=%u K=%u n_large=%u sinks=%u smooth=%u T=%g r=%u protect=%u%s%s%s",
             g->name, vase_dtype_to_string(dt), vase_policy_to_string(va->policy),
             vase_metric_to_string(va->metric), push_scores ? " pushed-scores" : "", n, K,
             p.n_large, p.n_sink, p.smooth, (double)p.temperature, p.rank, prompt,
             c->draws ? " injected-exp" : "", c->gauss ? " injected-gauss" : "",
             c->acc ? " acc" : "");
}

static unsigned cpu_threads(uint32_t heads) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1)
        n = 1;
    return (unsigned)(n < (long)heads ? n : heads);
}

static int cpu_plan(const struct vase_plan_input *in, uint32_t *keep) {
    return vase_plan(in, cpu_threads(in->k.heads), NULL, keep);
}

static struct vase_cuda_workspace *gws;
static cudaStream_t gstream;

#define SENTINEL 0xabababab

/* The GPU plan into keep (host). On failure checks that the device keep was not written. */
static int gpu_plan(const struct pcase *c, const struct vase_plan_input *din, uint32_t *keep) {
    size_t bytes = (size_t)c->heads * c->K * sizeof(uint32_t);
    uint32_t *dkeep = dmalloc(bytes);
    CU(cudaMemset(dkeep, 0xab, bytes));
    CU(cudaDeviceSynchronize()); /* the memset runs on the legacy stream, the plan on gstream */
    int r = vase_plan_cuda(din, gws, gstream, dkeep);
    CU(cudaMemcpy(keep, dkeep, bytes, cudaMemcpyDeviceToHost));
    CU(cudaFree(dkeep));
    if (r < 0) {
        for (size_t i = 0; i < (size_t)c->heads * c->K; i++)
            if (keep[i] != SENTINEL) {
                fail("%s: vase_plan_cuda() failed (%s) but wrote keep[%zu] = %u", c->name,
                     strerror(-r), i, keep[i]);
                break;
            }
    }
    return r;
}

/* Prints the first difference of two plans with some context; returns the number of
 * differing entries. */
static size_t plan_diff(const char *what, const struct pcase *c, const uint32_t *cpu,
                        const uint32_t *gpu, bool report) {
    size_t diff = 0, first = 0;
    size_t total = (size_t)c->heads * c->K;
    for (size_t i = 0; i < total; i++)
        if (cpu[i] != gpu[i] && diff++ == 0)
            first = i;
    if (diff && report) {
        uint32_t h = (uint32_t)(first / c->K), i = (uint32_t)(first % c->K);
        fail("%s: %s: %zu of %zu entries differ; first at head %u entry %u", c->name, what, diff,
             total, h, i);
        uint32_t lo = i >= 3 ? i - 3 : 0, hi = i + 4 < c->K ? i + 4 : c->K;
        printf("      entry:");
        for (uint32_t e = lo; e < hi; e++)
            printf(" %8u", e);
        printf("\n      cpu:  ");
        for (uint32_t e = lo; e < hi; e++)
            printf(" %8u", cpu[(size_t)h * c->K + e]);
        printf("\n      gpu:  ");
        for (uint32_t e = lo; e < hi; e++)
            printf(" %8u", gpu[(size_t)h * c->K + e]);
        printf("\n");
    }
    return diff;
}

/*
 * The CPU's own keys of the ranked part of an attention plan, for the near-tie check:
 * key [Hkv][n], tol [Hkv][n] (1e-4 relative to the terms), and how many leading entries
 * of each head (P of the value-aware policies) must match exactly rather than within tol.
 */
static int cpu_keys(const struct pcase *c, const struct vase_plan_input *in, float *key, float *tol,
                    uint32_t *ret_fixed) {
    uint32_t n = in->n, K = c->K;
    uint32_t n_large = in->params.n_large < K ? in->params.n_large : K;
    struct vase_workspace *ws = NULL;
    float *s = xmalloc(n * sizeof(float)), *aux = xmalloc(n * sizeof(float));
    int r = vase_workspace_new(&ws);
    if (r < 0)
        return r;
    *ret_fixed = value_aware(in->policy) ? n_large : 0;
    for (uint32_t h = 0; h < c->heads && r == 0; h++) {
        float *kh = key + (size_t)h * n, *th = tol + (size_t)h * n;
        r = vase_score_attention(in, h, ws, s);
        if (r < 0)
            break;
        bool sampled = in->policy == VASE_POLICY_ATTN_SAMPLE ||
                       in->policy == VASE_POLICY_VASE_ATTNV ||
                       in->policy == VASE_POLICY_RANGE_SAMPLE_ATTN;
        if (sampled) {
            if (in->exp_draws)
                memcpy(aux, in->exp_draws + (size_t)h * n, n * sizeof(float));
            else
                vase_rng_exp(&in->rng, h, aux, n);
            for (uint32_t j = 0; j < n; j++) {
                kh[j] = s[j] == 0.0f ? 0.0f : s[j] / aux[j];
                th[j] = 1e-4f * fabsf(kh[j]);
            }
        } else if (in->policy == VASE_POLICY_RKV) {
            r = vase_score_redundancy(&in->k, h, n, ws, aux);
            float l = in->params.lambda;
            for (uint32_t j = 0; j < n; j++) {
                kh[j] = l * s[j] - (1.0f - l) * aux[j];
                th[j] = 1e-4f * (l * fabsf(s[j]) + (1.0f - l) * fabsf(aux[j]));
            }
        } else {
            for (uint32_t j = 0; j < n; j++) {
                kh[j] = s[j];
                th[j] = 1e-4f * fabsf(s[j]);
            }
        }
    }
    vase_workspace_free(ws);
    free(aux);
    free(s);
    return r;
}

/*
 * True if the GPU plan is a valid ranking of the CPU's keys within tolerance: its first `fixed`
 * entries of each head equal the CPU's, the rest descend within tolerance, and no candidate
 * left out (nor in P) outranks the kept ones beyond it.
 */
static bool near_tie_only(const struct pcase *c, const struct vase_plan_input *in,
                          const uint32_t *cpu, const uint32_t *gpu) {
    uint32_t n = c->hin.n, K = c->K, fixed = 0;
    float *key = xmalloc((size_t)c->heads * n * sizeof(float));
    float *tol = xmalloc((size_t)c->heads * n * sizeof(float));
    uint8_t *used = xmalloc(n);
    bool ok = cpu_keys(c, in, key, tol, &fixed) == 0;

    for (uint32_t h = 0; h < c->heads && ok; h++) {
        const uint32_t *g = gpu + (size_t)h * K, *cp = cpu + (size_t)h * K;
        const float *kh = key + (size_t)h * n, *th = tol + (size_t)h * n;
        memset(used, 0, n);
        for (uint32_t i = 0; i < fixed && ok; i++) {
            ok = g[i] == cp[i];
            used[g[i]] = 1;
        }
        float floor_key = INFINITY; /* the lowest kept key, plus its tolerance */
        for (uint32_t i = fixed; i < K && ok; i++) {
            uint32_t a = g[i];
            if (a >= n || used[a]) {
                ok = false;
                break;
            }
            used[a] = 1;
            if (i + 1 < K && g[i + 1] < n) {
                uint32_t b = g[i + 1];
                ok = kh[a] + th[a] + th[b] >= kh[b];
            }
            if (kh[a] + th[a] < floor_key)
                floor_key = kh[a] + th[a];
        }
        for (uint32_t j = 0; j < n && ok && fixed < K; j++)
            if (!used[j])
                ok = kh[j] - th[j] <= floor_key;
        if (!ok && verbose)
            printf("      near-tie check fails at head %u\n", h);
    }
    free(used);
    free(tol);
    free(key);
    return ok;
}

/* GPU attention scores vs the CPU's: fails beyond 1e-3 relative plus 1e-6 of the head's
 * largest. Returns the GPU scores (host) for the pushed-scores comparison, or NULL. */
static float *compare_scores(const struct pcase *c, double *ret_max_rel) {
    const struct vase_plan_input *in = &c->hin;
    uint32_t n = in->n;
    size_t hn = (size_t)c->heads * n;
    float *dout = dmalloc(hn * sizeof(float)), *gpu = xmalloc(hn * sizeof(float));
    float *cpu = xmalloc(n * sizeof(float));
    struct vase_workspace *ws = NULL;
    double max_rel = 0.0;
    int r = vase_score_attention_cuda(&c->din, gws, gstream, dout);
    CU(cudaMemcpy(gpu, dout, hn * sizeof(float), cudaMemcpyDeviceToHost));
    CU(cudaFree(dout));
    checks++;
    if (r < 0) {
        fail("%s: vase_score_attention_cuda() failed: %s", c->name, strerror(-r));
        free(gpu);
        gpu = NULL;
        goto out;
    }
    if (vase_workspace_new(&ws) < 0)
        exit(2);
    for (uint32_t h = 0; h < c->heads; h++) {
        r = vase_score_attention(in, h, ws, cpu);
        if (r < 0) {
            fail("%s: vase_score_attention() failed: %s", c->name, strerror(-r));
            break;
        }
        float top = 0.0f;
        for (uint32_t j = 0; j < n; j++)
            top = cpu[j] > top ? cpu[j] : top;
        for (uint32_t j = 0; j < n; j++) {
            float gj = gpu[(size_t)h * n + j];
            double err = fabs((double)gj - cpu[j]);
            double rel = err / (fabs(cpu[j]) + 1e-30);
            if (!(err <= 1e-3 * fabs(cpu[j]) + 1e-6 * top)) {
                fail("%s: attention score head %u slot %u: gpu %.9g cpu %.9g", c->name, h, j,
                     (double)gj, (double)cpu[j]);
                h = c->heads;
                break;
            }
            if (cpu[j] > 1e-3f * top && rel > max_rel)
                max_rel = rel;
        }
    }
out:
    vase_workspace_free(ws);
    free(cpu);
    *ret_max_rel = max_rel;
    return gpu;
}

struct tally {
    unsigned long cases, exact, near_tie;
    double max_rel;
};

static void run_case(const struct geom *g, enum vase_dtype dt, const struct variant *va, bool push,
                     struct tally *t) {
    struct pcase c;
    case_make(&c, g, dt, va, push);
    size_t total = (size_t)c.heads * c.K;
    uint32_t *cpu = xmalloc(total * sizeof(uint32_t)), *gpu = xmalloc(total * sizeof(uint32_t));
    int rc = cpu_plan(&c.hin, cpu);
    int rg = gpu_plan(&c, &c.din, gpu);

    checks++;
    t->cases++;
    if (verbose)
        printf("  case %s\n", c.name);
    if (rc != rg || rc < 0) {
        fail("%s: vase_plan() = %d (%s), vase_plan_cuda() = %d (%s)%s", c.name, rc,
             rc < 0 ? strerror(-rc) : "ok", rg, rg < 0 ? strerror(-rg) : "ok",
             rg < 0 && vase_cuda_last_error() ? vase_cuda_last_error() : "");
        goto out;
    }
    if (vase_plan_validate(gpu, c.heads, c.K, c.hin.n) < 0) {
        fail("%s: the GPU plan is not K distinct candidates per head", c.name);
        goto out;
    }
    bool attention = uses_attention(va->policy) && !push;
    /* R-KV's redundancy goes through the CPU's expf, which the GPU matches but for a rare last
     * bit: its plans may differ at a near-tie even from the same attention scores. */
    bool rkv = va->policy == VASE_POLICY_RKV;
    if (!attention) {
        /* Everything summed in the CPU's order: the same plan. */
        if (plan_diff("plans", &c, cpu, gpu, !rkv) == 0)
            t->exact++;
        else if (rkv && near_tie_only(&c, &c.hin, cpu, gpu))
            t->near_tie++;
        else if (rkv)
            plan_diff("plans (beyond near-ties)", &c, cpu, gpu, true);
        goto out;
    }

    /* The attention policies: scores within rounding, the selection exact given the GPU's
     * scores, the plans equal up to near-ties. */
    double max_rel = 0.0;
    float *sg = NULL;
    uint32_t n_large = c.hin.params.n_large < c.K ? c.hin.params.n_large : c.K;
    if (!(value_aware(va->policy) && n_large == c.K)) {
        sg = compare_scores(&c, &max_rel);
        if (max_rel > t->max_rel)
            t->max_rel = max_rel;
    }
    if (sg) {
        struct vase_plan_input pin = c.hin;
        uint32_t *cpu2 = xmalloc(total * sizeof(uint32_t));
        pin.scores = sg;
        checks++;
        int r = cpu_plan(&pin, cpu2);
        if (r < 0)
            fail("%s: vase_plan() with the GPU's scores failed: %s", c.name, strerror(-r));
        else if (plan_diff("plans given the same (GPU) scores", &c, cpu2, gpu, !rkv) != 0 && rkv &&
                 !near_tie_only(&c, &pin, cpu2, gpu))
            plan_diff("plans given the same (GPU) scores, beyond near-ties", &c, cpu2, gpu, true);
        free(cpu2);
        free(sg);
    }
    checks++;
    if (plan_diff("plans", &c, cpu, gpu, false) == 0)
        t->exact++;
    else if (near_tie_only(&c, &c.hin, cpu, gpu))
        t->near_tie++;
    else
        plan_diff("plans (beyond near-ties)", &c, cpu, gpu, true);
out:
    free(gpu);
    free(cpu);
    case_free(&c);
}

static void section_plans(bool quick) {
    static const enum vase_dtype dts[] = {VASE_DTYPE_F32, VASE_DTYPE_F16, VASE_DTYPE_BF16};
    unsigned long f0 = failures;
    for (size_t gi = 0; gi < sizeof(geoms) / sizeof(geoms[0]); gi++) {
        const struct geom *g = &geoms[gi];
        struct tally t = {0};
        if (!geom_wanted(g)) {
            printf("plans %-12s skipped\n", g->name);
            continue;
        }
        unsigned trials = quick && g->trials > 1 ? 1 : g->trials;
        for (size_t di = 0; di < 3; di++)
            for (size_t vi = 0; vi < sizeof(variants) / sizeof(variants[0]); vi++)
                for (unsigned tr = 0;
                     tr < trials && (only_policy < 0 || (int)variants[vi].policy == only_policy);
                     tr++) {
                    run_case(g, dts[di], &variants[vi], false, &t);
                    if (uses_attention(variants[vi].policy) && tr == 0)
                        run_case(g, dts[di], &variants[vi], true, &t);
                }
        printf("plans %-12s %lu cases: %lu identical, %lu differ only at near-ties; attention "
               "max relative error %.2g\n",
               g->name, t.cases, t.exact, t.near_tie, t.max_rel);
        fflush(stdout);
    }
    printf("%s plans\n", failures == f0 ? "PASS" : "FAIL");
}

/* ---- NaN and Inf ------------------------------------------------------------------------- */

enum poison {
    POISON_K,
    POISON_V,
    POISON_Q,
    POISON_ACC,
    POISON_DRAWS,
    POISON_GAUSS,
    POISON_SCORES,
};

/* Puts one NaN, Inf or negative value into what `where` names, in row/entry `at`. */
static void poison(struct pcase *c, enum poison where, float bad, uint32_t head, uint32_t at) {
    struct vase_plan_input *in = &c->hin;
    switch (where) {
    case POISON_K:
        put(&in->k, at, head, in->k.dim - 1, bad);
        break;
    case POISON_V:
        put(&in->v, at, head, 0, bad);
        break;
    case POISON_Q:
        put(&in->q, at, head, in->q.dim / 2, bad);
        break;
    case POISON_ACC:
        c->acc[(size_t)head * in->n + at] = bad;
        break;
    case POISON_DRAWS:
        c->draws[(size_t)head * in->n + at] = bad;
        break;
    case POISON_GAUSS:
        c->gauss[at] = bad;
        break;
    case POISON_SCORES:
        c->scores[(size_t)head * in->n + at] = bad;
        break;
    }
    case_sync(c);
}

struct nan_case {
    enum vase_policy policy;
    enum poison where;
    float bad;
    bool reads;     /* whether the policy reads it: -EINVAL, else the same plan */
    bool all_large; /* n_large = K: vase-attnv never reads K or Q */
    bool push;      /* pushed scores */
};

static void section_nan(void) {
    const float nan = NAN, inf = INFINITY;
    const struct nan_case cases[] = {
        {VASE_POLICY_VASE_ATTNV, POISON_V, nan, true, false, false},
        {VASE_POLICY_VASE_ATTNV, POISON_K, inf, true, false, false},
        {VASE_POLICY_VASE_ATTNV, POISON_Q, nan, true, false, false},
        {VASE_POLICY_VASE_ATTNV, POISON_Q, -inf, true, false, false},
        {VASE_POLICY_VASE_ATTNV, POISON_DRAWS, nan, true, false, false},
        {VASE_POLICY_VASE_ATTNV, POISON_DRAWS, -1.0f, true, false, false},
        {VASE_POLICY_VASE_ATTNV, POISON_Q, nan, false, true, false},
        {VASE_POLICY_VASE_ATTNV, POISON_K, nan, false, true, false},
        {VASE_POLICY_VASE_DKV, POISON_K, nan, true, false, false},
        {VASE_POLICY_VASE_DKV, POISON_V, inf, true, false, false},
        {VASE_POLICY_CURDKV, POISON_GAUSS, nan, true, false, false},
        {VASE_POLICY_SNAPKV, POISON_K, nan, true, false, false},
        {VASE_POLICY_SNAPKV, POISON_Q, inf, true, false, false},
        {VASE_POLICY_SNAPKV, POISON_SCORES, -0.5f, true, false, true},
        {VASE_POLICY_SNAPKV, POISON_SCORES, inf, true, false, true},
        {VASE_POLICY_SNAPKV, POISON_Q, nan, false, false, true},
        {VASE_POLICY_RKV, POISON_K, nan, true, false, true},
        {VASE_POLICY_H2O, POISON_ACC, nan, true, false, false},
        {VASE_POLICY_H2O, POISON_ACC, -inf, true, false, false},
        {VASE_POLICY_H2O, POISON_K, nan, false, false, false},
        {VASE_POLICY_RANDOM, POISON_DRAWS, nan, true, false, false},
        {VASE_POLICY_RANDOM, POISON_V, nan, false, false, false},
        {VASE_POLICY_ATTN_SAMPLE, POISON_K, inf, true, false, false},
        {VASE_POLICY_RANGE_ATTN, POISON_V, nan, true, false, false},
        {VASE_POLICY_RANGE_SAMPLE_ATTN, POISON_Q, nan, true, false, false},
        {VASE_POLICY_EVICT_LARGE_RANGE, POISON_V, inf, true, false, false},
        {VASE_POLICY_EVICT_LARGE_RANGE, POISON_K, nan, false, false, false},
        {VASE_POLICY_STREAMING, POISON_K, nan, false, false, false},
        {VASE_POLICY_STREAMING, POISON_V, inf, false, false, false},
    };
    static const enum vase_dtype dts[] = {VASE_DTYPE_F32, VASE_DTYPE_F16, VASE_DTYPE_BF16};
    unsigned long f0 = failures, count = 0;
    const struct geom *g = &geoms[1];

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        for (size_t di = 0; di < 3; di++) {
            const struct nan_case *nc = &cases[i];
            struct variant va = {nc->policy, VASE_METRIC_RANGE};
            struct pcase c;
            bool need_draws = nc->where == POISON_DRAWS, need_gauss = nc->where == POISON_GAUSS;
            do { /* the case must carry the injected arrays it poisons */
                case_make(&c, g, dts[di], &va, nc->push);
                if ((!need_draws || c.draws) && (!need_gauss || c.gauss))
                    break;
                case_free(&c);
            } while (1);
            if (nc->all_large != (c.hin.params.n_large >= c.K)) {
                c.hin.params.n_large = nc->all_large ? c.K : c.K / 2;
                c.din.params.n_large = c.hin.params.n_large;
            }
            uint32_t head = rnd_below(c.heads), at;
            switch (nc->where) {
            case POISON_Q:
                head = rnd_below(c.hin.hq);
                at = rnd_below(c.hin.params.window);
                break;
            case POISON_GAUSS:
                at = rnd_below(c.hin.k.dim * c.hin.params.rank);
                break;
            default:
                at = rnd_below(c.hin.n);
            }
            poison(&c, nc->where, nc->bad, head, at);
            size_t total = (size_t)c.heads * c.K;
            uint32_t *cpu = xmalloc(total * sizeof(uint32_t)),
                     *gpu = xmalloc(total * sizeof(uint32_t));
            int rc = cpu_plan(&c.hin, cpu), rg = gpu_plan(&c, &c.din, gpu);
            checks++;
            count++;
            if (nc->reads) {
                if (rc != -EINVAL || rg != -EINVAL)
                    fail("%s: %g at %u/%u (where %d): vase_plan() = %d, vase_plan_cuda() = %d, "
                         "want -EINVAL from both",
                         c.name, (double)nc->bad, head, at, (int)nc->where, rc, rg);
            } else if (rc != 0 || rg != 0) {
                fail("%s: %g where the policy does not read (%d): vase_plan() = %d, "
                     "vase_plan_cuda() = %d, want 0",
                     c.name, (double)nc->bad, (int)nc->where, rc, rg);
            } else if (!uses_attention(nc->policy) || nc->all_large || nc->push) {
                plan_diff("plans with unread NaN", &c, cpu, gpu, true);
            }
            free(gpu);
            free(cpu);
            case_free(&c);
        }
    printf("%s NaN/Inf: %lu cases\n", failures == f0 ? "PASS" : "FAIL", count);
}

/* ---- compaction -------------------------------------------------------------------------- */

/* A plan of K distinct candidates below n per head; identity entries now and then. */
static uint32_t *random_plan(uint32_t heads, uint32_t K, uint32_t n) {
    uint32_t *keep = xmalloc((size_t)heads * K * sizeof(uint32_t) + 4);
    uint32_t *perm = xmalloc(n * sizeof(uint32_t));
    for (uint32_t h = 0; h < heads; h++) {
        for (uint32_t j = 0; j < n; j++)
            perm[j] = j;
        shuffle(perm, n);
        if (rnd_below(2)) /* some kept candidates already in place */
            for (uint32_t i = 0; i < K; i += 1 + rnd_below(4))
                for (uint32_t j = 0; j < n; j++)
                    if (perm[j] == i) {
                        uint32_t t = perm[i];
                        perm[i] = i;
                        perm[j] = t;
                        break;
                    }
        memcpy(keep + (size_t)h * K, perm, K * sizeof(uint32_t));
    }
    free(perm);
    return keep;
}

/* Compacts block b (K or V) of a paged tensor on both sides and compares all bytes. */
static void compact_one(const char *what, struct paged *p, uint32_t blocks, struct vase_view *hv0,
                        const uint32_t *keep, uint32_t K, uint32_t n, uint32_t len, bool valid) {
    uint8_t *orig = xmalloc(p->bytes);
    memcpy(orig, p->host, p->bytes);
    paged_upload(p);
    uint32_t *dkeep = to_dev(keep, (size_t)p->heads * K * sizeof(uint32_t));
    int want = valid ? (int)(K + len - n) : -EINVAL;

    /* Block 0 in the caller's scratch (as libvase calls it), the others in the call's own. */
    size_t scratch_bytes = vase_compact_cuda_scratch_bytes(
        hv0->heads, (size_t)hv0->dim * vase_dtype_size(hv0->dtype), n, K + len - n);
    void *scratch = NULL;
    CU(cudaMalloc(&scratch, scratch_bytes));
    checks++;
    for (uint32_t b = 0; b < blocks; b++) {
        struct vase_view hv = *hv0;
        hv.base = (uint8_t *)hv0->base + b * p->block_bytes;
        struct vase_view dv = dev_view(p, &hv);
        int rc = vase_compact(&hv, keep, K, n, len);
        int rg = b ? vase_compact_cuda(&dv, dkeep, K, n, len, NULL, 0, NULL)
                   : vase_compact_cuda(&dv, dkeep, K, n, len, scratch, scratch_bytes, gstream);
        if (rc != want || rg != (int)(K + len - n))
            fail("compaction %s block %u: vase_compact() = %d (want %d), vase_compact_cuda() "
                 "= %d (want %u)",
                 what, b, rc, want, rg, K + len - n);
    }
    CU(cudaDeviceSynchronize());
    uint8_t *got = xmalloc(p->bytes);
    CU(cudaMemcpy(got, p->dev, p->bytes, cudaMemcpyDeviceToHost));
    if (!valid && memcmp(p->host, orig, p->bytes) != 0)
        fail("compaction %s: the CPU moved data for an invalid plan", what);
    for (size_t i = 0; i < p->bytes; i++)
        if (got[i] != p->host[i]) {
            fail("compaction %s: byte %zu (page %zu offset %zu) gpu %u cpu %u (was %u)%s", what, i,
                 i / p->page_bytes, i % p->page_bytes, got[i], p->host[i], orig[i],
                 valid ? "" : " (invalid plan: nothing may move)");
            break;
        }
    free(got);
    free(orig);
    CU(cudaFree(dkeep));
    CU(cudaFree(scratch));
}

static void section_compact(bool quick) {
    static const enum vase_dtype dts[] = {VASE_DTYPE_F32, VASE_DTYPE_F16, VASE_DTYPE_BF16};
    unsigned long f0 = failures, count = 0;
    for (size_t gi = 0; gi < sizeof(geoms) / sizeof(geoms[0]); gi++)
        for (size_t di = 0; di < 3 && geom_wanted(&geoms[gi]); di++)
            for (unsigned tr = 0; tr < (quick ? 1u : 3u); tr++) {
                const struct geom *g = &geoms[gi];
                uint32_t K = g->budget - g->window;
                uint32_t n = K + rnd_below(g->budget + g->extra - K + 1);
                uint32_t len = n + rnd_below(3 * g->window + 1); /* past n - K: overlapping tail */
                struct paged p;
                char what[128];
                paged_init(&p, dts[di], len, g->tpp, g->hkv, g->dim, 2);
                struct vase_view hv = host_view(&p, 0);
                fill(&hv, len, 1.0f);
                struct vase_view hv1 = host_view(&p, 1);
                fill(&hv1, len, 1.0f);
                uint32_t *keep = random_plan(g->hkv, K, n);
                snprintf(what, sizeof(what), "%s %s K=%u n=%u len=%u", g->name,
                         vase_dtype_to_string(dts[di]), K, n, len);
                compact_one(what, &p, 2, &hv, keep, K, n, len, true);
                count++;
                if (tr == 0 && K >= 2) { /* a repeated entry: nothing may move */
                    keep[K - 1] = keep[0];
                    snprintf(what, sizeof(what), "%s %s invalid plan", g->name,
                             vase_dtype_to_string(dts[di]));
                    compact_one(what, &p, 2, &hv, keep, K, n, len, false);
                    keep[K - 1] = n; /* an entry out of range */
                    compact_one(what, &p, 2, &hv, keep, K, n, len, false);
                    count += 2;
                }
                free(keep);
                paged_free(&p);
            }
    /* A ring, as the query rings are laid out: rows wrap around the 2W slots. */
    for (size_t di = 0; di < 3; di++) {
        struct paged p;
        uint32_t W = 16, K = 5, n = 12, len = 20;
        paged_init(&p, dts[di], 2 * W, 3, 4, 24, 1);
        struct vase_view hv = host_view(&p, 0);
        fill(&hv, 2 * W, 1.0f);
        hv.ring = 2 * W;
        hv.first = 2 * W - 7;
        uint32_t *keep = random_plan(4, K, n);
        compact_one("ring", &p, 1, &hv, keep, K, n, len, true);
        count++;
        free(keep);
        paged_free(&p);
    }
    printf("%s compaction: %lu cases\n", failures == f0 ? "PASS" : "FAIL", count);
}

/* ---- scores and draws -------------------------------------------------------------------- */

/* Distance in units in the last place between two finite floats (0 for equal bits). */
static uint64_t ulps(float a, float b) {
    int32_t x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    int64_t ix = x < 0 ? (int64_t)INT32_MIN - x : x, iy = y < 0 ? (int64_t)INT32_MIN - y : y;
    return (uint64_t)(ix > iy ? ix - iy : iy - ix);
}

/*
 * cpu [heads][n] against gpu [heads][n]: at most max_ulps apart everywhere, and at most
 * max_diff_frac of the entries not bit for bit equal. Returns false after reporting.
 */
static bool compare_floats(const char *what, const float *cpu, const float *gpu, uint32_t heads,
                           uint32_t n, uint64_t max_ulps, double max_diff_frac) {
    size_t total = (size_t)heads * n, diff = 0, worst_at = 0;
    uint64_t worst = 0;
    for (size_t i = 0; i < total; i++) {
        uint64_t u = ulps(cpu[i], gpu[i]);
        if (u == 0 && memcmp(&cpu[i], &gpu[i], 4) == 0)
            continue;
        diff++;
        if (u >= worst) {
            worst = u;
            worst_at = i;
        }
    }
    checks++;
    if (verbose || diff)
        printf("      %s: %zu of %zu differ, by %llu ulp at most\n", what, diff, total,
               (unsigned long long)worst);
    if (worst > max_ulps || (double)diff > max_diff_frac * (double)total) {
        fail("%s: %zu of %zu entries differ, the worst at head %zu slot %zu: cpu %.9g gpu %.9g "
             "(%llu ulp)",
             what, diff, total, worst_at / n, worst_at % n, (double)cpu[worst_at],
             (double)gpu[worst_at], (unsigned long long)worst);
        return false;
    }
    return true;
}

/* The value metrics, the leverage and the redundancy of one random case, all heads. */
static void scores_case(const struct geom *g, enum vase_dtype dt) {
    static const struct variant va = {VASE_POLICY_VASE_ATTNV, VASE_METRIC_RANGE};
    struct pcase c;
    char what[256];
    case_make(&c, g, dt, &va, false);
    uint32_t n = c.hin.n, heads = c.heads, dim = c.hin.k.dim, rank = c.hin.params.rank;
    size_t hn = (size_t)heads * n;
    float *cpu = xmalloc(hn * sizeof(float)), *gpu = xmalloc(hn * sizeof(float));
    float *dout = dmalloc(hn * sizeof(float));
    struct vase_workspace *ws = NULL;
    if (vase_workspace_new(&ws) < 0)
        exit(2);

    for (int m = 0; m < _VASE_METRIC_MAX; m++) {
        if (m == VASE_METRIC_VAR && dim < 2)
            continue;
        for (uint32_t h = 0; h < heads; h++)
            if (vase_value_metric(&c.hin.v, h, n, (enum vase_metric)m, cpu + (size_t)h * n) < 0)
                exit(2);
        int r = vase_value_metric_cuda(&c.din.v, n, (enum vase_metric)m, gws, gstream, dout);
        snprintf(what, sizeof(what), "%s %s value metric %s", g->name, vase_dtype_to_string(dt),
                 vase_metric_to_string((enum vase_metric)m));
        if (r < 0) {
            fail("%s: vase_value_metric_cuda() = %s", what, strerror(-r));
            continue;
        }
        CU(cudaMemcpy(gpu, dout, hn * sizeof(float), cudaMemcpyDeviceToHost));
        compare_floats(what, cpu, gpu, heads, n, 0, 0.0);
    }

    /* The leverage with the sketch of the case's draws: bit for bit. */
    float *gm = xmalloc((size_t)dim * rank * sizeof(float));
    vase_sketch(&c.hin.rng, NULL, dim, rank, gm);
    float *dgm = to_dev(gm, (size_t)dim * rank * sizeof(float));
    for (uint32_t h = 0; h < heads; h++)
        if (vase_score_leverage(&c.hin.k, &c.hin.v, h, n, gm, rank, ws, cpu + (size_t)h * n) < 0)
            exit(2);
    snprintf(what, sizeof(what), "%s %s leverage r=%u", g->name, vase_dtype_to_string(dt), rank);
    int r = vase_score_leverage_cuda(&c.din.k, &c.din.v, n, dgm, rank, gws, gstream, dout);
    if (r < 0) {
        fail("%s: vase_score_leverage_cuda() = %s", what, strerror(-r));
    } else {
        CU(cudaMemcpy(gpu, dout, hn * sizeof(float), cudaMemcpyDeviceToHost));
        compare_floats(what, cpu, gpu, heads, n, 0, 0.0);
    }
    CU(cudaFree(dgm));
    free(gm);

    /* The redundancy: bit for bit but for the CPU's expf (glibc's is not always correctly
     * rounded; the GPU rounds a double exp once), whose last bit reaches every entry through
     * the softmax denominator. */
    for (uint32_t h = 0; h < heads; h++)
        if (vase_score_redundancy(&c.hin.k, h, n, ws, cpu + (size_t)h * n) < 0)
            exit(2);
    snprintf(what, sizeof(what), "%s %s redundancy", g->name, vase_dtype_to_string(dt));
    r = vase_score_redundancy_cuda(&c.din.k, n, gws, gstream, dout);
    if (r < 0) {
        fail("%s: vase_score_redundancy_cuda() = %s", what, strerror(-r));
    } else {
        CU(cudaMemcpy(gpu, dout, hn * sizeof(float), cudaMemcpyDeviceToHost));
        compare_floats(what, cpu, gpu, heads, n, 4, 1.0);
    }

    vase_workspace_free(ws);
    CU(cudaFree(dout));
    free(gpu);
    free(cpu);
    case_free(&c);
}

/* The draws: bit for bit, but for a rare last-bit difference of the double transcendentals
 * (at most 1 ulp in 1 of 10^5). */
static void draws_case(unsigned i) {
    struct vase_rng rng = {.seed = i == 0 ? 0 : rnd(),
                           .sequence = (uint32_t)rnd(),
                           .layer = i == 1 ? 0xffff : rnd_below(100),
                           .round = rnd_below(1000)};
    uint32_t head = i == 2 ? VASE_RNG_HEAD_SHARED : rnd_below(64);
    size_t n = 1 + rnd_below(40000) + (i % 2 ? 0 : 1); /* odd and even counts */
    float *cpu = xmalloc(n * sizeof(float)), *gpu = xmalloc(n * sizeof(float));
    float *d = dmalloc(n * sizeof(float));
    char what[160];

    vase_rng_exp(&rng, head, cpu, n);
    int r = vase_rng_exp_cuda(&rng, head, d, n, gstream);
    snprintf(what, sizeof(what), "Exp(1) draws seed %llu head %u n %zu",
             (unsigned long long)rng.seed, head, n);
    if (r < 0) {
        fail("%s: vase_rng_exp_cuda() = %s", what, strerror(-r));
    } else {
        CU(cudaMemcpy(gpu, d, n * sizeof(float), cudaMemcpyDeviceToHost));
        compare_floats(what, cpu, gpu, 1, (uint32_t)n, 1, 1e-5);
    }
    vase_rng_normal(&rng, head, cpu, n);
    r = vase_rng_normal_cuda(&rng, head, d, n, gstream);
    snprintf(what, sizeof(what), "normal draws seed %llu head %u n %zu",
             (unsigned long long)rng.seed, head, n);
    if (r < 0) {
        fail("%s: vase_rng_normal_cuda() = %s", what, strerror(-r));
    } else {
        CU(cudaMemcpy(gpu, d, n * sizeof(float), cudaMemcpyDeviceToHost));
        compare_floats(what, cpu, gpu, 1, (uint32_t)n, 1, 1e-5);
    }
    CU(cudaFree(d));
    free(gpu);
    free(cpu);
}

static void section_scores(bool quick) {
    static const enum vase_dtype dts[] = {VASE_DTYPE_F32, VASE_DTYPE_F16, VASE_DTYPE_BF16};
    unsigned long f0 = failures, count = 0;
    for (unsigned i = 0; i < (quick ? 8u : 32u); i++, count++)
        draws_case(i);
    for (size_t gi = 0; gi < sizeof(geoms) / sizeof(geoms[0]); gi++)
        for (size_t di = 0; di < 3 && geom_wanted(&geoms[gi]); di++, count++)
            scores_case(&geoms[gi], dts[di]);
    printf("%s scores and draws: %lu cases\n", failures == f0 ? "PASS" : "FAIL", count);
}

/* ---- main -------------------------------------------------------------------------------- */

static void help(void) {
    printf("Usage: compare_kernels [--quick] [--seed N] [--max-budget N] [--geom NAME]\n"
           "                       [--policy NAME] [--verbose]\n"
           "Compares the CUDA kernels with the CPU reference (plans, NaN handling, compaction).\n"
           "  --quick          one trial per geometry, dtype and policy\n"
           "  --seed N         the test data's seed\n"
           "  --max-budget N   skip the geometries of larger budgets (the model ones)\n"
           "  --geom NAME      that geometry alone (qwen3-4b, odd-a, ...)\n"
           "  --policy NAME    plans of that policy alone\n"
           "  --verbose        one line per case\n");
}

int main(int argc, char **argv) {
    static const struct option options[] = {
        {"quick", no_argument, NULL, 'q'},      {"seed", required_argument, NULL, 's'},
        {"verbose", no_argument, NULL, 'v'},    {"max-budget", required_argument, NULL, 'm'},
        {"geom", required_argument, NULL, 'g'}, {"policy", required_argument, NULL, 'p'},
        {"help", no_argument, NULL, 'h'},       {NULL, 0, NULL, 0},
    };
    bool quick = false;
    int c;
    while ((c = getopt_long(argc, argv, "qs:vh", options, NULL)) >= 0)
        switch (c) {
        case 'q':
            quick = true;
            break;
        case 's': {
            char *end;
            errno = 0;
            rng_state = strtoull(optarg, &end, 0);
            if (errno || *end || end == optarg) {
                fprintf(stderr, "compare_kernels: invalid seed '%s'\n", optarg);
                return 2;
            }
            break;
        }
        case 'v':
            verbose = true;
            break;
        case 'g':
            only_geom = optarg;
            break;
        case 'p': {
            enum vase_policy p;
            if (vase_policy_from_string(optarg, &p) < 0) {
                fprintf(stderr, "compare_kernels: unknown policy '%s'\n", optarg);
                return 2;
            }
            only_policy = (int)p;
            break;
        }
        case 'm': {
            char *end;
            errno = 0;
            unsigned long v = strtoul(optarg, &end, 10);
            if (errno || *end || end == optarg || v > UINT32_MAX) {
                fprintf(stderr, "compare_kernels: invalid budget '%s'\n", optarg);
                return 2;
            }
            max_budget = (uint32_t)v;
            break;
        }
        case 'h':
            help();
            return 0;
        default:
            return 2;
        }

    int r = vase_cuda_available();
    if (r <= 0) {
        fprintf(stderr, "compare_kernels: no CUDA device: %s\n",
                r < 0 ? strerror(-r) : "vase_cuda_available() = 0");
        return 2;
    }
    struct cudaDeviceProp prop;
    int dev = 0;
    CU(cudaGetDevice(&dev));
    CU(cudaGetDeviceProperties(&prop, dev));
    printf("compare_kernels: %s (sm_%d%d), seed %llu%s\n", prop.name, prop.major, prop.minor,
           (unsigned long long)rng_state, quick ? ", quick" : "");
    CU(cudaStreamCreateWithFlags(&gstream, cudaStreamNonBlocking));
    if (vase_cuda_workspace_new(&gws) < 0) {
        fprintf(stderr, "compare_kernels: vase_cuda_workspace_new() failed\n");
        return 2;
    }

    section_scores(quick);
    section_nan();
    section_compact(quick);
    section_plans(quick);

    vase_cuda_workspace_free(gws);
    CU(cudaStreamDestroy(gstream));
    printf("compare_kernels: %lu checks, %lu failed\n", checks, failures);
    return failures ? 1 : 0;
}
