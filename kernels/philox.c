/* SPDX-License-Identifier: MIT */

/*
 * Counter-based random draws. Every draw is a pure function of (seed, sequence, layer, KV head,
 * eviction round, stream, index), so the CPU and CUDA kernels draw the same numbers for the same
 * plan and a replay is exact, without any generator state to keep or share.
 *
 * Philox4x32-10 maps a 128-bit counter under a 64-bit key to 128 random bits. The key is the
 * seed; the counter is {block index, round, layer << 16 | kv_head << 4 | stream, sequence}.
 * Transcendentals are evaluated in double and rounded once, so that implementations whose
 * float functions differ in the last bit still agree.
 */

#include <math.h>

#include "internal.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

enum {
    STREAM_EXP = 1,
    STREAM_NORMAL = 2,
};

static void philox_round(uint32_t c[4], const uint32_t k[2]) {
    uint64_t p0 = (uint64_t)PHILOX_M0 * c[0];
    uint64_t p1 = (uint64_t)PHILOX_M1 * c[2];
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    uint32_t n0 = hi1 ^ c[1] ^ k[0];
    uint32_t n2 = hi0 ^ c[3] ^ k[1];
    c[0] = n0;
    c[1] = lo1;
    c[2] = n2;
    c[3] = lo0;
}

void vase_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c[4] = {ctr[0], ctr[1], ctr[2], ctr[3]};
    uint32_t k[2] = {key[0], key[1]};

    for (int i = 0; i < 10; i++) {
        if (i > 0) {
            k[0] += PHILOX_W0;
            k[1] += PHILOX_W1;
        }
        philox_round(c, k);
    }
    memcpy(out, c, sizeof(c));
}

/* Fills words[0..n) with the words of one stream starting at word first (a multiple of 4). */
static void stream_words(const struct vase_rng *rng, uint32_t kv_head, uint32_t stream,
                         size_t first, size_t n, uint32_t *words) {
    uint32_t key[2] = {(uint32_t)rng->seed, (uint32_t)(rng->seed >> 32)};
    uint32_t ctr[4] = {0, rng->round,
                       (rng->layer & 0xffffu) << 16 | (kv_head & 0xfffu) << 4 | (stream & 0xfu),
                       rng->sequence};
    for (size_t i = 0; i < n; i += 4) {
        uint32_t out[4];
        ctr[0] = (uint32_t)((first + i) / 4);
        vase_philox4x32_10(ctr, key, out);
        for (size_t j = 0; j < 4 && i + j < n; j++)
            words[i + j] = out[j];
    }
}

/* (0, 1]: the top 24 bits plus one, in units of 2^-24. */
static double unit_open0(uint32_t x) {
    return ((x >> 8) + 1u) * 0x1p-24;
}

/* [0, 1). */
static double unit_open1(uint32_t x) {
    return (x >> 8) * 0x1p-24;
}

/* Draws are made in chunks so no allocation is needed for any n. */
#define CHUNK 256

void vase_rng_uniform(const struct vase_rng *rng, uint32_t kv_head, uint32_t stream, float *out,
                      size_t n) {
    uint32_t w[CHUNK];
    for (size_t base = 0; base < n; base += CHUNK) {
        size_t m = n - base < CHUNK ? n - base : CHUNK;
        stream_words(rng, kv_head, stream, base, m, w);
        for (size_t i = 0; i < m; i++)
            out[base + i] = (float)unit_open0(w[i]);
    }
}

void vase_rng_exp(const struct vase_rng *rng, uint32_t kv_head, float *out, size_t n) {
    uint32_t w[CHUNK];
    for (size_t base = 0; base < n; base += CHUNK) {
        size_t m = n - base < CHUNK ? n - base : CHUNK;
        stream_words(rng, kv_head, STREAM_EXP, base, m, w);
        /* 0.0 - log(u) is +0 for u = 1, so w / E is +Inf rather than -Inf there. */
        for (size_t i = 0; i < m; i++)
            out[base + i] = (float)(0.0 - log(unit_open0(w[i])));
    }
}

void vase_rng_normal(const struct vase_rng *rng, uint32_t kv_head, float *out, size_t n) {
    uint32_t w[CHUNK];
    for (size_t base = 0; base < n; base += CHUNK) {
        size_t m = n - base < CHUNK ? n - base : CHUNK;
        stream_words(rng, kv_head, STREAM_NORMAL, base, (m + 1) & ~(size_t)1, w);
        /* Box-Muller on consecutive word pairs: (u1, u2) -> (z0, z1). */
        for (size_t i = 0; i < m; i += 2) {
            double rad = sqrt(-2.0 * log(unit_open0(w[i])));
            double ang = 2.0 * M_PI * unit_open1(w[i + 1]);
            out[base + i] = (float)(rad * cos(ang));
            if (i + 1 < m)
                out[base + i + 1] = (float)(rad * sin(ang));
        }
    }
}
