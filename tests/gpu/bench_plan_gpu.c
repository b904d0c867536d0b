/* SPDX-License-Identifier: MIT */

/*
 * bench_plan_gpu: how long vase_plan_cuda() takes per layer and per whole model, against the
 * time an eviction may take. K and V sit in one paged arena of all layers in the daemon's
 * layout ([layer][K,V][token][kv_head][dim] per page, 16 tokens per page, shuffled block table),
 * bf16, at the steady state (N = budget candidates), the queries in a per-layer ring of 2W.
 *
 * A plan runs once every W decode steps; the engine keeps decoding meanwhile (async mode), so
 * the whole model's plan time is compared with W steps of --step-ms each (20 ms: a decode step
 * of a busy server). Times are medians over --reps repetitions: "GPU" from CUDA events around
 * the calls on the plan's stream, "host" the wall time the calling thread spends (the call
 * returns only when the plan is complete). Prints a Markdown table.
 */

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "argnum.h"
#include "bench_gpu.h"
#include "vase_kernels.h"

struct model {
    const char *name;
    uint32_t layers, hq, hkv, dim;
};

static const struct model models[] = {
    {"Qwen3-4B", 36, 32, 8, 128},
    {"Qwen3-14B", 40, 40, 8, 128},
};

static const uint32_t budgets[] = {2048, 4096};

#define WINDOW 64
#define TPP 16

/* One sequence of one model: the arena, rings, accumulated attention. */
struct setup {
    const struct model *m;
    uint32_t budget, n, pages;
    size_t page_bytes, block_bytes;
    void *arena;
    uint32_t *dtable;
    void *rings; /* [layers][2W][Hq][D] */
    float *acc;  /* [Hkv][n] */
    uint32_t *keep;
};

static void setup_make(struct setup *s, const struct model *m, uint32_t budget) {
    memset(s, 0, sizeof(*s));
    s->m = m;
    s->budget = budget;
    s->n = budget;
    uint32_t rows = budget + 2 * WINDOW; /* steady state plus the slack */
    s->pages = (rows + TPP - 1) / TPP;
    s->block_bytes = (size_t)TPP * m->hkv * m->dim * 2;
    s->page_bytes = (size_t)m->layers * 2 * s->block_bytes;
    uint32_t phys = s->pages + 7;
    s->arena = bench_dmalloc(phys * s->page_bytes);
    bench_fill_dev(s->arena, phys * s->page_bytes);

    uint32_t *perm = malloc(phys * sizeof(uint32_t));
    if (!perm)
        exit(2);
    for (uint32_t i = 0; i < phys; i++)
        perm[i] = i;
    for (uint32_t i = phys; i > 1; i--) {
        uint32_t j = (uint32_t)(bench_rnd() % i), t = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = t;
    }
    s->dtable = bench_dmalloc(s->pages * sizeof(uint32_t));
    CU(cudaMemcpy(s->dtable, perm, s->pages * sizeof(uint32_t), cudaMemcpyHostToDevice));
    free(perm);

    size_t ring_bytes = (size_t)m->layers * 2 * WINDOW * m->hq * m->dim * 2;
    s->rings = bench_dmalloc(ring_bytes);
    bench_fill_dev(s->rings, ring_bytes);

    size_t hn = (size_t)m->hkv * s->n;
    float *acc = malloc(hn * sizeof(float));
    if (!acc)
        exit(2);
    for (size_t i = 0; i < hn; i++)
        acc[i] = (float)(bench_rnd() % 100000) * 1e-3f;
    s->acc = bench_dmalloc(hn * sizeof(float));
    CU(cudaMemcpy(s->acc, acc, hn * sizeof(float), cudaMemcpyHostToDevice));
    free(acc);
    s->keep = bench_dmalloc((size_t)m->hkv * budget * sizeof(uint32_t));
    /* The copies from pageable memory may still be in flight; the plans run on another stream. */
    CU(cudaDeviceSynchronize());
}

static void setup_free(struct setup *s) {
    CU(cudaFree(s->arena));
    CU(cudaFree(s->dtable));
    CU(cudaFree(s->rings));
    CU(cudaFree(s->acc));
    CU(cudaFree(s->keep));
}

/* The plan input of one layer. */
static struct vase_plan_input layer_input(const struct setup *s, enum vase_policy policy,
                                          uint32_t layer, uint32_t round) {
    const struct model *m = s->m;
    int64_t tok = (int64_t)m->hkv * m->dim * 2;
    char *kbase = (char *)s->arena + (size_t)layer * 2 * s->block_bytes;
    struct vase_view k = {
        .base = kbase,
        .pages = s->dtable,
        .tokens_per_page = TPP,
        .heads = m->hkv,
        .dim = m->dim,
        .dtype = VASE_DTYPE_BF16,
        .page_stride = (int64_t)s->page_bytes,
        .token_stride = tok,
        .head_stride = (int64_t)m->dim * 2,
    };
    struct vase_view v = k;
    v.base = kbase + s->block_bytes;
    struct vase_view q = {
        .base = (char *)s->rings + (size_t)layer * 2 * WINDOW * m->hq * m->dim * 2,
        .ring = 2 * WINDOW,
        .first = (round * WINDOW + 17) % (2 * WINDOW),
        .heads = m->hq,
        .dim = m->dim,
        .dtype = VASE_DTYPE_BF16,
        .token_stride = (int64_t)m->hq * m->dim * 2,
        .head_stride = (int64_t)m->dim * 2,
    };
    return (struct vase_plan_input){
        .policy = policy,
        .params = vase_params_default(s->budget),
        .n = s->n,
        .hq = m->hq,
        .k = k,
        .v = v,
        .q = q,
        .acc = policy == VASE_POLICY_H2O ? s->acc : NULL,
        .rng = {.seed = 42, .sequence = 7, .layer = layer, .round = round},
    };
}

struct opts {
    struct bench_opts b;
    double step_ms;
};

static void help(void) {
    printf("Usage: bench_plan_gpu [--reps N] [--step-ms MS] [--policies P,P,...]\n"
           "                      [--model NAME] [--budget N] [--layers N]\n"
           "Times vase_plan_cuda() per layer and per model (Qwen3-4B, Qwen3-14B; budgets 2048\n"
           "and 4096; bf16; W 64) against W decode steps of MS ms (default 20). Default: 9\n"
           "repetitions, every policy. --model, --budget and --layers narrow the run (a budget\n"
           "is a multiple of 64 above 64; fewer layers make the model times partial).\n");
}

static int parse_argv(int argc, char **argv, struct opts *o) {
    static const struct option options[] = {
        BENCH_LONG_OPTIONS,
        {"step-ms", required_argument, NULL, 's'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0) {
        char *end;
        int r = bench_parse_option(c, optarg, WINDOW, &o->b);
        if (r < 0)
            return r;
        if (r > 0)
            continue;
        switch (c) {
        case 's':
            o->step_ms = strtod(optarg, &end);
            if (*end || end == optarg || !(o->step_ms > 0))
                return -EINVAL;
            break;
        case 'h':
            help();
            return 0;
        default:
            return -EINVAL;
        }
    }
    return 1;
}

int main(int argc, char **argv) {
    struct opts o = {.b.reps = 9, .step_ms = 20.0};
    for (unsigned i = 0; i < _VASE_POLICY_MAX; i++)
        o.b.policies[i] = (enum vase_policy)i;
    o.b.npolicies = _VASE_POLICY_MAX;
    int r = parse_argv(argc, argv, &o);
    if (r <= 0)
        return r < 0 ? 2 : 0;

    r = vase_cuda_available();
    if (r <= 0) {
        fprintf(stderr, "bench_plan_gpu: no CUDA device\n");
        return 2;
    }
    struct cudaDeviceProp prop;
    int dev = 0;
    CU(cudaGetDevice(&dev));
    CU(cudaGetDeviceProperties(&prop, dev));

    cudaStream_t stream;
    cudaEvent_t ev0, ev1;
    struct vase_cuda_workspace *ws = NULL;
    CU(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CU(cudaEventCreate(&ev0));
    CU(cudaEventCreate(&ev1));
    if (vase_cuda_workspace_new(&ws) < 0)
        return 2;

    double budget_ms = o.step_ms * WINDOW;
    printf("# vase_plan_cuda() on %s: bf16, W %d, N = budget, %u repetitions, medians\n\n",
           prop.name, WINDOW, o.b.reps);
    printf("Eviction budget: %d decode steps x %.1f ms = %.0f ms per eviction of the whole "
           "model.\n\n",
           WINDOW, o.step_ms, budget_ms);
    printf("| model | budget | policy | layer GPU ms | layer host ms | model GPU ms | model host "
           "ms | of budget |\n");
    printf("|---|---:|---|---:|---:|---:|---:|---:|\n");
    fflush(stdout);

    int failed = 0;
    double *lg = malloc(o.b.reps * sizeof(double)), *lh = malloc(o.b.reps * sizeof(double));
    double *mg = malloc(o.b.reps * sizeof(double)), *mh = malloc(o.b.reps * sizeof(double));
    if (!lg || !lh || !mg || !mh)
        return 2;
    for (size_t mi = 0; mi < sizeof(models) / sizeof(models[0]) && !failed; mi++)
        for (size_t bi = 0; bi < sizeof(budgets) / sizeof(budgets[0]); bi++) {
            struct model m_ = models[mi];
            const struct model *m = &m_;
            uint32_t budget = o.b.budget ? o.b.budget : budgets[bi];
            if ((o.b.model && strcmp(o.b.model, m->name) != 0) || (o.b.budget && bi > 0))
                continue;
            if (o.b.max_layers && m_.layers > o.b.max_layers)
                m_.layers = o.b.max_layers;
            struct setup s;
            setup_make(&s, m, budget);
            for (unsigned pi = 0; pi < o.b.npolicies; pi++) {
                enum vase_policy p = o.b.policies[pi];
                /* Warm-up: the workspace grows to size, the modules load. */
                for (uint32_t l = 0; l < 2 && !failed; l++) {
                    struct vase_plan_input in = layer_input(&s, p, l, 0);
                    r = vase_plan_cuda(&in, ws, stream, s.keep);
                    if (r < 0) {
                        fprintf(stderr, "bench_plan_gpu: %s %s: vase_plan_cuda() = %s (%s)\n",
                                m->name, vase_policy_to_string(p), strerror(-r),
                                vase_cuda_last_error() ? vase_cuda_last_error() : "");
                        failed = 1;
                    }
                }
                if (failed)
                    break;
                for (unsigned rep = 0; rep < o.b.reps; rep++) {
                    /* One layer alone, then the whole model. */
                    struct vase_plan_input in = layer_input(&s, p, rep % m->layers, rep);
                    float ms;
                    double t0 = bench_now_ms();
                    CU(cudaEventRecord(ev0, stream));
                    r = vase_plan_cuda(&in, ws, stream, s.keep);
                    CU(cudaEventRecord(ev1, stream));
                    CU(cudaEventSynchronize(ev1));
                    lh[rep] = bench_now_ms() - t0;
                    CU(cudaEventElapsedTime(&ms, ev0, ev1));
                    lg[rep] = ms;

                    t0 = bench_now_ms();
                    CU(cudaEventRecord(ev0, stream));
                    for (uint32_t l = 0; l < m->layers && r == 0; l++) {
                        in = layer_input(&s, p, l, rep);
                        r = vase_plan_cuda(&in, ws, stream, s.keep);
                    }
                    CU(cudaEventRecord(ev1, stream));
                    CU(cudaEventSynchronize(ev1));
                    mh[rep] = bench_now_ms() - t0;
                    CU(cudaEventElapsedTime(&ms, ev0, ev1));
                    mg[rep] = ms;
                    if (r < 0) {
                        fprintf(stderr, "bench_plan_gpu: vase_plan_cuda() = %s\n", strerror(-r));
                        failed = 1;
                        break;
                    }
                }
                if (failed)
                    break;
                double model_host = bench_median(mh, o.b.reps);
                printf("| %s | %u | %s | %.3f | %.3f | %.2f | %.2f | %.2f%% |\n", m->name, budget,
                       vase_policy_to_string(p), bench_median(lg, o.b.reps),
                       bench_median(lh, o.b.reps), bench_median(mg, o.b.reps), model_host,
                       100.0 * model_host / budget_ms);
                fflush(stdout);
            }
            setup_free(&s);
            if (failed)
                break;
        }
    free(lg);
    free(lh);
    free(mg);
    free(mh);
    vase_cuda_workspace_free(ws);
    CU(cudaEventDestroy(ev0));
    CU(cudaEventDestroy(ev1));
    CU(cudaStreamDestroy(stream));
    return failed ? 1 : 0;
}
