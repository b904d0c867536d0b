/* SPDX-License-Identifier: MIT */

/*
 * The CUDA backends: an arena in the memory of one GPU, shared in one of two ways
 * (docs/ARCHITECTURE.md, "Memory" and "Memory that other processes have mapped"):
 *
 *   cuda-ipc  one plain cudaMalloc() allocation, exported by a legacy CUDA IPC handle of its
 *             base (clients add offsets). Plain, because legacy handles fail, sometimes
 *             silently, on memory from pools, VMM or managed allocations.
 *   cuda-vmm  one cuMemCreate() allocation with a POSIX file descriptor handle, its size
 *             rounded up to the allocation granularity, reserved, mapped and made accessible
 *             for the daemon itself; the fd goes to clients over the session socket with
 *             SCM_RIGHTS.
 *
 * The device is named by ordinal or by UUID, and always reported by UUID, since containers
 * renumber devices. Its compute mode must let several processes use it (engines and the daemon
 * share it). The driver API (cuMem*) is never linked: its entry points come from the runtime
 * (cudaGetDriverEntryPointByVersion; the lookups of the device and the entry points are shared
 * with libvase, kernels/cuda/device_cuda.c), so a daemon without a driver still starts on the host
 * arena, and one configured for a GPU it cannot use fails with a message that says why.
 *
 * Memory is freed only by destroy(), which vased calls at exit after every session is gone: a
 * client that dies (its driver mappings go with its process) never pins or frees anything.
 *
 * This file is memory only: plans over a CUDA arena are computed by the CUDA planner
 * (planner_cuda.c), which the evictor chooses for any arena on a device. CUDA failures become
 * -errno here, with the runtime's message logged once.
 */

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "arena.h"
#include "cuda/device_cuda.h"
#include "log.h"
#include "vase_kernels.h"

const bool vase_arena_have_cuda = true;

/* ---- errors ------------------------------------------------------------------------------ */

/* Logs a failed runtime call of arena a and returns its -errno; -ENOTRECOVERABLE for a sticky
 * error (vase_cuda_sticky(): this process's context on the device is lost). */
static int log_rt(const struct vase_arena *a, cudaError_t e, const char *what) {
    if (vase_cuda_sticky(e))
        return log_error_errno(-ENOTRECOVERABLE,
                               "Arena \"%s\": %s failed: %s (%s), a sticky error: the CUDA "
                               "context of vased is lost.",
                               a->kind, what, cudaGetErrorString(e), cudaGetErrorName(e));
    return log_error_errno(vase_cuda_errno(e), "Arena \"%s\": %s failed: %s (%s).", a->kind, what,
                           cudaGetErrorString(e), cudaGetErrorName(e));
}

/* ---- the device ---------------------------------------------------------------------------- */

/*
 * Finds the device a->kind names (a->device set: the ordinal; else a->device_uuid), checks its
 * compute mode and makes it current; fills a->device and a->device_uuid.
 */
static int open_device(struct vase_arena *a) {
    struct vase_cuda_failure why;
    struct vase_cuda_device d;
    cudaError_t e;

    _Static_assert(sizeof(d.uuid) == sizeof(a->device_uuid), "UUID size");
    int r = vase_cuda_device_find(a->device, a->device_uuid, &d, &why);
    if (r < 0 && d.count == 0 && why.driver_missing[0])
        return log_error_errno(-ENODEV,
                               "Arena \"%s\": no usable CUDA device on this machine: the NVIDIA "
                               "driver's library " VASE_CUDA_DRIVER_LIB " cannot be loaded (%s); "
                               "" VASE_CUDA_DRIVER_HINT ".",
                               a->kind, why.driver_missing);
    if (r < 0 && d.count == 0)
        return log_error_errno(
            -ENODEV,
            "Arena \"%s\": no usable CUDA device on this machine: %s (is a "
            "GPU visible, and the NVIDIA driver loaded?).",
            a->kind, why.call ? cudaGetErrorString(why.cuda_error) : "the runtime sees none");
    if (r < 0 && why.call)
        return log_rt(a, why.cuda_error, why.call);
    if (r < 0 && d.ordinal < 0 && a->device >= 0)
        return log_error_errno(-ENODEV, "Arena \"%s\": no CUDA device %d (this machine has %d).",
                               a->kind, a->device, d.count);
    if (r < 0 && d.ordinal < 0)
        return log_error_errno(-ENODEV,
                               "Arena \"%s\": no CUDA device with UUID %s among the %d visible "
                               "here (nvidia-smi -L lists them).",
                               a->kind, a->device_uuid, d.count);
    if (r < 0 && d.compute_mode == cudaComputeModeProhibited)
        return log_error_errno(-EBUSY,
                               "Arena \"%s\": device %s is in compute mode Prohibited: no process "
                               "may use it (nvidia-smi -c DEFAULT allows it).",
                               a->kind, d.uuid);
    if (r < 0)
        return log_error_errno(-EBUSY,
                               "Arena \"%s\": device %s is in an exclusive compute mode, but vased "
                               "and every engine must share it (nvidia-smi -c DEFAULT).",
                               a->kind, d.uuid);
    e = cudaSetDevice(d.ordinal);
    if (e != cudaSuccess)
        return log_rt(a, e, "cudaSetDevice()");
    a->device = d.ordinal;
    memcpy(a->device_uuid, d.uuid, sizeof(d.uuid));
    return 0;
}

/* Zeroes the new arena, as a memfd would be, and waits for it. */
static int zero_arena(struct vase_arena *a) {
    cudaError_t e = cudaMemset(a->map, 0, (size_t)a->size);
    if (e == cudaSuccess)
        e = cudaDeviceSynchronize();
    return e == cudaSuccess ? 0 : log_rt(a, e, "clearing the arena");
}

/* Zeroes a released range and waits for it: the pages may go to another engine's sequence as
 * soon as this returns. */
static int cuda_clear(struct vase_arena *a, uint64_t off, uint64_t len) {
    cudaError_t e = cudaMemset((char *)a->map + off, 0, (size_t)len);
    if (e == cudaSuccess)
        e = cudaDeviceSynchronize();
    return e == cudaSuccess ? 0 : log_rt(a, e, "clearing released pages");
}

/* ---- cuda-ipc ------------------------------------------------------------------------------ */

static int ipc_create(struct vase_arena *a) {
    cudaIpcMemHandle_t h;
    void *p = NULL;
    cudaError_t e;
    int r;

    r = open_device(a);
    if (r < 0)
        return r;
    e = cudaMalloc(&p, (size_t)a->size);
    if (e != cudaSuccess)
        return log_error_errno(vase_cuda_errno(e),
                               "Arena \"%s\": cannot allocate %llu bytes on %s: %s.", a->kind,
                               (unsigned long long)a->size, a->device_uuid, cudaGetErrorString(e));
    a->map = p;
    r = zero_arena(a);
    if (r < 0)
        return r; /* destroy() frees map */
    e = cudaIpcGetMemHandle(&h, p);
    if (e != cudaSuccess)
        return log_rt(a, e, "cudaIpcGetMemHandle()");
    _Static_assert(sizeof(h) <= VASE_ARENA_IPC_HANDLE_MAX, "IPC handle size");
    memcpy(a->ipc_handle, &h, sizeof(h));
    a->ipc_handle_len = sizeof(h);
    return 0;
}

static int no_export_fd(const struct vase_arena *a, int *ret_fd) {
    (void)a;
    (void)ret_fd;
    return -EBADF; /* shared by handle: no fd rides on the welcome */
}

static void ipc_destroy(struct vase_arena *a) {
    if (!a->map)
        return;
    cudaError_t e = cudaSetDevice(a->device);
    if (e == cudaSuccess)
        e = cudaFree(a->map);
    if (e != cudaSuccess)
        log_rt(a, e, "freeing the arena");
    a->map = NULL;
}

/* ---- cuda-vmm ------------------------------------------------------------------------------ */

struct vmm {
    struct vase_cuda_vmm api;
    uint64_t map_bytes; /* a->size rounded up to the granularity */
    CUmemGenericAllocationHandle handle;
    CUdeviceptr va;
    bool created, reserved, mapped;
};

static int resolve_vmm(const struct vase_arena *a, struct vmm *v) {
    struct vase_cuda_failure why;
    int r = vase_cuda_vmm_resolve(&v->api, &why);
    if (r == -EOPNOTSUPP)
        return log_error_errno(r,
                               "Arena \"%s\": the CUDA driver does not provide %s (%s); "
                               "cuda_share=vmm needs a driver for CUDA 12 or later.",
                               a->kind, why.call,
                               why.too_old ? "version too old" : "symbol not found");
    if (r < 0)
        return log_error_errno(r, "Arena \"%s\": cannot reach the CUDA driver for %s: %s.", a->kind,
                               why.call, cudaGetErrorString(why.cuda_error));
    return 0;
}

static int log_drv(const struct vase_arena *a, const struct vmm *v, CUresult e, const char *what) {
    const char *msg = NULL;
    if (v->api.error_string && v->api.error_string(e, &msg) != CUDA_SUCCESS)
        msg = NULL;
    return log_error_errno(vase_cu_errno(e), "Arena \"%s\": %s failed: %s (CUresult %d).", a->kind,
                           what, msg ? msg : "no message", (int)e);
}

static int vmm_create(struct vase_arena *a) {
    CUmemAllocationProp prop = {
        .type = CU_MEM_ALLOCATION_TYPE_PINNED,
        .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
    };
    size_t gran = 0;
    CUresult e;
    int r, fd = -1;

    struct vmm *v = calloc(1, sizeof(*v));
    if (!v)
        return log_oom();
    a->backend = v;
    /* The device first: it initialises the runtime, and so the driver the entry points need. */
    r = open_device(a);
    if (r < 0)
        return r;
    r = resolve_vmm(a, v);
    if (r < 0)
        return r;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = a->device;

    e = v->api.get_granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (e != CUDA_SUCCESS)
        return log_drv(a, v, e, "cuMemGetAllocationGranularity()");
    if (gran == 0)
        return log_error_errno(-EIO, "Arena \"%s\": the driver reports granularity 0.", a->kind);
    /* Clients compute the same rounding from the same query on the same device. */
    v->map_bytes = (a->size + gran - 1) / gran * gran;

    e = v->api.create(&v->handle, (size_t)v->map_bytes, &prop, 0);
    if (e != CUDA_SUCCESS) {
        r = log_drv(a, v, e, "cuMemCreate()");
        return r;
    }
    v->created = true;
    e = v->api.reserve(&v->va, (size_t)v->map_bytes, gran, 0, 0);
    if (e != CUDA_SUCCESS)
        return log_drv(a, v, e, "cuMemAddressReserve()");
    v->reserved = true;
    e = v->api.map(v->va, (size_t)v->map_bytes, 0, v->handle, 0);
    if (e != CUDA_SUCCESS)
        return log_drv(a, v, e, "cuMemMap()");
    v->mapped = true;
    CUmemAccessDesc access = {
        .location = prop.location,
        .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    e = v->api.set_access(v->va, (size_t)v->map_bytes, &access, 1);
    if (e != CUDA_SUCCESS)
        return log_drv(a, v, e, "cuMemSetAccess()");
    a->map = (void *)(uintptr_t)v->va;
    r = zero_arena(a);
    if (r < 0)
        return r;

    e = v->api.export_handle(&fd, v->handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (e != CUDA_SUCCESS)
        return log_drv(a, v, e, "cuMemExportToShareableHandle()");
    if (fd < 0)
        return log_error_errno(-EIO, "Arena \"%s\": the driver exported fd %d.", a->kind, fd);
    a->fd = fd;
    /* The driver does not promise O_CLOEXEC; vase fds are never inherited. */
    if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0)
        return log_error_errno(-errno, "Arena \"%s\": cannot set FD_CLOEXEC: %m", a->kind);
    return 0;
}

static int vmm_export_fd(const struct vase_arena *a, int *ret_fd) {
    if (a->fd < 0)
        return -EBADF;
    *ret_fd = a->fd;
    return 0;
}

static void vmm_destroy(struct vase_arena *a) {
    struct vmm *v = a->backend;
    CUresult e;

    if (a->fd >= 0)
        close(a->fd);
    a->fd = -1;
    a->map = NULL;
    if (!v)
        return;
    if (v->mapped && (e = v->api.unmap(v->va, (size_t)v->map_bytes)) != CUDA_SUCCESS)
        log_drv(a, v, e, "cuMemUnmap()");
    if (v->reserved && (e = v->api.address_free(v->va, (size_t)v->map_bytes)) != CUDA_SUCCESS)
        log_drv(a, v, e, "cuMemAddressFree()");
    if (v->created && (e = v->api.release(v->handle)) != CUDA_SUCCESS)
        log_drv(a, v, e, "cuMemRelease()");
    free(v);
    a->backend = NULL;
}

const struct vase_arena_ops vase_arena_cuda_ipc_ops = {
    .share = "cuda-ipc",
    .create = ipc_create,
    .export_fd = no_export_fd,
    .destroy = ipc_destroy,
    .clear = cuda_clear,
    .on_device = true,
};

const struct vase_arena_ops vase_arena_cuda_vmm_ops = {
    .share = "cuda-vmm",
    .create = vmm_create,
    .export_fd = vmm_export_fd,
    .destroy = vmm_destroy,
    .clear = cuda_clear,
    .on_device = true,
};
