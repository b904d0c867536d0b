/* SPDX-License-Identifier: MIT */

/*
 * bench_decode_gpu: what an eviction costs a whole model on the GPU, next to what one decode
 * step's attention over the same cache costs, measured in the same run. Per model geometry
 * (Qwen3-4B, Qwen3-14B) and budget (2048, 4096), one paged cache in vase's layout
 * (vase_layout.h: 16-token pages of every layer, shuffled block tables, the query ring in the
 * same arena), bf16, at budget + W tokens (W = 64, the default window):
 *
 *   plan:   vase_plan_cuda() of every layer in turn on a stream of its own, each call waiting
 *           for its plan, as vased's CUDA planner runs one sequence's eviction;
 *   decode: one decode step's attention of every layer (one query token per head, GQA) by
 *           decode_attn_cuda(), the reference kernel of decode_attn.cu;
 *   stall:  what the engine's stream waits per eviction: vase_compact_cuda() of every layer's K
 *           and V enqueued on it, as libvase does at vase_seq_poll().
 *
 * Times are medians over --reps repetitions of CUDA events around the calls; "host" columns
 * are the wall time of the calling thread until the work is done. Before any timing, the
 * attention kernel is checked against a float64 CPU reference: at small geometries (grouped
 * heads, odd head dims and page sizes, bf16/f16/f32, several sequences and splits, large
 * scores), and at each benchmark geometry on its first and last layers. A failed check or call
 * exits 1; a missed goal does not. --quick: the small checks and a toy geometry, for the CPU
 * emulation (tests/gpu/emu), whose times mean nothing. Prints a Markdown table.
 */

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "argnum.h"
#include "bench_gpu.h"
#include "decode_attn.h"
#include "vase_kernels.h"
#include "vase_layout.h"

struct model {
    const char *name;
    uint32_t layers, hq, hkv, dim;
};

static const struct model models[] = {
    {"Qwen3-4B", 36, 32, 8, 128},
    {"Qwen3-14B", 40, 40, 8, 128},
    {"toy", 2, 4, 2, 32}, /* --quick, or --model toy */
};

static const uint32_t budgets[] = {2048, 4096};

#define WINDOW 64
#define MAX_SEQS 16
#define GOAL_PCT 5.0
/* The attention check: |gpu - ref| <= ATOL + RTOL * |ref| for every output element. */
#define ATOL 2e-4
#define RTOL 1e-3

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "bench_decode_gpu: out of memory (%zu bytes)\n", n);
        exit(2);
    }
    return p;
}

/* count random values of dtype, times scale, at host memory dst. */
static void fill_host(void *dst, size_t count, enum vase_dtype dtype, float scale) {
    for (size_t i = 0; i < count; i++) {
        float x = bench_rnd_normal() * scale;
        if (dtype == VASE_DTYPE_BF16)
            ((uint16_t *)dst)[i] = vase_f32_to_bf16(x);
        else if (dtype == VASE_DTYPE_F16)
            ((uint16_t *)dst)[i] = vase_f32_to_f16(x);
        else
            ((float *)dst)[i] = x;
    }
}

/* ---- A paged cache on the device ---- */

/* seqs sequences of len tokens in one arena of vase's layout: each sequence's block table of
 * `blocks` pages and ring pages of its queries, all on shuffled physical pages. */
struct cache {
    struct vase_layout l;
    uint32_t seqs, len, blocks, ring_pages;
    uint64_t arena_bytes;
    void *arena;      /* device */
    uint32_t *table;  /* device [seqs][blocks] */
    uint32_t *ring;   /* device [seqs][ring_pages] */
    uint32_t *htable; /* host copy of table */
};

static void cache_make(struct cache *c, const struct vase_layout_geometry *g, uint32_t seqs,
                       uint32_t len, float scale) {
    char msg[256];
    bool fits = false;

    *c = (struct cache){.seqs = seqs, .len = len};
    /* A first layout for the page sizes, then the one of the arena as sized. */
    if (vase_layout_compute(g, (uint64_t)1 << 34, &c->l, msg, sizeof(msg)) < 0) {
        fprintf(stderr, "bench_decode_gpu: layout: %s\n", msg);
        exit(2);
    }
    c->blocks = vase_layout_blocks_for(&c->l, len);
    c->ring_pages = vase_layout_ring_pages(&c->l, WINDOW, &fits);
    bool shared = c->l.ring_page_bytes == c->l.page_bytes;
    uint64_t kv_units = (uint64_t)seqs * (c->blocks + (shared ? c->ring_pages : 0)) + 5;
    uint64_t ring0 =
        shared ? 0 : (kv_units * c->l.page_bytes + c->l.ring_page_bytes - 1) / c->l.ring_page_bytes;
    c->arena_bytes = shared ? kv_units * c->l.page_bytes
                            : (ring0 + (uint64_t)seqs * c->ring_pages) * c->l.ring_page_bytes;
    if (!fits || vase_layout_compute(g, c->arena_bytes, &c->l, msg, sizeof(msg)) < 0) {
        fprintf(stderr, "bench_decode_gpu: layout: %s\n", fits ? msg : "no room for the ring");
        exit(2);
    }

    uint32_t *perm = xmalloc(kv_units * sizeof(uint32_t));
    for (uint32_t i = 0; i < kv_units; i++)
        perm[i] = i;
    for (uint32_t i = (uint32_t)kv_units; i > 1; i--) {
        uint32_t j = (uint32_t)(bench_rnd() % i), t = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = t;
    }
    size_t nt = (size_t)seqs * c->blocks, nr = (size_t)seqs * c->ring_pages;
    uint32_t *hring = xmalloc(nr * sizeof(uint32_t));
    c->htable = xmalloc(nt * sizeof(uint32_t));
    memcpy(c->htable, perm, nt * sizeof(uint32_t));
    for (size_t i = 0; i < nr; i++)
        hring[i] = shared ? perm[nt + i] : (uint32_t)(ring0 + i);
    free(perm);
    c->table = bench_dmalloc(nt * sizeof(uint32_t));
    c->ring = bench_dmalloc(nr * sizeof(uint32_t) + 4);
    CU(cudaMemcpy(c->table, c->htable, nt * sizeof(uint32_t), cudaMemcpyHostToDevice));
    CU(cudaMemcpy(c->ring, hring, nr * sizeof(uint32_t), cudaMemcpyHostToDevice));
    free(hring);

    c->arena = bench_dmalloc(c->arena_bytes);
    if (g->dtype == VASE_DTYPE_BF16 && scale == 1.0f) {
        bench_fill_dev(c->arena, c->arena_bytes);
    } else {
        size_t es = vase_dtype_size(g->dtype), count = c->arena_bytes / es;
        void *h = xmalloc(count * es);
        fill_host(h, count, g->dtype, scale);
        CU(cudaMemcpy(c->arena, h, count * es, cudaMemcpyHostToDevice));
        free(h);
    }
    CU(cudaDeviceSynchronize());
}

static void cache_free(struct cache *c) {
    CU(cudaFree(c->arena));
    CU(cudaFree(c->table));
    CU(cudaFree(c->ring));
    free(c->htable);
}

/* The attention of one layer over the cache: q [seqs][hq][dim], out, scratch on the device. */
static struct decode_attn attn_of(const struct cache *c, uint32_t layer, const void *q, float *out,
                                  void *scratch, uint32_t split_keys) {
    return (struct decode_attn){
        .k = vase_layout_kv_view(&c->l, c->arena, c->table, layer, VASE_K),
        .v = vase_layout_kv_view(&c->l, c->arena, c->table, layer, VASE_V),
        .table_stride = c->blocks,
        .seqs = c->seqs,
        .len = c->len,
        .hq = c->l.q_heads,
        .split_keys = split_keys,
        .q = q,
        .out = out,
        .scratch = scratch,
    };
}

/* ---- The attention check ---- */

/*
 * Compares out (device [seqs][hq][dim], what decode_attn_cuda() wrote for layer with queries
 * hq_host [seqs][hq][dim] of the cache's dtype) with softmax(q K^T / sqrt(dim)) V in float64,
 * K and V read from harena (a host copy of the arena) through the host block tables. Returns
 * the number of sequences that fail; prints the verdict and the largest error when verbose.
 */
static unsigned check_attention(const struct cache *c, const void *harena, uint32_t layer,
                                const void *hq_host, const float *out, const char *what,
                                bool verbose) {
    const struct vase_layout *l = &c->l;
    uint32_t dim = l->head_dim, hq = l->q_heads, group = hq / l->kv_heads;
    size_t rows = (size_t)c->seqs * hq;
    float *got = xmalloc(rows * dim * sizeof(float)), *qrow = xmalloc(dim * sizeof(float));
    float *krow = xmalloc(dim * sizeof(float)), *vrow = xmalloc(dim * sizeof(float));
    double *s = xmalloc(c->len * sizeof(double)), *ref = xmalloc(dim * sizeof(double));
    struct vase_view qv = vase_view_contiguous((void *)hq_host, l->dtype, 1, (uint32_t)rows, dim);
    double worst = 0.0, worst_ref = 0.0;
    unsigned failed = 0;

    CU(cudaMemcpy(got, out, rows * dim * sizeof(float), cudaMemcpyDeviceToHost));
    for (uint32_t seq = 0; seq < c->seqs; seq++) {
        const uint32_t *table = c->htable + (size_t)seq * c->blocks;
        struct vase_view k = vase_layout_kv_view(l, (void *)harena, table, layer, VASE_K);
        struct vase_view v = vase_layout_kv_view(l, (void *)harena, table, layer, VASE_V);
        bool bad = false;
        for (uint32_t h = 0; h < hq; h++) {
            size_t row = (size_t)seq * hq + h;
            (void)vase_view_read_row(&qv, (uint32_t)row, 0, qrow);
            double m = -INFINITY, sum = 0.0;
            for (uint32_t t = 0; t < c->len; t++) {
                (void)vase_view_read_row(&k, t, h / group, krow);
                double dot = 0.0;
                for (uint32_t d = 0; d < dim; d++)
                    dot += (double)qrow[d] * krow[d];
                s[t] = dot / sqrt((double)dim);
                m = s[t] > m ? s[t] : m;
            }
            for (uint32_t d = 0; d < dim; d++)
                ref[d] = 0.0;
            for (uint32_t t = 0; t < c->len; t++) {
                double w = exp(s[t] - m);
                sum += w;
                (void)vase_view_read_row(&v, t, h / group, vrow);
                for (uint32_t d = 0; d < dim; d++)
                    ref[d] += w * vrow[d];
            }
            for (uint32_t d = 0; d < dim; d++) {
                double r = ref[d] / sum, e = fabs((double)got[row * dim + d] - r);
                if (!(e <= ATOL + RTOL * fabs(r)))
                    bad = true;
                if (!(e <= worst)) {
                    worst = e;
                    worst_ref = r;
                }
            }
        }
        failed += bad;
    }
    if (verbose)
        printf("%s attention check %s, layer %u, %u sequence(s) of %u tokens: largest error "
               "%.3g (reference %.4g; tolerance %.0e + %.0e |ref|)\n",
               failed ? "FAIL" : "PASS", what, layer, c->seqs, c->len, worst, worst_ref, ATOL,
               RTOL);
    free(got);
    free(qrow);
    free(krow);
    free(vrow);
    free(s);
    free(ref);
    return failed;
}

/* A copy of the cache's arena on the host. */
static void *arena_to_host(const struct cache *c) {
    void *h = xmalloc(c->arena_bytes);
    CU(cudaMemcpy(h, c->arena, c->arena_bytes, cudaMemcpyDeviceToHost));
    return h;
}

struct check_case {
    struct vase_layout_geometry g;
    uint32_t seqs, len, split_keys, layer;
    float scale; /* of the queries and the cache: large scores need the running maximum */
};

/*
 * The kernel at small geometries against the reference, and once with every sequence reading
 * the first one's block table, which the check must catch (it would pass a kernel that ignores
 * the tables otherwise). Returns the number of failures.
 */
static unsigned check_small(cudaStream_t stream) {
    static const struct check_case cases[] = {
        {{2, 4, 2, 32, VASE_DTYPE_BF16, 16}, 2, 37, 7, 1, 1.0f},
        {{1, 6, 3, 40, VASE_DTYPE_F16, 5}, 1, 23, 0, 0, 6.0f},
        {{1, 2, 2, 64, VASE_DTYPE_F32, 1}, 3, 9, 4, 0, 1.0f},
        {{1, 8, 1, 256, VASE_DTYPE_BF16, 16}, 1, 300, 0, 0, 1.0f},
    };
    unsigned failed = 0;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const struct check_case *cc = &cases[i];
        struct cache c;
        cache_make(&c, &cc->g, cc->seqs, cc->len, cc->scale);
        size_t qn = (size_t)cc->seqs * cc->g.q_heads * cc->g.head_dim;
        size_t qbytes = qn * vase_dtype_size(cc->g.dtype);
        void *hq = xmalloc(qbytes), *dq = bench_dmalloc(qbytes);
        fill_host(hq, qn, cc->g.dtype, cc->scale);
        CU(cudaMemcpy(dq, hq, qbytes, cudaMemcpyHostToDevice));
        float *out = bench_dmalloc(qn * sizeof(float));
        struct decode_attn a = attn_of(&c, cc->layer, dq, out, NULL, cc->split_keys);
        a.scratch = bench_dmalloc(decode_attn_scratch_bytes(&a));
        void *harena = arena_to_host(&c);
        char what[96];
        snprintf(what, sizeof(what), "%s hq %u hkv %u dim %u, %u-token pages, split %u",
                 vase_dtype_to_string(cc->g.dtype), cc->g.q_heads, cc->g.kv_heads, cc->g.head_dim,
                 cc->g.block_tokens, cc->split_keys ? cc->split_keys : DECODE_ATTN_SPLIT_KEYS);

        int r = decode_attn_cuda(&a, stream);
        CU(cudaStreamSynchronize(stream));
        if (r < 0) {
            printf("FAIL attention check %s: decode_attn_cuda() = %s\n", what, strerror(-r));
            failed++;
        } else {
            failed += check_attention(&c, harena, cc->layer, hq, out, what, true) != 0;
        }
        if (cc->seqs > 1) {
            a.table_stride = 0;
            r = decode_attn_cuda(&a, stream);
            CU(cudaStreamSynchronize(stream));
            bool caught = r == 0 && check_attention(&c, harena, cc->layer, hq, out, what, false) ==
                                        cc->seqs - 1;
            printf("%s attention check catches sequences reading another's pages (%s)\n",
                   caught ? "PASS" : "FAIL", what);
            failed += !caught;
        }
        free(harena);
        free(hq);
        CU(cudaFree(dq));
        CU(cudaFree(out));
        CU(cudaFree(a.scratch));
        cache_free(&c);
    }
    return failed;
}

/* ---- The benchmark ---- */

/*
 * The compaction of one layer's K or V at an eviction, as libvase enqueues it on the engine's
 * stream (lib/cuda.c, vase__cuda_compact()): with scratch allocated beforehand, as libvase
 * allocates it at the sequence's open, so that the time is the compaction's alone. The one call
 * of vase_compact_cuda() in this file: a change of its signature is made here.
 */
static void *compact_scratch;
static size_t compact_scratch_bytes;

/* Makes the scratch at least as large as compact_view() needs for view's shape; outside any
 * timed interval. */
static void compact_reserve(const struct vase_view *view, uint32_t K, uint32_t n, uint32_t len) {
    size_t need = vase_compact_cuda_scratch_bytes(
        view->heads, (size_t)view->dim * vase_dtype_size(view->dtype), n, K + len - n);
    if (need <= compact_scratch_bytes)
        return;
    if (compact_scratch)
        CU(cudaFree(compact_scratch));
    CU(cudaMalloc(&compact_scratch, need));
    compact_scratch_bytes = need;
}

static int compact_view(struct vase_view *view, const uint32_t *keep, uint32_t K, uint32_t n,
                        uint32_t len, cudaStream_t stream) {
    return vase_compact_cuda(view, keep, K, n, len, compact_scratch, compact_scratch_bytes, stream);
}

struct opts {
    struct bench_opts b; /* b.reps 0: 9, or 1 with --quick */
    uint32_t seqs;
    bool quick;
};

/* What one (model, budget) needs besides the cache: queries, plans, scratch. */
struct bench {
    const struct model *m;
    struct cache c;
    struct vase_params params;
    uint32_t n, K;
    void *q;        /* device [layers][seqs][hq][dim] bf16: each layer's query of the step */
    float *out;     /* device [seqs][hq][dim] */
    void *scratch;  /* device, the attention's */
    uint32_t *keep; /* device [layers][hkv][K]: the plans of one eviction */
    float *acc;     /* device [hkv][n]: h2o's accumulated attention */
};

static void bench_make(struct bench *b, const struct model *m, uint32_t budget, uint32_t seqs) {
    const struct vase_layout_geometry g = {m->layers, m->hq, m->hkv, m->dim, VASE_DTYPE_BF16, 16};
    *b = (struct bench){.m = m, .params = vase_params_default(budget), .n = budget};
    b->K = vase_plan_keep_count(&b->params);
    cache_make(&b->c, &g, seqs, budget + b->params.window, 1.0f);
    size_t qn = (size_t)seqs * m->hq * m->dim;
    b->q = bench_dmalloc(m->layers * qn * 2);
    bench_fill_dev(b->q, m->layers * qn * 2);
    b->out = bench_dmalloc(qn * sizeof(float));
    struct decode_attn a = attn_of(&b->c, 0, b->q, b->out, NULL, 0);
    b->scratch = bench_dmalloc(decode_attn_scratch_bytes(&a));
    b->keep = bench_dmalloc((size_t)m->layers * m->hkv * b->K * sizeof(uint32_t));
    size_t hn = (size_t)m->hkv * b->n;
    float *acc = xmalloc(hn * sizeof(float));
    for (size_t i = 0; i < hn; i++)
        acc[i] = (float)(bench_rnd() % 100000) * 1e-3f;
    b->acc = bench_dmalloc(hn * sizeof(float));
    CU(cudaMemcpy(b->acc, acc, hn * sizeof(float), cudaMemcpyHostToDevice));
    free(acc);
    CU(cudaDeviceSynchronize());
}

static void bench_free(struct bench *b) {
    cache_free(&b->c);
    CU(cudaFree(b->q));
    CU(cudaFree(b->out));
    CU(cudaFree(b->scratch));
    CU(cudaFree(b->keep));
    CU(cudaFree(b->acc));
}

static struct decode_attn bench_attn(const struct bench *b, uint32_t layer) {
    size_t qbytes = (size_t)b->c.seqs * b->m->hq * b->m->dim * 2;
    return attn_of(&b->c, layer, (char *)b->q + layer * qbytes, b->out, b->scratch, 0);
}

/* The plan input of one layer of sequence 0, as vased's planner builds it. */
static struct vase_plan_input bench_plan_input(const struct bench *b, enum vase_policy policy,
                                               uint32_t layer, uint32_t round) {
    const struct vase_layout *l = &b->c.l;
    uint32_t first = (round * WINDOW + 17) % (2 * WINDOW);
    return (struct vase_plan_input){
        .policy = policy,
        .params = b->params,
        .n = b->n,
        .hq = l->q_heads,
        .k = vase_layout_kv_view(l, b->c.arena, b->c.table, layer, VASE_K),
        .v = vase_layout_kv_view(l, b->c.arena, b->c.table, layer, VASE_V),
        .q = vase_layout_query_view(l, b->c.arena, b->c.ring, WINDOW, first, layer),
        .acc = policy == VASE_POLICY_H2O ? b->acc : NULL,
        .rng = {.seed = 42, .sequence = 7, .layer = layer, .round = round},
    };
}

struct timers {
    cudaStream_t engine, planner;
    cudaEvent_t ev0, ev1;
    struct vase_cuda_workspace *ws;
};

/* Milliseconds between the timers' two events, once the second has happened. */
static double elapsed_ms(const struct timers *t) {
    float ms;
    CU(cudaEventSynchronize(t->ev1));
    CU(cudaEventElapsedTime(&ms, t->ev0, t->ev1));
    return ms;
}

/* One decode step's attention of every layer on the engine's stream: GPU ms, or -errno. */
static double time_decode(const struct bench *b, const struct timers *t) {
    int r = 0;
    CU(cudaEventRecord(t->ev0, t->engine));
    for (uint32_t l = 0; l < b->m->layers && r == 0; l++) {
        struct decode_attn a = bench_attn(b, l);
        r = decode_attn_cuda(&a, t->engine);
    }
    CU(cudaEventRecord(t->ev1, t->engine));
    double ms = elapsed_ms(t);
    if (r < 0)
        fprintf(stderr, "bench_decode_gpu: decode_attn_cuda() = %s\n", strerror(-r));
    return r < 0 ? r : ms;
}

/* The plans of every layer on the planner's stream: GPU ms, host ms in *host, or -errno. */
static double time_plan(const struct bench *b, const struct timers *t, enum vase_policy p,
                        uint32_t round, double *host) {
    int r = 0;
    double t0 = bench_now_ms();
    size_t lists = (size_t)b->m->hkv * b->K;
    CU(cudaEventRecord(t->ev0, t->planner));
    for (uint32_t l = 0; l < b->m->layers && r == 0; l++) {
        struct vase_plan_input in = bench_plan_input(b, p, l, round);
        r = vase_plan_cuda(&in, t->ws, t->planner, b->keep + l * lists);
    }
    CU(cudaEventRecord(t->ev1, t->planner));
    double ms = elapsed_ms(t);
    *host = bench_now_ms() - t0;
    if (r < 0)
        fprintf(stderr, "bench_decode_gpu: %s: vase_plan_cuda() = %s (%s)\n",
                vase_policy_to_string(p), strerror(-r),
                vase_cuda_last_error() ? vase_cuda_last_error() : "");
    return r < 0 ? r : ms;
}

/* The compaction of every layer's K and V by the last plans, on the engine's stream: GPU ms,
 * host ms (enqueue and the stream synchronisation libvase does) in *host, or -errno. */
static double time_stall(const struct bench *b, const struct timers *t, double *host) {
    int r = 0;
    double t0 = bench_now_ms();
    size_t lists = (size_t)b->m->hkv * b->K;
    struct vase_view v0 = vase_layout_kv_view(&b->c.l, b->c.arena, b->c.table, 0, VASE_K);
    compact_reserve(&v0, b->K, b->n, b->c.len);
    CU(cudaEventRecord(t->ev0, t->engine));
    for (uint32_t l = 0; l < b->m->layers && r >= 0; l++)
        for (int kv = VASE_K; kv <= VASE_V && r >= 0; kv++) {
            struct vase_view v =
                vase_layout_kv_view(&b->c.l, b->c.arena, b->c.table, l, (enum vase_kv)kv);
            r = compact_view(&v, b->keep + l * lists, b->K, b->n, b->c.len, t->engine);
        }
    CU(cudaEventRecord(t->ev1, t->engine));
    CU(cudaStreamSynchronize(t->engine));
    *host = bench_now_ms() - t0;
    double ms = elapsed_ms(t);
    if (r < 0)
        fprintf(stderr, "bench_decode_gpu: vase_compact_cuda() = %s\n", strerror(-r));
    return r < 0 ? r : ms;
}

/* The attention of the first and the last layer against the reference. Failures. */
static unsigned check_bench(const struct bench *b, const struct timers *t) {
    const struct model *m = b->m;
    size_t qn = (size_t)b->c.seqs * m->hq * m->dim;
    void *harena = arena_to_host(&b->c), *hq = xmalloc(qn * 2);
    unsigned failed = 0;
    uint32_t layers[2] = {0, m->layers - 1};
    for (int i = 0; i < (m->layers > 1 ? 2 : 1); i++) {
        struct decode_attn a = bench_attn(b, layers[i]);
        int r = decode_attn_cuda(&a, t->engine);
        CU(cudaStreamSynchronize(t->engine));
        CU(cudaMemcpy(hq, a.q, qn * 2, cudaMemcpyDeviceToHost));
        if (r < 0) {
            printf("FAIL attention check %s: decode_attn_cuda() = %s\n", m->name, strerror(-r));
            failed++;
        } else {
            failed += check_attention(&b->c, harena, layers[i], hq, b->out, m->name, true) != 0;
        }
    }
    free(hq);
    free(harena);
    return failed;
}

static void help(void) {
    printf("Usage: bench_decode_gpu [--reps N] [--policies P,P,...] [--model NAME] [--budget N]\n"
           "                        [--layers N] [--seqs N] [--quick]\n"
           "Per eviction of a whole model (Qwen3-4B, Qwen3-14B; budgets 2048 and 4096; bf16;\n"
           "W 64; the cache at budget + W tokens): the plan time of every layer, one decode\n"
           "step's attention over the same cache (a reference kernel, checked against a float64\n"
           "CPU reference first), and the compaction the engine's stream waits for. Default: 9\n"
           "repetitions, vase-attnv and snapkv, 1 sequence. --model (also 'toy'), --budget and\n"
           "--layers narrow the run; --seqs N batches N sequences in the attention (the plan and\n"
           "the compaction stay one sequence's); --quick: the small checks and the toy model.\n");
}

static int parse_argv(int argc, char **argv, struct opts *o) {
    static const struct option options[] = {
        BENCH_LONG_OPTIONS,
        {"seqs", required_argument, NULL, 's'},
        {"quick", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0) {
        int r = bench_parse_option(c, optarg, WINDOW, &o->b);
        if (r < 0)
            return r;
        if (r > 0)
            continue;
        switch (c) {
        case 's':
            if (argnum_u32(optarg, 1, MAX_SEQS, &o->seqs) < 0) {
                fprintf(stderr, "bench_decode_gpu: --seqs takes 1 to %d\n", MAX_SEQS);
                return -EINVAL;
            }
            break;
        case 'q':
            o->quick = true;
            break;
        case 'h':
            help();
            return 0;
        default:
            return -EINVAL;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "bench_decode_gpu: unexpected argument '%s'\n", argv[optind]);
        return -EINVAL;
    }
    if (o->quick) {
        o->b.model = o->b.model ? o->b.model : "toy";
        o->b.budget = o->b.budget ? o->b.budget : 2 * WINDOW;
    }
    if (o->b.model) {
        bool known = false;
        for (size_t i = 0; i < sizeof(models) / sizeof(models[0]); i++)
            known |= strcmp(o->b.model, models[i].name) == 0;
        if (!known) {
            fprintf(stderr, "bench_decode_gpu: unknown model '%s'\n", o->b.model);
            return -EINVAL;
        }
    }
    return 1;
}

/* The table's rows, printed at the end (the checks print as they run); each is also printed as
 * it is measured, for a run cut short. */
#define MAX_ROWS 64
static char md_rows[MAX_ROWS][256];
static unsigned md_count;

static void print_notes(const char *device, const struct opts *o) {
    printf("\n# Whole-model eviction cost against decode attention on %s\n\n", device);
    printf("bf16 KV, 16-token pages, W %d, the cache at budget + W tokens, %u sequence(s) in the "
           "attention, medians of %u repetitions (CUDA events).\n\n",
           WINDOW, o->seqs, o->b.reps);
    printf("- plan: vase_plan_cuda() of every layer in turn on the planner's stream, each call "
           "waiting for its plan, as vased plans one sequence's eviction (host: the planner "
           "thread's wall time).\n"
           "- decode attn: one decode step's attention of every layer over the same cache, one "
           "query token per head, by this benchmark's reference kernel (tests/gpu/decode_attn.cu:"
           " split-K, one block per sequence, query head and %u keys), NOT FlashAttention: an "
           "upper bound on a tuned engine's attention time, so plan/decode reads low by as much. "
           "A real decode step also reads the weights and runs the MLP.\n"
           "- stall: what the engine's stream waits per eviction: vase_compact_cuda() of every "
           "layer's K and V enqueued on it with scratch allocated beforehand, as libvase does; "
           "host: enqueue and the stream synchronisation. The plan runs on its own stream, off "
           "the engine's path.\n\n",
           DECODE_ATTN_SPLIT_KEYS);
    fflush(stdout);
}

static void print_table(void) {
    printf("| model | budget | len | policy | plan ms | plan host ms | decode attn ms | "
           "plan/decode | stall ms | stall host ms | goal: plan < %.0f%% of decode |\n",
           GOAL_PCT);
    printf("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|\n");
    for (unsigned i = 0; i < md_count; i++)
        printf("%s\n", md_rows[i]);
}

/* The rows of one (model, budget). Returns the failures; counts goals met in *met of *rows. */
static unsigned bench_one(const struct model *m, bool cut, uint32_t budget, const struct opts *o,
                          const struct timers *t, unsigned *met, unsigned *rows) {
    struct bench b;
    bench_make(&b, m, budget, o->seqs);
    unsigned failed = check_bench(&b, t);
    double *dec = xmalloc(o->b.reps * sizeof(double)), *pg = xmalloc(o->b.reps * sizeof(double));
    double *ph = xmalloc(o->b.reps * sizeof(double)), *sg = xmalloc(o->b.reps * sizeof(double));
    double *sh = xmalloc(o->b.reps * sizeof(double)), host;

    /* Warm-up: modules load, the workspace and the allocator's pool grow to size. */
    if (!failed && (time_decode(&b, t) < 0 || time_plan(&b, t, o->b.policies[0], 0, &host) < 0 ||
                    time_stall(&b, t, &host) < 0))
        failed++;
    for (unsigned pi = 0; pi < o->b.npolicies && !failed; pi++) {
        enum vase_policy p = o->b.policies[pi];
        for (unsigned rep = 0; rep < o->b.reps && !failed; rep++) {
            /* The decode step and the eviction of the same round, measured side by side. */
            dec[rep] = time_decode(&b, t);
            pg[rep] = time_plan(&b, t, p, rep + 1, &ph[rep]);
            sg[rep] = time_stall(&b, t, &sh[rep]);
            failed += dec[rep] < 0 || pg[rep] < 0 || sg[rep] < 0;
        }
        if (failed)
            break;
        double plan = bench_median(pg, o->b.reps), decode = bench_median(dec, o->b.reps);
        double pct = 100.0 * plan / decode;
        if (md_count < MAX_ROWS) {
            snprintf(md_rows[md_count], sizeof(md_rows[0]),
                     "| %s%s | %u | %u | %s | %.3f | %.3f | %.3f | %.1f%% | %.3f | %.3f | %s |",
                     m->name, cut ? " (layers cut)" : "", budget, b.c.len, vase_policy_to_string(p),
                     plan, bench_median(ph, o->b.reps), decode, pct, bench_median(sg, o->b.reps),
                     bench_median(sh, o->b.reps), pct < GOAL_PCT ? "met" : "NOT met");
            printf("measured %s\n", md_rows[md_count++]);
            fflush(stdout);
        }
        *met += pct < GOAL_PCT;
        (*rows)++;
    }
    free(dec);
    free(pg);
    free(ph);
    free(sg);
    free(sh);
    bench_free(&b);
    return failed;
}

int main(int argc, char **argv) {
    struct opts o = {.seqs = 1};
    o.b.policies[0] = VASE_POLICY_VASE_ATTNV;
    o.b.policies[1] = VASE_POLICY_SNAPKV;
    o.b.npolicies = 2;
    int r = parse_argv(argc, argv, &o);
    if (r <= 0)
        return r < 0 ? 2 : 0;
    if (o.b.reps == 0)
        o.b.reps = o.quick ? 1 : 9;

    r = vase_cuda_available();
    if (r <= 0) {
        fprintf(stderr, "bench_decode_gpu: no CUDA device\n");
        return 2;
    }
    struct cudaDeviceProp prop;
    int dev = 0;
    CU(cudaGetDevice(&dev));
    CU(cudaGetDeviceProperties(&prop, dev));

    struct timers t = {0};
    CU(cudaStreamCreateWithFlags(&t.engine, cudaStreamNonBlocking));
    CU(cudaStreamCreateWithFlags(&t.planner, cudaStreamNonBlocking));
    CU(cudaEventCreate(&t.ev0));
    CU(cudaEventCreate(&t.ev1));
    if (vase_cuda_workspace_new(&t.ws) < 0)
        return 2;

    unsigned failed = check_small(t.engine), met = 0, rows = 0;
    if (!failed)
        print_notes(prop.name, &o);
    for (size_t mi = 0; mi < sizeof(models) / sizeof(models[0]) && !failed; mi++) {
        struct model m = models[mi];
        bool is_toy = mi == sizeof(models) / sizeof(models[0]) - 1;
        if (o.b.model ? strcmp(o.b.model, m.name) != 0 : is_toy)
            continue;
        bool cut = o.b.max_layers && m.layers > o.b.max_layers;
        if (cut)
            m.layers = o.b.max_layers;
        for (size_t bi = 0; bi < sizeof(budgets) / sizeof(budgets[0]) && !failed; bi++) {
            if (o.b.budget && bi > 0)
                break;
            failed +=
                bench_one(&m, cut, o.b.budget ? o.b.budget : budgets[bi], &o, &t, &met, &rows);
        }
    }
    if (!failed) {
        printf("\n");
        print_table();
        printf("\ngoal (whole-model plan < %.0f%% of one decode step's attention): met in %u of "
               "%u rows\n",
               GOAL_PCT, met, rows);
    }
    vase_cuda_workspace_free(t.ws);
    CU(cudaEventDestroy(t.ev0));
    CU(cudaEventDestroy(t.ev1));
    CU(cudaStreamDestroy(t.engine));
    CU(cudaStreamDestroy(t.planner));
    if (failed)
        fprintf(stderr, "bench_decode_gpu: %u failure(s)\n", failed);
    return failed ? 1 : 0;
}
