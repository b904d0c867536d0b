/* SPDX-License-Identifier: MIT */

/*
 * Unit tests of daemon/core/arena_cuda.c against the fake CUDA of tests/mock_cuda.c (no GPU, no
 * libcudart): device selection by ordinal and UUID, compute-mode and device refusals, the
 * cuda-ipc allocation and handle, the cuda-vmm allocation, its fd and an SCM_RIGHTS round trip
 * to an importer, unwinding after each injected failure (exact -errno, a message naming the
 * problem, nothing left allocated), memory freed only by vase_arena_free(), and that every CUDA
 * arena is planned by the CUDA planner (tested by test_daemon_cuda_planner). Last, the real
 * vased must refuse a CUDA arena it cannot have.
 */

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include <cmocka.h>

#include "vased_path.h"
#include "../daemon/core/alloc.h"
#include "../daemon/core/arena.h"
#include "../daemon/core/log.h"
#include "../daemon/plan/planner.h"
#include "../daemon/core/registry.h"
#include "../daemon/core/session.h"
#include "log_capture.h"
#include "mock_cuda.h"
#include "wire.h"

#define ARENA_BYTES (3u << 20)
#define GRANULE_BYTES (64u << 10)
/* An offset that is no multiple of a granule: page 5 of a model with pages of 12288 bytes. */
#define PAGE5 (5u * 12288u)

/* vase_arena_new() must fail with err and log a line holding want. */
static void expect_refusal(const char *spec, enum vase_cuda_share share, int err,
                           const char *want) {
    struct vase_arena *a = NULL;
    log_capture_begin();
    int r = vase_arena_new(0, spec, share, ARENA_BYTES, GRANULE_BYTES, &a);
    const char *log = log_capture_end();
    if (r != err || !strstr(log, want))
        print_error("%s: got %d, log \"%s\"; want %d and \"%s\"\n", spec, r, log, err, want);
    assert_int_equal(r, err);
    assert_non_null(strstr(log, want));
    assert_null(a);
    /* Whatever failed, nothing stays allocated or mapped. */
    assert_int_equal(mock_cuda_live_allocations(), 0);
    assert_int_equal(mock_cuda_live_mappings(), 0);
}

static int reset(void **state) {
    (void)state;
    mock_cuda_reset();
    return 0;
}

static int check_nothing_left(void **state) {
    (void)state;
    assert_int_equal(mock_cuda_live_allocations(), 0);
    assert_int_equal(mock_cuda_live_mappings(), 0);
    return 0;
}

/* ---- cuda-ipc ---- */

static void test_ipc_create(void **state) {
    (void)state;
    struct vase_arena *a = NULL;
    int fd = 7;

    assert_int_equal(
        vase_arena_new(2, "cuda:0", VASE_CUDA_SHARE_IPC, ARENA_BYTES, GRANULE_BYTES, &a), 0);
    assert_string_equal(a->ops->share, "cuda-ipc");
    assert_true(vase_arena_on_device(a));
    assert_ptr_equal(vase_planner_for(a), &vase_planner_cuda_ops);
    assert_int_equal(a->device, 0);
    assert_string_equal(a->device_uuid, "GPU-10111213-1415-1617-1819-1a1b1c1d1e1f");
    assert_int_equal(a->granule_bytes, GRANULE_BYTES);
    assert_int_equal(a->num_granules, ARENA_BYTES / GRANULE_BYTES);
    assert_non_null(a->map);
    assert_int_equal(a->fd, -1);
    /* Shared by handle: no fd rides on the welcome. */
    assert_int_equal(a->ops->export_fd(a, &fd), -EBADF);
    assert_int_equal(fd, 7);
    /* One plain allocation, cleared, and a handle of its base. */
    assert_int_equal(mock_cuda.mallocs, 1);
    assert_int_equal(mock_cuda.memsets, 1);
    assert_int_equal(mock_cuda.ipc_gets, 1);
    assert_int_equal(a->ipc_handle_len, sizeof(cudaIpcMemHandle_t));
    assert_int_equal(mock_cuda.current_device, 0);

    /* An importer's mapping of the handle sees the daemon's writes at the same offsets. */
    cudaIpcMemHandle_t h;
    void *client = NULL;
    memcpy(&h, a->ipc_handle, sizeof(h));
    assert_int_equal(cudaIpcOpenMemHandle(&client, h, cudaIpcMemLazyEnablePeerAccess), cudaSuccess);
    assert_ptr_not_equal(client, a->map);
    assert_ptr_equal(vase_arena_at(a, PAGE5), (char *)a->map + PAGE5);
    memcpy(vase_arena_at(a, PAGE5), "plan", 5);
    assert_string_equal((char *)client + PAGE5, "plan");
    assert_int_equal(cudaIpcCloseMemHandle(client), cudaSuccess);

    /* Memory is freed by vase_arena_free() and nothing else. */
    assert_int_equal(mock_cuda.frees, 0);
    assert_null(vase_arena_free(a));
    assert_int_equal(mock_cuda.frees, 1);
}

static void test_select_by_uuid(void **state) {
    (void)state;
    struct vase_arena *a = NULL;
    mock_cuda.device_count = 3;

    /* Upper case as some tools print it; device 1 of 3. */
    assert_int_equal(vase_arena_new(0, "cuda:GPU-20212223-2425-2627-2829-2A2B2C2D2E2F",
                                    VASE_CUDA_SHARE_IPC, ARENA_BYTES, GRANULE_BYTES, &a),
                     0);
    assert_int_equal(a->device, 1);
    assert_string_equal(a->device_uuid, "GPU-20212223-2425-2627-2829-2a2b2c2d2e2f");
    assert_int_equal(mock_cuda.current_device, 1);
    a = vase_arena_free(a);

    assert_int_equal(
        vase_arena_new(0, "cuda:2", VASE_CUDA_SHARE_IPC, ARENA_BYTES, GRANULE_BYTES, &a), 0);
    assert_int_equal(a->device, 2);
    assert_string_equal(a->device_uuid, "GPU-30313233-3435-3637-3839-3a3b3c3d3e3f");
    vase_arena_free(a);
}

static void test_device_refusals(void **state) {
    (void)state;
    static const enum vase_cuda_share shares[] = {VASE_CUDA_SHARE_IPC, VASE_CUDA_SHARE_VMM};

    for (size_t i = 0; i < 2; i++) {
        enum vase_cuda_share s = shares[i];
        mock_cuda_reset();
        mock_cuda.count_error = cudaErrorInsufficientDriver;
        expect_refusal("cuda:0", s, -ENODEV, "no usable CUDA device");
        assert_int_equal(mock_cuda.driver_probes, 1);
        /* No driver installed: the library and what to install are named. */
        mock_cuda.driver_missing = true;
        expect_refusal("cuda:0", s, -ENODEV,
                       "the NVIDIA driver's library libcuda.so.1 cannot be loaded");
        expect_refusal("cuda:0", s, -ENODEV, "(Debian: nvidia-driver, from non-free");
        mock_cuda.driver_missing = false;
        mock_cuda.count_error = cudaSuccess;
        mock_cuda.device_count = 0;
        expect_refusal("cuda:0", s, -ENODEV, "no usable CUDA device");
        mock_cuda.device_count = 2;
        expect_refusal("cuda:2", s, -ENODEV, "no CUDA device 2 (this machine has 2)");
        expect_refusal("cuda:GPU-00000000-0000-0000-0000-000000000000", s, -ENODEV,
                       "no CUDA device with UUID GPU-00000000-0000-0000-0000-000000000000");
        mock_cuda.compute_mode[1] = cudaComputeModeExclusiveProcess;
        expect_refusal("cuda:1", s, -EBUSY, "exclusive compute mode");
        mock_cuda.compute_mode[1] = cudaComputeModeProhibited;
        expect_refusal("cuda:GPU-20212223-2425-2627-2829-2a2b2c2d2e2f", s, -EBUSY,
                       "compute mode Prohibited");
    }
    assert_int_equal(mock_cuda.mallocs + mock_cuda.mem_creates, 0);
}

static void test_ipc_failures(void **state) {
    (void)state;
    mock_cuda.fail_malloc = true;
    expect_refusal("cuda:0", VASE_CUDA_SHARE_IPC, -ENOMEM, "cannot allocate 3145728 bytes");
    mock_cuda.fail_malloc = false;
    mock_cuda.fail_ipc_get = true;
    expect_refusal("cuda:0", VASE_CUDA_SHARE_IPC, -EIO, "cudaIpcGetMemHandle() failed");
    /* The allocation made before the failure was freed. */
    assert_int_equal(mock_cuda.mallocs, 1);
    assert_int_equal(mock_cuda.frees, 1);
}

/* ---- cuda-vmm ---- */

static void *driver_entry(const char *name) {
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q;
    assert_int_equal(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q),
                     cudaSuccess);
    assert_int_equal(q, cudaDriverEntryPointSuccess);
    return fn;
}

/* Receives one packet and the one fd riding on it. */
static int recv_fd(int sock) {
    char buf[4096];
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } control;
    struct iovec iov = {.iov_base = buf, .iov_len = sizeof(buf)};
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = control.buf,
                         .msg_controllen = sizeof(control.buf)};
    int fd = -1;
    assert_true(recvmsg(sock, &msg, MSG_CMSG_CLOEXEC) > 0);
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
            memcpy(&fd, CMSG_DATA(c), sizeof(int));
    return fd;
}

static void test_vmm_create_and_pass_fd(void **state) {
    (void)state;
    struct vase_arena *a = NULL;
    struct stat st_daemon, st_client;
    int fd, sv[2];

    assert_int_equal(
        vase_arena_new(0, "cuda:0", VASE_CUDA_SHARE_VMM, ARENA_BYTES, GRANULE_BYTES, &a), 0);
    assert_string_equal(a->ops->share, "cuda-vmm");
    assert_true(vase_arena_on_device(a));
    assert_ptr_equal(vase_planner_for(a), &vase_planner_cuda_ops);
    assert_int_equal(a->ipc_handle_len, 0);
    /* One allocation rounded up to the 2 MiB granularity, reserved, mapped and made accessible
     * for the daemon, cleared, exported once as a close-on-exec fd. */
    assert_int_equal(mock_cuda.mem_creates, 1);
    assert_int_equal(mock_cuda.reserves, 1);
    assert_int_equal(mock_cuda.maps, 1);
    assert_int_equal(mock_cuda.set_accesses, 1);
    assert_int_equal(mock_cuda.memsets, 1);
    assert_int_equal(mock_cuda.exports, 1);
    assert_int_equal(mock_cuda.mallocs, 0);
    assert_int_equal(a->ops->export_fd(a, &fd), 0);
    assert_int_equal(fd, a->fd);
    assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    assert_int_equal(fstat(fd, &st_daemon), 0);
    assert_int_equal(st_daemon.st_size, 4u << 20);

    /* The fd goes out on a session packet, as the welcome carries it... */
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    Vase__Ping ping = VASE__PING__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    e.version = VASE_WIRE_VERSION;
    e.body_case = VASE__ENVELOPE__BODY_PING;
    e.ping = &ping;
    assert_int_equal(vase_session_send(sv[0], &e, &fd, 1), 0);
    /* ...and arrives as another fd of the same allocation. */
    int got = recv_fd(sv[1]);
    assert_true(got >= 0);
    assert_int_not_equal(got, fd);
    assert_int_equal(fstat(got, &st_client), 0);
    assert_int_equal(st_client.st_ino, st_daemon.st_ino);
    assert_int_equal(st_client.st_dev, st_daemon.st_dev);

    /* An importer maps it and shares the daemon's bytes. */
    CUresult (*import)(CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType) =
        driver_entry("cuMemImportFromShareableHandle");
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long) =
        driver_entry("cuMemAddressReserve");
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) =
        driver_entry("cuMemMap");
    CUresult (*unmap)(CUdeviceptr, size_t) = driver_entry("cuMemUnmap");
    CUresult (*address_free)(CUdeviceptr, size_t) = driver_entry("cuMemAddressFree");
    CUresult (*release)(CUmemGenericAllocationHandle) = driver_entry("cuMemRelease");
    CUmemGenericAllocationHandle h;
    CUdeviceptr va;
    assert_int_equal(import(&h, (void *)(intptr_t)got, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                     CUDA_SUCCESS);
    close(got);
    assert_int_equal(reserve(&va, 4u << 20, 2u << 20, 0, 0), CUDA_SUCCESS);
    assert_int_equal(map(va, 4u << 20, 0, h, 0), CUDA_SUCCESS);
    assert_int_equal(release(h), CUDA_SUCCESS);
    memcpy(vase_arena_at(a, 9 * GRANULE_BYTES + 40), "keep", 5);
    assert_string_equal((char *)(uintptr_t)va + 9 * GRANULE_BYTES + 40, "keep");

    /* The daemon frees at teardown; the importer's mapping keeps the memory until it goes. */
    assert_int_equal(mock_cuda.mem_releases, 1);
    assert_null(vase_arena_free(a));
    assert_int_equal(mock_cuda.unmaps, 1);
    assert_int_equal(mock_cuda.address_frees, 1);
    assert_int_equal(mock_cuda.mem_releases, 2);
    assert_int_equal(mock_cuda_live_allocations(), 1);
    assert_string_equal((char *)(uintptr_t)va + 9 * GRANULE_BYTES + 40, "keep");
    assert_int_equal(unmap(va, 4u << 20), CUDA_SUCCESS);
    assert_int_equal(address_free(va, 4u << 20), CUDA_SUCCESS);
    assert_int_equal(mock_cuda_live_allocations(), 0);
    close(sv[0]);
    close(sv[1]);
}

static void test_vmm_failures(void **state) {
    (void)state;
    mock_cuda.no_symbols = true;
    expect_refusal("cuda:0", VASE_CUDA_SHARE_VMM, -EOPNOTSUPP,
                   "the CUDA driver does not provide cuMemGetAllocationGranularity");
    mock_cuda.no_symbols = false;
    mock_cuda.entry_error = cudaErrorInsufficientDriver;
    expect_refusal("cuda:0", VASE_CUDA_SHARE_VMM, -ENODEV, "cannot reach the CUDA driver");
    mock_cuda.entry_error = cudaSuccess;
    mock_cuda.fail_mem_create = true;
    expect_refusal("cuda:0", VASE_CUDA_SHARE_VMM, -ENOMEM, "cuMemCreate() failed");
    mock_cuda.fail_mem_create = false;
    mock_cuda.fail_mem_map = true;
    expect_refusal("cuda:0", VASE_CUDA_SHARE_VMM, -EIO, "cuMemMap() failed");
    /* Made, reserved, then unwound: the reservation freed and the handle released. */
    assert_int_equal(mock_cuda.mem_creates, 1);
    assert_int_equal(mock_cuda.reserves, 1);
    assert_int_equal(mock_cuda.address_frees, 1);
    assert_int_equal(mock_cuda.mem_releases, 1);
    assert_int_equal(mock_cuda.exports, 0);
}

/* ---- the real vased ---- */

/* Runs build/vased with args in a fresh runtime directory; its exit status and stderr. */
static int run_vased(const char *arena, const char *share, char *out, size_t out_len) {
    char vased[4096], dir[] = "/tmp/vase-cuda-test-XXXXXX", rt[4200], ar[256], sh[64];
    int pipefd[2], status;

    if (test_vased_path(vased, sizeof(vased)) < 0)
        fail_msg("VASE_BUILD_DIR is not set and this program is not in BUILD/tests/");
    assert_non_null(mkdtemp(dir));
    snprintf(rt, sizeof(rt), "--runtime-dir=%s", dir);
    snprintf(ar, sizeof(ar), "--arena=%s", arena);
    snprintf(sh, sizeof(sh), "--cuda-share=%s", share);
    assert_int_equal(pipe2(pipefd, O_CLOEXEC), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(pipefd[1], STDERR_FILENO);
        dup2(pipefd[1], STDOUT_FILENO);
        execl(vased, vased, "--config=/dev/null", rt, ar, sh, "--arena-bytes=64M",
              "--metrics-address=off", (char *)NULL);
        _exit(127);
    }
    close(pipefd[1]);
    size_t n = 0;
    ssize_t k;
    while (n + 1 < out_len && (k = read(pipefd[0], out + n, out_len - 1 - n)) > 0)
        n += (size_t)k;
    out[n] = '\0';
    close(pipefd[0]);
    /* A vased that started after all must not outlive the test. */
    alarm(20);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    alarm(0);
    rmdir(dir);
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}

static bool have_nvidia_gpu(void) {
    return access("/dev/nvidiactl", F_OK) == 0 || access("/proc/driver/nvidia/gpus", F_OK) == 0;
}

static void test_vased_refuses(void **state) {
    (void)state;
    char out[4096];

    /* A device no machine has: refused everywhere, naming it. */
    assert_int_equal(
        run_vased("cuda:GPU-00000000-0000-0000-0000-000000000000", "ipc", out, sizeof(out)), 1);
    assert_non_null(strstr(out, "Arena \"cuda:GPU-00000000-0000-0000-0000-000000000000\""));
    assert_non_null(strstr(out, "CUDA device"));
    assert_int_equal(run_vased("cuda:GPU-nope", "vmm", out, sizeof(out)), 1);
    assert_non_null(strstr(out, "Unknown arena \"cuda:GPU-nope\""));
    if (have_nvidia_gpu()) {
        print_message("An NVIDIA driver is present: cuda:0 is checked by tests/gpu.\n");
        return;
    }
    /* No GPU here: cuda:0 is refused with the reason, over both sharing paths. */
    assert_int_equal(run_vased("cuda:0", "ipc", out, sizeof(out)), 1);
    assert_non_null(strstr(out, "Arena \"cuda:0\": no usable CUDA device"));
    assert_int_equal(run_vased("cuda:0", "vmm", out, sizeof(out)), 1);
    assert_non_null(strstr(out, "Arena \"cuda:0\": no usable CUDA device"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_ipc_create, reset, check_nothing_left),
        cmocka_unit_test_setup_teardown(test_select_by_uuid, reset, check_nothing_left),
        cmocka_unit_test_setup_teardown(test_device_refusals, reset, check_nothing_left),
        cmocka_unit_test_setup_teardown(test_ipc_failures, reset, check_nothing_left),
        cmocka_unit_test_setup_teardown(test_vmm_create_and_pass_fd, reset, check_nothing_left),
        cmocka_unit_test_setup_teardown(test_vmm_failures, reset, check_nothing_left),
        cmocka_unit_test(test_vased_refuses),
    };
    vase_log_set_max_level(LOG_ERR);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
