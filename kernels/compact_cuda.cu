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
 * vase_plan() or vase_plan_cuda() are valid by construction. The scratch buffer comes from the
 * stream-ordered allocator (cudaMallocAsync) where the device has memory pools, else from
 * cudaMalloc, and is then freed after a synchronisation.
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

template <typename U>
static int launch_copies(const struct vase_view *view, const uint32_t *keep, uint32_t K, uint32_t n,
                         uint32_t rows, size_t row_bytes, void *scratch, const int *flag,
                         cudaStream_t stream) {
    uint32_t upr = (uint32_t)(row_bytes / sizeof(U));
    uint64_t blocks = ((uint64_t)rows * upr + COPY_THREADS - 1) / COPY_THREADS;
    dim3 grid(blocks < COPY_MAX_BLOCKS ? (unsigned)blocks : COPY_MAX_BLOCKS, view->heads);
    struct dview v = dview_of(view);

    /* Every source row is read (gather) before any destination is written (scatter): the two
     * launches are ordered on the stream. */
    compact_copy_kernel<U>
        <<<grid, COPY_THREADS, 0, stream>>>(v, keep, K, n, rows, upr, (U *)scratch, false, flag);
    CUDA_LAUNCHED();
    compact_copy_kernel<U>
        <<<grid, COPY_THREADS, 0, stream>>>(v, keep, K, n, rows, upr, (U *)scratch, true, flag);
    CUDA_LAUNCHED();
    return 0;
}

static size_t align256(size_t x) {
    return (x + 255) & ~(size_t)255;
}

extern "C" int vase_compact_cuda(struct vase_view *view, const uint32_t *keep, uint32_t K,
                                 uint32_t n, uint32_t len, void *stream) {
    cudaStream_t st = (cudaStream_t)stream;
    int r, dev = 0, pools = 0;

    if (!view || !keep || K > n || n > len || vase__view_check(view, len) < 0 ||
        !dview_aligned(view) || (uintptr_t)keep % 4 != 0)
        return -EINVAL;
    uint64_t new_len = (uint64_t)K + len - n;
    if (new_len > INT_MAX)
        return -EINVAL;
    uint32_t heads = view->heads, rows = (uint32_t)new_len;
    if (rows == 0)
        return 0;

    /* The widest copy unit (16, 8, 4 or 2 bytes) that every row address and the row size are
     * multiples of. */
    size_t row_bytes = (size_t)view->dim * vase_dtype_size(view->dtype);
    uint64_t bits = (uint64_t)(uintptr_t)view->base | (uint64_t)view->page_stride |
                    (uint64_t)view->token_stride | (uint64_t)view->head_stride | row_bytes;
    size_t unit = 16;
    while (bits % unit)
        unit /= 2;

    /* Scratch: [flag][seen bitmap [heads][words]][rows [heads][rows][row_bytes]]. */
    uint32_t words = (n + 31) / 32;
    size_t seen_off = 256, data_off = align256(seen_off + (size_t)heads * words * 4);
    size_t total = data_off + (size_t)heads * rows * row_bytes;

    (void)cudaGetLastError();
    r = vase__cuda_errno(cudaGetDevice(&dev));
    if (r == 0)
        r = vase__cuda_errno(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, dev));
    if (r < 0)
        return r;
    char *p = NULL;
    r = vase__cuda_errno(pools ? cudaMallocAsync((void **)&p, total, st)
                               : cudaMalloc((void **)&p, total));
    if (r < 0)
        return r;
    int *flag = (int *)p;
    r = vase__cuda_errno(cudaMemsetAsync(p, 0, data_off, st));
    if (r == 0 && K > 0) {
        /* Grid (ceil(K / 256), heads). */
        compact_validate_kernel<<<dim3(blocks_for(K, 256), heads), 256, 0, st>>>(
            keep, K, n, words, (uint32_t *)(p + seen_off), flag);
        r = vase__cuda_errno(cudaGetLastError());
    }
    if (r == 0) {
        void *data = p + data_off;
        switch (unit) {
        case 16:
            r = launch_copies<uint4>(view, keep, K, n, rows, row_bytes, data, flag, st);
            break;
        case 8:
            r = launch_copies<uint2>(view, keep, K, n, rows, row_bytes, data, flag, st);
            break;
        case 4:
            r = launch_copies<uint32_t>(view, keep, K, n, rows, row_bytes, data, flag, st);
            break;
        default:
            r = launch_copies<uint16_t>(view, keep, K, n, rows, row_bytes, data, flag, st);
            break;
        }
    }
    if (pools) {
        int f = vase__cuda_errno(cudaFreeAsync(p, st));
        r = r < 0 ? r : f;
    } else {
        /* cudaFree() would not wait for this stream's kernels. */
        int s = vase__cuda_errno(cudaStreamSynchronize(st));
        (void)cudaFree(p);
        r = r < 0 ? r : s;
    }
    return r < 0 ? r : (int)new_len;
}
