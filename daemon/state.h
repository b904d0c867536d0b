/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * struct vased: every piece of the daemon's state, passed explicitly to the modules of daemon/.
 * Only data and the daemon's clock live here, no loop functions: the loop (vased.h) calls down
 * into the modules that take a struct vased, and none of them calls back up into it.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>
#include <zmq.h>

#include "core/admitq.h"
#include "core/allow.h"
#include "config/config.h"
#include "serve/metrics.h"
#include "core/registry.h"
#include "core/session.h"

#define VASED_VERSION "0.1.0"
/* Sessions that connected but have not said hello yet (in all, and per uid), and how long
 * they may take. Only peers the allow-list admits get a slot. */
#define VASED_MAX_PENDING 64
#define VASED_MAX_PENDING_PER_UID 8
#define VASED_HELLO_TIMEOUT 5.0
/* Refused sessions logged: a burst, then a summary per interval. */
#define VASED_REFUSE_LOG_INTERVAL 10.0
#define VASED_REFUSE_LOG_BURST 10u
/* Sessions that begin and end (connected, disconnected, no hello): any admitted peer can make
 * them at will, so they are logged in a burst too, then summed up. */
#define VASED_CHURN_LOG_INTERVAL 10.0
#define VASED_CHURN_LOG_BURST 32u

struct vase_arena;
struct vase_alloc;
struct vase_events;
struct vase_evictor;
struct vase_metrics_http;
struct vase_plan_run;
struct vase_restore;

/* What a peer may do, from the credentials the kernel gave for its connection. */
struct vased_peer {
    uid_t uid;
    bool allowed;    /* by allow_users/allow_groups (root and the daemon's user always) */
    bool admin;      /* may change settings: root, the daemon's user, admin_group */
    uint32_t arenas; /* bit i: may use arena i (only when allowed) */
};

struct vased_pending {
    int fd;
    int pidfd, pidfd_error; /* the peer's process (drain.h), for device arenas */
    struct ucred cred;
    struct vased_peer peer;
    double deadline;
};

struct vased {
    struct vase_config cfg;
    /* Restart-only settings the configuration files changed since the start (a reload saw it):
     * the value they give now, which applies at the next restart (ConfigEntry.pending), by index
     * in vase_settings; NULL where none. */
    char **pending_settings;
    const struct vase_cmdline *cmdline; /* for SIGHUP: defaults, file, then these flags */

    char *runtime_dir;  /* absolute */
    int runtime_dir_fd; /* the directory that was checked, -1 before */
    char *session_path, *control_path, *events_path;
    char *control_endpoint, *events_endpoint;
    uint64_t incarnation;
    double started_at; /* CLOCK_MONOTONIC */
    uid_t self_uid;
    struct vase_allow allow;  /* who may open a session */
    struct vase_allow admins; /* admin_group */

    struct vase_arena *arenas[VASED_MAX_ARENAS];
    struct vase_alloc *allocs[VASED_MAX_ARENAS];
    const char *arena_names[VASED_MAX_ARENAS]; /* "default", or the section's NAME (in cfg) */
    struct vase_allow arena_allow[VASED_MAX_ARENAS];
    bool arena_open[VASED_MAX_ARENAS];   /* no users/groups named: everyone allowed may use it */
    bool pressure_low[VASED_MAX_ARENAS]; /* free pages below 10% when last looked */
    uint32_t n_arenas;

    struct vase_registry *reg;
    struct vase_admitq admitq; /* opens waiting for room (engine.h) */
    /* Per arena, its used bytes when the first parked open last did not fit: retried only
     * after they change. */
    uint64_t admit_free_seen[VASED_MAX_ARENAS];
    /* Elastic budgets (elastic.h): what the targets were last computed from. */
    uint64_t elastic_gen; /* admitq.gen */
    uint64_t elastic_used[VASED_MAX_ARENAS];
    bool elastic_waiting[VASED_MAX_ARENAS];
    bool elastic_dirty; /* a cap changed */
    uint64_t budget_shrinks_total, budget_grows_total;

    void *zmq_ctx;
    void *router;
    void *zap; /* answers libzmq's ZAP requests (who may subscribe to events) */
    struct vase_events *events;
    struct vase_evictor *evictor;

    int session_fd;               /* listener; -1 once shutdown began */
    bool session_activated;       /* session_fd came from systemd: its file is not ours to remove */
    struct vase_restore *restore; /* what systemd's fd store kept (restore.h); NULL: none */
    int signal_fd;
    int timer_fd;
    struct vased_pending pending[VASED_MAX_PENDING];
    size_t n_pending;
    struct vase_ratelimit refuse_log;
    struct vase_ratelimit churn_log; /* sessions begun and ended (VASED_CHURN_LOG_*) */
    bool unwatchable_logged; /* a client's process could not be watched (drain.h), said once */

    bool stopping;        /* SIGTERM seen: draining in-flight plans */
    double stop_deadline; /* CLOCK_MONOTONIC */
    bool quit;            /* leave the main loop */
    int exit_error;       /* why the loop stopped on its own (-ENOTRECOVERABLE: GPU context lost) */

    uint64_t watchdog_usec; /* 0: no systemd watchdog */
    double last_watchdog, last_stats;
    char last_status[256];

    uint64_t evictions_total, stats_messages_total, requests_total;
    /* Error replies: to engine requests (and unreadable frames), and to administrative ones. */
    uint64_t errors_total, admin_errors_total;
    uint32_t evictions_in_flight;

    struct vase_metrics metrics;            /* counters of the Prometheus metrics */
    struct vase_metrics_http *metrics_http; /* the /metrics endpoint; NULL when off */
    /* Why there is none although metrics_address is not off (StatusReply.metrics_unavailable,
     * STATUS=); "" otherwise. */
    char metrics_unavailable[160];
};

/* CLOCK_MONOTONIC in seconds: the daemon's clock for deadlines, uptimes and rate limits. */
static inline double vased_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
