/* SPDX-License-Identifier: MIT */

/* Unit tests of daemon/plan/evictor.c: plans computed by the thread pool through paged views of a
 * host arena must equal the kernels' plan on a contiguous copy of the same data, reach the
 * plan pages at PROTOCOL.md's offsets, and fail whole, naming the layer, on NaN; clients are
 * served in turn, and the queue's counters say so. */

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include <cmocka.h>

#include "../daemon/core/alloc.h"
#include "../daemon/core/arena.h"
#include "../daemon/plan/evictor.h"
#include "../daemon/core/log.h"
#include "../daemon/plan/planner.h"
#include "../daemon/core/registry.h"
#include "plan_fixture.h"

/* HQ / HKV = 12 and a block of 4 tokens make the three unit sizes differ (KV pages of 4096 bytes,
 * ring pages of one entry of every layer, 6144 bytes, since that is more than a page, and a plan
 * page of 8 lists, 7168 bytes in 8192), so a planner that addressed one kind of page in units of
 * another would read or write elsewhere. */
enum { L = 4, HQ = 24, HKV = 2, D = 16, B = 4, BUDGET = 256, W = 32, LEN = 1024, N = LEN - W };

static int setup(void **state) {
    struct plan_fixture *f = calloc(1, sizeof(*f));
    const struct vase_layout_geometry g = {L, HQ, HKV, D, VASE_DTYPE_F32, B};
    struct vase_alloc *alloc;
    uint64_t client = 0;
    uint32_t filler[8], kv[PLAN_FIXTURE_MAX_PAGES];
    assert_int_equal(vase_arena_new(0, "host", VASE_CUDA_SHARE_IPC, 4 << 20, 64 << 10, &f->arena),
                     0);
    assert_int_equal(vase_alloc_new(f->arena->size, f->arena->granule_bytes, &alloc), 0);
    plan_fixture_shape(f, &g, LEN, W, BUDGET);
    assert_int_equal(f->page_bytes, 4096);
    assert_int_equal(f->ring_page_bytes, 6144);
    assert_int_equal(f->plan_page_bytes, 8192);
    /* Take pages the way the registry does, after others, with the block table reversed, so that
     * the block table matters. */
    struct vase_alloc_req first = {.unit = f->page_bytes, .n = 8, .ret = filler};
    assert_int_equal(vase_alloc_reserve(alloc, &first, 1, 0, &client), 0);
    struct vase_alloc_req parts[3] = {
        {.unit = f->page_bytes, .n = f->n_pages, .ret = kv},
        {.unit = f->ring_page_bytes, .n = f->n_ring, .ret = f->ring},
        {.unit = f->plan_page_bytes, .n = f->n_plan, .ret = f->plan},
    };
    assert_int_equal(vase_alloc_reserve(alloc, parts, 3, 0, &client), 0);
    for (uint32_t i = 0; i < f->n_pages; i++)
        f->pages[i] = kv[f->n_pages - 1 - i];
    vase_alloc_free(alloc);
    plan_fixture_fill(f, 3);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    struct plan_fixture *f = *state;
    vase_arena_free(f->arena);
    free(f);
    return 0;
}

static struct vase_plan_run *make_run(struct plan_fixture *f, enum vase_policy policy,
                                      uint32_t ring_first) {
    struct vase_plan_run *run = plan_fixture_run(f, policy);
    run->seq_id = 7;
    run->round = 2;
    run->seed = 99;
    run->ring_first = ring_first;
    run->keep_lists = malloc((size_t)L * HKV * run->keep * sizeof(uint32_t));
    assert_non_null(run->keep_lists);
    return run;
}

/* The kernels' plan of layer l on contiguous copies: the reference for the paged one. */
static void reference_plan(struct plan_fixture *f, const struct vase_plan_run *run, uint32_t l,
                           uint32_t *keep) {
    float *k = malloc((size_t)HKV * LEN * D * sizeof(float));
    float *v = malloc((size_t)HKV * LEN * D * sizeof(float));
    float *q = malloc((size_t)HQ * W * D * sizeof(float));
    for (uint32_t h = 0; h < HKV; h++)
        for (uint32_t s = 0; s < LEN; s++) {
            size_t at = ((size_t)h * LEN + s) * D;
            memcpy(k + at, plan_fixture_kv(f, l, 0, s, h), D * sizeof(float));
            memcpy(v + at, plan_fixture_kv(f, l, 1, s, h), D * sizeof(float));
        }
    /* The window's queries: W ring entries from ring_first on. */
    for (uint32_t h = 0; h < HQ; h++)
        for (uint32_t r = 0; r < W; r++)
            memcpy(q + ((size_t)h * W + r) * D,
                   plan_fixture_q(f, l, (run->ring_first + r) % (2 * W), h), D * sizeof(float));
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

static void check_policy(struct plan_fixture *f, struct vase_evictor *ev, enum vase_policy policy,
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
            assert_memory_equal(plan_fixture_list(f, i), ref + (size_t)h * K, K * 4);
        }
    }
    free(ref);
    vase_plan_run_free(run);
}

static void test_plans(void **state) {
    struct plan_fixture *f = *state;
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
    struct plan_fixture *f = *state;
    void *ctx = zmq_ctx_new();
    struct vase_evictor *ev;
    assert_int_equal(vase_evictor_new(ctx, 2, &ev), 0);
    plan_fixture_kv(f, 2, 1, 17, 1)[3] = NAN;     /* a value of layer 2 */
    plan_fixture_kv(f, 3, 0, 5, 0)[0] = INFINITY; /* a key of layer 3 */
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
    struct plan_fixture *f = *state;
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

/*
 * A device arena whose planner notes the runs in the order threads start them, and holds them
 * until the test opens it: with one thread, the first run keeps the thread busy while the test
 * queues the others, so the order the queue hands them out is fixed, whatever the timing. The
 * evictor asks vase_planner_for() which planner serves an arena; the test links with
 * -Wl,--wrap=vase_planner_for, so that the gate arena gets the gate planner and every other
 * arena its real one.
 */
struct gate {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool open;
    uint32_t order[16]; /* seq_id of each run started */
    unsigned n;
};

static int gate_planner_new(const struct vase_arena *a, struct vase_planner **ret) {
    *ret = a->backend;
    return 0;
}

static void gate_planner_free(struct vase_planner *p) {
    (void)p;
}

static int gate_plan_layers(struct vase_planner *p, struct vase_plan_run *run, uint32_t l0,
                            uint32_t l1, uint32_t *ret_bad_layer) {
    struct gate *g = (struct gate *)p;
    (void)l0, (void)l1, (void)ret_bad_layer;
    pthread_mutex_lock(&g->lock);
    if (g->n < 16)
        g->order[g->n] = run->seq_id;
    g->n++;
    pthread_cond_broadcast(&g->cond);
    while (!g->open)
        pthread_cond_wait(&g->cond, &g->lock);
    pthread_mutex_unlock(&g->lock);
    return 0;
}

static const struct vase_arena_ops gate_ops = {
    .share = "memfd",
    .on_device = true,
};

static const struct vase_planner_ops gate_planner_ops = {
    .name = "gate",
    .thread_new = gate_planner_new,
    .thread_free = gate_planner_free,
    .plan_layers = gate_plan_layers,
};

const struct vase_planner_ops *__real_vase_planner_for(const struct vase_arena *a);
const struct vase_planner_ops *__wrap_vase_planner_for(const struct vase_arena *a);

const struct vase_planner_ops *__wrap_vase_planner_for(const struct vase_arena *a) {
    return a && a->ops == &gate_ops ? &gate_planner_ops : __real_vase_planner_for(a);
}

static struct vase_plan_run *gate_run(struct vase_evictor *ev, const struct vase_arena *a,
                                      uint32_t tenant, uint32_t seq_id) {
    struct vase_plan_run *run;
    assert_int_equal(vase_plan_run_new(&run), 0);
    run->tenant = tenant;
    run->seq_id = seq_id;
    run->layers = 1; /* one job */
    run->arena = a;
    assert_int_equal(vase_evictor_submit(ev, run), 0);
    return run;
}

static void assert_queue(struct vase_evictor *ev, uint32_t queued, uint32_t running,
                         uint32_t waiting) {
    struct vase_evictor_counts c;
    vase_evictor_get_counts(ev, &c);
    assert_int_equal(c.plans_queued, queued);
    assert_int_equal(c.plans_running, running);
    assert_int_equal(c.clients_waiting, waiting);
}

/* While the one thread is busy with client 3's plan, client 1 queues five plans, then client 2
 * one: client 2's goes second, not sixth (a single first-come first-served queue would plan it
 * last). */
static void test_clients_in_turn(void **state) {
    (void)state;
    void *ctx = zmq_ctx_new();
    struct gate g = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
    struct vase_arena a = {.id = 0, .kind = (char *)"gate", .ops = &gate_ops, .backend = &g};
    struct vase_evictor *ev;
    struct vase_plan_run *runs[7];
    assert_int_equal(vase_evictor_new(ctx, 1, &ev), 0);
    assert_queue(ev, 0, 0, 0);

    runs[0] = gate_run(ev, &a, 3, 301);
    struct timespec deadline; /* a guard against a hang, not part of the test */
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 60;
    pthread_mutex_lock(&g.lock);
    while (g.n == 0) /* the thread holds client 3's run */
        if (pthread_cond_timedwait(&g.cond, &g.lock, &deadline) == ETIMEDOUT)
            fail_msg("the evictor thread never started the first plan");
    pthread_mutex_unlock(&g.lock);
    assert_queue(ev, 0, 1, 0);
    for (uint32_t i = 1; i <= 5; i++)
        runs[i] = gate_run(ev, &a, 1, 100 + i);
    runs[6] = gate_run(ev, &a, 2, 201);
    assert_queue(ev, 6, 1, 2);
    assert_int_equal(vase_evictor_count_queued(ev, 1), 5);
    assert_int_equal(vase_evictor_count_queued(ev, 2), 1);
    assert_int_equal(vase_evictor_count_queued(ev, 3), 0);

    pthread_mutex_lock(&g.lock);
    g.open = true;
    pthread_cond_broadcast(&g.cond);
    pthread_mutex_unlock(&g.lock);
    for (int i = 0; i < 7; i++) {
        struct vase_plan_run *run = wait_run(ev);
        assert_int_equal(run->error, 0);
    }
    const uint32_t want[] = {301, 101, 201, 102, 103, 104, 105};
    assert_int_equal(g.n, 7);
    for (unsigned i = 0; i < 7; i++)
        assert_int_equal(g.order[i], want[i]);
    assert_queue(ev, 0, 0, 0);
    assert_int_equal(vase_evictor_count_queued(ev, 1), 0);

    vase_evictor_free(ev);
    for (int i = 0; i < 7; i++)
        vase_plan_run_free(runs[i]);
    zmq_ctx_term(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_plans, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nan, setup, teardown),
        cmocka_unit_test_setup_teardown(test_free_with_queued_jobs, setup, teardown),
        cmocka_unit_test(test_clients_in_turn),
    };
    vase_log_set_max_level(LOG_EMERG);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
