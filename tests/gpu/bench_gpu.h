/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * What the GPU benchmarks (bench_plan_gpu, bench_decode_gpu) share: exit-on-failure CUDA calls
 * (a benchmark has nothing to unwind), a seeded generator for the data, device buffers filled
 * with random bf16, medians and a monotonic clock.
 */

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "vase_types.h"

/* Prints what failed (with the program's name and the line) and exits with status 2. */
void bench_cuda_check(cudaError_t e, const char *what, int line);
#define CU(call) bench_cuda_check((call), #call, __LINE__)

/* The next value of a xorshift64 generator with a fixed seed. */
uint64_t bench_rnd(void);
/* A float roughly N(0, 1): the sum of four uniforms, centred and scaled. */
float bench_rnd_normal(void);
/* cudaMalloc() of n bytes, exiting on failure. */
void *bench_dmalloc(size_t n);
/* Fills bytes of device memory at dst with random bf16, copied from a few random host blocks. */
void bench_fill_dev(void *dst, size_t bytes);
/* The median of x[0 .. n), n >= 1; sorts x. */
double bench_median(double *x, unsigned n);
/* CLOCK_MONOTONIC in milliseconds. */
double bench_now_ms(void);

/* A comma-separated list of policy names into ret[0 .. *ret_n), at most _VASE_POLICY_MAX, with
 * a message on stderr for a name it does not know. 0, -EINVAL (nothing stored) or -ENOMEM. */
int bench_parse_policies(const char *arg, enum vase_policy *ret, unsigned *ret_n);

/* The options both benchmarks take, and their getopt_long() entries (values 'r', 'p', 'm', 'b',
 * 'l'). */
struct bench_opts {
    unsigned reps; /* --reps (1 to 1000) */
    enum vase_policy policies[_VASE_POLICY_MAX];
    unsigned npolicies;  /* --policies P,P,... */
    const char *model;   /* --model: that model alone */
    uint32_t budget;     /* --budget: that budget alone (0: each of the benchmark's) */
    uint32_t max_layers; /* --layers: at most that many layers (model times become partial) */
};
#define BENCH_LONG_OPTIONS                                                                         \
    {"reps", required_argument, NULL, 'r'}, {"policies", required_argument, NULL, 'p'},            \
        {"model", required_argument, NULL, 'm'}, {"budget", required_argument, NULL, 'b'}, {       \
        "layers", required_argument, NULL, 'l'                                                     \
    }
/* Parses option c of getopt_long() with argument arg into o when it is one of the above: 1;
 * 0 when c is another option; -EINVAL with a message on stderr for a bad argument (a budget is
 * a multiple of window from 2 * window to VASE_MAX_BUDGET). */
int bench_parse_option(int c, const char *arg, uint32_t window, struct bench_opts *o);
