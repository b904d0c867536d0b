/* SPDX-License-Identifier: MIT */

/*
 * run_vectors: replays the eviction test vectors (tests/vectors/FORMAT.md) through the CPU
 * kernels and compares the plans exactly.
 *
 * A single_* case is one call of vase_plan() on the arrays of the directory. A trace_* case is a
 * whole simulated generation: the runner keeps a per-KV-head cache of K rows, V rows and the
 * token index in each slot, appends one token at a time, evicts by the trigger rule of
 * ALGORITHM.md with the round's injected draws, and compacts the K and V rows with
 * vase_compact(). The token indices are compacted here, by hand, following the compaction rule
 * of ALGORITHM.md, and after every eviction each live slot's K and V rows are compared with the
 * stream rows of the token it claims to hold: so vase_compact() is checked independently of the
 * plans, and a plan bug cannot hide behind a compaction bug.
 *
 * Nothing about the shipped cases is built in: every size comes from params.txt and the array
 * shapes, each shape is checked against the others before use (tests/vcase.c reads the cases),
 * and every allocation is bounded by the size of an array already loaded (and by
 * VASE_NPY_MAX_BYTES through the loader), the paged buffers of --block also by STORE_MAX_BYTES.
 *
 * By default K and V are kept as the vectors hold them and the kernels read them through
 * contiguous views. With --block=N[,N...] each case runs once per block size N, named CASE@N,
 * with K and V (and a trace's cache) in shuffled pages of N tokens laid out as in an arena (see
 * struct kv_store); the plans and compactions must be the same exactly. The query window stays
 * a contiguous [Hq][W][D] array either way.
 *
 * With --cuda the plans and compactions go through the CUDA kernels instead (vase_plan_cuda(),
 * vase_compact_cuda()), in a binary that links the CUDA backend (run_vectors.h); everything
 * else, the checks included, is the same.
 *
 * Output: one line per case (and block size), "PASS <case>" or "FAIL <case>: <first
 * difference>", then "N passed, N failed". The exit status is 0 only if at least one case ran
 * and all passed.
 */

#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "argnum.h"
#include "npy.h"
#include "run_vectors.h"
#include "vase_kernels.h"
#include "vase_layout.h"
#include "vcase.h"

#define DEFAULT_ROOT "tests/vectors/reference"

static int cpu_plan(const struct vase_plan_input *in, struct vase_workspace **ws, uint32_t *keep) {
    return vase_plan(in, 1, ws, keep);
}

static const struct vectors_backend cpu_backend = {
    .plan_name = "vase_plan()",
    .compact_name = "vase_compact()",
    .plan = cpu_plan,
    .compact = vase_compact,
};

/* The kernels under test: cpu_backend, or the CUDA one with --cuda. */
static const struct vectors_backend *backend = &cpu_backend;

/* Block sizes each case is run with (--block); none: once, contiguous. */
#define MAX_BLOCKS 8
static uint32_t arg_blocks[MAX_BLOCKS];
static size_t arg_n_blocks;

/* ---- checks -------------------------------------------------------------------------- */

/* calloc of a * b * c elements of size, refusing overflow; never returns a zero-size block. */
static void *alloc_array(size_t a, size_t b, size_t c, size_t size) {
    size_t n;

    if (__builtin_mul_overflow(a, b, &n) || __builtin_mul_overflow(n, c, &n))
        return NULL;
    return calloc(n ? n : 1, size);
}

/*
 * Compares a plan or slot table, [heads][per_head] with got_stride entries between heads, with
 * the expected [heads][per_head] int32 array. The message names the first difference and how
 * many entries differ in all.
 */
static int compare(const char *what, const char *unit, const uint32_t *got, size_t got_stride,
                   const int32_t *want, size_t heads, size_t per_head, struct vcase_result *res) {
    size_t first_h = 0, first_i = 0, ndiff = 0;

    for (size_t h = 0; h < heads; h++)
        for (size_t i = 0; i < per_head; i++) {
            uint32_t g = got[h * got_stride + i];
            int32_t w = want[h * per_head + i];

            if (w >= 0 && g == (uint32_t)w)
                continue;
            if (ndiff++ == 0) {
                first_h = h;
                first_i = i;
            }
        }
    if (ndiff == 0)
        return 0;
    return vcase_failf(res, "%s head %zu %s %zu: got %u, want %d (%zu of %zu differ)", what,
                       first_h, unit, first_i, got[first_h * got_stride + first_i],
                       want[first_h * per_head + first_i], ndiff, heads * per_head);
}

/* A plan must be K distinct candidates per head before the runner indexes with it. */
static int check_plan(const uint32_t *keep, uint32_t heads, uint32_t K, uint32_t n, uint8_t *seen,
                      struct vcase_result *res) {
    for (uint32_t h = 0; h < heads; h++) {
        memset(seen, 0, n);
        for (uint32_t i = 0; i < K; i++) {
            uint32_t j = keep[(size_t)h * K + i];

            if (j >= n)
                return vcase_failf(
                    res, "plan head %u entry %u: slot %u is not a candidate (N = %u)", h, i, j, n);
            if (seen[j])
                return vcase_failf(res, "plan head %u entry %u: slot %u kept twice", h, i, j);
            seen[j] = 1;
        }
    }
    return 0;
}

/* ---- where the runner keeps K and V -------------------------------------------------- */

/*
 * Without --block, a case's K and V rows are kept as the vectors hold them: [Hkv][rows][D] for K,
 * then the same for V, and the kernels read them through vase_view_contiguous() views.
 *
 * With --block=B they are kept as an engine keeps them, in the arena layout of a one-layer f32
 * model (kernels/vase_layout.h), computed here and not by kernels/layout.c so that the layout is
 * checked against an independent statement of it: a page holds B tokens, K of all of them and
 * then V, each token [kv_head][dim]; page p starts at p * page_bytes. The pages in use are the
 * odd physical pages 1, 3, ..., 2 * npages - 1, in an order shuffled by a fixed seed and listed
 * by the block table; the even ones, between and around them, are never used. The whole buffer
 * starts out as NaN, so a kernel that reads a wrong page or slot fails on the NaN (the kernels
 * refuse NaN and Inf), and store_check_guards() catches one that writes outside the pages in use.
 */
struct kv_store {
    uint32_t block; /* tokens per page; 0: contiguous */
    uint32_t heads, rows, dim;
    uint32_t npages; /* pages in use, ceil(rows / block) */
    uint32_t *table; /* [npages]: the physical page holding rows [i * block, (i + 1) * block) */
    size_t page_bytes, kv_stride, token_stride, head_stride;
    size_t bytes;
    unsigned char *mem;
};

/* The largest paged buffer a case may make the runner allocate: K and V as large as the largest
 * array the loader accepts, twice over for the unused pages. A block much larger than the case
 * (B > T) costs up to 6 * B * Hkv * D floats, hence a bound of its own. */
#define STORE_MAX_BYTES (4 * (uint64_t)VASE_NPY_MAX_BYTES)
#define STORE_POISON 0xff               /* every byte: the float NaN 0xffffffff */
#define STORE_SEED UINT64_C(0x76617365) /* "vase" */

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

static void store_done(struct kv_store *s) {
    free(s->table);
    free(s->mem);
    *s = (struct kv_store){.block = 0};
}

/* A store for rows rows of heads heads of dim floats, K and V, in pages of block tokens (0:
 * contiguous). 0, or -EINVAL with the reason in res. */
static int store_init(struct kv_store *s, uint32_t block, uint32_t heads, uint32_t rows,
                      uint32_t dim, struct vcase_result *res) {
    size_t row_bytes, nphys;
    uint64_t state;

    *s = (struct kv_store){.block = block, .heads = heads, .rows = rows, .dim = dim};
    if (__builtin_mul_overflow((size_t)heads, (size_t)dim * sizeof(float), &row_bytes))
        return vcase_failf(res, "%u heads of dim %u overflow", heads, dim);
    if (block == 0) {
        s->mem = alloc_array(2 * (size_t)heads, rows, dim, sizeof(float));
        if (!s->mem)
            return vcase_failf(res, "out of memory");
        s->token_stride = (size_t)dim * sizeof(float);
        s->head_stride = (size_t)rows * s->token_stride;
        s->kv_stride = (size_t)heads * s->head_stride;
        return 0;
    }

    s->npages = rows / block + (rows % block != 0);
    s->token_stride = row_bytes;
    s->head_stride = (size_t)dim * sizeof(float);
    nphys = 2 * (size_t)s->npages + 1;
    if (__builtin_mul_overflow((size_t)block, row_bytes, &s->kv_stride) ||
        __builtin_mul_overflow(s->kv_stride, (size_t)2, &s->page_bytes) ||
        __builtin_mul_overflow(s->page_bytes, nphys, &s->bytes) || s->bytes > STORE_MAX_BYTES)
        return vcase_failf(res,
                           "pages of %u tokens: %zu pages of %u heads of dim %u exceed %llu "
                           "bytes",
                           block, nphys, heads, dim, (unsigned long long)STORE_MAX_BYTES);
    s->mem = malloc(s->bytes);
    s->table = alloc_array(s->npages, 1, 1, sizeof *s->table);
    if (!s->mem || !s->table)
        return vcase_failf(res, "out of memory");
    memset(s->mem, STORE_POISON, s->bytes);

    /* Fisher-Yates over the odd physical pages, seeded by the geometry: deterministic. */
    state = STORE_SEED ^ ((uint64_t)block << 32) ^ rows;
    for (uint32_t i = 0; i < s->npages; i++)
        s->table[i] = 2 * i + 1;
    for (uint32_t i = s->npages; i > 1; i--) {
        uint32_t j = (uint32_t)(splitmix64(&state) % i), t = s->table[i - 1];

        s->table[i - 1] = s->table[j];
        s->table[j] = t;
    }
    return 0;
}

/* Row (slot, head) of K or V: where the layout puts it, by the runner's own arithmetic. */
static float *store_row(const struct kv_store *s, enum vase_kv kv, uint32_t head, uint32_t slot) {
    size_t off;

    if (s->block == 0)
        off = kv * s->kv_stride + head * s->head_stride + slot * s->token_stride;
    else
        off = s->table[slot / s->block] * s->page_bytes + kv * s->kv_stride +
              (slot % s->block) * s->token_stride + head * s->head_stride;
    return (float *)(s->mem + off);
}

/* The view through which the kernels read (and compact) K or V. */
static struct vase_view store_view(const struct kv_store *s, enum vase_kv kv) {
    if (s->block == 0)
        return vase_view_contiguous(s->mem + kv * s->kv_stride, VASE_DTYPE_F32, s->heads, s->rows,
                                    s->dim);
    return (struct vase_view){
        .base = s->mem + kv * s->kv_stride,
        .pages = s->table,
        .tokens_per_page = s->block,
        .heads = s->heads,
        .dim = s->dim,
        .dtype = VASE_DTYPE_F32,
        .page_stride = (int64_t)s->page_bytes,
        .token_stride = (int64_t)s->token_stride,
        .head_stride = (int64_t)s->head_stride,
    };
}

/* The unused pages must still hold nothing but the poison. */
static int store_check_guards(const struct kv_store *s, const char *when,
                              struct vcase_result *res) {
    for (size_t p = 0; s->block && p <= 2 * (size_t)s->npages; p += 2) {
        const unsigned char *b = s->mem + p * s->page_bytes;
        size_t i = 0;

        /* Every byte is the first one: one memcmp() instead of a loop, the loop on failure. */
        if (b[0] == STORE_POISON && memcmp(b, b + 1, s->page_bytes - 1) == 0)
            continue;
        while (b[i] == STORE_POISON)
            i++;
        return vcase_failf(res, "%s: unused page %zu written at byte %zu", when, p, i);
    }
    return 0;
}

/* ---- single_*: one eviction ---------------------------------------------------------- */

static int run_single(const char *dir, uint32_t block, struct vcase_result *res) {
    struct vcase_single c = {.k = NULL};
    struct kv_store store = {.block = 0};
    struct vase_plan_input in;
    struct vcase_params p;
    struct vase_params params;
    enum vase_policy policy = VASE_POLICY_VASE_ATTNV;
    uint32_t *keep = NULL;
    uint8_t *seen = NULL;
    int r;

    r = vcase_read_params(dir, false, &p, &policy, &params, res);
    if (r < 0)
        return r;
    r = vcase_single_load(&c, dir, &p, policy, res);
    if (r < 0)
        goto out;

    in = (struct vase_plan_input){
        .policy = policy,
        .params = params,
        .n = c.n,
        .hq = c.hq,
        .k = vase_view_contiguous(c.k->data, VASE_DTYPE_F32, c.hkv, c.n, c.d),
        .v = vase_view_contiguous(c.v->data, VASE_DTYPE_F32, c.hkv, c.n, c.d),
        .q = vase_view_contiguous(c.q->data, VASE_DTYPE_F32, c.hq, p.window, c.d),
        .exp_draws = c.exp ? c.exp->data : NULL,
        .gauss = c.gauss ? c.gauss->data : NULL,
        .prompt_len = p.prompt,
    };
    if (block) {
        /* The vectors' [Hkv][N][D] rows, copied into pages. */
        r = store_init(&store, block, c.hkv, c.n, c.d, res);
        if (r < 0)
            goto out;
        for (uint32_t h = 0; h < c.hkv; h++)
            for (uint32_t j = 0; j < c.n; j++) {
                size_t at = ((size_t)h * c.n + j) * c.d;

                memcpy(store_row(&store, VASE_K, h, j), (const float *)c.k->data + at,
                       (size_t)c.d * sizeof(float));
                memcpy(store_row(&store, VASE_V, h, j), (const float *)c.v->data + at,
                       (size_t)c.d * sizeof(float));
            }
        in.k = store_view(&store, VASE_K);
        in.v = store_view(&store, VASE_V);
    }
    r = vase_params_check(&in.params, policy);
    if (r < 0) {
        r = vcase_failf(res, "vase_params_check() refuses the parameters: %s", strerror(-r));
        goto out;
    }
    if (vase_plan_keep_count(&in.params) != c.K) {
        r = vcase_failf(res, "vase_plan_keep_count() = %u, want budget - window = %u",
                        vase_plan_keep_count(&in.params), c.K);
        goto out;
    }

    keep = alloc_array(c.hkv, c.K, 1, sizeof *keep);
    seen = alloc_array(c.n, 1, 1, 1);
    if (!keep || !seen) {
        r = vcase_failf(res, "out of memory");
        goto out;
    }
    r = backend->plan(&in, NULL, keep);
    if (r < 0) {
        r = vcase_failf(res, "%s failed: %s", backend->plan_name, strerror(-r));
        goto out;
    }
    r = check_plan(keep, c.hkv, c.K, c.n, seen, res);
    if (r < 0)
        goto out;
    r = compare("keep", "entry", keep, c.K, c.keep->data, c.hkv, c.K, res);

out:
    store_done(&store);
    free(seen);
    free(keep);
    vcase_single_done(&c);
    return r;
}

/* ---- trace_*: a whole generation ----------------------------------------------------- */

struct trace {
    struct vcase_replay c; /* the case */
    uint32_t K;
    uint32_t cap; /* slots per head: never more than T tokens are cached */

    struct kv_store kv;        /* K and V of [Hkv][cap] slots */
    uint32_t *pos;             /* [Hkv][cap]: the token in each slot */
    uint32_t *pos_tmp;         /* [cap] */
    float *q_win;              /* [Hq][W][D] */
    uint32_t *keep;            /* [Hkv][K] */
    uint8_t *seen;             /* [cap] */
    struct vase_workspace *ws; /* reused by every round, as an engine would */
    uint32_t len;
    uint32_t rounds;
};

static void trace_done(struct trace *tr) {
    vase_workspace_free(tr->ws);
    free(tr->seen);
    free(tr->keep);
    free(tr->q_win);
    free(tr->pos_tmp);
    free(tr->pos);
    store_done(&tr->kv);
    vcase_trace_done(&tr->c.vc);
}

static void append(struct trace *tr, uint32_t t) {
    for (uint32_t h = 0; h < tr->c.vc.hkv; h++) {
        memcpy(store_row(&tr->kv, VASE_K, h, tr->len),
               vcase_stream_row(tr->c.vc.ks, tr->c.vc.hkv, tr->c.vc.d, t, h),
               (size_t)tr->c.vc.d * sizeof(float));
        memcpy(store_row(&tr->kv, VASE_V, h, tr->len),
               vcase_stream_row(tr->c.vc.vs, tr->c.vc.hkv, tr->c.vc.d, t, h),
               (size_t)tr->c.vc.d * sizeof(float));
        tr->pos[(size_t)h * tr->cap + tr->len] = t;
    }
    tr->len++;
}

/* After a compaction, every live slot must hold the K and V rows of the token it claims, read
 * where the runner's own arithmetic puts them (store_row()), and no unused page was written. */
static int verify_cache(const struct trace *tr, uint32_t round, struct vcase_result *res) {
    size_t row = (size_t)tr->c.vc.d * sizeof(float);
    char when[64];
    int r;

    /* A write to a wrong page shows here first, under its own name. */
    snprintf(when, sizeof when, "round %u: after vase_compact()", round);
    r = store_check_guards(&tr->kv, when, res);
    if (r < 0)
        return r;
    for (uint32_t h = 0; h < tr->c.vc.hkv; h++)
        for (uint32_t s = 0; s < tr->len; s++) {
            uint32_t t = tr->pos[(size_t)h * tr->cap + s];

            if (memcmp(store_row(&tr->kv, VASE_K, h, s),
                       vcase_stream_row(tr->c.vc.ks, tr->c.vc.hkv, tr->c.vc.d, t, h), row) != 0 ||
                memcmp(store_row(&tr->kv, VASE_V, h, s),
                       vcase_stream_row(tr->c.vc.vs, tr->c.vc.hkv, tr->c.vc.d, t, h), row) != 0)
                return vcase_failf(
                    res,
                    "round %u: after vase_compact() head %u slot %u does not hold the "
                    "K/V rows of token %u",
                    round, h, s, t);
        }
    return 0;
}

/* One eviction, triggered by the append of token t. */
static int evict(struct trace *tr, uint32_t t, struct vcase_result *res) {
    uint32_t round = tr->rounds, n = tr->len - tr->c.window, K = tr->K;
    struct vase_npy *exp = NULL;
    struct vase_view kview, vview;
    struct vase_plan_input in;
    int r, r2;

    r = vcase_trace_check_round(&tr->c.vc, round, t, res);
    if (r < 0)
        return r;
    r = vcase_trace_round_draws(&tr->c.vc, tr->c.needs, tr->c.params.rank, round, n, &exp, res);
    if (r < 0)
        return r;

    /* The window's queries: those of tokens t - W + 1 .. t, prefill ones included. */
    for (uint32_t h = 0; h < tr->c.vc.hq; h++)
        for (uint32_t i = 0; i < tr->c.window; i++)
            memcpy(
                tr->q_win + ((size_t)h * tr->c.window + i) * tr->c.vc.d,
                vcase_stream_row(tr->c.vc.qs, tr->c.vc.hq, tr->c.vc.d, t - tr->c.window + 1 + i, h),
                (size_t)tr->c.vc.d * sizeof(float));

    kview = store_view(&tr->kv, VASE_K);
    vview = store_view(&tr->kv, VASE_V);
    in = (struct vase_plan_input){
        .policy = tr->c.policy,
        .params = tr->c.params,
        .n = n,
        .hq = tr->c.vc.hq,
        .k = kview,
        .v = vview,
        .q = vase_view_contiguous(tr->q_win, VASE_DTYPE_F32, tr->c.vc.hq, tr->c.window, tr->c.vc.d),
        .exp_draws = exp ? exp->data : NULL,
        .gauss = (tr->c.needs & VASE_NEEDS_GAUSS) ? tr->c.vc.gauss->data : NULL,
        .prompt_len = tr->c.vc.prompt,
    };
    r = backend->plan(&in, &tr->ws, tr->keep);
    vase_npy_free(exp);
    if (r < 0)
        return vcase_failf(res, "round %u (t=%u): %s failed: %s", round, t, backend->plan_name,
                           strerror(-r));
    r = check_plan(tr->keep, tr->c.vc.hkv, K, n, tr->seen, res);
    if (r < 0)
        return r;

    r = backend->compact(&kview, tr->keep, K, n, tr->len);
    r2 = backend->compact(&vview, tr->keep, K, n, tr->len);
    if (r < 0 || r2 < 0)
        return vcase_failf(res, "round %u: %s failed: %s", round, backend->compact_name,
                           strerror(-(r < 0 ? r : r2)));
    if ((uint32_t)r != K + tr->len - n || (uint32_t)r2 != K + tr->len - n)
        return vcase_failf(res, "round %u: %s returned %d/%d, want %u", round,
                           backend->compact_name, r, r2, K + tr->len - n);

    /* The compaction rule, applied to the token indices by hand. */
    for (uint32_t h = 0; h < tr->c.vc.hkv; h++) {
        uint32_t *pos = tr->pos + (size_t)h * tr->cap;

        for (uint32_t i = 0; i < K; i++)
            tr->pos_tmp[i] = pos[tr->keep[(size_t)h * K + i]];
        for (uint32_t j = n; j < tr->len; j++)
            tr->pos_tmp[K + j - n] = pos[j];
        memcpy(pos, tr->pos_tmp, (size_t)(K + tr->len - n) * sizeof *pos);
    }
    tr->len = K + tr->len - n;
    tr->rounds++;
    return verify_cache(tr, round, res);
}

static int trace_setup(struct trace *tr, const char *dir, uint32_t block,
                       struct vcase_result *res) {
    int r;

    r = vcase_replay_load(&tr->c, dir, res);
    if (r < 0)
        return r;
    tr->K = tr->c.budget - tr->c.window;
    if (vase_plan_keep_count(&tr->c.params) != tr->K)
        return vcase_failf(res, "vase_plan_keep_count() = %u, want budget - window = %u",
                           vase_plan_keep_count(&tr->c.params), tr->K);

    /* The cache never holds more than the T tokens of the stream, so every allocation is
     * bounded by the size of k_stream.npy (the paged K and V of --block by STORE_MAX_BYTES
     * too). The eviction buffers are needed only if the sequence outgrows the budget, and then
     * W < budget < T bounds them too. */
    tr->cap = tr->c.vc.T;
    r = store_init(&tr->kv, block, tr->c.vc.hkv, tr->cap, tr->c.vc.d, res);
    if (r < 0)
        return r;
    tr->pos = alloc_array(tr->c.vc.hkv, tr->cap, 1, sizeof(uint32_t));
    if (!tr->pos)
        return vcase_failf(res, "out of memory");
    if (tr->c.vc.T > tr->c.budget) {
        tr->pos_tmp = alloc_array(tr->cap, 1, 1, sizeof(uint32_t));
        tr->q_win = alloc_array(tr->c.vc.hq, tr->c.window, tr->c.vc.d, sizeof(float));
        tr->keep = alloc_array(tr->c.vc.hkv, tr->K, 1, sizeof(uint32_t));
        tr->seen = alloc_array(tr->cap, 1, 1, 1);
        if (!tr->pos_tmp || !tr->q_win || !tr->keep || !tr->seen)
            return vcase_failf(res, "out of memory");
        r = vase_workspace_new(&tr->ws);
        if (r < 0)
            return vcase_failf(res, "vase_workspace_new() failed: %s", strerror(-r));
    }
    return 0;
}

static int run_trace(const char *dir, uint32_t block, struct vcase_result *res) {
    struct trace tr = {.len = 0};
    int r;

    r = trace_setup(&tr, dir, block, res);
    if (r < 0)
        goto out;

    /* Prefill never evicts; each decode step may. */
    for (uint32_t t = 0; t < tr.c.vc.T; t++) {
        append(&tr, t);
        if (t < tr.c.vc.prompt || tr.len <= tr.c.budget || tr.len % tr.c.window != 0)
            continue;
        r = evict(&tr, t, res);
        if (r < 0)
            goto out;
    }

    r = vcase_trace_check_end(&tr.c.vc, tr.rounds, tr.len, res);
    if (r < 0)
        goto out;
    /* pos is [Hkv][cap]; only the first len slots of each head are live. */
    r = compare("final_pos", "slot", tr.pos, tr.cap, tr.c.vc.final->data, tr.c.vc.hkv, tr.len, res);

out:
    trace_done(&tr);
    return r;
}

/* ---- driver -------------------------------------------------------------------------- */

/* Picks the kind of the case by its name, else by the files it holds. */
static int run_case(const char *path, const char *name, uint32_t block, struct vcase_result *res) {
    struct stat st;

    if (stat(path, &st) < 0)
        return vcase_failf(res, "%s", strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return vcase_failf(res, "not a directory");
    if (strncmp(name, "single_", 7) == 0)
        return run_single(path, block, res);
    if (strncmp(name, "trace_", 6) == 0)
        return run_trace(path, block, res);
    if (vcase_file_exists(path, "keep.npy"))
        return run_single(path, block, res);
    if (vcase_file_exists(path, "final_pos.npy"))
        return run_trace(path, block, res);
    return vcase_failf(res, "neither a single_ nor a trace_ case (no keep.npy or final_pos.npy)");
}

static int is_case_dir(const char *root, const char *name) {
    char path[PATH_MAX];
    struct stat st;

    if (name[0] == '.')
        return 0;
    return vcase_join_path(path, sizeof path, root, name) == 0 && stat(path, &st) == 0 &&
           S_ISDIR(st.st_mode);
}

/* Every subdirectory of root, sorted by name, as newly allocated paths. */
static int list_cases(const char *root, char ***ret, size_t *ret_n) {
    struct dirent **ents = NULL;
    char **paths = NULL;
    size_t n = 0;
    int count, r = 0;

    count = scandir(root, &ents, NULL, alphasort);
    if (count < 0)
        return -errno;
    paths = calloc((size_t)count + 1, sizeof *paths);
    if (!paths) {
        r = -ENOMEM;
        goto free_ents;
    }
    for (int i = 0; i < count; i++) {
        char buf[PATH_MAX];

        if (!is_case_dir(root, ents[i]->d_name))
            continue;
        if (vcase_join_path(buf, sizeof buf, root, ents[i]->d_name) < 0) {
            r = -ENAMETOOLONG;
            goto free_paths;
        }
        paths[n] = strdup(buf);
        if (!paths[n]) {
            r = -ENOMEM;
            goto free_paths;
        }
        n++;
    }
    *ret = paths;
    *ret_n = n;
    paths = NULL;

free_paths:
    if (paths)
        for (size_t i = 0; i < n; i++)
            free(paths[i]);
    free(paths);
free_ents:
    for (int i = 0; i < count; i++)
        free(ents[i]);
    free(ents);
    return r;
}

/* The reason of a case that failed with r and recorded none. */
static const char *errno_text(int r) {
    return strerror(-r);
}

static void help(void) {
    printf("Usage: run_vectors [--cuda] [--block=N[,N...]] [CASE_DIR...]\n"
           "Replays eviction test vectors through the CPU kernels. Without arguments, runs every\n"
           "case directory under $VASE_VECTORS, or %s.\n"
           "\n"
           "  --cuda          use the CUDA kernels (a binary built with them: run_vectors_cuda)\n"
           "  --block=N,...   run each case once per block size, its K and V in shuffled pages\n"
           "                  of N tokens (the arena layout), named CASE@N (default: once, K and\n"
           "                  V contiguous, named CASE)\n"
           "  -h --help       show this help\n",
           DEFAULT_ROOT);
}

/* Returns < 0 on a usage error, 0 to exit successfully (help), > 0 to go on. */
static int parse_argv(int argc, char **argv) {
    enum { ARG_CUDA = 0x100, ARG_BLOCK };
    static const struct option options[] = {
        {"help", no_argument, NULL, 'h'},
        {"cuda", no_argument, NULL, ARG_CUDA},
        {"block", required_argument, NULL, ARG_BLOCK},
        {NULL, 0, NULL, 0},
    };
    int c;

    while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0)
        switch (c) {
        case 'h':
            help();
            return 0;
        case ARG_CUDA:
            if (!vectors_backend_cuda) {
                fprintf(stderr, "run_vectors: --cuda: this binary was built without the CUDA "
                                "kernels (use run_vectors_cuda)\n");
                return -EINVAL;
            }
            backend = vectors_backend_cuda();
            if (!backend) {
                fprintf(stderr, "run_vectors: --cuda: no usable CUDA device\n");
                return -ENODEV;
            }
            break;
        case ARG_BLOCK:
            if (argnum_u32_list(optarg, 1, VASE_LAYOUT_MAX_BLOCK_TOKENS, arg_blocks, MAX_BLOCKS,
                                &arg_n_blocks) < 0) {
                fprintf(stderr,
                        "run_vectors: --block=%s: expected up to %d block sizes 1..%u, "
                        "separated by commas\n",
                        optarg, MAX_BLOCKS, VASE_LAYOUT_MAX_BLOCK_TOKENS);
                return -EINVAL;
            }
            break;
        case '?':
            return -EINVAL;
        default:
            return -EINVAL;
        }
    return 1;
}

int main(int argc, char **argv) {
    char **listed = NULL;
    size_t ncases = 0, passed = 0, failed = 0;
    const char *root;
    int r;

    r = parse_argv(argc, argv);
    if (r <= 0)
        return r < 0 ? 2 : 0;

    if (optind == argc) {
        root = getenv("VASE_VECTORS");
        if (!root || !root[0])
            root = DEFAULT_ROOT;
        r = list_cases(root, &listed, &ncases);
        if (r < 0) {
            fprintf(stderr, "run_vectors: cannot list %s: %s\n", root, strerror(-r));
            return 1;
        }
    } else
        ncases = (size_t)(argc - optind);

    /* Without --block, one contiguous run (block 0) under the plain name. */
    vcase_run_all(listed ? listed : argv + optind, ncases, arg_blocks, arg_n_blocks, run_case,
                  errno_text, &passed, &failed);
    if (backend->done)
        backend->done();

    if (listed)
        for (size_t i = 0; i < ncases; i++)
            free(listed[i]);
    free(listed);

    if (ncases == 0) {
        fprintf(stderr, "run_vectors: no cases to run\n");
        return 1;
    }
    return failed ? 1 : 0;
}
