/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The public types of vase: element types, eviction policies and their parameters, and the
 * strided view through which an engine reads and writes one layer's K, V or query rows. Part of
 * libvase's public API (vase.h includes it; an engine needs nothing else), and the one
 * definition the kernels build on (vase_kernels.h includes it): the types live with the kernels
 * that define their functions (kernels/view.c, kernels/policy.c), and libvase carries those
 * objects, so every function declared here is in libvase. Nothing here names a kernel, a
 * CUDA type or a header outside the C library.
 */

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Hard limits: what a plan may be asked to read, so that no request can make a kernel
 * allocate without bound. vase_params_check() and the daemon refuse geometry and parameters
 * beyond them, so an engine can check its own configuration against them first. */
#define VASE_MAX_DIM 1024          /* head dim */
#define VASE_MAX_HEADS 1024        /* query or KV heads of a layer */
#define VASE_MAX_TOKENS (1u << 22) /* candidates of one plan */
#define VASE_MAX_BUDGET (1u << 22)
#define VASE_MAX_RANK 256  /* sketch rank */
#define VASE_MAX_SMOOTH 63 /* box filter width */

enum vase_dtype {
    VASE_DTYPE_F32 = 0,
    VASE_DTYPE_F16 = 1,
    VASE_DTYPE_BF16 = 2,
    _VASE_DTYPE_MAX,
};

/* Bytes per element, or 0 for an invalid dtype. */
size_t vase_dtype_size(enum vase_dtype dtype);
/* "f32", "f16", "bf16"; NULL for an invalid dtype. */
const char *vase_dtype_to_string(enum vase_dtype dtype);
/* Parses "f32"/"float32", "f16"/"float16", "bf16"/"bfloat16". 0 or -EINVAL. */
int vase_dtype_from_string(const char *s, enum vase_dtype *ret);

/* Scalar conversions (round to nearest even), exposed for tests and the client library. */
float vase_f16_to_f32(uint16_t h);
uint16_t vase_f32_to_f16(float f);
float vase_bf16_to_f32(uint16_t h);
uint16_t vase_f32_to_bf16(float f);

enum vase_policy {
    VASE_POLICY_VASE_ATTNV = 0, /* range_sink_sample_attn (default) */
    VASE_POLICY_VASE_DKV,       /* cur_resample_gauss */
    VASE_POLICY_CURDKV,         /* cur_fixed_gauss */
    VASE_POLICY_SNAPKV,         /* attn */
    VASE_POLICY_RKV,            /* attn_rkv */
    VASE_POLICY_STREAMING,
    VASE_POLICY_RANDOM,
    VASE_POLICY_H2O,
    /* Ablations. */
    VASE_POLICY_ATTN_SAMPLE,       /* attn_sample */
    VASE_POLICY_RANGE_ATTN,        /* range_attn */
    VASE_POLICY_RANGE_SAMPLE_ATTN, /* range_sample_attn */
    VASE_POLICY_EVICT_LARGE_RANGE, /* evict_large_range */
    _VASE_POLICY_MAX,
};

/* Value-magnitude metric m[j] (ALGORITHM.md, "Value magnitude"). */
enum vase_metric {
    VASE_METRIC_RANGE = 0,
    VASE_METRIC_L2,
    VASE_METRIC_VAR,
    VASE_METRIC_ABSMAX,
    _VASE_METRIC_MAX,
};

/* Policy names as vase spells them ("vase-attnv", "snapkv", ...); NULL if invalid. */
const char *vase_policy_to_string(enum vase_policy p);
/* Parses a vase policy name. 0 or -EINVAL. */
int vase_policy_from_string(const char *s, enum vase_policy *ret);
/* Parses a reference mode name ("range_sink_sample_attn", "l2_sink_sample_attn",
 * "cur_fixed_gauss", ...) into a policy and the value metric it implies. 0 or -EINVAL. */
int vase_policy_from_mode(const char *mode, enum vase_policy *ret_policy,
                          enum vase_metric *ret_metric);
const char *vase_metric_to_string(enum vase_metric m);
int vase_metric_from_string(const char *s, enum vase_metric *ret);

/* What a policy reads. */
#define VASE_NEEDS_K (1u << 0)     /* candidate keys */
#define VASE_NEEDS_V (1u << 1)     /* candidate values */
#define VASE_NEEDS_Q (1u << 2)     /* the window's queries (windowed attention) */
#define VASE_NEEDS_ACC (1u << 3)   /* accumulated attention pushed by the engine (h2o) */
#define VASE_NEEDS_EXP (1u << 4)   /* Exp(1) draws, one per candidate and KV head */
#define VASE_NEEDS_GAUSS (1u << 5) /* a D x r Gaussian sketch */
unsigned vase_policy_needs(enum vase_policy p);

/* The two halves of a layer's cache. */
enum vase_kv {
    VASE_K = 0,
    VASE_V = 1,
};

struct vase_params {
    uint32_t budget;   /* slots kept after an eviction; multiple of window, > window */
    uint32_t window;   /* W */
    uint32_t n_sink;   /* first slots treated as sinks */
    uint32_t n_large;  /* slots reserved for large values (vase-attnv and ablations) */
    float temperature; /* T > 0 */
    uint32_t rank;     /* r >= 1, sketch rank (vase-dkv, curdkv) */
    float lambda;      /* R-KV mixing weight in [0, 1] */
    uint32_t smooth;   /* box filter width, odd, 1 = off */
    enum vase_metric metric;
    /* 1: the sequence's prompt, its first prompt_len slots (struct vase_seq_config), is never
     * evicted, with every policy: each plan keeps it first, in slot order, counts it against the
     * budget and leaves the policy budget - window - prompt_len of the other candidates to
     * choose (sinks inside the prompt are kept as part of it; those after it keep their rule).
     * Needs prompt_len <= budget - window (vase_params_explain_prompt()). 0: off, the default. */
    uint32_t protect_prompt;
};

/* The defaults of ALGORITHM.md for a budget: W 64, 4 sinks, n_large budget/4, T 1, r 20,
 * lambda 0.5, smooth 5, range, protect_prompt off. */
struct vase_params vase_params_default(uint32_t budget);
/* 0 if the parameters are valid for the policy, else -EINVAL. */
int vase_params_check(const struct vase_params *p, enum vase_policy policy);
/* vase_params_check() that also says why: on -EINVAL, the first rule p breaks, with the values
 * that break it ("budget must be a multiple of window (budget 100, window 64; 64 or 128 would
 * be)"), is written to msg[0 .. msg_size) (msg may be NULL); on 0, msg is "". */
int vase_params_explain(const struct vase_params *p, enum vase_policy policy, char *msg,
                        size_t msg_size);
/* vase_params_explain() of a sequence that prefills prompt_len tokens: also refuses
 * protect_prompt when the protected prompt and the window do not both fit the budget
 * (prompt_len > budget - window), with the rule and its values in msg. 0 or -EINVAL. */
int vase_params_explain_prompt(const struct vase_params *p, enum vase_policy policy,
                               uint32_t prompt_len, char *msg, size_t msg_size);

/*
 * A strided view of one layer's K, V or query rows, read (or, for compaction, written) in
 * place. Row r is the r-th token; its physical slot is r, or (first + r) % ring for a ring.
 * Slot s lives in page pages[s / tokens_per_page] (page s / tokens_per_page when pages is
 * NULL) at token s % tokens_per_page. The element (row, head, d) of that token is at
 *
 *     base + page * page_stride + token * token_stride + head * head_stride + d * elem_size
 *
 * so each head's dim elements are contiguous. tokens_per_page 0 means a single page. For the
 * arena layout [layer][K,V][token][kv_head][dim] of a page, a layer's K has
 * base = page 0 + layer * 2 * tpp * Hkv * D * es, token_stride = Hkv * D * es,
 * head_stride = D * es and page_stride = page_bytes; V is tpp * Hkv * D * es further.
 */
struct vase_view {
    void *base;
    const uint32_t *pages;    /* block table, or NULL for consecutive pages */
    uint32_t tokens_per_page; /* 0: every row on one page */
    uint32_t ring;            /* 0: row r is slot r; else slot (first + r) % ring */
    uint32_t first;
    uint32_t heads;
    uint32_t dim;
    enum vase_dtype dtype;
    int64_t page_stride; /* bytes */
    int64_t token_stride;
    int64_t head_stride;
};

/* A view of a contiguous [heads][rows][dim] array, the layout of the test vectors. */
struct vase_view vase_view_contiguous(void *base, enum vase_dtype dtype, uint32_t heads,
                                      uint32_t rows, uint32_t dim);
/* Address of element (row, head, 0). No checks. */
void *vase_view_row(const struct vase_view *v, uint32_t row, uint32_t head);
/* Reads one row of one head as float32 into out[dim]; returns 0, or -EINVAL if a value is
 * NaN or Inf (out is written either way). */
int vase_view_read_row(const struct vase_view *v, uint32_t row, uint32_t head, float *out);

#ifdef __cplusplus
}
#endif
