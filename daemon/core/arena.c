/* SPDX-License-Identifier: MIT */

/*
 * The arena interface and the host backend. A host arena is a memfd sealed against shrinking
 * and growing, so that a client which maps it can never be made to fault by a truncate, and
 * sealed against further sealing so that no client can change that; the daemon maps it
 * MAP_SHARED and passes the fd to clients. The memory lives until the daemon frees the arena
 * at exit, after every session is gone (docs/ARCHITECTURE.md, "Memory that other processes
 * have mapped"). The memfd is one page longer than the arena: the stamp page (arena.h), which
 * neither the daemon's mapping nor a client's covers; the stamp is read and written with
 * pread/pwrite.
 *
 * vase_arena_new() checks the spec's syntax for every backend ("cuda:N", "cuda:GPU-<uuid>"), so
 * that a typo is the same error in builds with and without CUDA; the CUDA backend resolves the
 * device.
 */

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "arena.h"
#include "log.h"

/* Maps a memfd kept by systemd's fd store (vase_arena_adopt_host()): its size and seals must
 * be what host_create() made, or clients could be made to fault. */
static int host_adopt(struct vase_arena *a, int fd) {
    struct stat st;
    if (fstat(fd, &st) < 0)
        return -errno;
    int seals = fcntl(fd, F_GET_SEALS);
    int want = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
    if (!S_ISREG(st.st_mode) || seals < 0 || (seals & want) != want)
        return -EBADFD;
    if ((uint64_t)st.st_size != a->size + VASE_ARENA_STAMP_PAGE)
        return -EMEDIUMTYPE;
    void *map = mmap(NULL, a->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED)
        return -errno;
    a->fd = fd;
    a->map = map;
    return 0;
}

static int host_create(struct vase_arena *a) {
    char name[32];
    snprintf(name, sizeof(name), "vase-arena-%u", a->id);
    int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return log_error_errno(-errno, "Failed to create memfd for arena %u: %m", a->id);
    if (ftruncate(fd, (off_t)(a->size + VASE_ARENA_STAMP_PAGE)) < 0) {
        int r = log_error_errno(-errno, "Failed to size arena %u to %llu bytes: %m", a->id,
                                (unsigned long long)a->size);
        close(fd);
        return r;
    }
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
        int r = log_error_errno(-errno, "Failed to seal arena %u: %m", a->id);
        close(fd);
        return r;
    }
    void *map = mmap(NULL, a->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        int r = log_error_errno(-errno, "Failed to map arena %u: %m", a->id);
        close(fd);
        return r;
    }
    a->fd = fd;
    a->map = map;
    return 0;
}

static int host_export_fd(const struct vase_arena *a, int *ret_fd) {
    if (a->fd < 0)
        return -EBADF;
    *ret_fd = a->fd;
    return 0;
}

static void host_destroy(struct vase_arena *a) {
    if (a->map)
        munmap(a->map, a->size);
    a->map = NULL;
    if (a->fd >= 0)
        close(a->fd);
    a->fd = -1;
}

static int host_clear(struct vase_arena *a, uint64_t off, uint64_t len) {
    memset((char *)a->map + off, 0, (size_t)len);
    return 0;
}

const struct vase_arena_ops vase_arena_host_ops = {
    .share = "memfd",
    .create = host_create,
    .export_fd = host_export_fd,
    .destroy = host_destroy,
    .clear = host_clear,
};

void vase_arena_zero(void *arena, uint64_t off, uint64_t len) {
    struct vase_arena *a = arena;
    int r = vase_arena_clear(a, off, len);
    if (r < 0)
        log_error_errno(r, "Arena %u: failed to zero %llu bytes at %llu: %m.", a->id,
                        (unsigned long long)len, (unsigned long long)off);
}

int vase_arena_clear(struct vase_arena *a, uint64_t off, uint64_t len) {
    if (!a || !a->map || off > a->size || len > a->size - off)
        return -EINVAL;
    if (len == 0)
        return 0;
    return a->ops->clear ? a->ops->clear(a, off, len) : -EOPNOTSUPP;
}

int vase_cuda_share_from_string(const char *s, enum vase_cuda_share *ret) {
    if (!s || !ret)
        return -EINVAL;
    if (strcmp(s, "ipc") == 0)
        *ret = VASE_CUDA_SHARE_IPC;
    else if (strcmp(s, "vmm") == 0)
        *ret = VASE_CUDA_SHARE_VMM;
    else
        return -EINVAL;
    return 0;
}

/* "GPU-" and 8-4-4-4-12 hex digits; copied lowercased into uuid. */
static bool parse_uuid(const char *s, char uuid[VASE_ARENA_UUID_MAX]) {
    static const char shape[] = "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx";

    if (strlen(s) != sizeof(shape) - 1 || strncmp(s, "GPU-", 4) != 0)
        return false;
    for (size_t i = 0; i < sizeof(shape) - 1; i++) {
        if (shape[i] == 'x' ? !isxdigit((unsigned char)s[i]) : s[i] != shape[i])
            return false;
        uuid[i] = i < 4 ? s[i] : (char)tolower((unsigned char)s[i]);
    }
    uuid[sizeof(shape) - 1] = '\0';
    return true;
}

/* The device part of "cuda:<device>": an ordinal (at most 4 digits) or a GPU UUID. */
static bool parse_cuda_device(const char *dev, int *ret_ordinal, char uuid[VASE_ARENA_UUID_MAX]) {
    size_t n = strlen(dev);

    if (n >= 1 && n <= 4 && strspn(dev, "0123456789") == n) {
        int v = 0;
        for (size_t i = 0; i < n; i++)
            v = v * 10 + (dev[i] - '0');
        *ret_ordinal = v;
        uuid[0] = '\0';
        return true;
    }
    *ret_ordinal = -1;
    return parse_uuid(dev, uuid);
}

int vase_arena_new(uint32_t id, const char *spec, enum vase_cuda_share share, uint64_t size,
                   uint64_t granule_bytes, struct vase_arena **ret) {
    const struct vase_arena_ops *ops;
    int device = -1, r;
    char uuid[VASE_ARENA_UUID_MAX] = "";

    if (!spec || !ret)
        return -EINVAL;
    if (strcmp(spec, "host") == 0)
        ops = &vase_arena_host_ops;
    else if (strncmp(spec, "cuda:", 5) == 0) {
        if (!parse_cuda_device(spec + 5, &device, uuid))
            return log_error_errno(-EINVAL,
                                   "Unknown arena \"%s\" (expected \"cuda:N\" or "
                                   "\"cuda:GPU-<uuid>\", the UUID as nvidia-smi -L prints it).",
                                   spec);
        if (share == VASE_CUDA_SHARE_IPC)
            ops = &vase_arena_cuda_ipc_ops;
        else if (share == VASE_CUDA_SHARE_VMM)
            ops = &vase_arena_cuda_vmm_ops;
        else
            return log_error_errno(-EINVAL, "Arena \"%s\": unknown CUDA sharing mode %d.", spec,
                                   (int)share);
    } else
        return log_error_errno(-EINVAL,
                               "Unknown arena \"%s\" (expected \"host\", \"cuda:N\" or "
                               "\"cuda:GPU-<uuid>\").",
                               spec);
    if (granule_bytes < 4096 || granule_bytes % 4096 != 0 || size == 0 ||
        size % granule_bytes != 0 || size / granule_bytes > INT32_MAX)
        return log_error_errno(
            -EINVAL, "Arena \"%s\": %llu bytes cannot be cut into granules of %llu bytes.", spec,
            (unsigned long long)size, (unsigned long long)granule_bytes);

    struct vase_arena *a = calloc(1, sizeof(*a));
    if (!a)
        return log_oom();
    *a = (struct vase_arena){
        .id = id,
        .ops = ops,
        .size = size,
        .granule_bytes = granule_bytes,
        .num_granules = (uint32_t)(size / granule_bytes),
        .fd = -1,
        .device = device,
    };
    memcpy(a->device_uuid, uuid, sizeof(uuid));
    a->kind = strdup(spec);
    if (!a->kind) {
        r = log_oom();
        goto free_arena;
    }
    r = ops->create(a);
    if (r < 0)
        goto free_arena;
    *ret = a;
    return 0;

free_arena:
    vase_arena_free(a);
    return r;
}

int vase_arena_adopt_host(uint32_t id, int fd, uint64_t size, uint64_t granule_bytes,
                          struct vase_arena **ret) {
    if (fd < 0 || !ret || granule_bytes < 4096 || granule_bytes % 4096 != 0 || size == 0 ||
        size % granule_bytes != 0 || size / granule_bytes > INT32_MAX)
        return -EINVAL;
    struct vase_arena *a = calloc(1, sizeof(*a));
    if (!a)
        return -ENOMEM;
    *a = (struct vase_arena){
        .id = id,
        .ops = &vase_arena_host_ops,
        .size = size,
        .granule_bytes = granule_bytes,
        .num_granules = (uint32_t)(size / granule_bytes),
        .fd = -1,
        .device = -1,
    };
    a->kind = strdup("host");
    int r = a->kind ? host_adopt(a, fd) : -ENOMEM;
    if (r < 0) {
        vase_arena_free(a); /* a->fd is still -1: fd stays the caller's */
        return r;
    }
    *ret = a;
    return 0;
}

struct vase_arena *vase_arena_free(struct vase_arena *a) {
    if (!a)
        return NULL;
    if (a->ops)
        a->ops->destroy(a);
    free(a->kind);
    free(a);
    return NULL;
}

/* The stamp as stored: magic, u32 version, u32 arena id, u64 incarnation, the stop id (native
 * byte order: the same host writes and reads it). */
#define STAMP_MAGIC "VASESTMP"
#define STAMP_VERSION 1u
#define STAMP_BYTES (8 + 4 + 4 + 8 + VASE_ARENA_STOP_ID_BYTES)

static int stamp_io(const struct vase_arena *a, void *buf, bool out) {
    if (a->ops != &vase_arena_host_ops || a->fd < 0)
        return -EOPNOTSUPP;
    ssize_t n = out ? pwrite(a->fd, buf, STAMP_BYTES, (off_t)a->size)
                    : pread(a->fd, buf, STAMP_BYTES, (off_t)a->size);
    if (n < 0)
        return -errno;
    return n == STAMP_BYTES ? 0 : -EIO;
}

int vase_arena_write_stamp(const struct vase_arena *a, const struct vase_arena_stamp *st) {
    uint8_t buf[STAMP_BYTES];
    uint32_t version = STAMP_VERSION;
    if (!a || !st)
        return -EINVAL;
    memcpy(buf, STAMP_MAGIC, 8);
    memcpy(buf + 8, &version, 4);
    memcpy(buf + 12, &st->arena_id, 4);
    memcpy(buf + 16, &st->incarnation, 8);
    memcpy(buf + 24, st->stop_id, VASE_ARENA_STOP_ID_BYTES);
    return stamp_io(a, buf, true);
}

int vase_arena_read_stamp(const struct vase_arena *a, struct vase_arena_stamp *ret) {
    uint8_t buf[STAMP_BYTES];
    uint32_t version;
    if (!a || !ret)
        return -EINVAL;
    int r = stamp_io(a, buf, false);
    if (r < 0)
        return r;
    memcpy(&version, buf + 8, 4);
    if (memcmp(buf, STAMP_MAGIC, 8) != 0 || version != STAMP_VERSION)
        return -ENOMSG;
    memcpy(&ret->arena_id, buf + 12, 4);
    memcpy(&ret->incarnation, buf + 16, 8);
    memcpy(ret->stop_id, buf + 24, VASE_ARENA_STOP_ID_BYTES);
    return 0;
}

int vase_arena_clear_stamp(const struct vase_arena *a) {
    uint8_t buf[STAMP_BYTES] = {0};
    if (!a)
        return -EINVAL;
    return stamp_io(a, buf, true);
}

void *vase_arena_at(const struct vase_arena *a, uint64_t off) {
    return (char *)a->map + off;
}

bool vase_arena_on_device(const struct vase_arena *a) {
    return a->ops->on_device;
}
