/* SPDX-License-Identifier: MIT */

/*
 * synthetic_engine: an inference engine without a model. It decodes N sequences through libvase
 * exactly as a real engine would: for every appended token it writes K and V of every layer and
 * KV head into the sequence's slots in the shared arena (and the query of every query head into
 * the query ring, when the policy reads queries), calls vase_seq_append() and vase_seq_poll()
 * at each step boundary, and optionally pushes accumulated attention for h2o. A simulated step
 * time (sleep or busy work) stands in for the forward pass.
 *
 * The data are heavy-tailed: standard normal rows, of which a small fraction of value rows are
 * scaled 20x. Those are the outliers VaSE-AttnV reserves slots for, so the summary counts how
 * many of them are still cached at the end, next to what the eviction cycle cost the engine:
 * stalls (time blocked waiting for a plan), compaction time and the daemon's plan time.
 *
 * Rows are cut from one precomputed pool of normal draws at random offsets, already converted
 * to the model's dtype, so that writing a token is a few memcpy()s and the engine measures the
 * service rather than its own random number generator. Rows are assembled in host buffers and
 * written with vase_seq_write_kv() and vase_seq_write_query(), so the same engine runs on the
 * host arena (memcpy) and on a CUDA arena (copies to the GPU on the legacy default stream):
 * whichever arena vased offers as --arena.
 *
 * The files: this one, the command line and main(); synthetic_engine_data.c, the row pool and
 * the synthetic K, V, queries and attention statistics; synthetic_engine_run.c, the run itself
 * from the connection to the report.
 */

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "synthetic_engine.h"

uint32_t arg_layers = 4;
uint32_t arg_q_heads = 8;
uint32_t arg_kv_heads = 2;
uint32_t arg_head_dim = 64;
enum vase_dtype arg_dtype = VASE_DTYPE_BF16;
uint32_t arg_block; /* 0: the library's default (16) */
uint32_t arg_seqs = 2;
uint32_t arg_budget = 512;
uint32_t arg_window = 64;
int32_t arg_slack = -1;
int32_t arg_admission_wait_ms = -1; /* -1: the daemon's admission_wait_ms */
uint32_t arg_min_budget;            /* 0: the budget (not elastic) */
uint32_t arg_weight;                /* 0: 1 */
enum vase_policy arg_policy = VASE_POLICY_VASE_ATTNV;
enum vase_mode arg_mode = VASE_MODE_ASYNC;
uint32_t arg_prompt = 256;
uint64_t arg_steps = 1024;
bool arg_steps_set;
double arg_duration; /* seconds; 0: --steps decides */
double arg_step_ms = 1.0;
enum step_work arg_step_work = STEP_SLEEP;
uint64_t arg_seed = 1;
bool arg_push_stats;
uint32_t arg_arena;
const char *arg_runtime_dir;
const char *arg_name = "synthetic_engine";

volatile sig_atomic_t stop_requested;

/* A decimal number within [min, max] and nothing else: no blanks, no sign (strtoull() would
 * take both, and wrap a minus). 0, -EINVAL when s is not a number, -ERANGE when it is one out
 * of range; *ret untouched on failure. Digits are accumulated here with an overflow check. */
static int parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *ret) {
    uint64_t v = 0;
    bool overflow = false;

    if (*s == '\0')
        return -EINVAL;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9')
            return -EINVAL;
        unsigned digit = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - digit) / 10)
            overflow = true;
        else
            v = v * 10 + digit;
    }
    if (overflow || v < min || v > max)
        return -ERANGE;
    *ret = v;
    return 0;
}

static int parse_seconds(const char *s, double max, double *ret) {
    char *end;
    double v;

    errno = 0;
    v = strtod(s, &end);
    if (end == s || *end != '\0' || errno == EINVAL)
        return -EINVAL;
    if (errno == ERANGE || !isfinite(v) || v < 0 || v > max)
        return -ERANGE;
    *ret = v;
    return 0;
}

static void help(void) {
    printf(
        "Usage: %s [OPTIONS]\n"
        "Decodes sequences of synthetic heavy-tailed K/V/Q through libvase and vased, and\n"
        "reports evictions, stalls, compaction and plan times.\n"
        "\n"
        "Model:\n"
        "      --layers=N         layers (4)\n"
        "      --q-heads=N        query heads (8)\n"
        "      --kv-heads=N       KV heads, dividing the query heads (2)\n"
        "      --head-dim=N       head dim (64)\n"
        "      --dtype=T          f32, f16 or bf16 (bf16)\n"
        "      --block=N          tokens per page (block) of the attention kernel (16)\n"
        "Sequences:\n"
        "      --seqs=N           sequences decoded together (2)\n"
        "      --budget=N         slots kept per sequence (512)\n"
        "      --window=N         window W (64)\n"
        "      --slack=N          steps the engine may run ahead of a plan (window)\n"
        "      --admission-wait-ms=N  how long an open waits for room in a full arena\n"
        "                         (the daemon's admission_wait_ms; 0: refused at once)\n"
        "      --min-budget=N     elastic: the least budget a sequence accepts when the\n"
        "                         daemon makes room for waiting opens (the budget: not elastic)\n"
        "      --weight=N         weight of the sequences when budgets are lowered (1)\n"
        "      --policy=NAME      vase-attnv, vase-dkv, curdkv, snapkv, rkv, streaming,\n"
        "                         random, h2o, ... (vase-attnv)\n"
        "      --mode=MODE        sync or async (async)\n"
        "      --prompt=N         prompt tokens prefilled in one append (256)\n"
        "      --push-stats       push accumulated attention (AttnStats) every step, for h2o\n"
        "Run:\n"
        "      --steps=N          decode steps (1024)\n"
        "      --duration=SEC     decode for this long instead (with --steps: whichever first)\n"
        "      --step-ms=MS       simulated forward time per step (1)\n"
        "      --step-work=KIND   sleep or busy (sleep)\n"
        "      --seed=N           data and sampling seed (1)\n"
        "      --arena=ID         the daemon's arena to run on, host or CUDA alike (0)\n"
        "      --runtime-dir=DIR  vased's runtime directory ($VASE_RUNTIME_DIR, /run/vase, ./run)\n"
        "      --name=NAME        client name shown by vasectl\n"
        "  -h --help              show this help\n",
        program_invocation_short_name);
}

/* Every option that takes a number: where it goes, its bounds and how an error names them
 * (NULL: no range worth naming), and the flag it sets when given. */
enum num_kind { NUM_U32, NUM_I32, NUM_U64, NUM_SECONDS };
static const struct num_option {
    const char *name;
    enum num_kind kind;
    void *value;
    uint64_t min, max; /* NUM_SECONDS: max only, in the option's unit */
    const char *range;
    bool *given;
} num_options[] = {
    {"layers", NUM_U32, &arg_layers, 1, 65535, "1..65535", NULL},
    {"q-heads", NUM_U32, &arg_q_heads, 1, VASE_MAX_HEADS, "1..1024", NULL},
    {"kv-heads", NUM_U32, &arg_kv_heads, 1, VASE_MAX_HEADS, "1..1024", NULL},
    {"head-dim", NUM_U32, &arg_head_dim, 1, VASE_MAX_DIM, "1..1024", NULL},
    {"block", NUM_U32, &arg_block, 1, 65536, "1..65536", NULL},
    {"block-tokens", NUM_U32, &arg_block, 1, 65536, "1..65536", NULL},
    {"seqs", NUM_U32, &arg_seqs, 1, MAX_SEQS, "1..1024", NULL},
    {"budget", NUM_U32, &arg_budget, 2, VASE_MAX_BUDGET, "2..4194304", NULL},
    {"window", NUM_U32, &arg_window, 1, VASE_MAX_BUDGET, "1..4194304", NULL},
    {"slack", NUM_I32, &arg_slack, 0, VASE_MAX_BUDGET, "0..4194304", NULL},
    {"admission-wait-ms", NUM_I32, &arg_admission_wait_ms, 0, VASE_MAX_ADMISSION_WAIT_MS,
     "0..600000", NULL},
    {"min-budget", NUM_U32, &arg_min_budget, 0, VASE_MAX_BUDGET, "0..4194304", NULL},
    {"weight", NUM_U32, &arg_weight, 0, VASE_MAX_WEIGHT, "0..1000", NULL},
    {"prompt", NUM_U32, &arg_prompt, 0, VASE_MAX_TOKENS, "0..4194304", NULL},
    {"steps", NUM_U64, &arg_steps, 0, UINT64_MAX, NULL, &arg_steps_set},
    {"duration", NUM_SECONDS, &arg_duration, 0, 10000000, "seconds >= 0", NULL},
    {"step-ms", NUM_SECONDS, &arg_step_ms, 0, 1000000, "milliseconds >= 0", NULL},
    {"seed", NUM_U64, &arg_seed, 0, UINT64_MAX, NULL, NULL},
    {"arena", NUM_U32, &arg_arena, 0, 255, "0..255", NULL},
};
#define N_NUM_OPTIONS (sizeof(num_options) / sizeof(num_options[0]))

/* The options that take a word, or nothing; the numeric ones follow from OPT_NUM. */
enum {
    OPT_DTYPE = 0x100,
    OPT_POLICY,
    OPT_MODE,
    OPT_PUSH_STATS,
    OPT_STEP_WORK,
    OPT_RUNTIME_DIR,
    OPT_NAME,
    OPT_NUM,
};
static const struct option word_options[] = {
    {"dtype", required_argument, NULL, OPT_DTYPE},
    {"policy", required_argument, NULL, OPT_POLICY},
    {"mode", required_argument, NULL, OPT_MODE},
    {"push-stats", no_argument, NULL, OPT_PUSH_STATS},
    {"step-work", required_argument, NULL, OPT_STEP_WORK},
    {"runtime-dir", required_argument, NULL, OPT_RUNTIME_DIR},
    {"name", required_argument, NULL, OPT_NAME},
    {"help", no_argument, NULL, 'h'},
};
#define N_WORD_OPTIONS (sizeof(word_options) / sizeof(word_options[0]))

static int bad_value(const char *option, const char *value, int r, const char *range) {
    fprintf(stderr, "%s: invalid --%s '%s': %s%s%s\n", program_invocation_short_name, option, value,
            r == -ERANGE ? "out of range" : "not a number", range ? ", expected " : "",
            range ? range : "");
    return -EINVAL;
}

/* Parses the value s of a numeric option into its variable; the error names it as given. */
static int parse_num(const struct num_option *o, const char *given_name, const char *s) {
    uint64_t v;
    int r;

    if (o->kind == NUM_SECONDS)
        r = parse_seconds(s, (double)o->max, o->value);
    else if ((r = parse_u64(s, o->min, o->max, &v)) >= 0) {
        if (o->kind == NUM_U32)
            *(uint32_t *)o->value = (uint32_t)v;
        else if (o->kind == NUM_I32)
            *(int32_t *)o->value = (int32_t)v;
        else
            *(uint64_t *)o->value = v;
    }
    if (r < 0)
        return bad_value(given_name, s, r, o->range);
    if (o->given)
        *o->given = true;
    return 0;
}

static int unknown_word(const char *option, const char *value, const char *expected) {
    fprintf(stderr, "%s: unknown --%s '%s'%s%s\n", program_invocation_short_name, option, value,
            expected ? ", expected " : "", expected ? expected : "");
    return -EINVAL;
}

/* The options that take a word (or nothing): 0, or -EINVAL after saying why. */
static int parse_word(int c, const char *s) {
    switch (c) {
    case OPT_DTYPE:
        return vase_dtype_from_string(s, &arg_dtype) < 0
                   ? unknown_word("dtype", s, "f32, f16 or bf16")
                   : 0;
    case OPT_POLICY:
        return vase_policy_from_string(s, &arg_policy) < 0 ? unknown_word("policy", s, NULL) : 0;
    case OPT_MODE:
        if (strcmp(s, "sync") != 0 && strcmp(s, "async") != 0)
            return unknown_word("mode", s, "sync or async");
        arg_mode = s[0] == 's' ? VASE_MODE_SYNC : VASE_MODE_ASYNC;
        return 0;
    case OPT_STEP_WORK:
        if (strcmp(s, "sleep") != 0 && strcmp(s, "busy") != 0)
            return unknown_word("step-work", s, "sleep or busy");
        arg_step_work = s[0] == 's' ? STEP_SLEEP : STEP_BUSY;
        return 0;
    case OPT_PUSH_STATS:
        arg_push_stats = true;
        return 0;
    case OPT_RUNTIME_DIR:
        arg_runtime_dir = s;
        return 0;
    case OPT_NAME:
        arg_name = s;
        return 0;
    default: /* '?': getopt_long() said why */
        return -EINVAL;
    }
}

/* Returns < 0 on a usage error, 0 to exit successfully (help), > 0 to go on. */
static int parse_argv(int argc, char **argv) {
    struct option options[N_WORD_OPTIONS + N_NUM_OPTIONS + 1] = {{0}};
    int c, r, idx = 0;

    memcpy(options, word_options, sizeof(word_options));
    /* An alias (block-tokens) shares its option's value, so that a prefix of both is no
     * ambiguity to getopt_long(). */
    for (size_t i = 0; i < N_NUM_OPTIONS; i++) {
        size_t j = 0;

        while (num_options[j].value != num_options[i].value)
            j++;
        options[N_WORD_OPTIONS + i] =
            (struct option){num_options[i].name, required_argument, NULL, OPT_NUM + (int)j};
    }
    while ((c = getopt_long(argc, argv, "h", options, &idx)) >= 0) {
        if (c == 'h') {
            help();
            return 0;
        }
        r = c >= OPT_NUM ? parse_num(&num_options[c - OPT_NUM], options[idx].name, optarg)
                         : parse_word(c, optarg);
        if (r < 0)
            return r;
    }
    if (optind < argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", program_invocation_short_name,
                argv[optind]);
        return -EINVAL;
    }
    if (arg_q_heads % arg_kv_heads != 0) {
        fprintf(stderr, "%s: --q-heads=%u is not a multiple of --kv-heads=%u\n",
                program_invocation_short_name, arg_q_heads, arg_kv_heads);
        return -EINVAL;
    }
    return 1;
}

int main(int argc, char **argv) {
    int r;

    r = parse_argv(argc, argv);
    if (r <= 0)
        return r < 0 ? 2 : 0;
    return run() < 0 ? 1 : 0;
}
