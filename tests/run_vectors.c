/* SPDX-License-Identifier: MIT */

/*
 * run_vectors: replays the eviction test vectors (shared/vectors/FORMAT.md) through the CPU
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
 * shapes, each shape is checked against the others before use, and every allocation is bounded
 * by the size of an array already loaded (and by VASE_NPY_MAX_BYTES through the loader).
 *
 * Output: one line per case, "PASS <case>" or "FAIL <case>: <first difference>", then
 * "N passed, N failed". The exit status is 0 only if at least one case ran and all passed.
 */

#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "npy.h"
#include "vase_kernels.h"

#define DEFAULT_ROOT "../shared/vectors"

/* params.txt is a dozen short lines; anything much larger is not a params file. */
#define MAX_PARAMS_BYTES 65536
#define MAX_LINE 1024

struct result {
    char msg[768];
};

static int failf(struct result *res, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Records why a case failed (the first reason only: later ones are consequences) and returns
 * -EINVAL so that callers can write "return failf(...)". */
static int failf(struct result *res, const char *fmt, ...) {
    va_list ap;

    if (res->msg[0] == '\0') {
        va_start(ap, fmt);
        vsnprintf(res->msg, sizeof res->msg, fmt, ap);
        va_end(ap);
    }
    return -EINVAL;
}

/* ---- params.txt ---------------------------------------------------------------------- */

struct case_params {
    char mode[64];
    uint32_t hq, hkv, d;
    uint32_t budget, window, cur_len, prompt, steps;
    uint32_t n_large, n_sink, rank, smooth;
    float temperature, lambda;
    uint32_t seen; /* bit k: param_table[k] was given */
};

enum param_key {
    P_MODE,
    P_HQ,
    P_HKV,
    P_D,
    P_BUDGET,
    P_WINDOW,
    P_CUR_LEN,
    P_PROMPT,
    P_STEPS,
    P_N_LARGE,
    P_N_SINK,
    P_TEMPERATURE,
    P_LAMBDA,
    P_SMOOTH,
    P_RANK,
    _P_MAX,
};

enum param_type { PARAM_STR, PARAM_U32, PARAM_F32 };

/* Every key params.txt may hold. An unknown key is an error rather than ignored: it would be a
 * setting of the generator that this runner does not reproduce. */
static const struct param_def {
    const char *key;
    enum param_type type;
    size_t offset;
} param_table[_P_MAX] = {
    [P_MODE] = {"mode", PARAM_STR, offsetof(struct case_params, mode)},
    [P_HQ] = {"Hq", PARAM_U32, offsetof(struct case_params, hq)},
    [P_HKV] = {"Hkv", PARAM_U32, offsetof(struct case_params, hkv)},
    [P_D] = {"D", PARAM_U32, offsetof(struct case_params, d)},
    [P_BUDGET] = {"budget", PARAM_U32, offsetof(struct case_params, budget)},
    [P_WINDOW] = {"window", PARAM_U32, offsetof(struct case_params, window)},
    [P_CUR_LEN] = {"cur_len", PARAM_U32, offsetof(struct case_params, cur_len)},
    [P_PROMPT] = {"prompt", PARAM_U32, offsetof(struct case_params, prompt)},
    [P_STEPS] = {"steps", PARAM_U32, offsetof(struct case_params, steps)},
    [P_N_LARGE] = {"n_large", PARAM_U32, offsetof(struct case_params, n_large)},
    [P_N_SINK] = {"n_sink", PARAM_U32, offsetof(struct case_params, n_sink)},
    [P_TEMPERATURE] = {"temperature", PARAM_F32, offsetof(struct case_params, temperature)},
    [P_LAMBDA] = {"rkv_lambda", PARAM_F32, offsetof(struct case_params, lambda)},
    [P_SMOOTH] = {"smooth_kernel", PARAM_U32, offsetof(struct case_params, smooth)},
    [P_RANK] = {"sketch_rank", PARAM_U32, offsetof(struct case_params, rank)},
};

static bool has(const struct case_params *p, enum param_key k) {
    return p->seen & (1u << k);
}

static bool is_digit(char ch) {
    return ch >= '0' && ch <= '9';
}

static bool is_space(char ch) {
    return ch == ' ' || ch == '\t' || ch == '\r' || ch == '\n';
}

/* A decimal unsigned 32-bit number and nothing else: no sign, no surrounding space. */
static int parse_u32(const char *s, uint32_t *ret) {
    unsigned long long v;
    char *end;

    if (!is_digit(s[0]))
        return -EINVAL;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno == ERANGE || v > UINT32_MAX)
        return -ERANGE;
    if (errno != 0 || *end != '\0')
        return -EINVAL;
    *ret = (uint32_t)v;
    return 0;
}

/* A finite float and nothing else. */
static int parse_f32(const char *s, float *ret) {
    char *end;
    float v;

    if (s[0] == '\0' || is_space(s[0]))
        return -EINVAL;
    errno = 0;
    v = strtof(s, &end);
    if (end == s || *end != '\0')
        return -EINVAL;
    if (errno == ERANGE)
        return -ERANGE;
    if (errno != 0 || !isfinite(v))
        return -EINVAL;
    *ret = v;
    return 0;
}

static char *trim(char *s) {
    size_t n;

    while (is_space(*s))
        s++;
    n = strlen(s);
    while (n > 0 && is_space(s[n - 1]))
        s[--n] = '\0';
    return s;
}

static int join_path(char *buf, size_t size, const char *dir, const char *name) {
    size_t len = strlen(dir);
    int n = snprintf(buf, size, len > 0 && dir[len - 1] == '/' ? "%s%s" : "%s/%s", dir, name);

    return n < 0 || (size_t)n >= size ? -ENAMETOOLONG : 0;
}

static int parse_line(struct case_params *p, char *line, unsigned lineno, struct result *res) {
    const struct param_def *def = NULL;
    char *eq, *key, *value;
    enum param_key k;
    int r = 0;

    eq = strchr(line, '=');
    if (!eq)
        return failf(res, "params.txt:%u: expected key=value", lineno);
    *eq = '\0';
    key = trim(line);
    value = trim(eq + 1);

    for (k = 0; k < _P_MAX; k++)
        if (strcmp(param_table[k].key, key) == 0) {
            def = &param_table[k];
            break;
        }
    if (!def)
        return failf(res, "params.txt:%u: unknown key '%s'", lineno, key);
    if (has(p, k))
        return failf(res, "params.txt:%u: duplicate key '%s'", lineno, key);

    switch (def->type) {
    case PARAM_STR:
        if (value[0] == '\0' || strlen(value) >= sizeof p->mode)
            r = -EINVAL;
        else
            strcpy((char *)p + def->offset, value);
        break;
    case PARAM_U32:
        r = parse_u32(value, (uint32_t *)(void *)((char *)p + def->offset));
        break;
    case PARAM_F32:
        r = parse_f32(value, (float *)(void *)((char *)p + def->offset));
        break;
    }
    if (r < 0)
        return failf(res, "params.txt:%u: invalid value for %s: '%s' (%s)", lineno, key, value,
                     strerror(-r));
    p->seen |= 1u << k;
    return 0;
}

/* Reads dir/params.txt. mode, budget and window are required (and prompt for a trace); the
 * other settings default as in ALGORITHM.md. */
static int read_params(const char *dir, bool trace, struct case_params *ret, struct result *res) {
    struct case_params p = {.seen = 0};
    struct vase_params def;
    char path[PATH_MAX], *line = NULL;
    size_t cap = 0;
    unsigned lineno = 0;
    struct stat st;
    ssize_t n;
    FILE *f;
    int r = 0;

    if (join_path(path, sizeof path, dir, "params.txt") < 0)
        return failf(res, "path too long");
    f = fopen(path, "re");
    if (!f)
        return failf(res, "cannot open params.txt: %s", strerror(errno));
    if (fstat(fileno(f), &st) < 0 || !S_ISREG(st.st_mode) || st.st_size > MAX_PARAMS_BYTES) {
        r = failf(res, "params.txt is not a regular file of at most %d bytes", MAX_PARAMS_BYTES);
        goto close_file;
    }

    while ((n = getline(&line, &cap, f)) >= 0) {
        char *s;

        lineno++;
        if (n > MAX_LINE || strlen(line) != (size_t)n) {
            r = failf(res, "params.txt:%u: line too long or holds a NUL byte", lineno);
            goto free_line;
        }
        s = trim(line);
        if (s[0] == '\0' || s[0] == '#')
            continue;
        r = parse_line(&p, s, lineno, res);
        if (r < 0)
            goto free_line;
    }
    if (ferror(f)) {
        r = failf(res, "cannot read params.txt: %s", strerror(errno));
        goto free_line;
    }

    if (!has(&p, P_MODE) || !has(&p, P_BUDGET) || !has(&p, P_WINDOW) ||
        (trace && !has(&p, P_PROMPT))) {
        r = failf(res, "params.txt: missing %s",
                  !has(&p, P_MODE)     ? "mode"
                  : !has(&p, P_BUDGET) ? "budget"
                  : !has(&p, P_WINDOW) ? "window"
                                       : "prompt");
        goto free_line;
    }
    def = vase_params_default(p.budget);
    if (!has(&p, P_N_LARGE))
        p.n_large = def.n_large;
    if (!has(&p, P_N_SINK))
        p.n_sink = def.n_sink;
    if (!has(&p, P_TEMPERATURE))
        p.temperature = def.temperature;
    if (!has(&p, P_LAMBDA))
        p.lambda = def.lambda;
    if (!has(&p, P_SMOOTH))
        p.smooth = def.smooth;
    if (!has(&p, P_RANK))
        p.rank = def.rank;
    *ret = p;

free_line:
    free(line);
close_file:
    fclose(f);
    return r;
}

/* The policy and metric of the case. mode is the reference's name; a policy without one
 * (streaming, random, h2o) may be named as vase spells it, with the default metric. */
static int resolve_policy(const struct case_params *p, enum vase_policy *ret_policy,
                          enum vase_metric *ret_metric, struct result *res) {
    enum vase_metric metric = VASE_METRIC_RANGE;
    enum vase_policy policy = VASE_POLICY_VASE_ATTNV;
    int r;

    r = vase_policy_from_mode(p->mode, &policy, &metric);
    if (r < 0) {
        metric = VASE_METRIC_RANGE;
        r = vase_policy_from_string(p->mode, &policy);
    }
    if (r < 0)
        return failf(res, "unknown mode '%s'", p->mode);
    *ret_policy = policy;
    *ret_metric = metric;
    return 0;
}

static struct vase_params make_params(const struct case_params *p, enum vase_metric metric) {
    return (struct vase_params){
        .budget = p->budget,
        .window = p->window,
        .n_sink = p->n_sink,
        .n_large = p->n_large,
        .temperature = p->temperature,
        .rank = p->rank,
        .lambda = p->lambda,
        .smooth = p->smooth,
        .metric = metric,
    };
}

/* The draws a policy needs must be there, and draws it does not need must not be: the
 * generator writes only what the reference consumed, so a mismatch means vase_policy_needs()
 * and the reference disagree about the policy. */
static int check_draws_present(enum vase_policy policy, unsigned needs, const char *exp_name,
                               bool have_exp, const char *gauss_name, bool have_gauss,
                               struct result *res) {
    const char *name = vase_policy_to_string(policy);

    if (!name)
        name = "?";
    if ((needs & VASE_NEEDS_EXP) && !have_exp)
        return failf(res, "policy %s needs Exp(1) draws but %s is missing", name, exp_name);
    if (!(needs & VASE_NEEDS_EXP) && have_exp)
        return failf(res, "%s is present but policy %s does not use Exp(1) draws", exp_name, name);
    if ((needs & VASE_NEEDS_GAUSS) && !have_gauss)
        return failf(res, "policy %s needs a Gaussian sketch but %s is missing", name, gauss_name);
    if (!(needs & VASE_NEEDS_GAUSS) && have_gauss)
        return failf(res, "%s is present but policy %s does not use a Gaussian sketch", gauss_name,
                     name);
    if (needs & VASE_NEEDS_ACC)
        return failf(res, "policy %s needs accumulated attention, which vectors do not carry",
                     name);
    return 0;
}

/* ---- arrays -------------------------------------------------------------------------- */

/* Loads dir/name. An optional array that does not exist gives *ret = NULL and 0. */
static int load(const char *dir, const char *name, bool optional, struct vase_npy **ret,
                struct result *res) {
    char path[PATH_MAX];
    int r;

    if (join_path(path, sizeof path, dir, name) < 0)
        return failf(res, "path too long");
    r = vase_npy_load(path, ret);
    if (r == -ENOENT && optional) {
        *ret = NULL;
        return 0;
    }
    if (r < 0)
        return failf(res, "cannot load %s: %s", name, strerror(-r));
    return 0;
}

static bool file_exists(const char *dir, const char *name) {
    char path[PATH_MAX];
    struct stat st;

    return join_path(path, sizeof path, dir, name) == 0 && stat(path, &st) == 0;
}

static void format_shape(const struct vase_npy *a, char *buf, size_t size) {
    size_t off = 0;

    off += (size_t)snprintf(buf, size, "(");
    for (unsigned i = 0; i < a->ndim && off < size; i++)
        off += (size_t)snprintf(buf + off, size - off, i ? ", %zu" : "%zu", a->shape[i]);
    if (off < size)
        snprintf(buf + off, size - off, a->ndim == 1 ? ",)" : ")");
}

/* The dtype and rank of an array. Every dimension then fits uint32_t: the loader bounds them
 * by VASE_NPY_MAX_BYTES. */
static int check_array(const struct vase_npy *a, const char *name, char dtype, unsigned ndim,
                       struct result *res) {
    char shape[128];

    if (a->dtype != dtype)
        return failf(res, "%s: dtype %s, want %s", name, vase_npy_dtype_name(a->dtype),
                     vase_npy_dtype_name(dtype));
    if (a->ndim != ndim) {
        format_shape(a, shape, sizeof shape);
        return failf(res, "%s: shape %s, want %u dimensions", name, shape, ndim);
    }
    for (unsigned i = 0; i < ndim; i++)
        if (a->shape[i] > UINT32_MAX)
            return failf(res, "%s: dimension %u too large", name, i);
    return 0;
}

static int check_dim(const struct vase_npy *a, const char *name, unsigned axis, uint64_t want,
                     const char *what, struct result *res) {
    char shape[128];

    if (a->shape[axis] == want)
        return 0;
    format_shape(a, shape, sizeof shape);
    return failf(res, "%s: shape %s, want dimension %u = %s = %llu", name, shape, axis, what,
                 (unsigned long long)want);
}

/* A params.txt value, where given, must agree with what the arrays say. */
static int check_param(const struct case_params *p, enum param_key k, uint64_t actual,
                       const char *source, struct result *res) {
    uint32_t given = *(const uint32_t *)(const void *)((const char *)p + param_table[k].offset);

    if (!has(p, k) || given == actual)
        return 0;
    return failf(res, "params.txt says %s=%u but %s gives %llu", param_table[k].key, given, source,
                 (unsigned long long)actual);
}

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
                   const int32_t *want, size_t heads, size_t per_head, struct result *res) {
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
    return failf(res, "%s head %zu %s %zu: got %u, want %d (%zu of %zu differ)", what, first_h,
                 unit, first_i, got[first_h * got_stride + first_i],
                 want[first_h * per_head + first_i], ndiff, heads * per_head);
}

/* A plan must be K distinct candidates per head before the runner indexes with it. */
static int check_plan(const uint32_t *keep, uint32_t heads, uint32_t K, uint32_t n, uint8_t *seen,
                      struct result *res) {
    for (uint32_t h = 0; h < heads; h++) {
        memset(seen, 0, n);
        for (uint32_t i = 0; i < K; i++) {
            uint32_t j = keep[(size_t)h * K + i];

            if (j >= n)
                return failf(res, "plan head %u entry %u: slot %u is not a candidate (N = %u)", h,
                             i, j, n);
            if (seen[j])
                return failf(res, "plan head %u entry %u: slot %u kept twice", h, i, j);
            seen[j] = 1;
        }
    }
    return 0;
}

/* ---- single_*: one eviction ---------------------------------------------------------- */

static int run_single(const char *dir, struct result *res) {
    struct vase_npy *k = NULL, *v = NULL, *q = NULL, *want = NULL, *exp = NULL, *gauss = NULL;
    struct vase_plan_input in;
    struct case_params p;
    enum vase_policy policy = VASE_POLICY_VASE_ATTNV;
    enum vase_metric metric = VASE_METRIC_RANGE;
    uint32_t hkv, hq, n, d, K, *keep = NULL;
    uint8_t *seen = NULL;
    unsigned needs;
    int r;

    r = read_params(dir, false, &p, res);
    if (r < 0)
        return r;
    r = resolve_policy(&p, &policy, &metric, res);
    if (r < 0)
        return r;
    needs = vase_policy_needs(policy);

    if ((r = load(dir, "k.npy", false, &k, res)) < 0 ||
        (r = load(dir, "v.npy", false, &v, res)) < 0 ||
        (r = load(dir, "q.npy", false, &q, res)) < 0 ||
        (r = load(dir, "keep.npy", false, &want, res)) < 0 ||
        (r = load(dir, "exp_noise.npy", true, &exp, res)) < 0 ||
        (r = load(dir, "gauss.npy", true, &gauss, res)) < 0)
        goto out;
    r = check_draws_present(policy, needs, "exp_noise.npy", exp, "gauss.npy", gauss, res);
    if (r < 0)
        goto out;

    /* k fixes Hkv, N and D; everything else must agree with it and with params.txt. */
    if ((r = check_array(k, "k.npy", 'f', 3, res)) < 0)
        goto out;
    hkv = (uint32_t)k->shape[0];
    n = (uint32_t)k->shape[1];
    d = (uint32_t)k->shape[2];
    if (hkv == 0 || d == 0) {
        r = failf(res, "k.npy: empty head or dim axis");
        goto out;
    }
    if (p.window == 0 || p.budget <= p.window) {
        r = failf(res, "params.txt: need budget > window > 0");
        goto out;
    }
    K = p.budget - p.window;
    if ((r = check_array(v, "v.npy", 'f', 3, res)) < 0 ||
        (r = check_dim(v, "v.npy", 0, hkv, "Hkv", res)) < 0 ||
        (r = check_dim(v, "v.npy", 1, n, "N", res)) < 0 ||
        (r = check_dim(v, "v.npy", 2, d, "D", res)) < 0 ||
        (r = check_array(q, "q.npy", 'f', 3, res)) < 0 ||
        (r = check_dim(q, "q.npy", 1, p.window, "window", res)) < 0 ||
        (r = check_dim(q, "q.npy", 2, d, "D", res)) < 0 ||
        (r = check_array(want, "keep.npy", 'i', 2, res)) < 0 ||
        (r = check_dim(want, "keep.npy", 0, hkv, "Hkv", res)) < 0 ||
        (r = check_dim(want, "keep.npy", 1, K, "budget - window", res)) < 0)
        goto out;
    hq = (uint32_t)q->shape[0];
    if (hq == 0 || hq % hkv != 0) {
        r = failf(res, "q.npy: %u query heads is not a multiple of %u KV heads", hq, hkv);
        goto out;
    }
    if ((r = check_param(&p, P_HKV, hkv, "k.npy", res)) < 0 ||
        (r = check_param(&p, P_D, d, "k.npy", res)) < 0 ||
        (r = check_param(&p, P_HQ, hq, "q.npy", res)) < 0 ||
        (r = check_param(&p, P_CUR_LEN, (uint64_t)n + p.window, "k.npy's N + window", res)) < 0)
        goto out;
    if (K > n) {
        r = failf(res, "k.npy: N = %u candidates, fewer than budget - window = %u", n, K);
        goto out;
    }
    if (exp && ((r = check_array(exp, "exp_noise.npy", 'f', 2, res)) < 0 ||
                (r = check_dim(exp, "exp_noise.npy", 0, hkv, "Hkv", res)) < 0 ||
                (r = check_dim(exp, "exp_noise.npy", 1, n, "N", res)) < 0))
        goto out;
    if (gauss && ((r = check_array(gauss, "gauss.npy", 'f', 2, res)) < 0 ||
                  (r = check_dim(gauss, "gauss.npy", 0, d, "D", res)) < 0 ||
                  (r = check_dim(gauss, "gauss.npy", 1, p.rank, "sketch_rank", res)) < 0))
        goto out;

    in = (struct vase_plan_input){
        .policy = policy,
        .params = make_params(&p, metric),
        .n = n,
        .hq = hq,
        .k = vase_view_contiguous(k->data, VASE_DTYPE_F32, hkv, n, d),
        .v = vase_view_contiguous(v->data, VASE_DTYPE_F32, hkv, n, d),
        .q = vase_view_contiguous(q->data, VASE_DTYPE_F32, hq, p.window, d),
        .exp_draws = exp ? exp->data : NULL,
        .gauss = gauss ? gauss->data : NULL,
    };
    r = vase_params_check(&in.params, policy);
    if (r < 0) {
        r = failf(res, "vase_params_check() refuses the parameters: %s", strerror(-r));
        goto out;
    }
    if (vase_plan_keep_count(&in.params) != K) {
        r = failf(res, "vase_plan_keep_count() = %u, want budget - window = %u",
                  vase_plan_keep_count(&in.params), K);
        goto out;
    }

    keep = alloc_array(hkv, K, 1, sizeof *keep);
    seen = alloc_array(n, 1, 1, 1);
    if (!keep || !seen) {
        r = failf(res, "out of memory");
        goto out;
    }
    r = vase_plan(&in, 1, NULL, keep);
    if (r < 0) {
        r = failf(res, "vase_plan() failed: %s", strerror(-r));
        goto out;
    }
    r = check_plan(keep, hkv, K, n, seen, res);
    if (r < 0)
        goto out;
    r = compare("keep", "entry", keep, K, want->data, hkv, K, res);

out:
    free(seen);
    free(keep);
    vase_npy_free(gauss);
    vase_npy_free(exp);
    vase_npy_free(want);
    vase_npy_free(q);
    vase_npy_free(v);
    vase_npy_free(k);
    return r;
}

/* ---- trace_*: a whole generation ----------------------------------------------------- */

struct trace {
    const char *dir;
    enum vase_policy policy;
    unsigned needs;
    struct vase_params params;
    uint32_t T, prompt, hkv, hq, d, window, budget, K;
    uint32_t cap; /* slots per head: never more than T tokens are cached */

    struct vase_npy *ks, *vs, *qs; /* [T][Hkv][D], [T][Hkv][D], [T][Hq][D] */
    struct vase_npy *steps;        /* [rounds] */
    struct vase_npy *final;        /* [Hkv][len] */
    struct vase_npy *gauss;        /* the sketch of the latest round that had one */

    float *k_cache, *v_cache;  /* [Hkv][cap][D] */
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
    free(tr->v_cache);
    free(tr->k_cache);
    vase_npy_free(tr->gauss);
    vase_npy_free(tr->final);
    vase_npy_free(tr->steps);
    vase_npy_free(tr->qs);
    vase_npy_free(tr->vs);
    vase_npy_free(tr->ks);
}

static const float *stream_row(const struct vase_npy *s, uint32_t heads, uint32_t d, uint32_t t,
                               uint32_t h) {
    return (const float *)s->data + ((size_t)t * heads + h) * d;
}

static float *cache_row(const struct trace *tr, float *cache, uint32_t h, uint32_t slot) {
    return cache + ((size_t)h * tr->cap + slot) * tr->d;
}

static void append(struct trace *tr, uint32_t t) {
    for (uint32_t h = 0; h < tr->hkv; h++) {
        memcpy(cache_row(tr, tr->k_cache, h, tr->len), stream_row(tr->ks, tr->hkv, tr->d, t, h),
               (size_t)tr->d * sizeof(float));
        memcpy(cache_row(tr, tr->v_cache, h, tr->len), stream_row(tr->vs, tr->hkv, tr->d, t, h),
               (size_t)tr->d * sizeof(float));
        tr->pos[(size_t)h * tr->cap + tr->len] = t;
    }
    tr->len++;
}

/* The draws of one round: Exp(1) from exp_noise_NNN.npy, and the sketch from gauss_NNN.npy
 * or, when this round has none (cur_fixed_gauss draws once), the latest earlier one. */
static int load_round_draws(struct trace *tr, uint32_t round, uint32_t n, struct vase_npy **ret_exp,
                            struct result *res) {
    struct vase_npy *exp = NULL, *gauss = NULL;
    char name[64];
    int r;

    if (tr->needs & VASE_NEEDS_EXP) {
        snprintf(name, sizeof name, "exp_noise_%03u.npy", round);
        r = load(tr->dir, name, false, &exp, res);
        if (r < 0)
            return r;
        if ((r = check_array(exp, name, 'f', 2, res)) < 0 ||
            (r = check_dim(exp, name, 0, tr->hkv, "Hkv", res)) < 0 ||
            (r = check_dim(exp, name, 1, n, "this round's N", res)) < 0) {
            vase_npy_free(exp);
            return r;
        }
    }
    if (tr->needs & VASE_NEEDS_GAUSS) {
        snprintf(name, sizeof name, "gauss_%03u.npy", round);
        r = load(tr->dir, name, true, &gauss, res);
        if (r < 0) {
            vase_npy_free(exp);
            return r;
        }
        if (gauss) {
            if ((r = check_array(gauss, name, 'f', 2, res)) < 0 ||
                (r = check_dim(gauss, name, 0, tr->d, "D", res)) < 0 ||
                (r = check_dim(gauss, name, 1, tr->params.rank, "sketch_rank", res)) < 0) {
                vase_npy_free(gauss);
                vase_npy_free(exp);
                return r;
            }
            vase_npy_free(tr->gauss);
            tr->gauss = gauss;
        } else if (!tr->gauss) {
            vase_npy_free(exp);
            return failf(res, "round %u: no %s and no earlier sketch", round, name);
        }
    }
    *ret_exp = exp;
    return 0;
}

/* After a compaction, every live slot must hold the K and V rows of the token it claims. */
static int verify_cache(const struct trace *tr, uint32_t round, struct result *res) {
    size_t row = (size_t)tr->d * sizeof(float);

    for (uint32_t h = 0; h < tr->hkv; h++)
        for (uint32_t s = 0; s < tr->len; s++) {
            uint32_t t = tr->pos[(size_t)h * tr->cap + s];

            if (memcmp(cache_row(tr, tr->k_cache, h, s), stream_row(tr->ks, tr->hkv, tr->d, t, h),
                       row) != 0 ||
                memcmp(cache_row(tr, tr->v_cache, h, s), stream_row(tr->vs, tr->hkv, tr->d, t, h),
                       row) != 0)
                return failf(res,
                             "round %u: after vase_compact() head %u slot %u does not hold the "
                             "K/V rows of token %u",
                             round, h, s, t);
        }
    return 0;
}

/* One eviction, triggered by the append of token t. */
static int evict(struct trace *tr, uint32_t t, struct result *res) {
    const int32_t *want_steps = tr->steps->data;
    uint32_t round = tr->rounds, n = tr->len - tr->window, K = tr->K;
    struct vase_npy *exp = NULL;
    struct vase_view kview, vview;
    struct vase_plan_input in;
    int r, r2;

    if (round >= tr->steps->shape[0])
        return failf(res, "eviction %u at t=%u, but evict_steps lists only %zu", round, t,
                     tr->steps->shape[0]);
    if (want_steps[round] < 0 || (uint32_t)want_steps[round] != t)
        return failf(res, "eviction %u at t=%u, want t=%d", round, t, want_steps[round]);

    r = load_round_draws(tr, round, n, &exp, res);
    if (r < 0)
        return r;

    /* The window's queries: those of tokens t - W + 1 .. t, prefill ones included. */
    for (uint32_t h = 0; h < tr->hq; h++)
        for (uint32_t i = 0; i < tr->window; i++)
            memcpy(tr->q_win + ((size_t)h * tr->window + i) * tr->d,
                   stream_row(tr->qs, tr->hq, tr->d, t - tr->window + 1 + i, h),
                   (size_t)tr->d * sizeof(float));

    kview = vase_view_contiguous(tr->k_cache, VASE_DTYPE_F32, tr->hkv, tr->cap, tr->d);
    vview = vase_view_contiguous(tr->v_cache, VASE_DTYPE_F32, tr->hkv, tr->cap, tr->d);
    in = (struct vase_plan_input){
        .policy = tr->policy,
        .params = tr->params,
        .n = n,
        .hq = tr->hq,
        .k = kview,
        .v = vview,
        .q = vase_view_contiguous(tr->q_win, VASE_DTYPE_F32, tr->hq, tr->window, tr->d),
        .exp_draws = exp ? exp->data : NULL,
        .gauss = (tr->needs & VASE_NEEDS_GAUSS) ? tr->gauss->data : NULL,
    };
    r = vase_plan(&in, 1, &tr->ws, tr->keep);
    vase_npy_free(exp);
    if (r < 0)
        return failf(res, "round %u (t=%u): vase_plan() failed: %s", round, t, strerror(-r));
    r = check_plan(tr->keep, tr->hkv, K, n, tr->seen, res);
    if (r < 0)
        return r;

    r = vase_compact(&kview, tr->keep, K, n, tr->len);
    r2 = vase_compact(&vview, tr->keep, K, n, tr->len);
    if (r < 0 || r2 < 0)
        return failf(res, "round %u: vase_compact() failed: %s", round,
                     strerror(-(r < 0 ? r : r2)));
    if ((uint32_t)r != K + tr->len - n || (uint32_t)r2 != K + tr->len - n)
        return failf(res, "round %u: vase_compact() returned %d/%d, want %u", round, r, r2,
                     K + tr->len - n);

    /* The compaction rule, applied to the token indices by hand. */
    for (uint32_t h = 0; h < tr->hkv; h++) {
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

static int trace_setup(struct trace *tr, const char *dir, struct result *res) {
    struct case_params p;
    enum vase_metric metric = VASE_METRIC_RANGE;
    int r;

    tr->dir = dir;
    r = read_params(dir, true, &p, res);
    if (r < 0)
        return r;
    r = resolve_policy(&p, &tr->policy, &metric, res);
    if (r < 0)
        return r;
    tr->needs = vase_policy_needs(tr->policy);
    tr->params = make_params(&p, metric);
    r = check_draws_present(tr->policy, tr->needs, "exp_noise_000.npy",
                            file_exists(dir, "exp_noise_000.npy"), "gauss_000.npy",
                            file_exists(dir, "gauss_000.npy"), res);
    if (r < 0)
        return r;
    r = vase_params_check(&tr->params, tr->policy);
    if (r < 0)
        return failf(res, "vase_params_check() refuses the parameters: %s", strerror(-r));
    if (p.window == 0 || p.budget <= p.window)
        return failf(res, "params.txt: need budget > window > 0");
    tr->window = p.window;
    tr->budget = p.budget;
    tr->K = p.budget - p.window;
    if (vase_plan_keep_count(&tr->params) != tr->K)
        return failf(res, "vase_plan_keep_count() = %u, want budget - window = %u",
                     vase_plan_keep_count(&tr->params), tr->K);

    if ((r = load(dir, "k_stream.npy", false, &tr->ks, res)) < 0 ||
        (r = load(dir, "v_stream.npy", false, &tr->vs, res)) < 0 ||
        (r = load(dir, "q_stream.npy", false, &tr->qs, res)) < 0 ||
        (r = load(dir, "evict_steps.npy", false, &tr->steps, res)) < 0 ||
        (r = load(dir, "final_pos.npy", false, &tr->final, res)) < 0)
        return r;

    if ((r = check_array(tr->ks, "k_stream.npy", 'f', 3, res)) < 0)
        return r;
    tr->T = (uint32_t)tr->ks->shape[0];
    tr->hkv = (uint32_t)tr->ks->shape[1];
    tr->d = (uint32_t)tr->ks->shape[2];
    if (tr->hkv == 0 || tr->d == 0)
        return failf(res, "k_stream.npy: empty head or dim axis");
    if ((r = check_array(tr->vs, "v_stream.npy", 'f', 3, res)) < 0 ||
        (r = check_dim(tr->vs, "v_stream.npy", 0, tr->T, "T", res)) < 0 ||
        (r = check_dim(tr->vs, "v_stream.npy", 1, tr->hkv, "Hkv", res)) < 0 ||
        (r = check_dim(tr->vs, "v_stream.npy", 2, tr->d, "D", res)) < 0 ||
        (r = check_array(tr->qs, "q_stream.npy", 'f', 3, res)) < 0 ||
        (r = check_dim(tr->qs, "q_stream.npy", 0, tr->T, "T", res)) < 0 ||
        (r = check_dim(tr->qs, "q_stream.npy", 2, tr->d, "D", res)) < 0 ||
        (r = check_array(tr->steps, "evict_steps.npy", 'i', 1, res)) < 0 ||
        (r = check_array(tr->final, "final_pos.npy", 'i', 2, res)) < 0 ||
        (r = check_dim(tr->final, "final_pos.npy", 0, tr->hkv, "Hkv", res)) < 0)
        return r;
    tr->hq = (uint32_t)tr->qs->shape[1];
    if (tr->hq == 0 || tr->hq % tr->hkv != 0)
        return failf(res, "q_stream.npy: %u query heads is not a multiple of %u KV heads", tr->hq,
                     tr->hkv);
    if ((r = check_param(&p, P_HKV, tr->hkv, "k_stream.npy", res)) < 0 ||
        (r = check_param(&p, P_D, tr->d, "k_stream.npy", res)) < 0 ||
        (r = check_param(&p, P_HQ, tr->hq, "q_stream.npy", res)) < 0)
        return r;
    if (p.prompt > tr->T)
        return failf(res, "params.txt: prompt=%u exceeds the %u tokens of k_stream.npy", p.prompt,
                     tr->T);
    tr->prompt = p.prompt;
    if ((r = check_param(&p, P_STEPS, tr->T - p.prompt, "k_stream.npy's T - prompt", res)) < 0)
        return r;

    /* The cache never holds more than the T tokens of the stream, so every allocation is
     * bounded by the size of k_stream.npy. The eviction buffers are needed only if the
     * sequence outgrows the budget, and then W < budget < T bounds them too. */
    tr->cap = tr->T;
    tr->k_cache = alloc_array(tr->hkv, tr->cap, tr->d, sizeof(float));
    tr->v_cache = alloc_array(tr->hkv, tr->cap, tr->d, sizeof(float));
    tr->pos = alloc_array(tr->hkv, tr->cap, 1, sizeof(uint32_t));
    if (!tr->k_cache || !tr->v_cache || !tr->pos)
        return failf(res, "out of memory");
    if (tr->T > tr->budget) {
        tr->pos_tmp = alloc_array(tr->cap, 1, 1, sizeof(uint32_t));
        tr->q_win = alloc_array(tr->hq, tr->window, tr->d, sizeof(float));
        tr->keep = alloc_array(tr->hkv, tr->K, 1, sizeof(uint32_t));
        tr->seen = alloc_array(tr->cap, 1, 1, 1);
        if (!tr->pos_tmp || !tr->q_win || !tr->keep || !tr->seen)
            return failf(res, "out of memory");
        r = vase_workspace_new(&tr->ws);
        if (r < 0)
            return failf(res, "vase_workspace_new() failed: %s", strerror(-r));
    }
    return 0;
}

static int run_trace(const char *dir, struct result *res) {
    struct trace tr = {.len = 0};
    const int32_t *want_steps;
    int r;

    r = trace_setup(&tr, dir, res);
    if (r < 0)
        goto out;

    /* Prefill never evicts; each decode step may. */
    for (uint32_t t = 0; t < tr.T; t++) {
        append(&tr, t);
        if (t < tr.prompt || tr.len <= tr.budget || tr.len % tr.window != 0)
            continue;
        r = evict(&tr, t, res);
        if (r < 0)
            goto out;
    }

    want_steps = tr.steps->data;
    if (tr.rounds != tr.steps->shape[0]) {
        r = failf(res, "%u evictions, want %zu (the next at t=%d)", tr.rounds, tr.steps->shape[0],
                  want_steps[tr.rounds]);
        goto out;
    }
    if (tr.final->shape[1] != tr.len) {
        r = failf(res, "final length %u, want %zu", tr.len, tr.final->shape[1]);
        goto out;
    }
    /* pos is [Hkv][cap]; only the first len slots of each head are live. */
    r = compare("final_pos", "slot", tr.pos, tr.cap, tr.final->data, tr.hkv, tr.len, res);

out:
    trace_done(&tr);
    return r;
}

/* ---- driver -------------------------------------------------------------------------- */

/* The case is named after the directory's basename, trailing slashes ignored. */
static void case_name(const char *path, char *buf, size_t size) {
    size_t len = strlen(path);
    const char *base;

    while (len > 1 && path[len - 1] == '/')
        len--;
    base = path + len;
    while (base > path && base[-1] != '/')
        base--;
    snprintf(buf, size, "%.*s", (int)(path + len - base), base);
}

/* Picks the kind of the case by its name, else by the files it holds. */
static int run_case(const char *path, struct result *res) {
    char name[NAME_MAX + 1];
    struct stat st;

    case_name(path, name, sizeof name);
    if (stat(path, &st) < 0)
        return failf(res, "%s", strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return failf(res, "not a directory");
    if (strncmp(name, "single_", 7) == 0)
        return run_single(path, res);
    if (strncmp(name, "trace_", 6) == 0)
        return run_trace(path, res);
    if (file_exists(path, "keep.npy"))
        return run_single(path, res);
    if (file_exists(path, "final_pos.npy"))
        return run_trace(path, res);
    return failf(res, "neither a single_ nor a trace_ case (no keep.npy or final_pos.npy)");
}

static int is_case_dir(const char *root, const char *name) {
    char path[PATH_MAX];
    struct stat st;

    if (name[0] == '.')
        return 0;
    return join_path(path, sizeof path, root, name) == 0 && stat(path, &st) == 0 &&
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
        if (join_path(buf, sizeof buf, root, ents[i]->d_name) < 0) {
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

static void help(void) {
    printf("Usage: run_vectors [CASE_DIR...]\n"
           "Replays eviction test vectors through the CPU kernels. Without arguments, runs every\n"
           "case directory under $VASE_VECTORS, or %s.\n"
           "\n"
           "  -h --help    show this help\n",
           DEFAULT_ROOT);
}

/* Returns < 0 on a usage error, 0 to exit successfully (help), > 0 to go on. */
static int parse_argv(int argc, char **argv) {
    static const struct option options[] = {
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c;

    while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0)
        switch (c) {
        case 'h':
            help();
            return 0;
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

    for (size_t i = 0; i < ncases; i++) {
        const char *path = listed ? listed[i] : argv[optind + (int)i];
        struct result res = {.msg = ""};
        char name[NAME_MAX + 1];

        case_name(path, name, sizeof name);
        r = run_case(path, &res);
        if (r < 0 && res.msg[0] == '\0')
            snprintf(res.msg, sizeof res.msg, "%s", strerror(-r));
        if (r < 0) {
            printf("FAIL %s: %s\n", name, res.msg);
            failed++;
        } else {
            printf("PASS %s\n", name);
            passed++;
        }
        /* stderr carries the loader's details; keep the two in order on a terminal or a log. */
        fflush(stdout);
    }
    printf("%zu passed, %zu failed\n", passed, failed);

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
