/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * A fake CUDA runtime, driver (the cuMem* entry points handed out by
 * cudaGetDriverEntryPointByVersion) and CUDA kernels, linked instead of libcudart and
 * libvasekernels_cuda.a by the unit tests of daemon/core/arena_cuda.c and lib/cuda.c. "Device"
 * memory is host memory in memfds: cudaMalloc() and cuMemCreate() make one, IPC opens and
 * cuMemMap() map it again at another address, so a daemon's and a client's views of one
 * allocation differ in address and share their bytes, as they would across processes. The
 * kernels run the CPU reference on that memory. Knobs inject failures; counters record what
 * the code under test did.
 */

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stddef.h>

#define MOCK_CUDA_MAX_DEVICES 4

struct mock_cuda {
    /* Knobs (mock_cuda_reset(): one device, compute mode Default, nothing failing). */
    int device_count;
    cudaError_t count_error; /* cudaGetDeviceCount() fails with this when not cudaSuccess */
    int compute_mode[MOCK_CUDA_MAX_DEVICES];
    unsigned char uuid[MOCK_CUDA_MAX_DEVICES][16];
    bool fail_malloc;        /* cudaMalloc(): cudaErrorMemoryAllocation */
    bool fail_ipc_get;       /* cudaIpcGetMemHandle(): cudaErrorMapBufferObjectFailed */
    bool fail_ipc_open;      /* cudaIpcOpenMemHandle(): cudaErrorMapBufferObjectFailed */
    cudaError_t entry_error; /* cudaGetDriverEntryPointByVersion() fails with this */
    bool no_symbols;         /* ... succeeds but finds no symbol */
    bool fail_mem_create;    /* cuMemCreate(): CUDA_ERROR_OUT_OF_MEMORY */
    bool fail_mem_map;       /* cuMemMap(): CUDA_ERROR_UNKNOWN */
    bool fail_import;        /* cuMemImportFromShareableHandle(): CUDA_ERROR_INVALID_VALUE */
    bool fail_stream_sync;   /* cudaStreamSynchronize(): cudaErrorLaunchFailure */
    size_t granularity;      /* cuMemGetAllocationGranularity(): 2 MiB */
    bool no_pools;           /* cudaDevAttrMemoryPoolsSupported 0, cudaMemPoolCreate() fails */
    bool fail_pool_create;   /* cudaMemPoolCreate(): cudaErrorMemoryAllocation */
    bool fail_pool_malloc;   /* cudaMallocFromPoolAsync(): cudaErrorMemoryAllocation */
    bool hold_events;        /* events recorded now stay not ready until completed */
    /* The thread's last runtime error, as the runtime keeps it: set by a failing call (of the
     * fakes that can fail) or by a test playing the engine, read by cudaPeekAtLastError(),
     * read and cleared by cudaGetLastError(). */
    cudaError_t last_error;
    /* Whether the device's primary context exists (cudaInitDevice(), or cudaSetDevice() as
     * CUDA 12 does it). The VMM calls of an importer fail without one on the current device,
     * as the driver's do. */
    bool context[MOCK_CUDA_MAX_DEVICES];

    /* Counters. */
    int current_device;
    unsigned set_device_calls;
    unsigned mallocs, frees, memsets;
    unsigned ipc_gets, ipc_opens, ipc_closes;
    unsigned mem_creates, mem_releases, exports, imports, reserves, address_frees, maps, unmaps,
        set_accesses;
    unsigned stream_creates, stream_destroys, stream_syncs, device_syncs;
    unsigned pools_created, pools_destroyed, pool_mallocs, async_frees;
    void *last_async_free_stream;
    unsigned event_creates, event_destroys, event_records, event_queries, event_syncs;
    unsigned compacts_in_scratch; /* vase_compact_cuda() calls given a scratch */
    void *last_synced_stream;
    unsigned copies_h2d, copies_d2h, copies_d2d;
    unsigned plans, compacts, workspaces;
    int workspaces_live;

    /* More knobs. */
    int plan_error; /* vase_plan_cuda() fails with this -errno when not 0 */
    /* dlopen() of the driver's libcuda.so.1 (the programs link with --wrap=dlopen,--wrap=dlclose)
     * fails when set, as where no NVIDIA driver is installed; else it gives a fake handle.
     * dlopen() of any other library is the real one. */
    bool driver_missing;
    unsigned driver_probes;
};

extern struct mock_cuda mock_cuda;

/* Knobs to their defaults, counters to zero. Allocations still alive stay alive. */
void mock_cuda_reset(void);
/* Allocations (memfds) and mappings (IPC opens, cuMemMap) still alive. */
unsigned mock_cuda_live_allocations(void);
unsigned mock_cuda_live_mappings(void);
/* IPC opens of the allocation at daemon address p still open. */
unsigned mock_cuda_ipc_open_count(void);
/* Completes every event recorded so far (the device has caught up). */
void mock_cuda_complete_events(void);
/* Events created and not destroyed. */
unsigned mock_cuda_live_events(void);
