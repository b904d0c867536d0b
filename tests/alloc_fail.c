/* SPDX-License-Identifier: MIT */

/*
 * The allocation-failure hook of tests/alloc_fail.h: wrappers of the allocator calls (linked in
 * with -Wl,--wrap) that count the allocations of an armed sweep step and fail its Nth one, and
 * a set of the blocks the step allocated, so that a block its clean-up forgets is caught here
 * as well as by valgrind and LeakSanitizer. While nothing is armed the wrappers only pass the
 * call on (the set still forgets blocks that are freed).
 *
 * Only the thread that armed the hook is counted and failed: a step may start threads (the
 * evictor's) whose allocations come at no fixed point, so counting them would make the Nth
 * allocation a different one on every run. Their frees still forget blocks the step's thread
 * allocated, so the set is behind a mutex.
 */

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "alloc_fail.h"

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
void *__real_aligned_alloc(size_t align, size_t n);
void __real_free(void *p);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t n);
char *__wrap_strdup(const char *s);
void *__wrap_aligned_alloc(size_t align, size_t n);
void __wrap_free(void *p);

/* Blocks allocated while armed and not freed yet: an open-addressing set of pointers. */
#define LIVE_SLOTS 8192
#define TOMBSTONE ((void *)1)

static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;

static struct {
    _Atomic bool armed; /* read by every thread that allocates */
    pthread_t owner;    /* the thread that armed the hook: the only one counted */
    unsigned fail_at;   /* the allocation to fail, counting from 1 while armed */
    unsigned calls;     /* allocations seen while armed */
    bool injected;      /* the step reached its fail_at-th allocation */
    void *live[LIVE_SLOTS];
    unsigned n_live;
} hook;

static size_t slot_of(const void *p) {
    return ((uintptr_t)p >> 4) * 2654435761u % LIVE_SLOTS;
}

static void live_add(void *p) {
    size_t i = slot_of(p);
    while (hook.live[i] && hook.live[i] != TOMBSTONE)
        i = (i + 1) % LIVE_SLOTS;
    hook.live[i] = p;
    hook.n_live++;
}

/* Forgets p; whether it was tracked. */
static bool live_remove(const void *p) {
    bool found = false;
    if (!p)
        return false;
    pthread_mutex_lock(&live_lock);
    size_t i = slot_of(p);
    for (size_t probes = 0; hook.n_live && hook.live[i] && probes < LIVE_SLOTS;
         probes++, i = (i + 1) % LIVE_SLOTS)
        if (hook.live[i] == p) {
            hook.live[i] = TOMBSTONE;
            hook.n_live--;
            found = true;
            break;
        }
    pthread_mutex_unlock(&live_lock);
    return found;
}

/* Whether the calling thread is the armed one. */
static bool counted(void) {
    return hook.armed && pthread_equal(pthread_self(), hook.owner);
}

/* Whether this allocation is the one to fail. */
static bool fail_now(void) {
    if (!counted())
        return false;
    if (++hook.calls != hook.fail_at)
        return false;
    hook.injected = true;
    return true;
}

/* Records a block allocated while armed. */
static void *track(void *p) {
    if (p && counted()) {
        pthread_mutex_lock(&live_lock);
        /* A step allocating more blocks than the set holds would make the check meaningless. */
        if (hook.n_live >= LIVE_SLOTS / 2)
            abort();
        live_add(p);
        pthread_mutex_unlock(&live_lock);
    }
    return p;
}

void *__wrap_malloc(size_t n) {
    return fail_now() ? NULL : track(__real_malloc(n));
}

void *__wrap_calloc(size_t n, size_t size) {
    return fail_now() ? NULL : track(__real_calloc(n, size));
}

void *__wrap_realloc(void *p, size_t n) {
    if (fail_now())
        return NULL;
    void *q = __real_realloc(p, n);
    /* A tracked block stays tracked when it moves, even after the step is disarmed. */
    if (q && live_remove(p) && !counted()) {
        pthread_mutex_lock(&live_lock);
        live_add(q);
        pthread_mutex_unlock(&live_lock);
    }
    return q ? track(q) : NULL;
}

char *__wrap_strdup(const char *s) {
    return fail_now() ? NULL : track(__real_strdup(s));
}

void *__wrap_aligned_alloc(size_t align, size_t n) {
    return fail_now() ? NULL : track(__real_aligned_alloc(align, n));
}

void __wrap_free(void *p) {
    live_remove(p);
    __real_free(p);
}

void alloc_fail_arm(void) {
    hook.owner = pthread_self();
    hook.calls = 0;
    hook.injected = false;
    hook.armed = true;
}

void alloc_fail_disarm(void) {
    hook.armed = false;
}

void alloc_fail_resume(void) {
    hook.owner = pthread_self();
    hook.armed = true;
}

void alloc_fail_at(unsigned n) {
    hook.fail_at = n;
    pthread_mutex_lock(&live_lock);
    hook.n_live = 0;
    memset(hook.live, 0, sizeof(hook.live));
    pthread_mutex_unlock(&live_lock);
}

bool alloc_fail_injected(void) {
    return hook.injected;
}

unsigned alloc_fail_live(void) {
    pthread_mutex_lock(&live_lock);
    unsigned n = hook.n_live;
    pthread_mutex_unlock(&live_lock);
    return n;
}

unsigned alloc_fail_sweep(const char *what, alloc_fail_step step, void *ctx, int success) {
    unsigned n;
    for (n = 1;; n++) {
        alloc_fail_at(n);
        int r = step(ctx);
        alloc_fail_disarm();
        if (hook.n_live != 0)
            fail_msg("%s: %u blocks leaked when allocation %u failed", what, hook.n_live, n);
        if (!hook.injected) {
            if (r != success)
                fail_msg("%s: %d without an injected failure, expected %d", what, r, success);
            break;
        }
        if (r != -ENOMEM)
            fail_msg("%s: allocation %u failed and it returned %d, not -ENOMEM", what, n, r);
        if (n > 100000)
            fail_msg("%s: no end to its allocations", what);
    }
    if (n == 1)
        printf("%s: no allocation at all\n", what);
    else
        printf("%s: %u allocation failure points, all -ENOMEM, nothing leaked\n", what, n - 1);
    return n - 1;
}
