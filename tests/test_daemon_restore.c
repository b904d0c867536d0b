/* SPDX-License-Identifier: MIT */

/* Unit tests of the sequences kept across a restart: daemon/core/registry.c takes a saved sequence
 * back only when every field fits what an open of its request holds, with exactly its pages;
 * daemon/serve/restore.c gives it only to a client of the same uid presenting its token, with a
 * model of its geometry, and only once. A kept arena is taken back only with the snapshot of the
 * stop that last stamped it: the test_bound_* play the fd store on a notification socket of its
 * own and replays stale, blank and twice-used pairs, and snapshots of another format version, cut
 * short, changed, or with a field a later vased adds. (The fd store and the snapshot file are also
 * tested through a real vased by tests/test_sd_emu.sh.) */

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "log_capture.h"

#include "../daemon/core/alloc.h"
#include "../daemon/core/registry.h"
#include "../daemon/plan/planner.h"
#include "../daemon/serve/restore.h"
#include "../daemon/state.h"
#include "vase.pb-c.h"

static const struct vase_layout_geometry tiny = {.layers = 4,
                                                 .q_heads = 6,
                                                 .kv_heads = 2,
                                                 .head_dim = 16,
                                                 .dtype = VASE_DTYPE_F32,
                                                 .block_tokens = 64};
#define ARENA (4u << 20)
#define GRANULE (64u << 10)

struct fixture {
    struct vased d;
    struct vase_layout layout;
    struct vased_seq_saved sv;
    uint32_t pages[64], plan[1];
};

/* A streaming sequence of budget 256, window 64, in KV pages 0.. and one plan page in the last
 * granule. */
static void saved_seq(struct fixture *f, uint32_t id) {
    struct vased_seq_footprint fp;
    char msg[256];
    f->sv = (struct vased_seq_saved){
        .id = id,
        .uid = 1000,
        .layout = f->layout,
        .req = {.policy = VASE_POLICY_STREAMING,
                .params = vase_params_default(256),
                .slack = 64,
                .mode = VASE__MODE__MODE_ASYNC,
                .min_budget = 256,
                .weight = 1},
        .budget = 256,
        .cap_budget = 256,
        .target_budget = 256,
        .len = 300,
        .rounds = 3,
        .position = 900,
    };
    memset(f->sv.token, 0x5a, sizeof(f->sv.token));
    assert_int_equal(vase_registry_footprint(&f->layout, &f->sv.req, &fp, msg, sizeof(msg)), 0);
    assert_true(fp.kv_pages <= 64);
    assert_int_equal(fp.ring_pages, 0);
    for (uint32_t i = 0; i < fp.kv_pages; i++)
        f->pages[i] = i;
    f->plan[0] = (uint32_t)((ARENA - GRANULE) / fp.plan.plan_page_bytes);
    f->sv.n_pages = fp.kv_pages;
    f->sv.pages = f->pages;
    f->sv.n_plan_pages = 1;
    f->sv.plan_pages = f->plan;
}

static int setup(void **state) {
    struct fixture *f = calloc(1, sizeof(*f));
    char msg[256];
    assert_non_null(f);
    assert_int_equal(vase_layout_compute(&tiny, ARENA, &f->layout, msg, sizeof(msg)), 0);
    assert_int_equal(vase_registry_new(vase_plan_run_free, &f->d.reg), 0);
    assert_int_equal(vase_alloc_new(ARENA, GRANULE, &f->d.allocs[0]), 0);
    f->d.n_arenas = 1;
    saved_seq(f, 5);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    struct fixture *f = *state;
    char msg[256];
    f->d.reg = vase_registry_free(f->d.reg);
    assert_int_equal(vase_alloc_check(f->d.allocs[0], msg, sizeof(msg)), 0);
    vase_alloc_free(f->d.allocs[0]);
    free(f);
    return 0;
}

static void test_restore_checks(void **state) {
    struct fixture *f = *state;
    struct vase_alloc *a = f->d.allocs[0];
    struct vase_registry *reg = f->d.reg;
    char msg[384];

    /* A KV page outside the arena, while nothing else holds the plan page: refused for the KV
     * page itself, nothing held. */
    uint32_t outside = f->layout.num_blocks;
    struct vased_seq_saved far = f->sv;
    far.pages = &outside;
    far.n_pages = 1;
    far.len = 0;
    assert_int_equal(vase_registry_restore_seq(reg, a, &far, msg, sizeof(msg)), -EEXIST);
    assert_int_equal(a->used_bytes, 0);
    assert_int_equal(reg->n_restored, 0);

    assert_int_equal(vase_registry_restore_seq(reg, a, &f->sv, msg, sizeof(msg)), 0);
    assert_int_equal(reg->n_restored, 1);
    assert_int_equal(reg->n_seqs, 0); /* nobody's: unreachable by id */
    assert_null(vase_registry_find_seq(reg, 5));
    assert_true(reg->next_seq_id > 5); /* new sequences never take its id */
    struct vased_seq *s = vase_registry_find_restored(reg, 5);
    assert_non_null(s);
    assert_int_equal(s->len, 300);
    assert_int_equal(s->rounds, 3);
    assert_int_equal(s->position, 900);
    assert_int_equal(s->keep, 192);
    uint64_t used = a->used_bytes;
    assert_int_equal(used, vase_registry_seq_bytes(s));
    for (uint32_t i = 0; i < f->sv.n_pages; i++)
        assert_true(vase_alloc_is_used(a, f->layout.page_bytes, i));

    /* The same id again; another id on the same pages: refused, nothing more held. */
    assert_int_equal(vase_registry_restore_seq(reg, a, &f->sv, msg, sizeof(msg)), -EINVAL);
    f->sv.id = 6;
    assert_int_equal(vase_registry_restore_seq(reg, a, &f->sv, msg, sizeof(msg)), -EEXIST);
    assert_non_null(strstr(msg, "another's"));
    assert_int_equal(a->used_bytes, used);

    /* Fields that do not fit the request. */
    struct vased_seq_saved bad = f->sv;
    bad.n_pages = 0;
    assert_int_equal(vase_registry_restore_seq(reg, a, &bad, msg, sizeof(msg)), -EINVAL);
    bad = f->sv;
    bad.budget = 250; /* not a multiple of the window */
    assert_int_equal(vase_registry_restore_seq(reg, a, &bad, msg, sizeof(msg)), -EINVAL);
    bad = f->sv;
    bad.len = bad.n_pages * f->layout.block_tokens + 1;
    assert_int_equal(vase_registry_restore_seq(reg, a, &bad, msg, sizeof(msg)), -EINVAL);
    bad = f->sv;
    bad.n_plan_pages = 0;
    assert_int_equal(vase_registry_restore_seq(reg, a, &bad, msg, sizeof(msg)), -EINVAL);
    bad = f->sv;
    bad.req.params.window = 0;
    assert_int_equal(vase_registry_restore_seq(reg, a, &bad, msg, sizeof(msg)), -EINVAL);
    /* A protected prompt must fit the budget with the window (192 of budget 256, window 64). */
    bad = f->sv;
    bad.id = 7;
    bad.req.params.protect_prompt = 2;
    assert_int_equal(vase_registry_restore_seq(reg, a, &bad, msg, sizeof(msg)), -EINVAL);
    bad.req.params.protect_prompt = 1;
    bad.req.prompt_len = 193;
    assert_int_equal(vase_registry_restore_seq(reg, a, &bad, msg, sizeof(msg)), -EINVAL);
    /* A label the rule of OpenSeq.label refuses: one that is too long (no terminator in its 65
     * bytes) or holds a byte outside the set. */
    bad = f->sv;
    bad.id = 7;
    memset(bad.req.label, 'a', sizeof(bad.req.label));
    assert_int_equal(vase_registry_restore_seq(reg, a, &bad, msg, sizeof(msg)), -EINVAL);
    assert_non_null(strstr(msg, "label"));
    strcpy(bad.req.label, "req\n7");
    assert_int_equal(vase_registry_restore_seq(reg, a, &bad, msg, sizeof(msg)), -EINVAL);
    assert_int_equal(a->used_bytes, used);

    /* Dropped: its pages come back. */
    vase_registry_drop_restored(reg, a, s);
    assert_int_equal(reg->n_restored, 0);
    assert_int_equal(a->used_bytes, 0);
}

static void test_reopen(void **state) {
    struct fixture *f = *state;
    struct vased *d = &f->d;
    struct vase_alloc *a = d->allocs[0];
    char msg[384];
    assert_int_equal(vase_registry_restore_seq(d->reg, a, &f->sv, msg, sizeof(msg)), 0);

    struct vased_client *c, *other;
    struct vased_model *m, *m_other, *m_wide;
    assert_int_equal(vase_registry_add_client(d->reg, -1, &c), 0);
    assert_int_equal(vase_registry_add_client(d->reg, -1, &other), 0);
    c->uid = 1000;
    other->uid = 1001;
    assert_int_equal(vase_registry_add_model(d->reg, c, "m", 0, &f->layout, &m), 0);
    assert_int_equal(vase_registry_add_model(d->reg, other, "m", 0, &f->layout, &m_other), 0);
    struct vase_layout_geometry g = tiny;
    g.head_dim = 32;
    struct vase_layout wide;
    assert_int_equal(vase_layout_compute(&g, ARENA, &wide, msg, sizeof(msg)), 0);
    assert_int_equal(vase_registry_add_model(d->reg, c, "wide", 0, &wide, &m_wide), 0);

    uint8_t token[16], wrong[16];
    memset(token, 0x5a, sizeof(token));
    memcpy(wrong, token, sizeof(wrong));
    wrong[15] ^= 1;
    struct vased_seq *s = NULL;
    const enum vase_policy P = VASE_POLICY_STREAMING;
#define REOPEN(client, model, id, tok, len, policy, budget)                                        \
    vase_restore_reopen(d, client, model, id, tok, len, policy, budget, 64, &s, msg, sizeof(msg))

    assert_int_equal(REOPEN(c, m, 9, token, 16, P, 256), -ENOENT);
    assert_int_equal(REOPEN(c, m, 5, wrong, 16, P, 256), -ENOENT);
    assert_int_equal(REOPEN(c, m, 5, token, 15, P, 256), -ENOENT);
    assert_int_equal(REOPEN(c, m, 5, NULL, 0, P, 256), -ENOENT);
    /* The right token from another uid: still not its sequence. */
    assert_int_equal(REOPEN(other, m_other, 5, token, 16, P, 256), -ENOENT);
    assert_int_equal(REOPEN(c, m_wide, 5, token, 16, P, 256), -EINVAL);
    assert_int_equal(REOPEN(c, m, 5, token, 16, VASE_POLICY_RANDOM, 256), -EINVAL);
    assert_int_equal(REOPEN(c, m, 5, token, 16, P, 512), -EINVAL);
    assert_null(s);
    assert_int_equal(d->reg->n_restored, 1);
    assert_int_equal(c->bytes, 0);

    assert_int_equal(REOPEN(c, m, 5, token, 16, P, 256), 0);
    assert_non_null(s);
    assert_ptr_equal(s->client, c);
    assert_ptr_equal(s->model, m);
    assert_int_equal(d->reg->n_restored, 0);
    assert_int_equal(c->n_seqs, 1);
    assert_int_equal(c->bytes, vase_registry_seq_bytes(s));
    struct vased_seq *found;
    assert_int_equal(vase_registry_get_seq(d->reg, c, 5, &found), 0);
    assert_ptr_equal(found, s);
    assert_int_equal(vase_registry_get_seq(d->reg, other, 5, &found), -ENOENT);
    /* Once only. */
    assert_int_equal(REOPEN(c, m, 5, token, 16, P, 256), -ENOENT);
#undef REOPEN

    assert_int_equal(vase_registry_close_seq(d->reg, a, s), 0);
    assert_int_equal(c->bytes, 0);
    assert_int_equal(a->used_bytes, 0);
}

/* ---- the fd store: what systemd keeps for vased, played on NOTIFY_SOCKET ---- */

struct store {
    int sock;
    char dir[64], path[96];
    int arena, state; /* the stored "arena-0" and "state", or -1 */
    unsigned arena_removed;
};

static void store_open(struct store *st) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    strcpy(st->dir, "/tmp/vase-restore-XXXXXX");
    assert_non_null(mkdtemp(st->dir));
    snprintf(st->path, sizeof(st->path), "%s/notify", st->dir);
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", st->path);
    st->sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    assert_true(st->sock >= 0);
    assert_int_equal(bind(st->sock, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(setenv("NOTIFY_SOCKET", st->path, 1), 0);
    st->arena = st->state = -1;
    st->arena_removed = 0;
}

static void store_close(struct store *st) {
    unsetenv("NOTIFY_SOCKET");
    close(st->sock);
    if (st->arena >= 0)
        close(st->arena);
    if (st->state >= 0)
        close(st->state);
    unlink(st->path);
    rmdir(st->dir);
}

static void put_fd(int *slot, int fd) {
    if (*slot >= 0)
        close(*slot);
    *slot = fd;
}

/* Takes every notification sent so far: FDSTORE and FDSTOREREMOVE of arena-0 and state. */
static void store_drain(struct store *st) {
    for (;;) {
        char text[256] = "";
        union {
            struct cmsghdr h;
            char buf[CMSG_SPACE(sizeof(int))];
        } ctl;
        struct iovec iov = {text, sizeof(text) - 1};
        struct msghdr m = {
            .msg_iov = &iov, .msg_iovlen = 1, .msg_control = &ctl, .msg_controllen = sizeof(ctl)};
        ssize_t n = recvmsg(st->sock, &m, MSG_CMSG_CLOEXEC);
        if (n < 0) {
            assert_int_equal(errno, EAGAIN);
            return;
        }
        int fd = -1;
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        if (c && c->cmsg_type == SCM_RIGHTS)
            memcpy(&fd, CMSG_DATA(c), sizeof(fd));
        bool arena = strstr(text, "FDNAME=arena-0") != NULL;
        assert_true(arena || strstr(text, "FDNAME=state"));
        if (strstr(text, "FDSTOREREMOVE=1")) {
            put_fd(arena ? &st->arena : &st->state, -1);
            st->arena_removed += arena;
        } else {
            assert_non_null(strstr(text, "FDSTORE=1"));
            assert_true(fd >= 0);
            put_fd(arena ? &st->arena : &st->state, fd);
            fd = -1;
        }
        if (fd >= 0)
            close(fd);
    }
}

/* A vased's start as restore.c sees it: systemd hands back arena_fd and state_fd (dups; -1:
 * none), arena 0 is made or kept, the snapshot's sequences restored. The log in *ret_log. */
static void start(struct vased *d, uint64_t incarnation, int arena_fd, int state_fd,
                  const char **ret_log) {
    memset(d, 0, sizeof(*d));
    d->incarnation = incarnation;
    d->cfg.restore_grace = 120;
    log_capture_begin();
    if (arena_fd >= 0)
        assert_int_equal(vase_restore_take_fd(d, dup(arena_fd), "arena-0"), 1);
    if (state_fd >= 0)
        assert_int_equal(vase_restore_take_fd(d, dup(state_fd), "state"), 1);
    assert_int_equal(vase_restore_load(d), 0);
    assert_int_equal(vase_restore_arena(d, 0, "default", "host", VASE_CUDA_SHARE_IPC, ARENA,
                                        GRANULE, &d->arenas[0]),
                     0);
    d->n_arenas = 1;
    d->arena_names[0] = "default";
    assert_int_equal(vase_registry_new(vase_plan_run_free, &d->reg), 0);
    assert_int_equal(vase_alloc_new(ARENA, GRANULE, &d->allocs[0]), 0);
    assert_int_equal(vase_restore_seqs(d), 0);
    *ret_log = log_capture_end();
}

/* Its stop: clean (the snapshot stored) or not (a crash); everything freed. */
static void stop(struct vased *d, bool clean) {
    log_capture_begin();
    if (clean)
        vase_restore_save(d);
    log_capture_end();
    d->reg = vase_registry_free(d->reg);
    d->allocs[0] = vase_alloc_free(d->allocs[0]);
    d->arenas[0] = vase_arena_free(d->arenas[0]);
    vase_restore_done(d);
}

static uint8_t first_byte(const struct vased *d) {
    return *(const uint8_t *)vase_arena_at(d->arenas[0], 0);
}

/* A first start on an empty store: a new arena, given to the store, one sequence on it, the
 * first page of K/V written with fill; a clean stop. The store has the arena and the snapshot. */
static void first_life(struct fixture *f, struct vased *d, struct store *st, uint8_t fill) {
    const char *log;
    char msg[384];
    start(d, 0x1111, -1, -1, &log);
    store_drain(st);
    assert_true(st->arena >= 0);
    assert_int_equal(vase_registry_restore_seq(d->reg, d->allocs[0], &f->sv, msg, sizeof(msg)), 0);
    memset(vase_arena_at(d->arenas[0], 0), fill, 4096);
    stop(d, true);
    store_drain(st);
    assert_true(st->state >= 0);
}

/* The pair of one stop: kept, contents and sequence intact. */
static void test_bound_kept(void **state) {
    struct store st;
    struct vased *d = calloc(1, sizeof(*d));
    const char *log;
    assert_non_null(d);
    store_open(&st);
    first_life(*state, d, &st, 0xa1);
    start(d, 0x2222, st.arena, st.state, &log);
    assert_non_null(strstr(log, "Arena 0 \"default\": kept across the restart"));
    assert_int_equal(first_byte(d), 0xa1);
    assert_int_equal(d->reg->n_restored, 1);
    stop(d, false);
    store_drain(&st);
    assert_int_equal(st.arena_removed, 0);
    store_close(&st);
    free(d);
}

/* A snapshot of an earlier stop with the arena as a later one left it; a pair replayed. */
static void test_bound_stale(void **state) {
    struct store st;
    struct vased *d = calloc(1, sizeof(*d));
    const char *log;
    assert_non_null(d);
    store_open(&st);
    first_life(*state, d, &st, 0xa1);
    int stale = dup(st.state);

    /* Kept; then the pages are written again (another owner's now, say) and it stops again. */
    start(d, 0x2222, st.arena, st.state, &log);
    assert_non_null(strstr(log, "kept across the restart"));
    memset(vase_arena_at(d->arenas[0], 0), 0xb2, 4096);
    stop(d, true);
    store_drain(&st);
    int arena = dup(st.arena), fresh = dup(st.state);

    /* The first stop's snapshot with it: discarded with the reason; a new arena, no sequence. */
    start(d, 0x3333, arena, stale, &log);
    assert_non_null(strstr(log, "Discarding the kept memory of arena 0 \"default\": the snapshot "
                                "is of another stop than the one that stamped this memory"));
    assert_non_null(strstr(log, "a stale or foreign pair"));
    assert_null(strstr(log, "kept across the restart"));
    assert_int_equal(first_byte(d), 0);
    assert_int_equal(d->reg->n_restored, 0);
    stop(d, false);
    store_drain(&st);
    assert_int_equal(st.arena_removed, 1);

    /* The second stop's own pair is still good; taken back once (then a crash), it cannot be
     * again. */
    start(d, 0x4444, arena, fresh, &log);
    assert_non_null(strstr(log, "kept across the restart"));
    assert_int_equal(first_byte(d), 0xb2);
    assert_int_equal(d->reg->n_restored, 1);
    stop(d, false);
    start(d, 0x5555, arena, fresh, &log);
    assert_non_null(strstr(log, "Discarding the kept memory of arena 0 \"default\": its memfd "
                                "carries no stamp of a stop"));
    assert_int_equal(first_byte(d), 0);
    assert_int_equal(d->reg->n_restored, 0);
    stop(d, false);

    close(arena);
    close(fresh);
    close(stale);
    store_close(&st);
    free(d);
}

/* A blank memfd of the arena's size and seals in its place: discarded, not adopted as intact. */
static void test_bound_blank(void **state) {
    struct store st;
    struct vased *d = calloc(1, sizeof(*d));
    const char *log;
    struct stat sb;
    assert_non_null(d);
    store_open(&st);
    first_life(*state, d, &st, 0xa1);
    assert_int_equal(fstat(st.arena, &sb), 0);
    int blank = memfd_create("blank", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_true(blank >= 0);
    assert_int_equal(ftruncate(blank, sb.st_size), 0);
    assert_int_equal(fcntl(blank, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
    start(d, 0x2222, blank, st.state, &log);
    assert_non_null(strstr(log, "Discarding the kept memory of arena 0 \"default\": its memfd "
                                "carries no stamp of a stop"));
    assert_null(strstr(log, "kept across the restart"));
    assert_int_equal(d->reg->n_restored, 0);
    stop(d, false);
    close(blank);
    store_close(&st);
    free(d);
}

/* Every field of a sequence comes back as it was stopped (a protected prompt and a label among
 * them): none is left out of the snapshot. */
static void test_bound_every_field(void **state) {
    struct fixture *f = *state;
    struct store st;
    struct vased *d = calloc(1, sizeof(*d));
    const char *log;
    assert_non_null(d);
    f->sv.uid = 4321;
    f->sv.req.seed = UINT64_C(0x0123456789abcdef);
    f->sv.req.mode = VASE__MODE__MODE_SYNC;
    f->sv.req.prompt_len = 17;
    f->sv.req.params.protect_prompt = 1;
    f->sv.req.slack = 32;
    f->sv.req.min_budget = 128;
    f->sv.req.weight = 9;
    memset(f->sv.req.label, 'L', VASE_WIRE_LABEL_MAX);
    memcpy(f->sv.req.label, "cmpl-7:x/y@z+1=2.3_", 19);
    f->sv.budget = 192;
    f->sv.cap_budget = 192;
    f->sv.target_budget = 128;
    f->sv.budget_changes = 6;
    f->sv.position = UINT64_C(1) << 40;
    for (uint32_t i = 0; i < sizeof(f->sv.token); i++)
        f->sv.token[i] = (uint8_t)(i * 7 + 1);
    /* At budget 192 it holds the pages of 192 + window + slack tokens. */
    struct vased_seq_footprint fp;
    char msg[256];
    assert_int_equal(vase_registry_footprint_at(&f->layout, &f->sv.req, 192, &fp, msg, sizeof(msg)),
                     0);
    f->sv.n_pages = fp.kv_pages;
    f->sv.len = fp.kv_pages * f->layout.block_tokens - 5;
    store_open(&st);
    first_life(f, d, &st, 0xa3);
    start(d, 0x2222, st.arena, st.state, &log);
    struct vased_seq *s = vase_registry_find_restored(d->reg, 5);
    assert_non_null(s);
    const struct vased_seq_saved *sv = &f->sv;
    assert_int_equal(s->arena_id, sv->arena_id);
    assert_int_equal(s->owner_uid, sv->uid);
    assert_memory_equal(s->resume_token, sv->token, sizeof(sv->token));
    assert_memory_equal(&s->layout, &sv->layout, sizeof(s->layout));
    assert_int_equal(s->policy, sv->req.policy);
    assert_memory_equal(&s->max_params, &sv->req.params, sizeof(s->max_params));
    assert_int_equal(s->params.protect_prompt, 1);
    assert_int_equal(s->prompt_len, sv->req.prompt_len);
    assert_true(s->seed == sv->req.seed);
    assert_int_equal(s->mode, sv->req.mode);
    assert_int_equal(s->slack, sv->req.slack);
    assert_int_equal(s->min_budget, sv->req.min_budget);
    assert_int_equal(s->weight, sv->req.weight);
    assert_int_equal(strlen(s->label), VASE_WIRE_LABEL_MAX);
    assert_string_equal(s->label, sv->req.label);
    assert_int_equal(s->params.budget, sv->budget);
    assert_int_equal(s->max_budget, sv->req.params.budget);
    assert_int_equal(s->cap_budget, sv->cap_budget);
    assert_int_equal(s->target_budget, sv->target_budget);
    assert_int_equal(s->budget_changes, sv->budget_changes);
    assert_int_equal(s->len, sv->len);
    assert_int_equal(s->rounds, sv->rounds);
    assert_true(s->position == sv->position);
    assert_int_equal(s->n_pages, sv->n_pages);
    assert_memory_equal(s->pages, sv->pages, sv->n_pages * sizeof(uint32_t));
    assert_int_equal(s->n_ring_pages, sv->n_ring_pages);
    assert_int_equal(s->n_plan_pages, sv->n_plan_pages);
    assert_memory_equal(s->plan_pages, sv->plan_pages, sv->n_plan_pages * sizeof(uint32_t));
    stop(d, false);
    store_drain(&st);
    store_close(&st);
    free(d);
}

/* A sealed memfd holding n bytes of p, as the store hands back. */
static int sealed(const void *p, size_t n) {
    int fd = memfd_create("vase-state", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, p, n), (ssize_t)n);
    assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW), 0);
    return fd;
}

/* The snapshot of a first life as edit leaves it (buf: its bytes, room for 16 more; returns the
 * new length), handed back with the arena: whether it was kept, and the log in *ret_log. */
static bool restart_edited(struct fixture *f, size_t (*edit)(uint8_t *buf, size_t len),
                           char *ret_log, size_t log_size) {
    struct store st;
    struct vased *d = calloc(1, sizeof(*d));
    const char *log;
    struct stat sb;
    assert_non_null(d);
    store_open(&st);
    first_life(f, d, &st, 0xa4);
    assert_int_equal(fstat(st.state, &sb), 0);
    size_t len = (size_t)sb.st_size;
    uint8_t *buf = malloc(len + 16);
    assert_non_null(buf);
    assert_int_equal(pread(st.state, buf, len, 0), (ssize_t)len);
    int fd = sealed(buf, edit(buf, len));
    free(buf);
    start(d, 0x2222, st.arena, fd, &log);
    snprintf(ret_log, log_size, "%s", log);
    bool kept = d->reg->n_restored == 1 && first_byte(d) == 0xa4;
    stop(d, false);
    store_drain(&st);
    close(fd);
    store_close(&st);
    free(d);
    return kept;
}

static void set_u32(uint8_t *p, uint32_t v) {
    memcpy(p, &v, sizeof(v));
}

/* The header's length and checksum of the message's len bytes after it. */
static size_t seal_header(uint8_t *buf, size_t len) {
    uint64_t h = UINT64_C(14695981039346656037);
    for (size_t i = 24; i < len; i++)
        h = (h ^ buf[i]) * UINT64_C(1099511628211);
    set_u32(buf + 12, (uint32_t)(len - 24));
    memcpy(buf + 16, &h, sizeof(h));
    return len;
}

static size_t unchanged(uint8_t *buf, size_t len) {
    (void)buf;
    return len;
}

/* The format before the snapshot was a protobuf message: the same magic, version 3. */
static size_t older_version(uint8_t *buf, size_t len) {
    set_u32(buf + 8, 3);
    return len;
}

static size_t cut_short(uint8_t *buf, size_t len) {
    (void)buf;
    return len - 1;
}

/* One byte of the message changed: the checksum no longer matches. */
static size_t flipped(uint8_t *buf, size_t len) {
    buf[len / 2] ^= 0xff;
    return len;
}

/* The message's bytes replaced by ones that do not unpack (a field of wire type 7), with a
 * checksum that matches. */
static size_t garbled(uint8_t *buf, size_t len) {
    memset(buf + 24, 0xff, len - 24);
    return seal_header(buf, len);
}

/* A field a later vased adds (number 15, a varint): what it wrote is read as before. */
static size_t later_field(uint8_t *buf, size_t len) {
    buf[len] = 15 << 3;
    buf[len + 1] = 0x2a;
    return seal_header(buf, len + 2);
}

/* The snapshot's format: the message is read through its version, length and checksum; a
 * snapshot of another version, one cut short or changed, or one protobuf cannot read discards
 * the arena with the reason; a field added later does not. */
static void test_bound_format(void **state) {
    char log[8192];
    assert_true(restart_edited(*state, unchanged, log, sizeof(log)));
    assert_true(restart_edited(*state, later_field, log, sizeof(log)));
    assert_non_null(strstr(log, "kept across the restart"));

    assert_false(restart_edited(*state, older_version, log, sizeof(log)));
    assert_non_null(strstr(log, "Discarding the state snapshot systemd kept: it has another format "
                                "version (3; this vased reads 4); starting empty."));
    assert_non_null(strstr(log, "Discarding the kept memory of arena 0 \"default\": there is no "
                                "valid state snapshot"));
    assert_false(restart_edited(*state, cut_short, log, sizeof(log)));
    assert_non_null(strstr(log, "its length or checksum is wrong (corrupt)"));
    assert_false(restart_edited(*state, flipped, log, sizeof(log)));
    assert_non_null(strstr(log, "its length or checksum is wrong (corrupt)"));
    assert_false(restart_edited(*state, garbled, log, sizeof(log)));
    assert_non_null(strstr(log, "it does not unpack (corrupt)"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_restore_checks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reopen, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bound_kept, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bound_stale, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bound_blank, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bound_every_field, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bound_format, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
