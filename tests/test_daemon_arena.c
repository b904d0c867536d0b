/* SPDX-License-Identifier: MIT */

/* Unit tests of daemon/core/arena.c: the host backend's memfd, its seals and mappings, the syntax
 * of arena specs, the stamp page past a host arena and the adoption of a kept memfd, and the
 * refusal of CUDA arenas in a build without CUDA (the CUDA backends themselves:
 * test_daemon_cuda_arena.c; which planner an arena's runs go to: test_daemon_planner.c). It links
 * the core layer of vased alone.
 */

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "../daemon/core/arena.h"
#include "../daemon/core/log.h"

static void test_host(void **state) {
    (void)state;
    struct vase_arena *a = NULL;
    int fd;
    assert_int_equal(vase_arena_new(3, "host", VASE_CUDA_SHARE_IPC, 1 << 20, 64 << 10, &a), 0);
    assert_non_null(a);
    assert_int_equal(a->id, 3);
    assert_string_equal(a->kind, "host");
    assert_string_equal(a->ops->share, "memfd");
    assert_int_equal(a->granule_bytes, 64 << 10);
    assert_int_equal(a->num_granules, 16);
    assert_int_equal(a->size, 1 << 20);
    assert_non_null(a->map);
    /* Host memory: the CPU plans over it (test_daemon_planner). */
    assert_false(vase_arena_on_device(a));

    assert_int_equal(a->ops->export_fd(a, &fd), 0);
    assert_int_equal(fd, a->fd);
    assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    int seals = fcntl(fd, F_GET_SEALS);
    assert_true(seals >= 0);
    assert_true(seals & F_SEAL_SHRINK);
    assert_true(seals & F_SEAL_GROW);
    assert_true(seals & F_SEAL_SEAL);
    assert_false(seals & F_SEAL_WRITE);
    /* The size cannot change, and no one can add or remove seals. */
    assert_int_equal(ftruncate(fd, 4096), -1);
    assert_int_equal(errno, EPERM);
    assert_int_equal(ftruncate(fd, 2 << 20), -1);
    assert_int_equal(errno, EPERM);
    assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), -1);
    assert_int_equal(errno, EPERM);

    /* A client's mapping of the exported fd sees the daemon's writes, and the other way. */
    char *client = mmap(NULL, a->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(client != MAP_FAILED);
    /* Offsets are bytes, not granules: page 5 of a model with pages of 12288 bytes. */
    char *page5 = vase_arena_at(a, 5 * 12288);
    assert_ptr_equal(page5, (char *)a->map + 5 * 12288);
    memcpy(page5, "plan", 5);
    assert_string_equal(client + 5 * 12288, "plan");
    assert_ptr_equal(vase_arena_at(a, 0), a->map);
    memcpy(client + 7, "kv", 3);
    assert_string_equal((char *)a->map + 7, "kv");
    munmap(client, a->size);

    assert_null(vase_arena_free(a));
    assert_null(vase_arena_free(NULL));
}

/* The stamp page: past the arena, in no mapping; written, read back, cleared. A kept memfd is
 * adopted only with its size and seals. */
static void test_stamp(void **state) {
    (void)state;
    struct vase_arena *a = NULL, *b = NULL;
    struct vase_arena_stamp got, st = {.arena_id = 3, .incarnation = 0x1234};
    struct stat sb;
    memset(st.stop_id, 0x77, sizeof(st.stop_id));
    assert_int_equal(vase_arena_new(3, "host", VASE_CUDA_SHARE_IPC, 1 << 20, 64 << 10, &a), 0);
    assert_int_equal(fstat(a->fd, &sb), 0);
    assert_int_equal(sb.st_size, (1 << 20) + VASE_ARENA_STAMP_PAGE);
    assert_int_equal(vase_arena_read_stamp(a, &got), -ENOMSG);
    assert_int_equal(vase_arena_write_stamp(a, &st), 0);
    assert_int_equal(vase_arena_read_stamp(a, &got), 0);
    assert_int_equal(got.arena_id, 3);
    assert_int_equal(got.incarnation, 0x1234);
    assert_memory_equal(got.stop_id, st.stop_id, sizeof(st.stop_id));
    /* Not in the arena's bytes. */
    const uint8_t *end = (const uint8_t *)a->map + a->size - 64;
    for (int i = 0; i < 64; i++)
        assert_int_equal(end[i], 0);

    /* Adopted with its stamp; a memfd of the arena's size alone (no stamp page) is not. */
    int fd = fcntl(a->fd, F_DUPFD_CLOEXEC, 0);
    assert_true(fd >= 0);
    assert_int_equal(vase_arena_adopt_host(3, fd, 1 << 20, 64 << 10, &b), 0);
    assert_int_equal(vase_arena_read_stamp(b, &got), 0);
    assert_int_equal(vase_arena_clear_stamp(b), 0);
    assert_int_equal(vase_arena_read_stamp(a, &got), -ENOMSG);
    b = vase_arena_free(b);
    int plain = memfd_create("plain", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_true(plain >= 0);
    assert_int_equal(ftruncate(plain, 1 << 20), 0);
    assert_int_equal(fcntl(plain, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
    assert_int_equal(vase_arena_adopt_host(3, plain, 1 << 20, 64 << 10, &b), -EMEDIUMTYPE);
    assert_null(b);
    close(plain);
    a = vase_arena_free(a);
}

static void test_refusals(void **state) {
    (void)state;
    struct vase_arena *a = NULL;
    assert_int_equal(vase_arena_new(0, "gpu", VASE_CUDA_SHARE_IPC, 1 << 20, 64 << 10, &a), -EINVAL);
    assert_int_equal(vase_arena_new(0, "", VASE_CUDA_SHARE_IPC, 1 << 20, 64 << 10, &a), -EINVAL);
    assert_int_equal(vase_arena_new(0, NULL, VASE_CUDA_SHARE_IPC, 1 << 20, 64 << 10, &a), -EINVAL);
    /* Granules must be 4 KiB multiples and divide the size. */
    assert_int_equal(vase_arena_new(0, "host", VASE_CUDA_SHARE_IPC, 1 << 20, 1000, &a), -EINVAL);
    assert_int_equal(vase_arena_new(0, "host", VASE_CUDA_SHARE_IPC, 1 << 20, 2048, &a), -EINVAL);
    assert_int_equal(vase_arena_new(0, "host", VASE_CUDA_SHARE_IPC, (1 << 20) + 4096, 64 << 10, &a),
                     -EINVAL);
    assert_int_equal(vase_arena_new(0, "host", VASE_CUDA_SHARE_IPC, 0, 64 << 10, &a), -EINVAL);
    assert_null(a);
}

/* CUDA specs are checked the same way in every build, before any backend runs. */
static void test_cuda_spec_syntax(void **state) {
    (void)state;
    static const char *const bad[] = {
        "cuda:",
        "cuda:-1",
        "cuda:+1",
        "cuda:x",
        "cuda:12345",
        "cuda:0x1",
        "cuda: 0",
        "cuda:GPU-",
        "cuda:GPU-0123456789-abcd-ef01-2345-6789abcdef01", /* wrong grouping */
        "cuda:GPU-01234567-89ab-cdef-0123-456789abcdeg",   /* not hex */
        "cuda:GPU-01234567-89ab-cdef-0123-456789abcdef0",  /* too long */
        "cuda:MIG-01234567-89ab-cdef-0123-456789abcdef",
    };
    struct vase_arena *a = NULL;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(vase_arena_new(0, bad[i], VASE_CUDA_SHARE_IPC, 1 << 20, 64 << 10, &a),
                         -EINVAL);
    assert_int_equal(vase_arena_new(0, "cuda:0", (enum vase_cuda_share)7, 1 << 20, 64 << 10, &a),
                     -EINVAL);
    assert_null(a);

    enum vase_cuda_share share;
    assert_int_equal(vase_cuda_share_from_string("ipc", &share), 0);
    assert_int_equal(share, VASE_CUDA_SHARE_IPC);
    assert_int_equal(vase_cuda_share_from_string("vmm", &share), 0);
    assert_int_equal(share, VASE_CUDA_SHARE_VMM);
    assert_int_equal(vase_cuda_share_from_string("VMM", &share), -EINVAL);
    assert_int_equal(vase_cuda_share_from_string("", &share), -EINVAL);
    assert_int_equal(vase_cuda_share_from_string(NULL, &share), -EINVAL);
}

/* Without CUDA every well-formed CUDA arena is refused as unsupported, whatever the sharing;
 * with CUDA, test_daemon_cuda_arena runs the backends against a fake runtime instead. */
static void test_cuda_refused_without_cuda(void **state) {
    (void)state;
    static const char *const good[] = {"cuda:0", "cuda:1",
                                       "cuda:GPU-01234567-89ab-cdef-0123-456789ABCDEF"};
    struct vase_arena *a = NULL;
    if (vase_arena_have_cuda) {
        print_message("This build has CUDA: its backends are tested by test_daemon_cuda_arena.\n");
        assert_true(vase_arena_cuda_ipc_ops.on_device);
        return;
    }
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        assert_int_equal(vase_arena_new(0, good[i], VASE_CUDA_SHARE_IPC, 1 << 20, 64 << 10, &a),
                         -EOPNOTSUPP);
        assert_int_equal(vase_arena_new(0, good[i], VASE_CUDA_SHARE_VMM, 1 << 20, 64 << 10, &a),
                         -EOPNOTSUPP);
    }
    assert_null(a);
    assert_string_equal(vase_arena_cuda_ipc_ops.share, "cuda-ipc");
    assert_string_equal(vase_arena_cuda_vmm_ops.share, "cuda-vmm");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host),
        cmocka_unit_test(test_stamp),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_cuda_spec_syntax),
        cmocka_unit_test(test_cuda_refused_without_cuda),
    };
    vase_log_set_max_level(LOG_EMERG);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
