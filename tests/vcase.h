/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * One eviction test-vector case (tests/vectors/FORMAT.md) as read from its directory: the
 * settings of params.txt, the arrays of a single_* or trace_* case with every shape checked
 * against the others and against params.txt, and the injected draws of a trace's rounds. Used by
 * tests/run_vectors (the CPU kernels) and tests/replay_engine (a running vased), so that both
 * read the same vectors the same way.
 *
 * Every function that can fail returns 0 or a negative errno (-EINVAL for a malformed case) and
 * records the first reason in a struct vcase_result; nothing is printed here (the .npy loader
 * writes its own one-line details to stderr), but for the driver that runs the cases and prints
 * their results, the same for both programs.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "npy.h"
#include "vase_kernels.h"

/* Why a case failed, as one line: the first reason only, later ones being consequences. */
struct vcase_result {
    char msg[768];
};

/* Records the reason in res unless one is there already. Returns -EINVAL. */
int vcase_failf(struct vcase_result *res, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---- params.txt ---------------------------------------------------------------------- */

/* Every key params.txt may hold. */
enum vcase_key {
    VCASE_KEY_MODE,
    VCASE_KEY_HQ,
    VCASE_KEY_HKV,
    VCASE_KEY_D,
    VCASE_KEY_BUDGET,
    VCASE_KEY_WINDOW,
    VCASE_KEY_CUR_LEN,
    VCASE_KEY_PROMPT,
    VCASE_KEY_STEPS,
    VCASE_KEY_N_LARGE,
    VCASE_KEY_N_SINK,
    VCASE_KEY_TEMPERATURE,
    VCASE_KEY_LAMBDA,
    VCASE_KEY_SMOOTH,
    VCASE_KEY_RANK,
    VCASE_KEY_PROTECT_PROMPT,
    _VCASE_KEY_MAX,
};

struct vcase_params {
    char mode[64];
    uint32_t hq, hkv, d;
    uint32_t budget, window, cur_len, prompt, steps;
    uint32_t n_large, n_sink, rank, smooth;
    uint32_t protect_prompt; /* 1: the first `prompt` slots are protected (needs prompt) */
    float temperature, lambda;
    uint32_t seen; /* bit k: key k was given */
};

/* Whether params.txt gave key k. */
bool vcase_has(const struct vcase_params *p, enum vcase_key k);

/*
 * Reads dir/params.txt into *ret, and the policy it names and the kernel parameters it gives
 * into *ret_policy and *ret_params (not yet checked with vase_params_check()). An unknown or
 * repeated key, a malformed value, or a missing mode, budget or window (or prompt, for a trace
 * or with protect_prompt) is an error. The settings it does not give default as
 * vase_params_default(budget) has them. mode is the reference's name, which implies the value
 * metric; a policy without one (streaming, random, h2o) may be named as vase spells it, with the
 * default metric. Nothing is written on failure.
 */
int vcase_read_params(const char *dir, bool trace, struct vcase_params *ret,
                      enum vase_policy *ret_policy, struct vase_params *ret_params,
                      struct vcase_result *res);

/*
 * Whether the draw files of a case are those its policy uses, no more and no fewer (exp_name and
 * gauss_name name the files for the message), and the policy needs nothing vectors lack.
 */
int vcase_check_draws_present(enum vase_policy policy, const char *exp_name, bool have_exp,
                              const char *gauss_name, bool have_gauss, struct vcase_result *res);

/* dir/name into buf; -ENAMETOOLONG if it does not fit. */
int vcase_join_path(char *buf, size_t size, const char *dir, const char *name);

/* Whether dir/name exists. */
bool vcase_file_exists(const char *dir, const char *name);

/* ---- single_*: one eviction ---------------------------------------------------------- */

struct vcase_single {
    uint32_t hkv, hq, n, d;
    uint32_t K;             /* budget - window: the candidates a plan keeps per head */
    struct vase_npy *k, *v; /* [Hkv][N][D] */
    struct vase_npy *q;     /* [Hq][W][D] */
    struct vase_npy *keep;  /* [Hkv][K] */
    struct vase_npy *exp;   /* [Hkv][N], or NULL where the policy draws none */
    struct vase_npy *gauss; /* [D][r], or NULL where the policy draws none */
};

/*
 * Loads the arrays of a single_* case into *c (zero-initialised by the caller) and checks their
 * shapes against one another and against p, and the draw files against the policy. Whatever it
 * loaded stays in *c, on failure too: free it with vcase_single_done().
 */
int vcase_single_load(struct vcase_single *c, const char *dir, const struct vcase_params *p,
                      enum vase_policy policy, struct vcase_result *res);

void vcase_single_done(struct vcase_single *c);

/* ---- trace_*: a whole generation ----------------------------------------------------- */

struct vcase_trace {
    const char *dir;
    uint32_t T, prompt, hkv, hq, d;
    struct vase_npy *ks, *vs, *qs; /* [T][Hkv][D], [T][Hkv][D], [T][Hq][D] */
    struct vase_npy *steps;        /* [rounds] */
    struct vase_npy *final;        /* [Hkv][len] */
    struct vase_npy *gauss;        /* the sketch of the latest round that had one */
};

/*
 * Loads the streams, evict_steps and final_pos of a trace_* case into *c (zero-initialised by
 * the caller) and checks their shapes against one another and against p (read with trace set).
 * The case's directory must outlive *c. Whatever it loaded stays in *c, on failure too: free it
 * with vcase_trace_done().
 */
int vcase_trace_load(struct vcase_trace *c, const char *dir, const struct vcase_params *p,
                     struct vcase_result *res);

void vcase_trace_done(struct vcase_trace *c);

/* A trace_* case as both replayers take it: its arrays and its policy's settings, checked. */
struct vcase_replay {
    struct vcase_trace vc; /* the case's arrays, T, prompt, Hkv, Hq and D */
    enum vase_policy policy;
    unsigned needs; /* vase_policy_needs(policy) */
    struct vase_params params;
    uint32_t window, budget;
};

/*
 * Reads params.txt of the trace_* case at dir and loads its arrays into *c (zero-initialised by
 * the caller; free with vcase_trace_done(&c->vc), on failure too): the parameters must pass
 * vase_params_check(), budget > window > 0, the draw files must be those the policy uses, and
 * the stream must have tokens.
 */
int vcase_replay_load(struct vcase_replay *c, const char *dir, struct vcase_result *res);

/* Row t of a [T][heads][d] stream, for head h. */
const float *vcase_stream_row(const struct vase_npy *s, uint32_t heads, uint32_t d, uint32_t t,
                              uint32_t h);

/* Whether the eviction triggered by the append of token t is round `round` of evict_steps. */
int vcase_trace_check_round(const struct vcase_trace *c, uint32_t round, uint32_t t,
                            struct vcase_result *res);

/* Whether a generation that ended after `rounds` evictions with `len` slots per head did as many
 * evictions as evict_steps lists and ended as long as final_pos. */
int vcase_trace_check_end(const struct vcase_trace *c, uint32_t rounds, uint32_t len,
                          struct vcase_result *res);

/*
 * The draws of eviction round `round`, of n candidates, for a policy that needs what `needs`
 * says (vase_policy_needs()) with a sketch of the given rank. The Exp(1) draws of
 * exp_noise_NNN.npy come back in *ret_exp (NULL where the policy draws none; the caller frees
 * them). The sketch of gauss_NNN.npy replaces c->gauss; a round without one keeps the latest
 * earlier sketch (cur_fixed_gauss draws once), and it is an error where there is none.
 */
int vcase_trace_round_draws(struct vcase_trace *c, unsigned needs, uint32_t rank, uint32_t round,
                            uint32_t n, struct vase_npy **ret_exp, struct vcase_result *res);

/* ---- naming -------------------------------------------------------------------------- */

/* The name of the case at path: the directory's basename, trailing slashes ignored. */
void vcase_name(const char *path, char *buf, size_t size);

/* ---- the driver ---------------------------------------------------------------------- */

/* Runs one case: the directory at path, its name, with pages of block tokens (0: as the program
 * does without --block). 0 if it passed, else -errno with the reason in res. */
typedef int (*vcase_run_fn)(const char *path, const char *name, uint32_t block,
                            struct vcase_result *res);

/*
 * Runs each of the n cases at paths once per block size of blocks (n_blocks of them, each
 * result named CASE@N), or once with block 0 and named CASE when n_blocks is 0, printing
 * "PASS <name>" or "FAIL <name>: <reason>" for each on stdout (strerr(r) as the reason when the
 * case recorded none), then "N passed, N failed". Stores the counts.
 */
void vcase_run_all(char *const *paths, size_t n, const uint32_t *blocks, size_t n_blocks,
                   vcase_run_fn run, const char *(*strerr)(int r), size_t *ret_passed,
                   size_t *ret_failed);
