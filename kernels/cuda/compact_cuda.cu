/* SPDX-License-Identifier: MIT */

/*
 * Compaction on the GPU (ALGORITHM.md, "Compaction"; compact.c is the reference): per head,
 * slot i < K receives candidate keep[i] and slots K .. K + len - n - 1 receive old slots
 * n .. len - 1, in place in the view, on the caller's stream and without waiting for it.
 *
 * The destinations overlap the sources (a kept candidate can sit where another one or a tail
 * token goes, and the tail overlaps itself when more than n - K tokens were appended), so the
 * move runs as three kernels in stream order: validate the plan, gather every source row (kept
 * candidates and tail) into a scratch buffer, scatter the scratch buffer to the destinations.
 * Kernel boundaries order them: every source is read before any destination is written. Rows
 * already in place (keep[i] == i, or a tail when n == K) are skipped, as on the CPU.
 *
 * The plan is validated on the device (entries below n, distinct within each head) into a flag
 * the copy kernels check first: an invalid plan moves nothing. The call cannot report that
 * without waiting for the stream, which the engine's hot path must not do; plans made by
 * vase_plan() or vase_plan_cuda() are valid by construction.
 *
 * The scratch buffer is the caller's (libvase allocates one per sequence at its open, sized for
 * the largest layer move the sequence can make), so that nothing is allocated while the engine
 * holds most of the GPU's memory; only tools and tests pass none, and then it comes from the
 * stream-ordered allocator (cudaMallocAsync) where the device has memory pools, else from
 * cudaMalloc, freed after a synchronisation.
 *
 * This runs in the engine's process, inside its CUDA context: a runtime error pending when the
 * call starts is the engine's, left pending. Launches are checked by peeking at the last error
 * (launch_check()) and only an error that was not already pending is taken as ours.
 */

#include <errno.h>
#include <limits.h>

#include "internal_cuda.cuh"

#define COPY_THREADS 256
#define COPY_MAX_BLOCKS (1u << 20) /* grid-stride beyond */

/* Grid (ceil(K / 256), heads), 256 threads, one plan entry each: raises the flag for an entry
 * >= n or one seen twice in its head. seen: [heads][words] bitmap, zeroed. */
static __global__ void compact_validate_kernel(const uint32_t *keep, uint32_t K, uint32_t n,
                                               uint32_t words, uint32_t *seen, int *flag) {
    uint32_t i = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y;
    if (i >= K)
        return;
    uint32_t j = keep[(size_t)h * K + i];
    if (j >= n) {
        raise_flag(flag);
        return;
    }
    uint32_t bit = 1u << (j % 32);
    if (atomicOr(&seen[(size_t)h * words + j / 32], bit) & bit)
        raise_flag(flag);
}

/* The source slot of destination slot t. */
static __device__ __forceinline__ uint32_t compact_src(const uint32_t *keep, uint32_t K, uint32_t n,
                                                       uint32_t h, uint32_t t) {
    return t < K ? keep[(size_t)h * K + t] : n + (t - K);
}

/*
 * Grid (min(ceil(rows * upr / 256), 2^20), heads), 256 threads, grid-stride over the rows * upr
 * units of U (upr units per row) of one head. Gather (to_view false): scratch [heads][rows]
 * [row] = source rows; scatter (to_view true): destination rows = scratch. Nothing when the
 * flag is raised.
 */
template <typename U>
static __global__ void compact_copy_kernel(struct dview v, const uint32_t *keep, uint32_t K,
                                           uint32_t n, uint32_t rows, uint32_t upr, U *scratch,
                                           bool to_view, const int *flag) {
    if (*flag)
        return;
    const uint32_t h = blockIdx.y;
    const uint64_t total = (uint64_t)rows * upr;
    for (uint64_t idx = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; idx < total;
         idx += (uint64_t)gridDim.x * blockDim.x) {
        uint32_t t = (uint32_t)(idx / upr), u = (uint32_t)(idx % upr);
        uint32_t src = compact_src(keep, K, n, h, t);
        if (src == t)
            continue;
        U *buf = scratch + ((size_t)h * rows + t) * upr + u;
        if (to_view)
            ((U *)dview_row(v, t, h))[u] = *buf;
        else
            *buf = ((const U *)dview_row(v, src, h))[u];
    }
}

/* A failure e of this call's own as -errno. It is cleared from the thread's last error (by
 * vase__cuda_errno()) only when no error was pending when the call started: the runtime keeps
 * one last error, so ours replaced the engine's, and clearing it would hide from the engine that
 * something failed. */
static int own_errno(cudaError_t e, cudaError_t before) {
    if (e == cudaSuccess)
        return 0;
    return before == cudaSuccess ? vase__cuda_errno(e) : vase_cuda_errno((int)e);
}

/* After a launch: 0, or the launch's own failure. An error equal to `before`, the one pending
 * when the call started, is taken for the engine's and left where it is. */
static int launch_check(cudaError_t before) {
    cudaError_t e = cudaPeekAtLastError();
    return e == before ? 0 : own_errno(e, before);
}

template <typename U>
static int launch_copies(const struct vase_view *view, const uint32_t *keep, uint32_t K, uint32_t n,
                         uint32_t rows, size_t row_bytes, void *scratch, const int *flag,
                         cudaStream_t stream, cudaError_t before) {
    uint32_t upr = (uint32_t)(row_bytes / sizeof(U));
    uint64_t blocks = ((uint64_t)rows * upr + COPY_THREADS - 1) / COPY_THREADS;
    dim3 grid(blocks < COPY_MAX_BLOCKS ? (unsigned)blocks : COPY_MAX_BLOCKS, view->heads);
    struct dview v = dview_of(view);

    /* Every source row is read (gather) before any destination is written (scatter): the two
     * launches are ordered on the stream. */
    compact_copy_kernel<U>
        <<<grid, COPY_THREADS, 0, stream>>>(v, keep, K, n, rows, upr, (U *)scratch, false, flag);
    int r = launch_check(before);
    if (r < 0)
        return r;
    compact_copy_kernel<U>
        <<<grid, COPY_THREADS, 0, stream>>>(v, keep, K, n, rows, upr, (U *)scratch, true, flag);
    return launch_check(before);
}

/* Enqueues the validation and the two copies into scratch p (256-byte aligned, large enough). */
static int enqueue(struct vase_view *view, const uint32_t *keep, uint32_t K, uint32_t n,
                   uint32_t rows, size_t row_bytes, char *p, cudaStream_t st, cudaError_t before) {
    uint32_t heads = view->heads, words = (n + 31) / 32;

    /* The widest copy unit (16, 8, 4 or 2 bytes) that every row address and the row size are
     * multiples of. */
    uint64_t bits = (uint64_t)(uintptr_t)view->base | (uint64_t)view->page_stride |
                    (uint64_t)view->token_stride | (uint64_t)view->head_stride | row_bytes;
    size_t unit = 16;
    while (bits % unit)
        unit /= 2;

    /* Scratch: [flag][seen bitmap [heads][words]][rows [heads][rows][row_bytes]], as
     * vase_compact_cuda_scratch_bytes() counts it. */
    size_t seen_off = 256;
    size_t data_off = vase_compact_cuda_scratch_bytes(heads, row_bytes, n, 0);
    int *flag = (int *)p;
    int r = own_errno(cudaMemsetAsync(p, 0, data_off, st), before);
    if (r == 0 && K > 0) {
        /* Grid (ceil(K / 256), heads). */
        compact_validate_kernel<<<dim3(blocks_for(K, 256), heads), 256, 0, st>>>(
            keep, K, n, words, (uint32_t *)(p + seen_off), flag);
        r = launch_check(before);
    }
    if (r < 0)
        return r;
    void *data = p + data_off;
    switch (unit) {
    case 16:
        return launch_copies<uint4>(view, keep, K, n, rows, row_bytes, data, flag, st, before);
    case 8:
        return launch_copies<uint2>(view, keep, K, n, rows, row_bytes, data, flag, st, before);
    case 4:
        return launch_copies<uint32_t>(view, keep, K, n, rows, row_bytes, data, flag, st, before);
    default:
        return launch_copies<uint16_t>(view, keep, K, n, rows, row_bytes, data, flag, st, before);
    }
}

extern "C" int vase_compact_cuda(struct vase_view *view, const uint32_t *keep, uint32_t K,
                                 uint32_t n, uint32_t len, void *scratch, size_t scratch_bytes,
                                 void *stream) {
    cudaStream_t st = (cudaStream_t)stream;
    int r, dev = 0, pools = 0;

    if (!view || !keep || K > n || n > len || vase__view_check(view, len) < 0 ||
        !dview_aligned(view) || (uintptr_t)keep % 4 != 0 || (uintptr_t)scratch % 256 != 0)
        return -EINVAL;
    uint64_t new_len = (uint64_t)K + len - n;
    if (new_len > INT_MAX)
        return -EINVAL;
    uint32_t rows = (uint32_t)new_len;
    size_t row_bytes = (size_t)view->dim * vase_dtype_size(view->dtype);
    size_t total = vase_compact_cuda_scratch_bytes(view->heads, row_bytes, n, rows);
    if (scratch && scratch_bytes < total)
        return -EINVAL;
    if (rows == 0)
        return 0;

    /* Not cleared: the engine's, if any (see the top of the file). */
    cudaError_t before = cudaPeekAtLastError();
    if (scratch)
        r = enqueue(view, keep, K, n, rows, row_bytes, (char *)scratch, st, before);
    else {
        char *p = NULL;
        r = own_errno(cudaGetDevice(&dev), before);
        if (r == 0)
            r = own_errno(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, dev),
                          before);
        if (r == 0)
            r = own_errno(pools ? cudaMallocAsync((void **)&p, total, st)
                                : cudaMalloc((void **)&p, total),
                          before);
        if (r < 0)
            return r;
        r = enqueue(view, keep, K, n, rows, row_bytes, p, st, before);
        if (pools) {
            int f = own_errno(cudaFreeAsync(p, st), before);
            r = r < 0 ? r : f;
        } else {
            /* cudaFree() would not wait for this stream's kernels. */
            int s = own_errno(cudaStreamSynchronize(st), before);
            (void)cudaFree(p);
            r = r < 0 ? r : s;
        }
    }
    return r < 0 ? r : (int)new_len;
}
