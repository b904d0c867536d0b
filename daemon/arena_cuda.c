/* SPDX-License-Identifier: MIT */

/*
 * The CUDA backends: an arena in the memory of one GPU, shared in one of two ways
 * (ARCHITECTURE.md "Memory", LESSONS.md "Memory that other processes have mapped"):
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
 * with libvase, kernels/device_cuda.c), so a daemon without a driver still starts on the host
 * arena, and one configured for a GPU it cannot use fails with a message that says why.
 *
 * Memory is freed only by destroy(), which vased calls at exit after every session is gone: a
 * client that dies (its driver mappings go with its process) never pins or frees anything.
 *
 * The planner runs on an evictor thread: its own stream and device workspace on the arena's
 * device, device copies of a job's block table, ring pages, statistics and draws, plans into
 * device scratch by vase_plan_cuda(), then device-to-device copies into the plan pages and a
 * copy back for the main thread (h2o's commit reads it), and a stream synchronisation, so the
 * plan is complete before the job is posted back. CUDA failures become -errno here, with the
 * runtime's message logged once.
 */

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "arena.h"
#include "device_cuda.h"
#include "evictor.h"
#include "log.h"
#include "vase_kernels.h"

/* Alignment of the regions of the planner's device scratch. */
#define SCRATCH_ALIGN 256

const bool vase_arena_have_cuda = true;

/* ---- errors ------------------------------------------------------------------------------ */

/* Logs a failed runtime call of arena a and returns its -errno. */
static int log_rt(const struct vase_arena *a, cudaError_t e, const char *what) {
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

/* ---- the planner --------------------------------------------------------------------------- */

struct vase_arena_planner {
    const struct vase_arena *arena;
    cudaStream_t stream;
    bool stream_made;
    struct vase_cuda_workspace *ws;
    char *scratch; /* device */
    size_t scratch_bytes;
};

static void cuda_planner_free(struct vase_arena_planner *p) {
    if (!p)
        return;
    /* Made on this thread's current device, which the planner keeps set. */
    (void)cudaSetDevice(p->arena->device);
    if (p->scratch)
        (void)cudaFree(p->scratch);
    vase_cuda_workspace_free(p->ws);
    if (p->stream_made)
        (void)cudaStreamDestroy(p->stream);
    free(p);
}

static int cuda_planner_new(const struct vase_arena *a, struct vase_arena_planner **ret) {
    cudaError_t e;
    int r;

    struct vase_arena_planner *p = calloc(1, sizeof(*p));
    if (!p)
        return log_oom();
    p->arena = a;
    e = cudaSetDevice(a->device);
    if (e != cudaSuccess) {
        r = log_rt(a, e, "cudaSetDevice() on an evictor thread");
        goto free_planner;
    }
    e = cudaStreamCreateWithFlags(&p->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        r = log_rt(a, e, "cudaStreamCreateWithFlags()");
        goto free_planner;
    }
    p->stream_made = true;
    r = vase_cuda_workspace_new(&p->ws);
    if (r < 0) {
        const char *m = vase_cuda_last_error();
        r = log_error_errno(r, "Arena \"%s\": cannot make a device workspace: %s", a->kind,
                            m ? m : strerror(-r));
        goto free_planner;
    }
    *ret = p;
    return 0;

free_planner:
    cuda_planner_free(p);
    return r;
}

static size_t align_up(size_t n) {
    return (n + SCRATCH_ALIGN - 1) / SCRATCH_ALIGN * SCRATCH_ALIGN;
}

/* Grows the device scratch to at least bytes (its old contents are not kept). */
static int reserve_scratch(struct vase_arena_planner *p, size_t bytes) {
    if (bytes <= p->scratch_bytes)
        return 0;
    if (p->scratch)
        (void)cudaFree(p->scratch);
    p->scratch = NULL;
    p->scratch_bytes = 0;
    void *s = NULL;
    cudaError_t e = cudaMalloc(&s, bytes);
    if (e != cudaSuccess)
        return log_rt(p->arena, e, "cudaMalloc() of plan scratch");
    p->scratch = s;
    p->scratch_bytes = bytes;
    return 0;
}

/* The regions of one job's device scratch (byte offsets; SIZE_MAX: absent). */
struct job_layout {
    size_t pages, ring, acc, scores, exp, gauss, keep, total;
    size_t n_ring;
};

static size_t take(struct job_layout *jl, size_t bytes) {
    size_t at = jl->total;
    jl->total += align_up(bytes ? bytes : 1);
    return at;
}

static void layout_job(const struct vase_plan_run *run, uint32_t nl, struct job_layout *jl) {
    size_t per_layer = (size_t)run->kv_heads * run->n * sizeof(float);

    *jl = (struct job_layout){
        .ring = SIZE_MAX, .acc = SIZE_MAX, .scores = SIZE_MAX, .exp = SIZE_MAX, .gauss = SIZE_MAX};
    jl->pages = take(jl, (size_t)run->n_pages * sizeof(uint32_t));
    if (run->ring_pages && run->layout.ring_rows_per_page) {
        jl->n_ring = (2 * (size_t)run->params.window + run->layout.ring_rows_per_page - 1) /
                     run->layout.ring_rows_per_page;
        jl->ring = take(jl, jl->n_ring * sizeof(uint32_t));
    }
    if (run->acc)
        jl->acc = take(jl, nl * per_layer);
    if (run->scores)
        jl->scores = take(jl, nl * per_layer);
    if (run->exp_draws)
        jl->exp = take(jl, nl * per_layer);
    if (run->gauss)
        jl->gauss = take(jl, (size_t)run->head_dim * run->params.rank * sizeof(float));
    jl->keep = take(jl, (size_t)nl * run->kv_heads * run->keep * sizeof(uint32_t));
}

static int h2d(struct vase_arena_planner *p, size_t at, const void *src, size_t bytes) {
    cudaError_t e = cudaMemcpyAsync(p->scratch + at, src, bytes, cudaMemcpyHostToDevice, p->stream);
    return e == cudaSuccess ? 0 : log_rt(p->arena, e, "copying plan inputs to the device");
}

static int cuda_plan_layers(struct vase_arena_planner *p, struct vase_plan_run *run, uint32_t l0,
                            uint32_t l1, uint32_t *ret_bad_layer) {
    const struct vase_arena *a = p->arena;
    uint32_t nl = l1 - l0, H = run->kv_heads, K = run->keep;
    size_t per_layer = (size_t)H * run->n;
    struct job_layout jl;
    cudaError_t e;
    int r;

    *ret_bad_layer = l0;
    if (l1 <= l0)
        return 0;
    e = cudaSetDevice(a->device);
    if (e != cudaSuccess)
        return log_rt(a, e, "cudaSetDevice()");
    layout_job(run, nl, &jl);
    r = reserve_scratch(p, jl.total);
    if (r < 0)
        return r;

    /* The job's inputs, on the stream the plans run on (so ordered before them). */
    if ((r = h2d(p, jl.pages, run->pages, (size_t)run->n_pages * sizeof(uint32_t))) < 0)
        return r;
    if (jl.ring != SIZE_MAX &&
        (r = h2d(p, jl.ring, run->ring_pages, jl.n_ring * sizeof(uint32_t))) < 0)
        return r;
    if (jl.acc != SIZE_MAX &&
        (r = h2d(p, jl.acc, run->acc + l0 * per_layer, nl * per_layer * sizeof(float))) < 0)
        return r;
    for (uint32_t l = l0; jl.scores != SIZE_MAX && l < l1; l++)
        if (run->scores[l] && (r = h2d(p, jl.scores + (l - l0) * per_layer * sizeof(float),
                                       run->scores[l], per_layer * sizeof(float))) < 0)
            return r;
    if (jl.exp != SIZE_MAX &&
        (r = h2d(p, jl.exp, run->exp_draws + l0 * per_layer, nl * per_layer * sizeof(float))) < 0)
        return r;
    if (jl.gauss != SIZE_MAX &&
        (r = h2d(p, jl.gauss, run->gauss,
                 (size_t)run->head_dim * run->params.rank * sizeof(float))) < 0)
        return r;

    uint32_t *d_pages = (uint32_t *)(p->scratch + jl.pages);
    uint32_t *d_keep = (uint32_t *)(p->scratch + jl.keep);
    for (uint32_t l = l0; l < l1; l++) {
        struct vase_plan_input in;
        size_t off = (size_t)(l - l0) * per_layer * sizeof(float);

        vase_plan_run_input(run, l, &in);
        in.k.pages = d_pages;
        in.v.pages = d_pages;
        if (jl.ring != SIZE_MAX)
            in.q.pages = (uint32_t *)(p->scratch + jl.ring);
        if (jl.acc != SIZE_MAX)
            in.acc = (const float *)(p->scratch + jl.acc + off);
        if (jl.scores != SIZE_MAX)
            in.scores = run->scores[l] ? (const float *)(p->scratch + jl.scores + off) : NULL;
        if (jl.exp != SIZE_MAX)
            in.exp_draws = (const float *)(p->scratch + jl.exp + off);
        if (jl.gauss != SIZE_MAX)
            in.gauss = (const float *)(p->scratch + jl.gauss);
        r = vase_plan_cuda(&in, p->ws, p->stream, d_keep + (size_t)(l - l0) * H * K);
        if (r < 0) {
            *ret_bad_layer = l;
            /* Bad data (NaN, Inf) is the engine's, reported to it; anything else is ours. */
            if (r != -EINVAL) {
                const char *m = vase_cuda_last_error();
                log_error_errno(r, "Arena \"%s\": planning layer %u of sequence %u on %s: %s",
                                a->kind, l, run->seq_id, a->device_uuid, m ? m : strerror(-r));
            }
            return r;
        }
    }

    /* Every layer of the range is planned: publish the keep lists in the plan pages
     * (device to device), and hand the main thread its copy. */
    size_t list = (size_t)K * sizeof(uint32_t);
    for (uint32_t l = l0; l < l1; l++)
        for (uint32_t h = 0; h < H; h++) {
            uint32_t i = l * H + h;
            e = cudaMemcpyAsync((char *)run->arena_base + vase_plan_run_list_offset(run, i),
                                d_keep + ((size_t)(l - l0) * H + h) * K, list,
                                cudaMemcpyDeviceToDevice, p->stream);
            if (e != cudaSuccess)
                return log_rt(a, e, "writing plan pages");
        }
    e = cudaMemcpyAsync(run->keep_lists + (size_t)l0 * H * K, d_keep, (size_t)nl * H * list,
                        cudaMemcpyDeviceToHost, p->stream);
    if (e != cudaSuccess)
        return log_rt(a, e, "copying plans to the host");
    /* The reply goes out when the job is posted back: the plan must be complete by then. */
    e = cudaStreamSynchronize(p->stream);
    if (e != cudaSuccess)
        return log_rt(a, e, "cudaStreamSynchronize() after a plan");
    return 0;
}

const struct vase_arena_ops vase_arena_cuda_ipc_ops = {
    .share = "cuda-ipc",
    .create = ipc_create,
    .export_fd = no_export_fd,
    .destroy = ipc_destroy,
    .planner_new = cuda_planner_new,
    .planner_free = cuda_planner_free,
    .plan_layers = cuda_plan_layers,
};

const struct vase_arena_ops vase_arena_cuda_vmm_ops = {
    .share = "cuda-vmm",
    .create = vmm_create,
    .export_fd = vmm_export_fd,
    .destroy = vmm_destroy,
    .planner_new = cuda_planner_new,
    .planner_free = cuda_planner_free,
    .plan_layers = cuda_plan_layers,
};
