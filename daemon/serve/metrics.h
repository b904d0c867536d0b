/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The daemon's Prometheus metrics: the counters the main loop keeps (struct vase_metrics, in
 * struct vased), a writer of the text exposition format 0.0.4 into a growing buffer, and the
 * renderer of every metric from the daemon's state. Only the main thread counts and renders;
 * metrics_http.h serves what this renders.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vase_types.h"

struct vased;

/* The upper bounds (seconds) of vase_plan_seconds' buckets, 100 us .. 10 s; +Inf follows. */
#define VASE_METRICS_PLAN_BUCKETS 16
extern const double vase_metrics_plan_bounds[VASE_METRICS_PLAN_BUCKETS];

/* Envelope body numbers (proto/vase.proto) below this are counted per message type; 0 stands
 * for a frame that is not a readable request. */
#define VASE_METRICS_MSG_TYPES 64

/* A client-supplied label value (a model name) is cut to this many bytes before escaping. */
#define VASE_METRICS_LABEL_MAX 128

/* Distinct (model name, arena) pairs vase_model_bytes shows; the rest add up under model "". */
#define VASE_METRICS_MAX_MODELS 256

/* Why an OpenSeq was refused (vase_admission_refusals_total{reason}). */
enum vase_metrics_refusal {
    VASE_METRICS_REFUSAL_NOSPACE, /* no room in the arena, and no wait asked for */
    VASE_METRICS_REFUSAL_QUOTA,   /* max_seqs_per_client, max_bytes_per_client, the per-uid caps */
    VASE_METRICS_REFUSAL_TIMEOUT, /* parked for admission_wait_ms, no room came */
    VASE_METRICS_REFUSAL_INVALID, /* the request itself was wrong (bad parameters, no model) */
    VASE_METRICS_REFUSAL_OTHER,   /* out of memory, and anything else */
    _VASE_METRICS_REFUSAL_MAX,
};

struct vase_metrics_policy {
    uint64_t evictions;                                   /* plans computed */
    uint64_t plan_buckets[VASE_METRICS_PLAN_BUCKETS + 1]; /* per bucket, not cumulative */
    double plan_seconds;                                  /* their sum */
    /* What engines reported with their commits (deltas summed). */
    uint64_t engine_stalls;
    double engine_stall_seconds, engine_compact_seconds;
};

/* Counters only ever grow over the daemon's life. */
struct vase_metrics {
    double started_at; /* CLOCK_REALTIME, seconds since the epoch */
    struct vase_metrics_policy policy[_VASE_POLICY_MAX];
    uint64_t requests[VASE_METRICS_MSG_TYPES];
    uint64_t engine_errors[VASE_METRICS_MSG_TYPES]; /* sum: errors_total */
    uint64_t admin_errors[VASE_METRICS_MSG_TYPES];  /* sum: admin_errors_total */
    uint64_t refusals[_VASE_METRICS_REFUSAL_MAX];
    uint64_t engine_reports_ignored; /* commits whose counters were not taken */
};

/* The message-type index of an envelope body number: itself, or 0 when out of range. */
static inline unsigned vase_metrics_msg_index(int body_case) {
    return body_case > 0 && body_case < VASE_METRICS_MSG_TYPES ? (unsigned)body_case : 0;
}

/* A plan of policy p that took seconds. */
void vase_metrics_observe_plan(struct vase_metrics *m, enum vase_policy p, double seconds);

/* The refusal reason of an OpenSeq answered with -error (a negative errno). */
enum vase_metrics_refusal vase_metrics_refusal_of(int error);

/* ---- the text format ---- */

/* A growing text buffer. After a failed allocation it stays as it was and error is -ENOMEM;
 * every later write is a no-op. */
struct vase_metrics_buf {
    char *data; /* NUL-terminated when len > 0; owned, free() it */
    size_t len, cap;
    int error;
};

struct vase_metrics_label {
    const char *name;
    const char *value; /* escaped and cut to VASE_METRICS_LABEL_MAX bytes when written */
};

/* "# HELP" and "# TYPE" lines of a family; type is "counter", "gauge" or "histogram". */
void vase_metrics_family(struct vase_metrics_buf *b, const char *name, const char *type,
                         const char *help);
/* One sample line: name{labels} value. */
void vase_metrics_sample(struct vase_metrics_buf *b, const char *name,
                         const struct vase_metrics_label *labels, size_t n_labels, double value);
/* One histogram's series (name_bucket with le, name_sum, name_count) from per-bucket counts of
 * n bounds plus +Inf (counts has n + 1 entries). */
void vase_metrics_histogram(struct vase_metrics_buf *b, const char *name,
                            const struct vase_metrics_label *labels, size_t n_labels,
                            const double *bounds, const uint64_t *counts, size_t n, double sum);

/*
 * Writes value as a label value of the format into out (out_len > 0; always NUL-terminated):
 * backslash, double quote and newline escaped, bytes that are not UTF-8 replaced by '?', at most
 * VASE_METRICS_LABEL_MAX bytes of value taken (never half a character). Returns the length.
 */
size_t vase_metrics_escape(const char *value, char *out, size_t out_len);

/* Every metric of the daemon, appended to b. 0 or -ENOMEM. Main thread only. */
int vase_metrics_render(const struct vased *d, struct vase_metrics_buf *b);
