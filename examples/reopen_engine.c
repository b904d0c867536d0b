/* SPDX-License-Identifier: MIT */

/*
 * reopen_engine: an engine that survives a restart of vased with its KV cache. It decodes one
 * sequence on the host arena, writing K and V rows whose values encode their token, layer, head
 * and dimension; keeps a copy of its block table and of every K and V byte it holds; then waits
 * for the daemon to go away (its calls fail with -VASE_ESTALE or -ECONNRESET: `systemctl
 * restart vased`), connects again (the socket unit queues the connect while vased starts),
 * registers its model again and reopens the sequence with vase_seq_reopen(). It checks that the
 * block table and every K and V byte are what it left, that the same sequence cannot be
 * reopened twice, and decodes on with evictions. With --expect-lost the daemon is expected to
 * have kept nothing (a crash, a changed arena, restore_grace passed): the reopen must fail with
 * -ENOENT, and the engine opens a new sequence instead.
 *
 *   reopen_engine [--runtime-dir DIR] [--steps N] [--ready-file PATH] [--go-file PATH]
 *                 [--expect-lost] [--wait-s S]
 *
 * --ready-file is created once the data is written (a test then restarts the daemon);
 * --go-file, when given, must exist before the reopen is tried. Exits 0 when every check
 * passed, 1 otherwise, with one line saying which.
 */

#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "vase.h"

#define LAYERS 2
#define KV_HEADS 2
#define HEAD_DIM 16
#define BUDGET 64
#define WINDOW 16

static const char *arg_runtime_dir;
static uint32_t arg_steps = 200;
static const char *arg_ready_file;
static const char *arg_go_file;
static bool arg_expect_lost;
static int arg_wait_s = 120;

static int fail(const char *what, int r) {
    fprintf(stderr, "reopen_engine: %s: %s\n", what, vase_strerror(r));
    return 1;
}

static void sleep_ms(long ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int connect_retry(struct vase_client **ret) {
    struct vase_connect_options o = {
        .runtime_dir = arg_runtime_dir, .name = "reopen_engine", .timeout_ms = 30000};
    int r = -ETIMEDOUT;
    for (int i = 0; i < arg_wait_s * 10; i++) {
        r = vase_connect(&o, ret);
        if (r == 0)
            return 0;
        sleep_ms(100);
    }
    return r;
}

static int register_model(struct vase_client *c, struct vase_model **ret) {
    struct vase_geometry g = {.name = "reopen-engine",
                              .layers = LAYERS,
                              .q_heads = KV_HEADS,
                              .kv_heads = KV_HEADS,
                              .head_dim = HEAD_DIM,
                              .dtype = VASE_DTYPE_F32,
                              .block_tokens = 16};
    return vase_model_register(c, &g, ret);
}

static int open_seq(struct vase_client *c, struct vase_model *m, struct vase_seq **ret) {
    struct vase_seq_config cfg = {
        .policy = VASE_POLICY_STREAMING,
        .params = vase_params_default(BUDGET),
        .mode = VASE_MODE_SYNC,
        .slack = -1,
    };
    cfg.params.window = WINDOW;
    cfg.params.n_large = 0;
    return vase_seq_open(c, m, &cfg, ret);
}

/* Decodes n tokens: K and V rows that say which token, layer, head and dimension they are. */
static int decode(struct vase_seq *s, uint32_t n) {
    float k[KV_HEADS * HEAD_DIM], v[KV_HEADS * HEAD_DIM];
    for (uint32_t t = 0; t < n; t++) {
        uint64_t pos = vase_seq_position(s);
        for (uint32_t l = 0; l < LAYERS; l++) {
            for (uint32_t i = 0; i < KV_HEADS * HEAD_DIM; i++) {
                k[i] = (float)(pos % 100000) + (float)l * 0.25f + (float)i * 1e-3f;
                v[i] = -k[i];
            }
            int r = vase_seq_write_kv(s, l, vase_seq_len(s), k, v);
            if (r < 0)
                return r;
        }
        int r = vase_seq_append(s, 1);
        if (r < 0)
            return r;
    }
    return 0;
}

/* The block table and every K and V row of slots [0, len). */
struct copy {
    int32_t *table;
    uint32_t n_table, len;
    float *kv; /* [len][LAYERS][K, V][KV_HEADS * HEAD_DIM] */
};

static int take_copy(struct vase_seq *s, struct copy *c) {
    const int32_t *table;
    int r = vase_seq_block_table(s, &table, &c->n_table);
    if (r < 0)
        return r;
    c->len = vase_seq_len(s);
    size_t row = KV_HEADS * HEAD_DIM;
    c->table = malloc(c->n_table * sizeof(int32_t));
    c->kv = malloc((size_t)c->len * LAYERS * 2 * row * sizeof(float) + 1);
    if (!c->table || !c->kv)
        return -ENOMEM;
    memcpy(c->table, table, c->n_table * sizeof(int32_t));
    for (uint32_t slot = 0; slot < c->len; slot++)
        for (uint32_t l = 0; l < LAYERS; l++) {
            float *at = c->kv + ((size_t)slot * LAYERS + l) * 2 * row;
            if ((r = vase_seq_read_kv(s, l, slot, at, at + row)) < 0)
                return r;
        }
    return 0;
}

static void free_copy(struct copy *c) {
    free(c->table);
    free(c->kv);
}

static int parse_argv(int argc, char **argv) {
    static const struct option options[] = {
        {"runtime-dir", required_argument, NULL, 'r'},
        {"steps", required_argument, NULL, 's'},
        {"ready-file", required_argument, NULL, 'R'},
        {"go-file", required_argument, NULL, 'g'},
        {"expect-lost", no_argument, NULL, 'l'},
        {"wait-s", required_argument, NULL, 'w'},
        {"help", no_argument, NULL, 'h'},
        {0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0) {
        switch (c) {
        case 'r':
            arg_runtime_dir = optarg;
            break;
        case 's':
            arg_steps = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        case 'R':
            arg_ready_file = optarg;
            break;
        case 'g':
            arg_go_file = optarg;
            break;
        case 'l':
            arg_expect_lost = true;
            break;
        case 'w':
            arg_wait_s = atoi(optarg) > 0 ? atoi(optarg) : 1;
            break;
        case 'h':
            printf("usage: reopen_engine [--runtime-dir DIR] [--steps N] [--ready-file PATH] "
                   "[--go-file PATH] [--expect-lost] [--wait-s S]\n");
            return 0;
        default:
            fprintf(stderr, "reopen_engine: unknown option; try --help\n");
            return -EINVAL;
        }
    }
    if (arg_steps < 2 * BUDGET) {
        fprintf(stderr,
                "reopen_engine: --steps must be at least %u (evictions before the "
                "restart)\n",
                2 * BUDGET);
        return -EINVAL;
    }
    return 1;
}

/* Waits for the old daemon to go: its calls then fail (-VASE_ESTALE, -ECONNRESET). */
static int wait_daemon_gone(struct vase_client *c) {
    for (int i = 0; i < arg_wait_s * 50; i++) {
        int r = vase_ping(c);
        if (r < 0 && r != -ETIMEDOUT)
            return r;
        sleep_ms(20);
    }
    return 0;
}

static bool wait_go_file(void) {
    for (int i = 0; arg_go_file && i < arg_wait_s * 50; i++) {
        if (access(arg_go_file, F_OK) == 0)
            return true;
        sleep_ms(20);
    }
    return !arg_go_file;
}

/* After the restart: the reopened sequence must hold what old held; then decode on. */
static int check_reopened(struct vase_model *m2, struct vase_seq *old, struct vase_seq *s2,
                          const struct copy *before) {
    struct copy after = {0};
    int r = take_copy(s2, &after);
    if (r < 0)
        return fail("reading the reopened sequence", r);
    bool table_same = after.n_table == before->n_table &&
                      memcmp(after.table, before->table, after.n_table * sizeof(int32_t)) == 0;
    bool kv_same = after.len == before->len && memcmp(after.kv, before->kv,
                                                      (size_t)after.len * LAYERS * 2 * KV_HEADS *
                                                          HEAD_DIM * sizeof(float)) == 0;
    free_copy(&after);
    if (!table_same || !kv_same) {
        fprintf(stderr, "reopen_engine: after the reopen the block table is %s and K/V are %s\n",
                table_same ? "identical" : "DIFFERENT", kv_same ? "identical" : "DIFFERENT");
        return 1;
    }
    printf("reopened: sequence %u, block table identical (%u pages), K/V identical (%u slots, "
           "%u layers)\n",
           vase_seq_id(s2), before->n_table, before->len, LAYERS);
    struct vase_seq *again;
    r = vase_seq_reopen(m2, old, &again);
    if (r != -ENOENT)
        return fail("a second reopen of the same sequence (want -ENOENT)", r == 0 ? -EEXIST : r);
    printf("a second reopen is refused: %s\n", vase_strerror(r));
    uint32_t rounds = vase_seq_rounds(s2);
    if ((r = decode(s2, arg_steps)) < 0)
        return fail("decoding after the reopen", r);
    if (vase_seq_rounds(s2) <= rounds) {
        fprintf(stderr, "reopen_engine: no eviction after the reopen\n");
        return 1;
    }
    printf("decoded %u more steps: position %llu, %u evictions in all\n", arg_steps,
           (unsigned long long)vase_seq_position(s2), vase_seq_rounds(s2));
    return 0;
}

int main(int argc, char **argv) {
    struct vase_client *c1 = NULL, *c2 = NULL;
    struct vase_model *m1, *m2;
    struct vase_seq *s1, *s2 = NULL;
    struct copy before = {0};
    int r = parse_argv(argc, argv);
    if (r <= 0)
        return r < 0 ? 2 : 0;

    if ((r = connect_retry(&c1)) < 0)
        return fail("connect", r);
    if ((r = register_model(c1, &m1)) < 0)
        return fail("register the model", r);
    if ((r = open_seq(c1, m1, &s1)) < 0)
        return fail("open the sequence", r);
    if ((r = decode(s1, arg_steps)) < 0)
        return fail("decode", r);
    if ((r = take_copy(s1, &before)) < 0)
        return fail("read the sequence", r);
    printf("written: sequence %u, len %u, position %llu, %u evictions\n", vase_seq_id(s1),
           vase_seq_len(s1), (unsigned long long)vase_seq_position(s1), vase_seq_rounds(s1));
    fflush(stdout);
    if (arg_ready_file) {
        FILE *f = fopen(arg_ready_file, "w");
        if (f)
            fclose(f);
    }

    r = wait_daemon_gone(c1);
    if (r == 0) {
        fprintf(stderr, "reopen_engine: the daemon did not go away within %d s\n", arg_wait_s);
        return 1;
    }
    printf("the daemon went away: %s\n", vase_strerror(r));
    if ((r = connect_retry(&c2)) < 0)
        return fail("connect again", r);
    printf("connected again\n");
    fflush(stdout);
    if (!wait_go_file()) {
        fprintf(stderr, "reopen_engine: %s did not appear within %d s\n", arg_go_file, arg_wait_s);
        return 1;
    }
    if ((r = register_model(c2, &m2)) < 0)
        return fail("register the model again", r);
    r = vase_seq_reopen(m2, s1, &s2);
    int status;
    if (arg_expect_lost) {
        if (r != -ENOENT)
            return fail("the reopen (want -ENOENT: nothing kept)", r == 0 ? -EEXIST : r);
        printf("reopen refused as expected: %s (%s)\n", vase_strerror(r), vase_last_error(c2));
        status = (r = open_seq(c2, m2, &s2)) < 0 || (r = decode(s2, arg_steps)) < 0
                     ? fail("a new sequence after the refused reopen", r)
                     : 0;
        if (status == 0)
            printf("a new sequence decoded %u steps\n", arg_steps);
    } else {
        status = r < 0 ? fail("the reopen", r) : check_reopened(m2, s1, s2, &before);
    }
    /* The old client and its sequence were valid until now; closing them leaves s2 alone. */
    vase_seq_close(s1);
    vase_disconnect(c1);
    free_copy(&before);
    if (status == 0 && s2 && (r = vase_seq_close(s2)) < 0)
        status = fail("close", r);
    vase_disconnect(c2);
    return status;
}
