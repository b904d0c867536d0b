/* SPDX-License-Identifier: MIT */
/* cub::DeviceSegmentedRadixSort::SortPairs for tests/gpu/emu: a stable sort per segment (the real
 * one is documented stable), full 32-bit keys only. */
#pragma once
#include <algorithm>
#include <vector>
#include "cuda_runtime.h"
namespace cub {
struct DeviceSegmentedRadixSort {
    template <typename K, typename V, typename B, typename E>
    static cudaError_t SortPairs(void *temp, size_t &bytes, const K *kin, K *kout, const V *vin,
                                 V *vout, int num_items, int num_segments, B begin, E end,
                                 int begin_bit = 0, int end_bit = sizeof(K) * 8,
                                 cudaStream_t s = 0) {
        (void)s;
        (void)num_items;
        if (!temp) {
            bytes = 64;
            return cudaSuccess;
        }
        if (begin_bit != 0 || end_bit != 32)
            return cudaErrorInvalidValue;
        for (int g = 0; g < num_segments; g++) {
            int b = begin[g], e = end[g];
            std::vector<int> idx;
            for (int i = b; i < e; i++)
                idx.push_back(i);
            std::stable_sort(idx.begin(), idx.end(), [&](int x, int y) { return kin[x] < kin[y]; });
            for (int i = b; i < e; i++) {
                kout[i] = kin[idx[i - b]];
                vout[i] = vin[idx[i - b]];
            }
        }
        return cudaSuccess;
    }
};
} // namespace cub
