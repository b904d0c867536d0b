/* SPDX-License-Identifier: MIT */

/*
 * The fake CUDA of mock_cuda.h. Only what daemon/core/arena_cuda.c and lib/cuda.c call is here;
 * a call the fake lacks is a link error, not a silent success. Single-threaded bookkeeping,
 * except that the evictor's threads may call the stream, copy and kernel entry points at once:
 * every entry point takes one mutex.
 */

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mock_cuda.h"
#include "vase_kernels.h"

struct mock_cuda mock_cuda;

#define MAX_ALLOCS 128
#define MAX_HANDLES 128
#define MAX_MAPS 128
#define MAX_STREAMS 64
#define MAX_EVENTS 64
#define MAX_POOLS 8
#define IPC_MAGIC "vase-mock-ipc"

struct alloc {
    bool used;
    unsigned generation;
    int fd;
    size_t size;
    dev_t dev;
    ino_t ino;
    void *base; /* the cudaMalloc() mapping, while not freed */
    unsigned handles, maps;
};

struct handle {
    bool used;
    int alloc;
};

struct map {
    bool used;
    bool ipc;      /* an IPC open; else a cuMemMap() */
    bool reserved; /* a reservation (cuMemAddressReserve) rather than a mapping */
    void *addr;
    size_t size;
    int alloc;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct alloc allocs[MAX_ALLOCS];
static struct handle handles[MAX_HANDLES];
static struct map maps[MAX_MAPS];
static char streams[MAX_STREAMS];
static struct { bool used, recorded, complete; } events[MAX_EVENTS];
static bool pools[MAX_POOLS];
static unsigned next_generation = 1;

void mock_cuda_reset(void) {
    pthread_mutex_lock(&lock);
    mock_cuda = (struct mock_cuda){.device_count = 1, .granularity = 2u << 20};
    for (int i = 0; i < MAX_EVENTS; i++)
        events[i].complete = true;
    for (int i = 0; i < MOCK_CUDA_MAX_DEVICES; i++)
        for (int k = 0; k < 16; k++)
            mock_cuda.uuid[i][k] = (unsigned char)(0x10 * (i + 1) + k);
    pthread_mutex_unlock(&lock);
}

unsigned mock_cuda_live_allocations(void) {
    unsigned n = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_ALLOCS; i++)
        n += allocs[i].used;
    pthread_mutex_unlock(&lock);
    return n;
}

unsigned mock_cuda_live_mappings(void) {
    unsigned n = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_MAPS; i++)
        n += maps[i].used && !maps[i].reserved;
    pthread_mutex_unlock(&lock);
    return n;
}

void mock_cuda_complete_events(void) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_EVENTS; i++)
        events[i].complete = true;
    pthread_mutex_unlock(&lock);
}

unsigned mock_cuda_live_events(void) {
    unsigned n = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_EVENTS; i++)
        n += events[i].used;
    pthread_mutex_unlock(&lock);
    return n;
}

/* A failure as the runtime reports it: returned, and kept as the thread's last error. Lock
 * held. */
static cudaError_t fail(cudaError_t e) {
    mock_cuda.last_error = e;
    return e;
}

unsigned mock_cuda_ipc_open_count(void) {
    unsigned n = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_MAPS; i++)
        n += maps[i].used && maps[i].ipc;
    pthread_mutex_unlock(&lock);
    return n;
}

/* ---- memory (lock held) ---- */

static int new_alloc(size_t size) {
    for (int i = 0; i < MAX_ALLOCS; i++) {
        if (allocs[i].used)
            continue;
        struct stat st;
        int fd = memfd_create("mock-cuda", MFD_CLOEXEC);
        if (fd < 0)
            return -1;
        if (ftruncate(fd, (off_t)size) < 0 || fstat(fd, &st) < 0) {
            close(fd);
            return -1;
        }
        allocs[i] = (struct alloc){.used = true,
                                   .generation = next_generation++,
                                   .fd = fd,
                                   .size = size,
                                   .dev = st.st_dev,
                                   .ino = st.st_ino};
        return i;
    }
    return -1;
}

static void maybe_drop(int i) {
    struct alloc *a = &allocs[i];
    if (a->used && !a->base && a->handles == 0 && a->maps == 0) {
        close(a->fd);
        a->used = false;
    }
}

static int find_map(void *addr, bool reserved) {
    for (int i = 0; i < MAX_MAPS; i++)
        if (maps[i].used && maps[i].addr == addr && maps[i].reserved == reserved)
            return i;
    return -1;
}

static int new_map(void) {
    for (int i = 0; i < MAX_MAPS; i++)
        if (!maps[i].used)
            return i;
    return -1;
}

/* ---- runtime ---- */

const char *cudaGetErrorString(cudaError_t error) {
    switch (error) {
    case cudaSuccess:
        return "no error";
    case cudaErrorMemoryAllocation:
        return "out of memory (mock)";
    case cudaErrorNoDevice:
        return "no CUDA-capable device is detected (mock)";
    case cudaErrorInsufficientDriver:
        return "CUDA driver version is insufficient for CUDA runtime version (mock)";
    case cudaErrorInvalidValue:
        return "invalid argument (mock)";
    default:
        return "some CUDA failure (mock)";
    }
}

const char *cudaGetErrorName(cudaError_t error) {
    return error == cudaSuccess ? "cudaSuccess" : "cudaErrorMock";
}

/* ---- the driver's library, as vase_cuda_device_find() probes it ---- */

void *__real_dlopen(const char *file, int mode);
int __real_dlclose(void *handle);
void *__wrap_dlopen(const char *file, int mode);
int __wrap_dlclose(void *handle);

static char fake_driver;

void *__wrap_dlopen(const char *file, int mode) {
    if (!file || strcmp(file, "libcuda.so.1") != 0)
        return __real_dlopen(file, mode);
    pthread_mutex_lock(&lock);
    mock_cuda.driver_probes++;
    bool missing = mock_cuda.driver_missing;
    pthread_mutex_unlock(&lock);
    return missing ? NULL : &fake_driver;
}

int __wrap_dlclose(void *handle) {
    return handle == &fake_driver ? 0 : __real_dlclose(handle);
}

cudaError_t cudaGetDeviceCount(int *count) {
    pthread_mutex_lock(&lock);
    cudaError_t e = mock_cuda.count_error;
    if (e == cudaSuccess && mock_cuda.device_count == 0)
        e = cudaErrorNoDevice;
    *count = e == cudaSuccess ? mock_cuda.device_count : 0;
    pthread_mutex_unlock(&lock);
    return e;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
    if (device < 0 || device >= mock_cuda.device_count)
        return cudaErrorInvalidDevice;
    memset(prop, 0, sizeof(*prop));
    snprintf(prop->name, sizeof(prop->name), "Mock GPU %d", device);
    memcpy(prop->uuid.bytes, mock_cuda.uuid[device], 16);
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
    if (device < 0 || device >= mock_cuda.device_count)
        return cudaErrorInvalidDevice;
    if (attr == cudaDevAttrComputeMode)
        *value = mock_cuda.compute_mode[device];
    else if (attr == cudaDevAttrMemoryPoolsSupported)
        *value = !mock_cuda.no_pools;
    else
        return cudaErrorInvalidValue;
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
    pthread_mutex_lock(&lock);
    cudaError_t e = mock_cuda.last_error;
    mock_cuda.last_error = cudaSuccess;
    pthread_mutex_unlock(&lock);
    return e;
}

cudaError_t cudaPeekAtLastError(void) {
    return mock_cuda.last_error;
}

/* CUDA 12: makes the device current and creates its primary context. */
cudaError_t cudaSetDevice(int device) {
    pthread_mutex_lock(&lock);
    mock_cuda.set_device_calls++;
    cudaError_t e = cudaErrorInvalidDevice;
    if (device >= 0 && device < mock_cuda.device_count) {
        mock_cuda.current_device = device;
        mock_cuda.context[device] = true;
        e = cudaSuccess;
    }
    pthread_mutex_unlock(&lock);
    return e;
}

cudaError_t cudaInitDevice(int device, unsigned int deviceFlags, unsigned int flags) {
    if (device < 0 || device >= mock_cuda.device_count || deviceFlags || flags)
        return cudaErrorInvalidValue;
    pthread_mutex_lock(&lock);
    mock_cuda.context[device] = true;
    pthread_mutex_unlock(&lock);
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
    *device = mock_cuda.current_device;
    return cudaSuccess;
}

/* A new allocation mapped at *devPtr. Lock held. */
static cudaError_t alloc_mapped(void **devPtr, size_t size) {
    int i = size > 0 ? new_alloc(size) : -1;
    if (i < 0)
        return fail(cudaErrorMemoryAllocation);
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, allocs[i].fd, 0);
    if (p == MAP_FAILED) {
        maybe_drop(i);
        return fail(cudaErrorMemoryAllocation);
    }
    allocs[i].base = p;
    *devPtr = p;
    return cudaSuccess;
}

/* Unmaps and drops the allocation at devPtr. Lock held. */
static cudaError_t free_mapped(void *devPtr) {
    for (int i = 0; i < MAX_ALLOCS; i++)
        if (allocs[i].used && allocs[i].base == devPtr) {
            munmap(devPtr, allocs[i].size);
            allocs[i].base = NULL;
            maybe_drop(i);
            return cudaSuccess;
        }
    return fail(cudaErrorInvalidValue);
}

cudaError_t cudaMalloc(void **devPtr, size_t size) {
    pthread_mutex_lock(&lock);
    cudaError_t e =
        mock_cuda.fail_malloc ? fail(cudaErrorMemoryAllocation) : alloc_mapped(devPtr, size);
    if (e == cudaSuccess)
        mock_cuda.mallocs++;
    pthread_mutex_unlock(&lock);
    return e;
}

/* A real cudaFree() of a pointer synchronises the device; cudaFree(NULL) does nothing. */
cudaError_t cudaFree(void *devPtr) {
    if (!devPtr)
        return cudaSuccess;
    pthread_mutex_lock(&lock);
    cudaError_t e = free_mapped(devPtr);
    if (e == cudaSuccess)
        mock_cuda.frees++;
    pthread_mutex_unlock(&lock);
    return e;
}

/* Memory pools: handles only; the memory is an allocation like cudaMalloc()'s. */
cudaError_t cudaMemPoolCreate(cudaMemPool_t *memPool, const struct cudaMemPoolProps *poolProps) {
    cudaError_t e = mock_cuda.fail_pool_create ? cudaErrorMemoryAllocation : cudaErrorNotSupported;
    pthread_mutex_lock(&lock);
    if (!mock_cuda.no_pools && !mock_cuda.fail_pool_create &&
        poolProps->location.type == cudaMemLocationTypeDevice && poolProps->location.id >= 0 &&
        poolProps->location.id < mock_cuda.device_count)
        for (int i = 0; i < MAX_POOLS; i++)
            if (!pools[i]) {
                pools[i] = true;
                *memPool = (cudaMemPool_t)(void *)&pools[i];
                mock_cuda.pools_created++;
                e = cudaSuccess;
                break;
            }
    if (e != cudaSuccess)
        fail(e);
    pthread_mutex_unlock(&lock);
    return e;
}

cudaError_t cudaMemPoolDestroy(cudaMemPool_t memPool) {
    pthread_mutex_lock(&lock);
    *(bool *)(void *)memPool = false;
    mock_cuda.pools_destroyed++;
    pthread_mutex_unlock(&lock);
    return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void *value) {
    (void)memPool;
    (void)value;
    return attr == cudaMemPoolAttrReleaseThreshold ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool,
                                    cudaStream_t stream) {
    (void)stream;
    pthread_mutex_lock(&lock);
    cudaError_t e = !*(bool *)(void *)memPool    ? fail(cudaErrorInvalidValue)
                    : mock_cuda.fail_pool_malloc ? fail(cudaErrorMemoryAllocation)
                                                 : alloc_mapped(ptr, size);
    if (e == cudaSuccess)
        mock_cuda.pool_mallocs++;
    pthread_mutex_unlock(&lock);
    return e;
}

cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream) {
    pthread_mutex_lock(&lock);
    cudaError_t e = free_mapped(devPtr);
    if (e == cudaSuccess) {
        mock_cuda.async_frees++;
        mock_cuda.last_async_free_stream = (void *)hStream;
    }
    pthread_mutex_unlock(&lock);
    return e;
}

/* ---- events: complete when recorded, unless held ---- */

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
    (void)flags;
    cudaError_t e = cudaErrorMemoryAllocation;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_EVENTS; i++)
        if (!events[i].used) {
            events[i].used = true;
            events[i].recorded = events[i].complete = false;
            *event = (cudaEvent_t)(void *)&events[i];
            mock_cuda.event_creates++;
            e = cudaSuccess;
            break;
        }
    pthread_mutex_unlock(&lock);
    return e;
}

static int event_index(cudaEvent_t event) {
    for (int i = 0; i < MAX_EVENTS; i++)
        if ((void *)event == (void *)&events[i] && events[i].used)
            return i;
    return -1;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
    pthread_mutex_lock(&lock);
    int i = event_index(event);
    if (i >= 0) {
        events[i].used = false;
        mock_cuda.event_destroys++;
    }
    pthread_mutex_unlock(&lock);
    return i >= 0 ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    (void)stream;
    pthread_mutex_lock(&lock);
    int i = event_index(event);
    if (i >= 0) {
        events[i].recorded = true;
        events[i].complete = !mock_cuda.hold_events;
        mock_cuda.event_records++;
    }
    pthread_mutex_unlock(&lock);
    return i >= 0 ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

/* Not ready is not recorded as the thread's last error, as with the runtime. */
cudaError_t cudaEventQuery(cudaEvent_t event) {
    pthread_mutex_lock(&lock);
    int i = event_index(event);
    mock_cuda.event_queries++;
    cudaError_t e = i < 0                                       ? cudaErrorInvalidResourceHandle
                    : !events[i].recorded || events[i].complete ? cudaSuccess
                                                                : cudaErrorNotReady;
    pthread_mutex_unlock(&lock);
    return e;
}

/* Blocks the host until the event completes: here, completes it. */
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    pthread_mutex_lock(&lock);
    int i = event_index(event);
    mock_cuda.event_syncs++;
    if (i >= 0)
        events[i].complete = true;
    pthread_mutex_unlock(&lock);
    return i >= 0 ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

cudaError_t cudaMemset(void *devPtr, int value, size_t count) {
    memset(devPtr, value, count);
    mock_cuda.memsets++;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    pthread_mutex_lock(&lock);
    mock_cuda.device_syncs++;
    pthread_mutex_unlock(&lock);
    return cudaSuccess;
}

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr) {
    cudaError_t e = cudaErrorInvalidValue;
    pthread_mutex_lock(&lock);
    if (mock_cuda.fail_ipc_get)
        e = cudaErrorMapBufferObjectFailed;
    else
        for (int i = 0; i < MAX_ALLOCS; i++)
            if (allocs[i].used && allocs[i].base == devPtr) {
                memset(handle, 0, sizeof(*handle));
                memcpy(handle->reserved, IPC_MAGIC, sizeof(IPC_MAGIC));
                memcpy(handle->reserved + 16, &i, sizeof(i));
                memcpy(handle->reserved + 20, &allocs[i].generation, sizeof(unsigned));
                mock_cuda.ipc_gets++;
                e = cudaSuccess;
                break;
            }
    pthread_mutex_unlock(&lock);
    return e;
}

cudaError_t cudaIpcOpenMemHandle(void **devPtr, cudaIpcMemHandle_t handle, unsigned int flags) {
    int i;
    unsigned gen;
    cudaError_t e = cudaErrorInvalidResourceHandle;

    if (flags != cudaIpcMemLazyEnablePeerAccess)
        return cudaErrorInvalidValue;
    pthread_mutex_lock(&lock);
    memcpy(&i, handle.reserved + 16, sizeof(i));
    memcpy(&gen, handle.reserved + 20, sizeof(gen));
    if (mock_cuda.fail_ipc_open) {
        e = cudaErrorMapBufferObjectFailed;
        goto out;
    }
    if (memcmp(handle.reserved, IPC_MAGIC, sizeof(IPC_MAGIC)) != 0 || i < 0 || i >= MAX_ALLOCS ||
        !allocs[i].used || allocs[i].generation != gen)
        goto out;
    /* A process may open a handle once: a second open is the bug the client's cache avoids. */
    for (int j = 0; j < MAX_MAPS; j++)
        if (maps[j].used && maps[j].ipc && maps[j].alloc == i)
            goto out;
    int m = new_map();
    if (m < 0)
        goto out;
    void *p = mmap(NULL, allocs[i].size, PROT_READ | PROT_WRITE, MAP_SHARED, allocs[i].fd, 0);
    if (p == MAP_FAILED)
        goto out;
    maps[m] =
        (struct map){.used = true, .ipc = true, .addr = p, .size = allocs[i].size, .alloc = i};
    allocs[i].maps++;
    mock_cuda.ipc_opens++;
    *devPtr = p;
    e = cudaSuccess;
out:
    pthread_mutex_unlock(&lock);
    return e;
}

cudaError_t cudaIpcCloseMemHandle(void *devPtr) {
    cudaError_t e = cudaErrorInvalidValue;
    pthread_mutex_lock(&lock);
    int m = find_map(devPtr, false);
    if (m >= 0 && maps[m].ipc) {
        munmap(maps[m].addr, maps[m].size);
        maps[m].used = false;
        allocs[maps[m].alloc].maps--;
        maybe_drop(maps[m].alloc);
        mock_cuda.ipc_closes++;
        e = cudaSuccess;
    }
    pthread_mutex_unlock(&lock);
    return e;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&lock);
    unsigned i = mock_cuda.stream_creates++ % MAX_STREAMS;
    pthread_mutex_unlock(&lock);
    *pStream = (cudaStream_t)(void *)&streams[i];
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    (void)stream;
    pthread_mutex_lock(&lock);
    mock_cuda.stream_destroys++;
    pthread_mutex_unlock(&lock);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    pthread_mutex_lock(&lock);
    mock_cuda.stream_syncs++;
    mock_cuda.last_synced_stream = (void *)stream;
    cudaError_t e = mock_cuda.fail_stream_sync ? fail(cudaErrorLaunchFailure) : cudaSuccess;
    pthread_mutex_unlock(&lock);
    return e;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
    (void)stream;
    pthread_mutex_lock(&lock);
    if (kind == cudaMemcpyHostToDevice)
        mock_cuda.copies_h2d++;
    else if (kind == cudaMemcpyDeviceToHost)
        mock_cuda.copies_d2h++;
    else if (kind == cudaMemcpyDeviceToDevice)
        mock_cuda.copies_d2d++;
    pthread_mutex_unlock(&lock);
    if (kind != cudaMemcpyHostToDevice && kind != cudaMemcpyDeviceToHost &&
        kind != cudaMemcpyDeviceToDevice)
        return cudaErrorInvalidMemcpyDirection;
    memmove(dst, src, count);
    return cudaSuccess;
}

/* Synchronous for the host, counted with the asynchronous copies of its direction. */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
    return cudaMemcpyAsync(dst, src, count, kind, NULL);
}

/* ---- driver (through cudaGetDriverEntryPointByVersion) ---- */

static bool valid_prop(const CUmemAllocationProp *prop) {
    return prop->type == CU_MEM_ALLOCATION_TYPE_PINNED &&
           prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && prop->location.id >= 0 &&
           prop->location.id < mock_cuda.device_count &&
           prop->requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

/* The driver's calls need a context current on the calling thread. */
static bool no_context(void) {
    return !mock_cuda.context[mock_cuda.current_device];
}

static CUresult fake_get_granularity(size_t *granularity, const CUmemAllocationProp *prop,
                                     CUmemAllocationGranularity_flags option) {
    if (no_context())
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!valid_prop(prop) || option != CU_MEM_ALLOC_GRANULARITY_MINIMUM)
        return CUDA_ERROR_INVALID_VALUE;
    *granularity = mock_cuda.granularity;
    return CUDA_SUCCESS;
}

static CUresult new_handle(int alloc, CUmemGenericAllocationHandle *ret) {
    for (int h = 0; h < MAX_HANDLES; h++)
        if (!handles[h].used) {
            handles[h] = (struct handle){.used = true, .alloc = alloc};
            allocs[alloc].handles++;
            *ret = (CUmemGenericAllocationHandle)(h + 1);
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_OUT_OF_MEMORY;
}

static struct handle *get_handle(CUmemGenericAllocationHandle h) {
    if (h == 0 || h > MAX_HANDLES || !handles[h - 1].used)
        return NULL;
    return &handles[h - 1];
}

static CUresult fake_create(CUmemGenericAllocationHandle *handle, size_t size,
                            const CUmemAllocationProp *prop, unsigned long long flags) {
    CUresult e = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    if (mock_cuda.fail_mem_create)
        e = CUDA_ERROR_OUT_OF_MEMORY;
    else if (valid_prop(prop) && flags == 0 && size > 0 && size % mock_cuda.granularity == 0) {
        int i = new_alloc(size);
        e = i < 0 ? CUDA_ERROR_OUT_OF_MEMORY : new_handle(i, handle);
        if (i >= 0 && e != CUDA_SUCCESS)
            maybe_drop(i);
        if (e == CUDA_SUCCESS)
            mock_cuda.mem_creates++;
    }
    pthread_mutex_unlock(&lock);
    return e;
}

static CUresult fake_release(CUmemGenericAllocationHandle handle) {
    CUresult e = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct handle *h = get_handle(handle);
    if (h) {
        h->used = false;
        allocs[h->alloc].handles--;
        maybe_drop(h->alloc);
        mock_cuda.mem_releases++;
        e = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return e;
}

static CUresult fake_reserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
    CUresult e = CUDA_ERROR_INVALID_VALUE;
    if (no_context())
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&lock);
    int m = new_map();
    if (m >= 0 && addr == 0 && flags == 0 && size % mock_cuda.granularity == 0 &&
        (alignment == 0 || alignment % mock_cuda.granularity == 0)) {
        void *p = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            e = CUDA_ERROR_OUT_OF_MEMORY;
        else {
            maps[m] =
                (struct map){.used = true, .reserved = true, .addr = p, .size = size, .alloc = -1};
            *ptr = (CUdeviceptr)(uintptr_t)p;
            mock_cuda.reserves++;
            e = CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&lock);
    return e;
}

static CUresult fake_address_free(CUdeviceptr ptr, size_t size) {
    CUresult e = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    int m = find_map((void *)(uintptr_t)ptr, true);
    if (m >= 0 && maps[m].size == size) {
        munmap(maps[m].addr, size);
        maps[m].used = false;
        mock_cuda.address_frees++;
        e = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return e;
}

static CUresult fake_map(CUdeviceptr ptr, size_t size, size_t offset,
                         CUmemGenericAllocationHandle handle, unsigned long long flags) {
    CUresult e = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct handle *h = get_handle(handle);
    int r = find_map((void *)(uintptr_t)ptr, true), m = new_map();
    if (mock_cuda.fail_mem_map)
        e = CUDA_ERROR_UNKNOWN;
    else if (h && r >= 0 && m >= 0 && flags == 0 && size <= maps[r].size &&
             offset + size <= allocs[h->alloc].size) {
        void *p = mmap((void *)(uintptr_t)ptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                       allocs[h->alloc].fd, (off_t)offset);
        if (p != MAP_FAILED) {
            maps[m] = (struct map){.used = true, .addr = p, .size = size, .alloc = h->alloc};
            allocs[h->alloc].maps++;
            mock_cuda.maps++;
            e = CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&lock);
    return e;
}

static CUresult fake_unmap(CUdeviceptr ptr, size_t size) {
    CUresult e = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    int m = find_map((void *)(uintptr_t)ptr, false);
    if (m >= 0 && !maps[m].ipc && maps[m].size == size) {
        /* Back to a bare reservation. */
        mmap(maps[m].addr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        maps[m].used = false;
        allocs[maps[m].alloc].maps--;
        maybe_drop(maps[m].alloc);
        mock_cuda.unmaps++;
        e = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return e;
}

static CUresult fake_set_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                size_t count) {
    CUresult e = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    int m = find_map((void *)(uintptr_t)ptr, false);
    if (m >= 0 && maps[m].size == size && count == 1 &&
        desc->location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
        desc->flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
        mock_cuda.set_accesses++;
        e = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return e;
}

static CUresult fake_export(void *shareable, CUmemGenericAllocationHandle handle,
                            CUmemAllocationHandleType type, unsigned long long flags) {
    CUresult e = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct handle *h = get_handle(handle);
    if (h && type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR && flags == 0) {
        /* A plain dup: the driver does not promise close-on-exec. */
        int fd = dup(allocs[h->alloc].fd);
        if (fd >= 0) {
            *(int *)shareable = fd;
            mock_cuda.exports++;
            e = CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&lock);
    return e;
}

static CUresult fake_import(CUmemGenericAllocationHandle *handle, void *os_handle,
                            CUmemAllocationHandleType type) {
    CUresult e = CUDA_ERROR_INVALID_VALUE;
    struct stat st;
    if (no_context())
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&lock);
    int fd = (int)(intptr_t)os_handle;
    if (!mock_cuda.fail_import && type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR &&
        fstat(fd, &st) == 0)
        for (int i = 0; i < MAX_ALLOCS; i++)
            if (allocs[i].used && allocs[i].dev == st.st_dev && allocs[i].ino == st.st_ino) {
                e = new_handle(i, handle);
                if (e == CUDA_SUCCESS)
                    mock_cuda.imports++;
                break;
            }
    pthread_mutex_unlock(&lock);
    return e;
}

static CUresult fake_error_string(CUresult error, const char **str) {
    *str = error == CUDA_SUCCESS ? "no error" : "some driver failure (mock)";
    return CUDA_SUCCESS;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr,
                                             unsigned int cudaVersion, unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *driverStatus) {
    static const struct {
        const char *name;
        void *fn;
    } table[] = {
        {"cuMemGetAllocationGranularity", (void *)fake_get_granularity},
        {"cuMemCreate", (void *)fake_create},
        {"cuMemRelease", (void *)fake_release},
        {"cuMemAddressReserve", (void *)fake_reserve},
        {"cuMemAddressFree", (void *)fake_address_free},
        {"cuMemMap", (void *)fake_map},
        {"cuMemUnmap", (void *)fake_unmap},
        {"cuMemSetAccess", (void *)fake_set_access},
        {"cuMemExportToShareableHandle", (void *)fake_export},
        {"cuMemImportFromShareableHandle", (void *)fake_import},
        {"cuGetErrorString", (void *)fake_error_string},
    };
    (void)flags;
    *funcPtr = NULL;
    if (driverStatus)
        *driverStatus = cudaDriverEntryPointSymbolNotFound;
    if (mock_cuda.entry_error != cudaSuccess)
        return mock_cuda.entry_error;
    if (cudaVersion < 10020)
        return cudaErrorInvalidValue;
    for (size_t i = 0; !mock_cuda.no_symbols && i < sizeof(table) / sizeof(table[0]); i++)
        if (strcmp(symbol, table[i].name) == 0) {
            *funcPtr = table[i].fn;
            if (driverStatus)
                *driverStatus = cudaDriverEntryPointSuccess;
            break;
        }
    return cudaSuccess;
}

/* ---- kernels: the CPU reference on the fake device memory ---- */

struct vase_cuda_workspace {
    int unused;
};

int vase_cuda_workspace_new(struct vase_cuda_workspace **ret) {
    struct vase_cuda_workspace *ws = calloc(1, sizeof(*ws));
    if (!ws)
        return -ENOMEM;
    pthread_mutex_lock(&lock);
    mock_cuda.workspaces++;
    mock_cuda.workspaces_live++;
    pthread_mutex_unlock(&lock);
    *ret = ws;
    return 0;
}

struct vase_cuda_workspace *vase_cuda_workspace_free(struct vase_cuda_workspace *ws) {
    if (ws) {
        pthread_mutex_lock(&lock);
        mock_cuda.workspaces_live--;
        pthread_mutex_unlock(&lock);
    }
    free(ws);
    return NULL;
}

const char *vase_cuda_last_error(void) {
    return "mock kernel failure";
}

int vase_plan_cuda(const struct vase_plan_input *in, struct vase_cuda_workspace *ws, void *stream,
                   uint32_t *keep) {
    (void)ws;
    (void)stream;
    pthread_mutex_lock(&lock);
    mock_cuda.plans++;
    int fail = mock_cuda.plan_error;
    pthread_mutex_unlock(&lock);
    if (fail)
        return fail;
    return vase_plan(in, 1, NULL, keep);
}

/* The kernel's checks of its scratch, then the CPU's compaction at once. */
int vase_compact_cuda(struct vase_view *view, const uint32_t *keep, uint32_t K, uint32_t n,
                      uint32_t len, void *scratch, size_t scratch_bytes, void *stream) {
    (void)stream;
    if (!view || K > n || n > len || (uintptr_t)scratch % 256 != 0)
        return -EINVAL;
    size_t row_bytes = (size_t)view->dim * vase_dtype_size(view->dtype);
    if (scratch &&
        scratch_bytes < vase_compact_cuda_scratch_bytes(view->heads, row_bytes, n, K + len - n))
        return -EINVAL;
    pthread_mutex_lock(&lock);
    mock_cuda.compacts++;
    mock_cuda.compacts_in_scratch += scratch != NULL;
    pthread_mutex_unlock(&lock);
    return vase_compact(view, keep, K, n, len);
}
