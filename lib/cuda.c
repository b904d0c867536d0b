/* SPDX-License-Identifier: MIT */

/*
 * libvase on a CUDA arena: the arena mapped into this process, the ordering the eviction cycle
 * needs on the engine's stream, and compaction by the CUDA kernel (vase.h, "Ordering").
 *
 * Mappings are process-wide: a legacy IPC handle can be opened only once per process, so two
 * clients of one daemon in one process share one mapping, reference-counted, in a cache keyed
 * by (arena id, daemon incarnation), never by address (docs/ARCHITECTURE.md, "Memory that other
 * processes have mapped"). The last reference unmaps
 * (cudaIpcCloseMemHandle, or cuMemUnmap + cuMemAddressFree) before the session socket closes,
 * so the daemon never sees a session end while this process still maps its memory; the daemon
 * frees the memory only at its exit. The cache and its mutex are the library's only process-wide
 * state, and exist because the CUDA handle rules are process-wide.
 *
 * The device is the one whose UUID the daemon reported (ordinals differ between processes and
 * containers), in a compute mode that lets processes share it. The driver API is not linked: the
 * VMM entry points come from the runtime (cudaGetDriverEntryPointByVersion); vased's CUDA arena
 * finds its device and these entry points the same way (kernels/cuda/device_cuda.c). So libvase
 * loads and works on host arenas on machines without a driver. Every call makes the arena's device
 * current and restores the caller's device before it returns; the mapping also creates the
 * device's primary context first, since the VMM calls of the driver need a current context and
 * nothing else in the process may have made one yet. Nothing is logged: failures are -errno,
 * with a sentence for vase_last_error() where the errno alone would not say enough.
 *
 * This code runs inside the engine's CUDA context, so it keeps out of the engine's way: a
 * runtime error pending when a call starts is the engine's and stays pending; only a failure of
 * libvase's own runtime calls is cleared, and only when nothing was pending (check()). Opening and
 * closing a sequence never synchronise the device: its device memory comes from a memory pool of
 * the mapping (stream-ordered allocation, freed on the sequence's stream), and only where the
 * device has no memory pools from cudaMalloc() and cudaFree(), which does synchronise.
 */

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_arena.h"
#include "cuda/device_cuda.h"
#include "vase_layout.h"
#include "session.h"
#include "vase_kernels.h"

/* ---- errors ------------------------------------------------------------------------------ */

static int say(char *msg, size_t msg_len, int r, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Writes the message of a failure r into msg; returns r. */
static int say(char *msg, size_t msg_len, int r, const char *fmt, ...) {
    va_list ap;
    if (msg && msg_len) {
        va_start(ap, fmt);
        vsnprintf(msg, msg_len, fmt, ap);
        va_end(ap);
    }
    return r;
}

/* ---- the current device ------------------------------------------------------------------- */

/* What a call found when it started: the caller's current device (for leave()) and the
 * runtime error already pending then, which is the engine's (check()). */
struct call {
    int prev;
    cudaError_t before;
};

/* A runtime call's result as -errno. A failure of libvase's own call is taken off the thread's
 * last error, so that the engine's next cudaGetLastError() does not take it for its own, but
 * only when no error was pending before the call: the runtime keeps one last error, so ours
 * replaced the engine's, and clearing it would hide from the engine that something failed. */
static int check(const struct call *c, cudaError_t e) {
    if (e != cudaSuccess && c->before == cudaSuccess && cudaPeekAtLastError() == e)
        (void)cudaGetLastError();
    return vase_cuda_errno(e);
}

/* Makes device current for a call. */
static int enter(int device, struct call *c) {
    int prev = -1;
    c->before = cudaPeekAtLastError();
    if (cudaGetDevice(&prev) != cudaSuccess)
        prev = -1;
    c->prev = prev;
    if (prev == device)
        return 0;
    return check(c, cudaSetDevice(device));
}

static void leave(int device, const struct call *c) {
    if (c->prev >= 0 && c->prev != device)
        (void)cudaSetDevice(c->prev);
}

/* ---- mappings ----------------------------------------------------------------------------- */

struct vase__cuda_mapping {
    struct vase__cuda_mapping *next;
    uint32_t arena_id;
    uint64_t incarnation;
    unsigned refs;
    int device;
    void *base;
    bool vmm;
    uint64_t map_bytes; /* vmm: the reserved and mapped range */
    CUresult (*unmap)(CUdeviceptr, size_t);
    CUresult (*address_free)(CUdeviceptr, size_t);
    /* The sequences' device memory: a pool that keeps what is freed for the next open (NULL
     * where the device has none), and a stream of libvase's own for the copies at an open. */
    cudaMemPool_t pool;
    cudaStream_t stream;
};

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static struct vase__cuda_mapping *cache; /* guarded by cache_lock */

/* The local device with the arena's UUID, in a compute mode that allows sharing. */
static int find_device(const struct vase__arena *a, int *ret, char *msg, size_t msg_len) {
    struct vase_cuda_failure why;
    struct vase_cuda_device d;

    int r = vase_cuda_device_find(-1, a->device_uuid, &d, &why);
    if (r < 0 && d.count == 0 && why.driver_missing[0])
        return say(msg, msg_len, -ENODEV,
                   "arena %u (%s) is on GPU %s, but the NVIDIA driver's library "
                   "" VASE_CUDA_DRIVER_LIB " cannot be loaded in this process (%s); "
                   "" VASE_CUDA_DRIVER_HINT,
                   a->id, a->kind, a->device_uuid, why.driver_missing);
    if (r < 0 && d.count == 0)
        return say(msg, msg_len, -ENODEV,
                   "arena %u (%s) is on GPU %s, but this process sees no CUDA device: %s", a->id,
                   a->kind, a->device_uuid,
                   why.call ? cudaGetErrorString(why.cuda_error) : "the runtime sees none");
    if (r < 0 && why.call)
        return say(msg, msg_len, r, "%s of device %d failed: %s", why.call, d.ordinal,
                   cudaGetErrorString(why.cuda_error));
    if (r < 0 && d.ordinal < 0)
        return say(msg, msg_len, -ENODEV,
                   "arena %u (%s) is on GPU %s, which is not among the %d CUDA devices this "
                   "process sees (CUDA_VISIBLE_DEVICES?)",
                   a->id, a->kind, a->device_uuid, d.count);
    if (r < 0)
        return say(msg, msg_len, -EBUSY,
                   "GPU %s is in compute mode %s, but the engines and vased must share it "
                   "(nvidia-smi -c DEFAULT)",
                   d.uuid,
                   d.compute_mode == cudaComputeModeProhibited ? "Prohibited" : "Exclusive");
    *ret = d.ordinal;
    return 0;
}

static int map_ipc(const struct vase__arena *a, struct vase__cuda_mapping *m, char *msg,
                   size_t msg_len) {
    cudaIpcMemHandle_t h;
    void *p = NULL;

    if (a->ipc_handle_len != sizeof(h))
        return say(msg, msg_len, -EPROTO, "arena %u: an IPC handle of %zu bytes", a->id,
                   a->ipc_handle_len);
    memcpy(&h, a->ipc_handle, sizeof(h));
    cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess)
        return say(msg, msg_len, vase_cuda_errno(e),
                   "cudaIpcOpenMemHandle() of arena %u failed: %s", a->id, cudaGetErrorString(e));
    m->base = p;
    return 0;
}

static int resolve_vmm(struct vase_cuda_vmm *v, char *msg, size_t msg_len) {
    struct vase_cuda_failure why;
    int r = vase_cuda_vmm_resolve(v, &why);
    if (r == -EOPNOTSUPP)
        return say(msg, msg_len, r,
                   "the CUDA driver does not provide %s, which a cuda-vmm arena needs", why.call);
    if (r < 0)
        return say(msg, msg_len, r, "cannot reach the CUDA driver for %s: %s", why.call,
                   cudaGetErrorString(why.cuda_error));
    return 0;
}

/* Imports the arena's fd, reserves a range, maps the allocation there and makes it readable
 * and writable by the device. The allocation handle is released once mapped: the mapping keeps
 * the memory, and unmapping is then all that is left to do. */
static int map_vmm(const struct vase__arena *a, int device, struct vase__cuda_mapping *m, char *msg,
                   size_t msg_len) {
    CUmemAllocationProp prop = {
        .type = CU_MEM_ALLOCATION_TYPE_PINNED,
        .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = device},
    };
    CUmemAccessDesc access = {.location = prop.location,
                              .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CUmemGenericAllocationHandle h;
    struct vase_cuda_vmm v;
    CUdeviceptr va = 0;
    size_t gran = 0;
    CUresult e;
    int r;

    if (a->fd < 0)
        return say(msg, msg_len, -EPROTO, "arena %u (cuda-vmm) came without its fd", a->id);
    r = resolve_vmm(&v, msg, msg_len);
    if (r < 0)
        return r;
    e = v.get_granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (e != CUDA_SUCCESS || gran == 0)
        return say(msg, msg_len, e != CUDA_SUCCESS ? vase_cu_errno(e) : -EIO,
                   "cuMemGetAllocationGranularity() failed (CUresult %d)", (int)e);
    /* The daemon rounded the allocation up the same way, on the same device. */
    m->map_bytes = (a->size_bytes + gran - 1) / gran * gran;

    e = v.import(&h, (void *)(uintptr_t)a->fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (e != CUDA_SUCCESS)
        return say(msg, msg_len, vase_cu_errno(e),
                   "cuMemImportFromShareableHandle() of arena %u failed (CUresult %d)", a->id,
                   (int)e);
    e = v.reserve(&va, (size_t)m->map_bytes, gran, 0, 0);
    if (e != CUDA_SUCCESS) {
        r = say(msg, msg_len, vase_cu_errno(e),
                "cuMemAddressReserve() of %llu bytes failed (CUresult %d)",
                (unsigned long long)m->map_bytes, (int)e);
        goto release;
    }
    e = v.map(va, (size_t)m->map_bytes, 0, h, 0);
    if (e != CUDA_SUCCESS) {
        r = say(msg, msg_len, vase_cu_errno(e), "cuMemMap() of arena %u failed (CUresult %d)",
                a->id, (int)e);
        goto free_range;
    }
    e = v.set_access(va, (size_t)m->map_bytes, &access, 1);
    if (e != CUDA_SUCCESS) {
        r = say(msg, msg_len, vase_cu_errno(e), "cuMemSetAccess() on arena %u failed (CUresult %d)",
                a->id, (int)e);
        goto unmap;
    }
    (void)v.release(h);
    m->base = (void *)(uintptr_t)va;
    m->vmm = true;
    m->unmap = v.unmap;
    m->address_free = v.address_free;
    return 0;

unmap:
    (void)v.unmap(va, (size_t)m->map_bytes);
free_range:
    (void)v.address_free(va, (size_t)m->map_bytes);
release:
    (void)v.release(h);
    return r;
}

/* Unmaps m on its device. Cache lock held. */
static void unmap_mapping(struct vase__cuda_mapping *m) {
    struct call c;
    if (enter(m->device, &c) < 0)
        c.prev = -1;
    /* A pool with memory still in use goes when the last of it is freed. */
    if (m->pool)
        (void)check(&c, cudaMemPoolDestroy(m->pool));
    if (m->stream)
        (void)check(&c, cudaStreamDestroy(m->stream));
    if (m->vmm) {
        (void)m->unmap((CUdeviceptr)(uintptr_t)m->base, (size_t)m->map_bytes);
        (void)m->address_free((CUdeviceptr)(uintptr_t)m->base, (size_t)m->map_bytes);
    } else
        (void)check(&c, cudaIpcCloseMemHandle(m->base));
    leave(m->device, &c);
}

/* Creates the device's primary context and makes it current: the driver's VMM calls need one,
 * and enter() does nothing when the device is already current, which it is (device 0) in a
 * process that has not touched CUDA yet. */
static int make_context(const struct vase__arena *a, int device, struct call *c, char *msg,
                        size_t msg_len) {
    cudaError_t e = cudaInitDevice(device, 0, 0);
    if (e == cudaSuccess)
        e = cudaSetDevice(device);
    if (e != cudaSuccess)
        return say(msg, msg_len, check(c, e), "cannot use GPU %s (device %d): %s", a->device_uuid,
                   device, cudaGetErrorString(e));
    return 0;
}

/* The pool and stream the mapping's sequences take their device memory from. A device without
 * memory pools, or whose pool cannot be made, has no pool (cudaMalloc then). */
static int make_pool(const struct vase__arena *a, struct vase__cuda_mapping *m,
                     const struct call *c, char *msg, size_t msg_len) {
    struct cudaMemPoolProps props = {
        .allocType = cudaMemAllocationTypePinned,
        .handleTypes = cudaMemHandleTypeNone,
        .location = {.type = cudaMemLocationTypeDevice, .id = m->device},
    };
    uint64_t keep_all = UINT64_MAX;
    int pools = 0;

    cudaError_t e = cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess &&
        cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, m->device) != cudaSuccess)
        pools = 0;
    if (e == cudaSuccess && pools) {
        /* Freed memory stays in the pool: the next open takes it without asking the driver. */
        cudaError_t p = cudaMemPoolCreate(&m->pool, &props);
        if (p == cudaSuccess)
            p = cudaMemPoolSetAttribute(m->pool, cudaMemPoolAttrReleaseThreshold, &keep_all);
        if (p != cudaSuccess) {
            (void)check(c, p);
            if (m->pool)
                (void)cudaMemPoolDestroy(m->pool);
            m->pool = NULL;
        }
    }
    if (e != cudaSuccess)
        return say(msg, msg_len, check(c, e),
                   "cannot make the memory pool for sequences on GPU %s: %s", a->device_uuid,
                   cudaGetErrorString(e));
    return 0;
}

int vase__cuda_map(struct vase__arena *a, uint64_t incarnation, char *msg, size_t msg_len) {
    struct vase__cuda_mapping *m;
    struct call c;
    int device = -1, r;

    if (!a || !vase__arena_on_device(a))
        return -EINVAL;
    if (a->mapping)
        return 0;
    bool vmm = strcmp(a->share, "cuda-vmm") == 0;
    if (!vmm && strcmp(a->share, "cuda-ipc") != 0)
        return say(msg, msg_len, -EOPNOTSUPP,
                   "arena %u is shared as \"%s\", which this libvase "
                   "cannot map",
                   a->id, a->share);

    pthread_mutex_lock(&cache_lock);
    for (m = cache; m; m = m->next)
        if (m->arena_id == a->id && m->incarnation == incarnation)
            break;
    if (m) {
        m->refs++;
        goto done;
    }

    r = find_device(a, &device, msg, msg_len);
    if (r < 0)
        goto unlock;
    m = calloc(1, sizeof(*m));
    if (!m) {
        r = -ENOMEM;
        goto unlock;
    }
    *m = (struct vase__cuda_mapping){
        .arena_id = a->id, .incarnation = incarnation, .refs = 1, .device = device};
    r = enter(device, &c);
    if (r < 0) {
        say(msg, msg_len, r, "cannot use GPU %s", a->device_uuid);
        goto free_mapping;
    }
    r = make_context(a, device, &c, msg, msg_len);
    if (r == 0)
        r = vmm ? map_vmm(a, device, m, msg, msg_len) : map_ipc(a, m, msg, msg_len);
    if (r == 0) {
        r = make_pool(a, m, &c, msg, msg_len);
        if (r < 0) {
            leave(device, &c);
            unmap_mapping(m); /* with its stream and pool, if made */
            goto free_mapping;
        }
    }
    leave(device, &c);
    if (r < 0)
        goto free_mapping;
    m->next = cache;
    cache = m;

done:
    /* The fd has done its work (or was not needed: the process maps the arena already). */
    if (a->fd >= 0) {
        close(a->fd);
        a->fd = -1;
    }
    a->mapping = m;
    a->map = m->base;
    a->device = m->device;
    pthread_mutex_unlock(&cache_lock);
    return 0;

free_mapping:
    free(m);
unlock:
    pthread_mutex_unlock(&cache_lock);
    return r;
}

void vase__cuda_unmap(struct vase__arena *a) {
    if (!a || !a->mapping)
        return;
    pthread_mutex_lock(&cache_lock);
    struct vase__cuda_mapping *m = a->mapping;
    if (--m->refs == 0) {
        for (struct vase__cuda_mapping **p = &cache; *p; p = &(*p)->next)
            if (*p == m) {
                *p = m->next;
                break;
            }
        unmap_mapping(m);
        free(m);
    }
    pthread_mutex_unlock(&cache_lock);
    a->mapping = NULL;
    a->map = NULL;
}

/* ---- streams and copies ------------------------------------------------------------------- */

int vase__cuda_sync(int device, void *stream) {
    struct call c;
    int r = enter(device, &c);
    if (r < 0)
        return r;
    r = check(&c, cudaStreamSynchronize((cudaStream_t)stream));
    leave(device, &c);
    return r;
}

int vase__cuda_copy(int device, void *stream, void *dst, const void *src, size_t n,
                    bool to_device) {
    struct call c;
    int r = enter(device, &c);
    if (r < 0)
        return r;
    /* On the engine's stream, so ordered with its own work; and complete on return. */
    cudaError_t e =
        cudaMemcpyAsync(dst, src, n, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                        (cudaStream_t)stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize((cudaStream_t)stream);
    r = check(&c, e);
    leave(device, &c);
    return r;
}

/* ---- sequences ---------------------------------------------------------------------------- */

struct vase__cuda_seq {
    int device;
    cudaStream_t stream; /* the sequence's (the engine's): its memory is freed on it */
    bool pooled;         /* mem is from the mapping's pool, else from cudaMalloc() */
    char *mem;           /* device: [pages][keep][scratch], each part 256-byte aligned */
    uint32_t *pages;     /* [max_pages] */
    size_t max_pages;
    uint32_t *keep; /* [keep_entries]: one layer's [heads][K] */
    size_t keep_entries;
    void *scratch; /* vase_compact_cuda()'s, for the largest move of one layer */
    size_t scratch_bytes;
    cudaEvent_t marks[VASE__CUDA_MARKS]; /* recorded by vase__cuda_seq_mark() */
};

static size_t align256(size_t x) {
    return (x + 255) & ~(size_t)255;
}

struct vase__cuda_seq *vase__cuda_seq_free(struct vase__cuda_seq *cs) {
    if (!cs)
        return NULL;
    struct call c;
    if (enter(cs->device, &c) == 0) {
        for (int i = 0; i < VASE__CUDA_MARKS; i++)
            if (cs->marks[i])
                (void)check(&c, cudaEventDestroy(cs->marks[i]));
        /* Freed in the order of the sequence's stream, after the work queued on it (the last
         * compaction included), without waiting. cudaFree() waits for the whole device. */
        if (cs->mem && cs->pooled)
            (void)check(&c, cudaFreeAsync(cs->mem, cs->stream));
        else if (cs->mem)
            (void)check(&c, cudaFree(cs->mem));
        leave(cs->device, &c);
    }
    free(cs);
    return NULL;
}

const uint32_t *vase__cuda_seq_table(const struct vase__cuda_seq *cs) {
    return cs ? cs->pages : NULL;
}

int vase__cuda_seq_set_table(struct vase__cuda_seq *cs, void *stream, const uint32_t *table,
                             size_t from, size_t n) {
    struct call c;
    if (!cs || n > cs->max_pages || from > n || (!table && n))
        return -EINVAL;
    if (from == n)
        return 0;
    int r = enter(cs->device, &c);
    if (r < 0)
        return r;
    /* From pageable memory the copy is staged before it returns: the table may change after. */
    r = check(&c, cudaMemcpyAsync(cs->pages + from, table + from, (n - from) * sizeof(uint32_t),
                                  cudaMemcpyHostToDevice, (cudaStream_t)stream));
    leave(cs->device, &c);
    return r;
}

void vase__cuda_seq_set_stream(struct vase__cuda_seq *cs, void *stream) {
    if (cs)
        cs->stream = (cudaStream_t)stream;
}

/* The device memory of a new sequence with the table copied in: from the mapping's pool on its
 * stream, waiting for that stream only, else cudaMalloc() and a synchronous copy. */
static cudaError_t seq_memory(struct vase__cuda_seq *cs, const struct vase__cuda_mapping *m,
                              size_t bytes, const uint32_t *table, size_t n_pages) {
    size_t table_bytes = n_pages * sizeof(uint32_t);
    cudaError_t e;

    if (m->pool) {
        e = cudaMallocFromPoolAsync((void **)&cs->mem, bytes, m->pool, m->stream);
        if (e != cudaSuccess)
            return e;
        cs->pooled = true;
        if (n_pages)
            e = cudaMemcpyAsync(cs->mem, table, table_bytes, cudaMemcpyHostToDevice, m->stream);
        if (e == cudaSuccess)
            e = cudaStreamSynchronize(m->stream);
        return e;
    }
    e = cudaMalloc((void **)&cs->mem, bytes);
    if (e == cudaSuccess && n_pages)
        e = cudaMemcpy(cs->mem, table, table_bytes, cudaMemcpyHostToDevice);
    return e;
}

int vase__cuda_seq_new(struct vase__cuda_mapping *m, const uint32_t *table, size_t n_pages,
                       size_t max_pages, size_t keep_entries, size_t scratch_bytes,
                       struct vase__cuda_seq **ret) {
    struct call c;
    int r;

    if (!m || !ret || (!table && n_pages) || keep_entries == 0 || scratch_bytes == 0 ||
        max_pages < n_pages)
        return -EINVAL;
    if (max_pages == 0)
        max_pages = 1;
    struct vase__cuda_seq *cs = calloc(1, sizeof(*cs));
    if (!cs)
        return -ENOMEM;
    *cs = (struct vase__cuda_seq){.device = m->device,
                                  .max_pages = max_pages,
                                  .keep_entries = keep_entries,
                                  .scratch_bytes = scratch_bytes};
    size_t keep_off = align256(max_pages * sizeof(uint32_t));
    size_t scratch_off = keep_off + align256(keep_entries * sizeof(uint32_t));
    r = enter(cs->device, &c);
    if (r < 0) {
        free(cs);
        return r;
    }
    cudaError_t e = cudaSuccess;
    for (int i = 0; i < VASE__CUDA_MARKS && e == cudaSuccess; i++)
        e = cudaEventCreateWithFlags(&cs->marks[i], cudaEventDisableTiming);
    if (e == cudaSuccess)
        e = seq_memory(cs, m, scratch_off + scratch_bytes, table, n_pages);
    r = check(&c, e);
    leave(cs->device, &c);
    if (r < 0) {
        vase__cuda_seq_free(cs);
        return r;
    }
    cs->pages = (uint32_t *)cs->mem;
    cs->keep = (uint32_t *)(cs->mem + keep_off);
    cs->scratch = cs->mem + scratch_off;
    *ret = cs;
    return 0;
}

int vase__cuda_seq_mark(struct vase__cuda_seq *cs, void *stream, enum vase__cuda_mark mark) {
    struct call c;
    int r = enter(cs->device, &c);
    if (r < 0)
        return r;
    r = check(&c, cudaEventRecord(cs->marks[mark], (cudaStream_t)stream));
    leave(cs->device, &c);
    return r;
}

int vase__cuda_seq_reached(struct vase__cuda_seq *cs, enum vase__cuda_mark mark, bool wait) {
    struct call c;
    int r = enter(cs->device, &c);
    if (r < 0)
        return r;
    cudaError_t e = wait ? cudaEventSynchronize(cs->marks[mark]) : cudaEventQuery(cs->marks[mark]);
    /* Not ready is no error: the runtime does not record it as one. */
    r = e == cudaErrorNotReady ? 0 : check(&c, e);
    leave(cs->device, &c);
    return r < 0 ? r : e == cudaSuccess;
}

/* ---- compaction --------------------------------------------------------------------------- */

/* Enqueues the copies of one layer's keep lists from the plan pages into cs->keep, merging
 * lists that are adjacent in one plan page. */
static cudaError_t copy_layer_lists(struct vase__cuda_seq *cs, cudaStream_t stream,
                                    const struct vase__cuda_compact *c, uint32_t layer) {
    const struct vase_layout *l = c->layout;
    size_t list = (size_t)c->keep * sizeof(uint32_t);

    for (uint32_t h = 0; h < l->kv_heads;) {
        uint32_t i = layer * l->kv_heads + h, run = 1;
        uint64_t off = vase_layout_plan_offset(c->plan, c->plan_pages, i);
        while (h + run < l->kv_heads &&
               vase_layout_plan_offset(c->plan, c->plan_pages, i + run) == off + run * list)
            run++;
        cudaError_t e =
            cudaMemcpyAsync((char *)cs->keep + (size_t)h * list, (const char *)c->arena_base + off,
                            run * list, cudaMemcpyDeviceToDevice, stream);
        if (e != cudaSuccess)
            return e;
        h += run;
    }
    return cudaSuccess;
}

int vase__cuda_compact(struct vase__cuda_seq *cs, void *stream, const struct vase__cuda_compact *c,
                       bool ordered) {
    const struct vase_layout *l = c->layout;
    cudaStream_t st = (cudaStream_t)stream;
    struct call cl;
    int r, new_len = -EPROTO;

    if (c->n_pages > cs->max_pages || (size_t)l->kv_heads * c->keep > cs->keep_entries)
        return -EPROTO;
    r = enter(cs->device, &cl);
    if (r < 0)
        return r;
    /* Stream order carries everything below: each layer's lists land after the previous
     * layer's kernels read theirs, and the scratch is reused the same way. The device block
     * table is the one copied at the open. */
    for (uint32_t layer = 0; layer < l->layers; layer++) {
        r = check(&cl, copy_layer_lists(cs, st, c, layer));
        if (r < 0)
            goto out;
        for (int kv = VASE_K; kv <= VASE_V; kv++) {
            struct vase_view v =
                vase_layout_kv_view(l, c->arena_base, cs->pages, layer, (enum vase_kv)kv);
            new_len = vase_compact_cuda(&v, cs->keep, c->keep, c->n, c->len, cs->scratch,
                                        cs->scratch_bytes, st);
            if (new_len < 0) {
                r = new_len == -EINVAL ? -EPROTO : new_len;
                goto out;
            }
        }
    }
    /* The commit may release pages the compaction reads: it must be done before. Stream
     * order: the mark tells when; host order: wait here. */
    if (ordered)
        r = check(&cl, cudaEventRecord(cs->marks[VASE__CUDA_COMPACTED], st));
    else
        r = check(&cl, cudaStreamSynchronize(st));
out:
    if (r < 0)
        (void)check(&cl, cudaStreamSynchronize(st)); /* nothing of ours runs after a failure */
    leave(cs->device, &cl);
    return r < 0 ? r : new_len;
}
