/* SPDX-License-Identifier: MIT */

/*
 * The daemon's half of the eviction cycle, in the order it runs (lib/cycle.c is the engine's
 * half): EvictRequest → a plan run → plan done → EvictCommit → surplus pages released. A
 * sequence is IDLE, PLANNING (its run is with the evictor) or PLAN_READY (the engine has the
 * plan, not yet applied); a request in another state is refused and changes nothing. A run holds
 * copies of everything the evictor threads read besides the arena, so AttnStats and the main
 * loop may go on changing the sequence meanwhile; a sequence closed while planning is freed only
 * when its run comes back (registry.c). AttnStats are charged to the client's statistics quota
 * before anything is kept.
 */

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/access.h"
#include "core/alloc.h"
#include "serve/clients.h"
#include "core/arena.h"
#include "serve/elastic.h"
#include "cycle.h"
#include "plan/evictor.h"
#include "core/log.h"
#include "serve/metrics.h"
#include "serve/publish.h"
#include "core/registry.h"
#include "reply.h"
#include "state.h"
#include "wire.h"

static bool all_finite(const float *x, size_t n, bool nonnegative) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]) || (nonnegative && x[i] < 0.0f))
            return false;
    return true;
}

static float *copy_floats(const float *x, size_t n) {
    float *c = malloc(n ? n * sizeof(float) : 1);
    if (c && n)
        memcpy(c, x, n * sizeof(float));
    return c;
}

/* The run's copies of the sequence: its geometry, parameters and page lists, and room for the
 * keep lists the threads write. 0 or -ENOMEM. */
static int copy_seq(struct vased *d, struct vased_seq *s, const Vase__EvictRequest *req,
                    struct vase_plan_run *run) {
    const struct vase_arena *a = d->arenas[s->arena_id];
    uint32_t L = s->layout.layers, H = s->layout.kv_heads;

    run->seq_id = s->id;
    run->round = s->rounds;
    run->len = req->len;
    run->n = req->len - s->params.window;
    /* A budget lowered to make room takes effect with this plan (elastic.h). */
    uint32_t budget = vase_elastic_plan_budget(s);
    run->params = vase_params_at_budget(&s->max_params, budget);
    run->keep = vase_plan_keep_count(&run->params);
    run->layers = L;
    run->kv_heads = H;
    run->q_heads = s->layout.q_heads;
    run->head_dim = s->layout.head_dim;
    run->dtype = s->layout.dtype;
    run->policy = s->policy;
    run->prompt_len = s->prompt_len;
    run->seed = s->seed;
    run->arena = a;
    run->arena_base = a->map;
    run->layout = s->layout;
    run->ring_first = req->ring_first;
    run->plan = s->plan;
    run->n_pages = s->n_pages;
    run->n_plan_pages = s->n_plan_pages;
    run->owner = s;

    run->pages = malloc((size_t)s->n_pages * sizeof(uint32_t));
    run->plan_pages = malloc((size_t)s->n_plan_pages * sizeof(uint32_t));
    run->keep_lists = malloc((size_t)L * H * run->keep * sizeof(uint32_t));
    if (!run->pages || !run->plan_pages || !run->keep_lists)
        return -ENOMEM;
    memcpy(run->pages, s->pages, (size_t)s->n_pages * sizeof(uint32_t));
    memcpy(run->plan_pages, s->plan_pages, (size_t)s->n_plan_pages * sizeof(uint32_t));
    if (s->n_ring_pages) {
        run->ring_pages = malloc((size_t)s->n_ring_pages * sizeof(uint32_t));
        if (!run->ring_pages)
            return -ENOMEM;
        memcpy(run->ring_pages, s->ring_pages, (size_t)s->n_ring_pages * sizeof(uint32_t));
    }
    return 0;
}

/* The random draws the engine sent (the reference's, for exact reproduction), checked and
 * copied. 0, -EINVAL with msg filled, or -ENOMEM. */
static int copy_draws(const struct vased_seq *s, const Vase__EvictRequest *req,
                      struct vase_plan_run *run, char *msg, size_t msg_len) {
    size_t draws = (size_t)run->layers * run->kv_heads * run->n;

    if (req->n_exp_draws) {
        if (req->n_exp_draws != draws) {
            snprintf(msg, msg_len,
                     "exp_draws has %zu floats; layers * kv_heads * (len - window) "
                     "= %zu",
                     req->n_exp_draws, draws);
            return -EINVAL;
        }
        if (!all_finite(req->exp_draws, req->n_exp_draws, true)) {
            snprintf(msg, msg_len, "exp_draws must be finite and non-negative");
            return -EINVAL;
        }
        if (!(run->exp_draws = copy_floats(req->exp_draws, req->n_exp_draws)))
            return -ENOMEM;
    }
    if (req->n_gauss) {
        size_t want = (size_t)run->head_dim * s->params.rank;
        if (req->n_gauss != want) {
            snprintf(msg, msg_len, "gauss has %zu floats; head_dim * rank = %zu", req->n_gauss,
                     want);
            return -EINVAL;
        }
        if (!all_finite(req->gauss, req->n_gauss, false)) {
            snprintf(msg, msg_len, "gauss must be finite");
            return -EINVAL;
        }
        if (!(run->gauss = copy_floats(req->gauss, req->n_gauss)))
            return -ENOMEM;
    }
    return 0;
}

/* A snapshot of the accumulated attention: AttnStats may keep adding to the live accumulators
 * while the plan is computed. 0 or -ENOMEM. */
static int snapshot_acc(const struct vased_seq *s, struct vase_plan_run *run) {
    uint32_t L = run->layers, H = run->kv_heads, n = run->n;
    size_t per_layer = (size_t)H * n;

    run->acc = calloc((size_t)L * per_layer, sizeof(float));
    if (!run->acc)
        return -ENOMEM;
    if (s->acc)
        for (uint32_t l = 0; l < L; l++)
            for (uint32_t h = 0; h < H; h++)
                memcpy(run->acc + l * per_layer + (size_t)h * n,
                       s->acc + ((size_t)l * H + h) * s->acc_stride, n * sizeof(float));
    return 0;
}

/* The window scores pushed for each layer, cut to the plan's n slots; a layer without them is
 * scored from the query ring, so ring_first must then point into it. 0, -EINVAL with msg
 * filled, or -ENOMEM. */
static int snapshot_scores(const struct vased_seq *s, const Vase__EvictRequest *req,
                           struct vase_plan_run *run, char *msg, size_t msg_len) {
    uint32_t L = run->layers, H = run->kv_heads, n = run->n, W = s->params.window;
    bool all_layers_scored = true;

    run->scores = calloc(L, sizeof(float *));
    if (!run->scores)
        return -ENOMEM;
    for (uint32_t l = 0; l < L; l++) {
        if (!s->scores[l]) {
            all_layers_scored = false;
            continue;
        }
        if (s->scores_len[l] < n) {
            snprintf(msg, msg_len,
                     "window scores pushed for layer %u cover %u slots; the "
                     "plan needs %u",
                     l, s->scores_len[l], n);
            return -EINVAL;
        }
        run->scores[l] = malloc((size_t)H * n * sizeof(float));
        if (!run->scores[l])
            return -ENOMEM;
        for (uint32_t h = 0; h < H; h++)
            memcpy(run->scores[l] + (size_t)h * n, s->scores[l] + (size_t)h * s->scores_len[l],
                   n * sizeof(float));
    }
    if (!all_layers_scored && (s->n_ring_pages == 0 || req->ring_first >= 2 * W)) {
        snprintf(msg, msg_len, "ring_first %u is not a ring entry (0 .. %u)", req->ring_first,
                 2 * W - 1);
        return -EINVAL;
    }
    return 0;
}

/* Builds the run of an eviction request: copies of everything the threads will read. 0, or
 * -EINVAL or -ENOMEM with msg filled. */
static int build_run(struct vased *d, struct vased_seq *s, const Vase__EvictRequest *req,
                     struct vase_plan_run *run, char *msg, size_t msg_len) {
    unsigned needs = vase_policy_needs(s->policy);
    int r = copy_seq(d, s, req, run);
    if (r >= 0)
        r = copy_draws(s, req, run, msg, msg_len);
    if (r >= 0 && (needs & VASE_NEEDS_ACC))
        r = snapshot_acc(s, run);
    if (r >= 0 && (needs & VASE_NEEDS_Q))
        r = snapshot_scores(s, req, run, msg, msg_len);
    if (r == -ENOMEM)
        snprintf(msg, msg_len, "out of memory");
    return r;
}

static int handle_evict_request(struct vased *d, struct vased_client *c,
                                const struct vase_reply_to *p, const Vase__EvictRequest *req) {
    struct vased_seq *s = vase_reply_own_seq(d, c, p, req->seq_id);
    if (!s)
        return 0;
    uint32_t W = s->params.window;
    if (d->stopping)
        return vase_reply_error(d, p, ESHUTDOWN, "the daemon is shutting down");
    if (s->state != VASED_SEQ_IDLE)
        return vase_reply_error(d, p, EBUSY,
                                "sequence %u has an uncommitted eviction (round %u, %s)", s->id,
                                s->rounds, vase_registry_state_name(s->state));
    if (req->len <= s->params.budget || req->len % W != 0)
        return vase_reply_error(d, p, EINVAL,
                                "len %u must be above budget %u and a multiple of "
                                "window %u",
                                req->len, s->params.budget, W);
    if (req->len > s->capacity)
        return vase_reply_error(d, p, EINVAL, "len %u exceeds the sequence's capacity %u", req->len,
                                s->capacity);
    if (req->position < req->len)
        return vase_reply_error(d, p, EINVAL, "position %llu is below len %u",
                                (unsigned long long)req->position, req->len);

    struct vase_plan_run *run;
    char msg[256];
    if (vase_plan_run_new(&run) < 0)
        return vase_reply_error(d, p, ENOMEM, "out of memory");
    int r = build_run(d, s, req, run, msg, sizeof(msg));
    /* Pushed window scores serve one plan attempt, whatever its outcome. */
    vase_registry_drop_scores(s);
    if (r < 0) {
        vase_plan_run_free(run);
        return vase_reply_error(d, p, -r, "bad evict_request for sequence %u: %s", s->id, msg);
    }
    if (p->id_len > sizeof(run->routing_id)) {
        vase_plan_run_free(run);
        return vase_reply_error(d, p, EINVAL, "routing id too long");
    }
    memcpy(run->routing_id, p->id, p->id_len);
    run->routing_id_len = p->id_len;
    run->request_id = p->request_id;
    run->uid = (uint32_t)c->uid;
    run->tenant = c->id;

    r = vase_evictor_submit(d->evictor, run);
    if (r < 0) {
        vase_plan_run_free(run);
        return vase_reply_error(d, p, -r, "cannot queue the plan: %s", strerror(-r));
    }
    s->run = run;
    s->state = VASED_SEQ_PLANNING;
    s->len = req->len;
    s->position = req->position;
    d->evictions_in_flight++;
    return 0;
}

/* The plan of a finished run, as the engine gets it and as the eviction event publishes it. */
static void evict_plan_of(const struct vased_seq *s, const struct vase_plan_run *run,
                          Vase__EvictPlan *ret) {
    vase__evict_plan__init(ret);
    ret->seq_id = s->id;
    ret->round = run->round;
    ret->n = run->n;
    ret->len = run->len;
    ret->keep = run->keep;
    ret->budget = run->params.budget;
    ret->plan_seconds = run->seconds;
}

/*
 * A plan failed with the planner's context on its device lost (a sticky CUDA error, logged by
 * the planner): every later plan there would fail the same way while the daemon looked alive, so
 * the main loop stops, and vased exits with a status that has systemd restart it (the unit's
 * Restart=on-failure). Clients see their session close and reconnect to the new daemon.
 */
static void fail_device(struct vased *d, const struct vase_plan_run *run) {
    if (d->exit_error == 0)
        log_error("Arena %u: the GPU context of vased is lost (sticky CUDA error while planning "
                  "sequence %u); stopping, so that vased is restarted.",
                  run->arena ? run->arena->id : 0, run->seq_id);
    d->exit_error = -ENOTRECOVERABLE;
    d->quit = true;
}

void vase_cycle_plan_done(struct vased *d, struct vase_plan_run *run) {
    struct vased_seq *s = run->owner;

    d->evictions_in_flight--;
    if (run->error == -ENOTRECOVERABLE)
        fail_device(d, run);
    if (!s->client) {
        /* Closed, or its client died, while the plan was computed: now its pages are free. */
        log_debug("Plan of closed sequence %u finished; releasing its pages.", s->id);
        vase_registry_reap(d->reg, d->allocs[s->arena_id], s);
        vase_publish_pressure(d, false);
        return;
    }

    /* The reply goes to whoever asked; the run's copy of its routing id dies with the run. */
    uint8_t id[sizeof(run->routing_id)];
    memcpy(id, run->routing_id, run->routing_id_len);
    struct vase_reply_to p = {.id = id,
                              .id_len = run->routing_id_len,
                              .request_id = run->request_id,
                              .body = VASE__ENVELOPE__BODY_EVICT_REQUEST};

    if (run->error) {
        int r = run->error;
        uint32_t layer = run->error_layer;
        s->run = vase_plan_run_free(run);
        s->state = VASED_SEQ_IDLE;
        /* Everything else was checked before the plan started, and pushed statistics are
         * checked when they arrive, so -EINVAL here means the rows the plan read from the
         * arena. The sequence stays usable: the engine may fix its data and ask again. */
        if (r == -EINVAL)
            vase_reply_error(d, &p, EINVAL,
                             "NaN or Inf in the keys/values/queries of layer %u of "
                             "sequence %u; no plan",
                             layer, s->id);
        else
            vase_reply_error(d, &p, -r, "planning layer %u of sequence %u failed: %s", layer, s->id,
                             strerror(-r));
        return;
    }
    s->state = VASED_SEQ_PLAN_READY;
    s->last_plan_seconds = run->seconds;
    d->evictions_total++;
    vase_metrics_observe_plan(&d->metrics, run->policy, run->seconds);

    Vase__EvictPlan ep;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    evict_plan_of(s, run, &ep);
    e.body_case = VASE__ENVELOPE__BODY_EVICT_PLAN;
    e.evict_plan = &ep;
    vase_reply_send(d, &p, &e);
}

/* Compacts the accumulated attention of s as the engine compacted its cache: the run's keep lists
 * applied to len_now slots. */
static void compact_stats(struct vased_seq *s, const struct vase_plan_run *run, uint32_t len_now) {
    uint32_t K = run->keep, N = run->n;
    if (!s->acc)
        return;
    for (uint32_t l = 0; l < s->layers; l++) {
        int r = vase_compact_f32(s->acc + (size_t)l * s->kv_heads * s->acc_stride, s->kv_heads,
                                 s->acc_stride, run->keep_lists + (size_t)l * s->kv_heads * K, K, N,
                                 len_now);
        if (r < 0) {
            /* Half-compacted statistics would mislead every later plan; none is better. */
            log_warning_errno(r,
                              "Cannot compact the accumulated attention of sequence %u; "
                              "dropping it: %m",
                              s->id);
            vase_registry_drop_acc(s);
            return;
        }
    }
}

/* Pages a long prompt needed beyond the steady state go back now; keep what the current
 * length still needs, the rest returns at a later commit. > 0 if pages were released. */
static int release_surplus(struct vased *d, struct vased_seq *s, uint32_t new_len) {
    uint32_t steady = vase_layout_blocks_for(
        &s->layout, vase_layout_steady_slots(s->params.budget, s->params.window, s->slack));
    uint32_t need = vase_layout_blocks_for(&s->layout, new_len);
    uint32_t target = steady > need ? steady : need;
    int r = vase_registry_shrink_seq(s, d->allocs[s->arena_id], target);
    if (r < 0)
        log_error_errno(r, "Cannot release surplus pages of sequence %u: %m", s->id);
    return r;
}

/*
 * The engine's cumulative counters of s as the commit reports them (EvictCommit 4-6), untrusted:
 * taken only when finite, non-negative, none below the last accepted ones and each increase
 * within what the client's time connected allows; the increase goes to the metrics of s's
 * policy. A report that is not taken adds nothing (the commit goes on) and is logged once per
 * sequence; one that only jumped is the base of the next.
 */
static void take_engine_report(struct vased *d, struct vased_client *c, struct vased_seq *s,
                               const Vase__EvictCommit *req) {
    double stall = req->stall_seconds, compact = req->compact_seconds;
    bool sane = isfinite(stall) && isfinite(compact) && stall >= s->engine_stall_seconds &&
                compact >= s->engine_compact_seconds && req->stalls >= s->engine_stalls;
    /* Nothing the engine did since its last report can take longer than it has been connected,
     * nor can it have waited more times than the bound below: a report beyond either would let
     * one client wrap or saturate the counters every client shares. */
    double connected = vased_now() - c->connected_at + 1.0;
    bool bounded = sane && stall - s->engine_stall_seconds <= connected &&
                   compact - s->engine_compact_seconds <= connected &&
                   req->stalls - s->engine_stalls <= UINT32_MAX;
    if (!bounded) {
        d->metrics.engine_reports_ignored++;
        if (!s->engine_report_logged && vase_clients_log_ok(c))
            log_notice("Client %u: the commit of sequence %u reports stalls %llu, stall_seconds "
                       "%g, compact_seconds %g: not finite, negative, below the last ones "
                       "(%llu, %g, %g) or more than the client's time connected allows; not "
                       "counted.",
                       c->id, s->id, (unsigned long long)req->stalls, stall, compact,
                       (unsigned long long)s->engine_stalls, s->engine_stall_seconds,
                       s->engine_compact_seconds);
        s->engine_report_logged = true;
        /* Values that only jumped (a sequence reopened after a restart carries its engine's
         * earlier totals) become the base the next reports are counted from. */
        if (!sane)
            return;
    } else if ((unsigned)s->policy < _VASE_POLICY_MAX) {
        struct vase_metrics_policy *mp = &d->metrics.policy[s->policy];
        mp->engine_stalls += req->stalls - s->engine_stalls;
        mp->engine_stall_seconds += stall - s->engine_stall_seconds;
        mp->engine_compact_seconds += compact - s->engine_compact_seconds;
    }
    s->engine_stalls = req->stalls;
    s->engine_stall_seconds = stall;
    s->engine_compact_seconds = compact;
}

static int handle_evict_commit(struct vased *d, struct vased_client *c,
                               const struct vase_reply_to *p, const Vase__EvictCommit *req) {
    struct vased_seq *s = vase_reply_own_seq(d, c, p, req->seq_id);
    if (!s)
        return 0;
    if (s->state != VASED_SEQ_PLAN_READY)
        return vase_reply_error(d, p, EINVAL, "sequence %u has no plan to commit (it is %s)", s->id,
                                vase_registry_state_name(s->state));
    struct vase_plan_run *run = s->run;
    if (req->round != run->round)
        return vase_reply_error(d, p, EINVAL,
                                "commit of round %u, but the plan of sequence %u is "
                                "round %u",
                                req->round, s->id, run->round);

    uint32_t K = run->keep, N = run->n;
    /* new_len = K + len_now - N with run->len <= len_now <= capacity. */
    uint64_t len_now = (uint64_t)req->new_len + N - K;
    if (req->new_len < K || len_now < run->len || len_now > s->capacity)
        return vase_reply_error(d, p, EINVAL,
                                "new_len %u does not fit: it must be K + len - N with "
                                "len between the request's %u and the capacity %u (K %u, N %u)",
                                req->new_len, run->len, s->capacity, K, N);

    take_engine_report(d, c, s, req);
    compact_stats(s, run, (uint32_t)len_now);
    /* The plan's budget is the sequence's from now on; lowered, it releases pages here. A
     * sequence below its target may take pages back (elastic.h), but not at a commit that
     * released some: the reply's table would then differ from the engine's where the released
     * pages were, and the engine may still hold them until it reads the reply. */
    vase_elastic_committed(d, s, run->params.budget, run->round);
    uint64_t used = d->allocs[s->arena_id]->used_bytes;
    int r = release_surplus(d, s, req->new_len);
    if (r == 0)
        vase_elastic_grow(d, s);

    Vase__EvictPlan ep;
    evict_plan_of(s, run, &ep);
    vase_publish_eviction(d, &ep);

    s->rounds++;
    s->len = req->new_len;
    s->state = VASED_SEQ_IDLE;
    s->run = vase_plan_run_free(run);

    Vase__CommitReply cr = VASE__COMMIT_REPLY__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    cr.seq_id = s->id;
    cr.capacity = s->capacity;
    cr.n_pages = s->n_pages;
    cr.pages = s->pages;
    cr.budget = s->params.budget;
    e.body_case = VASE__ENVELOPE__BODY_COMMIT_REPLY;
    e.commit_reply = &cr;
    vase_reply_send(d, p, &e);
    if (d->allocs[s->arena_id]->used_bytes != used)
        vase_publish_pressure(d, false);
    return 0;
}

static int handle_attn_stats(struct vased *d, struct vased_client *c, const struct vase_reply_to *p,
                             const Vase__AttnStats *req) {
    struct vased_seq *s = vase_reply_own_seq(d, c, p, req->seq_id);
    if (!s)
        return 0;
    uint32_t H = s->kv_heads;
    if (req->layer >= s->layers)
        return vase_reply_error(d, p, EINVAL, "attn_stats: layer %u of %u", req->layer, s->layers);
    if (req->kind != VASE__STATS_KIND__STATS_ACC_ADD &&
        req->kind != VASE__STATS_KIND__STATS_WINDOW_SCORES)
        return vase_reply_error(d, p, EINVAL, "attn_stats: unknown kind %d", (int)req->kind);
    if (req->len == 0 || req->len > s->capacity)
        return vase_reply_error(d, p, EINVAL, "attn_stats: len %u must be 1 .. capacity %u",
                                req->len, s->capacity);
    if (req->n_values != (size_t)H * req->len)
        return vase_reply_error(d, p, EINVAL, "attn_stats: %zu values; kv_heads * len = %zu",
                                req->n_values, (size_t)H * req->len);
    /* Attention received and window scores are means of probabilities: a negative one would
     * lower an accumulator that every later plan reads, or weigh a sample (ALGORITHM: weights
     * are non-negative). */
    if (!all_finite(req->values, req->n_values, true))
        return vase_reply_error(
            d, p, EINVAL, "attn_stats: NaN, Inf or a negative value in the values of layer %u",
            req->layer);

    /* What the daemon keeps of this message is charged to the client first: its heap is
     * shared by every client. */
    uint64_t quota = d->cfg.max_stats_bytes_per_client;
    uint64_t add = req->kind == VASE__STATS_KIND__STATS_ACC_ADD
                       ? (s->acc ? 0 : vase_registry_acc_bytes(s))
                       : req->n_values * sizeof(float);
    uint64_t freed = req->kind == VASE__STATS_KIND__STATS_WINDOW_SCORES && s->scores[req->layer]
                         ? (uint64_t)s->scores_len[req->layer] * H * sizeof(float)
                         : 0;
    if (add > freed && !vase_registry_stats_fit(s, add - freed, quota))
        return vase_reply_error(
            d, p, EDQUOT,
            "attn_stats: keeping %llu more bytes would take the "
            "client's statistics over max_stats_bytes_per_client (%llu; it holds "
            "%llu)",
            (unsigned long long)(add - freed), (unsigned long long)quota,
            (unsigned long long)c->stats_bytes);
    if (add > freed && vase_access_uid_capped(d, c->uid)) {
        /* The clients of one uid share one allowance: more sessions bring no more of it. */
        struct vased_uid_usage used;
        uint64_t uid_quota = d->cfg.max_stats_bytes_per_uid;
        vase_registry_uid_usage(d->reg, c->uid, &used);
        if (add - freed > uid_quota || used.stats_bytes > uid_quota - (add - freed))
            return vase_reply_error(d, p, EDQUOT,
                                    "attn_stats: keeping %llu more bytes would take the "
                                    "statistics of uid %u's clients over "
                                    "max_stats_bytes_per_uid (%llu; they hold %llu)",
                                    (unsigned long long)(add - freed), (unsigned)c->uid,
                                    (unsigned long long)uid_quota,
                                    (unsigned long long)used.stats_bytes);
    }

    if (req->kind == VASE__STATS_KIND__STATS_ACC_ADD) {
        if (!s->acc) {
            s->acc = calloc((size_t)s->layers * H * s->acc_stride, sizeof(float));
            if (!s->acc)
                return vase_reply_error(d, p, ENOMEM, "attn_stats: out of memory");
            vase_registry_charge_stats(s, (int64_t)add);
        }
        for (uint32_t h = 0; h < H; h++) {
            float *acc = s->acc + ((size_t)req->layer * H + h) * s->acc_stride;
            const float *v = req->values + (size_t)h * req->len;
            for (uint32_t j = 0; j < req->len; j++)
                acc[j] += v[j];
        }
    } else {
        float *copy = copy_floats(req->values, req->n_values);
        if (!copy)
            return vase_reply_error(d, p, ENOMEM, "attn_stats: out of memory");
        vase_registry_charge_stats(s, -(int64_t)freed);
        vase_registry_charge_stats(s, (int64_t)add);
        free(s->scores[req->layer]);
        s->scores[req->layer] = copy;
        s->scores_len[req->layer] = req->len;
    }
    d->stats_messages_total++;
    return 0;
}

int vase_cycle_handle(struct vased *d, struct vased_client *c, const struct vase_reply_to *p,
                      const Vase__Envelope *e) {
    switch (e->body_case) {
    case VASE__ENVELOPE__BODY_EVICT_REQUEST:
        return handle_evict_request(d, c, p, e->evict_request);
    case VASE__ENVELOPE__BODY_EVICT_COMMIT:
        return handle_evict_commit(d, c, p, e->evict_commit);
    case VASE__ENVELOPE__BODY_ATTN_STATS:
        return handle_attn_stats(d, c, p, e->attn_stats);
    default:
        return vase_reply_error(d, p, EINVAL, "%s is not a request", vase_wire_body_name(e));
    }
}
