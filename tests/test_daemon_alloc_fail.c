/* SPDX-License-Identifier: MIT */

/*
 * Allocation-failure sweeps of the daemon's code that runs in-process without sockets: the
 * configuration (defaults, INI text and file with [arena NAME] sections, the command line,
 * vase_config_load()), the registry (clients, models, sequences), the page allocator, plan runs
 * with their workspaces, the allow-list, a peer's groups, a host arena, and the fair queue.
 *
 * The hook is tests/alloc_fail.c, linked in with -Wl,--wrap for malloc, calloc, realloc,
 * strdup, aligned_alloc and free (see the Makefile), so that every call to them from the
 * daemon archive, the kernels and this file goes through it. While a sweep step is armed, it
 * counts allocations and makes the Nth one fail; outside it (cmocka, fixtures, set-up) it only
 * passes the call on. A sweep runs a step with N = 1, 2, ... until a step runs without reaching
 * an Nth allocation: every step before that must have failed with exactly -ENOMEM, and after
 * its clean-up every block allocated while armed must have been freed (checked by the hook,
 * and again by valgrind in `make check-valgrind` and by LeakSanitizer in the sanitizer build).
 */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <syslog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "../daemon/core/alloc.h"
#include "../daemon/core/arena.h"
#include "../daemon/config/config.h"
#include "../daemon/plan/evictor.h"
#include "../daemon/plan/fairq.h"
#include "../daemon/core/log.h"
#include "../daemon/plan/planner.h"
#include "../daemon/core/registry.h"
#include "../daemon/core/allow.h"
#include "../daemon/core/session.h"
#include "../daemon/setup.h"
#include "../daemon/state.h"
#include "alloc_fail.h"
#include "plan_fixture.h"

/* ---- configuration ---- */

static int step_config_init(void *ctx) {
    (void)ctx;
    struct vase_config c;
    alloc_fail_arm();
    int r = vase_config_init(&c);
    alloc_fail_disarm();
    vase_config_done(&c);
    return r;
}

static const char config_text[] = "# a file with every kind of section\n"
                                  "[vased]\n"
                                  "arena_bytes = 64M\n"
                                  "granule_bytes = 1M\n"
                                  "allow_users = alice, bob\n"
                                  "runtime_dir = /run/vase\n"
                                  "\n"
                                  "[arena bob]\n"
                                  "arena = host\n"
                                  "arena_bytes = 32M\n"
                                  "users = bob\n"
                                  "\n"
                                  "[arena carol]\n"
                                  "groups = staff\n"
                                  "cuda_share = vmm\n";

static int step_config_parse_string(void *ctx) {
    (void)ctx;
    struct vase_config c;
    assert_int_equal(vase_config_init(&c), 0);
    alloc_fail_arm();
    int r = vase_config_parse_string(&c, config_text);
    alloc_fail_disarm();
    if (r == 0) {
        assert_int_equal(c.n_extra_arenas, 2);
        assert_string_equal(c.extra_arenas[1].name, "carol");
        assert_int_equal(c.extra_arenas[1].arena_bytes, 64 << 20);
    } else
        assert_int_equal(c.n_extra_arenas, 0); /* no section is added on failure */
    vase_config_done(&c);
    return r;
}

static int step_config_set_get(void *ctx) {
    (void)ctx;
    struct vase_config c;
    char *v = NULL;
    assert_int_equal(vase_config_init(&c), 0);
    alloc_fail_arm();
    int r = vase_config_set(&c, "allow-groups", "wheel staff", VASE_CONFIG_RUNTIME);
    if (r == 0)
        r = vase_config_get(&c, "allow_groups", &v);
    alloc_fail_disarm();
    if (r == 0)
        assert_string_equal(v, "wheel staff");
    else
        assert_null(v);
    free(v);
    vase_config_done(&c);
    return r;
}

static char *const cmdline_argv[] = {"vased",
                                     "--config=/nonexistent/vased.conf",
                                     "--arena-bytes=64M",
                                     "--allow_users=bob",
                                     "--log-level=debug",
                                     "--config",
                                     "/also/not/there",
                                     NULL};

static int step_cmdline_parse(void *ctx) {
    (void)ctx;
    struct vase_cmdline cmd = {0};
    char *argv[sizeof(cmdline_argv) / sizeof(cmdline_argv[0])];
    memcpy(argv, cmdline_argv, sizeof(argv)); /* getopt may permute argv */
    alloc_fail_arm();
    int r = vase_cmdline_parse((int)(sizeof(argv) / sizeof(argv[0])) - 1, argv, &cmd);
    alloc_fail_disarm();
    if (r == 0) {
        assert_int_equal(cmd.n_overrides, 3);
        assert_string_equal(cmd.config_path, "/also/not/there");
    }
    vase_cmdline_done(&cmd);
    return r;
}

/* A file holding config_text, and a command line naming it with two overrides. */
struct load_ctx {
    char path[64];
    struct vase_cmdline cmd;
};

static int step_config_parse_file(void *ctx) {
    struct load_ctx *l = ctx;
    struct vase_config c;
    assert_int_equal(vase_config_init(&c), 0);
    alloc_fail_arm();
    int r = vase_config_parse_file(&c, l->path);
    alloc_fail_disarm();
    vase_config_done(&c);
    return r;
}

static int step_config_load(void *ctx) {
    struct load_ctx *l = ctx;
    struct vase_config c;
    alloc_fail_arm();
    int r = vase_config_load(&c, &l->cmd);
    alloc_fail_disarm();
    if (r == 0) {
        assert_int_equal(c.n_extra_arenas, 2);
        assert_string_equal(c.allow_users, "carol");
    }
    vase_config_done(&c);
    return r;
}

static void test_config(void **state) {
    (void)state;
    struct load_ctx l = {.path = "/tmp/vase-alloc-fail-XXXXXX"};
    int fd = mkstemp(l.path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, config_text, strlen(config_text)), (ssize_t)strlen(config_text));
    close(fd);
    char *argv[] = {"vased", NULL, "--allow-users=carol", "--max_clients=8", NULL};
    char config_flag[96];
    snprintf(config_flag, sizeof(config_flag), "--config=%s", l.path);
    argv[1] = config_flag;
    assert_int_equal(vase_cmdline_parse(4, argv, &l.cmd), 0);

    unsigned n = alloc_fail_sweep("config: vase_config_init", step_config_init, NULL, 0);
    assert_true(n >= 6); /* one string per string setting at least */
    assert_true(alloc_fail_sweep("config: vase_config_parse_string", step_config_parse_string, NULL,
                                 0) > 0);
    assert_true(alloc_fail_sweep("config: vase_config_set/get", step_config_set_get, NULL, 0) > 0);
    assert_true(alloc_fail_sweep("config: vase_cmdline_parse", step_cmdline_parse, NULL, 0) > 0);
    assert_true(alloc_fail_sweep("config: vase_config_parse_file", step_config_parse_file, &l, 0) >
                0);
    assert_true(alloc_fail_sweep("config: vase_config_load", step_config_load, &l, 0) > n);

    vase_cmdline_done(&l.cmd);
    unlink(l.path);
}

/* ---- registry and allocator ---- */

static const struct vase_layout_geometry tiny = {.layers = 4,
                                                 .q_heads = 6,
                                                 .kv_heads = 2,
                                                 .head_dim = 16,
                                                 .dtype = VASE_DTYPE_F32,
                                                 .block_tokens = 64};

/* The allocator's books are consistent. */
static void check_alloc(const struct vase_alloc *a) {
    char msg[256] = "";
    int r = vase_alloc_check(a, msg, sizeof(msg));
    if (r != 0)
        fail_msg("vase_alloc_check: %d %s", r, msg);
}

/* A reservation over three sizes, each a new class: a failure in any part takes nothing. */
static int step_alloc(void *ctx) {
    (void)ctx;
    struct vase_alloc *a = NULL;
    uint64_t held = 0;
    uint32_t kv[8], ring[3], plan[2];
    struct vase_alloc_req parts[3] = {
        {.unit = 64 << 10, .n = 8, .ret = kv},
        {.unit = 48 << 10, .n = 3, .ret = ring},
        {.unit = 7168, .n = 2, .ret = plan},
    };
    alloc_fail_arm();
    int r = vase_alloc_new(4 << 20, 64 << 10, &a);
    bool made = r == 0;
    if (r == 0)
        r = vase_alloc_reserve(a, parts, 3, 0, &held);
    alloc_fail_disarm();
    if (!made) {
        assert_null(a);
        return r;
    }
    check_alloc(a);
    if (r == 0) {
        assert_int_equal(held, 8 * (64 << 10) + 3 * (48 << 10) + 2 * 7168);
        assert_int_equal(vase_alloc_release(a, 64 << 10, kv, 8, &held), 0);
        assert_int_equal(vase_alloc_release(a, 48 << 10, ring, 3, &held), 0);
        assert_int_equal(vase_alloc_release(a, 7168, plan, 2, &held), 0);
    }
    /* Nothing held, no class kept. */
    assert_int_equal(held, 0);
    assert_int_equal(a->used_bytes, 0);
    assert_int_equal(a->n_free_granules, a->n_granules);
    for (uint32_t i = 0; i < a->n_classes; i++)
        assert_int_equal(a->classes[i].unit, 0);
    check_alloc(a);
    vase_alloc_free(a);
    return r;
}

/* A registry with two clients, a model and two sequences, one closed again: each call's
 * failure is checked to leave nothing behind, and the registry is freed whole. */
static int step_registry(void *ctx) {
    (void)ctx;
    struct vase_registry *reg = NULL;
    struct vase_alloc *alloc;
    struct vased_client *a = NULL, *b = NULL;
    struct vased_model *m = NULL;
    struct vased_seq *s = NULL, *t = NULL;
    struct vase_layout L;
    struct vased_seq_request req = {.policy = VASE_POLICY_VASE_ATTNV,
                                    .prompt_len = 1000,
                                    .slack = 32,
                                    .params = vase_params_default(256)};
    char msg[256];
    req.params.window = 32;

    assert_int_equal(vase_alloc_new(8 << 20, 64 << 10, &alloc), 0);
    assert_int_equal(vase_layout_compute(&tiny, 8 << 20, &L, msg, sizeof(msg)), 0);
    alloc_fail_arm();
    int r = vase_registry_new(vase_plan_run_free, &reg);
    if (r == 0)
        r = vase_registry_add_client(reg, -1, &a);
    if (r == 0)
        r = vase_registry_add_client(reg, -1, &b);
    if (r == 0)
        r = vase_registry_add_model(reg, a, "tiny", 0, &L, &m);
    if (r == 0)
        r = vase_registry_open_seq(reg, alloc, a, m, &req, 8, 0, &s, msg, sizeof(msg));
    if (r == 0)
        r = vase_registry_open_seq(reg, alloc, a, m, &req, 8, 0, &t, msg, sizeof(msg));
    if (r == 0) {
        r = vase_registry_close_seq(reg, alloc, s); /* no plan: freed at once */
        s = NULL;
    }
    alloc_fail_disarm();

    if (reg) {
        assert_int_equal(reg->n_clients, (a != NULL) + (b != NULL));
        assert_int_equal(reg->n_seqs, (s != NULL) + (t != NULL));
        /* A failed OpenSeq holds no pages: only those of the open sequences are taken. */
        uint64_t held = 0;
        struct vased_seq *open[] = {s, t};
        for (size_t i = 0; i < 2; i++)
            if (open[i])
                held += vase_registry_seq_bytes(open[i]);
        assert_int_equal(alloc->used_bytes, held);
        if (a)
            assert_int_equal(a->bytes, held);
        check_alloc(alloc);
        if (s)
            assert_int_equal(vase_registry_close_seq(reg, alloc, s), 0);
        if (t)
            assert_int_equal(vase_registry_close_seq(reg, alloc, t), 0);
        if (b)
            vase_registry_remove_client(reg, b);
    }
    assert_int_equal(alloc->used_bytes, 0);
    assert_int_equal(alloc->n_free_granules, alloc->n_granules);
    check_alloc(alloc);
    vase_registry_free(reg);
    vase_alloc_free(alloc);
    return r;
}

static void test_registry_alloc(void **state) {
    (void)state;
    /* 3 allocations make the allocator, 2 each of the 3 classes. */
    assert_true(alloc_fail_sweep("alloc: vase_alloc_new/reserve", step_alloc, NULL, 0) >= 9);
    assert_true(alloc_fail_sweep("registry: new/add_client/add_model/open_seq/close_seq",
                                 step_registry, NULL, 0) >= 6);
}

/* ---- plan runs ---- */

enum { PL = 4, PHQ = 4, PHKV = 2, PD = 16, PB = 16, PBUDGET = 256, PW = 32, PLEN = 1024 };

struct plan_ctx {
    struct plan_fixture f;
    struct vase_plan_run *run;
    bool own_ws; /* make the workspace first (else vase_plan_run_layers() makes its own) */
};

static int step_plan_run_new(void *ctx) {
    (void)ctx;
    struct vase_plan_run *run = NULL;
    alloc_fail_arm();
    int r = vase_plan_run_new(&run);
    alloc_fail_disarm();
    vase_plan_run_free(run);
    return r;
}

static int step_plan_layers(void *ctx) {
    struct plan_ctx *p = ctx;
    struct vase_workspace *ws = NULL;
    uint32_t bad = UINT32_MAX;
    alloc_fail_arm();
    int r = p->own_ws ? vase_workspace_new(&ws) : 0;
    if (r == 0)
        r = vase_plan_run_layers(p->run, 0, PL, ws, &bad);
    alloc_fail_disarm();
    if (r < 0 && (!p->own_ws || ws))
        assert_true(bad < PL); /* the failing layer is named */
    vase_workspace_free(ws);
    return r;
}

static void test_plan_run(void **state) {
    (void)state;
    static const enum vase_policy policies[] = {VASE_POLICY_VASE_ATTNV, VASE_POLICY_VASE_DKV,
                                                VASE_POLICY_SNAPKV, VASE_POLICY_RKV};
    struct plan_ctx p = {0};
    const struct vase_layout_geometry g = {PL, PHQ, PHKV, PD, VASE_DTYPE_F32, PB};
    struct vase_alloc *alloc;
    uint64_t client = 0;

    assert_int_equal(vase_arena_new(0, "host", VASE_CUDA_SHARE_IPC, 4 << 20, 64 << 10, &p.f.arena),
                     0);
    assert_int_equal(vase_alloc_new(p.f.arena->size, p.f.arena->granule_bytes, &alloc), 0);
    plan_fixture_shape(&p.f, &g, PLEN, PW, PBUDGET);
    struct vase_alloc_req parts[3] = {
        {.unit = p.f.page_bytes, .n = p.f.n_pages, .ret = p.f.pages},
        {.unit = p.f.ring_page_bytes, .n = p.f.n_ring, .ret = p.f.ring},
        {.unit = p.f.plan_page_bytes, .n = p.f.n_plan, .ret = p.f.plan},
    };
    assert_int_equal(vase_alloc_reserve(alloc, parts, 3, 0, &client), 0);
    vase_alloc_free(alloc);
    plan_fixture_fill(&p.f, 5);

    assert_int_equal(alloc_fail_sweep("evictor: vase_plan_run_new", step_plan_run_new, NULL, 0), 1);
    for (size_t i = 0; i < sizeof(policies) / sizeof(policies[0]); i++) {
        char what[96];
        p.run = plan_fixture_run(&p.f, policies[i]);
        p.run->seq_id = 3;
        p.run->seed = 11;
        p.run->keep_lists = malloc((size_t)PL * PHKV * p.run->keep * sizeof(uint32_t));
        assert_non_null(p.run->keep_lists);
        for (int own = 0; own < 2; own++) {
            p.own_ws = own;
            snprintf(what, sizeof(what), "evictor: vase_plan_run_layers %s, %s",
                     vase_policy_to_string(policies[i]),
                     own ? "given a new workspace" : "its own workspace");
            assert_true(alloc_fail_sweep(what, step_plan_layers, &p, 0) > 0);
        }
        p.run = vase_plan_run_free(p.run);
    }
    vase_arena_free(p.f.arena);
}

/* ---- the allow-list and the host arena ---- */

/* Numeric ids and root, which every system resolves, in both spellings of the separators. */
static int step_allow(void *ctx) {
    (void)ctx;
    struct vase_allow a = {0};
    alloc_fail_arm();
    int r = vase_allow_parse("0, 1000 1001,1002,root", "0 100,1000", &a);
    alloc_fail_disarm();
    if (r == 0) {
        assert_int_equal(a.n_uids, 5);
        assert_int_equal(a.n_gids, 3);
        assert_int_equal(vase_allow_check(&a, 999, 1001, 5, NULL, 0), 0);
    }
    vase_allow_done(&a);
    return r;
}

static int step_peer_groups(void *ctx) {
    (void)ctx;
    gid_t *groups = NULL;
    size_t n = 0;
    alloc_fail_arm();
    int r = vase_allow_peer_groups(0, 0, &groups, &n);
    alloc_fail_disarm();
    if (r < 0)
        assert_null(groups);
    free(groups);
    return r;
}

static int step_host_arena(void *ctx) {
    (void)ctx;
    struct vase_arena *a = NULL;
    alloc_fail_arm();
    int r = vase_arena_new(0, "host", VASE_CUDA_SHARE_IPC, 1 << 20, 64 << 10, &a);
    alloc_fail_disarm();
    if (r == 0)
        assert_int_equal(a->num_granules, 16);
    else
        assert_null(a);
    vase_arena_free(a);
    return r;
}

static void test_allow_arena(void **state) {
    (void)state;
    assert_true(alloc_fail_sweep("allow: vase_allow_parse", step_allow, NULL, 0) >= 2);
    /* Root's supplementary groups: at least the one allocation of the list. */
    assert_true(alloc_fail_sweep("allow: vase_allow_peer_groups", step_peer_groups, NULL, 0) >= 1);
    assert_true(alloc_fail_sweep("arena: vase_arena_new host", step_host_arena, NULL, 0) >= 1);
}

/* ---- fair queue ---- */

struct fq_ctx {
    struct vase_fairq q;
    struct vase_fairq_run runs[3];
    struct vase_fairq_job jobs[3][2];
};

/* The queue allocates nothing (fairq.h): a sweep of it must find no allocation at all. */
static int step_fairq(void *ctx) {
    struct fq_ctx *c = ctx;
    struct vase_fairq_job *j;
    int popped = 0, r = 0;
    *c = (struct fq_ctx){0};
    alloc_fail_arm();
    for (uint32_t i = 0; i < 3 && r == 0; i++) {
        c->jobs[i][0].next = &c->jobs[i][1];
        r = vase_fairq_push(&c->q, &c->runs[i], i % 2, i, &c->jobs[i][0]);
    }
    while (r == 0 && vase_fairq_pop(&c->q, &j) == 1)
        popped++;
    alloc_fail_disarm();
    assert_int_equal(popped, 6);
    assert_true(vase_fairq_is_empty(&c->q));
    return r;
}

static void test_fairq(void **state) {
    (void)state;
    struct fq_ctx c;
    assert_int_equal(alloc_fail_sweep("fairq: push/pop", step_fairq, &c, 0), 0);
}

/* ---- daemon start-up ---- */

/*
 * The whole start-up of vased_run() in this process, in a fresh runtime directory each time:
 * incarnation, signals, directory and sockets, access lists, a 1 MiB host arena, registry, one
 * evictor thread, timer. Only this thread's allocations are counted; the evictor's and
 * ZeroMQ's own (C++, in a shared library) are not. Start-up blocks SIGTERM, SIGINT and SIGHUP
 * and installs handlers for them; the step puts the mask and the handlers back.
 */
static int step_setup_start(void *ctx) {
    (void)ctx;
    static const int sigs[] = {SIGTERM, SIGINT, SIGHUP, SIGPIPE};
    struct sigaction old_sa[4];
    sigset_t old_mask;
    char dir[] = "/tmp/vase-setup-XXXXXX";

    assert_non_null(mkdtemp(dir));
    assert_int_equal(chmod(dir, 0700), 0);
    assert_int_equal(pthread_sigmask(SIG_SETMASK, NULL, &old_mask), 0);
    for (size_t i = 0; i < 4; i++)
        assert_int_equal(sigaction(sigs[i], NULL, &old_sa[i]), 0);

    struct vased *d = calloc(1, sizeof(*d));
    assert_non_null(d);
    assert_int_equal(vase_config_init(&d->cfg), 0);
    assert_int_equal(vase_config_set(&d->cfg, "runtime_dir", dir, 0), 0);
    assert_int_equal(vase_config_set(&d->cfg, "arena", "host", 0), 0);
    assert_int_equal(vase_config_set(&d->cfg, "arena_bytes", "1M", 0), 0);
    assert_int_equal(vase_config_set(&d->cfg, "granule_bytes", "64K", 0), 0);
    assert_int_equal(vase_config_set(&d->cfg, "evictor_threads", "1", 0), 0);
    d->session_fd = d->signal_fd = d->timer_fd = d->runtime_dir_fd = -1;
    d->self_uid = geteuid();

    alloc_fail_arm();
    int r = vase_setup_start(d);
    alloc_fail_disarm();
    if (r == 0) {
        assert_int_equal(d->n_arenas, 1);
        assert_int_equal(d->arenas[0]->num_granules, 16);
        assert_non_null(d->reg);
        assert_non_null(d->evictor);
        assert_true(d->session_fd >= 0 && d->timer_fd >= 0 && d->signal_fd >= 0);
    }
    /* Blocks of the armed stretch stay tracked: the teardown must free them all. */
    vase_setup_teardown(d);
    free(d);

    /* Teardown leaves no socket behind: the directory is empty again. */
    assert_int_equal(rmdir(dir), 0);
    for (size_t i = 0; i < 4; i++)
        assert_int_equal(sigaction(sigs[i], &old_sa[i], NULL), 0);
    assert_int_equal(pthread_sigmask(SIG_SETMASK, &old_mask, NULL), 0);
    return r;
}

static void test_setup_start(void **state) {
    (void)state;
    assert_true(alloc_fail_sweep("setup: vase_setup_start", step_setup_start, NULL, 0) >= 5);
}

static int teardown(void **state) {
    (void)state;
    alloc_fail_disarm(); /* a failed assertion may leave a step armed */
    return 0;
}

int main(void) {
    /* Every injected failure is logged where it is handled; only the sweeps' counts matter. */
    vase_log_set_max_level(LOG_EMERG);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_config, teardown),
        cmocka_unit_test_teardown(test_registry_alloc, teardown),
        cmocka_unit_test_teardown(test_plan_run, teardown),
        cmocka_unit_test_teardown(test_allow_arena, teardown),
        cmocka_unit_test_teardown(test_fairq, teardown),
        cmocka_unit_test_teardown(test_setup_start, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
