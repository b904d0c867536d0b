/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The host side of CUDA that vased's CUDA arena (daemon/core/arena_cuda.c) and libvase's
 * (lib/cuda.c) share: finding the device an arena names and checking that processes may share
 * it, and the driver's VMM entry points, looked up through the runtime. Only those two CUDA
 * variants include this header, so it may name CUDA types; vase_kernels.h does not. Nothing is
 * logged: a failure comes back as -errno with what the caller needs for its own message.
 */

#include <cuda.h>
#include <stdbool.h>
#include <stddef.h>

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" and a NUL, with room to spare. */
#define VASE_CUDA_UUID_MAX 48

/* What a failed call of this module met, for the caller's message. */
struct vase_cuda_failure {
    const char *call; /* the runtime call that failed ("cudaGetDeviceProperties()"), or the
                       * driver entry point not found ("cuMemMap"); NULL if neither */
    int cuda_error;   /* the runtime call's cudaError_t; 0 for an entry point the driver lacks */
    bool too_old;     /* an entry point the driver lacks because it is older than asked for */
    /* When cudaGetDeviceCount() failed and the driver's library (VASE_CUDA_DRIVER_LIB) cannot be
     * loaded at all: why not, as dlerror() says it (bounded); else empty. */
    char driver_missing[192];
};

/* The NVIDIA driver's CUDA library, which the runtime (linked statically) loads at its first
 * call, and what to install where it is missing. */
#define VASE_CUDA_DRIVER_LIB "libcuda.so.1"
#define VASE_CUDA_DRIVER_HINT                                                                      \
    "a CUDA arena needs the NVIDIA driver: install it (Debian: nvidia-driver, from non-free, "     \
    "which brings libcuda1), or use a host arena, which needs no CUDA library"

/* A device found by vase_cuda_device_find(), as far as the search got. */
struct vase_cuda_device {
    int count;                     /* devices the runtime sees; 0 if none, or it failed */
    int ordinal;                   /* the device found (or whose query failed), else -1 */
    char uuid[VASE_CUDA_UUID_MAX]; /* its UUID, as nvidia-smi -L prints it (lower case) */
    int compute_mode;              /* its cudaComputeMode */
};

/*
 * Finds the device that ordinal (>= 0) names, or else the one whose UUID is uuid (any case),
 * among those the runtime sees, and checks that its compute mode lets several processes use it
 * (vased and the engines share it). Does not make it current. Fills *ret as far as it got and
 * *why on a failed runtime call. Returns 0, or:
 *   -ENODEV  the runtime sees no device (ret->count 0; why->call set if cudaGetDeviceCount()
 *            failed, and why->driver_missing if the driver's library cannot be loaded), or none
 *            that matches (ret->count > 0, ret->ordinal -1, why->call NULL);
 *   -EBUSY   the device's compute mode is Prohibited or an exclusive one (ret->compute_mode);
 *   -errno   of vase_cuda_errno() for another failed runtime call (why->call, why->cuda_error).
 */
int vase_cuda_device_find(int ordinal, const char *uuid, struct vase_cuda_device *ret,
                          struct vase_cuda_failure *why);

/* The driver's virtual memory management entry points (error_string may be NULL). */
struct vase_cuda_vmm {
    CUresult (*get_granularity)(size_t *, const CUmemAllocationProp *,
                                CUmemAllocationGranularity_flags);
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                       unsigned long long);
    CUresult (*release)(CUmemGenericAllocationHandle);
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*address_free)(CUdeviceptr, size_t);
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*unmap)(CUdeviceptr, size_t);
    CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*export_handle)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
                              unsigned long long);
    CUresult (*import)(CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType);
    CUresult (*error_string)(CUresult, const char **);
};

/*
 * Looks up every entry point of *v through the runtime (the driver library is never linked, so a
 * process without a driver still loads), the ABI of CUDA 12, in the order of the struct. The
 * runtime must be initialised on the device first. Returns 0; -ENODEV (or the -errno of the
 * runtime's error, when that is more specific than -EIO) when the runtime cannot reach the
 * driver (why->call the symbol, why->cuda_error); -EOPNOTSUPP when the driver lacks one
 * (why->call the symbol, why->too_old). Only error_string may be missing (then NULL).
 */
int vase_cuda_vmm_resolve(struct vase_cuda_vmm *v, struct vase_cuda_failure *why);
