/* SPDX-License-Identifier: MIT */

/* Unit tests of daemon/evictor.c: plans computed by the thread pool through paged views of a
 * host arena must equal the kernels' plan on a contiguous copy of the same data, reach the
 * plan pages at PROTOCOL.md's offsets, and fail whole, naming the layer, on NaN. */

#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include <cmocka.h>

#include "../daemon/alloc.h"
#include "../daemon/arena.h"
#include "../daemon/evictor.h"
#include "../daemon/log.h"
#include "../daemon/registry.h"

enum { L = 4, HQ = 4, HKV = 2, D = 16, BUDGET = 256, W = 32, LEN = 1024, N = LEN - W };

struct fixture {
    struct vase_arena *arena;
    struct vase_alloc *alloc;
    struct vase_layout lay;
    uint32_t pages[32], ring[4], plan[4];
    uint32_t n_pages, n_ring, n_plan, ppp;
};

static float *kv_addr(struct fixture *f, uint32_t l, int v, uint32_t slot, uint32_t h) {
    uint32_t tpp = f->lay.tokens_per_page;
    return (float *)((char *)f->arena->map + (uint64_t)f->pages[slot / tpp] * f->arena->page_bytes +
                     l * f->lay.layer_stride + v * f->lay.kv_stride +
                     (slot % tpp) * f->lay.token_stride + h * f->lay.head_stride);
}

static float *q_addr(struct fixture *f, uint32_t l, uint32_t entry, uint32_t h) {
    uint32_t rr = f->lay.ring_rows_per_page;
    return (float *)((char *)f->arena->map + (uint64_t)f->ring[entry / rr] * f->arena->page_bytes +
                     l * f->lay.ring_layer_stride + (entry % rr) * f->lay.ring_row_stride +
                     h * f->lay.head_stride);
}

static int setup(void **state) {
    struct fixture *f = calloc(1, sizeof(*f));
    const struct vase_geometry_desc g = {L, HQ, HKV, D, VASE_DTYPE_F32, 1};
    uint32_t client = 0, all[40];
    assert_int_equal(vase_arena_new(0, "host", VASE_CUDA_SHARE_IPC, 4 << 20, 64 << 10, &f->arena),
                     0);
    assert_int_equal(vase_alloc_new(f->arena->num_pages, &f->alloc), 0);
    assert_int_equal(vase_layout_compute(&g, 64 << 10, &f->lay, NULL), 0);
    f->n_pages = (LEN + W + f->lay.tokens_per_page - 1) / f->lay.tokens_per_page;
    f->n_ring = (2 * W + f->lay.ring_rows_per_page - 1) / f->lay.ring_rows_per_page;
    f->ppp = (uint32_t)((64 << 10) / (4 * (BUDGET - W)));
    f->n_plan = (L * HKV + f->ppp - 1) / f->ppp;
    /* Take pages in a scrambled order so that the block table matters. */
    assert_int_equal(vase_alloc_reserve(f->alloc, 8, 0, &client, all), 0);
    assert_int_equal(vase_alloc_reserve(f->alloc, f->n_pages + f->n_ring + f->n_plan, 0, &client,
                                        all + 8),
                     0);
    for (uint32_t i = 0; i < f->n_pages; i++)
        f->pages[i] = all[8 + f->n_pages - 1 - i];
    memcpy(f->ring, all + 8 + f->n_pages, f->n_ring * sizeof(uint32_t));
    memcpy(f->plan, all + 8 + f->n_pages + f->n_ring, f->n_plan * sizeof(uint32_t));

    srand(3);
    for (uint32_t l = 0; l < L; l++) {
        for (uint32_t s = 0; s < LEN; s++)
            for (int v = 0; v < 2; v++)
                for (uint32_t h = 0; h < HKV; h++)
                    for (uint32_t d = 0; d < D; d++)
                        kv_addr(f, l, v, s, h)[d] = (float)rand() / RAND_MAX - 0.5f;
        for (uint32_t e = 0; e < 2 * W; e++)
            for (uint32_t h = 0; h < HQ; h++)
                for (uint32_t d = 0; d < D; d++)
                    q_addr(f, l, e, h)[d] = (float)rand() / RAND_MAX - 0.5f;
    }
    *state = f;
    return 0;
}

static int teardown(void **state) {
    struct fixture *f = *state;
    vase_alloc_free(f->alloc);
    vase_arena_free(f->arena);
    free(f);
    return 0;
}

static struct vase_plan_run *make_run(struct fixture *f, enum vase_policy policy,
                                      uint32_t ring_first) {
    struct vase_plan_run *run;
    assert_int_equal(vase_plan_run_new(&run), 0);
    run->seq_id = 7;
    run->round = 2;
    run->len = LEN;
    run->n = N;
    run->layers = L;
    run->kv_heads = HKV;
    run->q_heads = HQ;
    run->head_dim = D;
    run->dtype = VASE_DTYPE_F32;
    run->policy = policy;
    run->params = vase_params_default(BUDGET);
    run->params.window = W;
    run->keep = vase_plan_keep_count(&run->params);
    run->seed = 99;
    run->arena_base = f->arena->map;
    run->page_bytes = f->arena->page_bytes;
    run->tokens_per_page = f->lay.tokens_per_page;
    run->layer_stride = f->lay.layer_stride;
    run->kv_stride = f->lay.kv_stride;
    run->token_stride = f->lay.token_stride;
    run->ring_rows_per_page = f->lay.ring_rows_per_page;
    run->ring_layer_stride = f->lay.ring_layer_stride;
    run->ring_row_stride = f->lay.ring_row_stride;
    run->ring_first = ring_first;
    run->plans_per_page = f->ppp;
    run->n_pages = f->n_pages;
    run->n_plan_pages = f->n_plan;
    run->pages = malloc(sizeof(f->pages));
    run->ring_pages = malloc(sizeof(f->ring));
    run->plan_pages = malloc(sizeof(f->plan));
    run->keep_lists = malloc((size_t)L * HKV * run->keep * sizeof(uint32_t));
    assert_non_null(run->keep_lists);
    memcpy(run->pages, f->pages, sizeof(f->pages));
    memcpy(run->ring_pages, f->ring, sizeof(f->ring));
    memcpy(run->plan_pages, f->plan, sizeof(f->plan));
    return run;
}

/* The kernels' plan of layer l on contiguous copies: the reference for the paged one. */
static void reference_plan(struct fixture *f, const struct vase_plan_run *run, uint32_t l,
                           uint32_t *keep) {
    float *k = malloc((size_t)HKV * LEN * D * sizeof(float));
    float *v = malloc((size_t)HKV * LEN * D * sizeof(float));
    float *q = malloc((size_t)HQ * W * D * sizeof(float));
    for (uint32_t h = 0; h < HKV; h++)
        for (uint32_t s = 0; s < LEN; s++) {
            memcpy(k + ((size_t)h * LEN + s) * D, kv_addr(f, l, 0, s, h), D * sizeof(float));
            memcpy(v + ((size_t)h * LEN + s) * D, kv_addr(f, l, 1, s, h), D * sizeof(float));
        }
    /* The window's queries: W ring entries from ring_first on. */
    for (uint32_t h = 0; h < HQ; h++)
        for (uint32_t r = 0; r < W; r++)
            memcpy(q + ((size_t)h * W + r) * D, q_addr(f, l, (run->ring_first + r) % (2 * W), h),
                   D * sizeof(float));
    struct vase_plan_input in = {
        .policy = run->policy,
        .params = run->params,
        .n = N,
        .hq = HQ,
        .k = vase_view_contiguous(k, VASE_DTYPE_F32, HKV, LEN, D),
        .v = vase_view_contiguous(v, VASE_DTYPE_F32, HKV, LEN, D),
        .q = vase_view_contiguous(q, VASE_DTYPE_F32, HQ, W, D),
        .rng = {.seed = run->seed, .sequence = run->seq_id, .layer = l, .round = run->round},
    };
    assert_int_equal(vase_plan_heads(&in, 0, HKV, NULL, keep), 0);
    free(k);
    free(v);
    free(q);
}

static struct vase_plan_run *wait_run(struct vase_evictor *ev) {
    zmq_pollitem_t it = {.socket = vase_evictor_socket(ev), .events = ZMQ_POLLIN};
    for (int i = 0; i < 1000; i++) {
        struct vase_plan_run *run = NULL;
        int r = vase_evictor_receive(ev, &run);
        if (r == 1)
            return run;
        if (r == -EAGAIN)
            zmq_poll(&it, 1, 100);
    }
    fail_msg("the plan never finished");
    return NULL;
}

static void check_policy(struct fixture *f, struct vase_evictor *ev, enum vase_policy policy,
                         uint32_t ring_first) {
    struct vase_plan_run *run = make_run(f, policy, ring_first);
    assert_int_equal(vase_evictor_submit(ev, run), 0);
    assert_int_equal(run->jobs_total, 3); /* 3 threads share 4 layers */
    assert_ptr_equal(wait_run(ev), run);
    assert_int_equal(run->error, 0);
    assert_int_equal(run->jobs_done, run->jobs_total);

    uint32_t K = run->keep;
    uint32_t *ref = malloc((size_t)HKV * K * sizeof(uint32_t));
    for (uint32_t l = 0; l < L; l++) {
        reference_plan(f, run, l, ref);
        assert_memory_equal(run->keep_lists + (size_t)l * HKV * K, ref, HKV * K * 4);
        assert_int_equal(vase_plan_validate(ref, HKV, K, N), 0);
        for (uint32_t h = 0; h < HKV; h++) {
            uint32_t i = l * HKV + h;
            const uint32_t *pp =
                (const uint32_t *)((char *)f->arena->map +
                                   (uint64_t)f->plan[i / f->ppp] * f->arena->page_bytes +
                                   (uint64_t)(i % f->ppp) * 4 * K);
            assert_memory_equal(pp, ref + (size_t)h * K, K * 4);
        }
    }
    free(ref);
    vase_plan_run_free(run);
}

static void test_plans(void **state) {
    struct fixture *f = *state;
    void *ctx = zmq_ctx_new();
    struct vase_evictor *ev;
    assert_int_equal(vase_evictor_new(ctx, 3, &ev), 0);
    assert_int_equal(vase_evictor_threads(ev), 3);
    check_policy(f, ev, VASE_POLICY_VASE_ATTNV, 0);
    check_policy(f, ev, VASE_POLICY_SNAPKV, 45); /* the window wraps around the ring */
    check_policy(f, ev, VASE_POLICY_VASE_DKV, 0);
    check_policy(f, ev, VASE_POLICY_STREAMING, 0);
    vase_evictor_free(ev);
    zmq_ctx_term(ctx);
}

static void test_nan(void **state) {
    struct fixture *f = *state;
    void *ctx = zmq_ctx_new();
    struct vase_evictor *ev;
    assert_int_equal(vase_evictor_new(ctx, 2, &ev), 0);
    kv_addr(f, 2, 1, 17, 1)[3] = NAN; /* a value of layer 2 */
    kv_addr(f, 3, 0, 5, 0)[0] = INFINITY; /* a key of layer 3 */
    struct vase_plan_run *run = make_run(f, VASE_POLICY_VASE_ATTNV, 0);
    assert_int_equal(vase_evictor_submit(ev, run), 0);
    assert_ptr_equal(wait_run(ev), run);
    assert_int_equal(run->error, -EINVAL);
    assert_int_equal(run->error_layer, 2); /* the first bad layer */
    vase_plan_run_free(run);
    /* Policies that do not read the bad rows still plan. */
    run = make_run(f, VASE_POLICY_STREAMING, 0);
    assert_int_equal(vase_evictor_submit(ev, run), 0);
    assert_ptr_equal(wait_run(ev), run);
    assert_int_equal(run->error, 0);
    vase_plan_run_free(run);
    vase_evictor_free(ev);
    zmq_ctx_term(ctx);
}

static void test_free_with_queued_jobs(void **state) {
    struct fixture *f = *state;
    void *ctx = zmq_ctx_new();
    struct vase_evictor *ev;
    struct vase_plan_run *runs[8];
    assert_int_equal(vase_evictor_new(ctx, 1, &ev), 0);
    for (int i = 0; i < 8; i++) {
        runs[i] = make_run(f, VASE_POLICY_VASE_ATTNV, 0);
        assert_int_equal(vase_evictor_submit(ev, runs[i]), 0);
    }
    /* Stopping drops queued jobs and frees them; runs stay with their owners. */
    vase_evictor_free(ev);
    for (int i = 0; i < 8; i++)
        vase_plan_run_free(runs[i]);
    zmq_ctx_term(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_plans, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nan, setup, teardown),
        cmocka_unit_test_setup_teardown(test_free_with_queued_jobs, setup, teardown),
    };
    vase_log_set_max_level(LOG_EMERG);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
