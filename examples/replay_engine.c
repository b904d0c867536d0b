/* SPDX-License-Identifier: MIT */

/*
 * replay_engine: replays the trace_* test vectors (shared/vectors/FORMAT.md) through a running
 * vased, as an engine would, and checks that the daemon and libvase together evict exactly what
 * the reference implementation evicted.
 *
 * For each case it registers a one-layer float32 model of the trace's geometry, opens a sync
 * sequence with the case's policy and parameters, prefills the prompt (K and V rows into the
 * slots, queries into the query ring) in one append, then decodes the remaining tokens one by
 * one. Before each append that the trigger rule says will evict, it injects that round's
 * recorded draws with vase_seq_set_draws(), so that the plan is the reference's.
 *
 * The engine cannot see plans, only what they did to its cache. So the token in each slot is
 * found by reading the slot's K row back from the arena and looking it up, bit for bit, among
 * the stream's K rows of that head (the lookup refuses a trace whose K rows are not unique, where
 * this would be ambiguous), and the slot's V row must then be that token's V row too. This runs
 * after every eviction, so a compaction that moved K and V differently, or lost a row, is caught
 * at the round where it happened; at the end the slots are compared with final_pos.
 *
 * Output, as tests/run_vectors: "PASS <case>" or "FAIL <case>: <first difference>" per case,
 * then "N passed, N failed"; the exit status is 0 only if at least one case ran and all passed.
 */

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "npy.h"
#include "vase.h"

/* params.txt is a dozen short lines. */
#define MAX_PARAMS_BYTES 65536
#define MAX_LINE 1024

static const char *arg_runtime_dir;

struct result {
    char msg[768];
};

static int failf(struct result *res, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int failf(struct result *res, const char *fmt, ...) {
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(res->msg, sizeof res->msg, fmt, ap);
    va_end(ap);
    return -EINVAL;
}

static int fail_call(struct result *res, struct vase_client *c, int r, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* A failed libvase call: the message, the call's errno, and the daemon's own words about it when
 * it sent some (vase_last_error()). Returns r. */
static int fail_call(struct result *res, struct vase_client *c, int r, const char *fmt, ...) {
    const char *detail = c ? vase_last_error(c) : "";
    size_t len;
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(res->msg, sizeof res->msg, fmt, ap);
    va_end(ap);
    len = strlen(res->msg);
    snprintf(res->msg + len, sizeof res->msg - len, ": %s%s%s%s", vase_strerror(r),
             detail[0] ? " (vased: " : "", detail, detail[0] ? ")" : "");
    return r;
}

/* ---- params.txt ------------------------------------------------------------------------ */

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

/* Every key the vectors' generator writes. An unknown key is an error: it would be a setting
 * this replay does not pass on to the daemon. */
static const char *const param_names[_P_MAX] = {
    [P_MODE] = "mode",         [P_HQ] = "Hq",
    [P_HKV] = "Hkv",           [P_D] = "D",
    [P_BUDGET] = "budget",     [P_WINDOW] = "window",
    [P_CUR_LEN] = "cur_len",   [P_PROMPT] = "prompt",
    [P_STEPS] = "steps",       [P_N_LARGE] = "n_large",
    [P_N_SINK] = "n_sink",     [P_TEMPERATURE] = "temperature",
    [P_LAMBDA] = "rkv_lambda", [P_SMOOTH] = "smooth_kernel",
    [P_RANK] = "sketch_rank",
};

struct case_params {
    unsigned seen; /* bit per param_key */
    char mode[64];
    uint32_t u[_P_MAX]; /* the integer settings */
    float temperature, lambda;
};

static bool has(const struct case_params *p, enum param_key k) {
    return p->seen & (1u << k);
}

static bool is_space(char ch) {
    return ch == ' ' || ch == '\t' || ch == '\r' || ch == '\n';
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

/* A decimal unsigned 32-bit number and nothing else. */
static int parse_u32(const char *s, uint32_t *ret) {
    unsigned long long v;
    char *end;

    if (s[0] < '0' || s[0] > '9')
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

    if (s[0] == '\0')
        return -EINVAL;
    errno = 0;
    v = strtof(s, &end);
    if (end == s || *end != '\0')
        return -EINVAL;
    if (errno == ERANGE)
        return -ERANGE;
    if (!isfinite(v))
        return -EINVAL;
    *ret = v;
    return 0;
}

static int join_path(char *buf, size_t size, const char *dir, const char *name) {
    size_t len = strlen(dir);
    int n = snprintf(buf, size, len > 0 && dir[len - 1] == '/' ? "%s%s" : "%s/%s", dir, name);

    return n < 0 || (size_t)n >= size ? -ENAMETOOLONG : 0;
}

static int parse_line(struct case_params *p, char *line, unsigned lineno, struct result *res) {
    char *eq = strchr(line, '='), *key, *value;
    int k, r;

    if (!eq)
        return failf(res, "params.txt:%u: expected key=value", lineno);
    *eq = '\0';
    key = trim(line);
    value = trim(eq + 1);
    for (k = 0; k < _P_MAX; k++)
        if (strcmp(param_names[k], key) == 0)
            break;
    if (k == _P_MAX)
        return failf(res, "params.txt:%u: unknown key '%s'", lineno, key);
    if (has(p, k))
        return failf(res, "params.txt:%u: duplicate key '%s'", lineno, key);

    switch (k) {
    case P_MODE:
        r = value[0] == '\0' || strlen(value) >= sizeof p->mode ? -EINVAL : 0;
        if (r == 0)
            strcpy(p->mode, value);
        break;
    case P_TEMPERATURE:
        r = parse_f32(value, &p->temperature);
        break;
    case P_LAMBDA:
        r = parse_f32(value, &p->lambda);
        break;
    default:
        r = parse_u32(value, &p->u[k]);
        break;
    }
    if (r < 0)
        return failf(res, "params.txt:%u: invalid value for %s: '%s' (%s)", lineno, key, value,
                     strerror(-r));
    p->seen |= 1u << k;
    return 0;
}

static int read_params(const char *dir, struct case_params *ret, struct result *res) {
    struct case_params p = {.seen = 0};
    char path[PATH_MAX], *line = NULL;
    unsigned lineno = 0;
    size_t cap = 0;
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
    if (!has(&p, P_MODE) || !has(&p, P_BUDGET) || !has(&p, P_WINDOW) || !has(&p, P_PROMPT)) {
        r = failf(res, "params.txt: missing %s",
                  !has(&p, P_MODE)     ? "mode"
                  : !has(&p, P_BUDGET) ? "budget"
                  : !has(&p, P_WINDOW) ? "window"
                                       : "prompt");
        goto free_line;
    }
    *ret = p;

free_line:
    free(line);
close_file:
    fclose(f);
    return r;
}

/* ---- one case ------------------------------------------------------------------------- */

/* A K row of the stream, by content: rows sorted by (hash, token) for a binary search. */
struct row_key {
    uint64_t hash;
    uint32_t token;
};

struct replay {
    const char *dir;
    enum vase_policy policy;
    unsigned needs;
    struct vase_params params;
    uint32_t T, prompt, hkv, hq, d, window, budget;

    struct vase_npy *ks, *vs, *qs; /* [T][Hkv][D], [T][Hkv][D], [T][Hq][D] */
    struct vase_npy *steps;        /* [rounds] */
    struct vase_npy *final;        /* [Hkv][len] */
    struct vase_npy *gauss;        /* the sketch of the latest round that had one */
    struct row_key *index;         /* [Hkv][T] */
    uint32_t *pos;                 /* [Hkv][T]: the token found in each slot */
    uint8_t *seen;                 /* [T] */

    struct vase_client *client;
    struct vase_model *model;
    struct vase_seq *seq;
    uint32_t rounds;
};

static void replay_done(struct replay *rp) {
    /* The model stays registered with the client until the client goes. */
    vase_seq_close(rp->seq);
    free(rp->seen);
    free(rp->pos);
    free(rp->index);
    vase_npy_free(rp->gauss);
    vase_npy_free(rp->final);
    vase_npy_free(rp->steps);
    vase_npy_free(rp->qs);
    vase_npy_free(rp->vs);
    vase_npy_free(rp->ks);
}

static const float *stream_row(const struct vase_npy *s, uint32_t heads, uint32_t d, uint32_t t,
                               uint32_t h) {
    return (const float *)s->data + ((size_t)t * heads + h) * d;
}

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

/* a has dtype 'f' or 'i' and ndim dimensions; shape[axis] == want where want is given. */
static int check_shape(const struct vase_npy *a, const char *name, char dtype, unsigned ndim,
                       const int64_t *want, struct result *res) {
    if (a->dtype != dtype || a->ndim != ndim)
        return failf(res, "%s: want a %u-dimensional %s array", name, ndim,
                     vase_npy_dtype_name(dtype));
    for (unsigned i = 0; i < ndim; i++)
        if (want[i] >= 0 && a->shape[i] != (size_t)want[i])
            return failf(res, "%s: axis %u is %zu, want %lld", name, i, a->shape[i],
                         (long long)want[i]);
    return 0;
}

static uint64_t hash_row(const float *row, uint32_t d) {
    const unsigned char *p = (const unsigned char *)row;
    uint64_t h = 0xcbf29ce484222325ull;

    for (size_t i = 0; i < (size_t)d * sizeof(float); i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static int cmp_row_key(const void *a, const void *b) {
    const struct row_key *x = a, *y = b;

    if (x->hash != y->hash)
        return x->hash < y->hash ? -1 : 1;
    return x->token < y->token ? -1 : x->token > y->token;
}

/* Indexes every head's K rows by content; refuses duplicates, which would make a slot's token
 * ambiguous. */
static int build_index(struct replay *rp, struct result *res) {
    size_t row = (size_t)rp->d * sizeof(float);

    rp->index = calloc((size_t)rp->hkv * rp->T, sizeof *rp->index);
    if (!rp->index)
        return failf(res, "out of memory");
    for (uint32_t h = 0; h < rp->hkv; h++) {
        struct row_key *ix = rp->index + (size_t)h * rp->T;

        for (uint32_t t = 0; t < rp->T; t++)
            ix[t] = (struct row_key){hash_row(stream_row(rp->ks, rp->hkv, rp->d, t, h), rp->d), t};
        qsort(ix, rp->T, sizeof *ix, cmp_row_key);
        for (uint32_t i = 1; i < rp->T; i++)
            if (ix[i].hash == ix[i - 1].hash &&
                memcmp(stream_row(rp->ks, rp->hkv, rp->d, ix[i].token, h),
                       stream_row(rp->ks, rp->hkv, rp->d, ix[i - 1].token, h), row) == 0)
                return failf(res,
                             "k_stream.npy: tokens %u and %u have identical K rows in head %u, so "
                             "slots cannot be told apart by their contents",
                             ix[i - 1].token, ix[i].token, h);
    }
    return 0;
}

/* The token whose K row of head h is k, or -1. */
static int64_t lookup(const struct replay *rp, uint32_t h, const float *k) {
    const struct row_key *ix = rp->index + (size_t)h * rp->T;
    uint64_t hash = hash_row(k, rp->d);
    size_t lo = 0, hi = rp->T;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;

        if (ix[mid].hash < hash)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (; lo < rp->T && ix[lo].hash == hash; lo++)
        if (memcmp(stream_row(rp->ks, rp->hkv, rp->d, ix[lo].token, h), k,
                   (size_t)rp->d * sizeof(float)) == 0)
            return ix[lo].token;
    return -1;
}

/* Reads every live slot back from the arena and finds its token: K must be a stream row, V the
 * same token's V row, and no token may sit in two slots of a head. */
static int identify_slots(struct replay *rp, const char *when, struct result *res) {
    uint32_t len = vase_seq_len(rp->seq);
    size_t row = (size_t)rp->d * sizeof(float);

    if (len > rp->T)
        return failf(res, "%s: length %u exceeds the %u tokens of the stream", when, len, rp->T);
    for (uint32_t h = 0; h < rp->hkv; h++) {
        memset(rp->seen, 0, rp->T);
        for (uint32_t s = 0; s < len; s++) {
            const float *k = vase_seq_kv_ptr(rp->seq, 0, VASE_K, s, h);
            const float *v = vase_seq_kv_ptr(rp->seq, 0, VASE_V, s, h);
            int64_t t;

            if (!k || !v)
                return failf(res,
                             "%s: vase_seq_kv_ptr() has no address for slot %u of head %u "
                             "(len %u, capacity %u)",
                             when, s, h, len, vase_seq_capacity(rp->seq));
            t = lookup(rp, h, k);
            if (t < 0)
                return failf(res, "%s: head %u slot %u holds a K row that is no token's", when, h,
                             s);
            if (memcmp(v, stream_row(rp->vs, rp->hkv, rp->d, (uint32_t)t, h), row) != 0)
                return failf(res,
                             "%s: head %u slot %u holds the K row of token %lld but another "
                             "V row",
                             when, h, s, (long long)t);
            if (rp->seen[t])
                return failf(res, "%s: head %u holds token %lld twice (again in slot %u)", when, h,
                             (long long)t, s);
            rp->seen[t] = 1;
            rp->pos[(size_t)h * rp->T + s] = (uint32_t)t;
        }
    }
    return 0;
}

static int setup(struct replay *rp, struct result *res) {
    struct case_params p;
    enum vase_metric metric = VASE_METRIC_RANGE;
    int r;

    r = read_params(rp->dir, &p, res);
    if (r < 0)
        return r;
    if (vase_policy_from_mode(p.mode, &rp->policy, &metric) < 0 &&
        vase_policy_from_string(p.mode, &rp->policy) < 0)
        return failf(res, "unknown mode '%s'", p.mode);
    rp->needs = vase_policy_needs(rp->policy);
    rp->budget = p.u[P_BUDGET];
    rp->window = p.u[P_WINDOW];
    rp->prompt = p.u[P_PROMPT];
    rp->params = vase_params_default(rp->budget);
    rp->params.window = rp->window;
    rp->params.metric = metric;
    if (has(&p, P_N_SINK))
        rp->params.n_sink = p.u[P_N_SINK];
    if (has(&p, P_N_LARGE))
        rp->params.n_large = p.u[P_N_LARGE];
    if (has(&p, P_SMOOTH))
        rp->params.smooth = p.u[P_SMOOTH];
    if (has(&p, P_RANK))
        rp->params.rank = p.u[P_RANK];
    if (has(&p, P_TEMPERATURE))
        rp->params.temperature = p.temperature;
    if (has(&p, P_LAMBDA))
        rp->params.lambda = p.lambda;
    r = vase_params_check(&rp->params, rp->policy);
    if (r < 0)
        return failf(res, "vase_params_check() refuses the parameters of %s: %s", p.mode,
                     strerror(-r));

    if ((r = load(rp->dir, "k_stream.npy", false, &rp->ks, res)) < 0 ||
        (r = load(rp->dir, "v_stream.npy", false, &rp->vs, res)) < 0 ||
        (r = load(rp->dir, "q_stream.npy", false, &rp->qs, res)) < 0 ||
        (r = load(rp->dir, "evict_steps.npy", false, &rp->steps, res)) < 0 ||
        (r = load(rp->dir, "final_pos.npy", false, &rp->final, res)) < 0)
        return r;
    if ((r = check_shape(rp->ks, "k_stream.npy", 'f', 3, (int64_t[]){-1, -1, -1}, res)) < 0)
        return r;
    rp->T = (uint32_t)rp->ks->shape[0];
    rp->hkv = (uint32_t)rp->ks->shape[1];
    rp->d = (uint32_t)rp->ks->shape[2];
    if (rp->T == 0 || rp->hkv == 0 || rp->d == 0)
        return failf(res, "k_stream.npy: an empty axis");
    if ((r = check_shape(rp->vs, "v_stream.npy", 'f', 3, (int64_t[]){rp->T, rp->hkv, rp->d}, res)) <
            0 ||
        (r = check_shape(rp->qs, "q_stream.npy", 'f', 3, (int64_t[]){rp->T, -1, rp->d}, res)) < 0 ||
        (r = check_shape(rp->steps, "evict_steps.npy", 'i', 1, (int64_t[]){-1}, res)) < 0 ||
        (r = check_shape(rp->final, "final_pos.npy", 'i', 2, (int64_t[]){rp->hkv, -1}, res)) < 0)
        return r;
    rp->hq = (uint32_t)rp->qs->shape[1];
    if (rp->hq == 0 || rp->hq % rp->hkv != 0)
        return failf(res, "q_stream.npy: %u query heads is not a multiple of %u KV heads", rp->hq,
                     rp->hkv);
    if ((has(&p, P_HKV) && p.u[P_HKV] != rp->hkv) || (has(&p, P_HQ) && p.u[P_HQ] != rp->hq) ||
        (has(&p, P_D) && p.u[P_D] != rp->d))
        return failf(res, "params.txt: Hq/Hkv/D disagree with the streams (%u/%u/%u)", rp->hq,
                     rp->hkv, rp->d);
    if (rp->prompt > rp->T)
        return failf(res, "params.txt: prompt=%u exceeds the %u tokens of the stream", rp->prompt,
                     rp->T);
    if (has(&p, P_STEPS) && p.u[P_STEPS] != rp->T - rp->prompt)
        return failf(res, "params.txt: steps=%u, but the stream has %u tokens after the prompt",
                     p.u[P_STEPS], rp->T - rp->prompt);

    rp->pos = calloc((size_t)rp->hkv * rp->T, sizeof *rp->pos);
    rp->seen = calloc(rp->T, 1);
    if (!rp->pos || !rp->seen)
        return failf(res, "out of memory");
    return build_index(rp, res);
}

/* Writes token t's K and V into slot, and its query into the ring. */
static int write_token(struct replay *rp, uint32_t t, uint32_t slot, bool query,
                       struct result *res) {
    size_t row = (size_t)rp->d * sizeof(float);

    for (uint32_t h = 0; h < rp->hkv; h++) {
        void *k = vase_seq_kv_ptr(rp->seq, 0, VASE_K, slot, h);
        void *v = vase_seq_kv_ptr(rp->seq, 0, VASE_V, slot, h);

        if (!k || !v)
            return failf(res, "t=%u: vase_seq_kv_ptr() has no address for slot %u (capacity %u)", t,
                         slot, vase_seq_capacity(rp->seq));
        memcpy(k, stream_row(rp->ks, rp->hkv, rp->d, t, h), row);
        memcpy(v, stream_row(rp->vs, rp->hkv, rp->d, t, h), row);
    }
    if (!query || !(rp->needs & VASE_NEEDS_Q))
        return 0;
    for (uint32_t h = 0; h < rp->hq; h++) {
        void *q = vase_seq_query_ptr(rp->seq, 0, t, h);

        if (!q)
            return failf(res,
                         "t=%u: vase_seq_query_ptr() is NULL for a policy that reads "
                         "queries",
                         t);
        memcpy(q, stream_row(rp->qs, rp->hq, rp->d, t, h), row);
    }
    return 0;
}

/* Hands the daemon the draws of the coming round: the Exp(1) draws from exp_noise_NNN.npy,
 * and the sketch from gauss_NNN.npy or, when this round has none (cur_fixed_gauss draws once),
 * the latest earlier one. */
static int inject_draws(struct replay *rp, uint32_t round, uint32_t n, struct result *res) {
    struct vase_npy *exp = NULL, *gauss = NULL;
    char name[64];
    int r;

    if (rp->needs & VASE_NEEDS_EXP) {
        snprintf(name, sizeof name, "exp_noise_%03u.npy", round);
        if ((r = load(rp->dir, name, false, &exp, res)) < 0)
            return r;
        if ((r = check_shape(exp, name, 'f', 2, (int64_t[]){rp->hkv, n}, res)) < 0)
            goto free_exp;
    }
    if (rp->needs & VASE_NEEDS_GAUSS) {
        snprintf(name, sizeof name, "gauss_%03u.npy", round);
        if ((r = load(rp->dir, name, true, &gauss, res)) < 0)
            goto free_exp;
        if (gauss) {
            r = check_shape(gauss, name, 'f', 2, (int64_t[]){rp->d, rp->params.rank}, res);
            if (r < 0) {
                vase_npy_free(gauss);
                goto free_exp;
            }
            vase_npy_free(rp->gauss);
            rp->gauss = gauss;
        } else if (!rp->gauss) {
            r = failf(res, "round %u: no %s and no earlier sketch", round, name);
            goto free_exp;
        }
    }
    /* One layer, so the [layers][kv_heads][N] draws of the request are the file's [Hkv][N]. */
    r = vase_seq_set_draws(rp->seq, exp ? exp->data : NULL, exp ? exp->count : 0,
                           (rp->needs & VASE_NEEDS_GAUSS) ? rp->gauss->data : NULL,
                           (rp->needs & VASE_NEEDS_GAUSS) ? rp->gauss->count : 0);
    if (r < 0)
        r = fail_call(res, rp->client, r, "round %u: vase_seq_set_draws() failed", round);

free_exp:
    vase_npy_free(exp);
    return r;
}

/* Decodes token t; an eviction it triggers must be the next of evict_steps. */
static int decode(struct replay *rp, uint32_t t, struct result *res) {
    const int32_t *want = rp->steps->data;
    uint32_t len = vase_seq_len(rp->seq), rounds = (uint32_t)rp->steps->shape[0];
    bool trigger = len + 1 > rp->budget && (len + 1) % rp->window == 0;
    char when[64];
    int r;

    if (vase_seq_position(rp->seq) != t)
        return failf(res, "t=%u: libvase's position is %llu", t,
                     (unsigned long long)vase_seq_position(rp->seq));
    r = write_token(rp, t, len, true, res);
    if (r < 0)
        return r;
    if (trigger) {
        if (rp->rounds >= rounds || want[rp->rounds] < 0 || (uint32_t)want[rp->rounds] != t)
            return rp->rounds < rounds
                       ? failf(res, "eviction %u at t=%u, want t=%d", rp->rounds, t,
                               want[rp->rounds])
                       : failf(res, "eviction %u at t=%u, but evict_steps lists only %u",
                               rp->rounds, t, rounds);
        r = inject_draws(rp, rp->rounds, len + 1 - rp->window, res);
        if (r < 0)
            return r;
    }

    r = vase_seq_append(rp->seq, 1);
    if (r < 0)
        return fail_call(res, rp->client, r, "t=%u (len %u): vase_seq_append() failed", t, len);
    if (trigger != (r > 0))
        return failf(res, "t=%u (len %u -> %u): %s", t, len, len + 1,
                     trigger ? "the trigger rule evicts here, but the sync append applied no plan"
                             : "the append applied a plan the trigger rule does not call for");
    if (!trigger)
        return 0;

    snprintf(when, sizeof when, "after eviction %u (t=%u)", rp->rounds, t);
    rp->rounds++;
    if (vase_seq_rounds(rp->seq) != rp->rounds)
        return failf(res, "%s: libvase counts %u rounds", when, vase_seq_rounds(rp->seq));
    if (vase_seq_len(rp->seq) != rp->budget)
        return failf(res, "%s: length %u, want the budget %u", when, vase_seq_len(rp->seq),
                     rp->budget);
    return identify_slots(rp, when, res);
}

/* Each case has a client of its own, so that cases cannot affect one another and no number of
 * cases runs into the daemon's per-client model quota. */
static int run_case(const char *dir, const char *name, struct result *res) {
    struct replay rp = {.dir = dir};
    char model_name[80];
    const int32_t *want;
    uint32_t len;
    int r;

    r = setup(&rp, res);
    if (r < 0)
        goto out;
    r = vase_connect(
        &(struct vase_connect_options){.runtime_dir = arg_runtime_dir, .name = "replay_engine"},
        &rp.client);
    if (r < 0) {
        r = failf(res, "cannot connect to vased: %s%s", vase_strerror(r),
                  r == -ENOENT || r == -ECONNREFUSED ? " (is vased running?)" : "");
        goto out;
    }

    snprintf(model_name, sizeof model_name, "replay-%.64s", name);
    r = vase_model_register(rp.client,
                            &(struct vase_geometry){
                                .name = model_name,
                                .layers = 1,
                                .q_heads = rp.hq,
                                .kv_heads = rp.hkv,
                                .head_dim = rp.d,
                                .dtype = VASE_DTYPE_F32,
                            },
                            &rp.model);
    if (r < 0) {
        r = fail_call(res, rp.client, r,
                      "vase_model_register(1 layer, %u/%u heads, dim %u, f32) failed", rp.hq,
                      rp.hkv, rp.d);
        goto out;
    }
    r = vase_seq_open(rp.client, rp.model,
                      &(struct vase_seq_config){
                          .policy = rp.policy,
                          .params = rp.params,
                          .prompt_len = rp.prompt,
                          .mode = VASE_MODE_SYNC,
                          .slack = -1,
                      },
                      &rp.seq);
    if (r < 0) {
        r = fail_call(res, rp.client, r,
                      "vase_seq_open(%s, budget %u, window %u, prompt %u) failed",
                      vase_policy_to_string(rp.policy), rp.budget, rp.window, rp.prompt);
        goto out;
    }

    /* Prefill in one append, as an engine does. Only the last 2 * window queries can still be
     * in the ring afterwards, and only those are written. */
    for (uint32_t t = 0; t < rp.prompt; t++) {
        r = write_token(&rp, t, t, rp.prompt - t <= 2 * rp.window, res);
        if (r < 0)
            goto out;
    }
    if (rp.prompt > 0) {
        r = vase_seq_append(rp.seq, rp.prompt);
        if (r != 0) {
            r = r < 0 ? fail_call(res, rp.client, r, "the prompt's append failed")
                      : failf(res, "the prompt's append applied a plan: prefill never evicts");
            goto out;
        }
    }
    for (uint32_t t = rp.prompt; t < rp.T; t++) {
        r = decode(&rp, t, res);
        if (r < 0)
            goto out;
    }

    want = rp.steps->data;
    if (rp.rounds != rp.steps->shape[0]) {
        r = failf(res, "%u evictions, want %zu (the next at t=%d)", rp.rounds, rp.steps->shape[0],
                  want[rp.rounds]);
        goto out;
    }
    len = vase_seq_len(rp.seq);
    if (rp.final->shape[1] != len) {
        r = failf(res, "final length %u, want %zu", len, rp.final->shape[1]);
        goto out;
    }
    r = identify_slots(&rp, "at the end", res);
    if (r < 0)
        goto out;
    for (uint32_t h = 0; h < rp.hkv; h++)
        for (uint32_t s = 0; s < len; s++) {
            int32_t w = ((const int32_t *)rp.final->data)[(size_t)h * len + s];
            uint32_t got = rp.pos[(size_t)h * rp.T + s];

            if (w < 0 || (uint32_t)w != got) {
                r = failf(res, "final_pos: head %u slot %u holds token %u, want %d", h, s, got, w);
                goto out;
            }
        }

out:
    replay_done(&rp);
    vase_disconnect(rp.client);
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

static void help(void) {
    printf(
        "Usage: %s [--runtime-dir DIR] CASE_DIR...\n"
        "Replays trace_* test vectors through a running vased (sync mode, injected draws)\n"
        "and compares the evictions and the final slots exactly.\n"
        "\n"
        "      --runtime-dir=DIR  vased's runtime directory ($VASE_RUNTIME_DIR, /run/vase, ./run)\n"
        "  -h --help              show this help\n",
        program_invocation_short_name);
}

/* Returns < 0 on a usage error, 0 to exit successfully (help), > 0 to go on. */
static int parse_argv(int argc, char **argv) {
    static const struct option options[] = {
        {"runtime-dir", required_argument, NULL, 'r'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c;

    while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0)
        switch (c) {
        case 'h':
            help();
            return 0;
        case 'r':
            arg_runtime_dir = optarg;
            break;
        default:
            return -EINVAL;
        }
    if (optind == argc) {
        fprintf(stderr, "%s: no case directories given\n", program_invocation_short_name);
        return -EINVAL;
    }
    return 1;
}

int main(int argc, char **argv) {
    unsigned passed = 0, failed = 0;
    int r;

    r = parse_argv(argc, argv);
    if (r <= 0)
        return r < 0 ? 2 : 0;

    for (int i = optind; i < argc; i++) {
        struct result res = {.msg = ""};
        char name[NAME_MAX + 1];

        case_name(argv[i], name, sizeof name);
        r = run_case(argv[i], name, &res);
        if (r < 0) {
            printf("FAIL %s: %s\n", name, res.msg[0] ? res.msg : vase_strerror(r));
            failed++;
        } else {
            printf("PASS %s\n", name);
            passed++;
        }
        /* stderr carries the loader's details; keep the two in order on a terminal or a log. */
        fflush(stdout);
    }
    printf("%u passed, %u failed\n", passed, failed);
    return failed == 0 && passed > 0 ? 0 : 1;
}
