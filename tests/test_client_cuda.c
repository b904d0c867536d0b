/* SPDX-License-Identifier: MIT */

/*
 * Unit tests of lib/cuda.c (and the device side of lib/session.c) against the fake CUDA
 * of tests/mock_cuda.c (no GPU, no libcudart): a device arena is opened once per process and
 * daemon incarnation however many clients map it, closed with the last of them and before the
 * session socket, found by UUID whatever the ordinals, refused with an exact -errno and a
 * sentence when it cannot be used; a cuda-vmm fd crosses a socket with SCM_RIGHTS and is
 * imported, then closed, in a context the mapping made current itself; compaction on the
 * engine's stream equals the CPU's, runs in the sequence's own scratch, and is complete (the
 * stream synchronised) before the call returns in host order, or marked by an event and never
 * waited for in stream order; a sequence's memory comes from the mapping's pool and goes back
 * ordered on its stream, with no device synchronisation; the engine's pending runtime error is
 * never cleared; the caller's current device is restored. close() is wrapped to see when the
 * session socket closes. The eviction cycle (lib/cycle.c) on a device arena runs against a
 * daemon faked at the channel (vase__chan_* wrapped): in stream order the request and the
 * commit leave only once their events have completed, and nothing waits for the device.
 */

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "../lib/cuda_arena.h"
#include "../lib/internal.h"
#include "../lib/session.h"
#include "mock_cuda.h"
#include "vase_kernels.h"
#include "vase_layout.h"

#define GRANULE_BYTES (64u << 10)
#define GRANULES 32u
#define ARENA_BYTES ((size_t)GRANULE_BYTES * GRANULES)

/* ---- close(), watched ---- */

int __real_close(int fd);
int __wrap_close(int fd);

static int watched_fd = -1;
static int ipc_opens_at_watched_close = -1;

int __wrap_close(int fd) {
    if (watched_fd >= 0 && fd == watched_fd) {
        ipc_opens_at_watched_close = (int)mock_cuda_ipc_open_count();
        watched_fd = -1;
    }
    return __real_close(fd);
}

/* ---- the daemon's side, faked ---- */

static void *daemon_ipc_base;

/* An arena as take_arena() leaves it for a cuda-ipc welcome: the daemon's allocation on device
 * dev and its handle. */
static void ipc_arena(struct vase__arena *a, uint32_t id, int dev) {
    cudaIpcMemHandle_t h;
    char uuid[48];
    const unsigned char *b = mock_cuda.uuid[dev];

    if (!daemon_ipc_base) {
        assert_int_equal(cudaMalloc(&daemon_ipc_base, ARENA_BYTES), cudaSuccess);
        memset(daemon_ipc_base, 0, ARENA_BYTES);
    }
    assert_int_equal(cudaIpcGetMemHandle(&h, daemon_ipc_base), cudaSuccess);
    snprintf(uuid, sizeof(uuid),
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
             b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
             b[15]);
    *a = (struct vase__arena){
        .id = id,
        .kind = strdup("cuda:0"),
        .share = strdup("cuda-ipc"),
        .granule_bytes = GRANULE_BYTES,
        .granules = GRANULES,
        .size_bytes = ARENA_BYTES,
        .device_uuid = strdup(uuid),
        .ipc_handle_len = sizeof(h),
        .fd = -1,
        .device = -1,
    };
    memcpy(a->ipc_handle, &h, sizeof(h));
}

static void arena_done(struct vase__arena *a) {
    vase__cuda_unmap(a);
    if (a->fd >= 0)
        close(a->fd);
    free(a->kind);
    free(a->share);
    free(a->device_uuid);
}

static void free_daemon_ipc(void) {
    if (daemon_ipc_base)
        assert_int_equal(cudaFree(daemon_ipc_base), cudaSuccess);
    daemon_ipc_base = NULL;
}

static void *entry(const char *name) {
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q;
    assert_int_equal(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q),
                     cudaSuccess);
    assert_non_null(fn);
    return fn;
}

/* The daemon's cuda-vmm allocation: made, exported, and its own mapping. */
struct daemon_vmm {
    CUmemGenericAllocationHandle h;
    CUdeviceptr va;
    size_t bytes;
    int fd;
};

static void daemon_vmm_new(struct daemon_vmm *d) {
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                       unsigned long long) = entry("cuMemCreate");
    CUresult (*export_handle)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
                              unsigned long long) = entry("cuMemExportToShareableHandle");
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long) =
        entry("cuMemAddressReserve");
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) =
        entry("cuMemMap");
    CUmemAllocationProp prop = {
        .type = CU_MEM_ALLOCATION_TYPE_PINNED,
        .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
    };
    /* In its own process, with its own context: this one's stays as it was. */
    bool had_context = mock_cuda.context[0];
    mock_cuda.context[0] = true;
    d->bytes = 2u << 20; /* ARENA_BYTES rounded up to the granularity */
    assert_int_equal(create(&d->h, d->bytes, &prop, 0), CUDA_SUCCESS);
    assert_int_equal(export_handle(&d->fd, d->h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                     CUDA_SUCCESS);
    assert_int_equal(reserve(&d->va, d->bytes, d->bytes, 0, 0), CUDA_SUCCESS);
    assert_int_equal(map(d->va, d->bytes, 0, d->h, 0), CUDA_SUCCESS);
    mock_cuda.context[0] = had_context;
}

static void daemon_vmm_free(struct daemon_vmm *d) {
    CUresult (*unmap)(CUdeviceptr, size_t) = entry("cuMemUnmap");
    CUresult (*address_free)(CUdeviceptr, size_t) = entry("cuMemAddressFree");
    CUresult (*release)(CUmemGenericAllocationHandle) = entry("cuMemRelease");
    assert_int_equal(unmap(d->va, d->bytes), CUDA_SUCCESS);
    assert_int_equal(address_free(d->va, d->bytes), CUDA_SUCCESS);
    assert_int_equal(release(d->h), CUDA_SUCCESS);
    close(d->fd);
}

/* The daemon's fd, as the client receives it: over a socket, with SCM_RIGHTS. */
static int pass_fd(int fd) {
    int sv[2], got = -1;
    char byte = 'w';
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } control = {0};
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = control.buf,
                         .msg_controllen = sizeof(control.buf)};

    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof(int));
    assert_int_equal(sendmsg(sv[0], &msg, 0), 1);
    memset(&control, 0, sizeof(control));
    msg.msg_controllen = sizeof(control.buf);
    assert_int_equal(recvmsg(sv[1], &msg, MSG_CMSG_CLOEXEC), 1);
    for (cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm))
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
            memcpy(&got, CMSG_DATA(cm), sizeof(int));
    close(sv[0]);
    close(sv[1]);
    assert_true(got >= 0 && got != fd);
    return got;
}

static void vmm_arena(struct vase__arena *a, uint32_t id, int daemon_fd) {
    struct vase__arena tmp;
    ipc_arena(&tmp, id, 0); /* for the uuid and names */
    *a = tmp;
    free(a->share);
    a->share = strdup("cuda-vmm");
    a->ipc_handle_len = 0;
    a->fd = daemon_fd >= 0 ? pass_fd(daemon_fd) : -1;
}

static int setup(void **state) {
    (void)state;
    mock_cuda_reset();
    return 0;
}

static int teardown(void **state) {
    (void)state;
    free_daemon_ipc();
    assert_int_equal(mock_cuda_live_allocations(), 0);
    assert_int_equal(mock_cuda_live_mappings(), 0);
    return 0;
}

/* ---- mapping ---- */

static void test_ipc_once_per_process(void **state) {
    (void)state;
    struct vase__arena a, b, c;
    char msg[256] = "";

    mock_cuda.device_count = 2;
    /* The engine works on device 0; the arena is on device 1 (by UUID). */
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    ipc_arena(&a, 0, 1);
    ipc_arena(&b, 0, 1);
    assert_int_equal(vase__cuda_map(&a, 77, msg, sizeof(msg)), 0);
    assert_int_equal(a.device, 1);
    assert_non_null(a.map);
    assert_ptr_not_equal(a.map, daemon_ipc_base);
    assert_int_equal(mock_cuda.current_device, 0);
    /* A second client of the same daemon in this process shares the open handle. */
    assert_int_equal(vase__cuda_map(&b, 77, msg, sizeof(msg)), 0);
    assert_ptr_equal(b.map, a.map);
    assert_int_equal(mock_cuda.ipc_opens, 1);
    /* Mapping twice through one arena is a no-op. */
    assert_int_equal(vase__cuda_map(&a, 77, msg, sizeof(msg)), 0);
    assert_int_equal(mock_cuda.ipc_opens, 1);

    /* The bytes are the daemon's. */
    memcpy((char *)daemon_ipc_base + 3 * GRANULE_BYTES, "plan", 5);
    assert_string_equal((char *)a.map + 3 * GRANULE_BYTES, "plan");

    /* The last reference closes the handle, on the arena's device, restoring the caller's. */
    vase__cuda_unmap(&a);
    assert_null(a.map);
    assert_int_equal(mock_cuda.ipc_closes, 0);
    vase__cuda_unmap(&b);
    assert_int_equal(mock_cuda.ipc_closes, 1);
    assert_int_equal(mock_cuda.current_device, 0);

    /* A restarted daemon (new incarnation, new allocation) is a new mapping, never the old
     * one found by address. */
    free_daemon_ipc();
    ipc_arena(&c, 0, 1);
    assert_int_equal(vase__cuda_map(&c, 78, msg, sizeof(msg)), 0);
    assert_int_equal(mock_cuda.ipc_opens, 2);
    arena_done(&a);
    arena_done(&b);
    arena_done(&c);
    assert_int_equal(mock_cuda.ipc_closes, 2);
}

static void test_vmm_import(void **state) {
    (void)state;
    struct daemon_vmm d;
    struct vase__arena a, b;
    char msg[256] = "";

    daemon_vmm_new(&d);
    vmm_arena(&a, 0, d.fd);
    vmm_arena(&b, 0, d.fd);
    int fd_a = a.fd;
    /* A process that has not touched CUDA: device 0 is current, but it has no context yet,
     * and the driver's VMM calls need one. The mapping makes it. */
    assert_int_equal(mock_cuda.current_device, 0);
    assert_false(mock_cuda.context[0]);
    assert_int_equal(vase__cuda_map(&a, 5, msg, sizeof(msg)), 0);
    assert_true(mock_cuda.context[0]);
    /* The sequences' pool and open stream, one per mapping. */
    assert_int_equal(mock_cuda.pools_created, 1);
    assert_int_equal(mock_cuda.stream_creates, 1);
    /* Imported, the fd is closed; the mapping covers the granularity-rounded allocation. */
    assert_int_equal(a.fd, -1);
    assert_int_equal(fcntl(fd_a, F_GETFD), -1);
    assert_int_equal(mock_cuda.imports, 1);
    assert_int_equal(mock_cuda.set_accesses, 1);
    assert_non_null(a.map);
    assert_ptr_not_equal(a.map, (void *)(uintptr_t)d.va);
    memcpy((char *)(uintptr_t)d.va + 7 * GRANULE_BYTES, "kv", 3);
    assert_string_equal((char *)a.map + 7 * GRANULE_BYTES, "kv");
    /* The handle is released once mapped: the mapping holds the memory. */
    assert_int_equal(mock_cuda.mem_releases, 1);

    /* Another client: the cached mapping, its own fd closed unused. */
    assert_int_equal(vase__cuda_map(&b, 5, msg, sizeof(msg)), 0);
    assert_int_equal(b.fd, -1);
    assert_ptr_equal(b.map, a.map);
    assert_int_equal(mock_cuda.imports, 1);

    vase__cuda_unmap(&a);
    assert_int_equal(mock_cuda.unmaps, 0);
    vase__cuda_unmap(&b);
    assert_int_equal(mock_cuda.unmaps, 1);
    assert_int_equal(mock_cuda.address_frees, 1);
    assert_int_equal(mock_cuda.pools_destroyed, 1);
    assert_int_equal(mock_cuda.stream_destroys, 1);
    arena_done(&a);
    arena_done(&b);
    daemon_vmm_free(&d);
}

/* Maps a (built by make) after setting knobs; expects err and a message holding want. */
static void expect_refusal(struct vase__arena *a, int err, const char *want) {
    char msg[256] = "";
    int r = vase__cuda_map(a, 1, msg, sizeof(msg));
    if (r != err || !strstr(msg, want))
        print_error("got %d \"%s\"; want %d \"%s\"\n", r, msg, err, want);
    assert_int_equal(r, err);
    assert_non_null(strstr(msg, want));
    assert_null(a->map);
    assert_null(a->mapping);
    assert_int_equal(mock_cuda_ipc_open_count(), 0);
}

static void test_refusals(void **state) {
    (void)state;
    struct vase__arena a;
    struct daemon_vmm d;

    ipc_arena(&a, 0, 0);
    mock_cuda.count_error = cudaErrorInsufficientDriver;
    expect_refusal(&a, -ENODEV, "this process sees no CUDA device");
    /* No driver at all: the library to install is named. */
    mock_cuda.driver_missing = true;
    expect_refusal(&a, -ENODEV, "library libcuda.so.1 cannot be loaded in this process");
    expect_refusal(&a, -ENODEV, "install it (Debian: nvidia-driver");
    mock_cuda.driver_missing = false;
    mock_cuda.count_error = cudaSuccess;
    mock_cuda.device_count = 0;
    expect_refusal(&a, -ENODEV, "this process sees no CUDA device");
    /* Devices, but not the arena's: CUDA_VISIBLE_DEVICES hid it, or another machine's UUID. */
    mock_cuda.device_count = 2;
    mock_cuda.uuid[0][0] ^= 0xff;
    expect_refusal(&a, -ENODEV, "which is not among the 2 CUDA devices");
    mock_cuda.uuid[0][0] ^= 0xff;
    mock_cuda.compute_mode[0] = cudaComputeModeExclusiveProcess;
    expect_refusal(&a, -EBUSY, "compute mode Exclusive");
    mock_cuda.compute_mode[0] = cudaComputeModeProhibited;
    expect_refusal(&a, -EBUSY, "compute mode Prohibited");
    mock_cuda.compute_mode[0] = cudaComputeModeDefault;
    mock_cuda.fail_ipc_open = true;
    expect_refusal(&a, -EIO, "cudaIpcOpenMemHandle() of arena 0 failed");
    mock_cuda.fail_ipc_open = false;
    a.ipc_handle_len = 10;
    expect_refusal(&a, -EPROTO, "an IPC handle of 10 bytes");
    a.ipc_handle_len = sizeof(cudaIpcMemHandle_t);
    /* Nothing was cached by the failures: the arena maps now. */
    char msg[64];
    assert_int_equal(vase__cuda_map(&a, 1, msg, sizeof(msg)), 0);
    assert_int_equal(mock_cuda.ipc_opens, 1);
    arena_done(&a);

    daemon_vmm_new(&d);
    vmm_arena(&a, 1, d.fd);
    mock_cuda.no_symbols = true;
    expect_refusal(&a, -EOPNOTSUPP, "does not provide cuMemGetAllocationGranularity");
    mock_cuda.no_symbols = false;
    mock_cuda.entry_error = cudaErrorInsufficientDriver;
    expect_refusal(&a, -ENODEV, "cannot reach the CUDA driver");
    mock_cuda.entry_error = cudaSuccess;
    mock_cuda.fail_import = true;
    expect_refusal(&a, -EINVAL, "cuMemImportFromShareableHandle() of arena 1 failed");
    mock_cuda.fail_import = false;
    mock_cuda.fail_mem_map = true;
    expect_refusal(&a, -EIO, "cuMemMap() of arena 1 failed");
    mock_cuda.fail_mem_map = false;
    /* The failed attempts released what they imported and reserved. */
    assert_int_equal(mock_cuda.imports, 1);
    assert_int_equal(mock_cuda.reserves, 2); /* the daemon's and the failed map's */
    assert_int_equal(mock_cuda.address_frees, 1);
    assert_int_equal(mock_cuda.mem_releases, 1);
    int fd = a.fd;
    a.fd = -1;
    expect_refusal(&a, -EPROTO, "came without its fd");
    a.fd = fd;
    assert_int_equal(vase__cuda_map(&a, 1, msg, sizeof(msg)), 0);
    arena_done(&a);
    daemon_vmm_free(&d);
}

/* vase__session_close(): device mappings go before the session socket does. */
static void test_unmap_before_session_closes(void **state) {
    (void)state;
    struct vase__session s;
    int sv[2];
    char msg[64], byte;

    vase__session_init(&s);
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    s.fd = sv[0];
    s.arenas = calloc(1, sizeof(*s.arenas));
    s.n_arenas = 1;
    ipc_arena(&s.arenas[0], 0, 0);
    assert_int_equal(vase__cuda_map(&s.arenas[0], 9, msg, sizeof(msg)), 0);
    assert_int_equal(mock_cuda_ipc_open_count(), 1);

    watched_fd = sv[0];
    ipc_opens_at_watched_close = -1;
    vase__session_close(&s);
    assert_int_equal(watched_fd, -1);
    assert_int_equal(ipc_opens_at_watched_close, 0);
    assert_int_equal(mock_cuda.ipc_closes, 1);
    /* The daemon sees the session end. */
    assert_int_equal(recv(sv[1], &byte, 1, 0), 0);
    close(sv[1]);
}

/* ---- streams, copies, compaction ---- */

static void test_sync_and_copy(void **state) {
    (void)state;
    char stream_obj, host[16] = "engine", back[16] = "";
    void *dev = NULL;

    mock_cuda.device_count = 2;
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    assert_int_equal(cudaMalloc(&dev, 64), cudaSuccess);
    assert_int_equal(vase__cuda_sync(0, &stream_obj), 0);
    assert_ptr_equal(mock_cuda.last_synced_stream, &stream_obj);
    assert_int_equal(mock_cuda.current_device, 1);
    assert_int_equal(vase__cuda_copy(0, NULL, dev, host, sizeof(host), true), 0);
    assert_int_equal(vase__cuda_copy(0, NULL, back, dev, sizeof(back), false), 0);
    assert_string_equal(back, "engine");
    assert_int_equal(mock_cuda.copies_h2d, 1);
    assert_int_equal(mock_cuda.copies_d2h, 1);
    /* Each copy is complete on return. */
    assert_int_equal(mock_cuda.stream_syncs, 3);
    assert_null(mock_cuda.last_synced_stream);
    mock_cuda.fail_stream_sync = true;
    assert_int_equal(vase__cuda_sync(0, NULL), -EIO);
    assert_int_equal(cudaFree(dev), cudaSuccess);
}

enum {
    L = 2,
    HQ = 2,
    HKV = 2,
    D = 8,
    B = 16,
    BUDGET = 64,
    W = 16,
    LEN = 128,
    N = LEN - W,
    K = BUDGET - W
};

/* The model of the compaction and cycle tests. */
static const struct vase_layout_geometry geometry = {.layers = L,
                                                     .q_heads = HQ,
                                                     .kv_heads = HKV,
                                                     .head_dim = D,
                                                     .dtype = VASE_DTYPE_F32,
                                                     .block_tokens = B};

/* Writes a plan keeping the first K candidates of every head of every layer into the plan
 * area of the daemon's arena. */
static void write_first_k_plans(const struct vase_plan_layout *plan, const uint32_t *plan_pages) {
    uint32_t keep[K];
    for (uint32_t i = 0; i < K; i++)
        keep[i] = i;
    for (uint32_t i = 0; i < L * HKV; i++)
        memcpy((char *)daemon_ipc_base + vase_layout_plan_offset(plan, plan_pages, i), keep,
               sizeof(keep));
}

static void test_compact(void **state) {
    (void)state;
    struct vase_layout lay;
    struct vase_plan_layout plan;
    struct vase__cuda_seq *cs = NULL;
    struct vase__arena a;
    uint32_t pages[8], plan_pages[1] = {30}, keep[HKV * K];
    char stream_obj, msg[128];

    /* Pages of 16 * 2 * 2 * 2 * 8 * 4 = 4096 bytes: 8 blocks for 128 slots, 512 in the arena. */
    assert_int_equal(vase_layout_compute(&geometry, ARENA_BYTES, &lay, msg, sizeof(msg)), 0);
    assert_int_equal(lay.page_bytes, 4096);
    size_t n_pages = vase_layout_blocks_for(&lay, LEN);
    assert_int_equal(n_pages, 8);
    for (size_t i = 0; i < n_pages; i++)
        pages[i] = (uint32_t)(20 - 2 * i);
    /* Lists of 48 slots, 192 bytes: all four in one 768-byte plan page (plan page 30 lies in
     * block 5, which the table does not hold). */
    assert_int_equal(vase_layout_plans(&lay, K, &plan, NULL, 0), 0);
    assert_int_equal(plan.plans_per_page, L * HKV);
    assert_int_equal(plan.plan_pages, 1);

    ipc_arena(&a, 0, 0);
    assert_int_equal(vase__cuda_map(&a, 1, msg, sizeof(msg)), 0);
    char *host = malloc(ARENA_BYTES);
    srand(9);
    for (size_t i = 0; i < ARENA_BYTES / sizeof(float); i++)
        ((float *)daemon_ipc_base)[i] = (float)rand() / RAND_MAX;
    /* Plans: each head of each layer keeps a different run of candidates. */
    for (uint32_t l = 0; l < L; l++)
        for (uint32_t h = 0; h < HKV; h++) {
            for (uint32_t i = 0; i < K; i++)
                keep[h * K + i] = i + (h + l) * 3;
            memcpy((char *)daemon_ipc_base +
                       vase_layout_plan_offset(&plan, plan_pages, l * HKV + h),
                   keep + h * K, K * sizeof(uint32_t));
        }
    memcpy(host, daemon_ipc_base, ARENA_BYTES);

    /* The reference: the CPU compaction on the host copy. */
    int want = 0;
    for (uint32_t l = 0; l < L; l++) {
        for (uint32_t h = 0; h < HKV; h++)
            memcpy(keep + h * K, host + vase_layout_plan_offset(&plan, plan_pages, l * HKV + h),
                   K * sizeof(uint32_t));
        struct vase_view kv = vase_layout_kv_view(&lay, host, pages, l, VASE_K);
        struct vase_view vv = vase_layout_kv_view(&lay, host, pages, l, VASE_V);
        want = vase_compact_layer(&kv, &vv, keep, K, N, LEN);
        assert_int_equal(want, K + LEN - N);
    }

    /* The block table goes to the device once, at the open, and is the host's. The sequence's
     * memory comes from the mapping's pool, and the open waits for libvase's own stream only. */
    size_t scratch = vase_compact_cuda_scratch_bytes(HKV, D * sizeof(float), LEN, LEN);
    assert_int_equal(
        vase__cuda_seq_new(a.mapping, pages, n_pages, n_pages, (size_t)HKV * K, scratch, &cs), 0);
    vase__cuda_seq_set_stream(cs, &stream_obj);
    assert_int_equal(mock_cuda.copies_h2d, 1);
    assert_int_equal(mock_cuda.pool_mallocs, 1);
    assert_int_equal(mock_cuda.mallocs, 1); /* the daemon's arena only */
    assert_int_equal(mock_cuda.stream_syncs, 1);
    assert_ptr_not_equal(mock_cuda.last_synced_stream, &stream_obj);
    assert_non_null(mock_cuda.last_synced_stream);
    const uint32_t *dev_table = vase__cuda_seq_table(cs);
    assert_non_null(dev_table);
    assert_ptr_not_equal(dev_table, pages);
    assert_memory_equal(dev_table, pages, n_pages * sizeof(uint32_t));

    struct vase__cuda_compact cc = {
        .layout = &lay,
        .arena_base = a.map,
        .pages = pages,
        .n_pages = n_pages,
        .plan_pages = plan_pages,
        .plan = &plan,
        .keep = K,
        .n = N,
        .len = LEN,
    };
    unsigned syncs = mock_cuda.stream_syncs;
    assert_int_equal(vase__cuda_compact(cs, &stream_obj, &cc, false), want);
    assert_memory_equal(daemon_ipc_base, host, ARENA_BYTES);
    /* Per layer one merged copy of its lists, two kernels in the sequence's scratch; nothing
     * allocated, no block table copied again; then a wait on the engine's stream. */
    assert_int_equal(mock_cuda.copies_d2d, L);
    assert_int_equal(mock_cuda.compacts, 2 * L);
    assert_int_equal(mock_cuda.compacts_in_scratch, 2 * L);
    assert_int_equal(mock_cuda.pool_mallocs + mock_cuda.mallocs, 2);
    assert_int_equal(mock_cuda.copies_h2d, 1);
    assert_int_equal(mock_cuda.stream_syncs, syncs + 1);
    assert_ptr_equal(mock_cuda.last_synced_stream, &stream_obj);

    /* A table that lost its tail (a commit after a long prompt) still compacts through the
     * device copy's first entries. */
    cc.n_pages = 4;
    cc.len = 64;
    cc.n = 56; /* above every kept candidate (53 at most) */
    assert_int_equal(vase__cuda_compact(cs, &stream_obj, &cc, false), K + 8);
    assert_int_equal(mock_cuda.copies_h2d, 1);
    cc.n_pages = n_pages;
    cc.len = LEN;
    cc.n = N;

    /* Arguments the device state cannot hold, and a failing stream: libvase's own failure is
     * returned and taken off the thread's last error. */
    cc.n_pages = n_pages + 1;
    assert_int_equal(vase__cuda_compact(cs, &stream_obj, &cc, false), -EPROTO);
    cc.n_pages = n_pages;
    cc.keep = K + 1;
    assert_int_equal(vase__cuda_compact(cs, &stream_obj, &cc, false), -EPROTO);
    cc.keep = K;
    cc.n = LEN + 1;
    assert_int_equal(vase__cuda_compact(cs, &stream_obj, &cc, false), -EPROTO);
    cc.n = N;
    mock_cuda.fail_stream_sync = true;
    assert_int_equal(vase__cuda_compact(cs, &stream_obj, &cc, false), -EIO);
    assert_int_equal(mock_cuda.last_error, cudaSuccess);
    mock_cuda.fail_stream_sync = false;

    /* The close frees on the sequence's stream, without a device synchronisation. */
    unsigned frees = mock_cuda.frees;
    assert_null(vase__cuda_seq_free(cs));
    assert_int_equal(mock_cuda.async_frees, 1);
    assert_ptr_equal(mock_cuda.last_async_free_stream, &stream_obj);
    assert_int_equal(mock_cuda.frees, frees);
    assert_int_equal(mock_cuda.device_syncs, 0);
    assert_int_equal(mock_cuda_live_events(), 0);
    assert_null(vase__cuda_seq_free(NULL));

    /* A scratch smaller than a layer's move: the kernel refuses, nothing moves. */
    cs = NULL;
    assert_int_equal(
        vase__cuda_seq_new(a.mapping, pages, n_pages, n_pages, (size_t)HKV * K, 256, &cs), 0);
    assert_int_equal(vase__cuda_compact(cs, &stream_obj, &cc, false), -EPROTO);
    cs = vase__cuda_seq_free(cs);

    mock_cuda.fail_pool_malloc = true;
    assert_int_equal(
        vase__cuda_seq_new(a.mapping, pages, n_pages, n_pages, (size_t)HKV * K, scratch, &cs),
        -ENOMEM);
    assert_null(cs);
    assert_int_equal(mock_cuda.last_error, cudaSuccess);
    assert_int_equal(mock_cuda_live_events(), 0);
    mock_cuda.fail_pool_malloc = false;
    assert_int_equal(vase__cuda_seq_new(a.mapping, pages, n_pages, n_pages, 0, scratch, &cs),
                     -EINVAL);
    assert_int_equal(vase__cuda_seq_new(a.mapping, pages, n_pages, n_pages, 1, 0, &cs), -EINVAL);
    assert_int_equal(vase__cuda_seq_new(a.mapping, NULL, n_pages, n_pages, 1, scratch, &cs),
                     -EINVAL);
    assert_int_equal(vase__cuda_seq_new(a.mapping, pages, n_pages, n_pages, 1, scratch, NULL),
                     -EINVAL);
    assert_int_equal(vase__cuda_seq_new(NULL, pages, n_pages, n_pages, 1, scratch, &cs), -EINVAL);
    assert_null(cs);
    free(host);
    arena_done(&a);
}

/* A device without memory pools (or whose pool cannot be made): the sequence's memory from
 * cudaMalloc() and back by cudaFree() (which synchronises the device: the one fallback). */
static void test_seq_memory_without_pools(void **state) {
    (void)state;
    struct vase__cuda_seq *cs = NULL;
    struct vase__arena a;
    uint32_t pages[2] = {3, 4};
    char msg[128];

    mock_cuda.no_pools = true;
    ipc_arena(&a, 0, 0);
    assert_int_equal(vase__cuda_map(&a, 1, msg, sizeof(msg)), 0);
    assert_int_equal(mock_cuda.pools_created, 0);
    assert_int_equal(vase__cuda_seq_new(a.mapping, pages, 2, 2, 4, 4096, &cs), 0);
    assert_int_equal(mock_cuda.mallocs, 2); /* the daemon's arena, and the sequence's */
    assert_int_equal(mock_cuda.pool_mallocs, 0);
    assert_memory_equal(vase__cuda_seq_table(cs), pages, sizeof(pages));
    assert_null(vase__cuda_seq_free(cs));
    assert_int_equal(mock_cuda.frees, 1);
    assert_int_equal(mock_cuda.async_frees, 0);
    arena_done(&a);

    /* Pools, but this one cannot be made. */
    mock_cuda.no_pools = false;
    mock_cuda.fail_pool_create = true;
    ipc_arena(&a, 0, 0);
    assert_int_equal(vase__cuda_map(&a, 2, msg, sizeof(msg)), 0);
    assert_int_equal(mock_cuda.last_error, cudaSuccess); /* libvase's own failure, cleared */
    assert_int_equal(vase__cuda_seq_new(a.mapping, pages, 2, 2, 4, 4096, &cs), 0);
    assert_int_equal(mock_cuda.pool_mallocs, 0);
    assert_int_equal(mock_cuda.mallocs, 3);
    assert_null(vase__cuda_seq_free(cs));
    assert_int_equal(mock_cuda.frees, 2);
    arena_done(&a);
}

/* Entries a commit's reply appends to the block table (an elastic budget growing back) reach
 * the device copy, on the sequence's stream, without a wait; never beyond the open's length. */
static void test_seq_table_grows(void **state) {
    (void)state;
    struct vase__cuda_seq *cs = NULL;
    struct vase__arena a;
    uint32_t pages[4] = {3, 4, 5, 6};
    char msg[128], stream_obj;

    ipc_arena(&a, 0, 0);
    assert_int_equal(vase__cuda_map(&a, 1, msg, sizeof(msg)), 0);
    /* Opened with two pages and room for four (an elastic open below its budget). */
    assert_int_equal(vase__cuda_seq_new(a.mapping, pages, 4, 2, 4, 4096, &cs), -EINVAL);
    assert_int_equal(vase__cuda_seq_new(a.mapping, pages, 2, 4, 4, 4096, &cs), 0);
    assert_memory_equal(vase__cuda_seq_table(cs), pages, 2 * sizeof(uint32_t));
    /* Grown to four pages, on other pages than the host's first table had. */
    uint32_t grown[4] = {3, 4, 9, 11};
    unsigned syncs = mock_cuda.stream_syncs;
    assert_int_equal(vase__cuda_seq_set_table(cs, &stream_obj, grown, 2, 4), 0);
    assert_memory_equal(vase__cuda_seq_table(cs), grown, sizeof(grown));
    assert_int_equal(mock_cuda.stream_syncs, syncs);
    assert_int_equal(vase__cuda_seq_set_table(cs, &stream_obj, grown, 4, 4), 0);
    assert_int_equal(vase__cuda_seq_set_table(cs, &stream_obj, grown, 2, 5), -EINVAL);
    assert_int_equal(vase__cuda_seq_set_table(cs, &stream_obj, grown, 3, 2), -EINVAL);
    assert_int_equal(vase__cuda_seq_set_table(cs, &stream_obj, NULL, 0, 2), -EINVAL);
    assert_int_equal(vase__cuda_seq_set_table(NULL, &stream_obj, grown, 0, 2), -EINVAL);
    assert_memory_equal(vase__cuda_seq_table(cs), grown, sizeof(grown));
    assert_null(vase__cuda_seq_free(cs));
    arena_done(&a);
}

/* Stream order: the compaction is enqueued and marked by an event, never waited for; the mark
 * is reached only once the device has run it; the engine's pending error survives. */
static void test_compact_stream_ordered(void **state) {
    (void)state;
    struct vase_layout lay;
    struct vase_plan_layout plan;
    struct vase__cuda_seq *cs = NULL;
    struct vase__arena a;
    uint32_t pages[8], plan_pages[1] = {30};
    char stream_obj, msg[128];

    assert_int_equal(vase_layout_compute(&geometry, ARENA_BYTES, &lay, msg, sizeof(msg)), 0);
    assert_int_equal(vase_layout_plans(&lay, K, &plan, NULL, 0), 0);
    for (size_t i = 0; i < 8; i++)
        pages[i] = (uint32_t)(20 - 2 * i);
    ipc_arena(&a, 0, 0);
    assert_int_equal(vase__cuda_map(&a, 1, msg, sizeof(msg)), 0);
    write_first_k_plans(&plan, plan_pages);
    size_t scratch = vase_compact_cuda_scratch_bytes(HKV, D * sizeof(float), LEN, LEN);
    assert_int_equal(vase__cuda_seq_new(a.mapping, pages, 8, 8, (size_t)HKV * K, scratch, &cs), 0);
    struct vase__cuda_compact cc = {.layout = &lay,
                                    .arena_base = a.map,
                                    .pages = pages,
                                    .n_pages = 8,
                                    .plan_pages = plan_pages,
                                    .plan = &plan,
                                    .keep = K,
                                    .n = N,
                                    .len = LEN};

    /* Never recorded: reached. */
    assert_int_equal(vase__cuda_seq_reached(cs, VASE__CUDA_COMPACTED, false), 1);

    /* The engine's kernel failed to launch just before; the compaction is queued behind work
     * the device has not run yet. */
    mock_cuda.last_error = cudaErrorInvalidConfiguration;
    mock_cuda.hold_events = true;
    unsigned syncs = mock_cuda.stream_syncs, records = mock_cuda.event_records;
    assert_int_equal(vase__cuda_compact(cs, &stream_obj, &cc, true), K + LEN - N);
    assert_int_equal(mock_cuda.stream_syncs, syncs);
    assert_int_equal(mock_cuda.event_syncs, 0);
    assert_int_equal(mock_cuda.device_syncs, 0);
    assert_int_equal(mock_cuda.event_records, records + 1);
    assert_int_equal(mock_cuda.compacts_in_scratch, 2 * L);
    assert_int_equal(mock_cuda.last_error, cudaErrorInvalidConfiguration);

    /* Not reached until the device has run it; looking never waits. */
    assert_int_equal(vase__cuda_seq_reached(cs, VASE__CUDA_COMPACTED, false), 0);
    assert_int_equal(vase__cuda_seq_reached(cs, VASE__CUDA_COMPACTED, false), 0);
    assert_int_equal(mock_cuda.event_syncs, 0);
    mock_cuda_complete_events();
    assert_int_equal(vase__cuda_seq_reached(cs, VASE__CUDA_COMPACTED, false), 1);

    /* The other mark, for the engine's writes; waiting for it blocks (here: completes it). */
    assert_int_equal(vase__cuda_seq_mark(cs, &stream_obj, VASE__CUDA_WRITTEN), 0);
    assert_int_equal(vase__cuda_seq_reached(cs, VASE__CUDA_WRITTEN, false), 0);
    assert_int_equal(vase__cuda_seq_reached(cs, VASE__CUDA_WRITTEN, true), 1);
    assert_int_equal(mock_cuda.event_syncs, 1);
    assert_int_equal(mock_cuda.stream_syncs, syncs);
    assert_int_equal(mock_cuda.last_error, cudaErrorInvalidConfiguration);

    /* A failure of libvase's own call replaces the engine's pending error (the runtime keeps
     * one): it stays, so the engine still sees that something failed. With nothing pending
     * before, libvase's own failure is cleared. */
    mock_cuda.fail_stream_sync = true;
    assert_int_equal(vase__cuda_sync(0, &stream_obj), -EIO);
    assert_int_equal(mock_cuda.last_error, cudaErrorLaunchFailure);
    mock_cuda.last_error = cudaSuccess;
    assert_int_equal(vase__cuda_sync(0, &stream_obj), -EIO);
    assert_int_equal(mock_cuda.last_error, cudaSuccess);
    mock_cuda.fail_stream_sync = false;
    mock_cuda.last_error = cudaErrorInvalidConfiguration;
    assert_int_equal(vase__cuda_sync(0, &stream_obj), 0);
    assert_int_equal(mock_cuda.last_error, cudaErrorInvalidConfiguration);

    mock_cuda.hold_events = false;
    mock_cuda.last_error = cudaSuccess;
    assert_null(vase__cuda_seq_free(cs));
    arena_done(&a);
}

/* ---- the eviction cycle in stream order, against a daemon faked at the channel ---- */

/* What the fake daemon got, and what it answers: the plan of the last request at once, and
 * the commit's reply with the table cut to reply_pages pages. */
static struct fake_daemon {
    unsigned requests, commits, calls;
    uint32_t request_len, commit_round, commit_len;
    uint64_t next_id, request_id, commit_id;
    uint32_t seq_pages[8];
    uint32_t reply_pages;
} fake;

int __wrap_vase__chan_send(struct vase__chan *ch, Vase__Envelope *e, uint64_t *ret_request_id);
int __wrap_vase__chan_wait(struct vase__chan *ch, uint64_t request_id, int timeout_ms,
                           Vase__Envelope **ret);
int __wrap_vase__chan_drain(struct vase__chan *ch);
uint64_t __wrap_vase__chan_answered(const struct vase__chan *ch);
void __wrap_vase__chan_drop(struct vase__chan *ch, uint64_t request_id);
int __wrap_vase__chan_call(struct vase__chan *ch, Vase__Envelope *e,
                           Vase__Envelope__BodyCase expect, Vase__Envelope **ret);
bool __wrap_vase__session_closed(int session_fd);

int __wrap_vase__chan_send(struct vase__chan *ch, Vase__Envelope *e, uint64_t *ret_request_id) {
    (void)ch;
    uint64_t id = ++fake.next_id;
    if (e->body_case == VASE__ENVELOPE__BODY_EVICT_REQUEST) {
        fake.requests++;
        fake.request_len = e->evict_request->len;
        fake.request_id = id;
    } else if (e->body_case == VASE__ENVELOPE__BODY_EVICT_COMMIT) {
        fake.commits++;
        fake.commit_round = e->evict_commit->round;
        fake.commit_len = e->evict_commit->new_len;
        fake.commit_id = id;
    } else
        fail_msg("unexpected message %d", (int)e->body_case);
    if (ret_request_id)
        *ret_request_id = id;
    return 0;
}

int __wrap_vase__chan_wait(struct vase__chan *ch, uint64_t request_id, int timeout_ms,
                           Vase__Envelope **ret) {
    (void)ch;
    (void)timeout_ms;
    Vase__Envelope *e = malloc(sizeof(*e));
    assert_non_null(e);
    vase__envelope__init(e);
    if (request_id == fake.request_id && fake.request_id) {
        Vase__EvictPlan *p = malloc(sizeof(*p));
        assert_non_null(p);
        vase__evict_plan__init(p);
        p->seq_id = 7;
        p->round = 0;
        p->len = fake.request_len;
        p->n = fake.request_len - W;
        p->keep = K;
        e->body_case = VASE__ENVELOPE__BODY_EVICT_PLAN;
        e->evict_plan = p;
        fake.request_id = 0;
    } else if (request_id == fake.commit_id && fake.commit_id) {
        Vase__CommitReply *cr = malloc(sizeof(*cr));
        assert_non_null(cr);
        vase__commit_reply__init(cr);
        cr->seq_id = 7;
        cr->capacity = fake.reply_pages * B;
        cr->n_pages = fake.reply_pages;
        cr->pages = malloc(fake.reply_pages * sizeof(uint32_t));
        assert_non_null(cr->pages);
        memcpy(cr->pages, fake.seq_pages, fake.reply_pages * sizeof(uint32_t));
        e->body_case = VASE__ENVELOPE__BODY_COMMIT_REPLY;
        e->commit_reply = cr;
        fake.commit_id = 0;
    } else {
        free(e);
        fail_msg("a wait for request %llu, which was not sent", (unsigned long long)request_id);
    }
    *ret = e;
    return 0;
}

int __wrap_vase__chan_drain(struct vase__chan *ch) {
    (void)ch;
    return 0;
}

uint64_t __wrap_vase__chan_answered(const struct vase__chan *ch) {
    (void)ch;
    return fake.next_id;
}

void __wrap_vase__chan_drop(struct vase__chan *ch, uint64_t request_id) {
    (void)ch;
    (void)request_id;
}

/* CloseSeq, the only call: answered Ok. */
int __wrap_vase__chan_call(struct vase__chan *ch, Vase__Envelope *e,
                           Vase__Envelope__BodyCase expect, Vase__Envelope **ret) {
    (void)ch;
    assert_int_equal(e->body_case, VASE__ENVELOPE__BODY_CLOSE_SEQ);
    assert_int_equal(expect, VASE__ENVELOPE__BODY_OK);
    fake.calls++;
    Vase__Envelope *r = malloc(sizeof(*r));
    Vase__Ok *ok = malloc(sizeof(*ok));
    assert_non_null(r);
    assert_non_null(ok);
    vase__envelope__init(r);
    vase__ok__init(ok);
    r->body_case = VASE__ENVELOPE__BODY_OK;
    r->ok = ok;
    *ret = r;
    return 0;
}

bool __wrap_vase__session_closed(int session_fd) {
    (void)session_fd;
    return false;
}

static void test_cycle_stream_ordered(void **state) {
    (void)state;
    struct vase_client c = {.lock = PTHREAD_MUTEX_INITIALIZER, .timeout_ms = 1000};
    struct vase_model m = {.client = &c, .id = 1};
    struct vase__arena a;
    char stream_obj, msg[128];

    fake = (struct fake_daemon){.reply_pages = 6};
    c.chan = (struct vase__chan *)&fake; /* never looked into: the channel is faked */
    assert_int_equal(vase_layout_compute(&geometry, ARENA_BYTES, &m.layout, msg, sizeof(msg)), 0);
    ipc_arena(&a, 0, 0);
    assert_int_equal(vase__cuda_map(&a, 1, msg, sizeof(msg)), 0);
    m.arena = &a;

    /* A sequence as seq_from_layout() makes it: 8 pages (128 slots), the plan in plan page 30,
     * every plan keeping the first K candidates. */
    struct vase_seq *s = calloc(1, sizeof(*s));
    assert_non_null(s);
    *s = (struct vase_seq){.client = &c,
                           .model = &m,
                           .id = 7,
                           .policy = VASE_POLICY_STREAMING,
                           .mode = VASE_MODE_ASYNC,
                           .budget = BUDGET,
                           .min_budget = BUDGET,
                           .max_budget = BUDGET,
                           .window = W,
                           .keep = K,
                           .slack = W,
                           .capacity = 8 * B,
                           .n_pages = 8,
                           .max_pages = 8,
                           .n_plan_pages = 1};
    s->pages = malloc(8 * sizeof(uint32_t));
    s->plan_pages = malloc(sizeof(uint32_t));
    assert_non_null(s->pages);
    assert_non_null(s->plan_pages);
    for (uint32_t i = 0; i < 8; i++)
        s->pages[i] = fake.seq_pages[i] = 20 - 2 * i;
    s->plan_pages[0] = 30;
    assert_int_equal(vase_layout_plans(&m.layout, K, &s->plan, NULL, 0), 0);
    write_first_k_plans(&s->plan, s->plan_pages);
    size_t scratch = vase_compact_cuda_scratch_bytes(HKV, D * sizeof(float), 8 * B, 8 * B);
    assert_int_equal(
        vase__cuda_seq_new(a.mapping, s->pages, 8, 8, (size_t)HKV * K, scratch, &s->cuda), 0);
    c.seqs = s;
    assert_int_equal(vase_seq_set_stream(s, &stream_obj), 0);
    assert_int_equal(vase_seq_set_ordering(s, VASE_ORDER_STREAM), 0);
    assert_int_equal(vase_seq_set_ordering(s, (enum vase_ordering)2), -EINVAL);

    /* The device lags behind the host from here on; the engine has a launch error pending. */
    mock_cuda.hold_events = true;
    mock_cuda.last_error = cudaErrorInvalidConfiguration;
    unsigned syncs = mock_cuda.stream_syncs;

    /* 80 tokens fire the trigger: the request waits for the engine's writes to run. */
    assert_int_equal(vase_seq_append(s, 5 * W), 0);
    assert_int_equal(fake.requests, 0);
    assert_int_equal(vase_seq_poll(s), 0);
    assert_int_equal(fake.requests, 0);
    /* Its draws are its own now. */
    float draw = 1.0f;
    assert_int_equal(vase_seq_set_draws(s, &draw, 1, NULL, 0), -EBUSY);

    /* Once the stream has run them, the next call sends it, and the plan (there at once) is
     * applied: the compaction enqueued, the commit held back until it has run. */
    mock_cuda_complete_events();
    assert_int_equal(vase_seq_poll(s), 1);
    assert_int_equal(fake.requests, 1);
    assert_int_equal(fake.request_len, 5 * W);
    assert_int_equal(mock_cuda.compacts_in_scratch, 2 * L);
    assert_int_equal(vase_seq_len(s), K + W);
    assert_int_equal(fake.commits, 0);
    /* The commit will release pages (6 kept of 8): the engine may no longer use them. */
    assert_int_equal(vase_seq_capacity(s), 6 * B);
    assert_int_equal(vase_seq_poll(s), 0);
    assert_int_equal(vase_seq_append(s, 1), 0);
    assert_int_equal(fake.commits, 0);

    /* Compaction done on the device: the commit goes, with the compacted length (not the
     * length the engine has reached since), and its reply is taken (pages were released). */
    mock_cuda_complete_events();
    assert_int_equal(vase_seq_poll(s), 0);
    assert_int_equal(fake.commits, 1);
    assert_int_equal(fake.commit_len, K + W);
    assert_int_equal(vase_seq_capacity(s), 6 * B);
    assert_false(s->commit_pending);
    assert_int_equal(s->n_pages, 6);

    /* Not once did libvase wait for the device or touch the engine's pending error. */
    assert_int_equal(mock_cuda.stream_syncs, syncs);
    assert_int_equal(mock_cuda.event_syncs, 0);
    assert_int_equal(mock_cuda.device_syncs, 0);
    assert_int_equal(mock_cuda.last_error, cudaErrorInvalidConfiguration);

    /* A close with a compaction still queued waits for that event, then frees the memory on
     * the stream. (The next trigger, at 96: compaction of the second round.) */
    assert_int_equal(vase_seq_append(s, W - 1), 0);
    assert_int_equal(fake.requests, 1); /* queued */
    mock_cuda_complete_events();
    fake.reply_pages = 6;
    assert_int_equal(vase_seq_poll(s), 1);
    assert_int_equal(fake.requests, 2);
    assert_int_equal(fake.commits, 1);
    assert_int_equal(vase_seq_close(s), 0);
    assert_int_equal(mock_cuda.event_syncs, 1);
    assert_int_equal(fake.calls, 1);
    assert_int_equal(mock_cuda.async_frees, 1);
    assert_ptr_equal(mock_cuda.last_async_free_stream, &stream_obj);
    assert_int_equal(mock_cuda_live_events(), 0);

    mock_cuda.hold_events = false;
    mock_cuda.last_error = cudaSuccess;
    arena_done(&a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_ipc_once_per_process, setup, teardown),
        cmocka_unit_test_setup_teardown(test_vmm_import, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unmap_before_session_closes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_and_copy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_compact, setup, teardown),
        cmocka_unit_test_setup_teardown(test_seq_memory_without_pools, setup, teardown),
        cmocka_unit_test_setup_teardown(test_seq_table_grows, setup, teardown),
        cmocka_unit_test_setup_teardown(test_compact_stream_ordered, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cycle_stream_ordered, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
