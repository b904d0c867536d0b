/* SPDX-License-Identifier: MIT */

/*
 * The engine's side of the eviction cycle (docs/ARCHITECTURE.md and PROTOCOL.md, "The eviction
 * cycle").
 * A sequence counts the tokens the engine appends, sends an EvictRequest when the trigger of
 * ALGORITHM.md fires, and applies the plan the daemon writes into the plan area: compaction of
 * every layer's K and V, then EvictCommit, whose reply carries the block table from then on.
 * The draws and statistics an engine pushes for the next plan are push.c's.
 *
 * Invariants: at most one request per sequence is in flight (pending); the daemon reads only
 * candidate slots [0, req_len - window) and the window's queries while it plans, and the engine
 * writes only slots >= req_len and ring entries of later positions, so both sides work at the
 * same time without a lock. Two limits keep that true in async mode: the engine can never
 * write past capacity, and, for policies with a query ring, never more than window tokens past
 * the request (the next query would overwrite the oldest of the window's): when either limit is
 * reached, vase_seq_append() waits for the plan before it returns (a stall).
 *
 * A plan is validated layer by layer as it is applied; if the memory might no longer match
 * what the daemon believes (a compaction or commit failed half way), the sequence is marked
 * broken and every later call on it fails with that error.
 *
 * On a device arena (cuda-ipc, cuda-vmm) the same cycle runs on the engine's CUDA stream
 * (vase.h, "Ordering"). Host order: the stream is synchronised before a request is sent, and
 * the compaction is enqueued on it (cuda.c) and synchronised before the commit. Stream order:
 * nothing waits for the device on the decode path; a mark (an event) is recorded on the stream
 * after the engine's writes and after the compaction, and the request and the commit are
 * queued until their mark has been reached, then sent by whichever call finds it reached
 * (flush_queued()). The commit, which lets the daemon hand pages on, thus never leaves before
 * the compaction that reads them has run.
 */

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int finish_commit(struct vase_seq *s, bool wait);
static int flush_queued(struct vase_seq *s, bool wait);

/* Returns, once, the refusal of a stats push that arrived for s (0 if none), with the daemon's
 * words for vase_last_error(). Lock held. */
static int take_deferred(struct vase_seq *s) {
    int r = s->deferred_error;
    if (r < 0)
        vase__client_fail(s->client, r, "a stats push of sequence %u was refused: %s", s->id,
                          s->deferred_message);
    s->deferred_error = 0;
    return r;
}

int vase__seq_precheck(struct vase_seq *s) {
    if (!s->client->dead && vase__session_closed(s->client->session.fd))
        vase__client_check(s->client, -ECONNRESET);
    if (s->client->dead)
        return s->client->dead;
    if (s->broken)
        return vase__client_fail(s->client, s->broken,
                                 "sequence %u no longer matches the daemon's view since an "
                                 "earlier failure (%s); it can only be closed",
                                 s->id, vase_strerror(s->broken));
    int r = flush_queued(s, false);
    if (r < 0)
        return r;
    r = finish_commit(s, false);
    if (r < 0)
        return r;
    return take_deferred(s);
}

/* ---- the eviction cycle ---- */

/* Sends the EvictRequest for (len, position) and makes it the pending one. The engine's
 * writes to the slots and queries it covers are complete, and the last commit's reply read. */
static int transmit_request(struct vase_seq *s, uint32_t len, uint64_t position) {
    Vase__EvictRequest req = VASE__EVICT_REQUEST__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    uint64_t id;

    req.seq_id = s->id;
    req.len = len;
    req.ring_first = vase_layout_ring_first(position, s->window);
    req.position = position;
    req.n_exp_draws = s->n_exp;
    req.exp_draws = s->exp_draws;
    req.n_gauss = s->n_gauss;
    req.gauss = s->gauss;
    e.body_case = VASE__ENVELOPE__BODY_EVICT_REQUEST;
    e.evict_request = &req;
    int r = vase__client_check(s->client, vase__chan_send(s->client->chan, &e, &id));
    /* Draws are used once; draws too large to ever be sent are dropped too. */
    if (r == 0 || r == -EMSGSIZE)
        vase__seq_clear_draws(s);
    if (r < 0)
        return r;
    s->pending = true;
    s->pending_id = id;
    s->last_sent_id = id;
    s->req_len = len;
    s->req_position = position;
    return 0;
}

static int send_request(struct vase_seq *s, uint32_t len, uint64_t position) {
    /* Stream order: the request leaves once the stream has run the engine's writes. */
    if (s->cuda && s->ordering == VASE_ORDER_STREAM) {
        int r = vase__cuda_seq_mark(s->cuda, s->stream, VASE__CUDA_WRITTEN);
        if (r < 0)
            return r;
        s->request_queued = true;
        s->pending = true;
        s->pending_id = 0;
        s->req_len = len;
        s->req_position = position;
        return flush_queued(s, false);
    }
    /* The block table of the last commit first: the engine is about to run past the slots
     * that were safe without it. */
    int rc = finish_commit(s, true);
    if (rc < 0)
        return rc;
    /* That reply may have raised the budget past this length: the request is not due. */
    if (len <= s->budget)
        return 0;
    /* The daemon reads the slots and queries as soon as the request arrives: the engine's
     * writes on its stream must be complete (on the host the system call orders them). */
    if (s->cuda) {
        int r = vase__cuda_sync(s->model->arena->device, s->stream);
        if (r < 0)
            return r;
    }
    return transmit_request(s, len, position);
}

/* Sends EvictCommit without waiting for its reply: in the steady state the engine's next step
 * does not depend on it (the block table does not change), and finish_commit() reads the
 * reply at the next call, at the latest before the next request. A commit that releases
 * pages is waited for by apply(). Lock held. */
static int send_commit(struct vase_seq *s, uint32_t round, uint32_t new_len) {
    Vase__EvictCommit ec = VASE__EVICT_COMMIT__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    uint64_t id;

    ec.seq_id = s->id;
    ec.round = round;
    ec.new_len = new_len;
    ec.stalls = s->stats.stalls;
    ec.stall_seconds = s->stats.stall_seconds;
    ec.compact_seconds = s->stats.compact_seconds;
    e.body_case = VASE__ENVELOPE__BODY_EVICT_COMMIT;
    e.evict_commit = &ec;
    int r = vase__client_check(s->client, vase__chan_send(s->client->chan, &e, &id));
    if (r < 0)
        return r;
    s->commit_pending = true;
    s->commit_id = id;
    s->last_sent_id = id;
    return 0;
}

/* The pages the daemon keeps at a commit of new length len: the steady-state block table,
 * ceil((budget + window + slack) / block_tokens) pages, or what the length needs if that is
 * more (PROTOCOL.md, the eviction cycle). */
static uint32_t commit_keeps_pages(const struct vase_seq *s, uint32_t len) {
    const struct vase_layout *l = &s->model->layout;
    uint32_t steady =
        vase_layout_blocks_for(l, vase_layout_steady_slots(s->budget, s->window, s->slack));
    uint32_t need = vase_layout_blocks_for(l, len);
    return steady > need ? steady : need;
}

/* Whether a commit of new length len releases pages. */
static bool commit_releases_pages(const struct vase_seq *s, uint32_t len) {
    return s->n_pages > commit_keeps_pages(s, len);
}

/* Sends what waits for a mark of the engine's stream (stream order), in order: the commit once
 * the compaction has run, then the request once the engine's writes before it have. wait:
 * blocks the host until they have (for callers that wait anyway); else sends only what is
 * ready. A commit that releases pages is waited for (a round trip to the daemon, not to the
 * device), as in host order; so is the previous commit's reply before a request. 0 or -errno: a
 * commit that cannot be sent (or whose compaction failed) breaks the sequence, a request that
 * cannot be sent is over. Lock held. */
static int flush_queued(struct vase_seq *s, bool wait) {
    int r;

    if (s->commit_queued) {
        r = vase__cuda_seq_reached(s->cuda, VASE__CUDA_COMPACTED, wait);
        if (r == 0)
            return 0;
        s->commit_queued = false;
        if (r > 0)
            r = send_commit(s, s->commit_round, s->commit_len);
        if (r == 0 && commit_releases_pages(s, s->commit_len))
            r = finish_commit(s, true);
        if (r < 0) {
            s->broken = r;
            return r;
        }
    }
    if (s->request_queued) {
        r = vase__cuda_seq_reached(s->cuda, VASE__CUDA_WRITTEN, wait);
        if (r == 0)
            return 0;
        s->request_queued = false;
        s->pending = false;
        if (r > 0)
            r = finish_commit(s, true);
        /* A budget the commit's reply raised past the request's length: not due any more. */
        if (r == 0 && s->req_len > s->budget)
            r = transmit_request(s, s->req_len, s->req_position);
        if (r < 0)
            return r;
    }
    return 0;
}

/* Whether commit reply cr fits s, budget being the budget it gives (the sequence's own when it
 * gives none). The block table loses or gains entries at its end only; it gains them only with a
 * budget raised within the sequence's range, never beyond the pages of the open. */
static bool commit_reply_fits(const struct vase_seq *s, const Vase__CommitReply *cr,
                              uint32_t budget) {
    size_t common = cr->n_pages < s->n_pages ? cr->n_pages : s->n_pages;
    bool grows = budget > s->budget;
    return cr->seq_id == s->id && cr->capacity >= s->len &&
           (uint64_t)cr->n_pages * s->model->layout.block_tokens >= cr->capacity &&
           budget >= s->budget && budget <= s->max_budget && budget % s->window == 0 &&
           (cr->n_pages <= s->n_pages || grows) && cr->n_pages <= s->max_pages &&
           memcmp(cr->pages, s->pages, common * sizeof(uint32_t)) == 0;
}

/* Takes the block table, capacity and budget of commit reply cr, which fits s
 * (commit_reply_fits()). 0, or -errno with nothing taken. */
static int commit_apply(struct vase_seq *s, const Vase__CommitReply *cr, uint32_t budget) {
    uint32_t *pages = NULL;
    int r = vase__seq_copy_pages(cr->pages, cr->n_pages, s->model->layout.num_blocks, &pages);
    if (r == 0 && cr->n_pages > s->n_pages && s->cuda)
        r = vase__cuda_seq_set_table(s->cuda, s->stream, pages, s->n_pages, cr->n_pages);
    if (r < 0) {
        free(pages);
        return r;
    }
    if (budget > s->budget) {
        s->budget = budget;
        s->keep = budget - s->window;
        s->stats.budget_changes++;
    }
    free(s->pages);
    s->pages = pages;
    s->n_pages = cr->n_pages;
    s->capacity = cr->capacity;
    return 0;
}

/* The reply to a commit of s, taken if it fits. 0, or -errno: the daemon's refusal, -EPROTO for
 * a reply that does not fit (said in vase_last_error()), the apply's failure. */
static int commit_take(struct vase_seq *s, const Vase__Envelope *reply) {
    if (reply->body_case == VASE__ENVELOPE__BODY_ERROR)
        return vase__client_refused(s->client, reply->error);
    int r = -EPROTO;
    if (reply->body_case == VASE__ENVELOPE__BODY_COMMIT_REPLY) {
        const Vase__CommitReply *cr = reply->commit_reply;
        uint32_t budget = cr->budget ? cr->budget : s->budget;
        if (commit_reply_fits(s, cr, budget))
            r = commit_apply(s, cr, budget);
    }
    if (r == -EPROTO)
        vase__client_fail(s->client, r,
                          "the daemon's reply to the commit of sequence %u does not fit it", s->id);
    return r;
}

/* Reads the reply to the pending commit, if any, and takes its block table: waits for it
 * (bounded by the client's timeout) when wait is set, else only looks. 0 (done, or not there
 * yet and not waiting), or -errno; a refused commit breaks the sequence. Lock held. */
static int finish_commit(struct vase_seq *s, bool wait) {
    Vase__Envelope *reply;

    if (!s->commit_pending)
        return 0;
    int r = vase__chan_wait(s->client->chan, s->commit_id, wait ? -1 : 0, &reply);
    if (r == -EAGAIN && !wait)
        return 0;
    r = vase__client_check(s->client, r);
    if (r < 0)
        return r;
    s->commit_pending = false;
    r = commit_take(s, reply);
    if (r < 0)
        s->broken = r;
    vase__envelope__free_unpacked(reply, NULL);
    return r;
}

/* Copies one layer's keep lists ([kv_heads][K]) out of the plan area into keep. */
static void read_layer_plan(const struct vase_seq *s, uint32_t layer, uint32_t *keep) {
    const struct vase_layout *l = &s->model->layout;
    const char *map = s->model->arena->map;

    for (uint32_t h = 0; h < l->kv_heads; h++) {
        uint32_t i = layer * l->kv_heads + h;
        memcpy(keep + (size_t)h * s->keep,
               map + vase_layout_plan_offset(&s->plan, s->plan_pages, i),
               (size_t)s->keep * sizeof(*keep));
    }
}

/* Compacts every layer by the plan on the CPU. The new length, or -errno (-EPROTO for a bad
 * list: layer by layer, the lists are checked before anything of that layer moves, so a bad
 * one leaves the earlier layers compacted). */
static int compact_host(struct vase_seq *s, uint32_t n) {
    const struct vase_layout *l = &s->model->layout;
    int new_len = 0;

    uint32_t *keep = malloc((size_t)l->kv_heads * s->keep * sizeof(*keep) + 1);
    if (!keep)
        return -ENOMEM;
    for (uint32_t layer = 0; layer < l->layers; layer++) {
        read_layer_plan(s, layer, keep);
        struct vase_view kv = vase_layout_kv_view(l, s->model->arena->map, s->pages, layer, VASE_K);
        struct vase_view vv = vase_layout_kv_view(l, s->model->arena->map, s->pages, layer, VASE_V);
        new_len = vase_compact_layer(&kv, &vv, keep, s->keep, n, s->len);
        if (new_len < 0) {
            new_len = new_len == -EINVAL ? -EPROTO : new_len;
            break;
        }
    }
    free(keep);
    return new_len;
}

/* Compacts every layer on the engine's stream and, in host order, waits for it (cuda.c). The
 * kernel checks each layer's lists on the device and moves nothing of a layer whose lists are
 * bad. */
static int compact_device(struct vase_seq *s, uint32_t n, bool ordered) {
    struct vase__cuda_compact cc = {
        .layout = &s->model->layout,
        .arena_base = s->model->arena->map,
        .pages = s->pages,
        .n_pages = s->n_pages,
        .plan_pages = s->plan_pages,
        .plan = &s->plan,
        .keep = s->keep,
        .n = n,
        .len = s->len,
    };
    return vase__cuda_compact(s->cuda, s->stream, &cc, ordered);
}

/* Applies the reply to the pending request. 1 if a plan was applied; the daemon's error if it
 * could not plan (the request is over then); -errno. */
static int apply(struct vase_seq *s, Vase__Envelope *e) {
    int r;

    s->pending = false;
    if (e->body_case == VASE__ENVELOPE__BODY_ERROR)
        return vase__client_refused(s->client, e->error);
    const Vase__EvictPlan *p =
        e->body_case == VASE__ENVELOPE__BODY_EVICT_PLAN ? e->evict_plan : NULL;
    uint32_t n = s->req_len - s->window;
    /* The plan's budget: the sequence's, or lower when the daemon made room (never below
     * min_budget); a daemon without elastic budgets sends none. */
    uint32_t budget = p && p->budget ? p->budget : s->budget;
    if (!p || p->seq_id != s->id || p->len != s->req_len || p->n != n || budget < s->min_budget ||
        budget > s->budget || budget % s->window || p->keep != budget - s->window) {
        r = vase__client_fail(s->client, -EPROTO,
                              "the daemon's reply does not answer the eviction request of "
                              "sequence %u",
                              s->id);
        goto broken;
    }
    /* Even a plan that cannot be applied (for want of memory, say) breaks the sequence: the
     * reply is consumed, and the daemon keeps waiting for a commit that will not come. */
    if (budget != s->budget) {
        s->budget = budget;
        s->keep = p->keep;
        s->stats.budget_changes++;
    }
    bool ordered = s->cuda && s->ordering == VASE_ORDER_STREAM;
    double t0 = now_seconds();
    int new_len = s->cuda ? compact_device(s, n, ordered) : compact_host(s, n);
    if (new_len < 0) {
        r = new_len;
        if (r == -EPROTO)
            vase__client_fail(s->client, r,
                              "the plan of sequence %u holds a keep list that is not distinct "
                              "slots below %u",
                              s->id, n);
        goto broken;
    }
    s->stats.compact_seconds += now_seconds() - t0;

    s->len = (uint32_t)new_len;
    s->rounds++;
    s->stats.evictions++;
    s->stats.last_plan_seconds = p->plan_seconds;
    if (ordered) {
        /* The commit leaves once the compaction has run. Until its reply, the engine must not
         * write into pages it will release: the capacity is what the daemon keeps. */
        s->commit_queued = true;
        s->commit_round = p->round;
        s->commit_len = s->len;
        uint64_t keeps = (uint64_t)commit_keeps_pages(s, s->len) * s->model->layout.block_tokens;
        if (keeps < s->capacity)
            s->capacity = (uint32_t)keeps;
        r = flush_queued(s, false);
        if (r < 0)
            goto broken;
        return 1;
    }
    r = send_commit(s, p->round, s->len);
    /* A commit that hands pages back (a prompt longer than the steady state) is waited for,
     * so that the block table and capacity the engine sees are the daemon's at once. */
    if (r == 0 && commit_releases_pages(s, s->len))
        r = finish_commit(s, true);
    if (r < 0)
        goto broken;
    return 1;

broken:
    s->broken = r;
    return r;
}

/* Waits (at most the client's timeout) for the pending plan and applies it. A wait counted as a
 * stall adds to the sequence's stall statistics. Lock held. */
static int wait_and_apply(struct vase_seq *s, bool stall) {
    Vase__Envelope *e;
    double t0 = now_seconds();

    /* A request still queued (stream order) is sent first, once the stream has run up to it. */
    int r = s->request_queued ? flush_queued(s, true) : 0;
    if (r == 0)
        r = vase__client_check(s->client, vase__chan_wait(s->client->chan, s->pending_id, -1, &e));
    if (stall) {
        s->stats.stalls++;
        s->stats.stall_seconds += now_seconds() - t0;
    }
    if (r < 0)
        return r;
    r = apply(s, e);
    vase__envelope__free_unpacked(e, NULL);
    return r;
}

/* The last of the n tokens just counted whose append fires the trigger, as the number of tokens
 * counted after it; -1 if none does. */
static int64_t last_trigger(const struct vase_seq *s, uint32_t n) {
    for (uint32_t after = 0; after < n; after++) {
        uint64_t pos = s->position - 1 - after;
        if (pos < s->prompt_len)
            break;
        if (vase_layout_evict_due(pos, s->prompt_len, s->len - after, s->budget, s->window))
            return after;
    }
    return -1;
}

int vase_seq_append(struct vase_seq *s, uint32_t n) {
    int r, applied = 0;

    if (!s)
        return -EINVAL;
    vase__client_lock(s->client);
    r = vase__seq_precheck(s);
    if (r < 0 || n == 0)
        goto out;
    if ((uint64_t)s->len + n > s->capacity && s->pending) {
        r = wait_and_apply(s, true);
        if (r < 0)
            goto out;
        applied = 1;
    }
    if ((uint64_t)s->len + n > s->capacity) {
        r = vase__client_fail(s->client, -ENOSPC,
                              "%u tokens do not fit sequence %u: %u of %u slots are filled", n,
                              s->id, s->len, s->capacity);
        goto out;
    }
    s->len += n;
    s->position += n;

    int64_t after = last_trigger(s, n);
    if (after >= 0) {
        /* Never two requests in flight: the pending plan goes first. Compaction keeps len
         * modulo the window and moves the tail as a block, so the trigger still holds for the
         * same token, now at len - after. */
        if (s->pending) {
            r = wait_and_apply(s, true);
            if (r < 0)
                goto out;
            applied = 1;
        }
        r = send_request(s, s->len - (uint32_t)after, s->position - (uint64_t)after);
        if (r < 0)
            goto out;
        /* Sync mode waits by design: a stall is an async engine outrunning its plan. */
        if (s->mode == VASE_MODE_SYNC && s->pending) {
            r = wait_and_apply(s, false);
            if (r < 0)
                goto out;
            applied = 1;
        }
    }
    /* The engine's next write must not land where the daemon may still read: a full block
     * table, or a query ring about to wrap onto the window's queries. */
    if (s->pending && (s->len >= s->capacity ||
                       (s->n_ring_pages && s->position - s->req_position >= s->window))) {
        r = wait_and_apply(s, true);
        if (r < 0)
            goto out;
        applied = 1;
    }
    r = applied;
out:
    pthread_mutex_unlock(&s->client->lock);
    return r;
}

int vase_seq_poll(struct vase_seq *s) {
    Vase__Envelope *e;
    int r;

    if (!s)
        return -EINVAL;
    vase__client_lock(s->client);
    r = vase__seq_precheck(s);
    if (r < 0)
        goto out;
    if (s->pending && s->request_queued) {
        r = 0; /* not sent yet: the engine's stream has not reached it */
    } else if (s->pending) {
        r = vase__client_check(s->client, vase__chan_wait(s->client->chan, s->pending_id, 0, &e));
        if (r == 0) {
            r = apply(s, e);
            vase__envelope__free_unpacked(e, NULL);
        } else if (r == -EAGAIN)
            r = 0;
    } else
        r = vase__client_check(s->client, vase__chan_drain(s->client->chan));
    /* A refusal that arrived just now is reported now rather than one step later. */
    if (r == 0)
        r = take_deferred(s);
out:
    pthread_mutex_unlock(&s->client->lock);
    return r;
}

int vase_seq_wait(struct vase_seq *s) {
    int r;

    if (!s)
        return -EINVAL;
    vase__client_lock(s->client);
    r = vase__seq_precheck(s);
    if (r == 0 && s->pending)
        r = wait_and_apply(s, false);
    pthread_mutex_unlock(&s->client->lock);
    return r;
}

int vase_seq_flush(struct vase_seq *s) {
    int r;

    if (!s)
        return -EINVAL;
    vase__client_lock(s->client);
    r = vase__seq_precheck(s);
    if (r == 0)
        r = flush_queued(s, true);
    if (r == 0)
        r = finish_commit(s, true);
    /* A push or a request nothing has answered yet: the daemon handles a client's messages in
     * order, so the reply to a Ping sent now comes after it has handled them. A refusal of a
     * push arrives before that reply and is returned now. */
    if (r == 0 && s->last_sent_id > vase__chan_answered(s->client->chan)) {
        r = vase__client_ping(s->client);
        if (r == 0)
            r = take_deferred(s);
    }
    pthread_mutex_unlock(&s->client->lock);
    return r;
}
