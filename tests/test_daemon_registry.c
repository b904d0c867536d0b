/* SPDX-License-Identifier: MIT */

/* Unit tests of daemon/core/registry.c: the layout formulas of PROTOCOL.md as the registry uses
 * them, footprints of sequences in bytes, all-or-nothing sequence admission charged in bytes,
 * ownership, shrinking, orphans whose pages wait for their plan, and sequences held for a client
 * whose process may still write them. */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../daemon/core/alloc.h"
#include "../daemon/core/registry.h"

/* The registry never looks inside a plan run (core/ knows the type by name only, and this test
 * links the core layer alone): the test's own stand-in, made by run_new() and freed by the
 * destructor the registry is given, which counts what it frees. */
struct vase_plan_run {
    struct vased_seq *owner;
};

static int runs_freed;

static struct vase_plan_run *free_run(struct vase_plan_run *run) {
    free(run);
    runs_freed++;
    return NULL;
}

static int run_new(struct vase_plan_run **ret) {
    *ret = calloc(1, sizeof(**ret));
    return *ret ? 0 : -ENOMEM;
}

/* Blocks of 64 tokens, 6 query heads over 2 KV heads: a KV page is 64 * 4 * 2 * 2 * 16 * 4 = 65536
 * bytes, a ring entry of every layer 4 * 6 * 16 * 4 = 1536 bytes, so a ring page, one KV page,
 * holds floor(65536 / 1536) = 42 entries. */
static const struct vase_layout_geometry tiny = {.layers = 4,
                                                 .q_heads = 6,
                                                 .kv_heads = 2,
                                                 .head_dim = 16,
                                                 .dtype = VASE_DTYPE_F32,
                                                 .block_tokens = 64};
#define ARENA (4u << 20)
#define GRANULE (64u << 10)

static void test_layout(void **state) {
    (void)state;
    struct vase_layout L;
    struct vase_plan_layout P;
    char msg[256];
    assert_int_equal(vase_layout_compute(&tiny, ARENA, &L, msg, sizeof(msg)), 0);
    assert_int_equal(L.block_tokens, 64);
    assert_int_equal(L.head_stride, 16 * 4);
    assert_int_equal(L.token_stride, 2 * 16 * 4);
    assert_int_equal(L.kv_stride, 64 * 128);
    assert_int_equal(L.layer_stride, 2 * 64 * 128);
    assert_int_equal(L.page_bytes, 65536);
    assert_int_equal(L.num_blocks, ARENA / 65536);
    assert_int_equal(L.ring_row_stride, 6 * 16 * 4);
    assert_int_equal(L.ring_rows_per_page, 42);
    assert_int_equal(L.ring_layer_stride, 42 * 384);
    assert_int_equal(L.ring_page_bytes, 65536); /* a KV page: 42 entries of 1536 bytes fit */
    assert_int_equal(vase_layout_ring_pages(&L, 32, NULL), 2); /* 64 entries */
    assert_int_equal(vase_layout_ring_pages(&L, 0, NULL), 0);
    assert_int_equal(vase_layout_blocks_for(&L, 1064), 17);
    assert_int_equal(vase_layout_blocks_for(&L, 1088), 17);
    assert_int_equal(vase_layout_blocks_for(&L, 1089), 18);

    /* Page (block) 2 of the arena, layer 3, V, token 6 of the block, head 1. */
    const uint32_t table[2] = {5, 2};
    assert_int_equal(vase_layout_kv_offset(&L, table, 3, VASE_V, 70, 1),
                     2 * 65536 + 3 * 16384 + 8192 + 6 * 128 + 64);

    /* Keep lists of 224 slots (896 bytes): the 8 of them, 7168 bytes, in one plan page of
     * 8192, the next power of two. */
    assert_int_equal(vase_layout_plans(&L, 224, &P, msg, sizeof(msg)), 0);
    assert_int_equal(P.lists, 8);
    assert_int_equal(P.plans_per_page, 8);
    assert_int_equal(P.plan_page_bytes, 8192);
    assert_int_equal(P.plan_pages, 1);
    /* Lists larger than a KV page: still one plan page, 8 * 80000 bytes in 1 MiB. */
    assert_int_equal(vase_layout_plans(&L, 20000, &P, msg, sizeof(msg)), 0);
    assert_int_equal(P.plans_per_page, 8);
    assert_int_equal(P.plan_page_bytes, 1 << 20);
    assert_int_equal(P.plan_pages, 1);
    assert_int_equal(vase_layout_plans(&L, 0, &P, msg, sizeof(msg)), -EINVAL);

    /* Block size 0 is the default, 16; other dtypes scale every byte count. */
    struct vase_layout_geometry g = tiny;
    g.block_tokens = 0;
    g.dtype = VASE_DTYPE_BF16;
    assert_int_equal(vase_layout_compute(&g, ARENA, &L, msg, sizeof(msg)), 0);
    assert_int_equal(L.block_tokens, VASE_LAYOUT_DEFAULT_BLOCK_TOKENS);
    assert_int_equal(L.page_bytes, 16 * 4 * 2 * 2 * 16 * 2);

    g = tiny;
    g.q_heads = 3;
    assert_int_equal(vase_layout_compute(&g, ARENA, &L, msg, sizeof(msg)), -EINVAL);
    g = tiny;
    g.layers = 0;
    assert_int_equal(vase_layout_compute(&g, ARENA, &L, msg, sizeof(msg)), -EINVAL);
    g.layers = VASE_LAYOUT_MAX_LAYERS + 1;
    assert_int_equal(vase_layout_compute(&g, ARENA, &L, msg, sizeof(msg)), -EINVAL);
    g = tiny;
    g.head_dim = VASE_MAX_DIM + 1;
    assert_int_equal(vase_layout_compute(&g, ARENA, &L, msg, sizeof(msg)), -EINVAL);
    g = tiny;
    g.dtype = (enum vase_dtype)7;
    assert_int_equal(vase_layout_compute(&g, ARENA, &L, msg, sizeof(msg)), -EINVAL);
    g = tiny;
    g.block_tokens = VASE_LAYOUT_MAX_BLOCK_TOKENS + 1;
    assert_int_equal(vase_layout_compute(&g, ARENA, &L, msg, sizeof(msg)), -EINVAL);
    /* One page larger than the arena: refused, saying what to change. */
    g = tiny;
    g.block_tokens = 128;
    msg[0] = '\0';
    assert_int_equal(vase_layout_compute(&g, 64 << 10, &L, msg, sizeof(msg)), -EINVAL);
    assert_non_null(strstr(msg, "block_tokens"));
    g.block_tokens = 64;
    assert_int_equal(vase_layout_compute(&g, 64 << 10, &L, msg, sizeof(msg)), 0);
}

struct fixture {
    struct vase_registry *reg;
    struct vase_alloc *alloc;
    struct vased_client *a, *b;
    struct vased_model *ma;
};

static int setup(void **state) {
    struct fixture *f = calloc(1, sizeof(*f));
    struct vase_layout L;
    char msg[256];
    assert_int_equal(vase_registry_new(free_run, &f->reg), 0);
    assert_int_equal(vase_alloc_new(ARENA, GRANULE, &f->alloc), 0);
    assert_int_equal(vase_registry_add_client(f->reg, -1, &f->a), 0);
    assert_int_equal(vase_registry_add_client(f->reg, -1, &f->b), 0);
    assert_int_equal(vase_layout_compute(&tiny, ARENA, &L, msg, sizeof(msg)), 0);
    assert_int_equal(vase_registry_add_model(f->reg, f->a, "tiny", 0, &L, &f->ma), 0);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    struct fixture *f = *state;
    vase_registry_free(f->reg);
    vase_alloc_free(f->alloc);
    free(f);
    return 0;
}

static struct vased_seq_request request(uint32_t prompt) {
    struct vased_seq_request r = {
        .policy = VASE_POLICY_VASE_ATTNV, .prompt_len = prompt, .slack = 32};
    r.params = vase_params_default(256);
    r.params.window = 32;
    return r;
}

/* The allocator's books are consistent. */
static void check_alloc(const struct vase_alloc *a) {
    char msg[256] = "";
    int r = vase_alloc_check(a, msg, sizeof(msg));
    if (r != 0)
        fail_msg("vase_alloc_check: %d %s", r, msg);
}

/* KV pages of 65536, two ring pages of 65536 and one plan page for a prompt of 1000:
 * ceil((1000 + 32 + 32) / 64) = 17 KV pages; 8 keep lists of 224 slots are 7168 bytes, in a
 * plan page of 8192. */
#define SEQ_BYTES (17u * 65536u + 2u * 65536u + 8192u)

static void test_footprint(void **state) {
    struct fixture *f = *state;
    struct vased_seq_request req = request(1000);
    struct vased_seq_footprint fp;
    char msg[256];

    assert_int_equal(vase_registry_footprint(&f->ma->layout, &req, &fp, msg, sizeof(msg)), 0);
    assert_int_equal(fp.kv_pages, 17);
    assert_int_equal(fp.ring_pages, 2);
    assert_int_equal(fp.plan.plan_pages, 1);
    assert_int_equal(fp.plan.plan_page_bytes, 8192);
    assert_int_equal(fp.bytes, SEQ_BYTES);
    /* A short prompt reserves the budget; a policy that reads no query has no ring. */
    req = request(10);
    req.policy = VASE_POLICY_STREAMING;
    assert_int_equal(vase_registry_footprint(&f->ma->layout, &req, &fp, msg, sizeof(msg)), 0);
    assert_int_equal(fp.kv_pages, 5); /* ceil((256 + 32 + 32) / 64) */
    assert_int_equal(fp.ring_pages, 0);
    assert_int_equal(fp.bytes, 5u * 65536u + 8192u);
    /* A capacity beyond 32 bits is refused with a reason. */
    req = request(UINT32_MAX - 10);
    msg[0] = '\0';
    assert_int_equal(vase_registry_footprint(&f->ma->layout, &req, &fp, msg, sizeof(msg)), -EINVAL);
    assert_true(msg[0] != '\0');
}

static void test_clients_models(void **state) {
    struct fixture *f = *state;
    struct vased_model *m;
    assert_int_not_equal(f->a->id, f->b->id);
    assert_int_not_equal(f->a->token[0], 0);
    assert_ptr_equal(vase_registry_find_token(f->reg, f->a->token, 16), f->a);
    assert_ptr_equal(vase_registry_find_token(f->reg, f->b->token, 16), f->b);
    assert_null(vase_registry_find_token(f->reg, f->a->token, 15));
    assert_ptr_equal(vase_registry_find_client(f->reg, f->b->id), f->b);
    assert_null(vase_registry_find_client(f->reg, 999));
    assert_int_equal(f->reg->n_clients, 2);
    assert_int_equal(vase_registry_get_model(f->reg, f->a, f->ma->id, &m), 0);
    assert_ptr_equal(m, f->ma);
    assert_int_equal(vase_registry_get_model(f->reg, f->b, f->ma->id, &m), -ENOENT);
    assert_int_equal(vase_registry_get_model(f->reg, f->a, 999, &m), -ENOENT);
    assert_int_equal(f->a->n_models, 1);
}

static void test_open_close(void **state) {
    struct fixture *f = *state;
    struct vased_seq_request req = request(1000);
    struct vased_seq *s, *t;
    char msg[256];

    assert_int_equal(
        vase_registry_open_seq(f->reg, f->alloc, f->a, f->ma, &req, 8, 0, &s, msg, sizeof(msg)), 0);
    assert_int_equal(s->n_pages, 17);
    assert_int_equal(s->n_ring_pages, 2);
    assert_int_equal(s->n_plan_pages, 1);
    assert_int_equal(s->capacity, 17 * 64);
    assert_int_equal(s->keep, 224);
    assert_int_equal(s->plan.plans_per_page, 8);
    assert_int_equal(s->layout.page_bytes, f->ma->layout.page_bytes);
    assert_int_equal(vase_registry_seq_bytes(s), SEQ_BYTES);
    assert_int_equal(f->a->bytes, SEQ_BYTES);
    assert_int_equal(f->alloc->used_bytes, SEQ_BYTES);
    assert_int_equal(f->reg->n_seqs, 1);
    /* Each page was taken at its own size. */
    for (uint32_t i = 0; i < s->n_pages; i++)
        assert_true(vase_alloc_is_used(f->alloc, 65536, s->pages[i]));
    for (uint32_t i = 0; i < s->n_ring_pages; i++)
        assert_true(vase_alloc_is_used(f->alloc, 65536, s->ring_pages[i]));
    assert_true(vase_alloc_is_used(f->alloc, 8192, s->plan_pages[0]));
    check_alloc(f->alloc);

    assert_int_equal(vase_registry_get_seq(f->reg, f->a, s->id, &t), 0);
    assert_ptr_equal(t, s);
    assert_int_equal(vase_registry_get_seq(f->reg, f->b, s->id, &t), -ENOENT);
    assert_int_equal(vase_registry_get_seq(f->reg, f->a, s->id + 100, &t), -ENOENT);

    /* Sequence quota, byte quota, arena space: each refusal takes nothing. */
    uint64_t free_bytes = vase_alloc_free_bytes(f->alloc);
    assert_int_equal(
        vase_registry_open_seq(f->reg, f->alloc, f->a, f->ma, &req, 1, 0, &t, msg, sizeof(msg)),
        -EDQUOT);
    assert_non_null(strstr(msg, "max_seqs_per_client"));
    assert_int_equal(vase_registry_open_seq(f->reg, f->alloc, f->a, f->ma, &req, 8,
                                            2 * SEQ_BYTES - 1, &t, msg, sizeof(msg)),
                     -EDQUOT);
    assert_non_null(strstr(msg, "max_bytes_per_client"));
    struct vased_seq_request huge = request(5000); /* 80 KV pages: more than the arena */
    assert_int_equal(
        vase_registry_open_seq(f->reg, f->alloc, f->a, f->ma, &huge, 8, 0, &t, msg, sizeof(msg)),
        -ENOSPC);
    assert_int_equal(f->a->bytes, SEQ_BYTES);
    assert_int_equal(f->alloc->used_bytes, SEQ_BYTES);
    assert_int_equal(vase_alloc_free_bytes(f->alloc), free_bytes);
    assert_int_equal(f->a->n_seqs, 1);
    assert_int_equal(f->reg->n_seqs, 1);
    check_alloc(f->alloc);

    /* A quota of exactly two sequences admits the second. */
    assert_int_equal(vase_registry_open_seq(f->reg, f->alloc, f->a, f->ma, &req, 8, 2 * SEQ_BYTES,
                                            &t, msg, sizeof(msg)),
                     0);
    assert_int_equal(f->a->bytes, 2 * SEQ_BYTES);
    /* Three fit the 4 MiB arena (3 * 1250304 bytes), a fourth does not. */
    struct vased_seq *u, *v;
    assert_int_equal(
        vase_registry_open_seq(f->reg, f->alloc, f->a, f->ma, &req, 8, 0, &u, msg, sizeof(msg)), 0);
    assert_int_equal(
        vase_registry_open_seq(f->reg, f->alloc, f->a, f->ma, &req, 8, 0, &v, msg, sizeof(msg)),
        -ENOSPC);
    assert_non_null(strstr(msg, "not enough free memory"));
    assert_int_equal(f->alloc->used_bytes, 3 * SEQ_BYTES);
    assert_int_equal(f->a->bytes, 3 * SEQ_BYTES);
    check_alloc(f->alloc);

    /* After the first commit a long prompt's surplus goes back. */
    assert_int_equal(vase_registry_shrink_seq(s, f->alloc, 5), 1);
    assert_int_equal(s->n_pages, 5);
    assert_int_equal(s->capacity, 320);
    assert_int_equal(f->a->bytes, 3 * SEQ_BYTES - 12 * 65536);
    assert_int_equal(f->alloc->used_bytes, 3 * SEQ_BYTES - 12 * 65536);
    assert_int_equal(vase_registry_seq_bytes(s), SEQ_BYTES - 12 * 65536);
    assert_int_equal(vase_registry_shrink_seq(s, f->alloc, 5), 0);
    check_alloc(f->alloc);

    assert_int_equal(vase_registry_close_seq(f->reg, f->alloc, s), 0);
    assert_int_equal(vase_registry_close_seq(f->reg, f->alloc, t), 0);
    assert_int_equal(f->a->bytes, SEQ_BYTES);
    assert_int_equal(f->a->n_seqs, 1);
    assert_int_equal(f->reg->n_seqs, 1);
    assert_int_equal(f->alloc->used_bytes, SEQ_BYTES);
    check_alloc(f->alloc);
    assert_int_equal(vase_registry_close_seq(f->reg, f->alloc, u), 0);
    assert_int_equal(f->a->bytes, 0);
    assert_int_equal(f->alloc->used_bytes, 0);
    assert_int_equal(vase_alloc_free_bytes(f->alloc), ARENA);
    check_alloc(f->alloc);
}

/* Two models of different block sizes and dtypes share one arena; each sequence's pages are of
 * its model's sizes, and closing them all gives every granule back. */
static void test_two_models(void **state) {
    struct fixture *f = *state;
    struct vase_layout_geometry g = tiny;
    struct vase_layout L;
    struct vased_model *mb;
    struct vased_seq *s, *t;
    struct vased_seq_request req = request(1000);
    char msg[256];

    g.block_tokens = 16;
    g.dtype = VASE_DTYPE_BF16;
    assert_int_equal(vase_layout_compute(&g, ARENA, &L, msg, sizeof(msg)), 0);
    assert_int_equal(L.page_bytes, 16 * 4 * 2 * 2 * 16 * 2); /* 8192 */
    assert_int_equal(vase_registry_add_model(f->reg, f->a, "small", 0, &L, &mb), 0);
    assert_int_equal(
        vase_registry_open_seq(f->reg, f->alloc, f->a, f->ma, &req, 8, 0, &s, msg, sizeof(msg)), 0);
    assert_int_equal(
        vase_registry_open_seq(f->reg, f->alloc, f->a, mb, &req, 8, 0, &t, msg, sizeof(msg)), 0);
    assert_int_equal(t->n_pages, 67); /* ceil(1064 / 16) */
    assert_int_equal(t->layout.page_bytes, 8192);
    for (uint32_t i = 0; i < t->n_pages; i++)
        assert_true(vase_alloc_is_used(f->alloc, 8192, t->pages[i]));
    assert_int_equal(f->a->bytes, vase_registry_seq_bytes(s) + vase_registry_seq_bytes(t));
    assert_int_equal(f->alloc->used_bytes, f->a->bytes);
    check_alloc(f->alloc);
    assert_int_equal(vase_registry_close_seq(f->reg, f->alloc, s), 0);
    assert_int_equal(vase_registry_close_seq(f->reg, f->alloc, t), 0);
    assert_int_equal(f->a->bytes, 0);
    assert_int_equal(vase_alloc_free_bytes(f->alloc), ARENA);
    check_alloc(f->alloc);
}

static void test_orphan(void **state) {
    struct fixture *f = *state;
    struct vased_seq_request req = request(100);
    struct vased_seq *s;
    char msg[256];
    assert_int_equal(
        vase_registry_open_seq(f->reg, f->alloc, f->a, f->ma, &req, 8, 0, &s, msg, sizeof(msg)), 0);
    uint64_t held = vase_registry_seq_bytes(s);
    uint32_t id = s->id;
    assert_int_equal(f->a->bytes, held);
    /* A plan is being computed when the sequence closes. */
    assert_int_equal(run_new(&s->run), 0);
    s->run->owner = s;
    s->state = VASED_SEQ_PLANNING;
    assert_int_equal(vase_registry_close_seq(f->reg, f->alloc, s), 1);
    assert_null(vase_registry_find_seq(f->reg, id));
    assert_null(s->client);
    assert_int_equal(f->a->bytes, 0);             /* uncharged */
    assert_int_equal(f->alloc->used_bytes, held); /* but still held */
    assert_true(vase_alloc_free_bytes(f->alloc) < ARENA);
    assert_true(vase_alloc_is_used(f->alloc, s->layout.page_bytes, s->pages[0]));
    assert_ptr_equal(f->reg->orphans, s);
    check_alloc(f->alloc);
    vase_registry_reap(f->reg, f->alloc, s);
    assert_int_equal(f->alloc->used_bytes, 0);
    assert_int_equal(vase_alloc_free_bytes(f->alloc), ARENA);
    assert_null(f->reg->orphans);
    check_alloc(f->alloc);

    /* A client that goes away with open sequences: close each, then remove. */
    assert_int_equal(
        vase_registry_open_seq(f->reg, f->alloc, f->b, f->ma, &req, 8, 0, &s, msg, sizeof(msg)),
        0); /* models are per client, but the registry checks that in get_model */
    assert_int_equal(f->b->bytes, held);
    while (f->b->seqs)
        vase_registry_close_seq(f->reg, f->alloc, f->b->seqs);
    vase_registry_remove_client(f->reg, f->b);
    f->b = NULL;
    assert_int_equal(f->reg->n_clients, 1);
    assert_int_equal(vase_alloc_free_bytes(f->alloc), ARENA);
    check_alloc(f->alloc);
}

/*
 * A client whose process may still write its pages: its sequences are held (unreachable, still
 * charged, pages out of the free pool), one of them with a plan in flight whose end does not free
 * it; the release returns what is idle at once and leaves the planning one to its run.
 */
static void test_hold(void **state) {
    struct fixture *f = *state;
    struct vased_seq_request req = request(100);
    struct vased_seq *s, *t;
    struct vase_alloc *allocs[1] = {f->alloc};
    char msg[256];
    assert_int_equal(
        vase_registry_open_seq(f->reg, f->alloc, f->a, f->ma, &req, 8, 0, &s, msg, sizeof(msg)), 0);
    assert_int_equal(
        vase_registry_open_seq(f->reg, f->alloc, f->a, f->ma, &req, 8, 0, &t, msg, sizeof(msg)), 0);
    uint64_t one = vase_registry_seq_bytes(s);
    uint32_t id = s->id;
    struct vased_model *mb;
    assert_int_equal(vase_registry_add_model(f->reg, f->b, "tiny", 0, &f->ma->layout, &mb), 0);
    assert_int_equal(run_new(&t->run), 0);
    t->run->owner = t;
    t->state = VASED_SEQ_PLANNING;

    struct vased_client *a = f->a;
    vase_registry_hold_seq(f->reg, s);
    vase_registry_hold_seq(f->reg, t);
    assert_null(vase_registry_find_seq(f->reg, id));
    assert_int_equal(f->reg->n_seqs, 0);
    assert_int_equal(a->n_seqs, 0);
    assert_int_equal(a->n_held, 2);
    assert_int_equal(a->bytes, 2 * one); /* still charged */
    assert_ptr_equal(s->holder, a);
    assert_null(s->client);
    vase_registry_drain_client(f->reg, a);
    f->a = NULL;
    f->ma = NULL; /* a's, freed with it */
    assert_int_equal(f->reg->n_clients, 1);
    assert_int_equal(f->reg->n_draining, 1);
    assert_null(vase_registry_find_token(f->reg, a->token, VASE_TOKEN_BYTES));

    /* The plan ends first: its run goes, its pages stay. */
    int freed = runs_freed;
    vase_registry_reap(f->reg, f->alloc, t);
    assert_null(t->run);
    assert_int_equal(runs_freed, freed + 1);
    assert_int_equal(t->state, VASED_SEQ_IDLE);
    assert_int_equal(f->alloc->used_bytes, 2 * one);
    check_alloc(f->alloc);
    assert_int_equal(vase_registry_release_client(f->reg, allocs, a), 2 * one);
    assert_int_equal(f->reg->n_draining, 0);
    assert_null(f->reg->orphans);
    assert_int_equal(f->alloc->used_bytes, 0);
    check_alloc(f->alloc);

    /* Released while a plan is still in flight: that sequence waits for its run. */
    assert_int_equal(
        vase_registry_open_seq(f->reg, f->alloc, f->b, mb, &req, 8, 0, &s, msg, sizeof(msg)), 0);
    assert_int_equal(
        vase_registry_open_seq(f->reg, f->alloc, f->b, mb, &req, 8, 0, &t, msg, sizeof(msg)), 0);
    assert_int_equal(run_new(&t->run), 0);
    t->run->owner = t;
    t->state = VASED_SEQ_PLANNING;
    struct vased_client *b = f->b;
    vase_registry_hold_seq(f->reg, s);
    vase_registry_hold_seq(f->reg, t);
    vase_registry_drain_client(f->reg, b);
    f->b = NULL;
    assert_int_equal(vase_registry_release_client(f->reg, allocs, b), one);
    assert_ptr_equal(f->reg->orphans, t);
    assert_null(t->holder);
    assert_int_equal(f->alloc->used_bytes, one);
    vase_registry_reap(f->reg, f->alloc, t);
    assert_null(f->reg->orphans);
    assert_int_equal(f->alloc->used_bytes, 0);
    check_alloc(f->alloc);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout),
        cmocka_unit_test_setup_teardown(test_clients_models, setup, teardown),
        cmocka_unit_test_setup_teardown(test_footprint, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_close, setup, teardown),
        cmocka_unit_test_setup_teardown(test_two_models, setup, teardown),
        cmocka_unit_test_setup_teardown(test_orphan, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hold, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
