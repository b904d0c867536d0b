/* SPDX-License-Identifier: MIT */

/*
 * Helpers of the GPU benchmarks (bench_gpu.h). The generator's state is the one global: the
 * benchmarks are single-threaded and want the same data on every run.
 */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "argnum.h"
#include "bench_gpu.h"
#include "vase_kernels.h"

void bench_cuda_check(cudaError_t e, const char *what, int line) {
    if (e != cudaSuccess) {
        fprintf(stderr, "%s:%d: %s: %s\n", program_invocation_short_name, line, what,
                cudaGetErrorString(e));
        exit(2);
    }
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

uint64_t bench_rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

float bench_rnd_normal(void) {
    uint64_t x = bench_rnd();
    float s = 0.0f;
    for (int i = 0; i < 4; i++)
        s += (float)((x >> (16 * i)) & 0xffff) * (1.0f / 65536.0f);
    return (s - 2.0f) * 1.7320508f;
}

void *bench_dmalloc(size_t n) {
    void *p = NULL;
    CU(cudaMalloc(&p, n));
    return p;
}

void bench_fill_dev(void *dst, size_t bytes) {
    enum { BLOCK = 1 << 22, VARIANTS = 4 };
    uint16_t *h = malloc((size_t)BLOCK * VARIANTS);
    if (!h) {
        fprintf(stderr, "%s: out of memory\n", program_invocation_short_name);
        exit(2);
    }
    for (size_t i = 0; i < (size_t)BLOCK * VARIANTS / 2; i++)
        h[i] = vase_f32_to_bf16(bench_rnd_normal());
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

double bench_median(double *x, unsigned n) {
    qsort(x, n, sizeof(double), cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

double bench_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

int bench_parse_policies(const char *arg, enum vase_policy *ret, unsigned *ret_n) {
    enum vase_policy p[_VASE_POLICY_MAX];
    unsigned n = 0;
    char *copy = strdup(arg), *save = NULL;
    if (!copy)
        return -ENOMEM;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (n == _VASE_POLICY_MAX || vase_policy_from_string(t, &p[n]) < 0) {
            fprintf(stderr, "%s: unknown policy '%s'\n", program_invocation_short_name, t);
            free(copy);
            return -EINVAL;
        }
        n++;
    }
    free(copy);
    if (n == 0)
        return -EINVAL;
    memcpy(ret, p, n * sizeof(p[0]));
    *ret_n = n;
    return 0;
}

int bench_parse_option(int c, const char *arg, uint32_t window, struct bench_opts *o) {
    const char *name = program_invocation_short_name;
    uint32_t u;

    switch (c) {
    case 'r':
        if (argnum_u32(arg, 1, 1000, &u) < 0) {
            fprintf(stderr, "%s: --reps takes 1 to 1000, not '%s'\n", name, arg);
            return -EINVAL;
        }
        o->reps = u;
        return 1;
    case 'p':
        return bench_parse_policies(arg, o->policies, &o->npolicies) < 0 ? -EINVAL : 1;
    case 'm':
        o->model = arg;
        return 1;
    case 'b':
        if (argnum_u32(arg, 2 * window, VASE_MAX_BUDGET, &u) < 0 || u % window) {
            fprintf(stderr, "%s: --budget takes a multiple of %u from %u to %u, not '%s'\n", name,
                    window, 2 * window, VASE_MAX_BUDGET, arg);
            return -EINVAL;
        }
        o->budget = u;
        return 1;
    case 'l':
        if (argnum_u32(arg, 1, 1000, &u) < 0) {
            fprintf(stderr, "%s: --layers takes 1 to 1000, not '%s'\n", name, arg);
            return -EINVAL;
        }
        o->max_layers = u;
        return 1;
    default:
        return 0;
    }
}
