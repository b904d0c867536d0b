/* SPDX-License-Identifier: MIT */
#pragma once

#include <stdbool.h>

/*
 * Allocation-failure injection for the tests that sweep it (test_daemon_alloc_fail,
 * test_client_alloc_fail, test_integration_alloc_fail). A binary that links tests/alloc_fail.c
 * must be linked with -Wl,--wrap for malloc, calloc, realloc, strdup, aligned_alloc and free
 * (ALLOC_WRAP in the Makefile): every call to them from the archives it links and from its own
 * objects then goes through the wrappers there. Calls from shared libraries (libc itself,
 * cmocka, ZeroMQ, protobuf-c, libinih) are not seen. Failures are cmocka assertions; include
 * <cmocka.h> (and what it needs) before this header.
 */

/* Starts counting the calling thread's allocations: the sweep's Nth one from here fails. Blocks
 * it allocates from here on are tracked until freed (by any thread). Other threads' allocations
 * are neither counted nor failed. */
void alloc_fail_arm(void);
/* Stops counting and failing; tracked blocks stay tracked, so the step's clean-up is checked. */
void alloc_fail_disarm(void);
/* Arms the hook again, for the calling thread, without restarting the count: for a step that
 * must do something of its own (play the peer) between the calls under test. */
void alloc_fail_resume(void);

/* For a process that runs one step of a sweep driven from outside (build/tests/vased_alloc_fail):
 * the nth allocation from the next arming is the one to fail, and the set of tracked blocks is
 * emptied. */
void alloc_fail_at(unsigned n);
/* Whether the allocation chosen by alloc_fail_at() (or the sweep) was reached and failed. */
bool alloc_fail_injected(void);
/* How many blocks allocated while armed have not been freed yet. */
unsigned alloc_fail_live(void);

/*
 * A sweep step does its set-up, arms the hook around the calls under test, disarms it, checks
 * what they left behind, frees everything, and returns what the calls returned.
 */
typedef int (*alloc_fail_step)(void *ctx);

/*
 * Runs step with its 1st, 2nd, ... armed allocation failing, until a run reaches no injected
 * failure: that run must return success, every earlier one exactly -ENOMEM, and after each every
 * block allocated while armed must have been freed. Prints "WHAT: N allocation failure points,
 * all -ENOMEM, nothing leaked" and returns N.
 */
unsigned alloc_fail_sweep(const char *what, alloc_fail_step step, void *ctx, int success);
