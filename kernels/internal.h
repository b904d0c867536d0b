/* SPDX-License-Identifier: MIT */
#pragma once

/* Internals shared by the files of kernels/: scratch buffers, row gathering, the vectorised
 * exponential and the per-head selection helpers. Not installed, not part of the API. */

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "vase_kernels.h"

/* Hot loops are compiled for several instruction sets and picked at load time, so one binary
 * runs everywhere and still uses AVX2/AVX-512 where the CPU has them. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) &&                             \
    !defined(__SANITIZE_ADDRESS__)
#define VASE_HOT __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define VASE_HOT
#endif

/* Named scratch buffers of a workspace. Each is grown on demand and never shrinks. */
enum ws_slot {
    WS_K,      /* [n][D] candidate keys of one head, float32 */
    WS_V,      /* [n][D] candidate values */
    WS_Q,      /* [W][D] one query head's window */
    WS_LOGITS, /* [W][n] one query head's logits, then probabilities */
    WS_HEAD,   /* [n] one query head's mean attention */
    WS_S,      /* [n] the score being built */
    WS_M,      /* [n] value metric */
    WS_AUX,    /* [n] second score (redundancy, exclusion keys) */
    WS_DRAWS,  /* [n] Exp(1) draws */
    WS_SKETCH, /* [D][r] sketch, then [n][r] products */
    WS_SORT,   /* radix sort scratch, 4 * n words */
    WS_MASK,   /* [n] exclusion mask */
    WS_KEEP,   /* [heads][K] plan under construction */
    _WS_MAX,
};

struct vase_workspace {
    void *buf[_WS_MAX];
    size_t size[_WS_MAX];
};

/* A buffer of at least bytes bytes, 64-byte aligned; contents undefined. NULL on ENOMEM. */
void *vase__ws_get(struct vase_workspace *ws, enum ws_slot slot, size_t bytes);

/* Reads rows [0, n) of one head of a view into out [n][dim] as float32. Returns 0, or -EINVAL
 * if any value is NaN or Inf. */
int vase__gather(const struct vase_view *v, uint32_t head, uint32_t n, float *out);
/* Address of (row, head, 0) of a view: vase_view_row(), inlined for the hot loops. */
static inline void *vase__row(const struct vase_view *v, uint32_t row, uint32_t head) {
    uint64_t slot = v->ring ? ((uint64_t)v->first + row) % v->ring : row;
    uint64_t page = 0, tok = slot;

    if (v->tokens_per_page) {
        page = slot / v->tokens_per_page;
        tok = slot % v->tokens_per_page;
        if (v->pages)
            page = v->pages[page];
    }
    return (char *)v->base + (int64_t)page * v->page_stride + (int64_t)tok * v->token_stride +
           (int64_t)head * v->head_stride;
}

/* Rows of a strided read are requested this many rows ahead. */
#define VASE_PREFETCH_AHEAD 12

/* Asks the cache for one row of one head of a view. */
void vase__prefetch_row(const struct vase_view *v, uint32_t row, uint32_t head);
/* Checks that a view is well formed and holds at least rows rows. 0 or -EINVAL. */
int vase__view_check(const struct vase_view *v, uint32_t rows);
/* Converts count elements of dtype at src to float32; returns true if all are finite. */
bool vase__convert(const void *src, enum vase_dtype dtype, uint32_t count, float *out);
/* True if all count floats are finite. */
bool vase__all_finite(const float *x, size_t count);

/* Functions that the CUDA kernels run too (internal_cuda.cuh includes this header): under nvcc
 * inline functions of the host and the device, in C plain inline functions. */
#ifdef __CUDACC__
#define VASE_HD __host__ __device__ __forceinline__
#else
#define VASE_HD inline
#endif

/* The float whose bits are u. */
static VASE_HD float vase__float_of_bits(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    union {
        uint32_t u;
        float f;
    } x = {.u = u};
    return x.f;
#endif
}

/* Set by tests: the paged attention (attend.c) takes its portable path even where the CPU has
 * AVX-512, so that both paths are checked on one machine. */
extern int vase__attend_portable;

/* The float32 value of a binary16 pattern h (Inf and NaN stay so). Normal numbers rebias;
 * subnormals go through a float product (exact); the selects keep it branch-free, so that loops
 * over it vectorise. */
static inline float vase__f16_value(uint32_t h) {
    uint32_t sign = (h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu;
    uint32_t normal = (em << 13) + ((127u - 15u) << 23);
    float sub = (float)em * 0x1p-24f;
    uint32_t sub_bits;
    memcpy(&sub_bits, &sub, sizeof(sub_bits));
    uint32_t special = 0x7f800000u | ((em & 0x3ffu) << 13);
    uint32_t u = em >= 0x7c00u ? special : em >= 0x0400u ? normal : sub_bits;
    return vase__float_of_bits(sign | u);
}

/* exp(x) for x <= 0 in float32 to about one ulp, 0 below the normal range; vectorisable. On the
 * device too, where --fmad=false makes it round exactly as the CPU's. */
static VASE_HD float vase__exp_neg(float x) {
    const float log2e = 1.44269504088896341f;
    const float ln2_hi = 0.693145751953125f;
    const float ln2_lo = 1.42860682030941723e-6f;
    const float shifter = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float xc = x < -87.0f ? -87.0f : x;
    float t = xc * log2e + shifter;
    float nf = t - shifter;
    float r = xc - nf * ln2_hi - nf * ln2_lo;
    /* Taylor polynomial of degree 7 on |r| <= ln2/2: truncation error below 1e-8. */
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t n = (int32_t)nf;
    float y = p * vase__float_of_bits((uint32_t)(n + 127) << 23);
    return x < -87.0f ? 0.0f : y;
}

/* The candidates a plan keeps ahead of its policy's picks: [0, P), the protected prompt (0 unless
 * params.protect_prompt). */
static inline uint32_t vase__protected(const struct vase_plan_input *in) {
    return in->params.protect_prompt ? in->prompt_len : 0;
}

/* StreamingLLM's leading slots: the sinks, or the protected prompt when it is longer, at most
 * K; the rest of its plan is the most recent candidates. */
static VASE_HD uint32_t vase__streaming_head(uint32_t n_sink, uint32_t prompt, uint32_t K) {
    uint32_t head = n_sink > prompt ? n_sink : prompt;
    return head < K ? head : K;
}

/* The checks of vase_plan() that read no data, only the parameters, the views and which inputs
 * are present: shared with vase_plan_cuda(), whose data is on the device. 0 or -EINVAL. */
int vase__plan_check(const struct vase_plan_input *in);

/* Indices of the n largest keys among those not excluded (exclude may be NULL), descending,
 * ties in ascending index. Keys must not be NaN. scratch holds 4 * len words. -EINVAL when
 * fewer than n indices are eligible. */
int vase__select_top(const float *key, const uint8_t *exclude, uint32_t len, uint32_t n,
                     uint32_t *out, uint32_t *scratch);

/* Exponential-race keys w / E (0 where w is 0). -EINVAL for a negative, NaN or infinite weight
 * or a negative or NaN draw. */
int vase__race_keys(const float *w, const float *exp_draws, uint32_t len, float *keys);

/* Makes the BLAS run single-threaded in the calling thread; once per process. */
void vase__blas_init(void);

/* Sketched leverage of heads [h0, h1) at once (reads each token's heads together):
 * out [h1 - h0][n]. 0, -EINVAL (NaN/Inf or overflow), -ENOMEM. */
int vase__leverage_heads(const struct vase_view *k, const struct vase_view *v, uint32_t h0,
                         uint32_t h1, uint32_t n, const float *gm, uint32_t r,
                         struct vase_workspace *ws, float *out);
