/* SPDX-License-Identifier: MIT */

/*
 * The CPU emulation of CUDA for tests/gpu/emu: the runtime calls of cuda_runtime_api.h and the
 * scheduler of CUDA threads. A block's threads are ucontext fibers run round-robin; each runs
 * until it finishes or waits at a barrier (__syncthreads, or a shuffle's warp barrier). When
 * every live fiber waits, the scheduler releases a warp whose live threads all wait at a
 * shuffle (all 32 must be live: the kernels shuffle with full masks), else the block if every
 * live thread waits at __syncthreads (and none has exited), else it reports a deadlock: the
 * divergent barriers a GPU would hang on or misbehave with. Shuffle values go through a
 * double-buffered slot per lane, so a fast warp cannot overwrite values a slow lane has yet to
 * read.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ucontext.h>
#include <vector>

#include "cuda_runtime.h"

namespace emu {
uint3 cur_tid, cur_bid;
dim3 cur_bdim, cur_gdim;

enum wait_kind { RUN, BLOCK, WARP, DONE };
struct fiber {
    ucontext_t ctx;
    uint3 tid;
    int lane, warp, gen;
    wait_kind wait;
};
static ucontext_t sched_ctx;
static std::vector<fiber> fibers;
static char *stacks;
static size_t stacks_n;
static fiber *cur;
static const std::function<void()> *cur_body;
struct warp_slots {
    uint64_t v[2][32];
};
static std::vector<warp_slots> slots;
static const size_t STACK = 128 * 1024;
unsigned long launches, blocks_run;

static void die(const char *what) {
    fprintf(stderr, "emu: %s (block %u,%u,%u thread %u,%u,%u)\n", what, cur_bid.x, cur_bid.y,
            cur_bid.z, cur ? cur->tid.x : 0, cur ? cur->tid.y : 0, cur ? cur->tid.z : 0);
    abort();
}

static void fiber_main() {
    (*cur_body)();
    cur->wait = DONE;
    swapcontext(&cur->ctx, &sched_ctx);
    die("a finished fiber resumed");
}

void syncthreads() {
    fiber *me = cur;
    me->wait = BLOCK;
    swapcontext(&me->ctx, &sched_ctx);
}

uint64_t shfl_raw(uint64_t v, int src, int mode) {
    fiber *me = cur;
    int g = me->gen;
    slots[me->warp].v[g][me->lane] = v;
    me->wait = WARP;
    swapcontext(&me->ctx, &sched_ctx);
    int from = mode ? (me->lane ^ src) : src;
    if (from < 0 || from >= 32)
        die("shuffle source lane out of range");
    me->gen ^= 1;
    return slots[me->warp].v[g][from];
}

/* The order runnable fibers run in changes from round to round (a seeded shuffle), so that a
 * read of shared memory that another thread writes without a barrier in between sees either
 * value across the run, as on a GPU, rather than always the same one. */
static uint64_t order_state = 1;
static std::vector<unsigned> order;

static unsigned order_rand(unsigned n) {
    order_state = order_state * 6364136223846793005ull + 1442695040888963407ull;
    return (unsigned)((order_state >> 33) % n);
}

static void schedule(unsigned nt) {
    unsigned nwarps = (nt + 31) / 32;
    order.resize(nt);
    for (unsigned t = 0; t < nt; t++)
        order[t] = t;
    for (;;) {
        for (unsigned t = nt; t > 1; t--) {
            unsigned j = order_rand(t), x = order[t - 1];
            order[t - 1] = order[j];
            order[j] = x;
        }
        for (unsigned i = 0; i < nt; i++)
            if (fibers[order[i]].wait == RUN) {
                cur = &fibers[order[i]];
                cur_tid = cur->tid;
                swapcontext(&sched_ctx, &cur->ctx);
            }
        cur = NULL;
        unsigned live = 0, at_block = 0;
        for (unsigned t = 0; t < nt; t++) {
            live += fibers[t].wait != DONE;
            at_block += fibers[t].wait == BLOCK;
        }
        if (live == 0)
            return;
        bool released = false;
        for (unsigned w = 0; w < nwarps; w++) {
            unsigned lo = w * 32, hi = lo + 32 < nt ? lo + 32 : nt, lw = 0, aw = 0;
            for (unsigned t = lo; t < hi; t++) {
                lw += fibers[t].wait != DONE;
                aw += fibers[t].wait == WARP;
            }
            if (aw && aw == lw) {
                if (lw != 32)
                    die("warp shuffle with inactive lanes (full mask)");
                for (unsigned t = lo; t < hi; t++)
                    fibers[t].wait = RUN;
                released = true;
            }
        }
        if (released)
            continue;
        if (at_block == live) {
            if (live != nt)
                die("__syncthreads after some threads exited");
            for (unsigned t = 0; t < nt; t++)
                fibers[t].wait = RUN;
            continue;
        }
        die("deadlock: divergent __syncthreads / shuffles");
    }
}

void run_grid(dim3 g, dim3 b, const std::function<void()> &body) {
    unsigned nt = b.x * b.y * b.z;
    if (nt == 0 || nt > 1024 || g.x == 0 || g.y == 0 || g.z == 0 || g.y > 65535 || g.z > 65535 ||
        g.x > 0x7fffffffu)
        die("invalid launch configuration");
    launches++;
    cur_bdim = b;
    cur_gdim = g;
    cur_body = &body;
    fibers.resize(nt);
    if (stacks_n < nt) {
        free(stacks);
        stacks = (char *)malloc(nt * STACK);
        stacks_n = nt;
    }
    slots.resize((nt + 31) / 32);
    for (unsigned bz = 0; bz < g.z; bz++)
        for (unsigned by = 0; by < g.y; by++)
            for (unsigned bx = 0; bx < g.x; bx++) {
                cur_bid = {bx, by, bz};
                blocks_run++;
                for (unsigned t = 0; t < nt; t++) {
                    fiber &f = fibers[t];
                    f.tid = {t % b.x, (t / b.x) % b.y, t / (b.x * b.y)};
                    f.lane = t % 32;
                    f.warp = t / 32;
                    f.gen = 0;
                    f.wait = RUN;
                    getcontext(&f.ctx);
                    f.ctx.uc_stack.ss_sp = stacks + t * STACK;
                    f.ctx.uc_stack.ss_size = STACK;
                    f.ctx.uc_link = NULL;
                    makecontext(&f.ctx, fiber_main, 0);
                }
                schedule(nt);
            }
}
} // namespace emu

extern "C" {
const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess:
        return "no error";
    case cudaErrorMemoryAllocation:
        return "out of memory";
    case cudaErrorInvalidValue:
        return "invalid argument";
    case cudaErrorNoDevice:
        return "no CUDA-capable device is detected";
    default:
        return "emulated error";
    }
}
cudaError_t cudaGetLastError(void) {
    return cudaSuccess;
}
cudaError_t cudaPeekAtLastError(void) {
    return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int *n) {
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *d) {
    *d = 0;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
    return d == 0 ? cudaSuccess : cudaErrorInvalidValue;
}
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d) {
    (void)d;
    memset(p, 0, sizeof(*p));
    strcpy(p->name, "CPU emulation");
    p->major = 9;
    return cudaSuccess;
}
static int pools = 1;
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int d) {
    (void)a;
    (void)d;
    *v = getenv("EMU_NO_POOLS") ? 0 : pools;
    return cudaSuccess;
}
cudaError_t cudaMalloc(void **p, size_t n) {
    *p = aligned_alloc(256, (n + 255) & ~(size_t)255);
    if (!*p)
        return cudaErrorMemoryAllocation;
    memset(*p, 0xcd, n); /* device memory is not zeroed */
    return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t n) {
    return cudaMalloc(p, n);
}
cudaError_t cudaFreeHost(void *p) {
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s) {
    (void)s;
    return cudaMalloc(p, n);
}
cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
    (void)s;
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k) {
    (void)k;
    memmove(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k,
                            cudaStream_t st) {
    (void)st;
    return cudaMemcpy(d, s, n, k);
}
cudaError_t cudaMemset(void *d, int v, size_t n) {
    memset(d, v, n);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t st) {
    (void)st;
    return cudaMemset(d, v, n);
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    (void)s;
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned f) {
    (void)f;
    *s = (cudaStream_t)malloc(8);
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    free(s);
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) {
    *e = (cudaEvent_t)malloc(sizeof(double));
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    free(e);
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    (void)s;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    *(double *)(void *)e = ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    (void)e;
    return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    *ms = (float)(*(double *)(void *)b - *(double *)(void *)a);
    return cudaSuccess;
}
}
