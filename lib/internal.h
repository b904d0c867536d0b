/* SPDX-License-Identifier: MIT */
#pragma once

/* libvase's private state: the client, its models and sequences, shared by client.c, model.c
 * and seq.c. Nothing outside client/ includes this. */

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "chan.h"
#include "cuda_arena.h"
#include "session.h"
#include "vase.h"
#include "vase_kernels.h"
#include "vase_layout.h"

/* Stats pushes remembered so that a refusal (an Error with the push's request id) reaches its
 * sequence; a refusal older than this many pushes is dropped. */
#define VASE__STATS_RING 256

struct vase_model {
    struct vase_client *client;
    struct vase_model *next;
    uint32_t id;
    struct vase__arena *arena;
    struct vase_layout layout;
    char *name; /* as registered */
};

struct vase_seq {
    struct vase_client *client;
    struct vase_model *model;
    struct vase_seq *next;

    uint32_t id;
    /* As opened, and the daemon's secret for it: what vase_seq_reopen() presents. cfg.label
     * points to label, the sequence's copy. */
    struct vase_seq_config cfg;
    char label[VASE_SEQ_LABEL_MAX + 1];
    uint8_t resume_token[16];
    bool has_resume_token;
    enum vase_policy policy;
    enum vase_mode mode;
    uint32_t budget, window, keep, slack, prompt_len;
    uint32_t min_budget, max_budget; /* elastic budgets: the range it was opened with */
    uint32_t capacity;
    uint32_t len;
    uint64_t position;
    uint32_t rounds;

    uint32_t *pages; /* block table, capacity / block_tokens entries or more */
    size_t n_pages;
    size_t max_pages; /* at the open: the most it ever holds */
    uint32_t *ring_pages;
    size_t n_ring_pages;
    uint32_t *plan_pages;
    size_t n_plan_pages;
    struct vase_plan_layout plan;

    /* The request in flight, if any: its id, and the len and position it was sent with. */
    bool pending;
    uint64_t pending_id;
    /* The commit whose reply has not been read yet, if any. The engine does not wait for it:
     * the reply is read by the next call, and at the latest before the next request. */
    bool commit_pending;
    uint64_t commit_id;
    uint32_t req_len;
    uint64_t req_position;
    /* The request id of the last message sent for this sequence (request, commit, stats
     * push): once the channel has a reply to it or to anything later, the daemon has handled
     * them all (vase_seq_flush()). */
    uint64_t last_sent_id;

    /* Draws injected for the next request (vase_seq_set_draws), owned here. */
    float *exp_draws;
    size_t n_exp;
    float *gauss;
    size_t n_gauss;

    /* An error that arrived for this sequence out of band (a refused stats push), returned by
     * its next call, with the daemon's message. A sequence whose memory may no longer match the
     * daemon's view is broken: every later call returns broken. */
    int deferred_error;
    char deferred_message[256];
    int broken;

    uint32_t *keep_buf; /* [layers][kv_heads][keep], the copied plan */
    struct vase_seq_stats stats;

    /* Device arenas: the engine's stream (vase_seq_set_stream(); NULL: the legacy default
     * stream) and the sequence's device state for compaction. */
    void *stream;
    struct vase__cuda_seq *cuda;
    /* Stream order (vase_seq_set_ordering()): what waits for a mark of the stream before it
     * is sent, in this order: the commit of a compaction enqueued on the stream (its round
     * and new length), then a request whose slots the engine's queued work writes (its len
     * and position are req_len and req_position; pending is set, pending_id is not yet). */
    enum vase_ordering ordering;
    bool commit_queued;
    uint32_t commit_round, commit_len;
    bool request_queued;
};

/* A call waiting for its reply without the client's lock (vase__client_call_unlocked()). */
struct vase__waiting {
    uint64_t id;
    struct vase__waiting *next;
};
/* An open sent by vase_seq_open_async(), waiting for vase_open_poll() to take its reply. */
struct vase_open {
    struct vase_client *client;
    struct vase_model *model;
    struct vase_seq_config cfg; /* cfg.label points to label, the open's copy */
    char label[VASE_SEQ_LABEL_MAX + 1];
    uint64_t id;         /* the OpenSeq's request id */
    int64_t deadline_ms; /* CLOCK_MONOTONIC: no reply by then is a timeout */
    struct vase_open *next;
};
/* An open given up (vase_open_cancel(), or timed out): a sequence it is still admitted as is
 * closed when the reply arrives. */
struct vase__abandoned {
    uint64_t id;
    struct vase__abandoned *next;
};
/* How often such a call looks for its reply, in ms. */
#define VASE__UNLOCKED_POLL_MS 2

struct vase_client {
    pthread_mutex_t lock;
    struct vase__session session;
    struct vase__chan *chan;
    int timeout_ms;
    /* Once the daemon is known to be gone (-ECONNRESET) or restarted (-VASE_ESTALE), every
     * call fails with that error at once. */
    int dead;

    struct vase_model *models;
    struct vase_seq *seqs;

    /* Why the last call failed, for vase_last_error(): the daemon's message, one of libvase's,
     * or "". Cleared as every call that returns an error code starts (vase__client_lock()). */
    char last_error[256];

    uint64_t stats_ids[VASE__STATS_RING];
    uint32_t stats_seqs[VASE__STATS_RING];
    size_t stats_next;
    uint64_t pings;
    struct vase__waiting *waiting; /* calls waiting without the lock, on their stacks */
    struct vase_open *opens;       /* vase_seq_open_async()'s, not yet polled to the end */
    struct vase__abandoned *abandoned;
};

/* Remembers the client as dead if r says the daemon is gone; returns r. */
int vase__client_check(struct vase_client *c, int r);
/* Takes the client's lock for a public call that returns an error code, and clears the last
 * error: whatever the call leaves there is about this call. */
void vase__client_lock(struct vase_client *c);
/* Says why the call fails, for vase_last_error(); returns r. Lock held. */
int vase__client_fail(struct vase_client *c, int r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A refusal by the daemon: keeps its message and returns its code as -errno (recording daemon
 * death). Lock held. */
int vase__client_refused(struct vase_client *c, const Vase__Error *err);
/* Sends e and waits for a reply of body case expect, recording daemon death. Lock held. */
int vase__client_call(struct vase_client *c, Vase__Envelope *e, Vase__Envelope__BodyCase expect,
                      Vase__Envelope **ret);
/* vase__client_call() whose wait for the reply lasts timeout_ms (< 0: the client's timeout). */
int vase__client_call_wait(struct vase_client *c, Vase__Envelope *e,
                           Vase__Envelope__BodyCase expect, int timeout_ms, Vase__Envelope **ret);
/* vase__client_call_wait() that lets go of the lock while it waits (other threads' calls run
 * meanwhile; whichever reads the reply keeps it for this call): for waits as long as an
 * admission wait. Lock held on entry and on return. */
int vase__client_call_unlocked(struct vase_client *c, Vase__Envelope *e,
                               Vase__Envelope__BodyCase expect, int timeout_ms,
                               Vase__Envelope **ret);
/* The end of a call: daemon death recorded (vase__client_check()), and on failure the
 * channel's last error (the daemon's words when it refused) for vase_last_error(). Returns r.
 * Lock held. */
int vase__client_done(struct vase_client *c, int r);
/* Remembers request id as an open given up: if it is admitted after all, the sequence is
 * closed when the reply arrives. Lock held. */
void vase__client_abandon_open(struct vase_client *c, uint64_t id);
/* A Ping round trip (vase_ping()). Lock held. */
int vase__client_ping(struct vase_client *c);
/* Frees every model and sequence of the client locally (no messages). Lock held. */
void vase__client_free_objects(struct vase_client *c);
/* Remembers that stats push request_id belongs to seq_id. Lock held. */
void vase__client_note_stats(struct vase_client *c, uint64_t request_id, uint32_t seq_id);

/* The unclaimed-reply callback of an engine client: keeps plans someone waits for, routes
 * refused stats pushes to their sequence, drops the rest. */
bool vase__client_unclaimed(void *userdata, const Vase__Envelope *e);

/* Frees a sequence's local state (no message); accepts NULL. */
struct vase_seq *vase__seq_free(struct vase_seq *s);
/* The error a call on s returns before doing anything: the client is dead (also found out
 * here, with one non-blocking look at the session socket, so that even a call that sends
 * nothing never pretends a sequence of a dead daemon lives on), the sequence is broken, or a
 * refusal arrived for it (returned once). It also sends what waits for the engine's stream and
 * reads a commit's reply that has come (cycle.c). Lock held. */
int vase__seq_precheck(struct vase_seq *s);
/* Drops the draws the engine set for the next plan (vase_seq_set_draws()). */
void vase__seq_clear_draws(struct vase_seq *s);
/* Copies a page list (a block table) into a new malloc'd array *ret after checking that every
 * page lies inside the arena. 0, -EPROTO for a page outside it, -ENOMEM. */
int vase__seq_copy_pages(const uint32_t *src, size_t n, uint64_t limit, uint32_t **ret);
/* The public geometry g as the layout formulas take it (vase_layout.h): what vase_model_register()
 * and vase_size_seq() lay out, and, field for field, what RegisterModel carries. */
void vase__geometry_layout(const struct vase_geometry *g, struct vase_layout_geometry *ret);
/* Frees a model's local state; accepts NULL. */
struct vase_model *vase__model_free(struct vase_model *m);
