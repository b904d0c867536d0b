/* SPDX-License-Identifier: MIT */

/* Unit tests of daemon/plan/planner.c's choice of planner: the runs of a host arena (and of a run
 * without an arena) go to the CPU planner, those of a CUDA arena to the CUDA planner, which in a
 * build without CUDA refuses every run and every thread (its kernels: test_daemon_cuda_planner.c).
 */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "../daemon/core/arena.h"
#include "../daemon/core/log.h"
#include "../daemon/plan/planner.h"

static void test_host_runs_plan_on_the_cpu(void **state) {
    (void)state;
    struct vase_arena *a = NULL;
    assert_int_equal(vase_arena_new(3, "host", VASE_CUDA_SHARE_IPC, 1 << 20, 64 << 10, &a), 0);
    assert_ptr_equal(vase_planner_for(a), &vase_planner_cpu_ops);
    assert_ptr_equal(vase_planner_for(NULL), &vase_planner_cpu_ops);
    assert_null(vase_arena_free(a));
}

static void test_cuda_runs_go_to_the_cuda_planner(void **state) {
    (void)state;
    struct vase_arena cuda = {.ops = &vase_arena_cuda_vmm_ops};
    assert_ptr_equal(vase_planner_for(&cuda), &vase_planner_cuda_ops);
    cuda.ops = &vase_arena_cuda_ipc_ops;
    assert_ptr_equal(vase_planner_for(&cuda), &vase_planner_cuda_ops);
    assert_int_equal(vase_planner_have_cuda, vase_arena_have_cuda);
    if (vase_planner_have_cuda) {
        print_message("This build has CUDA: its planner is tested by test_daemon_cuda_planner.\n");
        return;
    }
    struct vase_planner *p = NULL;
    uint32_t bad = 99;
    assert_int_equal(vase_planner_cuda_ops.thread_new(&cuda, &p), -EOPNOTSUPP);
    assert_null(p);
    assert_int_equal(vase_planner_cuda_ops.plan_layers(NULL, NULL, 3, 4, &bad), -EOPNOTSUPP);
    assert_int_equal(bad, 3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_runs_plan_on_the_cpu),
        cmocka_unit_test(test_cuda_runs_go_to_the_cuda_planner),
    };
    vase_log_set_max_level(LOG_EMERG);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
