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
#include <time.h>

#include <cuda_runtime_api.h>

#include "argnum.h"
#include "vase_kernels.h"

static void cuda_check(cudaError_t e, const char *what, int line) {
    if (e != cudaSuccess) {
        fprintf(stderr, "bench_plan_gpu:%d: %s: %s\n", line, what, cudaGetErrorString(e));
        exit(2);
    }
}
#define CU(call) cuda_check((call), #call, __LINE__)

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

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* A bf16 value roughly N(0, 1): the sum of four uniforms, centred and scaled. */
static uint16_t rnd_bf16(void) {
    uint64_t x = rnd();
    float s = 0.0f;
    for (int i = 0; i < 4; i++)
        s += (float)((x >> (16 * i)) & 0xffff) * (1.0f / 65536.0f);
    return vase_f32_to_bf16((s - 2.0f) * 1.7320508f);
}

static void *dmalloc(size_t n) {
    void *p = NULL;
    CU(cudaMalloc(&p, n));
    return p;
}

/* Fills a device buffer with random bf16 from a few random host blocks. */
static void fill_dev(void *dst, size_t bytes) {
    enum { BLOCK = 1 << 22, VARIANTS = 4 };
    uint16_t *h = malloc((size_t)BLOCK * VARIANTS);
    if (!h)
        exit(2);
    for (size_t i = 0; i < (size_t)BLOCK * VARIANTS / 2; i++)
        h[i] = rnd_bf16();
    for (size_t off = 0, v = 0; off < bytes; off += BLOCK, v = (v + 1) % VARIANTS) {
        size_t m = bytes - off < BLOCK ? bytes - off : BLOCK;
        CU(cudaMemcpy((char *)dst + off, (char *)h + v * BLOCK, m, cudaMemcpyHostToDevice));
    }
    free(h);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *x, unsigned n) {
    qsort(x, n, sizeof(double), cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

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
    s->arena = dmalloc(phys * s->page_bytes);
    fill_dev(s->arena, phys * s->page_bytes);

    uint32_t *perm = malloc(phys * sizeof(uint32_t));
    if (!perm)
        exit(2);
    for (uint32_t i = 0; i < phys; i++)
        perm[i] = i;
    for (uint32_t i = phys; i > 1; i--) {
        uint32_t j = (uint32_t)(rnd() % i), t = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = t;
    }
    s->dtable = dmalloc(s->pages * sizeof(uint32_t));
    CU(cudaMemcpy(s->dtable, perm, s->pages * sizeof(uint32_t), cudaMemcpyHostToDevice));
    free(perm);

    size_t ring_bytes = (size_t)m->layers * 2 * WINDOW * m->hq * m->dim * 2;
    s->rings = dmalloc(ring_bytes);
    fill_dev(s->rings, ring_bytes);

    size_t hn = (size_t)m->hkv * s->n;
    float *acc = malloc(hn * sizeof(float));
    if (!acc)
        exit(2);
    for (size_t i = 0; i < hn; i++)
        acc[i] = (float)(rnd() % 100000) * 1e-3f;
    s->acc = dmalloc(hn * sizeof(float));
    CU(cudaMemcpy(s->acc, acc, hn * sizeof(float), cudaMemcpyHostToDevice));
    free(acc);
    s->keep = dmalloc((size_t)m->hkv * budget * sizeof(uint32_t));
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
    unsigned reps;
    double step_ms;
    enum vase_policy policies[_VASE_POLICY_MAX];
    unsigned npolicies;
    const char *model;   /* --model: that model alone */
    uint32_t budget;     /* --budget: that budget alone (0: 2048 and 4096) */
    uint32_t max_layers; /* --layers: at most that many layers (a smoke test) */
};

static int parse_policies(const char *arg, struct opts *o) {
    char *copy = strdup(arg), *save = NULL;
    if (!copy)
        return -ENOMEM;
    o->npolicies = 0;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (o->npolicies == _VASE_POLICY_MAX ||
            vase_policy_from_string(t, &o->policies[o->npolicies]) < 0) {
            fprintf(stderr, "bench_plan_gpu: unknown policy '%s'\n", t);
            free(copy);
            return -EINVAL;
        }
        o->npolicies++;
    }
    free(copy);
    return o->npolicies ? 0 : -EINVAL;
}

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
        {"reps", required_argument, NULL, 'r'},     {"step-ms", required_argument, NULL, 's'},
        {"policies", required_argument, NULL, 'p'}, {"model", required_argument, NULL, 'm'},
        {"budget", required_argument, NULL, 'b'},   {"layers", required_argument, NULL, 'l'},
        {"help", no_argument, NULL, 'h'},           {NULL, 0, NULL, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0) {
        char *end;
        uint32_t u;
        switch (c) {
        case 'r':
            if (argnum_u32(optarg, 1, 1000, &u) < 0)
                return -EINVAL;
            o->reps = u;
            break;
        case 's':
            o->step_ms = strtod(optarg, &end);
            if (*end || end == optarg || !(o->step_ms > 0))
                return -EINVAL;
            break;
        case 'p':
            if (parse_policies(optarg, o) < 0)
                return -EINVAL;
            break;
        case 'm':
            o->model = optarg;
            break;
        case 'b':
            if (argnum_u32(optarg, WINDOW + 1, VASE_MAX_BUDGET, &u) < 0 || u % WINDOW)
                return -EINVAL;
            o->budget = u;
            break;
        case 'l':
            if (argnum_u32(optarg, 1, 1000, &o->max_layers) < 0)
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
    struct opts o = {.reps = 9, .step_ms = 20.0};
    for (unsigned i = 0; i < _VASE_POLICY_MAX; i++)
        o.policies[i] = (enum vase_policy)i;
    o.npolicies = _VASE_POLICY_MAX;
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
           prop.name, WINDOW, o.reps);
    printf("Eviction budget: %d decode steps x %.1f ms = %.0f ms per eviction of the whole "
           "model.\n\n",
           WINDOW, o.step_ms, budget_ms);
    printf("| model | budget | policy | layer GPU ms | layer host ms | model GPU ms | model host "
           "ms | of budget |\n");
    printf("|---|---:|---|---:|---:|---:|---:|---:|\n");
    fflush(stdout);

    int failed = 0;
    double *lg = malloc(o.reps * sizeof(double)), *lh = malloc(o.reps * sizeof(double));
    double *mg = malloc(o.reps * sizeof(double)), *mh = malloc(o.reps * sizeof(double));
    if (!lg || !lh || !mg || !mh)
        return 2;
    for (size_t mi = 0; mi < sizeof(models) / sizeof(models[0]) && !failed; mi++)
        for (size_t bi = 0; bi < sizeof(budgets) / sizeof(budgets[0]); bi++) {
            struct model m_ = models[mi];
            const struct model *m = &m_;
            uint32_t budget = o.budget ? o.budget : budgets[bi];
            if ((o.model && strcmp(o.model, m->name) != 0) || (o.budget && bi > 0))
                continue;
            if (o.max_layers && m_.layers > o.max_layers)
                m_.layers = o.max_layers;
            struct setup s;
            setup_make(&s, m, budget);
            for (unsigned pi = 0; pi < o.npolicies; pi++) {
                enum vase_policy p = o.policies[pi];
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
                for (unsigned rep = 0; rep < o.reps; rep++) {
                    /* One layer alone, then the whole model. */
                    struct vase_plan_input in = layer_input(&s, p, rep % m->layers, rep);
                    float ms;
                    double t0 = now_ms();
                    CU(cudaEventRecord(ev0, stream));
                    r = vase_plan_cuda(&in, ws, stream, s.keep);
                    CU(cudaEventRecord(ev1, stream));
                    CU(cudaEventSynchronize(ev1));
                    lh[rep] = now_ms() - t0;
                    CU(cudaEventElapsedTime(&ms, ev0, ev1));
                    lg[rep] = ms;

                    t0 = now_ms();
                    CU(cudaEventRecord(ev0, stream));
                    for (uint32_t l = 0; l < m->layers && r == 0; l++) {
                        in = layer_input(&s, p, l, rep);
                        r = vase_plan_cuda(&in, ws, stream, s.keep);
                    }
                    CU(cudaEventRecord(ev1, stream));
                    CU(cudaEventSynchronize(ev1));
                    mh[rep] = now_ms() - t0;
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
                double model_host = median(mh, o.reps);
                printf("| %s | %u | %s | %.3f | %.3f | %.2f | %.2f | %.2f%% |\n", m->name, budget,
                       vase_policy_to_string(p), median(lg, o.reps), median(lh, o.reps),
                       median(mg, o.reps), model_host, 100.0 * model_host / budget_ms);
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
