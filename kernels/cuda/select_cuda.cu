/* SPDX-License-Identifier: MIT */

/*
 * Selection on the GPU: a stable sort of (key, index) pairs per KV head, the first m indices of
 * each head kept. The keys are the 32-bit desc_key() images of select.c, built with the
 * indices in ascending order, and cub::DeviceSegmentedRadixSort is stable (it shares its
 * implementation with cub::DeviceRadixSort, documented stable): equal keys keep ascending
 * index, so the order is exactly vase__select_top()'s, descending value, ties in ascending
 * slot order. Excluded candidates carry KEY_EXCLUDED, which no float maps to, and sort after
 * every eligible one.
 *
 * This file holds the CUB instantiation alone, the slowest thing to compile, so that it is
 * rebuilt only when the sort itself changes. The sort takes int item counts: heads are sorted
 * in batches of at most INT_MAX items.
 */

#include <errno.h>
#include <limits.h>

#include <cub/device/device_segmented_radix_sort.cuh>

#include "internal_cuda.cuh"

uint32_t vase__cuda_sort_batch(uint32_t heads, uint32_t n) {
    uint64_t b = n ? (uint64_t)INT_MAX / n : heads;
    if (b < 1)
        b = 1;
    return b < heads ? (uint32_t)b : heads;
}

/* The CUB scratch for `segments` segments of n items each. */
static int temp_bytes(uint32_t segments, uint32_t n, size_t *ret) {
    size_t bytes = 0;
    cudaError_t e = cub::DeviceSegmentedRadixSort::SortPairs(
        nullptr, bytes, (const uint32_t *)nullptr, (uint32_t *)nullptr, (const uint32_t *)nullptr,
        (uint32_t *)nullptr, (int)((uint64_t)segments * n), (int)segments, (const int *)nullptr,
        (const int *)nullptr, 0, 32, (cudaStream_t)0);
    if (e != cudaSuccess)
        return vase__cuda_errno(e);
    *ret = bytes;
    return 0;
}

int vase__cuda_sort_reserve(struct vase_cuda_workspace *ws, uint32_t heads, uint32_t n) {
    uint32_t batch = vase__cuda_sort_batch(heads, n), last = heads % batch;
    size_t bytes = 0, b2 = 0;
    void *p;
    int r;

    if ((r = temp_bytes(batch, n, &bytes)) < 0)
        return r;
    /* A shorter last batch should need no more, but it costs nothing to make sure. */
    if (last && (r = temp_bytes(last, n, &b2)) < 0)
        return r;
    if (b2 > bytes)
        bytes = b2;
    if ((r = vase__cws_get(ws, CWS_KEYS2, (size_t)batch * n * sizeof(uint32_t), &p)) < 0 ||
        (r = vase__cws_get(ws, CWS_VALS2, (size_t)batch * n * sizeof(uint32_t), &p)) < 0 ||
        (r = vase__cws_get(ws, CWS_OFFSETS, ((size_t)batch + 1) * sizeof(int), &p)) < 0 ||
        (r = vase__cws_get(ws, CWS_CUB, bytes, &p)) < 0)
        return r;
    return 0;
}

/* Grid ceil((count + 1) / 256), 256 threads: offsets [count + 1] = i n, the segment bounds. */
static __global__ void offsets_kernel(int *offsets, uint32_t count, uint32_t n) {
    uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= count)
        offsets[i] = (int)((uint64_t)i * n);
}

/* Grid (ceil(m / 256), batch heads), 256 threads: out[(h0 + h) * stride + off + i] = the i-th
 * index of head h's sorted segment vals [batch][n]. */
static __global__ void take_kernel(const uint32_t *vals, uint32_t n, uint32_t m, uint32_t h0,
                                   uint32_t *out, uint32_t stride, uint32_t off) {
    uint32_t i = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y;
    if (i >= m)
        return;
    out[(size_t)(h0 + h) * stride + off + i] = vals[(size_t)h * n + i];
}

int vase__cuda_sort_take(struct vase_cuda_workspace *ws, cudaStream_t stream, const uint32_t *keys,
                         const uint32_t *vals, uint32_t heads, uint32_t n, uint32_t m,
                         uint32_t *out, uint32_t out_stride, uint32_t out_off) {
    uint32_t batch = vase__cuda_sort_batch(heads, n);
    uint32_t *keys2 = (uint32_t *)ws->buf[CWS_KEYS2], *vals2 = (uint32_t *)ws->buf[CWS_VALS2];
    int *offsets = (int *)ws->buf[CWS_OFFSETS];
    size_t bytes = ws->size[CWS_CUB];

    if (m == 0)
        return 0;
    if (m > n)
        return -EINVAL;
    /* Grid ceil((batch + 1) / 256). */
    offsets_kernel<<<blocks_for((uint64_t)batch + 1, 256), 256, 0, stream>>>(offsets, batch, n);
    CUDA_LAUNCHED();
    for (uint32_t h0 = 0; h0 < heads; h0 += batch) {
        uint32_t hb = heads - h0 < batch ? heads - h0 : batch;
        CUDA_TRY(cub::DeviceSegmentedRadixSort::SortPairs(
            ws->buf[CWS_CUB], bytes, keys + (size_t)h0 * n, keys2, vals + (size_t)h0 * n, vals2,
            (int)((uint64_t)hb * n), (int)hb, offsets, offsets + 1, 0, 32, stream));
        /* Grid (ceil(m / 256), hb). */
        take_kernel<<<dim3(blocks_for(m, 256), hb), 256, 0, stream>>>(vals2, n, m, h0, out,
                                                                      out_stride, out_off);
        CUDA_LAUNCHED();
    }
    return 0;
}
