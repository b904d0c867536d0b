/* SPDX-License-Identifier: MIT */

/*
 * The kernels' side of the CUDA runtime: how every .cu file reports a runtime failure
 * (vase__cuda_errno(): the mapping of errno_cuda.c, and the message kept per thread for
 * vase_cuda_last_error()), and vase_cuda_available(). Its own file so that what links only the
 * compaction (libvase) takes this and errno_cuda.c, not the planner and its workspace.
 */

#include "internal_cuda.cuh"

static thread_local const char *last_error;

int vase__cuda_errno(cudaError_t e) {
    if (e == cudaSuccess)
        return 0;
    last_error = cudaGetErrorString(e);
    (void)cudaGetLastError(); /* a non-sticky error must not surface again at the next check */
    return vase_cuda_errno((int)e);
}

extern "C" const char *vase_cuda_last_error(void) {
    return last_error;
}

extern "C" int vase_cuda_available(void) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) {
        vase__cuda_errno(e);
        return 0;
    }
    if (e != cudaSuccess)
        return vase__cuda_errno(e);
    return count > 0;
}
