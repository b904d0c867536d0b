/* SPDX-License-Identifier: MIT */

/*
 * Unit tests of daemon/plan/planner_cuda.c against the fake CUDA of tests/mock_cuda.c (no GPU, no
 * libcudart), on a cuda-ipc arena whose "device" memory the CPU can read: plans on the
 * "device" equal the CPU planner's, reach the plan pages, fail whole on NaN naming the layer,
 * report CUDA failures with the runtime's message, and the evictor's threads make and free their
 * planners; a sticky CUDA error stops the daemon with the status that restarts it.
 */

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

#include "../daemon/core/alloc.h"
#include "../daemon/core/arena.h"
#include "../daemon/control/cycle.h"
#include "../daemon/plan/evictor.h"
#include "../daemon/core/log.h"
#include "../daemon/plan/planner.h"
#include "../daemon/core/registry.h"
#include "../daemon/state.h"
#include "../daemon/vased.h"
#include "log_capture.h"
#include "mock_cuda.h"
#include "plan_fixture.h"

#define GRANULE_BYTES (64u << 10)

static int check_nothing_left(void **state) {
    (void)state;
    assert_int_equal(mock_cuda_live_allocations(), 0);
    assert_int_equal(mock_cuda_live_mappings(), 0);
    return 0;
}

/* Three unit sizes: KV pages of 1536 bytes, ring pages of one entry of every layer (4608 bytes,
 * more than a page), a plan page of 6 lists (2304 bytes, in 4096). */
enum { L = 3, HQ = 24, HKV = 2, D = 16, B = 2, BUDGET = 128, W = 32, LEN = 512, N = LEN - W };

/* A cuda-ipc arena (the fake's device memory is readable by the CPU, so the CPU planner can
 * check the device planner on the same bytes) with one sequence's K, V and queries. */
static int plan_setup(void **state) {
    struct plan_fixture *f = calloc(1, sizeof(*f));
    const struct vase_layout_geometry g = {L, HQ, HKV, D, VASE_DTYPE_F32, B};

    mock_cuda_reset();
    assert_int_equal(
        vase_arena_new(0, "cuda:0", VASE_CUDA_SHARE_IPC, 4u << 20, GRANULE_BYTES, &f->arena), 0);
    plan_fixture_shape(f, &g, LEN, W, BUDGET);
    assert_int_equal(f->page_bytes, 1536);
    assert_int_equal(f->ring_page_bytes, 4608);
    assert_int_equal(f->plan_page_bytes, 4096);
    assert_int_equal(f->n_pages, 272);
    /* KV pages backwards, so that the block table matters; each kind in units of its own size
     * (the fixture checks that none overlap). */
    for (uint32_t i = 0; i < f->n_pages; i++)
        f->pages[i] = 282 - i;
    for (uint32_t i = 0; i < f->n_ring; i++)
        f->ring[i] = 100 + i;
    for (uint32_t i = 0; i < f->n_plan; i++)
        f->plan[i] = 200 + i;
    plan_fixture_fill(f, 5);
    *state = f;
    return 0;
}

static int plan_teardown(void **state) {
    struct plan_fixture *f = *state;
    vase_arena_free(f->arena);
    free(f);
    return check_nothing_left(state);
}

static struct vase_plan_run *make_run(struct plan_fixture *f, enum vase_policy policy,
                                      const struct vase_arena *arena) {
    struct vase_plan_run *run = plan_fixture_run(f, policy);
    run->seq_id = 3;
    run->round = 1;
    run->seed = 42;
    run->arena = arena;
    run->ring_first = 5;
    run->keep_lists = calloc((size_t)L * HKV * run->keep, sizeof(uint32_t));
    if (vase_policy_needs(policy) & VASE_NEEDS_ACC) {
        run->acc = malloc((size_t)L * HKV * N * sizeof(float));
        for (size_t i = 0; i < (size_t)L * HKV * N; i++)
            run->acc[i] = (float)((i * 7919) % 1000) / 1000.0f;
    }
    return run;
}

/* The device planner's lists equal the CPU's, in run->keep_lists and in the plan pages. */
static void check_against_cpu(struct plan_fixture *f, enum vase_policy policy) {
    struct vase_plan_run *dev = make_run(f, policy, f->arena);
    struct vase_plan_run *cpu = make_run(f, policy, NULL);
    struct vase_planner *p = NULL;
    uint32_t bad = 99;
    size_t list = (size_t)dev->keep;

    assert_int_equal(vase_planner_for(f->arena)->thread_new(f->arena, &p), 0);
    unsigned syncs = mock_cuda.stream_syncs;
    assert_int_equal(vase_planner_for(f->arena)->plan_layers(p, dev, 0, L, &bad), 0);
    /* Complete before it returns: the stream was synchronised. */
    assert_true(mock_cuda.stream_syncs > syncs);
    assert_int_equal(mock_cuda.plans, L);
    assert_int_equal(mock_cuda.copies_d2d, L * HKV);
    assert_int_equal(mock_cuda.copies_d2h, 1);
    for (uint32_t i = 0; i < L * HKV; i++)
        assert_memory_equal(plan_fixture_list(f, i), dev->keep_lists + i * list,
                            list * sizeof(uint32_t));

    assert_int_equal(vase_plan_run_layers(cpu, 0, L, NULL, &bad), 0);
    assert_memory_equal(dev->keep_lists, cpu->keep_lists, (size_t)L * HKV * list * 4);
    vase_planner_for(f->arena)->thread_free(p);
    vase_plan_run_free(dev);
    vase_plan_run_free(cpu);
    assert_int_equal(mock_cuda.workspaces_live, 0);
    assert_int_equal(mock_cuda.stream_destroys, mock_cuda.stream_creates);
}

static void test_planner_attnv(void **state) {
    check_against_cpu(*state, VASE_POLICY_VASE_ATTNV);
}

static void test_planner_h2o(void **state) {
    check_against_cpu(*state, VASE_POLICY_H2O);
}

static void test_planner_nan(void **state) {
    struct plan_fixture *f = *state;
    struct vase_plan_run *run = make_run(f, VASE_POLICY_VASE_ATTNV, f->arena);
    struct vase_planner *p = NULL;
    uint32_t bad = 99, i0 = 1 * HKV;
    uint32_t sentinel[4] = {0xdeadbeef, 0xdeadbeef, 0xdeadbeef, 0xdeadbeef};

    /* A NaN in layer 1: the plan fails whole, naming the layer; no plan page is written. */
    plan_fixture_kv(f, 1, 1, 17, 0)[3] = NAN;
    memcpy(plan_fixture_list(f, i0), sentinel, sizeof(sentinel));
    assert_int_equal(vase_planner_for(f->arena)->thread_new(f->arena, &p), 0);
    assert_int_equal(vase_planner_for(f->arena)->plan_layers(p, run, 0, L, &bad), -EINVAL);
    assert_int_equal(bad, 1);
    assert_memory_equal(plan_fixture_list(f, i0), sentinel, sizeof(sentinel));
    vase_planner_for(f->arena)->thread_free(p);
    vase_plan_run_free(run);
}

static void test_planner_failures(void **state) {
    struct plan_fixture *f = *state;
    struct vase_plan_run *run = make_run(f, VASE_POLICY_SNAPKV, f->arena);
    struct vase_planner *p = NULL;
    uint32_t bad = 99;

    mock_cuda.fail_malloc = true;
    assert_int_equal(vase_planner_for(f->arena)->thread_new(f->arena, &p), 0);
    log_capture_begin();
    int r = vase_planner_for(f->arena)->plan_layers(p, run, 0, L, &bad);
    const char *log = log_capture_end();
    assert_int_equal(r, -ENOMEM);
    assert_non_null(strstr(log, "plan scratch"));
    assert_int_equal(bad, 0);
    mock_cuda.fail_malloc = false;
    /* cudaErrorLaunchFailure is sticky: the context is lost, said so, and -ENOTRECOVERABLE. */
    mock_cuda.fail_stream_sync = true;
    log_capture_begin();
    r = vase_planner_for(f->arena)->plan_layers(p, run, 0, L, &bad);
    log = log_capture_end();
    assert_int_equal(r, -ENOTRECOVERABLE);
    assert_non_null(strstr(log, "cudaStreamSynchronize"));
    assert_non_null(strstr(log, "sticky"));
    mock_cuda.fail_stream_sync = false;
    /* A kernel failure that leaves the context usable stays the kernels' -EIO... */
    mock_cuda.plan_error = -EIO;
    log_capture_begin();
    r = vase_planner_for(f->arena)->plan_layers(p, run, 0, L, &bad);
    log = log_capture_end();
    assert_int_equal(r, -EIO);
    assert_null(strstr(log, "sticky"));
    /* ... and one after which the stream reports a sticky error is the context's loss. */
    mock_cuda.fail_stream_sync = true;
    log_capture_begin();
    r = vase_planner_for(f->arena)->plan_layers(p, run, 0, L, &bad);
    log = log_capture_end();
    assert_int_equal(r, -ENOTRECOVERABLE);
    assert_non_null(strstr(log, "the plan kernels"));
    mock_cuda.fail_stream_sync = false;
    mock_cuda.plan_error = 0;
    assert_int_equal(vase_planner_for(f->arena)->plan_layers(p, run, 0, L, &bad), 0);
    vase_planner_for(f->arena)->thread_free(p);
    vase_plan_run_free(run);
}

/* The evictor sends device runs to the CUDA planner, one per thread, freed at its end. */
static void test_evictor_on_device(void **state) {
    struct plan_fixture *f = *state;
    void *ctx = zmq_ctx_new();
    struct vase_evictor *ev = NULL;
    struct vase_plan_run *runs[4], *cpu = make_run(f, VASE_POLICY_VASE_ATTNV, NULL);
    uint32_t bad;

    assert_int_equal(vase_plan_run_layers(cpu, 0, L, NULL, &bad), 0);
    assert_int_equal(vase_evictor_new(ctx, 2, &ev), 0);
    for (int i = 0; i < 4; i++) {
        runs[i] = make_run(f, VASE_POLICY_VASE_ATTNV, f->arena);
        assert_int_equal(vase_evictor_submit(ev, runs[i]), 0);
    }
    zmq_pollitem_t item = {.socket = vase_evictor_socket(ev), .events = ZMQ_POLLIN};
    for (int done = 0; done < 4;) {
        struct vase_plan_run *run;
        /* A bound that only a lost run reaches, never a slow one. */
        assert_true(zmq_poll(&item, 1, 60000) > 0);
        int r;
        while ((r = vase_evictor_receive(ev, &run)) >= 0)
            if (r == 1) {
                assert_int_equal(run->error, 0);
                assert_memory_equal(run->keep_lists, cpu->keep_lists,
                                    (size_t)L * HKV * run->keep * sizeof(uint32_t));
                done++;
            }
        assert_int_equal(r, -EAGAIN);
    }
    assert_int_equal(mock_cuda.plans, 4 * L);
    assert_true(mock_cuda.workspaces >= 1 && mock_cuda.workspaces <= 2);
    vase_evictor_free(ev);
    assert_int_equal(mock_cuda.workspaces_live, 0);
    assert_int_equal(mock_cuda.stream_destroys, mock_cuda.stream_creates);
    for (int i = 0; i < 4; i++)
        vase_plan_run_free(runs[i]);
    vase_plan_run_free(cpu);
    zmq_ctx_term(ctx);
}

/* The scratch grows, by half again, and is never allocated or freed per plan: a larger job
 * within the margin and any number of repeated jobs reuse it. */
static void test_scratch_reused(void **state) {
    struct plan_fixture *f = *state;
    struct vase_plan_run *run = make_run(f, VASE_POLICY_VASE_ATTNV, f->arena);
    struct vase_planner *p = NULL;
    uint32_t bad;

    assert_int_equal(vase_planner_for(f->arena)->thread_new(f->arena, &p), 0);
    unsigned mallocs = mock_cuda.mallocs;
    assert_int_equal(vase_planner_for(f->arena)->plan_layers(p, run, 0, 2, &bad), 0);
    assert_int_equal(mock_cuda.mallocs, mallocs + 1);
    unsigned frees = mock_cuda.frees;
    for (int i = 0; i < 8; i++)
        assert_int_equal(vase_planner_for(f->arena)->plan_layers(p, run, 0, L, &bad), 0);
    assert_int_equal(mock_cuda.mallocs, mallocs + 1);
    assert_int_equal(mock_cuda.frees, frees);
    vase_planner_for(f->arena)->thread_free(p);
    vase_plan_run_free(run);
}

/* The sticky class (errno_cuda.c), against the runtime's own codes. */
static void test_sticky_class(void **state) {
    (void)state;
    assert_true(vase_cuda_sticky(cudaErrorIllegalAddress));
    assert_true(vase_cuda_sticky(cudaErrorLaunchFailure));
    assert_true(vase_cuda_sticky(cudaErrorAssert));
    assert_true(vase_cuda_sticky(cudaErrorHardwareStackError));
    assert_true(vase_cuda_sticky(cudaErrorMisalignedAddress));
    assert_true(vase_cuda_sticky(cudaErrorECCUncorrectable));
    assert_false(vase_cuda_sticky(cudaSuccess));
    assert_false(vase_cuda_sticky(cudaErrorMemoryAllocation));
    assert_false(vase_cuda_sticky(cudaErrorInvalidValue));
    assert_false(vase_cuda_sticky(cudaErrorNotReady));
    /* Its mapping to errno is unchanged: the class is asked for separately. */
    assert_int_equal(vase_cuda_errno(cudaErrorIllegalAddress), -EIO);
}

/*
 * From the planner to the main loop: a run whose plan hit a sticky error comes back from the
 * evictor with -ENOTRECOVERABLE, and its completion stops the loop with the status that has
 * systemd restart vased; a run that failed otherwise does not. The sequence, closed while it
 * planned, gets its pages back either way.
 */
static void test_sticky_stops_daemon(void **state) {
    struct plan_fixture *f = *state;
    const struct vase_layout_geometry g = {L, HQ, HKV, D, VASE_DTYPE_F32, B};
    void *ctx = zmq_ctx_new();
    struct vase_evictor *ev = NULL;
    struct vased *d = calloc(1, sizeof(*d));
    struct vased_client *c;
    struct vased_model *m;
    struct vase_layout lay;
    char msg[256];

    assert_non_null(d);
    assert_int_equal(vase_registry_new(vase_plan_run_free, &d->reg), 0);
    assert_int_equal(vase_alloc_new(4u << 20, GRANULE_BYTES, &d->allocs[0]), 0);
    assert_int_equal(vase_layout_compute(&g, 4u << 20, &lay, msg, sizeof(msg)), 0);
    assert_int_equal(vase_registry_add_client(d->reg, -1, &c), 0);
    assert_int_equal(vase_registry_add_model(d->reg, c, "m", 0, &lay, &m), 0);
    assert_int_equal(vase_evictor_new(ctx, 1, &ev), 0);

    for (int sticky = 0; sticky < 2; sticky++) {
        struct vased_seq_request req = {.policy = VASE_POLICY_VASE_ATTNV, .slack = W};
        struct vased_seq *s;
        req.params = vase_params_default(BUDGET);
        req.params.window = W;
        assert_int_equal(
            vase_registry_open_seq(d->reg, d->allocs[0], c, m, &req, 8, 0, &s, msg, sizeof(msg)),
            0);
        struct vase_plan_run *run = make_run(f, VASE_POLICY_VASE_ATTNV, f->arena);
        run->owner = s;
        s->run = run;
        s->state = VASED_SEQ_PLANNING;
        assert_int_equal(vase_registry_close_seq(d->reg, d->allocs[0], s), 1);

        mock_cuda.plan_error = -EIO;
        mock_cuda.fail_stream_sync = sticky;
        log_capture_begin();
        assert_int_equal(vase_evictor_submit(ev, run), 0);
        d->evictions_in_flight++;
        zmq_pollitem_t item = {.socket = vase_evictor_socket(ev), .events = ZMQ_POLLIN};
        struct vase_plan_run *back = NULL;
        while (!back) {
            /* A bound that only a lost run reaches, never a slow one. */
            assert_true(zmq_poll(&item, 1, 60000) > 0);
            while (vase_evictor_receive(ev, &back) == 0)
                ;
        }
        assert_ptr_equal(back, run);
        assert_int_equal(run->error, sticky ? -ENOTRECOVERABLE : -EIO);
        vase_cycle_plan_done(d, run); /* frees the orphan, and the run with it */
        const char *log = log_capture_end();
        assert_int_equal(d->quit, sticky);
        assert_int_equal(d->exit_error, sticky ? -ENOTRECOVERABLE : 0);
        assert_int_equal(vased_exit_status(d->exit_error),
                         sticky ? VASED_EXIT_DEVICE_LOST : EXIT_SUCCESS);
        if (sticky)
            assert_non_null(strstr(log, "GPU context of vased is lost"));
        assert_null(d->reg->orphans);
        assert_int_equal(d->allocs[0]->used_bytes, 0);
        assert_int_equal(d->evictions_in_flight, 0);
    }
    mock_cuda.plan_error = 0;
    mock_cuda.fail_stream_sync = false;
    assert_int_equal(vased_exit_status(-EIO), EXIT_FAILURE);
    vase_evictor_free(ev);
    vase_registry_free(d->reg);
    vase_alloc_free(d->allocs[0]);
    free(d);
    zmq_ctx_term(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_planner_attnv, plan_setup, plan_teardown),
        cmocka_unit_test_setup_teardown(test_planner_h2o, plan_setup, plan_teardown),
        cmocka_unit_test_setup_teardown(test_planner_nan, plan_setup, plan_teardown),
        cmocka_unit_test_setup_teardown(test_planner_failures, plan_setup, plan_teardown),
        cmocka_unit_test_setup_teardown(test_evictor_on_device, plan_setup, plan_teardown),
        cmocka_unit_test_setup_teardown(test_scratch_reused, plan_setup, plan_teardown),
        cmocka_unit_test(test_sticky_class),
        cmocka_unit_test_setup_teardown(test_sticky_stops_daemon, plan_setup, plan_teardown),
    };
    vase_log_set_max_level(LOG_ERR);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
