/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * Internals shared by the CUDA kernels (the .cu files of kernels/): the device form of a view,
 * element loads, the Philox draws and the sort key of the CPU reference written out again for
 * the device (the exponential, vase__exp_neg(), is internal.h's own, a VASE_HD function), the
 * workspace, the error mapping and the launchers one .cu file calls in another. Not installed,
 * not part of the API.
 *
 * Bit-exactness. The CPU reference is compiled as ISO C, so GCC contracts no multiply-add into
 * an FMA, and its float loops keep their written order. The .cu files are compiled with
 * --fmad=false for the same reason: every device function here that mirrors a CPU formula
 * (value metrics, the leverage sketch, the R-KV redundancy, the draws, exp_neg) then rounds
 * exactly as the CPU does when it sums in the same order. Where an FMA is wanted (the Q.K^T
 * products, which cannot match OpenBLAS bit for bit anyway) it is written as __fmaf_rn().
 */

#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "internal.h"
}

/* ---- Errors ---- */

/* runtime_cuda.cu: maps a CUDA error to -errno by vase_cuda_errno() (0 for cudaSuccess),
 * remembers its message for vase_cuda_last_error() and clears a non-sticky error. */
int vase__cuda_errno(cudaError_t e);

/* Returns the mapped error of a runtime call, or of the last launch. */
#define CUDA_TRY(expr)                                                                             \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return vase__cuda_errno(e_);                                                           \
    } while (0)
#define CUDA_LAUNCHED() CUDA_TRY(cudaGetLastError())

/* ---- Workspace ---- */

/* Named device buffers of a workspace, each grown on demand. All of them are acquired before a
 * call launches anything, so growing one never frees memory a queued kernel still uses. */
enum cws_slot {
    CWS_FLAG,    /* int: nonzero once a kernel met NaN/Inf or an invalid value */
    CWS_KEEP,    /* [Hkv][K] u32: the plan under construction */
    CWS_S,       /* [Hkv][n] f32: the attention score (or the pushed one) */
    CWS_M,       /* [Hkv][n] f32: value metric, leverage or raw redundancy */
    CWS_AUX,     /* [Hkv][n] f32: exp of the redundancy */
    CWS_MASK,    /* [Hkv][n] u8: candidates excluded from the second selection */
    CWS_KEYS,    /* [Hkv][n] u32: sort keys */
    CWS_VALS,    /* [Hkv][n] u32: candidate index within its head */
    CWS_KEYS2,   /* [batch][n] u32: sorted keys */
    CWS_VALS2,   /* [batch][n] u32: sorted indices */
    CWS_OFFSETS, /* [batch + 1] int: segment offsets of the sort */
    CWS_CUB,     /* the sort's temporary storage */
    CWS_PART,    /* [Hq * W][tiles] float2: per-tile (max, sum) of each query row */
    CWS_STATS,   /* [Hq * W] float2: (max, 1 / sum) of each query row */
    CWS_AG,      /* [Hkv][G][n] f32: each query head's window-mean attention */
    CWS_GM,      /* [D][r] f32: the sketch */
    CWS_KN,      /* [Hkv][n][D] f32: normalised keys (R-KV) */
    CWS_DSUM,    /* [Hkv][D] f64: sum of the normalised keys (R-KV) */
    CWS_TOT,     /* [Hkv] f32: per-head totals */
    _CWS_MAX,
};

struct vase_cuda_workspace {
    int device;
    void *buf[_CWS_MAX];
    size_t size[_CWS_MAX];
    int *host_flag; /* pinned */
};

/* A device buffer of at least bytes bytes (256-byte aligned); contents undefined. 0 or -errno. */
int vase__cws_get(struct vase_cuda_workspace *ws, enum cws_slot slot, size_t bytes, void **ret);

/* Start of an exported call: clears stale runtime errors, makes a workspace for the call when
 * *ws is NULL (*own then holds it, for vase_cuda_workspace_free()), checks that the workspace
 * belongs to the current device and acquires its flag. 0 or -errno. */
int vase__cuda_enter(struct vase_cuda_workspace **ws, struct vase_cuda_workspace **own);
/* End of an exported call that launched work on stream (launched: 0, or the -errno of a failed
 * launch): reads the flag back and synchronises the stream, in every case. Returns launched if
 * it was an error, else -EINVAL if a kernel raised the flag, else 0 (or -errno). */
int vase__cuda_finish(struct vase_cuda_workspace *ws, cudaStream_t stream, int launched);

/* ---- Views on the device ---- */

/* A struct vase_view by value, its pointers on the device (base and the block table). */
struct dview {
    char *base;
    const uint32_t *pages; /* device block table, or NULL */
    uint32_t tpp, ring, first, heads, dim;
    int dtype;
    int64_t page_stride, token_stride, head_stride;
};

static inline struct dview dview_of(const struct vase_view *v) {
    struct dview d;
    d.base = (char *)v->base;
    d.pages = v->pages;
    d.tpp = v->tokens_per_page;
    d.ring = v->ring;
    d.first = v->first;
    d.heads = v->heads;
    d.dim = v->dim;
    d.dtype = (int)v->dtype;
    d.page_stride = v->page_stride;
    d.token_stride = v->token_stride;
    d.head_stride = v->head_stride;
    return d;
}

/* True if every address the view can form is aligned to its element size (the device faults
 * on misaligned loads where the CPU does not). */
static inline bool dview_aligned(const struct vase_view *v) {
    uint64_t es = vase_dtype_size(v->dtype);
    uint64_t bits = (uint64_t)(uintptr_t)v->base | (uint64_t)v->page_stride |
                    (uint64_t)v->token_stride | (uint64_t)v->head_stride;
    return es != 0 && bits % es == 0 && (uint64_t)(uintptr_t)v->pages % 4 == 0;
}

/* Address of (row, head, 0): vase__row() of internal.h, on the device. */
static __device__ __forceinline__ char *dview_row(const struct dview &v, uint32_t row,
                                                  uint32_t head) {
    uint64_t slot = v.ring ? ((uint64_t)v.first + row) % v.ring : row;
    uint64_t page = 0, tok = slot;

    if (v.tpp) {
        page = slot / v.tpp;
        tok = slot % v.tpp;
        if (v.pages)
            page = v.pages[page];
    }
    return v.base + (int64_t)page * v.page_stride + (int64_t)tok * v.token_stride +
           (int64_t)head * v.head_stride;
}

/* Element d of a row as float32, as vase__convert() converts it; bad |= 1 for NaN or Inf. */
static __device__ __forceinline__ float load_elem(const char *row, int dtype, uint32_t d,
                                                  uint32_t &bad) {
    uint32_t u;
    if (dtype == VASE_DTYPE_BF16) {
        u = (uint32_t)((const uint16_t *)row)[d] << 16;
    } else if (dtype == VASE_DTYPE_F16) {
        uint32_t h = ((const uint16_t *)row)[d];
        uint32_t sign = (h & 0x8000u) << 16, em = h & 0x7fffu;
        if (em >= 0x7c00u) /* Inf and NaN keep their payload */
            u = sign | 0x7f800000u | ((em & 0x3ffu) << 13);
        else if (em >= 0x0400u) /* normal: rebias the exponent */
            u = sign | ((em << 13) + ((127u - 15u) << 23));
        else /* zero and subnormals: exact as a float product */
            u = sign | __float_as_uint((float)em * 0x1p-24f);
    } else {
        u = ((const uint32_t *)row)[d];
    }
    bad |= (u & 0x7f800000u) == 0x7f800000u;
    return __uint_as_float(u);
}

static __device__ __forceinline__ bool finite_f(float x) {
    return (__float_as_uint(x) & 0x7f800000u) != 0x7f800000u;
}

/* Sets the workspace flag; many threads may, any value is as good as another. */
static __device__ __forceinline__ void raise_flag(int *flag) {
    atomicOr(flag, 1);
}

/* ---- Numerics mirrored from the CPU ---- */

/* desc_key() of select.c: ascending order of the key is descending order of the float, -0 and
 * +0 alike. No float maps to 0xffffffff (that would be a negative NaN), which marks excluded
 * candidates so that they sort after every eligible one. */
#define KEY_EXCLUDED 0xffffffffu
static __device__ __forceinline__ uint32_t desc_key(float f) {
    if (f == 0.0f)
        f = 0.0f;
    uint32_t u = __float_as_uint(f);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ~u;
}

/* Philox4x32-10 and the stream layout of philox.c: key = seed, counter = {word / 4, round,
 * layer << 16 | kv_head << 4 | stream, sequence}. */
enum { PHILOX_STREAM_EXP = 1, PHILOX_STREAM_NORMAL = 2 };

static __device__ __forceinline__ uint32_t philox_word(const struct vase_rng &rng, uint32_t kv_head,
                                                       uint32_t stream, uint64_t word) {
    uint32_t k0 = (uint32_t)rng.seed, k1 = (uint32_t)(rng.seed >> 32);
    uint32_t c0 = (uint32_t)(word / 4), c1 = rng.round;
    uint32_t c2 = (rng.layer & 0xffffu) << 16 | (kv_head & 0xfffu) << 4 | (stream & 0xfu);
    uint32_t c3 = rng.sequence;
    for (int i = 0; i < 10; i++) {
        if (i > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        uint32_t lo0 = 0xD2511F53u * c0, hi0 = __umulhi(0xD2511F53u, c0);
        uint32_t lo1 = 0xCD9E8D57u * c2, hi1 = __umulhi(0xCD9E8D57u, c2);
        uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
    }
    switch (word % 4) {
    case 0:
        return c0;
    case 1:
        return c1;
    case 2:
        return c2;
    default:
        return c3;
    }
}

/* Exp(1) draw j of (rng, kv_head): (float)(0.0 - log(u)), u = ((x >> 8) + 1) 2^-24, in double
 * as vase_rng_exp() computes it. */
static __device__ __forceinline__ float exp_draw(const struct vase_rng &rng, uint32_t kv_head,
                                                 uint64_t j) {
    uint32_t x = philox_word(rng, kv_head, PHILOX_STREAM_EXP, j);
    double u = ((x >> 8) + 1u) * 0x1p-24;
    return (float)(0.0 - log(u));
}

/* Standard normal draw e of (rng, kv_head) as vase_rng_normal() makes it: Box-Muller on the
 * word pair (2p, 2p + 1), p = e / 2, cosine for even e and sine for odd e, in double. */
static __device__ __forceinline__ float normal_draw(const struct vase_rng &rng, uint32_t kv_head,
                                                    uint64_t e) {
    uint64_t w = e & ~(uint64_t)1;
    uint32_t x1 = philox_word(rng, kv_head, PHILOX_STREAM_NORMAL, w);
    uint32_t x2 = philox_word(rng, kv_head, PHILOX_STREAM_NORMAL, w + 1);
    double rad = sqrt(-2.0 * log(((x1 >> 8) + 1u) * 0x1p-24));
    double ang = 2.0 * 3.14159265358979323846 * ((x2 >> 8) * 0x1p-24);
    return (float)(e & 1 ? rad * sin(ang) : rad * cos(ang));
}

/* ---- Launch helpers ---- */

static inline unsigned blocks_for(uint64_t items, unsigned block) {
    return (unsigned)((items + block - 1) / block);
}

/* ---- Launchers shared between the .cu files (all enqueue on stream, none synchronises) ---- */

struct plan_dims {
    uint32_t heads; /* Hkv */
    uint32_t n;     /* candidates */
    uint32_t K;     /* kept per head */
    uint32_t group; /* G = Hq / Hkv */
};

/* score_attn_cuda.cu: the window score s [Hkv][n] (attention, or the pushed scores checked). The
 * buffers it uses must have been acquired by vase__cuda_scores_reserve(). */
int vase__cuda_scores_reserve(const struct vase_plan_input *in, struct vase_cuda_workspace *ws);
int vase__cuda_scores(const struct vase_plan_input *in, struct vase_cuda_workspace *ws,
                      cudaStream_t stream, float *out, int *flag);
/* score_cuda.cu: value metric m [Hkv][n] of the view v. */
int vase__cuda_metric(const struct vase_view *v, uint32_t heads, uint32_t n, enum vase_metric m,
                      cudaStream_t stream, float *out, int *flag);
/* score_cuda.cu: the sketch gm [D][r]: gauss (injected normals, device [D][r], checked) or the
 * draws of rng, divided by sqrt(r), as vase_sketch() makes it. */
int vase__cuda_sketch(const float *gauss, const struct vase_rng *rng, uint32_t dim, uint32_t r,
                      cudaStream_t stream, float *gm, int *flag);
/* score_cuda.cu: the unnormalised leverage c [heads][n] = k2 v2 and each head's total
 * tot[h] = (float)sum_j c_j, summed in double in slot order. */
int vase__cuda_leverage(const struct vase_view *k, const struct vase_view *v, uint32_t heads,
                        uint32_t n, const float *gm, uint32_t r, cudaStream_t stream, float *c,
                        float *tot, int *flag);
/* score_cuda.cu: R-KV: red_exp [Hkv][n] = exp(raw - max) and tot[h] = sum_j red_exp (float, in
 * slot order); red = red_exp / tot. kn and dsum are scratch. */
int vase__cuda_redundancy(const struct vase_view *k, uint32_t heads, uint32_t n, float *kn,
                          double *dsum, float *raw, cudaStream_t stream, float *red_exp, float *tot,
                          int *flag);

/* select_cuda.cu: the heads per sort batch for n candidates (batch * n <= INT_MAX), and the
 * acquisition of the sort's buffers for heads x n keys. */
uint32_t vase__cuda_sort_batch(uint32_t heads, uint32_t n);
int vase__cuda_sort_reserve(struct vase_cuda_workspace *ws, uint32_t heads, uint32_t n);
/* select_cuda.cu: per head h, sorts (keys, vals) [heads][n] stably by key, ascending, and writes
 * the first m vals to out[h * out_stride + out_off + i]. Buffers from the workspace (CWS_KEYS2,
 * CWS_VALS2, CWS_OFFSETS, CWS_CUB), acquired beforehand. */
int vase__cuda_sort_take(struct vase_cuda_workspace *ws, cudaStream_t stream, const uint32_t *keys,
                         const uint32_t *vals, uint32_t heads, uint32_t n, uint32_t m,
                         uint32_t *out, uint32_t out_stride, uint32_t out_off);
