/* SPDX-License-Identifier: MIT */
/*
 * The driver API's result codes for tests/gpu/emu (see run.sh there): only the CUresult values
 * that kernels/cuda/errno_cuda.c maps, with the real header's numbers. Nothing of the driver
 * itself: neither the kernels nor the programs of tests/gpu/ call it.
 */
#pragma once
typedef enum cudaError_enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_DEINITIALIZED = 4,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_NOT_SUPPORTED = 801,
} CUresult;
