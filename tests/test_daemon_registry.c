/* SPDX-License-Identifier: MIT */

/* Unit tests of daemon/registry.c: the layout formulas of PROTOCOL.md, all-or-nothing sequence
 * admission, ownership, shrinking, and orphans whose pages wait for their plan. */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../daemon/alloc.h"
#include "../daemon/evictor.h"
#include "../daemon/registry.h"

static const struct vase_geometry_desc tiny = {
    .layers = 4, .q_heads = 4, .kv_heads = 2, .head_dim = 16, .dtype = VASE_DTYPE_F32, .align = 1};

static void test_layout(void **state) {
    (void)state;
    struct vase_layout L;
    const char *msg = NULL;
    assert_int_equal(vase_layout_compute(&tiny, 64 << 10, &L, &msg), 0);
    assert_int_equal(L.token_stride, 2 * 16 * 4);
    assert_int_equal(L.tokens_per_page, (64 << 10) / (4 * 2 * 128));
    assert_int_equal(L.kv_stride, 64 * 128);
    assert_int_equal(L.layer_stride, 2 * 64 * 128);
    assert_int_equal(L.head_stride, 16 * 4);
    assert_int_equal(L.ring_row_stride, 4 * 16 * 4);
    assert_int_equal(L.ring_rows_per_page, (64 << 10) / (4 * 256));
    assert_int_equal(L.ring_layer_stride, 64 * 256);
    /* Everything of one page fits in it. */
    assert_true(L.layer_stride * tiny.layers <= L.page_bytes);

    struct vase_geometry_desc g = tiny;
    g.align = 48;
    assert_int_equal(vase_layout_compute(&g, 64 << 10, &L, &msg), 0);
    assert_int_equal(L.tokens_per_page, 48);
    g.dtype = VASE_DTYPE_BF16;
    g.align = 0;
    assert_int_equal(vase_layout_compute(&g, 64 << 10, &L, &msg), 0);
    assert_int_equal(L.tokens_per_page, 128);

    g = tiny;
    g.q_heads = 3;
    assert_int_equal(vase_layout_compute(&g, 64 << 10, &L, &msg), -EINVAL);
    g = tiny;
    g.layers = 0;
    assert_int_equal(vase_layout_compute(&g, 64 << 10, &L, &msg), -EINVAL);
    g.layers = VASE_MAX_LAYERS + 1;
    assert_int_equal(vase_layout_compute(&g, 64 << 10, &L, &msg), -EINVAL);
    g = tiny;
    g.head_dim = 2048;
    assert_int_equal(vase_layout_compute(&g, 64 << 10, &L, &msg), -EINVAL);
    g = tiny;
    g.dtype = (enum vase_dtype)7;
    assert_int_equal(vase_layout_compute(&g, 64 << 10, &L, &msg), -EINVAL);
    /* tokens_per_page would be 0. */
    g = (struct vase_geometry_desc){
        .layers = 64, .q_heads = 64, .kv_heads = 64, .head_dim = 128, .dtype = VASE_DTYPE_F32};
    msg = NULL;
    assert_int_equal(vase_layout_compute(&g, 64 << 10, &L, &msg), -EINVAL);
    assert_non_null(msg);
    g = tiny;
    g.align = 128; /* 64 tokens fit, rounded down to 128 gives 0 */
    assert_int_equal(vase_layout_compute(&g, 64 << 10, &L, &msg), -EINVAL);
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
    assert_int_equal(vase_registry_new(&f->reg), 0);
    assert_int_equal(vase_alloc_new(64, &f->alloc), 0);
    assert_int_equal(vase_registry_add_client(f->reg, -1, &f->a), 0);
    assert_int_equal(vase_registry_add_client(f->reg, -1, &f->b), 0);
    assert_int_equal(vase_layout_compute(&tiny, 64 << 10, &L, NULL), 0);
    assert_int_equal(vase_registry_add_model(f->reg, f->a, "tiny", 0, &tiny, &L, &f->ma), 0);
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
    assert_int_equal(vase_registry_get_model(f->reg, f->b, f->ma->id, &m), -EPERM);
    assert_int_equal(vase_registry_get_model(f->reg, f->a, 999, &m), -ENOENT);
    assert_int_equal(f->a->n_models, 1);
}

static void test_open_close(void **state) {
    struct fixture *f = *state;
    struct vased_seq_request req = request(1000);
    struct vased_seq *s, *t;
    const char *msg;

    assert_int_equal(vase_registry_open_seq(f->reg, f->alloc, f->a, f->ma, &req, 8, 0, &s, &msg),
                     0);
    /* ceil((1000 + 32 + 32) / 64) = 17 KV pages, 1 ring page, 1 plan page. */
    assert_int_equal(s->n_pages, 17);
    assert_int_equal(s->n_ring_pages, 1);
    assert_int_equal(s->n_plan_pages, 1);
    assert_int_equal(s->capacity, 17 * 64);
    assert_int_equal(s->keep, 224);
    assert_int_equal(s->plans_per_page, (64 << 10) / (4 * 224));
    assert_int_equal(f->a->pages, 19);
    assert_int_equal(f->alloc->n_free, 64 - 19);
    assert_int_equal(f->reg->n_seqs, 1);

    assert_int_equal(vase_registry_get_seq(f->reg, f->a, s->id, &t), 0);
    assert_ptr_equal(t, s);
    assert_int_equal(vase_registry_get_seq(f->reg, f->b, s->id, &t), -EPERM);
    assert_int_equal(vase_registry_get_seq(f->reg, f->a, s->id + 100, &t), -ENOENT);

    /* Sequence quota, page quota, arena space: each refusal takes nothing. */
    assert_int_equal(vase_registry_open_seq(f->reg, f->alloc, f->a, f->ma, &req, 1, 0, &t, &msg),
                     -EDQUOT);
    assert_int_equal(vase_registry_open_seq(f->reg, f->alloc, f->a, f->ma, &req, 8, 30, &t, &msg),
                     -EDQUOT);
    struct vased_seq_request huge = request(5000);
    assert_int_equal(vase_registry_open_seq(f->reg, f->alloc, f->a, f->ma, &huge, 8, 0, &t, &msg),
                     -ENOSPC);
    assert_int_equal(f->a->pages, 19);
    assert_int_equal(f->alloc->n_free, 64 - 19);
    assert_int_equal(f->a->n_seqs, 1);

    /* Two more fit (19 each), a fourth does not. */
    assert_int_equal(vase_registry_open_seq(f->reg, f->alloc, f->a, f->ma, &req, 8, 0, &t, &msg),
                     0);
    struct vased_seq *u;
    assert_int_equal(vase_registry_open_seq(f->reg, f->alloc, f->a, f->ma, &req, 8, 0, &u, &msg),
                     0);
    assert_int_equal(vase_registry_open_seq(f->reg, f->alloc, f->a, f->ma, &req, 8, 0, &u, &msg),
                     -ENOSPC);
    assert_int_equal(f->alloc->n_free, 64 - 57);

    /* After the first commit a long prompt's surplus goes back. */
    assert_int_equal(vase_registry_shrink_seq(s, f->alloc, 5), 1);
    assert_int_equal(s->n_pages, 5);
    assert_int_equal(s->capacity, 320);
    assert_int_equal(f->a->pages, 57 - 12);
    assert_int_equal(vase_registry_shrink_seq(s, f->alloc, 5), 0);

    assert_int_equal(vase_registry_close_seq(f->reg, f->alloc, s), 0);
    assert_int_equal(vase_registry_close_seq(f->reg, f->alloc, t), 0);
    assert_int_equal(f->a->pages, 19);
    assert_int_equal(f->a->n_seqs, 1);
    assert_int_equal(f->reg->n_seqs, 1);
    assert_int_equal(f->alloc->n_free, 64 - 19);
}

static void test_orphan(void **state) {
    struct fixture *f = *state;
    struct vased_seq_request req = request(100);
    struct vased_seq *s;
    const char *msg;
    assert_int_equal(vase_registry_open_seq(f->reg, f->alloc, f->a, f->ma, &req, 8, 0, &s, &msg),
                     0);
    uint32_t held = s->n_pages + s->n_ring_pages + s->n_plan_pages;
    uint32_t id = s->id;
    /* A plan is being computed when the sequence closes. */
    assert_int_equal(vase_plan_run_new(&s->run), 0);
    s->run->owner = s;
    s->state = VASED_SEQ_PLANNING;
    assert_int_equal(vase_registry_close_seq(f->reg, f->alloc, s), 1);
    assert_null(vase_registry_find_seq(f->reg, id));
    assert_null(s->client);
    assert_int_equal(f->a->pages, 0);              /* uncharged */
    assert_int_equal(f->alloc->n_free, 64 - held); /* but still held */
    assert_ptr_equal(f->reg->orphans, s);
    vase_registry_reap(f->reg, f->alloc, s);
    assert_int_equal(f->alloc->n_free, 64);
    assert_null(f->reg->orphans);

    /* A client that goes away with open sequences: close each, then remove. */
    assert_int_equal(vase_registry_open_seq(f->reg, f->alloc, f->b, f->ma, &req, 8, 0, &s, &msg),
                     0); /* models are per client, but the registry checks that in get_model */
    while (f->b->seqs)
        vase_registry_close_seq(f->reg, f->alloc, f->b->seqs);
    vase_registry_remove_client(f->reg, f->b);
    f->b = NULL;
    assert_int_equal(f->reg->n_clients, 1);
    assert_int_equal(f->alloc->n_free, 64);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout),
        cmocka_unit_test_setup_teardown(test_clients_models, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_close, setup, teardown),
        cmocka_unit_test_setup_teardown(test_orphan, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
