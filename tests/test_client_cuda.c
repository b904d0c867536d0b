/* SPDX-License-Identifier: MIT */

/*
 * Unit tests of client/cuda.c (and the device side of client/session.c) against the fake CUDA
 * of tests/mock_cuda.c (no GPU, no libcudart): a device arena is opened once per process and
 * daemon incarnation however many clients map it, closed with the last of them and before the
 * session socket, found by UUID whatever the ordinals, refused with an exact -errno and a
 * sentence when it cannot be used; a cuda-vmm fd crosses a socket with SCM_RIGHTS and is
 * imported, then closed; compaction on the engine's stream equals the CPU's and is complete
 * (the stream synchronised) before the call returns; the caller's current device is restored.
 * close() is wrapped to see when the session socket closes.
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

#include "../client/cuda_arena.h"
#include "../client/session.h"
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
    d->bytes = 2u << 20; /* ARENA_BYTES rounded up to the granularity */
    assert_int_equal(create(&d->h, d->bytes, &prop, 0), CUDA_SUCCESS);
    assert_int_equal(export_handle(&d->fd, d->h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                     CUDA_SUCCESS);
    assert_int_equal(reserve(&d->va, d->bytes, d->bytes, 0, 0), CUDA_SUCCESS);
    assert_int_equal(map(d->va, d->bytes, 0, d->h, 0), CUDA_SUCCESS);
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
    assert_int_equal(vase__cuda_map(&a, 5, msg, sizeof(msg)), 0);
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

static void test_compact(void **state) {
    (void)state;
    const struct vase_layout_geometry g = {.layers = L,
                                           .q_heads = HQ,
                                           .kv_heads = HKV,
                                           .head_dim = D,
                                           .dtype = VASE_DTYPE_F32,
                                           .block_tokens = B};
    struct vase_layout lay;
    struct vase_plan_layout plan;
    struct vase__cuda_seq *cs = NULL;
    struct vase__arena a;
    uint32_t pages[8], plan_pages[1] = {30}, keep[HKV * K];
    char stream_obj, msg[128];

    /* Pages of 16 * 2 * 2 * 2 * 8 * 4 = 4096 bytes: 8 blocks for 128 slots, 512 in the arena. */
    assert_int_equal(vase_layout_compute(&g, ARENA_BYTES, &lay, msg, sizeof(msg)), 0);
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

    /* The block table goes to the device once, at the open, and is the host's. */
    assert_int_equal(vase__cuda_seq_new(0, pages, n_pages, (size_t)HKV * K, &cs), 0);
    assert_int_equal(mock_cuda.copies_h2d, 1);
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
    assert_int_equal(vase__cuda_compact(cs, &stream_obj, &cc), want);
    assert_memory_equal(daemon_ipc_base, host, ARENA_BYTES);
    /* Per layer one merged copy of its lists, two kernels; no block table copied again; then
     * a wait on the engine's stream. */
    assert_int_equal(mock_cuda.copies_d2d, L);
    assert_int_equal(mock_cuda.compacts, 2 * L);
    assert_int_equal(mock_cuda.copies_h2d, 1);
    assert_int_equal(mock_cuda.stream_syncs, syncs + 1);
    assert_ptr_equal(mock_cuda.last_synced_stream, &stream_obj);

    /* A table that lost its tail (a commit after a long prompt) still compacts through the
     * device copy's first entries. */
    cc.n_pages = 4;
    cc.len = 64;
    cc.n = 56; /* above every kept candidate (53 at most) */
    assert_int_equal(vase__cuda_compact(cs, &stream_obj, &cc), K + 8);
    assert_int_equal(mock_cuda.copies_h2d, 1);
    cc.n_pages = n_pages;
    cc.len = LEN;
    cc.n = N;

    /* Arguments the device state cannot hold, and a failing stream. */
    cc.n_pages = n_pages + 1;
    assert_int_equal(vase__cuda_compact(cs, &stream_obj, &cc), -EPROTO);
    cc.n_pages = n_pages;
    cc.keep = K + 1;
    assert_int_equal(vase__cuda_compact(cs, &stream_obj, &cc), -EPROTO);
    cc.keep = K;
    cc.n = LEN + 1;
    assert_int_equal(vase__cuda_compact(cs, &stream_obj, &cc), -EPROTO);
    cc.n = N;
    mock_cuda.fail_stream_sync = true;
    assert_int_equal(vase__cuda_compact(cs, &stream_obj, &cc), -EIO);
    mock_cuda.fail_stream_sync = false;

    assert_null(vase__cuda_seq_free(cs));
    assert_null(vase__cuda_seq_free(NULL));
    mock_cuda.fail_malloc = true;
    cs = NULL;
    assert_int_equal(vase__cuda_seq_new(0, pages, n_pages, (size_t)HKV * K, &cs), -ENOMEM);
    assert_null(cs);
    mock_cuda.fail_malloc = false;
    assert_int_equal(vase__cuda_seq_new(0, pages, n_pages, 0, &cs), -EINVAL);
    assert_int_equal(vase__cuda_seq_new(0, NULL, n_pages, 1, &cs), -EINVAL);
    assert_int_equal(vase__cuda_seq_new(0, pages, n_pages, 1, NULL), -EINVAL);
    assert_null(cs);
    free(host);
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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
