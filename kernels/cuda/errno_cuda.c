/* SPDX-License-Identifier: MIT */

/*
 * CUDA failures as -errno, the one mapping of the tree: the kernels (through vase__cuda_errno()
 * of internal_cuda.cuh), vased's CUDA arena and libvase's map runtime and driver errors here.
 * Pure functions of the error code: they call nothing in the runtime, so that the unit tests of
 * the arena backends link them against their fake runtime. Compiled against the toolkit's
 * headers (for the codes' names) into libvasekernels_cuda.a; vase_kernels.h declares them with
 * int arguments, since it names no CUDA type.
 *
 * What each errno means to a caller: -ENOMEM out of device memory, -EINVAL an invalid argument,
 * -ENODEV no usable device or driver (none, not visible, not initialised, too old, mismatched),
 * -EBUSY the device is not available to this process (compute mode), -EOPNOTSUPP not supported
 * by this device or driver, -EIO anything else (a failed kernel, a lost context).
 */

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <errno.h>

#include "vase_kernels.h"

int vase_cuda_errno(int cuda_error) {
    switch ((cudaError_t)cuda_error) {
    case cudaSuccess:
        return 0;
    case cudaErrorMemoryAllocation:
        return -ENOMEM;
    case cudaErrorInvalidValue:
        return -EINVAL;
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInitializationError:
    case cudaErrorCallRequiresNewerDriver:
    case cudaErrorSystemDriverMismatch:
        return -ENODEV;
    case cudaErrorDevicesUnavailable:
        return -EBUSY;
    case cudaErrorNotSupported:
        return -EOPNOTSUPP;
    default:
        return -EIO;
    }
}

int vase_cu_errno(int cu_result) {
    switch ((CUresult)cu_result) {
    case CUDA_SUCCESS:
        return 0;
    case CUDA_ERROR_OUT_OF_MEMORY:
        return -ENOMEM;
    case CUDA_ERROR_INVALID_VALUE:
        return -EINVAL;
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_INVALID_DEVICE:
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED:
        return -ENODEV;
    case CUDA_ERROR_NOT_SUPPORTED:
        return -EOPNOTSUPP;
    default:
        return -EIO;
    }
}

/*
 * The runtime's documentation says of each of these that it "leaves the process in an
 * inconsistent state and any further CUDA work will return the same error. To continue using
 * CUDA, the process must be terminated and relaunched." An uncorrectable ECC error is not
 * described so, but the memory it was found in can no longer be trusted either. The codes added
 * in later toolkits are matched by value, so that older toolkits still compile this file.
 */
int vase_cuda_sticky(int cuda_error) {
    switch (cuda_error) {
    case cudaErrorECCUncorrectable:
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case 226: /* cudaErrorContained */
    case 721: /* cudaErrorTensorMemoryLeak */
    case 810: /* cudaErrorMpsClientTerminated */
    case 911: /* cudaErrorExternalDevice */
        return 1;
    default:
        return 0;
    }
}
