/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * Clients, models and sequences: the objects of the protocol, their ids, lookups, ownership
 * checks, the layout formulas of PROTOCOL.md, and page accounting of sequences. Everything here
 * belongs to the main thread.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "log.h"
#include "vase_kernels.h"

struct vase_alloc;
struct vase_plan_run;

/* Hard limits on what one request may describe (the kernels' limits cover heads and dims). */
#define VASE_MAX_LAYERS 1024u
#define VASE_MAX_NAME 256u
#define VASE_MAX_ALIGN 65536u
#define VASE_TOKEN_BYTES 16u
/* What one client's behaviour may make the daemon log: a burst, then a summary per interval. */
#define VASE_CLIENT_LOG_INTERVAL 10.0
#define VASE_CLIENT_LOG_BURST 5u

struct vased_client {
    uint32_t id;
    uint8_t token[VASE_TOKEN_BYTES]; /* the control DEALER's routing id */
    char *name;
    uint32_t pid;
    uid_t uid;
    gid_t gid;
    int fd;               /* the session socket; closed by vase_registry_remove_client() */
    double connected_at;  /* CLOCK_MONOTONIC seconds */
    uint32_t pages;       /* pages charged to this client (quota) */
    uint64_t stats_bytes; /* daemon memory its sequences' pushed statistics hold (quota) */
    uint32_t arenas;      /* bit i: the client may use arena i */
    uint32_t n_seqs, n_models;
    uint64_t last_client_seq;
    struct vase_ratelimit log_limit; /* what this client makes the daemon log */
    struct vased_model *models;
    struct vased_seq *seqs;
    struct vased_client *next;
};

/* What RegisterModel describes, and the layout the daemon derives from it. */
struct vase_geometry_desc {
    uint32_t layers, q_heads, kv_heads, head_dim;
    enum vase_dtype dtype;
    uint32_t align;
};

struct vase_layout {
    uint32_t tokens_per_page;
    uint64_t page_bytes;
    uint64_t layer_stride, kv_stride, token_stride, head_stride;
    uint32_t ring_rows_per_page; /* 0: the query ring does not fit a page */
    uint64_t ring_layer_stride, ring_row_stride;
};

struct vased_model {
    uint32_t id;
    uint32_t arena_id;
    char *name;
    struct vased_client *client;
    struct vase_geometry_desc geo;
    struct vase_layout layout;
    struct vased_model *next;
};

enum vased_seq_state {
    VASED_SEQ_IDLE,
    VASED_SEQ_PLANNING,   /* evictor jobs in flight */
    VASED_SEQ_PLAN_READY, /* plan written, waiting for EvictCommit */
};

struct vased_seq {
    uint32_t id;
    struct vased_client *client; /* NULL once orphaned (closed or client gone, plan in flight) */
    struct vased_model *model;   /* NULL once orphaned */
    uint32_t arena_id;
    uint32_t layers, kv_heads; /* copied from the model, which an orphan no longer has */
    enum vase_policy policy;
    struct vase_params params;
    uint32_t keep; /* K = budget - window */
    uint32_t mode; /* Vase__Mode */
    uint32_t slack;
    uint32_t prompt_len;
    uint64_t seed;
    uint32_t tokens_per_page;
    uint32_t capacity; /* n_pages * tokens_per_page */
    uint32_t *pages, n_pages;
    uint32_t *ring_pages, n_ring_pages;
    uint32_t *plan_pages, n_plan_pages;
    uint32_t plans_per_page;
    uint32_t len; /* the last length the client reported (request or commit) */
    uint64_t position;
    uint32_t rounds; /* committed evictions */
    enum vased_seq_state state;
    struct vase_plan_run *run; /* the in-flight or ready plan */
    double last_plan_seconds;
    /* h2o accumulators [layers][kv_heads][acc_stride], allocated at the first ACC_ADD;
     * acc_stride is the capacity at open (capacity only shrinks). */
    float *acc;
    uint32_t acc_stride;
    /* Window scores pushed per layer, [kv_heads][scores_len[l]], consumed by the next plan. */
    float **scores;
    uint32_t *scores_len;
    uint64_t stats_bytes;        /* bytes of acc and scores, also charged to the client */
    struct vased_seq *next;      /* in the client's list, or the orphan list */
    struct vased_seq *hash_next; /* in the registry's id table */
};

struct vase_registry {
    struct vased_client *clients;
    uint32_t n_clients;
    uint32_t n_seqs; /* live (not orphaned) sequences */
    uint32_t next_client_id, next_model_id, next_seq_id;
    struct vased_seq **seq_table; /* id hash, chained through hash_next */
    uint32_t seq_table_size;      /* power of two */
    struct vased_seq *orphans;    /* sequences whose pages wait for their plan to finish */
};

int vase_registry_new(struct vase_registry **ret);
/* Frees every object; pages are not released (the allocator goes away with it). The caller
 * must have stopped the evictor first. */
struct vase_registry *vase_registry_free(struct vase_registry *reg);

/* A new client with a fresh id and a random token; the registry owns it (fd included). */
int vase_registry_add_client(struct vase_registry *reg, int fd, struct vased_client **ret);
struct vased_client *vase_registry_find_client(const struct vase_registry *reg, uint32_t id);
struct vased_client *vase_registry_find_token(const struct vase_registry *reg, const void *token,
                                              size_t len);
/* Unlinks and frees a client with its models; its sequences must be gone already. */
void vase_registry_remove_client(struct vase_registry *reg, struct vased_client *c);

/*
 * Computes the layout of PROTOCOL.md for g in pages of page_bytes. -EINVAL with the reason in
 * *ret_msg for a geometry out of bounds, or one whose tokens_per_page would be 0.
 */
int vase_layout_compute(const struct vase_geometry_desc *g, uint64_t page_bytes,
                        struct vase_layout *ret, const char **ret_msg);

int vase_registry_add_model(struct vase_registry *reg, struct vased_client *c, const char *name,
                            uint32_t arena_id, const struct vase_geometry_desc *g,
                            const struct vase_layout *layout, struct vased_model **ret);
/* The client's model id: -ENOENT if there is none, -EPERM if another client's. */
int vase_registry_get_model(const struct vase_registry *reg, const struct vased_client *c,
                            uint32_t id, struct vased_model **ret);

/* What OpenSeq asks for, already defaulted and checked. */
struct vased_seq_request {
    enum vase_policy policy;
    struct vase_params params;
    uint32_t prompt_len;
    uint64_t seed;
    uint32_t mode;
    uint32_t slack;
};

/* Page counts of a sequence for a model, per PROTOCOL.md. -EINVAL with *ret_msg. */
int vase_registry_page_counts(const struct vased_model *m, const struct vased_seq_request *req,
                              uint32_t *ret_kv, uint32_t *ret_ring, uint32_t *ret_plan,
                              uint32_t *ret_plans_per_page, const char **ret_msg);

/*
 * Opens a sequence: one all-or-nothing reservation of its KV, ring and plan pages in alloc,
 * charged to c (quota 0: none). -EDQUOT (sequence or page quota), -ENOSPC (arena full),
 * -EINVAL (layout, *ret_msg), -ENOMEM. Nothing is held on failure.
 */
int vase_registry_open_seq(struct vase_registry *reg, struct vase_alloc *alloc,
                           struct vased_client *c, struct vased_model *m,
                           const struct vased_seq_request *req, uint32_t max_seqs,
                           uint32_t page_quota, struct vased_seq **ret, const char **ret_msg);
/* The client's sequence: -ENOENT if there is none, -EPERM if another client's. */
int vase_registry_get_seq(const struct vase_registry *reg, const struct vased_client *c,
                          uint32_t id, struct vased_seq **ret);
struct vased_seq *vase_registry_find_seq(const struct vase_registry *reg, uint32_t id);

/*
 * Ends a sequence. Its pages go back to alloc at once, unless a plan is being computed: then it
 * is orphaned (unreachable by id, uncharged from the client) and its pages return when
 * vase_registry_reap() is called for it. Returns 1 if orphaned, 0 if freed.
 */
int vase_registry_close_seq(struct vase_registry *reg, struct vase_alloc *alloc,
                            struct vased_seq *s);
/* Frees an orphan whose plan has finished, returning its pages. */
void vase_registry_reap(struct vase_registry *reg, struct vase_alloc *alloc, struct vased_seq *s);

/* Releases the KV pages of s beyond keep_pages (charged to its client). 0 or -EINVAL. */
int vase_registry_shrink_seq(struct vased_seq *s, struct vase_alloc *alloc, uint32_t keep_pages);

/* "idle", "planning", "plan-ready". */
const char *vase_registry_state_name(enum vased_seq_state st);
/* Frees a sequence's pushed window scores (uncharging them). */
void vase_registry_drop_scores(struct vased_seq *s);
/* Frees the h2o accumulators of s (uncharging them). */
void vase_registry_drop_acc(struct vased_seq *s);
/* Bytes of the accumulators of s, allocated or not: layers * kv_heads * acc_stride floats. */
uint64_t vase_registry_acc_bytes(const struct vased_seq *s);
/*
 * Charges (delta > 0) or uncharges (delta < 0) statistics memory of s to it and its client
 * (none once orphaned). Charge before allocating: vase_registry_stats_fit() says whether it may.
 */
void vase_registry_charge_stats(struct vased_seq *s, int64_t delta);
/* Whether the client of s may hold delta more bytes of statistics under quota (0: none). */
bool vase_registry_stats_fit(const struct vased_seq *s, uint64_t delta, uint64_t quota);
