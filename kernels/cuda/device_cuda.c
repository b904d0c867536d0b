/* SPDX-License-Identifier: MIT */

/*
 * The device lookup and the driver entry points that vased's and libvase's CUDA arenas share
 * (device_cuda.h). Devices are matched by UUID, since ordinals differ between processes and
 * containers; a device is usable only in a compute mode that lets vased and the engines share
 * it. The driver API is reached through cudaGetDriverEntryPointByVersion(), never linked.
 * Logs nothing: the callers word the messages, each for its own reader.
 */

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "device_cuda.h"
#include "vase_kernels.h"

/* The driver ABI version asked for: cuMem* have had one ABI since CUDA 10.2, and any driver a
 * CUDA 12 or 13 runtime runs on provides it. */
#define DRIVER_API_VERSION 12000

static int failed(struct vase_cuda_failure *why, const char *call, cudaError_t e) {
    *why = (struct vase_cuda_failure){.call = call, .cuda_error = (int)e};
    return vase_cuda_errno((int)e);
}

/* Whether the runtime's failure is that the driver's library is not there at all: the static
 * runtime then says only that the driver is "insufficient". dlopen() with RTLD_NOLOAD first, so
 * that a library already loaded is not loaded twice; the probe's handle is closed again. */
static void probe_driver(struct vase_cuda_failure *why) {
    void *h = dlopen(VASE_CUDA_DRIVER_LIB, RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);

    if (!h)
        h = dlopen(VASE_CUDA_DRIVER_LIB, RTLD_LAZY | RTLD_LOCAL);
    if (h) {
        dlclose(h);
        return;
    }
    const char *e = dlerror();
    snprintf(why->driver_missing, sizeof(why->driver_missing), "%s",
             e ? e : VASE_CUDA_DRIVER_LIB ": cannot be loaded");
}

static void format_uuid(const cudaUUID_t *u, char out[VASE_CUDA_UUID_MAX]) {
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(out, VASE_CUDA_UUID_MAX,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
             b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
             b[15]);
}

int vase_cuda_device_find(int ordinal, const char *uuid, struct vase_cuda_device *ret,
                          struct vase_cuda_failure *why) {
    struct cudaDeviceProp prop;
    cudaError_t e;

    *ret = (struct vase_cuda_device){.ordinal = -1};
    *why = (struct vase_cuda_failure){0};
    e = cudaGetDeviceCount(&ret->count);
    if (e != cudaSuccess || ret->count <= 0) {
        ret->count = 0;
        if (e != cudaSuccess) {
            failed(why, "cudaGetDeviceCount()", e);
            probe_driver(why);
        }
        return -ENODEV;
    }
    for (int dev = 0; dev < ret->count; dev++) {
        e = cudaGetDeviceProperties(&prop, dev);
        if (e != cudaSuccess) {
            ret->ordinal = dev;
            return failed(why, "cudaGetDeviceProperties()", e);
        }
        format_uuid(&prop.uuid, ret->uuid);
        if (ordinal >= 0 ? dev == ordinal : strcasecmp(ret->uuid, uuid) == 0) {
            ret->ordinal = dev;
            break;
        }
    }
    if (ret->ordinal < 0) {
        ret->uuid[0] = '\0';
        return -ENODEV;
    }
    e = cudaDeviceGetAttribute(&ret->compute_mode, cudaDevAttrComputeMode, ret->ordinal);
    if (e != cudaSuccess)
        return failed(why, "cudaDeviceGetAttribute(compute mode)", e);
    if (ret->compute_mode == cudaComputeModeProhibited ||
        ret->compute_mode == cudaComputeModeExclusive ||
        ret->compute_mode == cudaComputeModeExclusiveProcess)
        return -EBUSY;
    return 0;
}

/* One entry point into *ret (NULL on failure). */
static int get_entry(const char *symbol, void **ret, struct vase_cuda_failure *why) {
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    void *fn = NULL;

    cudaError_t e =
        cudaGetDriverEntryPointByVersion(symbol, &fn, DRIVER_API_VERSION, cudaEnableDefault, &q);
    *ret = NULL;
    if (e == cudaSuccess && q == cudaDriverEntryPointSuccess && fn) {
        *ret = fn;
        return 0;
    }
    if (e != cudaSuccess) {
        int r = failed(why, symbol, e);
        return r == -EIO ? -ENODEV : r;
    }
    *why = (struct vase_cuda_failure){.call = symbol,
                                      .too_old = q == cudaDriverEntryPointVersionNotSufficent};
    return -EOPNOTSUPP;
}

int vase_cuda_vmm_resolve(struct vase_cuda_vmm *v, struct vase_cuda_failure *why) {
    const struct {
        const char *name;
        void **fn;
    } syms[] = {
        {"cuMemGetAllocationGranularity", (void **)&v->get_granularity},
        {"cuMemCreate", (void **)&v->create},
        {"cuMemRelease", (void **)&v->release},
        {"cuMemAddressReserve", (void **)&v->reserve},
        {"cuMemAddressFree", (void **)&v->address_free},
        {"cuMemMap", (void **)&v->map},
        {"cuMemUnmap", (void **)&v->unmap},
        {"cuMemSetAccess", (void **)&v->set_access},
        {"cuMemExportToShareableHandle", (void **)&v->export_handle},
        {"cuMemImportFromShareableHandle", (void **)&v->import},
    };
    struct vase_cuda_failure ignored;

    *why = (struct vase_cuda_failure){0};
    for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
        int r = get_entry(syms[i].name, syms[i].fn, why);
        if (r < 0)
            return r;
    }
    /* Only for messages: a driver without it is still usable. */
    (void)get_entry("cuGetErrorString", (void **)&v->error_string, &ignored);
    return 0;
}
