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
#include "vase_layout.h"
#include "wire.h"

struct vase_alloc;
struct vase_plan_run;

/* Hard limits on what one request may describe (the kernels' limits cover heads and dims). */
#define VASE_MAX_NAME 256u
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
    int fd; /* the session socket; closed by vase_registry_remove_client() */
    /* The process, watched from its connection on (drain.h): a pidfd, or -1 with pidfd_error
     * saying why (-ESRCH: gone already; -ENOSYS, -EPERM, -EINVAL: it cannot be watched). */
    int pidfd;
    int pidfd_error;
    /* Draining: the session closed while the process may still run GPU work on the pages of its
     * device sequences, which it holds (n_held orphans) until release_at (0: until it exits). */
    bool draining;
    double release_at;
    uint32_t n_held;
    double connected_at;  /* CLOCK_MONOTONIC seconds */
    uint64_t bytes;       /* arena bytes charged to this client (quota) */
    uint64_t stats_bytes; /* daemon memory its sequences' pushed statistics hold (quota) */
    uint32_t arenas;      /* bit i: the client may use arena i */
    uint32_t n_seqs, n_models;
    uint64_t last_client_seq;
    struct vase_ratelimit log_limit; /* what this client makes the daemon log */
    struct vased_model *models;
    struct vased_seq *seqs;
    struct vased_client *next;
};

struct vased_model {
    uint32_t id;
    uint32_t arena_id;
    char *name;
    struct vased_client *client;
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
    struct vase_params params; /* params.budget: the budget its plans keep now */
    uint32_t keep;             /* K = params.budget - window */
    /* Elastic budgets (elastic.h): the range it was opened with, the engine's cap (SetBudget),
     * the budget the daemon wants it to have after its next eviction, its weight. Always
     * min_budget <= target_budget <= cap_budget <= max_budget; params.budget moves toward
     * target_budget at eviction boundaries only. */
    uint32_t max_budget, min_budget, cap_budget, target_budget, weight;
    struct vase_params max_params; /* as opened: params at max_budget */
    uint32_t budget_changes;
    uint32_t mode; /* Vase__Mode */
    uint32_t slack;
    uint32_t prompt_len;
    uint64_t seed;
    char label[VASE_WIRE_LABEL_MAX + 1]; /* OpenSeq.label, checked (vase_wire_label_check()) */
    struct vase_layout layout;          /* the model's, copied: an orphan no longer has its model */
    struct vase_plan_layout plan;       /* its plan area */
    uint32_t capacity;                  /* n_pages * block_tokens */
    uint32_t *pages, n_pages;           /* block table: KV pages of layout.page_bytes */
    uint32_t max_pages;                 /* room in pages[]: the pages at the open */
    uint32_t *ring_pages, n_ring_pages; /* of layout.ring_page_bytes */
    uint32_t *plan_pages, n_plan_pages; /* of plan.plan_page_bytes */
    uint32_t len; /* the last length the client reported (request or commit) */
    uint64_t position;
    uint32_t rounds; /* committed evictions */
    enum vased_seq_state state;
    struct vase_plan_run *run; /* the in-flight or ready plan */
    double last_plan_seconds;
    /* What its engine reported with its last accepted commit (EvictCommit fields 4-6,
     * cumulative): exported, never acted on. */
    uint64_t engine_stalls;
    double engine_stall_seconds, engine_compact_seconds;
    bool engine_report_logged; /* a report that was not taken has been logged */
    /* h2o accumulators [layers][kv_heads][acc_stride], allocated at the first ACC_ADD;
     * acc_stride is the capacity at open (capacity only shrinks). */
    float *acc;
    uint32_t acc_stride;
    /* Window scores pushed per layer, [kv_heads][scores_len[l]], consumed by the next plan. */
    float **scores;
    uint32_t *scores_len;
    uint64_t stats_bytes;        /* bytes of acc and scores, also charged to the client */
    struct vased_seq *next;      /* in the client's list, or the orphan list */
    struct vased_client *holder; /* an orphan's draining client, whose process may write it */
    struct vased_seq *hash_next; /* in the registry's id table */
    /* Drawn at the open: what a reopen after a restart presents (restore.h), with the uid of the
     * client that opened it. */
    uint8_t resume_token[VASE_TOKEN_BYTES];
    uid_t owner_uid;
};

struct vase_registry {
    struct vased_client *clients;
    uint32_t n_clients;
    uint32_t n_seqs; /* live (not orphaned) sequences */
    uint32_t next_client_id, next_model_id, next_seq_id;
    struct vased_seq **seq_table;  /* id hash, chained through hash_next */
    uint32_t seq_table_size;       /* power of two */
    struct vased_seq *orphans;     /* sequences whose pages wait for their plan or holder */
    struct vased_client *draining; /* clients gone from the session, holding device pages */
    uint32_t n_draining;
    /* Sequences kept across a restart (restore.h), no client's until one reopens them:
     * unreachable by id, their pages held. */
    struct vased_seq *restored;
    uint32_t n_restored;
    /* Frees a sequence's plan run (the planner's, plan/planner.h): the registry holds runs but
     * never looks inside one. */
    struct vase_plan_run *(*free_run)(struct vase_plan_run *run);
};

/* An empty registry whose sequences' runs free_run frees. 0 or -ENOMEM. */
int vase_registry_new(struct vase_plan_run *(*free_run)(struct vase_plan_run *run),
                      struct vase_registry **ret);
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
/* "connected", or "draining" (drain.h): what vasectl shows for a client. */
const char *vase_registry_client_state(const struct vased_client *c);

int vase_registry_add_model(struct vase_registry *reg, struct vased_client *c, const char *name,
                            uint32_t arena_id, const struct vase_layout *layout,
                            struct vased_model **ret);
/* The client's model id: -ENOENT if there is none or it is another client's (the same
 * answer, so that ids reveal nothing of other tenants). */
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
    uint32_t min_budget;                 /* = params.budget when not elastic */
    uint32_t weight;                     /* >= 1 */
    char label[VASE_WIRE_LABEL_MAX + 1]; /* "" or a label vase_wire_label_check() accepts */
};

/* What a sequence of model m holds at open (vase_layout.h). */
struct vased_seq_footprint {
    uint32_t kv_pages, ring_pages;
    struct vase_plan_layout plan;
    uint64_t bytes; /* all of it */
};

/* The footprint of a sequence for a model. -EINVAL with the reason in msg. */
int vase_registry_footprint(const struct vase_layout *l, const struct vased_seq_request *req,
                            struct vased_seq_footprint *ret, char *msg, size_t msg_size);
/* The same at budget (the KV pages of that budget; the plan area of the one asked for). */
int vase_registry_footprint_at(const struct vase_layout *l, const struct vased_seq_request *req,
                               uint32_t budget, struct vased_seq_footprint *ret, char *msg,
                               size_t msg_size);

/*
 * Opens a sequence: one all-or-nothing reservation of its KV, ring and plan pages in alloc,
 * charged to c in bytes (quota 0: none). An elastic request (min_budget below its budget) that
 * does not fit takes a lower budget that does, not below min_budget (params.budget of the
 * sequence then; max_budget is the one asked for). -EDQUOT (sequence or byte quota), -ENOSPC
 * (arena full), -EINVAL (layout), -ENOMEM; the reason in msg. Nothing is held on failure.
 */
int vase_registry_open_seq(struct vase_registry *reg, struct vase_alloc *alloc,
                           struct vased_client *c, struct vased_model *m,
                           const struct vased_seq_request *req, uint32_t max_seqs,
                           uint64_t byte_quota, struct vased_seq **ret, char *msg, size_t msg_size);
/* Bytes of arena the sequence holds now. */
uint64_t vase_registry_seq_bytes(const struct vased_seq *s);

/* A sequence as the previous daemon kept it (restore.c reads it from the state snapshot). */
struct vased_seq_saved {
    uint32_t id, arena_id;
    uid_t uid;
    uint8_t token[VASE_TOKEN_BYTES];
    struct vase_layout layout;    /* of its model's geometry in this arena */
    struct vased_seq_request req; /* as opened: req.params at its max_budget */
    uint32_t budget, cap_budget, target_budget, budget_changes;
    uint32_t n_pages, n_ring_pages, n_plan_pages;
    const uint32_t *pages, *ring_pages, *plan_pages;
    uint32_t len, rounds;
    uint64_t position;
};

/*
 * Takes a saved sequence back, unowned, on the restored list: its pages exactly as saved,
 * claimed in alloc. Every field is checked against what an open of that request would hold
 * (the snapshot is input): -EINVAL or -EEXIST (a page taken twice or outside the arena) with the
 * reason in msg, -ENOMEM; nothing is held on failure.
 */
int vase_registry_restore_seq(struct vase_registry *reg, struct vase_alloc *alloc,
                              const struct vased_seq_saved *sv, char *msg, size_t msg_size);
/* The restored sequence id, or NULL. */
struct vased_seq *vase_registry_find_restored(const struct vase_registry *reg, uint32_t id);
/* Gives restored sequence s to client c with its model m (same geometry, checked by the caller);
 * its bytes are charged to c. */
void vase_registry_adopt_restored(struct vase_registry *reg, struct vased_client *c,
                                  struct vased_model *m, struct vased_seq *s);
/* Frees restored sequence s, its pages back to alloc. */
void vase_registry_drop_restored(struct vase_registry *reg, struct vase_alloc *alloc,
                                 struct vased_seq *s);
/* The client's sequence: -ENOENT if there is none or it is another client's (the same
 * answer). */
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
/* Frees an orphan whose plan has finished, returning its pages; one a draining client holds
 * only drops its run and keeps its pages until vase_registry_release_client(). */
void vase_registry_reap(struct vase_registry *reg, struct vase_alloc *alloc, struct vased_seq *s);

/*
 * Ends live sequence s of a client whose session closed without returning its pages: it becomes
 * an orphan held by the client (unreachable by id), its pages still charged to the client, until
 * vase_registry_release_client(). Its plan in flight, if any, finishes as for any orphan.
 */
void vase_registry_hold_seq(struct vase_registry *reg, struct vased_seq *s);
/* Moves client c, which has no live sequence left and holds n_held > 0, from the clients to the
 * draining list (unreachable by token; no longer counted in n_clients); its session closes. */
void vase_registry_drain_client(struct vase_registry *reg, struct vased_client *c);
/*
 * Ends draining client c: the pages of the orphans it holds go back to their arena's allocator
 * (allocs, by arena id), those with a plan in flight when it finishes; c is freed. Returns the
 * bytes returned now.
 */
uint64_t vase_registry_release_client(struct vase_registry *reg, struct vase_alloc *const *allocs,
                                      struct vased_client *c);
/* The bytes the draining clients hold. */
uint64_t vase_registry_draining_bytes(const struct vase_registry *reg);

/* What the connected clients of one uid hold together (the per-uid caps; draining clients, whose
 * sessions are gone, are not counted). */
struct vased_uid_usage {
    uint32_t sessions;
    uint32_t seqs;
    uint64_t stats_bytes;
};
/* Costs one step per connected client. */
void vase_registry_uid_usage(const struct vase_registry *reg, uid_t uid,
                             struct vased_uid_usage *ret);

/* Releases the KV pages of s beyond keep_pages (charged to its client). 0 or -EINVAL. */
int vase_registry_shrink_seq(struct vased_seq *s, struct vase_alloc *alloc, uint32_t keep_pages);
/* Appends KV pages to the block table of s until it has n_pages (at most max_pages), charged
 * to its client under quota (0: none): all of them or none. 0, -ENOSPC, -EDQUOT, -ENOMEM. */
int vase_registry_grow_seq(struct vased_seq *s, struct vase_alloc *alloc, uint32_t n_pages,
                           uint64_t quota);

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
