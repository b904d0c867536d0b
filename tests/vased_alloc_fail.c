/* SPDX-License-Identifier: MIT */

/*
 * The test-only half of build/tests/vased_alloc_fail: vased's own main() and archive, linked
 * with tests/alloc_fail.c and -Wl,--wrap for the allocator calls and for sd_notify(). The
 * daemon says "READY=1" once, on its main thread, when it starts serving; the wrapper below
 * then arms the allocation-failure hook on that thread, so that the Nth allocation the main
 * loop makes while handling requests fails, N from $VASE_ALLOC_FAIL_AFTER_READY. The hook is
 * disarmed when the daemon says "STOPPING=1": the sweep is about serving, not shutting down.
 * The production daemon has no such code; without the variable this binary is vased.
 *
 * At exit the hook reports on stderr, which the integration harness keeps in the daemon's
 * log, one line the test reads: "vased_alloc_fail: allocation N failed, K blocks left" or
 * "vased_alloc_fail: allocation N not reached, K blocks left", K counting the blocks the main
 * thread allocated while armed and never freed.
 */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "alloc_fail.h"

int __real_sd_notify(int unset_environment, const char *state);
int __wrap_sd_notify(int unset_environment, const char *state);

static unsigned fail_at;

/* The count from the environment; 0 (the hook stays off) when unset or not a number. */
static unsigned fail_at_from_env(void) {
    const char *s = getenv("VASE_ALLOC_FAIL_AFTER_READY");
    if (!s || !*s)
        return 0;
    char *end;
    errno = 0;
    unsigned long n = strtoul(s, &end, 10);
    if (errno || *end || s[0] == '-' || n == 0 || n > 1000000)
        return 0;
    return (unsigned)n;
}

static void report(void) {
    alloc_fail_disarm();
    /* write(), not stdio: nothing here may allocate or depend on buffers still being flushed. */
    char line[128];
    int n = snprintf(line, sizeof(line), "vased_alloc_fail: allocation %u %s, %u blocks left\n",
                     fail_at, alloc_fail_injected() ? "failed" : "not reached", alloc_fail_live());
    if (n > 0 && write(STDERR_FILENO, line, (size_t)n) < 0)
        _exit(EXIT_FAILURE);
}

int __wrap_sd_notify(int unset_environment, const char *state) {
    int r = __real_sd_notify(unset_environment, state);
    if (!state)
        return r;
    if (strstr(state, "STOPPING=1"))
        alloc_fail_disarm();
    else if (strstr(state, "READY=1") && fail_at == 0 && (fail_at = fail_at_from_env()) > 0) {
        if (atexit(report) != 0)
            abort();
        alloc_fail_at(fail_at);
        alloc_fail_arm();
    }
    return r;
}
