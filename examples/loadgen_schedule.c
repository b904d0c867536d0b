/* SPDX-License-Identifier: MIT */

/*
 * loadgen's clock, its random numbers (splitmix64: the same seed gives the same numbers on every
 * machine) and the arrival schedule they draw, the same for every mode of a run.
 */

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <time.h>

#include "loadgen.h"

double now_seconds(void) {
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void sleep_until(double t) {
    for (double left = t - now_seconds(); left > 0 && !stop_requested; left = t - now_seconds()) {
        struct timespec ts = {.tv_sec = (time_t)left,
                              .tv_nsec = (long)((left - (double)(time_t)left) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

/* splitmix64 */
uint64_t mix(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in (0, 1]. */
double uniform(uint64_t *state) {
    return ((double)(mix(state) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

static double exponential(uint64_t *state, double mean) {
    return -mean * log(uniform(state));
}

/* Uniform integer in [lo, hi]. */
static uint32_t uniform_in(uint64_t *state, uint32_t lo, uint32_t hi) {
    return lo + (uint32_t)((mix(state) >> 33) % ((uint64_t)hi - lo + 1));
}

int make_schedule(struct arrival **ret, size_t *ret_n) {
    uint64_t rng = (uint64_t)arg_seed;
    struct arrival *a = NULL;
    size_t n = 0, cap = 0;
    bool burst = false;
    double t = 0, period_end = exponential(&rng, arg_calm_seconds);

    for (;;) {
        double rate = burst ? arg_burst_rate : arg_calm_rate;
        double next = rate > 0 ? t + exponential(&rng, 1.0 / rate) : INFINITY;

        if (next > period_end) {
            t = period_end;
            burst = !burst;
            period_end = t + exponential(&rng, burst ? arg_burst_seconds : arg_calm_seconds);
            if (t >= arg_duration)
                break;
            continue;
        }
        t = next;
        if (t >= arg_duration)
            break;
        if (n == cap) {
            size_t ncap = cap ? 2 * cap : 256;
            struct arrival *p = realloc(a, ncap * sizeof(*a));

            if (!p) {
                free(a);
                return -ENOMEM;
            }
            a = p;
            cap = ncap;
        }
        double pick = uniform(&rng), acc = 0;
        uint32_t e = 0;
        for (e = 0; e + 1 < N_MODELS; e++) {
            acc += models[e].share;
            if (pick <= acc)
                break;
        }
        a[n++] = (struct arrival){
            .t = t,
            .engine = e,
            .prompt = uniform_in(&rng, models[e].budget / 2, models[e].budget),
            .length = uniform_in(&rng, (uint32_t)arg_decode_min, (uint32_t)arg_decode_max),
            .burst = burst,
        };
    }
    *ret = a;
    *ret_n = n;
    return 0;
}
