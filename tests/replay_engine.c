/* SPDX-License-Identifier: MIT */

/*
 * replay_engine: replays the trace_* test vectors (tests/vectors/FORMAT.md) through a running
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
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "argnum.h"
#include "npy.h"
#include "vase.h"
#include "vcase.h"

static const char *arg_runtime_dir;
/* Block sizes each case is replayed with (--block); 0 is the library's default. */
#define MAX_BLOCKS 8
static uint32_t arg_blocks[MAX_BLOCKS];
static size_t arg_n_blocks;

static int fail_call(struct vcase_result *res, struct vase_client *c, int r, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* A failed libvase call: the message, the call's errno, and the daemon's own words about it when
 * it sent some (vase_last_error()). Returns r. */
static int fail_call(struct vcase_result *res, struct vase_client *c, int r, const char *fmt, ...) {
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

/* ---- one case ------------------------------------------------------------------------- */

/* A K row of the stream, by content: rows sorted by (hash, token) for a binary search. */
struct row_key {
    uint64_t hash;
    uint32_t token;
};

struct replay {
    struct vcase_replay c; /* the case */

    struct row_key *index; /* [Hkv][T] */
    uint32_t *pos;         /* [Hkv][T]: the token found in each slot */
    uint8_t *seen;         /* [T] */

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
    vcase_trace_done(&rp->c.vc);
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
static int build_index(struct replay *rp, struct vcase_result *res) {
    size_t row = (size_t)rp->c.vc.d * sizeof(float);

    rp->index = calloc((size_t)rp->c.vc.hkv * rp->c.vc.T, sizeof *rp->index);
    if (!rp->index)
        return vcase_failf(res, "out of memory");
    for (uint32_t h = 0; h < rp->c.vc.hkv; h++) {
        struct row_key *ix = rp->index + (size_t)h * rp->c.vc.T;

        for (uint32_t t = 0; t < rp->c.vc.T; t++)
            ix[t] = (struct row_key){
                hash_row(vcase_stream_row(rp->c.vc.ks, rp->c.vc.hkv, rp->c.vc.d, t, h), rp->c.vc.d),
                t};
        qsort(ix, rp->c.vc.T, sizeof *ix, cmp_row_key);
        for (uint32_t i = 1; i < rp->c.vc.T; i++)
            if (ix[i].hash == ix[i - 1].hash &&
                memcmp(vcase_stream_row(rp->c.vc.ks, rp->c.vc.hkv, rp->c.vc.d, ix[i].token, h),
                       vcase_stream_row(rp->c.vc.ks, rp->c.vc.hkv, rp->c.vc.d, ix[i - 1].token, h),
                       row) == 0)
                return vcase_failf(
                    res,
                    "k_stream.npy: tokens %u and %u have identical K rows in head %u, so "
                    "slots cannot be told apart by their contents",
                    ix[i - 1].token, ix[i].token, h);
    }
    return 0;
}

/* The token whose K row of head h is k, or -1. */
static int64_t lookup(const struct replay *rp, uint32_t h, const float *k) {
    const struct row_key *ix = rp->index + (size_t)h * rp->c.vc.T;
    uint64_t hash = hash_row(k, rp->c.vc.d);
    size_t lo = 0, hi = rp->c.vc.T;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;

        if (ix[mid].hash < hash)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (; lo < rp->c.vc.T && ix[lo].hash == hash; lo++)
        if (memcmp(vcase_stream_row(rp->c.vc.ks, rp->c.vc.hkv, rp->c.vc.d, ix[lo].token, h), k,
                   (size_t)rp->c.vc.d * sizeof(float)) == 0)
            return ix[lo].token;
    return -1;
}

/* Reads every live slot back from the arena and finds its token: K must be a stream row, V the
 * same token's V row, and no token may sit in two slots of a head. */
static int identify_slots(struct replay *rp, const char *when, struct vcase_result *res) {
    uint32_t len = vase_seq_len(rp->seq);
    size_t row = (size_t)rp->c.vc.d * sizeof(float);

    if (len > rp->c.vc.T)
        return vcase_failf(res, "%s: length %u exceeds the %u tokens of the stream", when, len,
                           rp->c.vc.T);
    for (uint32_t h = 0; h < rp->c.vc.hkv; h++) {
        memset(rp->seen, 0, rp->c.vc.T);
        for (uint32_t s = 0; s < len; s++) {
            const float *k = vase_seq_kv_ptr(rp->seq, 0, VASE_K, s, h);
            const float *v = vase_seq_kv_ptr(rp->seq, 0, VASE_V, s, h);
            int64_t t;

            if (!k || !v)
                return vcase_failf(res,
                                   "%s: vase_seq_kv_ptr() has no address for slot %u of head %u "
                                   "(len %u, capacity %u)",
                                   when, s, h, len, vase_seq_capacity(rp->seq));
            t = lookup(rp, h, k);
            if (t < 0)
                return vcase_failf(res, "%s: head %u slot %u holds a K row that is no token's",
                                   when, h, s);
            if (memcmp(v, vcase_stream_row(rp->c.vc.vs, rp->c.vc.hkv, rp->c.vc.d, (uint32_t)t, h),
                       row) != 0)
                return vcase_failf(res,
                                   "%s: head %u slot %u holds the K row of token %lld but another "
                                   "V row",
                                   when, h, s, (long long)t);
            if (rp->seen[t])
                return vcase_failf(res, "%s: head %u holds token %lld twice (again in slot %u)",
                                   when, h, (long long)t, s);
            rp->seen[t] = 1;
            rp->pos[(size_t)h * rp->c.vc.T + s] = (uint32_t)t;
        }
    }
    return 0;
}

static int setup(struct replay *rp, const char *dir, struct vcase_result *res) {
    int r = vcase_replay_load(&rp->c, dir, res);
    if (r < 0)
        return r;
    rp->pos = calloc((size_t)rp->c.vc.hkv * rp->c.vc.T, sizeof *rp->pos);
    rp->seen = calloc(rp->c.vc.T, 1);
    if (!rp->pos || !rp->seen)
        return vcase_failf(res, "out of memory");
    return build_index(rp, res);
}

/* Writes token t's K and V into slot, and its query into the ring. */
static int write_token(struct replay *rp, uint32_t t, uint32_t slot, bool query,
                       struct vcase_result *res) {
    size_t row = (size_t)rp->c.vc.d * sizeof(float);

    for (uint32_t h = 0; h < rp->c.vc.hkv; h++) {
        void *k = vase_seq_kv_ptr(rp->seq, 0, VASE_K, slot, h);
        void *v = vase_seq_kv_ptr(rp->seq, 0, VASE_V, slot, h);

        if (!k || !v)
            return vcase_failf(res,
                               "t=%u: vase_seq_kv_ptr() has no address for slot %u (capacity %u)",
                               t, slot, vase_seq_capacity(rp->seq));
        memcpy(k, vcase_stream_row(rp->c.vc.ks, rp->c.vc.hkv, rp->c.vc.d, t, h), row);
        memcpy(v, vcase_stream_row(rp->c.vc.vs, rp->c.vc.hkv, rp->c.vc.d, t, h), row);
    }
    if (!query || !(rp->c.needs & VASE_NEEDS_Q))
        return 0;
    for (uint32_t h = 0; h < rp->c.vc.hq; h++) {
        void *q = vase_seq_query_ptr(rp->seq, 0, t, h);

        if (!q)
            return vcase_failf(res,
                               "t=%u: vase_seq_query_ptr() is NULL for a policy that reads "
                               "queries",
                               t);
        memcpy(q, vcase_stream_row(rp->c.vc.qs, rp->c.vc.hq, rp->c.vc.d, t, h), row);
    }
    return 0;
}

/* Hands the daemon the draws of the coming round: the Exp(1) draws from exp_noise_NNN.npy,
 * and the sketch from gauss_NNN.npy or, when this round has none (cur_fixed_gauss draws once),
 * the latest earlier one. */
static int inject_draws(struct replay *rp, uint32_t round, uint32_t n, struct vcase_result *res) {
    struct vase_npy *exp = NULL;
    int r;

    r = vcase_trace_round_draws(&rp->c.vc, rp->c.needs, rp->c.params.rank, round, n, &exp, res);
    if (r < 0)
        return r;
    /* One layer, so the [layers][kv_heads][N] draws of the request are the file's [Hkv][N]. */
    r = vase_seq_set_draws(rp->seq, exp ? exp->data : NULL, exp ? exp->count : 0,
                           (rp->c.needs & VASE_NEEDS_GAUSS) ? rp->c.vc.gauss->data : NULL,
                           (rp->c.needs & VASE_NEEDS_GAUSS) ? rp->c.vc.gauss->count : 0);
    if (r < 0)
        r = fail_call(res, rp->client, r, "round %u: vase_seq_set_draws() failed", round);
    vase_npy_free(exp);
    return r;
}

/* Decodes token t; an eviction it triggers must be the next of evict_steps. */
static int decode(struct replay *rp, uint32_t t, struct vcase_result *res) {
    uint32_t len = vase_seq_len(rp->seq);
    bool trigger = len + 1 > rp->c.budget && (len + 1) % rp->c.window == 0;
    char when[64];
    int r;

    if (vase_seq_position(rp->seq) != t)
        return vcase_failf(res, "t=%u: libvase's position is %llu", t,
                           (unsigned long long)vase_seq_position(rp->seq));
    r = write_token(rp, t, len, true, res);
    if (r < 0)
        return r;
    if (trigger) {
        r = vcase_trace_check_round(&rp->c.vc, rp->rounds, t, res);
        if (r < 0)
            return r;
        r = inject_draws(rp, rp->rounds, len + 1 - rp->c.window, res);
        if (r < 0)
            return r;
    }

    r = vase_seq_append(rp->seq, 1);
    if (r < 0)
        return fail_call(res, rp->client, r, "t=%u (len %u): vase_seq_append() failed", t, len);
    if (trigger != (r > 0))
        return vcase_failf(res, "t=%u (len %u -> %u): %s", t, len, len + 1,
                           trigger
                               ? "the trigger rule evicts here, but the sync append applied no plan"
                               : "the append applied a plan the trigger rule does not call for");
    if (!trigger)
        return 0;

    snprintf(when, sizeof when, "after eviction %u (t=%u)", rp->rounds, t);
    rp->rounds++;
    if (vase_seq_rounds(rp->seq) != rp->rounds)
        return vcase_failf(res, "%s: libvase counts %u rounds", when, vase_seq_rounds(rp->seq));
    if (vase_seq_len(rp->seq) != rp->c.budget)
        return vcase_failf(res, "%s: length %u, want the budget %u", when, vase_seq_len(rp->seq),
                           rp->c.budget);
    return identify_slots(rp, when, res);
}

/* Each case has a client of its own, so that cases cannot affect one another and no number of
 * cases runs into the daemon's per-client model quota. */
static int run_case(const char *dir, const char *name, uint32_t block, struct vcase_result *res) {
    struct replay rp = {.rounds = 0};
    char model_name[80];
    uint32_t len;
    int r;

    r = setup(&rp, dir, res);
    if (r < 0)
        goto out;
    r = vase_connect(
        &(struct vase_connect_options){.runtime_dir = arg_runtime_dir, .name = "replay_engine"},
        &rp.client);
    if (r < 0) {
        r = vcase_failf(res, "cannot connect to vased: %s%s", vase_strerror(r),
                        r == -ENOENT || r == -ECONNREFUSED ? " (is vased running?)" : "");
        goto out;
    }

    snprintf(model_name, sizeof model_name, "replay-%.64s", name);
    r = vase_model_register(rp.client,
                            &(struct vase_geometry){
                                .name = model_name,
                                .layers = 1,
                                .q_heads = rp.c.vc.hq,
                                .kv_heads = rp.c.vc.hkv,
                                .head_dim = rp.c.vc.d,
                                .dtype = VASE_DTYPE_F32,
                                .block_tokens = block,
                            },
                            &rp.model);
    if (r < 0) {
        r = fail_call(res, rp.client, r,
                      "vase_model_register(1 layer, %u/%u heads, dim %u, f32, block %u) failed",
                      rp.c.vc.hq, rp.c.vc.hkv, rp.c.vc.d, block);
        goto out;
    }
    if (block && vase_model_tokens_per_page(rp.model) != block) {
        r = vcase_failf(res, "blocks of %u tokens asked for, %u per page given", block,
                        vase_model_tokens_per_page(rp.model));
        goto out;
    }
    r = vase_seq_open(rp.client, rp.model,
                      &(struct vase_seq_config){
                          .policy = rp.c.policy,
                          .params = rp.c.params,
                          .prompt_len = rp.c.vc.prompt,
                          .mode = VASE_MODE_SYNC,
                          .slack = -1,
                      },
                      &rp.seq);
    if (r < 0) {
        r = fail_call(res, rp.client, r,
                      "vase_seq_open(%s, budget %u, window %u, prompt %u) failed",
                      vase_policy_to_string(rp.c.policy), rp.c.budget, rp.c.window, rp.c.vc.prompt);
        goto out;
    }

    /* Prefill in one append, as an engine does. Only the last 2 * window queries can still be
     * in the ring afterwards, and only those are written. */
    for (uint32_t t = 0; t < rp.c.vc.prompt; t++) {
        r = write_token(&rp, t, t, rp.c.vc.prompt - t <= 2 * rp.c.window, res);
        if (r < 0)
            goto out;
    }
    if (rp.c.vc.prompt > 0) {
        r = vase_seq_append(rp.seq, rp.c.vc.prompt);
        if (r != 0) {
            r = r < 0
                    ? fail_call(res, rp.client, r, "the prompt's append failed")
                    : vcase_failf(res, "the prompt's append applied a plan: prefill never evicts");
            goto out;
        }
    }
    for (uint32_t t = rp.c.vc.prompt; t < rp.c.vc.T; t++) {
        r = decode(&rp, t, res);
        if (r < 0)
            goto out;
    }

    len = vase_seq_len(rp.seq);
    r = vcase_trace_check_end(&rp.c.vc, rp.rounds, len, res);
    if (r < 0)
        goto out;
    r = identify_slots(&rp, "at the end", res);
    if (r < 0)
        goto out;
    for (uint32_t h = 0; h < rp.c.vc.hkv; h++)
        for (uint32_t s = 0; s < len; s++) {
            int32_t w = ((const int32_t *)rp.c.vc.final->data)[(size_t)h * len + s];
            uint32_t got = rp.pos[(size_t)h * rp.c.vc.T + s];

            if (w < 0 || (uint32_t)w != got) {
                r = vcase_failf(res, "final_pos: head %u slot %u holds token %u, want %d", h, s,
                                got, w);
                goto out;
            }
        }

out:
    replay_done(&rp);
    vase_disconnect(rp.client);
    return r;
}

/* ---- driver -------------------------------------------------------------------------- */

static void help(void) {
    printf(
        "Usage: %s [--runtime-dir DIR] [--block=N[,N...]] CASE_DIR...\n"
        "Replays trace_* test vectors through a running vased (sync mode, injected draws)\n"
        "and compares the evictions and the final slots exactly.\n"
        "\n"
        "      --runtime-dir=DIR  vased's runtime directory ($VASE_RUNTIME_DIR, /run/vase, ./run)\n"
        "      --block=N,...      replay each case with pages of each of these block sizes\n"
        "                         (tokens per page); results are named CASE@N (default: once,\n"
        "                         with the library's default block size, named CASE)\n"
        "  -h --help              show this help\n",
        program_invocation_short_name);
}

/* Returns < 0 on a usage error, 0 to exit successfully (help), > 0 to go on. */
static int parse_argv(int argc, char **argv) {
    static const struct option options[] = {
        {"runtime-dir", required_argument, NULL, 'r'},
        {"block", required_argument, NULL, 'b'},
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
        case 'b':
            if (argnum_u32_list(optarg, 1, 65536, arg_blocks, MAX_BLOCKS, &arg_n_blocks) < 0) {
                fprintf(stderr,
                        "%s: --block=%s: expected up to %d block sizes 1..65536, "
                        "separated by commas\n",
                        program_invocation_short_name, optarg, MAX_BLOCKS);
                return -EINVAL;
            }
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
    size_t passed, failed;
    int r;

    r = parse_argv(argc, argv);
    if (r <= 0)
        return r < 0 ? 2 : 0;
    vcase_run_all(argv + optind, (size_t)(argc - optind), arg_blocks, arg_n_blocks, run_case,
                  vase_strerror, &passed, &failed);
    return failed == 0 && passed > 0 ? 0 : 1;
}
