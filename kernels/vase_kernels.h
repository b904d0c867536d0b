/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The eviction kernels: scoring, selection, compaction and random draws for every policy of
 * ALGORITHM.md. One C interface with no CUDA types; the CPU implementation is the reference.
 * Beside them (vase_attend.h, a header of its own) the CPU paged attention over the arena.
 *
 * Every fallible function returns >= 0 on success and -errno on failure (-EINVAL for bad
 * parameters and for NaN or Inf in the data a policy reads, -ENOMEM when scratch memory cannot
 * be had). On failure a plan or a compaction writes nothing: a plan is either complete or
 * absent. The score functions, exposed for tests, leave their output undefined on failure.
 */

#include <stddef.h>
#include <stdint.h>

#include "vase_attend.h"
#include "vase_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The hard limits (VASE_MAX_*) are those of vase_types.h. */

/* ---- Random draws: Philox4x32-10 ---- */

/* One Philox4x32-10 block: ten rounds of the counter under the key. */
void vase_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* The key of a draw stream. Sequence ids are 32-bit; layer < 65536, kv_head < 4095. */
struct vase_rng {
    uint64_t seed;
    uint32_t sequence;
    uint32_t layer;
    uint32_t round;
};

#define VASE_RNG_HEAD_SHARED 0xfffu /* kv_head of draws shared by a layer's heads */

/* n Exp(1) draws (-log u, u in (0,1]) for (rng, kv_head). */
void vase_rng_exp(const struct vase_rng *rng, uint32_t kv_head, float *out, size_t n);
/* n standard normal draws by Box-Muller for (rng, kv_head). */
void vase_rng_normal(const struct vase_rng *rng, uint32_t kv_head, float *out, size_t n);
/* n uniform draws in (0, 1] for (rng, kv_head, stream); exposed for distribution tests. */
void vase_rng_uniform(const struct vase_rng *rng, uint32_t kv_head, uint32_t stream, float *out,
                      size_t n);

/* ---- Primitives ---- */

/* The n largest of x[0..len) in descending order, ties in ascending index. x must hold no NaN.
 * Writes n indices to out. 0 or -EINVAL (n > len). */
int vase_topk(const float *x, uint32_t len, uint32_t n, uint32_t *out);
/* The exponential race: n distinct indices drawn without replacement with probability
 * proportional to w (>= 0), given one Exp(1) draw per index; keys w/E in descending order,
 * zero weights last in ascending index. Indices with exclude[i] != 0 (exclude may be NULL) are
 * never drawn. 0, or -EINVAL if n exceeds the indices available or a weight is negative/NaN. */
int vase_sample(const float *w, const float *exp_draws, const uint8_t *exclude, uint32_t len,
                uint32_t n, uint32_t *out);

/* Value magnitude of rows [0, n) of one head. 0 or -EINVAL (NaN/Inf). */
int vase_value_metric(const struct vase_view *v, uint32_t head, uint32_t n, enum vase_metric m,
                      float *out);

/* ---- Scores (exposed for tests; vase_plan_heads() uses them) ---- */

struct vase_plan_input;
struct vase_workspace;

/* Windowed attention score s[0..n) of one KV head (ALGORITHM.md "Scores"): softmax over the
 * candidates per query, mean over the window, box filter, mean over the group. Uses
 * in->scores instead when it is set. 0 or -EINVAL (NaN/Inf in K or Q) / -ENOMEM. */
int vase_score_attention(const struct vase_plan_input *in, uint32_t head, struct vase_workspace *ws,
                         float *out);
/* The sketch gm [D][r]: gauss (injected standard normals, [D][r]) or draws keyed by rng with
 * VASE_RNG_HEAD_SHARED, divided by sqrt(r). */
void vase_sketch(const struct vase_rng *rng, const float *gauss, uint32_t dim, uint32_t r,
                 float *gm);
/* Sketched leverage c[0..n) of one KV head: k2 v2 / sum(k2 v2), with gm from vase_sketch().
 * 0 or -EINVAL / -ENOMEM. */
int vase_score_leverage(const struct vase_view *k, const struct vase_view *v, uint32_t head,
                        uint32_t n, const float *gm, uint32_t r, struct vase_workspace *ws,
                        float *out);
/* R-KV redundancy red[0..n) of one KV head: softmax_j(mean_i C[i,j]), C the cosine
 * similarity of keys with a zero diagonal. 0 or -EINVAL / -ENOMEM. */
int vase_score_redundancy(const struct vase_view *k, uint32_t head, uint32_t n,
                          struct vase_workspace *ws, float *out);

/* ---- Plans ---- */

/* Everything one layer's plan reads. Candidates are rows [0, n) of k and v. */
struct vase_plan_input {
    enum vase_policy policy;
    struct vase_params params;
    uint32_t n;             /* candidates N = len - W */
    uint32_t hq;            /* query heads; a multiple of k.heads */
    struct vase_view k;     /* rows >= n, heads Hkv */
    struct vase_view v;     /* rows >= n, heads Hkv, same dim as k */
    struct vase_view q;     /* rows >= W (the window's queries, any order), heads hq */
    const float *acc;       /* [Hkv][n] accumulated attention (h2o), else NULL */
    const float *scores;    /* [Hkv][n] pushed window scores replacing the computed s, or NULL */
    struct vase_rng rng;    /* draws when the injected ones below are NULL */
    const float *exp_draws; /* injected [Hkv][n] Exp(1) draws, or NULL */
    const float *gauss;     /* injected [D][r] standard normals, or NULL */
    /* The sequence's prompt length. With params.protect_prompt, candidates [0, prompt_len) (at
     * most K of them) lead every head's plan in slot order and are never picked by the policy,
     * which chooses the other K - prompt_len; ignored otherwise. */
    uint32_t prompt_len;
};

/* Scratch memory for plans; one per thread. Grows as needed, freed by vase_workspace_free(). */
struct vase_workspace;
int vase_workspace_new(struct vase_workspace **ret);
struct vase_workspace *vase_workspace_free(struct vase_workspace *ws);

/* K = budget - window: the number of candidates each KV head keeps. */
uint32_t vase_plan_keep_count(const struct vase_params *p);

/* The parameters of a sequence opened with at_max, at another budget (elastic budgets):
 * n_large scaled with the budget (n_large * budget / at_max->budget, rounded down), everything
 * else as opened (policy.c, beside vase_params_default()). */
struct vase_params vase_params_at_budget(const struct vase_params *at_max, uint32_t budget);

/*
 * Computes the plan of KV heads [h0, h1) of one layer: keep[(h - h0) * K + i], K from
 * vase_plan_keep_count(). ws may be NULL (scratch is then allocated for the call).
 * Returns 0; -EINVAL for invalid parameters or views, or NaN/Inf in what the policy reads
 * (nothing is written then); -ENOMEM.
 */
int vase_plan_heads(const struct vase_plan_input *in, uint32_t h0, uint32_t h1,
                    struct vase_workspace *ws, uint32_t *keep);
/* The whole layer, keep [Hkv][K], its KV heads spread over nthreads threads (>= 1). ws is
 * NULL or an array of nthreads workspaces, one per thread. Same returns as vase_plan_heads(). */
int vase_plan(const struct vase_plan_input *in, unsigned nthreads, struct vase_workspace **ws,
              uint32_t *keep);

/* ---- Compaction ---- */

/*
 * Applies a plan to one view (a layer's K or V, all heads): for each head, slot i < K receives
 * candidate keep[head * K + i] and slots K .. K + len - n - 1 receive old slots n .. len - 1 in
 * order. Reads every source before it overwrites any. keep must be distinct values below n,
 * K <= n <= len. Returns the new length K + len - n, or -EINVAL (nothing moved) / -ENOMEM.
 */
int vase_compact(struct vase_view *view, const uint32_t *keep, uint32_t K, uint32_t n,
                 uint32_t len);
/* vase_compact() of a layer's K and V (v may be NULL) by one plan, checked once. Returns the
 * new length, or -EINVAL / -ENOMEM with nothing moved. */
int vase_compact_layer(struct vase_view *k, struct vase_view *v, const uint32_t *keep, uint32_t K,
                       uint32_t n, uint32_t len);
/* The same move on a [heads][stride] float array (per-slot statistics such as h2o's
 * accumulated attention); entries past the new length are zeroed. Returns the new length. */
int vase_compact_f32(float *data, uint32_t heads, size_t stride, const uint32_t *keep, uint32_t K,
                     uint32_t n, uint32_t len);

/* Validates a plan: every head's K entries distinct and below n. 0 or -EINVAL. */
int vase_plan_validate(const uint32_t *keep, uint32_t heads, uint32_t K, uint32_t n);

/* ---- CUDA (built when USE_CUDA=1) ---- */

/*
 * The same plans and compaction on the GPU, in libvasekernels_cuda.a (the .cu files of
 * kernels/; link it before libvasekernels.a, with -lcudart -lstdc++). Declared whatever the
 * build; defined only when USE_CUDA=1.
 *
 * The CUDA entry points take the CPU's structures, but every pointer they reach through them is
 * a DEVICE pointer of the current device: each view's base and its block table (pages), acc,
 * scores, exp_draws, gauss, keep and out. Views must be aligned to their element size (base
 * and every stride), block tables to 4 bytes (-EINVAL otherwise). Nothing is read on the host
 * but the structures themselves. Work goes to the CUDA stream `stream` (a cudaStream_t; NULL is
 * the legacy default stream) of the calling thread's current device.
 *
 * Returns: as the CPU functions, plus CUDA failures mapped to -errno by vase_cuda_errno();
 * vase_cuda_last_error() gives the runtime's message for logging. Each call but
 * vase_compact_cuda() first clears the thread's pending (non-sticky) runtime error: they run in
 * vased and in tools, whereas vase_compact_cuda() runs in the engine's process (see there).
 */

/*
 * A CUDA runtime error (a cudaError_t) and a driver result (a CUresult) as -errno, 0 for success;
 * the one mapping of vase (errno_cuda.c), used by the kernels, vased and libvase. Runtime:
 * -ENOMEM for cudaErrorMemoryAllocation; -EINVAL for cudaErrorInvalidValue; -ENODEV for no
 * device, an invalid device, an insufficient, mismatched or uninitialised driver, or a call that
 * needs a newer one; -EBUSY for cudaErrorDevicesUnavailable (compute mode); -EOPNOTSUPP for
 * cudaErrorNotSupported; -EIO for anything else. Driver: -ENOMEM for CUDA_ERROR_OUT_OF_MEMORY,
 * -EINVAL for CUDA_ERROR_INVALID_VALUE, -ENODEV for no or an invalid device and a driver not (or
 * no longer) initialised, -EOPNOTSUPP for CUDA_ERROR_NOT_SUPPORTED, -EIO for anything else.
 * Pure: they call nothing in the runtime.
 */
int vase_cuda_errno(int cuda_error);
int vase_cu_errno(int cu_result);
/*
 * 1 if cuda_error (a cudaError_t) is of the sticky class: the context of the process is lost and
 * every later CUDA call fails the same way until the process restarts (an illegal address, a
 * failed launch, a device assert, an uncorrectable ECC error...); 0 otherwise. Pure.
 */
int vase_cuda_sticky(int cuda_error);

/* 1 if a CUDA device is usable, 0 if there is none (or no driver), -errno on another error. */
int vase_cuda_available(void);
/* The CUDA runtime's message for the last CUDA failure a vase_*_cuda() call of this thread
 * mapped to -errno, or NULL. A static string. */
const char *vase_cuda_last_error(void);

/* Device scratch memory for plans, bound to the device current at creation; one per thread.
 * Grows as needed; freed (with its buffers) by vase_cuda_workspace_free(), which accepts NULL. */
struct vase_cuda_workspace;
int vase_cuda_workspace_new(struct vase_cuda_workspace **ret);
struct vase_cuda_workspace *vase_cuda_workspace_free(struct vase_cuda_workspace *ws);

/*
 * vase_plan() on the GPU: the plan of every KV head of the layer into keep, DEVICE [Hkv][K], the
 * same plan as the CPU's for the same inputs and seed (the Philox draws of the CPU, the same
 * selection order; scores that cannot be summed in the CPU's order, the attention's, agree to
 * float rounding). ws may be NULL (scratch is then allocated for the call) and must belong to
 * the current device.
 *
 * Ordering: the plan reads the views on stream, so the engine's writes to the slots it reads
 * must be complete before the call (the engine synchronises its stream before it sends the
 * request). The call synchronises stream before it returns: on success the plan is complete in
 * device memory, and any process or stream may read it once told so. On failure nothing has
 * been written to keep: -EINVAL for invalid parameters or views, or NaN/Inf in what the policy
 * reads (detected on the device); -ENOMEM; the CUDA errors above.
 */
int vase_plan_cuda(const struct vase_plan_input *in, struct vase_cuda_workspace *ws, void *stream,
                   uint32_t *keep);

/*
 * The CPU's test exports on the GPU, for every head of the view at once: out DEVICE [heads][n].
 * They run the kernels the plans run, so that tests can compare scores and draws, not only
 * plans. Each synchronises stream; ws may be NULL. 0, -EINVAL (bad arguments, or NaN/Inf where
 * the CPU function rejects it: out is then undefined), -ENOMEM, CUDA errors.
 *
 * vase_score_attention_cuda(): vase_score_attention() of every KV head (in->scores, when set,
 * checked and copied). vase_value_metric_cuda(): vase_value_metric(). vase_score_leverage_cuda():
 * vase_score_leverage() with gm DEVICE [D][r] as vase_sketch() makes it.
 * vase_score_redundancy_cuda(): vase_score_redundancy(). vase_rng_exp_cuda(),
 * vase_rng_normal_cuda(): vase_rng_exp() and vase_rng_normal() into out DEVICE [n].
 */
int vase_score_attention_cuda(const struct vase_plan_input *in, struct vase_cuda_workspace *ws,
                              void *stream, float *out);
int vase_value_metric_cuda(const struct vase_view *v, uint32_t n, enum vase_metric m,
                           struct vase_cuda_workspace *ws, void *stream, float *out);
int vase_score_leverage_cuda(const struct vase_view *k, const struct vase_view *v, uint32_t n,
                             const float *gm, uint32_t r, struct vase_cuda_workspace *ws,
                             void *stream, float *out);
int vase_score_redundancy_cuda(const struct vase_view *k, uint32_t n,
                               struct vase_cuda_workspace *ws, void *stream, float *out);
int vase_rng_exp_cuda(const struct vase_rng *rng, uint32_t kv_head, float *out, size_t n,
                      void *stream);
int vase_rng_normal_cuda(const struct vase_rng *rng, uint32_t kv_head, float *out, size_t n,
                         void *stream);

/*
 * The device scratch vase_compact_cuda() needs for a view of heads heads and rows of row_bytes
 * bytes (dim * the dtype's size), n candidates and a new length of rows (K + len - n): a
 * validation flag, a [heads][ceil(n / 32)] bitmap and the moved rows [heads][rows][row_bytes],
 * each 256-byte aligned. Increasing in n and rows: the size for the largest n and rows a caller
 * will ever pass covers every call. Pure, inline so that every build (and the fake runtime of
 * the tests) computes the same size.
 */
static inline size_t vase_compact_cuda_scratch_bytes(uint32_t heads, size_t row_bytes, uint32_t n,
                                                     uint32_t rows) {
    size_t words = ((size_t)n + 31) / 32;
    size_t data_off = (256 + heads * words * 4 + 255) & ~(size_t)255;
    return data_off + (size_t)heads * rows * row_bytes;
}

/*
 * vase_compact() on the GPU, enqueued on stream (the engine's) without waiting for it: view's
 * base and block table and keep [heads][K] are device pointers. Ordered after the work already
 * on stream and before the work queued after it; keep, and every slot up to len - 1 (the tail
 * may sit in pages that the new length no longer needs), must stay untouched until the
 * compaction has run: wait for it (an event, or a stream sync) before reporting a commit that
 * lets those pages be handed to someone else. The plan is validated on the device: an invalid one
 * (an entry >= n, or repeated within a head) moves nothing, which the call cannot report since
 * it does not wait; plans of vase_plan() and vase_plan_cuda() are always valid.
 *
 * scratch: DEVICE memory of scratch_bytes bytes, 256-byte aligned, at least
 * vase_compact_cuda_scratch_bytes(view->heads, row bytes, n, K + len - n), owned by the caller
 * and not used by anything else until the compaction has run (stream order: anything queued
 * on stream later may reuse it). With it the call allocates nothing and never synchronises, so
 * it may run on an engine's hot path and inside CUDA graph capture. scratch NULL: the call
 * allocates the scratch itself (stream-ordered where the device has memory pools, else
 * cudaMalloc and a stream synchronisation before cudaFree), for tools and tests.
 *
 * Errors: a CUDA error pending before the call (the engine's own launch failure, say) is left
 * pending for its owner, never returned and never cleared. A failure of the call's own runtime
 * calls and launches is returned, and cleared (unless sticky) only when nothing was pending
 * before: otherwise it has replaced the engine's error, and stays, so that the engine still
 * sees a failure. A launch failure with the very code already pending cannot be told from it
 * and is not reported.
 *
 * Returns the new length K + len - n once the work is queued, -EINVAL for invalid arguments or
 * a scratch too small or misaligned (nothing queued), -ENOMEM or a CUDA error.
 */
int vase_compact_cuda(struct vase_view *view, const uint32_t *keep, uint32_t K, uint32_t n,
                      uint32_t len, void *scratch, size_t scratch_bytes, void *stream);

/* ---- end CUDA ---- */

#ifdef __cplusplus
}
#endif
