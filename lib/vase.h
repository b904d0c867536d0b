/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * libvase: the engine's side of vase. An engine connects to vased, registers its model
 * geometry, opens sequences, writes keys, values (and, for attention policies, queries) for
 * each new token straight into the shared arena, and calls vase_seq_append() and
 * vase_seq_poll() at step boundaries; libvase talks to the daemon and applies eviction plans
 * with the kernels' compaction.
 *
 * Errors: every fallible call returns >= 0 on success and a negative errno (or -VASE_E*) on
 * failure; vase_strerror() names it, and vase_last_error() says in words why that call failed.
 * A call never blocks longer than the client's timeout (default 5 s); if the daemon is gone the
 * call fails with -ECONNRESET, and if it restarted with -VASE_ESTALE; the client must then be
 * freed and may reconnect.
 *
 * Threads: a client and its sequences are protected by one mutex, so calls from several
 * threads are safe but serialised. Each call on a sequence must come from code that owns the
 * sequence (the library does not reorder calls on one sequence).
 *
 * Ordering (host arena): the engine's stores to the arena are complete when
 * vase_seq_append() is called, because the call itself is a synchronisation point (a system
 * call follows); the daemon writes plans before it replies, and libvase reads them after it
 * received the reply.
 *
 * Ordering (CUDA arena, ArenaInfo share "cuda-ipc" or "cuda-vmm"): the arena is GPU memory,
 * mapped into the engine's process when its first model is registered on it (on the device
 * whose UUID the daemon reports, in compute mode Default). Every address libvase hands out for
 * it (vase_seq_kv_view(), vase_seq_kv_ptr(), vase_seq_query_ptr()) is a DEVICE address of that
 * GPU, for the engine's kernels and CUDA copies; the host must not dereference it. The engine
 * writes K, V and queries on its stream (vase_seq_set_stream(); default: the legacy default
 * stream of the arena's device). Each sequence runs in one of two orderings
 * (vase_seq_set_ordering()). Host order (the default):
 *   1. before libvase sends an EvictRequest (inside vase_seq_append()) it synchronises that
 *      stream, so the engine's writes for every appended token are complete before the daemon
 *      reads them; work the engine queued on other streams it must order before that stream
 *      itself (an event, or a sync) before calling vase_seq_append();
 *   2. the daemon's plan (computed on the same GPU) is complete in the arena before its reply;
 *   3. when a plan is applied (vase_seq_poll(), vase_seq_wait(), or an append that waits),
 *      libvase enqueues on the engine's stream, per layer, a device-to-device copy of the keep
 *      lists from the plan area into its own scratch and the compaction kernel for K and V,
 *      then synchronises the stream before it sends EvictCommit (the commit may release pages
 *      the compaction reads); when the call returns, the compaction is complete, and work the
 *      engine queues afterwards on any stream sees the compacted cache.
 * Stream order (VASE_ORDER_STREAM): no call on the decode path (vase_seq_append(),
 * vase_seq_poll()) waits for the device; everything is ordered by the engine's stream:
 *   1. vase_seq_append() records an event on the stream after the engine's work queued so far
 *      and keeps the EvictRequest until that event has completed; this call or a later one
 *      (append, poll, wait, flush) that finds it completed sends it (cudaEventQuery(), never
 *      a wait). vase_seq_wait(), and an append that must wait for the plan, wait for the event;
 *   2. as in host order;
 *   3. applying a plan enqueues the same copies and kernels on the stream, in the sequence's
 *      own scratch (nothing is allocated), and records an event after them; EvictCommit, which
 *      lets the daemon hand the released pages on, is sent only by a call that finds that
 *      event completed. When the call returns, the compaction is queued, not done: work the
 *      engine queues afterwards on the stream sees the compacted cache; work on another stream
 *      must first wait for this one (cudaEventRecord + cudaStreamWaitEvent);
 *   4. the engine's kernels on other streams that read the cache must be ordered before the
 *      stream (cudaStreamWaitEvent on it) before the call that may apply a plan (append, poll,
 *      wait): the compaction runs after what the stream holds, nothing else;
 *   5. the length, the views and the block table a call returns describe the cache as the
 *      stream will have it once the queued compaction has run; the commit's reply may come a
 *      few calls later, and until then the capacity is already what the daemon will keep.
 * Either way, vase_seq_close() waits for the last compaction libvase queued (that event only)
 * before the daemon gets the pages back; the engine's own work on the sequence's pages must be
 * complete (or ordered before a sync) by then. Opening and closing a sequence never
 * synchronise the device where it has memory pools: the sequence's device memory is taken
 * from a pool at the open and freed, ordered on the sequence's stream, at the close.
 *
 * Errors: libvase runs in the engine's CUDA context and leaves the engine's pending runtime
 * error alone (it never calls cudaGetLastError() to clear one it did not cause); a failure of
 * its own calls is returned as -errno and taken off the thread's last error.
 * Every call makes the arena's device current for its CUDA work and restores the caller's
 * current device before it returns.
 *
 * Ordering (other connections): the daemon handles one client's messages in order, but nothing
 * orders them with another connection's (vasectl's, say), and some of them are sent without
 * waiting for a reply (EvictCommit, stats pushes). vase_seq_flush() waits until the daemon has
 * handled everything sent for a sequence, for code that then asks the daemon about it.
 */

#include <stddef.h>
#include <stdint.h>

#include "vase_errors.h"
#include "vase_types.h"

#ifdef __cplusplus
extern "C" {
#endif

#define VASE_PROTOCOL_VERSION 2

/* The vase-specific error codes (VASE_EPROTOVERSION, VASE_ESTALE) come from vase_errors.h;
 * the element types, policies, parameters and views from vase_types.h. */

/* The message for a negative return value (or a positive code). Never NULL. */
const char *vase_strerror(int err);

struct vase_client;
struct vase_model;
struct vase_seq;
struct vase_open;

struct vase_connect_options {
    const char *runtime_dir; /* NULL: $VASE_RUNTIME_DIR, else /run/vase if it exists, else ./run */
    const char *name;        /* shown by vasectl; NULL: the program name */
    int timeout_ms;          /* bound on every wait for the daemon; 0: 5000 */
};

/* Connects to vased: session handshake, arena mapping, control socket. On success *ret owns
 * the connection. -ENOENT (no daemon socket), -EACCES/-EPERM (refused by the allow-list),
 * -ECONNREFUSED, -ETIMEDOUT, -VASE_EPROTOVERSION. Under socket activation (vased.socket) the
 * socket exists while the daemon is stopped or starting: the connect succeeds and the welcome
 * is waited for up to timeout_ms, -ETIMEDOUT if the daemon was not up by then. */
int vase_connect(const struct vase_connect_options *opts, struct vase_client **ret);
/* Closes every sequence, unmaps the arenas, closes the sockets; accepts NULL. Returns NULL. */
struct vase_client *vase_disconnect(struct vase_client *c);

/* The daemon's incarnation and the client id it assigned. */
uint64_t vase_client_incarnation(const struct vase_client *c);
uint32_t vase_client_id(const struct vase_client *c);
/*
 * Why the last call on the client failed, in words, where its errno says only the kind of
 * failure: the daemon's message when the daemon refused the call (e.g. "NaN or Inf in the
 * keys/values/queries of layer 3 of sequence 7; no plan"), else libvase's own when it refused
 * the call itself (an argument out of range, a device arena it cannot map, a broken sequence,
 * a refused stats push returned by a later call), else "" (the errno is all there is:
 * -ETIMEDOUT, -ECONNRESET, ...). Every call on the client, its models or its sequences that
 * returns an error code sets it as it starts, so a failed call never leaves an older call's
 * message here, and a call that succeeds leaves "". Calls that return no error code
 * (vase_seq_len(), vase_seq_kv_ptr(), vase_seq_get_stats(), ...) and calls that get no client
 * (a NULL client or sequence, vase_connect()) leave it as it is. Never NULL; "" for a NULL
 * client. The string is the client's, valid until the client is freed; its content describes
 * the latest call on the client from any thread, so with several threads read it before
 * another thread's call can intervene.
 */
const char *vase_last_error(struct vase_client *c);
/* Round trip of a Ping, for health checks and benchmarks. 0 or -errno. */
int vase_ping(struct vase_client *c);

/*
 * A model's geometry, and the block size of the engine's attention kernel: block_tokens tokens
 * make one page (block) of the model's paged KV cache. Kernels constrain it: vLLM's
 * FlashAttention backend wants a multiple of 16, FlashAttention-2's flash_attn_with_kvcache
 * with a block_table a multiple of 256, FlashInfer any size. 0 means 16.
 *
 * Layout (PROTOCOL.md "Memory"): a page holds block_tokens tokens of every layer, ordered
 * [layer][K,V][token][kv_head][dim], so
 *     page_bytes = block_tokens * layers * 2 * kv_heads * head_dim * dtype_bytes,
 * and block b of the model starts at byte b * page_bytes of the arena. For each layer, K (and V)
 * of the whole arena is then one strided tensor [num_blocks][block_tokens][kv_heads][head_dim]
 * (vase_model_kv_tensor()), and a sequence's block table (vase_seq_block_table()) lists int32
 * block indices into it: slot s is token s % block_tokens of block table[s / block_tokens].
 */
struct vase_geometry {
    const char *name;
    uint32_t layers, q_heads, kv_heads, head_dim;
    enum vase_dtype dtype;
    uint32_t block_tokens; /* tokens per page of the engine's attention kernel; 0: 16 */
    uint32_t arena;        /* arena id: 0 is the default arena; see vase_arena_find() */
};

/*
 * The id of the arena called name among those this client may use: "default" (arena 0), or the
 * NAME of an [arena NAME] section of vased.conf. The daemon tells each client only of the
 * arenas its uid may use (each arena is a trust domain). 0 and *ret_id; -ENOENT if this client
 * has no such arena; -EINVAL for NULL arguments.
 */
int vase_arena_find(struct vase_client *c, const char *name, uint32_t *ret_id);

/* Registers a model geometry; *ret is owned by the client (freed with it). The same geometry
 * (block_tokens 0 read as 16) under the same name on the same arena registered again on one
 * client gives back the model registered first, without a message to the daemon: a client
 * holds at most max_models_per_client distinct models, however many caches it makes. The
 * first model on a CUDA arena maps it (once per process and daemon incarnation, shared by every
 * client of the process; unmapped when the last such client disconnects). -EINVAL for a geometry
 * the arena cannot lay out (a page of block_tokens tokens larger than the arena, a bound exceeded;
 * vase_last_error() says which and what to change) or an unknown arena id, -EPROTO if the
 * daemon's layout differs from the one PROTOCOL.md prescribes. A CUDA arena that cannot be mapped:
 * -EOPNOTSUPP (libvase built without CUDA, or a driver without the VMM API for cuda-vmm), -ENODEV
 * (no CUDA device or driver, or no device with the arena's UUID visible to this process), -EBUSY
 * (the device's compute mode forbids sharing it), -ENOMEM, -EIO; vase_last_error() then says which.
 */
int vase_model_register(struct vase_client *c, const struct vase_geometry *g,
                        struct vase_model **ret);
/* Tokens per page of the model's layout: exactly its block_tokens. */
uint32_t vase_model_tokens_per_page(const struct vase_model *m);
/* Bytes of one page (block) of the model: the block stride of its tensors. */
uint64_t vase_model_page_bytes(const struct vase_model *m);

/*
 * A strided tensor in the arena, described as DLPack and PyTorch describe one. data is the
 * address of element [0][0][0][0]; element [i][j][k][l] is at
 *     data + i * byte_strides[0] + j * byte_strides[1] + k * byte_strides[2] + l * byte_strides[3]
 * (strides[] are the same in elements). On a CUDA arena data is a device address of the arena's
 * GPU, device its ordinal in this process; -1 for host memory.
 */
struct vase_tensor {
    void *data;
    enum vase_dtype dtype;
    int device;
    uint32_t ndim; /* 4 */
    int64_t shape[4];
    int64_t strides[4];
    int64_t byte_strides[4];
};

/*
 * K or V of one layer over the whole arena, as the paged-KV attention kernels take it:
 * shape [num_blocks][block_tokens][kv_heads][head_dim] with num_blocks = floor(arena bytes /
 * page_bytes), strides [page_bytes, kv_heads * head_dim, head_dim, 1] / dtype_bytes in
 * elements; the last three dimensions are contiguous. Valid as long as the client. Index it
 * with a sequence's block table: FlashAttention's flash_attn_with_kvcache(q, k_cache, v_cache,
 * block_table=...), vLLM's paged attention and FlashInfer's paged KV (NHD layout) take it as is
 * (docs/engines.md, "Attention kernels"). 0, or -EINVAL for a layer out of range.
 */
int vase_model_kv_tensor(const struct vase_model *m, uint32_t layer, enum vase_kv kv,
                         struct vase_tensor *ret);

enum vase_mode {
    VASE_MODE_ASYNC = 0,
    VASE_MODE_SYNC = 1,
};

/* The longest admission wait an open may ask for (struct vase_seq_config). */
#define VASE_MAX_ADMISSION_WAIT_MS 600000
/* The largest weight of an elastic sequence (struct vase_seq_config). */
#define VASE_MAX_WEIGHT 1000
/* The longest label of a sequence, in bytes (struct vase_seq_config). */
#define VASE_SEQ_LABEL_MAX 64

struct vase_seq_config {
    enum vase_policy policy;
    struct vase_params params; /* vase_params_default(budget) and adjust */
    /* Tokens the engine will prefill. With params.protect_prompt they are never evicted and count
     * against the budget: prompt_len must be at most budget - window (and min_budget - window
     * when elastic; vase_params_explain_prompt()), else the open fails with -EINVAL. */
    uint32_t prompt_len;
    uint64_t seed;
    enum vase_mode mode;
    int32_t slack; /* steps the engine may run ahead of a plan; -1: window */
    /* Milliseconds the open may wait for room when the arena is full: 0 (a zeroed config):
     * refused at once; N > 0 (at most 600000): wait up to N ms; -1: the daemon's
     * admission_wait_ms setting. */
    int32_t admission_wait_ms;
    /* Elastic budget: the least budget the sequence accepts when the daemon makes room for
     * waiting opens (a multiple of window, above it, at most params.budget); 0 (a zeroed
     * config): params.budget, not elastic. See "Elastic budgets" below. */
    uint32_t min_budget;
    /* Its weight when budgets are lowered (the daemon's elastic_policy); 0: 1; at most 1000. */
    uint32_t weight;
    /* What the engine calls the sequence, for the people who watch the daemon: an inference
     * server's request id, say. vasectl seqs and seq show it, as do the daemon's SeqInfo and
     * events, and its metrics when metrics_sequence_labels is on. NULL or "" (a zeroed config):
     * none. Else 1 .. VASE_SEQ_LABEL_MAX bytes, each an ASCII letter or digit or one of
     * . _ : / @ + = - (no space, quote, control character or byte above 0x7f, so that no
     * output has to escape it); anything else fails the open with -EINVAL before anything is
     * sent, vase_last_error() naming the first byte that breaks the rule by its offset and hex
     * value. Copied at the open (vase_seq_label()): the string need not outlive the call. Labels
     * need not be unique, and the daemon never acts on them. A member added in libvase.so.2. */
    const char *label;
};

/*
 * Opens a sequence: reserves all its pages at once (its KV blocks, and its query ring and plan
 * pages), or fails whole with -ENOSPC (the arena has no room for them) or -EDQUOT (the client's
 * quota, max_bytes_per_client or max_seqs_per_client); vase_last_error() gives the sizes.
 * With an admission wait (cfg->admission_wait_ms), an open that finds the arena full blocks
 * until closed sequences or departed clients free enough memory (waiting opens are admitted in
 * arrival order), or elastic sequences make room for it (below), or the wait passes (-ENOSPC,
 * the message says how long it waited). A quota refusal (-EDQUOT) never waits, nor does a
 * sequence larger than the whole arena. The client's lock is not held while the open waits:
 * other threads of the engine keep decoding its other sequences meanwhile (which is how they
 * give up budget to it, if they are elastic); a single-threaded engine uses
 * vase_seq_open_async() instead. *ret is owned by the client.
 *
 * Elastic budgets. A sequence opened with cfg->min_budget below cfg->params.budget is elastic.
 * When its budget does not fit, it is admitted at once at a lower budget that does (not below
 * min_budget; vase_seq_budget() and vase_seq_capacity() say which) and grows later; only when
 * min_budget does not fit either does the open wait or fail. While opens wait for room in its
 * arena, the daemon may lower its budget, never below
 * min_budget (how much: the daemon's elastic_policy and each sequence's weight). The engine
 * learns it with the next plan: that plan keeps the lower budget, its compaction applies it, and
 * its commit releases the pages the sequence no longer needs (capacity and block table shrink).
 * When no open waits any more, the budget grows back toward the sequence's cap (params.budget,
 * or what vase_seq_set_budget() set) at a later commit, whose reply appends the reserved pages
 * to the block table. n_large scales with the budget (n_large * budget / params.budget); the
 * other parameters stay. Budgets change only at eviction boundaries: between two plans the
 * footprint is static. vase_seq_budget() says the budget now; a sequence opened with
 * min_budget 0 never changes budget, and sync mode stays exact for it.
 */
int vase_seq_open(struct vase_client *c, struct vase_model *m, const struct vase_seq_config *cfg,
                  struct vase_seq **ret);
/*
 * vase_seq_open() that does not block: sends the open and returns at once; vase_open_poll()
 * completes it. For an engine whose one thread both admits and decodes: while an open waits for
 * admission, the engine keeps decoding, and its own elastic sequences can make the room. 0 and
 * *ret, or the errors vase_seq_open() returns before it sends anything.
 */
int vase_seq_open_async(struct vase_client *c, struct vase_model *m,
                        const struct vase_seq_config *cfg, struct vase_open **ret);
/*
 * Looks, without blocking, whether the open has been answered: 0 not yet; 1 admitted, *ret_seq
 * is the sequence; -errno refused or failed, as vase_seq_open() (-ETIMEDOUT when no answer came
 * within the admission wait and the client's timeout). After 1 or -errno the open is over and
 * freed; do not use o again.
 */
int vase_open_poll(struct vase_open *o, struct vase_seq **ret_seq);
/* Gives up an open still waiting (accepts NULL) and frees it: should the daemon admit it later,
 * libvase closes that sequence again. vase_disconnect() frees the opens still waiting. */
void vase_open_cancel(struct vase_open *o);

/*
 * What one sequence costs in an arena, computed without a daemon by the code vased lays out and
 * places sequences with (kernels/layout.c, daemon/core/alloc.c): `vasectl size` prints it.
 */
struct vase_size {
    uint64_t token_bytes;     /* K and V of one token, every layer */
    uint64_t page_bytes;      /* one KV page: block_tokens tokens */
    uint32_t slots;           /* max(prompt_len, budget) + window + slack */
    uint32_t kv_pages;        /* KV pages reserved at open: slots rounded up to whole pages */
    uint32_t ring_pages;      /* query ring pages (policies that read queries), else 0 */
    uint64_t ring_page_bytes; /* one ring page (page_bytes, unless an entry is larger) */
    uint64_t plan_page_bytes; /* the one plan page */
    uint64_t seq_bytes;       /* everything an open reserves: KV, ring and plan pages */
    uint64_t seqs;            /* sequences of this size an empty arena of arena_bytes holds */
};

/*
 * The size of a sequence of configuration cfg (cfg->params.budget, window, policy, prompt_len;
 * slack -1 is window, the daemon's default_slack unless set) for geometry g, and how many such
 * sequences an empty arena of arena_bytes in granules of granule_bytes (vased.conf) holds: the
 * count comes from placing them one after another with vased's own allocator until one does not
 * fit, so where pages of two sizes share a granule it counts what is lost there. An elastic
 * sequence is counted at its full budget. 0 and *ret, or -EINVAL with the reason, the rule
 * broken and its values, in msg (msg_size bytes; may be NULL): a geometry the arena cannot lay
 * out, parameters vase_params_explain() refuses, sizes that do not cut into granules; -ENOMEM.
 */
int vase_size_seq(const struct vase_geometry *g, const struct vase_seq_config *cfg,
                  uint64_t arena_bytes, uint64_t granule_bytes, struct vase_size *ret, char *msg,
                  size_t msg_size);

/*
 * Reopens, on a new client, a sequence of a client whose daemon restarted (its calls fail with
 * -VASE_ESTALE or -ECONNRESET): when the daemon kept the host arena across the restart
 * (vased.service's file descriptor store, a clean stop), the sequence is given back with the
 * same id, pages and block table, so its K and V are intact, and decoding goes on from old's
 * len, position and evictions (read through the new sequence: its pointers are into the new
 * client's mapping). m is a model of the new client registered with old's geometry on the same
 * arena; old keeps its configuration and the daemon's resume token. old and its dead client stay
 * valid: close them (vase_seq_close(), vase_disconnect()) after the reopen; closing old does not
 * touch the reopened sequence. 0 and *ret; -ENOENT (the daemon kept no such sequence for this
 * user: it did not stop cleanly, its arena changed, restore_grace passed, or the sequence is
 * another user's or the token is wrong, which the daemon answers the same way), -EINVAL (old is m's
 * client's already, has no token, or m's geometry is not old's), -EPROTO (the daemon's copy is not
 * old's state: a commit it never saw), or a call's -errno.
 */
int vase_seq_reopen(struct vase_model *m, const struct vase_seq *old, struct vase_seq **ret);

/* Ends a sequence and returns its pages; accepts NULL. 0 or -errno (the local state is freed
 * either way). */
int vase_seq_close(struct vase_seq *s);

uint32_t vase_seq_id(const struct vase_seq *s);
/* Slots filled now. */
uint32_t vase_seq_len(const struct vase_seq *s);
/* Slots the block table holds now (shrinks after the first eviction of a long prompt). */
uint32_t vase_seq_capacity(const struct vase_seq *s);
/* Tokens appended since the open, prompt included. */
uint64_t vase_seq_position(const struct vase_seq *s);
/* Eviction rounds applied. */
uint32_t vase_seq_rounds(const struct vase_seq *s);
/* The budget its plans keep now (elastic budgets: between min_budget and the budget it opened
 * with; that budget otherwise). */
uint32_t vase_seq_budget(const struct vase_seq *s);
/* The least budget it accepts (its budget when it is not elastic). */
uint32_t vase_seq_min_budget(const struct vase_seq *s);
/* The label it was opened with (struct vase_seq_config), "" when none; "" for NULL. The
 * sequence's copy, valid until it is closed; a reopened sequence has its old one's. */
const char *vase_seq_label(const struct vase_seq *s);
/*
 * Caps the budget of an elastic sequence: budget must be a multiple of window in [min_budget,
 * the budget it was opened with]. A cap below the budget now takes effect with the next plan
 * (lowered like a shrink to make room); a cap above it lets the sequence grow back to it at a
 * later commit, when memory is free. Waits for the daemon's answer. 0 or -errno (-EINVAL out of
 * range).
 */
int vase_seq_set_budget(struct vase_seq *s, uint32_t budget);

/* A view of one layer's K or V, every slot of the sequence, for the engine's kernels and for
 * its writes (vase_view_row() gives the address of a slot). The view stays valid until the
 * next vase_seq_poll()/vase_seq_append() that applies a plan (the block table may change).
 * On a CUDA arena base is a device address, while pages (the block table) is host memory: an
 * engine kernel takes the device copy, vase_seq_block_table_device(). */
int vase_seq_kv_view(const struct vase_seq *s, uint32_t layer, enum vase_kv kv,
                     struct vase_view *ret);
/*
 * The sequence's block table: *ret_n int32 block indices into the tensors of
 * vase_model_kv_tensor(); slot s of the sequence is token s % block_tokens of block
 * (*ret_table)[s / block_tokens]. Host memory, valid until the next call that applies a plan or
 * reads a commit's reply (vase_seq_poll(), vase_seq_wait(), vase_seq_append(),
 * vase_seq_flush()): the table only ever loses entries at its end (after the first eviction of
 * a prompt longer than the steady state, or when an elastic budget is lowered) or gains them
 * there (an elastic budget growing back), never changes an entry. 0 or -EINVAL.
 */
int vase_seq_block_table(const struct vase_seq *s, const int32_t **ret_table, uint32_t *ret_n);
/* On a CUDA arena, a device copy of the block table for the engine's kernels, sized for the
 * table at the open: its first entries are the host table's (entries a commit's reply appends
 * are copied in on the sequence's stream before the call that read it returns); NULL on the
 * host arena. */
const int32_t *vase_seq_block_table_device(const struct vase_seq *s);

/* Address of (slot, kv_head) of layer's K or V; NULL if out of range. A device address on a
 * CUDA arena. */
void *vase_seq_kv_ptr(const struct vase_seq *s, uint32_t layer, enum vase_kv kv, uint32_t slot,
                      uint32_t kv_head);
/* Address where the engine writes the query of q_head for the token at position pos (the
 * position the next vase_seq_append() will count); NULL if the policy reads no queries. A device
 * address on a CUDA arena. */
void *vase_seq_query_ptr(const struct vase_seq *s, uint32_t layer, uint64_t pos, uint32_t q_head);

/* The CUDA stream (a cudaStream_t of the arena's device; NULL: the legacy default stream) on
 * which the engine writes this sequence's K, V and queries, and on which libvase synchronises
 * and compacts (see "Ordering" above). Ignored on the host arena. 0 or -EINVAL. */
int vase_seq_set_stream(struct vase_seq *s, void *cuda_stream);

enum vase_ordering {
    VASE_ORDER_HOST = 0,   /* the default: the host waits for the stream where order needs it */
    VASE_ORDER_STREAM = 1, /* the stream carries the order; no wait on the decode path */
};

/*
 * How the sequence's eviction cycle is ordered with the engine's CUDA stream ("Ordering"
 * above): VASE_ORDER_HOST synchronises the stream before a request and after a compaction;
 * VASE_ORDER_STREAM records events instead, and sends the request and the commit from the
 * first call that finds them completed, so that the decode path never blocks on the device.
 * May be changed at any time; what is already queued still goes out when its event completes.
 * Ignored on the host arena. In stream order the compaction time of vase_seq_get_stats() is
 * the time to enqueue it. 0 or -EINVAL (an unknown ordering).
 */
int vase_seq_set_ordering(struct vase_seq *s, enum vase_ordering ordering);

/*
 * Convenience copies for examples and tests, on any arena: memcpy on the host arena, a copy on
 * the sequence's stream that is complete when the call returns on a CUDA arena.
 * vase_seq_write_kv() writes the K and V rows of token slot of layer, k and v host buffers
 * [kv_heads][head_dim] in the model's dtype; vase_seq_read_kv() reads them back.
 * vase_seq_write_query() writes the query of the token at position pos (as
 * vase_seq_query_ptr()), q a host buffer [q_heads][head_dim]. 0, -EINVAL (NULL buffer, layer or
 * slot out of range, or no query ring because the policy reads no queries), or a CUDA failure.
 */
int vase_seq_write_kv(struct vase_seq *s, uint32_t layer, uint32_t slot, const void *k,
                      const void *v);
int vase_seq_read_kv(struct vase_seq *s, uint32_t layer, uint32_t slot, void *k, void *v);
int vase_seq_write_query(struct vase_seq *s, uint32_t layer, uint64_t pos, const void *q);

/*
 * Counts n tokens the engine has written at slots len .. len + n - 1 (and their queries).
 * During the prompt (position < prompt_len) nothing is evicted; after it, a token that makes
 * len > budget and len % window == 0 starts an eviction: sync mode waits for the plan and
 * applies it before returning; async mode sends the request and returns. If the sequence is
 * full it first waits for and applies the pending plan. Returns 0, 1 if a plan was applied,
 * -ENOSPC if n tokens do not fit even after that, or -errno.
 *
 * Details (PROTOCOL.md, "Decisions libvase made"): when several of the n tokens fire the
 * trigger, only the last one starts an eviction. A plan still pending when the trigger fires is
 * applied first. In async mode the call also waits for the pending plan before returning when
 * the sequence is full or, for policies with a query ring, once window tokens were appended
 * since the request (the next query would overwrite one the daemon may still read); such waits
 * count as stalls. The n tokens are counted even when the eviction fails (it is retried at the
 * next trigger); they are not counted when the call fails first: -ENOSPC, a dead client, a
 * broken sequence, or a deferred error (vase_seq_push_stats()).
 *
 * A sequence whose plan could not be applied whole (an invalid plan: -EPROTO; or a failed
 * commit) no longer matches the daemon's view: every later call on it returns that error, and
 * it can only be closed.
 */
int vase_seq_append(struct vase_seq *s, uint32_t n);
/* Injects the draws of the next eviction request, for exact replays: exp_draws
 * [layers][kv_heads][len - window] Exp(1) draws (n_exp floats) and gauss [head_dim][rank]
 * standard normals (n_gauss floats); either may be NULL/0. Copied; used once. -EINVAL for a
 * negative or non-finite draw; -EBUSY while a request waits for the engine's stream (stream
 * order), since the draws set before it are its own. */
int vase_seq_set_draws(struct vase_seq *s, const float *exp_draws, size_t n_exp, const float *gauss,
                       size_t n_gauss);
/* Applies a ready plan, if any, without waiting. 1 if applied, 0 if none, -errno. */
int vase_seq_poll(struct vase_seq *s);
/* Waits for the pending plan, if any, and applies it. 1 if applied, 0 if none pending,
 * -ETIMEDOUT if it did not come within the client's timeout (it stays pending), -errno. */
int vase_seq_wait(struct vase_seq *s);
/*
 * Waits until the daemon has handled every message libvase sent for the sequence. libvase does
 * not wait for the reply to EvictCommit (it reads it at the next call on the sequence), and
 * stats pushes have no reply, so when another call returns the daemon may not have seen them
 * yet; anyone asking it over another connection (vasectl, a monitoring tool, a test) may then
 * see the sequence as it was before. After vase_seq_flush() returns 0 they see at least its
 * state as of the call: every applied plan committed (rounds, length, block table, state no
 * longer waiting for the commit), every pushed statistic taken in, and the pending request, if
 * any, accepted. It reads the outstanding commit reply (taking its block table, as the next call
 * would); if a push or a request is still unanswered, it adds a Ping round trip (the daemon
 * handles one client's messages in order, PROTOCOL.md). A commit or request still waiting for
 * the engine's stream (stream order) is sent first, once the stream has reached it (waited
 * for). Nothing else is sent, and a pending plan is neither waited for nor applied: call
 * vase_seq_wait() first to have its commit included.
 * An engine never needs it for its own work. 0; -ETIMEDOUT if the daemon did not answer within
 * the client's timeout (what was outstanding stays so; the call may be repeated); a refused
 * commit (the sequence is broken then, see vase_seq_append()); a refused stats push (returned
 * once, as by the other calls); -ECONNRESET, -VASE_ESTALE; -EINVAL for NULL.
 */
int vase_seq_flush(struct vase_seq *s);

enum vase_stats_kind {
    VASE_STATS_ACC_ADD = 0,       /* attention received per slot: added to the h2o accumulator */
    VASE_STATS_WINDOW_SCORES = 1, /* window scores replacing the computed ones at the next plan */
};

/* Pushes statistics for one layer: values [kv_heads][len], 1 <= len <= the sequence's len,
 * all finite and non-negative (-EINVAL otherwise, nothing sent). values is copied. Not
 * acknowledged: a refusal by the daemon is returned, once, by the next vase_seq_append(),
 * vase_seq_poll(), vase_seq_wait() or vase_seq_push_stats() on this sequence, which then does
 * nothing else. */
int vase_seq_push_stats(struct vase_seq *s, uint32_t layer, enum vase_stats_kind kind,
                        const float *values, uint32_t len);

/* Counters of what the library did for one sequence. */
struct vase_seq_stats {
    uint64_t evictions;       /* plans applied */
    uint64_t stalls;          /* appends that had to wait for a plan (the waits of sync mode,
                                 which wait by design, are not counted) */
    double stall_seconds;     /* total time waited in those */
    double compact_seconds;   /* total time spent compacting */
    double last_plan_seconds; /* the daemon's time for the last plan */
    uint64_t budget_changes;  /* elastic budgets: plans that lowered it, commits that raised it */
};
void vase_seq_get_stats(const struct vase_seq *s, struct vase_seq_stats *ret);

#ifdef __cplusplus
}
#endif
