/* SPDX-License-Identifier: MIT */

/*
 * bench_kernels: times one layer's plan (all KV heads) at a model geometry, reading K and V
 * through the paged arena layout and the queries through a ring, as the daemon does. Prints
 * the distribution of the repetitions and, last, "median_ms=<x>". With --gemm-floor it also
 * times the bare Q.K^T products of the same shapes through the same BLAS, alternating with
 * the plan so both see the same machine load, and prints their ratio.
 */

#include <cblas.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "argnum.h"
#include "vase_kernels.h"

struct opts {
    enum vase_policy policy;
    uint32_t hq, hkv, dim, budget, window;
    enum vase_dtype dtype;
    unsigned threads, reps;
    uint64_t seed;
    size_t page_bytes;
    int gemm_floor;
};

static void help(void) {
    printf("Usage: bench_kernels [OPTIONS]\n"
           "  --policy P       policy (default vase-attnv)\n"
           "  --hq N --hkv N --d N   query heads, KV heads, head dim (32, 8, 128)\n"
           "  --budget N --window N  (4096, 64)\n"
           "  --dtype f32|f16|bf16   storage type (f32)\n"
           "  --threads N      threads over KV heads (1)\n"
           "  --reps N         timed repetitions (15)\n"
           "  --seed N         data and draw seed (1)\n"
           "  --gemm-floor     also time the bare Q.K^T products and print the ratio\n");
}

static int parse_argv(int argc, char **argv, struct opts *o) {
    static const struct option longopts[] = {
        {"policy", required_argument, NULL, 'p'},
        {"hq", required_argument, NULL, 'q'},
        {"hkv", required_argument, NULL, 'k'},
        {"d", required_argument, NULL, 'd'},
        {"budget", required_argument, NULL, 'b'},
        {"window", required_argument, NULL, 'w'},
        {"dtype", required_argument, NULL, 't'},
        {"threads", required_argument, NULL, 'j'},
        {"reps", required_argument, NULL, 'r'},
        {"seed", required_argument, NULL, 's'},
        {"gemm-floor", no_argument, NULL, 'g'},
        {"help", no_argument, NULL, 'h'},
        {0},
    };
    int c, r = 0, idx = 0;
    while ((c = getopt_long(argc, argv, "h", longopts, &idx)) >= 0) {
        uint32_t u;
        switch (c) {
        case 'p':
            if (vase_policy_from_string(optarg, &o->policy) < 0) {
                fprintf(stderr, "bench_kernels: unknown policy '%s'\n", optarg);
                return -EINVAL;
            }
            break;
        case 'q':
            r = argnum_u32(optarg, 1, VASE_MAX_HEADS, &o->hq);
            break;
        case 'k':
            r = argnum_u32(optarg, 1, VASE_MAX_HEADS, &o->hkv);
            break;
        case 'd':
            r = argnum_u32(optarg, 1, VASE_MAX_DIM, &o->dim);
            break;
        case 'b':
            r = argnum_u32(optarg, 2, 1u << 20, &o->budget);
            break;
        case 'w':
            r = argnum_u32(optarg, 1, 1u << 16, &o->window);
            break;
        case 't':
            if (vase_dtype_from_string(optarg, &o->dtype) < 0) {
                fprintf(stderr, "bench_kernels: unknown dtype '%s'\n", optarg);
                return -EINVAL;
            }
            break;
        case 'j':
            r = argnum_u32(optarg, 1, 256, &u);
            o->threads = u;
            break;
        case 'r':
            r = argnum_u32(optarg, 1, 100000, &u);
            o->reps = u;
            break;
        case 's':
            r = argnum_u32(optarg, 0, UINT32_MAX, &u);
            o->seed = u;
            break;
        case 'g':
            o->gemm_floor = 1;
            break;
        case 'h':
            help();
            return 0;
        default:
            return -EINVAL;
        }
        if (r < 0) {
            fprintf(stderr, "bench_kernels: invalid value '%s' for --%s\n", optarg,
                    longopts[idx].name);
            return r;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "bench_kernels: unexpected argument '%s'\n", argv[optind]);
        return -EINVAL;
    }
    if (o->hq % o->hkv) {
        fprintf(stderr, "bench_kernels: --hq must be a multiple of --hkv\n");
        return -EINVAL;
    }
    return 1;
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* A small deterministic generator for the synthetic data (not the plan's draws). */
static uint64_t mix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float gauss(uint64_t *s) {
    double u1 = ((mix(s) >> 11) + 1) * 0x1p-53, u2 = (mix(s) >> 11) * 0x1p-53;
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

static void store(void *dst, enum vase_dtype dt, float f) {
    if (dt == VASE_DTYPE_F32) {
        memcpy(dst, &f, 4);
    } else {
        uint16_t h = dt == VASE_DTYPE_F16 ? vase_f32_to_f16(f) : vase_f32_to_bf16(f);
        memcpy(dst, &h, 2);
    }
}

static double median(double *x, unsigned n) {
    qsort(x, n, sizeof(*x), cmp_double);
    return n % 2 ? x[n / 2] : (x[n / 2 - 1] + x[n / 2]) / 2;
}

static int run(const struct opts *o) {
    uint32_t W = o->window, N = o->budget, len = N + W, G = o->hq / o->hkv;
    size_t es = vase_dtype_size(o->dtype);
    size_t row = (size_t)o->hkv * o->dim * es;
    uint32_t tpp = (uint32_t)(o->page_bytes / (2 * row));
    if (tpp == 0)
        tpp = 1;
    uint32_t npages = (len + tpp - 1) / tpp;
    size_t page_bytes =
        (size_t)tpp * 2 * row > o->page_bytes ? (size_t)tpp * 2 * row : o->page_bytes;
    /* One spare page at the front and a reversed block table, so the view really jumps. */
    char *arena = aligned_alloc(4096, (npages + 1) * page_bytes);
    uint32_t *table = malloc(npages * sizeof(uint32_t));
    uint32_t ring = 2 * W;
    char *qring = malloc((size_t)ring * o->hq * o->dim * es);
    uint32_t K = o->budget - W;
    uint32_t *keep = malloc((size_t)o->hkv * K * sizeof(uint32_t));
    float *qf = malloc((size_t)o->hq * W * o->dim * sizeof(float));
    float *kf = malloc((size_t)o->hkv * N * o->dim * sizeof(float));
    float *logits = malloc((size_t)G * W * N * sizeof(float));
    float *acc = calloc((size_t)o->hkv * N, sizeof(float));
    double *tp = malloc(o->reps * sizeof(double)), *tg = malloc(o->reps * sizeof(double));
    struct vase_workspace **ws = calloc(o->threads, sizeof(*ws));
    int r = -ENOMEM;
    if (!arena || !table || !qring || !keep || !qf || !kf || !logits || !acc || !tp || !tg || !ws)
        goto out;
    for (unsigned t = 0; t < o->threads; t++)
        if (vase_workspace_new(&ws[t]) < 0)
            goto out;

    for (uint32_t p = 0; p < npages; p++)
        table[p] = npages - p;
    uint64_t s = o->seed * 0x632be59bd9b4e019ull + 1;
    /* Heavy-tailed synthetic data: Gaussian keys and values, a few tokens whose values are
     * twenty times larger (the outliers VaSE protects), queries correlated with a direction. */
    for (uint32_t t = 0; t < len; t++) {
        uint32_t page = table[t / tpp], tok = t % tpp;
        char *kb = arena + page * page_bytes + (size_t)tok * row;
        char *vb = kb + (size_t)tpp * row;
        float vscale = (mix(&s) % 97 == 0) ? 20.0f : 1.0f;
        for (uint32_t i = 0; i < o->hkv * o->dim; i++) {
            store(kb + i * es, o->dtype, gauss(&s));
            store(vb + i * es, o->dtype, vscale * gauss(&s));
        }
    }
    for (size_t i = 0; i < (size_t)ring * o->hq * o->dim; i++)
        store(qring + i * es, o->dtype, gauss(&s) * 2.0f);
    for (size_t i = 0; i < (size_t)o->hkv * N; i++)
        acc[i] = (float)(mix(&s) % 1000);

    struct vase_view kv = {
        .base = arena,
        .pages = table,
        .tokens_per_page = tpp,
        .heads = o->hkv,
        .dim = o->dim,
        .dtype = o->dtype,
        .page_stride = (int64_t)page_bytes,
        .token_stride = (int64_t)row,
        .head_stride = (int64_t)o->dim * es,
    };
    struct vase_view vv = kv;
    vv.base = arena + (size_t)tpp * row;
    struct vase_view qv = {
        .base = qring,
        .ring = ring,
        .first = W + 3,
        .heads = o->hq,
        .dim = o->dim,
        .dtype = o->dtype,
        .token_stride = (int64_t)o->hq * o->dim * es,
        .head_stride = (int64_t)o->dim * es,
    };
    struct vase_plan_input in = {
        .policy = o->policy,
        .params = vase_params_default(o->budget),
        .n = N,
        .hq = o->hq,
        .k = kv,
        .v = vv,
        .q = qv,
        .acc = acc,
        .rng = {.seed = o->seed, .sequence = 1, .layer = 0, .round = 0},
    };
    in.params.window = W;
    r = vase_params_check(&in.params, o->policy);
    if (r < 0) {
        fprintf(stderr, "bench_kernels: invalid parameters (budget must be a multiple of "
                        "window and larger)\n");
        goto out;
    }
    /* The floor's operands: contiguous float32 copies, made once, outside the timing. */
    for (uint32_t h = 0; h < o->hkv; h++)
        for (uint32_t j = 0; j < N; j++)
            vase_view_read_row(&kv, j, h, kf + ((size_t)h * N + j) * o->dim);
    for (uint32_t h = 0; h < o->hq; h++)
        for (uint32_t i = 0; i < W; i++)
            vase_view_read_row(&qv, i, h, qf + ((size_t)h * W + i) * o->dim);

    printf("policy=%s hq=%u hkv=%u d=%u budget=%u window=%u dtype=%s threads=%u reps=%u\n",
           vase_policy_to_string(o->policy), o->hq, o->hkv, o->dim, o->budget, W,
           vase_dtype_to_string(o->dtype), o->threads, o->reps);
    for (unsigned rep = 0; rep < o->reps + 2; rep++) {
        in.rng.round = rep;
        double t0 = now_ms();
        r = vase_plan(&in, o->threads, ws, keep);
        double t1 = now_ms();
        if (r < 0) {
            fprintf(stderr, "bench_kernels: plan failed: %s\n", strerror(-r));
            goto out;
        }
        if (o->gemm_floor) {
            for (uint32_t h = 0; h < o->hkv; h++)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(G * W), (int)N,
                            (int)o->dim, 1.0f, qf + (size_t)h * G * W * o->dim, (int)o->dim,
                            kf + (size_t)h * N * o->dim, (int)o->dim, 0.0f, logits, (int)N);
        }
        double t2 = now_ms();
        if (rep >= 2) { /* two warm-up repetitions fill caches and workspaces */
            tp[rep - 2] = t1 - t0;
            tg[rep - 2] = t2 - t1;
        }
    }
    double pmin, pmax, pmed;
    pmed = median(tp, o->reps);
    pmin = tp[0];
    pmax = tp[o->reps - 1];
    printf("plan_ms: min=%.3f median=%.3f max=%.3f\n", pmin, pmed, pmax);
    if (o->gemm_floor) {
        double gmed = median(tg, o->reps);
        printf("gemm_floor_ms=%.3f (%u x sgemm %ux%ux%u, one thread)\n", gmed, o->hkv, G * W, N,
               o->dim);
        printf("ratio=%.2f\n", pmed / gmed);
    }
    printf("median_ms=%.3f\n", pmed);
    r = 0;
out:
    if (ws)
        for (unsigned t = 0; t < o->threads; t++)
            vase_workspace_free(ws[t]);
    free(ws);
    free(tg);
    free(tp);
    free(acc);
    free(logits);
    free(kf);
    free(qf);
    free(keep);
    free(qring);
    free(table);
    free(arena);
    return r;
}

int main(int argc, char **argv) {
    struct opts o = {
        .policy = VASE_POLICY_VASE_ATTNV,
        .hq = 32,
        .hkv = 8,
        .dim = 128,
        .budget = 4096,
        .window = 64,
        .dtype = VASE_DTYPE_F32,
        .threads = 1,
        .reps = 15,
        .seed = 1,
        .page_bytes = 2u << 20,
    };
    int r = parse_argv(argc, argv, &o);
    if (r <= 0)
        return r < 0 ? 2 : 0;
    /* The floor is one thread, like the plans (--threads spreads heads over our own threads). */
    openblas_set_num_threads(1);
    return run(&o) < 0 ? 1 : 0;
}
