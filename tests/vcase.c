/* SPDX-License-Identifier: MIT */

/*
 * The vector-case loader: params.txt, the arrays of a case and a trace's per-round draws, for
 * the programs that replay the eviction test vectors (tests/run_vectors, tests/replay_engine).
 *
 * Nothing about the shipped cases is built in: every size comes from params.txt and the array
 * shapes, and each shape is checked against the others before a caller indexes with it. Every
 * dimension of an accepted array fits uint32_t (the .npy loader bounds arrays by
 * VASE_NPY_MAX_BYTES). The module owns nothing but the arrays it hands out in the structs of a
 * case, which the matching *_done() function frees.
 */

#include "vcase.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* params.txt is a dozen short lines; anything much larger is not a params file. */
#define MAX_PARAMS_BYTES 65536
#define MAX_LINE 1024

int vcase_failf(struct vcase_result *res, const char *fmt, ...) {
    va_list ap;

    if (res->msg[0] == '\0') {
        va_start(ap, fmt);
        vsnprintf(res->msg, sizeof res->msg, fmt, ap);
        va_end(ap);
    }
    return -EINVAL;
}

/* ---- params.txt ---------------------------------------------------------------------- */

enum param_type { PARAM_STR, PARAM_U32, PARAM_F32 };

/* Every key params.txt may hold. An unknown key is an error rather than ignored: it would be a
 * setting of the generator that the program reading the case does not reproduce. */
static const struct param_def {
    const char *key;
    enum param_type type;
    size_t offset;
} param_table[_VCASE_KEY_MAX] = {
    [VCASE_KEY_MODE] = {"mode", PARAM_STR, offsetof(struct vcase_params, mode)},
    [VCASE_KEY_HQ] = {"Hq", PARAM_U32, offsetof(struct vcase_params, hq)},
    [VCASE_KEY_HKV] = {"Hkv", PARAM_U32, offsetof(struct vcase_params, hkv)},
    [VCASE_KEY_D] = {"D", PARAM_U32, offsetof(struct vcase_params, d)},
    [VCASE_KEY_BUDGET] = {"budget", PARAM_U32, offsetof(struct vcase_params, budget)},
    [VCASE_KEY_WINDOW] = {"window", PARAM_U32, offsetof(struct vcase_params, window)},
    [VCASE_KEY_CUR_LEN] = {"cur_len", PARAM_U32, offsetof(struct vcase_params, cur_len)},
    [VCASE_KEY_PROMPT] = {"prompt", PARAM_U32, offsetof(struct vcase_params, prompt)},
    [VCASE_KEY_STEPS] = {"steps", PARAM_U32, offsetof(struct vcase_params, steps)},
    [VCASE_KEY_N_LARGE] = {"n_large", PARAM_U32, offsetof(struct vcase_params, n_large)},
    [VCASE_KEY_N_SINK] = {"n_sink", PARAM_U32, offsetof(struct vcase_params, n_sink)},
    [VCASE_KEY_TEMPERATURE] = {"temperature", PARAM_F32,
                               offsetof(struct vcase_params, temperature)},
    [VCASE_KEY_LAMBDA] = {"rkv_lambda", PARAM_F32, offsetof(struct vcase_params, lambda)},
    [VCASE_KEY_SMOOTH] = {"smooth_kernel", PARAM_U32, offsetof(struct vcase_params, smooth)},
    [VCASE_KEY_RANK] = {"sketch_rank", PARAM_U32, offsetof(struct vcase_params, rank)},
    [VCASE_KEY_PROTECT_PROMPT] = {"protect_prompt", PARAM_U32,
                                  offsetof(struct vcase_params, protect_prompt)},
};

bool vcase_has(const struct vcase_params *p, enum vcase_key k) {
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

int vcase_join_path(char *buf, size_t size, const char *dir, const char *name) {
    size_t len = strlen(dir);
    int n = snprintf(buf, size, len > 0 && dir[len - 1] == '/' ? "%s%s" : "%s/%s", dir, name);

    return n < 0 || (size_t)n >= size ? -ENAMETOOLONG : 0;
}

static int parse_line(struct vcase_params *p, char *line, unsigned lineno,
                      struct vcase_result *res) {
    const struct param_def *def = NULL;
    char *eq, *key, *value;
    enum vcase_key k;
    int r = 0;

    eq = strchr(line, '=');
    if (!eq)
        return vcase_failf(res, "params.txt:%u: expected key=value", lineno);
    *eq = '\0';
    key = trim(line);
    value = trim(eq + 1);

    for (k = 0; k < _VCASE_KEY_MAX; k++)
        if (strcmp(param_table[k].key, key) == 0) {
            def = &param_table[k];
            break;
        }
    if (!def)
        return vcase_failf(res, "params.txt:%u: unknown key '%s'", lineno, key);
    if (vcase_has(p, k))
        return vcase_failf(res, "params.txt:%u: duplicate key '%s'", lineno, key);

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
        return vcase_failf(res, "params.txt:%u: invalid value for %s: '%s' (%s)", lineno, key,
                           value, strerror(-r));
    p->seen |= 1u << k;
    return 0;
}

static struct vase_params make_params(const struct vcase_params *p, enum vase_metric metric) {
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
        .protect_prompt = p->protect_prompt,
    };
}

/* The policy that mode names, and the kernel parameters of the case. */
static int resolve_policy(const struct vcase_params *p, enum vase_policy *ret_policy,
                          struct vase_params *ret_params, struct vcase_result *res) {
    enum vase_metric metric = VASE_METRIC_RANGE;
    enum vase_policy policy = VASE_POLICY_VASE_ATTNV;
    int r;

    r = vase_policy_from_mode(p->mode, &policy, &metric);
    if (r < 0) {
        metric = VASE_METRIC_RANGE;
        r = vase_policy_from_string(p->mode, &policy);
    }
    if (r < 0)
        return vcase_failf(res, "unknown mode '%s'", p->mode);
    *ret_policy = policy;
    *ret_params = make_params(p, metric);
    return 0;
}

int vcase_read_params(const char *dir, bool trace, struct vcase_params *ret,
                      enum vase_policy *ret_policy, struct vase_params *ret_params,
                      struct vcase_result *res) {
    struct vcase_params p = {.seen = 0};
    struct vase_params def, params;
    enum vase_policy policy = VASE_POLICY_VASE_ATTNV;
    char path[PATH_MAX], *line = NULL;
    size_t cap = 0;
    unsigned lineno = 0;
    struct stat st;
    ssize_t n;
    FILE *f;
    int r = 0;

    if (vcase_join_path(path, sizeof path, dir, "params.txt") < 0)
        return vcase_failf(res, "path too long");
    f = fopen(path, "re");
    if (!f)
        return vcase_failf(res, "cannot open params.txt: %s", strerror(errno));
    if (fstat(fileno(f), &st) < 0 || !S_ISREG(st.st_mode) || st.st_size > MAX_PARAMS_BYTES) {
        r = vcase_failf(res, "params.txt is not a regular file of at most %d bytes",
                        MAX_PARAMS_BYTES);
        goto close_file;
    }

    while ((n = getline(&line, &cap, f)) >= 0) {
        char *s;

        lineno++;
        if (n > MAX_LINE || strlen(line) != (size_t)n) {
            r = vcase_failf(res, "params.txt:%u: line too long or holds a NUL byte", lineno);
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
        r = vcase_failf(res, "cannot read params.txt: %s", strerror(errno));
        goto free_line;
    }

    /* A protected prompt is the first `prompt` slots, in a single case too. */
    bool need_prompt = trace || p.protect_prompt;
    if (!vcase_has(&p, VCASE_KEY_MODE) || !vcase_has(&p, VCASE_KEY_BUDGET) ||
        !vcase_has(&p, VCASE_KEY_WINDOW) || (need_prompt && !vcase_has(&p, VCASE_KEY_PROMPT))) {
        r = vcase_failf(res, "params.txt: missing %s",
                        !vcase_has(&p, VCASE_KEY_MODE)     ? "mode"
                        : !vcase_has(&p, VCASE_KEY_BUDGET) ? "budget"
                        : !vcase_has(&p, VCASE_KEY_WINDOW) ? "window"
                                                           : "prompt");
        goto free_line;
    }
    def = vase_params_default(p.budget);
    if (!vcase_has(&p, VCASE_KEY_N_LARGE))
        p.n_large = def.n_large;
    if (!vcase_has(&p, VCASE_KEY_N_SINK))
        p.n_sink = def.n_sink;
    if (!vcase_has(&p, VCASE_KEY_TEMPERATURE))
        p.temperature = def.temperature;
    if (!vcase_has(&p, VCASE_KEY_LAMBDA))
        p.lambda = def.lambda;
    if (!vcase_has(&p, VCASE_KEY_SMOOTH))
        p.smooth = def.smooth;
    if (!vcase_has(&p, VCASE_KEY_RANK))
        p.rank = def.rank;
    r = resolve_policy(&p, &policy, &params, res);
    if (r < 0)
        goto free_line;
    *ret = p;
    *ret_policy = policy;
    *ret_params = params;

free_line:
    free(line);
close_file:
    fclose(f);
    return r;
}

/* The generator writes only the draws the reference consumed, so a mismatch means
 * vase_policy_needs() and the reference disagree about the policy. */
int vcase_check_draws_present(enum vase_policy policy, const char *exp_name, bool have_exp,
                              const char *gauss_name, bool have_gauss, struct vcase_result *res) {
    const char *name = vase_policy_to_string(policy);
    unsigned needs = vase_policy_needs(policy);

    if (!name)
        name = "?";
    if ((needs & VASE_NEEDS_EXP) && !have_exp)
        return vcase_failf(res, "policy %s needs Exp(1) draws but %s is missing", name, exp_name);
    if (!(needs & VASE_NEEDS_EXP) && have_exp)
        return vcase_failf(res, "%s is present but policy %s does not use Exp(1) draws", exp_name,
                           name);
    if ((needs & VASE_NEEDS_GAUSS) && !have_gauss)
        return vcase_failf(res, "policy %s needs a Gaussian sketch but %s is missing", name,
                           gauss_name);
    if (!(needs & VASE_NEEDS_GAUSS) && have_gauss)
        return vcase_failf(res, "%s is present but policy %s does not use a Gaussian sketch",
                           gauss_name, name);
    if (needs & VASE_NEEDS_ACC)
        return vcase_failf(res, "policy %s needs accumulated attention, which vectors do not carry",
                           name);
    return 0;
}

/* A params.txt value, where given, must agree with what the arrays say. */
static int check_param(const struct vcase_params *p, enum vcase_key k, uint64_t actual,
                       const char *source, struct vcase_result *res) {
    uint32_t given = *(const uint32_t *)(const void *)((const char *)p + param_table[k].offset);

    if (!vcase_has(p, k) || given == actual)
        return 0;
    return vcase_failf(res, "params.txt says %s=%u but %s gives %llu", param_table[k].key, given,
                       source, (unsigned long long)actual);
}

/* ---- arrays -------------------------------------------------------------------------- */

/* Loads dir/name. An optional array that does not exist gives *ret = NULL and 0. */
static int load(const char *dir, const char *name, bool optional, struct vase_npy **ret,
                struct vcase_result *res) {
    char path[PATH_MAX];
    int r;

    if (vcase_join_path(path, sizeof path, dir, name) < 0)
        return vcase_failf(res, "path too long");
    r = vase_npy_load(path, ret);
    if (r == -ENOENT && optional) {
        *ret = NULL;
        return 0;
    }
    if (r < 0)
        return vcase_failf(res, "cannot load %s: %s", name, strerror(-r));
    return 0;
}

bool vcase_file_exists(const char *dir, const char *name) {
    char path[PATH_MAX];
    struct stat st;

    return vcase_join_path(path, sizeof path, dir, name) == 0 && stat(path, &st) == 0;
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
                       struct vcase_result *res) {
    char shape[128];

    if (a->dtype != dtype)
        return vcase_failf(res, "%s: dtype %s, want %s", name, vase_npy_dtype_name(a->dtype),
                           vase_npy_dtype_name(dtype));
    if (a->ndim != ndim) {
        format_shape(a, shape, sizeof shape);
        return vcase_failf(res, "%s: shape %s, want %u dimensions", name, shape, ndim);
    }
    for (unsigned i = 0; i < ndim; i++)
        if (a->shape[i] > UINT32_MAX)
            return vcase_failf(res, "%s: dimension %u too large", name, i);
    return 0;
}

static int check_dim(const struct vase_npy *a, const char *name, unsigned axis, uint64_t want,
                     const char *what, struct vcase_result *res) {
    char shape[128];

    if (a->shape[axis] == want)
        return 0;
    format_shape(a, shape, sizeof shape);
    return vcase_failf(res, "%s: shape %s, want dimension %u = %s = %llu", name, shape, axis, what,
                       (unsigned long long)want);
}

/* Exp(1) draws: [Hkv][N] f32, n_what naming N for the message. */
static int check_exp(const struct vase_npy *a, const char *name, uint32_t hkv, uint32_t n,
                     const char *n_what, struct vcase_result *res) {
    int r;

    if ((r = check_array(a, name, 'f', 2, res)) < 0 ||
        (r = check_dim(a, name, 0, hkv, "Hkv", res)) < 0 ||
        (r = check_dim(a, name, 1, n, n_what, res)) < 0)
        return r;
    return 0;
}

/* A Gaussian sketch: [D][r] f32. */
static int check_gauss(const struct vase_npy *a, const char *name, uint32_t d, uint32_t rank,
                       struct vcase_result *res) {
    int r;

    if ((r = check_array(a, name, 'f', 2, res)) < 0 ||
        (r = check_dim(a, name, 0, d, "D", res)) < 0 ||
        (r = check_dim(a, name, 1, rank, "sketch_rank", res)) < 0)
        return r;
    return 0;
}

/* ---- single_*: one eviction ---------------------------------------------------------- */

int vcase_single_load(struct vcase_single *c, const char *dir, const struct vcase_params *p,
                      enum vase_policy policy, struct vcase_result *res) {
    int r;

    if ((r = load(dir, "k.npy", false, &c->k, res)) < 0 ||
        (r = load(dir, "v.npy", false, &c->v, res)) < 0 ||
        (r = load(dir, "q.npy", false, &c->q, res)) < 0 ||
        (r = load(dir, "keep.npy", false, &c->keep, res)) < 0 ||
        (r = load(dir, "exp_noise.npy", true, &c->exp, res)) < 0 ||
        (r = load(dir, "gauss.npy", true, &c->gauss, res)) < 0)
        return r;
    r = vcase_check_draws_present(policy, "exp_noise.npy", c->exp, "gauss.npy", c->gauss, res);
    if (r < 0)
        return r;

    /* k fixes Hkv, N and D; everything else must agree with it and with params.txt. */
    if ((r = check_array(c->k, "k.npy", 'f', 3, res)) < 0)
        return r;
    c->hkv = (uint32_t)c->k->shape[0];
    c->n = (uint32_t)c->k->shape[1];
    c->d = (uint32_t)c->k->shape[2];
    if (c->hkv == 0 || c->d == 0)
        return vcase_failf(res, "k.npy: empty head or dim axis");
    if (p->window == 0 || p->budget <= p->window)
        return vcase_failf(res, "params.txt: need budget > window > 0");
    c->K = p->budget - p->window;
    if ((r = check_array(c->v, "v.npy", 'f', 3, res)) < 0 ||
        (r = check_dim(c->v, "v.npy", 0, c->hkv, "Hkv", res)) < 0 ||
        (r = check_dim(c->v, "v.npy", 1, c->n, "N", res)) < 0 ||
        (r = check_dim(c->v, "v.npy", 2, c->d, "D", res)) < 0 ||
        (r = check_array(c->q, "q.npy", 'f', 3, res)) < 0 ||
        (r = check_dim(c->q, "q.npy", 1, p->window, "window", res)) < 0 ||
        (r = check_dim(c->q, "q.npy", 2, c->d, "D", res)) < 0 ||
        (r = check_array(c->keep, "keep.npy", 'i', 2, res)) < 0 ||
        (r = check_dim(c->keep, "keep.npy", 0, c->hkv, "Hkv", res)) < 0 ||
        (r = check_dim(c->keep, "keep.npy", 1, c->K, "budget - window", res)) < 0)
        return r;
    c->hq = (uint32_t)c->q->shape[0];
    if (c->hq == 0 || c->hq % c->hkv != 0)
        return vcase_failf(res, "q.npy: %u query heads is not a multiple of %u KV heads", c->hq,
                           c->hkv);
    if ((r = check_param(p, VCASE_KEY_HKV, c->hkv, "k.npy", res)) < 0 ||
        (r = check_param(p, VCASE_KEY_D, c->d, "k.npy", res)) < 0 ||
        (r = check_param(p, VCASE_KEY_HQ, c->hq, "q.npy", res)) < 0 ||
        (r = check_param(p, VCASE_KEY_CUR_LEN, (uint64_t)c->n + p->window, "k.npy's N + window",
                         res)) < 0)
        return r;
    if (c->K > c->n)
        return vcase_failf(res, "k.npy: N = %u candidates, fewer than budget - window = %u", c->n,
                           c->K);
    if (c->exp && (r = check_exp(c->exp, "exp_noise.npy", c->hkv, c->n, "N", res)) < 0)
        return r;
    if (c->gauss && (r = check_gauss(c->gauss, "gauss.npy", c->d, p->rank, res)) < 0)
        return r;
    return 0;
}

void vcase_single_done(struct vcase_single *c) {
    vase_npy_free(c->gauss);
    vase_npy_free(c->exp);
    vase_npy_free(c->keep);
    vase_npy_free(c->q);
    vase_npy_free(c->v);
    vase_npy_free(c->k);
}

/* ---- trace_*: a whole generation ----------------------------------------------------- */

int vcase_trace_load(struct vcase_trace *c, const char *dir, const struct vcase_params *p,
                     struct vcase_result *res) {
    int r;

    c->dir = dir;
    if ((r = load(dir, "k_stream.npy", false, &c->ks, res)) < 0 ||
        (r = load(dir, "v_stream.npy", false, &c->vs, res)) < 0 ||
        (r = load(dir, "q_stream.npy", false, &c->qs, res)) < 0 ||
        (r = load(dir, "evict_steps.npy", false, &c->steps, res)) < 0 ||
        (r = load(dir, "final_pos.npy", false, &c->final, res)) < 0)
        return r;

    /* k_stream fixes T, Hkv and D; everything else must agree with it and with params.txt. */
    if ((r = check_array(c->ks, "k_stream.npy", 'f', 3, res)) < 0)
        return r;
    c->T = (uint32_t)c->ks->shape[0];
    c->hkv = (uint32_t)c->ks->shape[1];
    c->d = (uint32_t)c->ks->shape[2];
    if (c->hkv == 0 || c->d == 0)
        return vcase_failf(res, "k_stream.npy: empty head or dim axis");
    if ((r = check_array(c->vs, "v_stream.npy", 'f', 3, res)) < 0 ||
        (r = check_dim(c->vs, "v_stream.npy", 0, c->T, "T", res)) < 0 ||
        (r = check_dim(c->vs, "v_stream.npy", 1, c->hkv, "Hkv", res)) < 0 ||
        (r = check_dim(c->vs, "v_stream.npy", 2, c->d, "D", res)) < 0 ||
        (r = check_array(c->qs, "q_stream.npy", 'f', 3, res)) < 0 ||
        (r = check_dim(c->qs, "q_stream.npy", 0, c->T, "T", res)) < 0 ||
        (r = check_dim(c->qs, "q_stream.npy", 2, c->d, "D", res)) < 0 ||
        (r = check_array(c->steps, "evict_steps.npy", 'i', 1, res)) < 0 ||
        (r = check_array(c->final, "final_pos.npy", 'i', 2, res)) < 0 ||
        (r = check_dim(c->final, "final_pos.npy", 0, c->hkv, "Hkv", res)) < 0)
        return r;
    c->hq = (uint32_t)c->qs->shape[1];
    if (c->hq == 0 || c->hq % c->hkv != 0)
        return vcase_failf(res, "q_stream.npy: %u query heads is not a multiple of %u KV heads",
                           c->hq, c->hkv);
    if ((r = check_param(p, VCASE_KEY_HKV, c->hkv, "k_stream.npy", res)) < 0 ||
        (r = check_param(p, VCASE_KEY_D, c->d, "k_stream.npy", res)) < 0 ||
        (r = check_param(p, VCASE_KEY_HQ, c->hq, "q_stream.npy", res)) < 0)
        return r;
    if (p->prompt > c->T)
        return vcase_failf(res, "params.txt: prompt=%u exceeds the %u tokens of k_stream.npy",
                           p->prompt, c->T);
    c->prompt = p->prompt;
    return check_param(p, VCASE_KEY_STEPS, c->T - p->prompt, "k_stream.npy's T - prompt", res);
}

void vcase_trace_done(struct vcase_trace *c) {
    vase_npy_free(c->gauss);
    vase_npy_free(c->final);
    vase_npy_free(c->steps);
    vase_npy_free(c->qs);
    vase_npy_free(c->vs);
    vase_npy_free(c->ks);
}

const float *vcase_stream_row(const struct vase_npy *s, uint32_t heads, uint32_t d, uint32_t t,
                              uint32_t h) {
    return (const float *)s->data + ((size_t)t * heads + h) * d;
}

int vcase_trace_check_round(const struct vcase_trace *c, uint32_t round, uint32_t t,
                            struct vcase_result *res) {
    const int32_t *want = c->steps->data;

    if (round >= c->steps->shape[0])
        return vcase_failf(res, "eviction %u at t=%u, but evict_steps lists only %zu", round, t,
                           c->steps->shape[0]);
    if (want[round] < 0 || (uint32_t)want[round] != t)
        return vcase_failf(res, "eviction %u at t=%u, want t=%d", round, t, want[round]);
    return 0;
}

int vcase_trace_check_end(const struct vcase_trace *c, uint32_t rounds, uint32_t len,
                          struct vcase_result *res) {
    const int32_t *want = c->steps->data;

    /* Fewer rounds than listed (more is refused round by round), so want[rounds] exists. */
    if (rounds != c->steps->shape[0])
        return vcase_failf(res, "%u evictions, want %zu (the next at t=%d)", rounds,
                           c->steps->shape[0], want[rounds]);
    if (c->final->shape[1] != len)
        return vcase_failf(res, "final length %u, want %zu", len, c->final->shape[1]);
    return 0;
}

int vcase_trace_round_draws(struct vcase_trace *c, unsigned needs, uint32_t rank, uint32_t round,
                            uint32_t n, struct vase_npy **ret_exp, struct vcase_result *res) {
    struct vase_npy *exp = NULL, *gauss = NULL;
    char name[64];
    int r;

    if (needs & VASE_NEEDS_EXP) {
        snprintf(name, sizeof name, "exp_noise_%03u.npy", round);
        r = load(c->dir, name, false, &exp, res);
        if (r < 0)
            return r;
        r = check_exp(exp, name, c->hkv, n, "this round's N", res);
        if (r < 0)
            goto free_exp;
    }
    if (needs & VASE_NEEDS_GAUSS) {
        snprintf(name, sizeof name, "gauss_%03u.npy", round);
        r = load(c->dir, name, true, &gauss, res);
        if (r < 0)
            goto free_exp;
        if (gauss) {
            r = check_gauss(gauss, name, c->d, rank, res);
            if (r < 0) {
                vase_npy_free(gauss);
                goto free_exp;
            }
            vase_npy_free(c->gauss);
            c->gauss = gauss;
        } else if (!c->gauss) {
            r = vcase_failf(res, "round %u: no %s and no earlier sketch", round, name);
            goto free_exp;
        }
    }
    *ret_exp = exp;
    return 0;

free_exp:
    vase_npy_free(exp);
    return r;
}

/* ---- naming -------------------------------------------------------------------------- */

void vcase_name(const char *path, char *buf, size_t size) {
    size_t len = strlen(path);
    const char *base;

    while (len > 1 && path[len - 1] == '/')
        len--;
    base = path + len;
    while (base > path && base[-1] != '/')
        base--;
    snprintf(buf, size, "%.*s", (int)(path + len - base), base);
}

int vcase_replay_load(struct vcase_replay *c, const char *dir, struct vcase_result *res) {
    struct vcase_params p;
    int r;

    r = vcase_read_params(dir, true, &p, &c->policy, &c->params, res);
    if (r < 0)
        return r;
    c->needs = vase_policy_needs(c->policy);
    r = vcase_check_draws_present(c->policy, "exp_noise_000.npy",
                                  vcase_file_exists(dir, "exp_noise_000.npy"), "gauss_000.npy",
                                  vcase_file_exists(dir, "gauss_000.npy"), res);
    if (r < 0)
        return r;
    r = vase_params_check(&c->params, c->policy);
    if (r < 0)
        return vcase_failf(res, "vase_params_check() refuses the parameters of %s: %s", p.mode,
                           strerror(-r));
    if (p.window == 0 || p.budget <= p.window)
        return vcase_failf(res, "params.txt: need budget > window > 0");
    c->window = p.window;
    c->budget = p.budget;
    r = vcase_trace_load(&c->vc, dir, &p, res);
    if (r < 0)
        return r;
    if (c->vc.T == 0)
        return vcase_failf(res, "k_stream.npy: an empty axis");
    return 0;
}

/* ---- the driver ---------------------------------------------------------------------- */

void vcase_run_all(char *const *paths, size_t n, const uint32_t *blocks, size_t n_blocks,
                   vcase_run_fn run, const char *(*strerr)(int r), size_t *ret_passed,
                   size_t *ret_failed) {
    static const uint32_t unnamed = 0;
    bool named = n_blocks > 0;
    size_t passed = 0, failed = 0;

    if (!named) {
        blocks = &unnamed;
        n_blocks = 1;
    }
    for (size_t i = 0; i < n; i++)
        for (size_t b = 0; b < n_blocks; b++) {
            struct vcase_result res = {.msg = ""};
            char name[NAME_MAX + 1], shown[NAME_MAX + 16];

            vcase_name(paths[i], name, sizeof name);
            if (named)
                snprintf(shown, sizeof shown, "%s@%u", name, blocks[b]);
            else
                snprintf(shown, sizeof shown, "%s", name);
            int r = run(paths[i], name, blocks[b], &res);
            if (r < 0) {
                printf("FAIL %s: %s\n", shown, res.msg[0] ? res.msg : strerr(r));
                failed++;
            } else {
                printf("PASS %s\n", shown);
                passed++;
            }
            /* stderr carries the loader's details; keep the two in order on a terminal or a
             * log. */
            fflush(stdout);
        }
    printf("%zu passed, %zu failed\n", passed, failed);
    *ret_passed = passed;
    *ret_failed = failed;
}
