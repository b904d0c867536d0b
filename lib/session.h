/* SPDX-License-Identifier: MIT */
#pragma once

/* The session socket: runtime directory, handshake, arena file descriptors and their
 * mappings. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct vase__cuda_mapping;

/* An arena as the welcome described it, mapped when it is a memfd. A device arena (share
 * "cuda-ipc" or "cuda-vmm") is mapped by lib/cuda.c when a model is first registered on it,
 * so that a client that never uses it never touches CUDA. */
struct vase__arena {
    uint32_t id;
    char *name;  /* "default", or the NAME of its [arena NAME] section in vased.conf */
    char *kind;  /* "host", "cuda:N" */
    char *share; /* "memfd", "cuda-ipc", "cuda-vmm" */
    uint64_t granule_bytes;
    uint32_t granules;
    uint64_t size_bytes;
    void *map; /* memfd: MAP_SHARED read/write mapping; device arenas: the device address once
                * mapped (NULL before) */
    /* Device arenas: the GPU's UUID, the legacy IPC handle (cuda-ipc), the received fd
     * (cuda-vmm, held until the import; -1 otherwise), and once mapped, the CUDA device
     * ordinal in this process and the process-wide mapping this arena holds a reference on. */
    char *device_uuid;
    uint8_t ipc_handle[64];
    size_t ipc_handle_len;
    int fd;
    int device;
    struct vase__cuda_mapping *mapping;
};

/* Whether a's memory is on a device (share "cuda-ipc" or "cuda-vmm"). */
bool vase__arena_on_device(const struct vase__arena *a);

/* What the welcome told the client, copied out of the unpacked message. */
struct vase__session {
    int fd; /* the session socket, held open for the life of the client */
    uint32_t client_id;
    uint64_t incarnation;
    uint8_t token[255];
    size_t token_len;
    char *control_endpoint;
    char *events_endpoint;
    uint32_t max_message_bytes;
    struct vase__arena *arenas;
    size_t n_arenas;
};

/* Hard bound on arenas a welcome may describe (and fds it may carry). */
#define VASE__MAX_ARENAS 64

/*
 * The runtime directory: dir if not NULL, else $VASE_RUNTIME_DIR if set and not empty, else
 * /run/vase if it is a directory, else ./run. Writes it to buf. 0, -ENAMETOOLONG.
 */
int vase__runtime_dir(const char *dir, char *buf, size_t size);

/*
 * Connects <runtime_dir>/session.sock, says hello as name, and takes the welcome: arenas
 * mapped, everything copied into *s. Waits at most timeout_ms for the welcome. 0; -ENOENT
 * (no socket), -ECONNREFUSED (no daemon behind it), -EACCES/-EPERM (refused), -ETIMEDOUT,
 * -ECONNRESET (closed without a word), -VASE_EPROTOVERSION, -EPROTO (a welcome that does not
 * add up), -ENAMETOOLONG, -ENOMEM, or the daemon's Error code.
 */
int vase__session_open(const char *runtime_dir, const char *name, int timeout_ms,
                       struct vase__session *s);
/* Unmaps every arena (device arenas: drops this session's reference on the process-wide
 * mapping, closing the handle with the last one), then closes the socket (in that order:
 * docs/ARCHITECTURE.md, "Memory that other processes have mapped"), and frees the copies.
 * Accepts a session set up by vase__session_init() and never opened. */
void vase__session_close(struct vase__session *s);
/* A session that holds nothing, safe to close. */
void vase__session_init(struct vase__session *s);
