/* SPDX-License-Identifier: MIT */

/*
 * The control protocol: frame checks, dispatch and the request handlers of PROTOCOL.md.
 * Invariants: every frame gets at most one reply, an Error naming the problem when it is
 * refused (AttnStats: only then); no input can crash the daemon or make it allocate more than
 * the configured limits allow; an unpacked envelope is freed in the function that unpacked it
 * and nothing keeps pointers into it (the evictor gets copies); a refused request changes
 * nothing.
 */

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "alloc.h"
#include "arena.h"
#include "control.h"
#include "events.h"
#include "evictor.h"
#include "log.h"
#include "registry.h"
#include "vased.h"
#include "wire.h"

/* ---- frame checks (pure) ---- */

static int set_error(struct vase_control_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int set_error(struct vase_control_error *err, int code, const char *fmt, ...) {
    va_list ap;
    err->code = code;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
    return -code;
}

bool vase_control_is_admin(Vase__Envelope__BodyCase body) {
    switch (body) {
    case VASE__ENVELOPE__BODY_PING:
    case VASE__ENVELOPE__BODY_STATUS:
    case VASE__ENVELOPE__BODY_LIST_CLIENTS:
    case VASE__ENVELOPE__BODY_LIST_SEQS:
    case VASE__ENVELOPE__BODY_GET_SEQ:
    case VASE__ENVELOPE__BODY_CONFIG_GET:
    case VASE__ENVELOPE__BODY_CONFIG_SET:
        return true;
    default:
        return false;
    }
}

bool vase_control_is_request(Vase__Envelope__BodyCase body) {
    switch (body) {
    case VASE__ENVELOPE__BODY_REGISTER_MODEL:
    case VASE__ENVELOPE__BODY_OPEN_SEQ:
    case VASE__ENVELOPE__BODY_CLOSE_SEQ:
    case VASE__ENVELOPE__BODY_EVICT_REQUEST:
    case VASE__ENVELOPE__BODY_EVICT_COMMIT:
    case VASE__ENVELOPE__BODY_ATTN_STATS:
        return true;
    default:
        return vase_control_is_admin(body);
    }
}

int vase_control_unpack(const void *buf, size_t len, size_t max, Vase__Envelope **ret,
                        struct vase_control_error *err) {
    Vase__Envelope *e = NULL;

    *err = (struct vase_control_error){0};
    int r = vase_wire_unpack(buf, len, max, &e);
    switch (r) {
    case 0:
        break;
    case -EMSGSIZE:
        return set_error(err, EMSGSIZE, "message of %zu bytes exceeds max_message_bytes (%zu)",
                         len, max);
    case -EBADMSG:
        return set_error(err, EBADMSG, "message of %zu bytes is not a vase.Envelope", len);
    case -VASE_WIRE_EPROTOVERSION:
        err->request_id = e->request_id;
        set_error(err, VASE_WIRE_EPROTOVERSION, "protocol version %u is not supported (this "
                  "daemon speaks version %d)", e->version, VASE_WIRE_VERSION);
        vase__envelope__free_unpacked(e, NULL);
        return -VASE_WIRE_EPROTOVERSION;
    case -EINVAL:
        err->request_id = e ? e->request_id : 0;
        vase__envelope__free_unpacked(e, NULL);
        return set_error(err, EINVAL, "envelope has no body");
    default:
        return set_error(err, -r, "message cannot be read");
    }
    if (!vase_control_is_request(e->body_case)) {
        err->request_id = e->request_id;
        set_error(err, EINVAL, "%s is not a request", vase_wire_body_name(e));
        vase__envelope__free_unpacked(e, NULL);
        return -EINVAL;
    }
    *ret = e;
    return 0;
}

int vase_control_check_peer(const Vase__Envelope *e, uint64_t incarnation, bool has_session,
                            uint64_t *last_client_seq, uint64_t *ret_lost,
                            struct vase_control_error *err) {
    bool admin = vase_control_is_admin(e->body_case);

    if (ret_lost)
        *ret_lost = 0;
    *err = (struct vase_control_error){.request_id = e->request_id};
    if (e->incarnation != incarnation && !(admin && e->incarnation == 0))
        return set_error(err, VASE_WIRE_ESTALE,
                         "stale incarnation %016llx (the daemon is %016llx: it restarted; "
                         "reconnect)",
                         (unsigned long long)e->incarnation, (unsigned long long)incarnation);
    if (!admin && !has_session)
        return set_error(err, ENOTCONN, "%s needs a session: this routing id is not the token "
                         "of a live session", vase_wire_body_name(e));
    if (has_session && last_client_seq) {
        if (e->client_seq <= *last_client_seq)
            return set_error(err, EPROTO, "client_seq %llu is not above the last one (%llu): "
                             "replayed or reordered message",
                             (unsigned long long)e->client_seq,
                             (unsigned long long)*last_client_seq);
        if (e->client_seq != *last_client_seq + 1 && *last_client_seq != 0 && ret_lost)
            *ret_lost = e->client_seq - *last_client_seq - 1;
        *last_client_seq = e->client_seq;
    }
    return 0;
}

int vase_control_peer_cred(const char *peer_address, struct ucred *ret) {
    /* libzmq reads SO_PEERCRED when an ipc connection is accepted and appends ":uid:gid:pid"
     * to the peer's address; what comes before is not ours to interpret. */
    uint64_t v[3];
    const char *end = peer_address ? peer_address + strlen(peer_address) : NULL;
    if (!end)
        return -ENODATA;
    for (int i = 2; i >= 0; i--) {
        const char *colon = end;
        while (colon > peer_address && colon[-1] != ':')
            colon--;
        if (colon == peer_address || colon == end || end - colon > 20)
            return -ENODATA;
        char num[21];
        memcpy(num, colon, (size_t)(end - colon));
        num[end - colon] = '\0';
        if (vase_parse_u64(num, &v[i]) < 0 || v[i] > (i == 2 ? INT32_MAX : UINT32_MAX - 1))
            return -ENODATA;
        end = colon - 1;
    }
    *ret = (struct ucred){.uid = (uid_t)v[0], .gid = (gid_t)v[1], .pid = (pid_t)v[2]};
    return 0;
}

enum vase_control_access vase_control_access_of(Vase__Envelope__BodyCase body) {
    switch (body) {
    case VASE__ENVELOPE__BODY_PING:
    case VASE__ENVELOPE__BODY_STATUS:
    case VASE__ENVELOPE__BODY_CONFIG_GET:
        return VASE_CONTROL_ACCESS_ANY;
    case VASE__ENVELOPE__BODY_LIST_CLIENTS:
    case VASE__ENVELOPE__BODY_LIST_SEQS:
    case VASE__ENVELOPE__BODY_GET_SEQ:
        return VASE_CONTROL_ACCESS_ALLOWED;
    case VASE__ENVELOPE__BODY_CONFIG_SET:
        return VASE_CONTROL_ACCESS_ADMIN;
    default:
        return VASE_CONTROL_ACCESS_SESSION;
    }
}

int vase_control_open(void *zmq_ctx, const char *endpoint, uint64_t max_message_bytes,
                      void **ret) {
    int zero = 0, timeout = 100;
    /* Frames up to twice the limit arrive and get an EMSGSIZE reply; anything larger is cut off
     * by ZeroMQ itself (the peer is disconnected, no reply), so no peer can make us buffer
     * more. */
    int64_t cut = 2 * (int64_t)max_message_bytes + (64 << 10);
    int r;
    void *s = zmq_socket(zmq_ctx, ZMQ_ROUTER);
    if (!s)
        return log_error_errno(-zmq_errno(), "Failed to create the control socket: %m");
    if (zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero)) < 0 ||
        zmq_setsockopt(s, ZMQ_SNDTIMEO, &timeout, sizeof(timeout)) < 0 ||
        zmq_setsockopt(s, ZMQ_ROUTER_MANDATORY, &zero, sizeof(zero)) < 0 ||
        zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &cut, sizeof(cut)) < 0) {
        r = log_error_errno(-zmq_errno(), "Failed to configure the control socket: %m");
        goto close_socket;
    }
    if (zmq_bind(s, endpoint) < 0) {
        r = log_error_errno(-zmq_errno(), "Failed to bind %s: %m", endpoint);
        goto close_socket;
    }
    *ret = s;
    return 0;

close_socket:
    zmq_close(s);
    return r;
}

/* ---- replies ---- */

struct peer {
    const void *id;
    size_t id_len;
    uint64_t request_id;
    bool cred_known;   /* false: the transport did not say (never on ipc) */
    struct ucred cred; /* the kernel's, for the connection the frame came over */
};

static int send_envelope(struct vased *d, const struct peer *p, Vase__Envelope *e) {
    void *buf;
    size_t len;

    e->version = VASE_WIRE_VERSION;
    e->incarnation = d->incarnation;
    e->request_id = p->request_id;
    if (vase_wire_pack(e, &buf, &len) < 0)
        return log_oom();
    /* ROUTER_MANDATORY is off: a reply to a vanished peer is dropped, never blocks. */
    if (zmq_send(d->router, p->id, p->id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(d->router, buf, len, ZMQ_DONTWAIT) < 0)
        log_debug("Dropped a %s reply: %s", vase_wire_body_name(e), zmq_strerror(zmq_errno()));
    free(buf);
    return 0;
}

static int reply_error(struct vased *d, const struct peer *p, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int reply_error(struct vased *d, const struct peer *p, int code, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);

    Vase__Error err = VASE__ERROR__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    err.code = code;
    err.message = msg;
    e.body_case = VASE__ENVELOPE__BODY_ERROR;
    e.error = &err;
    d->errors_total++;
    log_debug("Error reply %d to request %llu: %s", code, (unsigned long long)p->request_id, msg);
    send_envelope(d, p, &e);
    return -code;
}

static int reply_control_error(struct vased *d, const struct peer *p,
                                const struct vase_control_error *err) {
    struct peer q = *p;
    q.request_id = err->request_id;
    return reply_error(d, &q, err->code, "%s", err->message);
}

/*
 * The entries of a repeated message field in one zeroed allocation: the array of n pointers that
 * protobuf-c packs, then the n messages of size bytes they point to. The caller initialises each
 * message through its pointer and frees the array with free(). n may be 0. NULL when out of
 * memory.
 */
static ProtobufCMessage **repeated_new(size_t n, size_t size) {
    size_t align = _Alignof(max_align_t), head, total;
    ProtobufCMessage **ptrs;

    /* The messages start at the first offset after the pointers that is aligned for anything. */
    if (__builtin_mul_overflow(n, sizeof(*ptrs), &head) ||
        __builtin_add_overflow(head, align - 1, &head))
        return NULL;
    head -= head % align;
    if (__builtin_mul_overflow(n, size, &total) || __builtin_add_overflow(total, head, &total))
        return NULL;
    ptrs = calloc(1, total ? total : 1);
    if (!ptrs)
        return NULL;
    for (size_t i = 0; i < n; i++)
        ptrs[i] = (ProtobufCMessage *)((char *)ptrs + head + i * size);
    return ptrs;
}

static int reply_ok(struct vased *d, const struct peer *p) {
    Vase__Ok ok = VASE__OK__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    e.body_case = VASE__ENVELOPE__BODY_OK;
    e.ok = &ok;
    return send_envelope(d, p, &e);
}

/* ---- info ---- */

void vase_control_client_info(const struct vased *d, const struct vase_client *c,
                              Vase__ClientInfo *ret) {
    vase__client_info__init(ret);
    ret->client_id = c->id;
    ret->name = c->name ? c->name : (char *)"";
    ret->pid = c->pid;
    ret->uid = c->uid;
    ret->gid = c->gid;
    ret->pages = c->pages;
    ret->seqs = c->n_seqs;
    ret->models = c->n_models;
    ret->connected_seconds = vased_now() - c->connected_at;
    ret->plans_queued = d->evictor ? vase_evictor_count_queued(d->evictor, c->id) : 0;
}

void vase_control_seq_info(const struct vase_seq *s, Vase__SeqInfo *ret) {
    vase__seq_info__init(ret);
    ret->seq_id = s->id;
    ret->client_id = s->client ? s->client->id : 0;
    ret->model_id = s->model ? s->model->id : 0;
    ret->policy = (char *)vase_policy_to_string(s->policy);
    ret->mode = s->mode == VASE__MODE__MODE_SYNC ? VASE__MODE__MODE_SYNC : VASE__MODE__MODE_ASYNC;
    ret->budget = s->params.budget;
    ret->window = s->params.window;
    ret->len = s->len;
    ret->capacity = s->capacity;
    ret->pages = s->n_pages + s->n_ring_pages + s->n_plan_pages;
    ret->rounds = s->rounds;
    ret->position = s->position;
    ret->state = (char *)vase_seq_state_to_string(s->state);
    ret->last_plan_seconds = s->last_plan_seconds;
    ret->arena_id = s->arena_id;
}

/* Who sees what in listings: admins everything; others their own uid's clients and sequences,
 * and those in the arenas they may use (which they could read anyway). */
static bool client_visible(const struct vased_peer *who, const struct vase_client *c) {
    if (who->admin || c->uid == who->uid)
        return true;
    for (const struct vase_model *m = c->models; m; m = m->next)
        if (who->arenas & (1u << m->arena_id))
            return true;
    return false;
}

static bool seq_visible(const struct vased_peer *who, const struct vase_seq *s) {
    return who->admin || (s->client && s->client->uid == who->uid) ||
           (who->arenas & (1u << s->arena_id));
}

/* ---- engine requests ---- */

static int handle_register_model(struct vased *d, struct vase_client *c, const struct peer *p,
                                  const Vase__RegisterModel *req) {
    const Vase__ModelGeometry *g = req->geometry;
    if (!g)
        return reply_error(d, p, EINVAL, "register_model has no geometry");
    if (c->n_models >= d->cfg.max_models_per_client)
        return reply_error(d, p, EDQUOT, "client has %u models (max_models_per_client)",
                           c->n_models);
    if (g->arena_id >= d->n_arenas)
        return reply_error(d, p, EINVAL, "no arena %u (this daemon has %u)", g->arena_id,
                           d->n_arenas);
    if (!(c->arenas & (1u << g->arena_id)))
        return reply_error(d, p, EPERM, "arena %u (\"%s\") is not open to uid %u", g->arena_id,
                           d->arena_names[g->arena_id], (unsigned)c->uid);
    if (strlen(g->name) > VASE_MAX_NAME)
        return reply_error(d, p, EINVAL, "model name longer than %u bytes", VASE_MAX_NAME);
    if ((unsigned)g->dtype >= _VASE_DTYPE_MAX)
        return reply_error(d, p, EINVAL, "unknown dtype %d", (int)g->dtype);

    struct vase_geometry_desc geo = {
        .layers = g->layers,
        .q_heads = g->q_heads,
        .kv_heads = g->kv_heads,
        .head_dim = g->head_dim,
        .dtype = (enum vase_dtype)g->dtype,
        .align = g->align,
    };
    struct vase_layout layout;
    const char *msg = NULL;
    int r = vase_layout_compute(&geo, d->arenas[g->arena_id]->page_bytes, &layout, &msg);
    if (r < 0)
        return reply_error(d, p, -r, "bad geometry: %s", msg ? msg : "invalid");

    struct vase_model *m;
    r = vase_registry_add_model(d->reg, c, g->name, g->arena_id, &geo, &layout, &m);
    if (r < 0)
        return reply_error(d, p, -r, "cannot register the model: %s", strerror(-r));
    log_info("Client %u registered model %u \"%s\": %u layers, %u/%u heads, dim %u, %s, "
             "%u tokens per page.", c->id, m->id, m->name, geo.layers, geo.q_heads, geo.kv_heads,
             geo.head_dim, vase_dtype_to_string(geo.dtype), layout.tokens_per_page);

    Vase__ModelLayout ml = VASE__MODEL_LAYOUT__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    ml.model_id = m->id;
    ml.tokens_per_page = layout.tokens_per_page;
    ml.page_bytes = layout.page_bytes;
    ml.layer_stride = layout.layer_stride;
    ml.kv_stride = layout.kv_stride;
    ml.token_stride = layout.token_stride;
    ml.head_stride = layout.head_stride;
    ml.ring_rows_per_page = layout.ring_rows_per_page;
    ml.ring_layer_stride = layout.ring_layer_stride;
    ml.ring_row_stride = layout.ring_row_stride;
    e.body_case = VASE__ENVELOPE__BODY_MODEL_LAYOUT;
    e.model_layout = &ml;
    send_envelope(d, p, &e);
    return 0;
}

/* The first rule of vase_params_check() that p breaks, for the error message. */
static const char *explain_params(const struct vase_params *p) {
    if (p->window == 0)
        return "window must be positive";
    if (p->budget <= p->window)
        return "budget must be larger than window";
    if (p->budget % p->window != 0)
        return "budget must be a multiple of window";
    if (p->budget > VASE_MAX_BUDGET)
        return "budget too large";
    if (p->n_sink > p->budget)
        return "n_sink must not exceed budget";
    if (p->n_large > p->budget)
        return "n_large must not exceed budget";
    if (!(p->temperature > 0.0f) || !isfinite(p->temperature))
        return "temperature must be positive and finite";
    if (!(p->lambda >= 0.0f && p->lambda <= 1.0f))
        return "lambda must be in [0, 1]";
    if (p->smooth == 0 || p->smooth % 2 == 0 || p->smooth > VASE_MAX_SMOOTH)
        return "smooth must be odd and at most 63";
    if (p->rank == 0 || p->rank > VASE_MAX_RANK)
        return "rank must be 1 .. 256";
    return "invalid parameters";
}

/* SeqParams with PROTOCOL.md's defaults applied, checked. 0 or -EINVAL with *msg. */
static int seq_request_from(const struct vased *d, const Vase__OpenSeq *o,
                            struct vase_seq_request *ret, const char **msg) {
    const Vase__SeqParams *sp = o->params;
    enum vase_metric implied = VASE_METRIC_RANGE;
    bool has_implied = false;

    if (!sp) {
        *msg = "open_seq has no params (budget is required)";
        return -EINVAL;
    }
    *ret = (struct vase_seq_request){0};
    if (sp->policy[0] == '\0')
        ret->policy = VASE_POLICY_VASE_ATTNV;
    else if (vase_policy_from_string(sp->policy, &ret->policy) < 0) {
        /* Reference mode names ("range_sink_sample_attn", ...) imply a value metric too. */
        if (vase_policy_from_mode(sp->policy, &ret->policy, &implied) < 0) {
            *msg = "unknown policy";
            return -EINVAL;
        }
        has_implied = true;
    }
    if (sp->budget == 0) {
        *msg = "budget must be set";
        return -EINVAL;
    }
    struct vase_params p = vase_params_default(sp->budget);
    if (sp->window)
        p.window = sp->window;
    if (sp->n_sink < -1 || sp->n_large < -1) {
        *msg = "n_sink and n_large must be >= 0, or -1 for the default";
        return -EINVAL;
    }
    if (sp->n_sink >= 0)
        p.n_sink = (uint32_t)sp->n_sink;
    if (sp->n_large >= 0)
        p.n_large = (uint32_t)sp->n_large;
    if (sp->temperature != 0.0f)
        p.temperature = sp->temperature;
    if (sp->rank)
        p.rank = sp->rank;
    if (sp->lambda >= 0.0f || isnan(sp->lambda))
        p.lambda = sp->lambda;
    if (sp->smooth)
        p.smooth = sp->smooth;
    if (sp->metric[0]) {
        if (vase_metric_from_string(sp->metric, &p.metric) < 0) {
            *msg = "unknown metric (range, l2, var, absmax)";
            return -EINVAL;
        }
    } else if (has_implied) {
        p.metric = implied;
    }
    if (vase_params_check(&p, ret->policy) < 0) {
        *msg = explain_params(&p);
        return -EINVAL;
    }
    if (o->mode != VASE__MODE__MODE_ASYNC && o->mode != VASE__MODE__MODE_SYNC) {
        *msg = "unknown mode";
        return -EINVAL;
    }
    if (o->prompt_len > VASE_MAX_TOKENS) {
        *msg = "prompt_len too large";
        return -EINVAL;
    }
    int64_t slack = o->slack;
    if (slack < -1) {
        *msg = "slack must be >= 0, or -1 for the default";
        return -EINVAL;
    }
    if (slack == -1)
        slack = d->cfg.default_slack >= 0 ? d->cfg.default_slack : (int64_t)p.window;
    if (slack > (int64_t)VASE_MAX_BUDGET) {
        *msg = "slack too large";
        return -EINVAL;
    }
    uint64_t most = (uint64_t)(o->prompt_len > p.budget ? o->prompt_len : p.budget) + p.window +
                    (uint64_t)slack;
    if (most > VASE_MAX_TOKENS) {
        *msg = "max(prompt_len, budget) + window + slack exceeds the kernels' token limit";
        return -EINVAL;
    }
    ret->params = p;
    ret->prompt_len = o->prompt_len;
    ret->seed = o->seed;
    ret->mode = (uint32_t)o->mode;
    ret->slack = (uint32_t)slack;
    return 0;
}

static int handle_open_seq(struct vased *d, struct vase_client *c, const struct peer *p,
                            const Vase__OpenSeq *o) {
    struct vase_model *m;
    int r = vase_registry_get_model(d->reg, c, o->model_id, &m);
    if (r == -ENOENT)
        return reply_error(d, p, ENOENT, "no model %u", o->model_id);
    if (r < 0)
        return reply_error(d, p, EPERM, "model %u belongs to another client", o->model_id);

    struct vase_seq_request req;
    const char *msg = NULL;
    r = seq_request_from(d, o, &req, &msg);
    if (r < 0)
        return reply_error(d, p, EINVAL, "bad open_seq: %s", msg);

    struct vase_seq *s;
    r = vase_registry_open_seq(d->reg, d->allocs[m->arena_id], c, m, &req,
                               d->cfg.max_seqs_per_client, d->cfg.max_pages_per_client, &s, &msg);
    if (r < 0)
        return reply_error(d, p, -r, "cannot open the sequence: %s",
                           msg ? msg : strerror(-r));
    log_debug("Client %u opened sequence %u: %s, budget %u, window %u, %u pages.", c->id, s->id,
              vase_policy_to_string(s->policy), s->params.budget, s->params.window,
              s->n_pages + s->n_ring_pages + s->n_plan_pages);

    Vase__SeqLayout sl = VASE__SEQ_LAYOUT__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    sl.seq_id = s->id;
    sl.capacity = s->capacity;
    sl.n_pages = s->n_pages;
    sl.pages = s->pages;
    sl.n_ring_pages = s->n_ring_pages;
    sl.ring_pages = s->ring_pages;
    sl.n_plan_pages = s->n_plan_pages;
    sl.plan_pages = s->plan_pages;
    sl.keep = s->keep;
    sl.plans_per_page = s->plans_per_page;
    sl.window = s->params.window;
    sl.budget = s->params.budget;
    sl.slack = s->slack;
    e.body_case = VASE__ENVELOPE__BODY_SEQ_LAYOUT;
    e.seq_layout = &sl;
    send_envelope(d, p, &e);
    vased_publish_seq(d, s, true);
    vased_check_pressure(d, false);
    return 0;
}

/* Looks up the client's sequence, replying ENOENT/EPERM itself. */
static struct vase_seq *own_seq(struct vased *d, struct vase_client *c, const struct peer *p,
                                uint32_t id) {
    struct vase_seq *s;
    int r = vase_registry_get_seq(d->reg, c, id, &s);
    if (r == -ENOENT)
        reply_error(d, p, ENOENT, "no sequence %u", id);
    else if (r < 0)
        reply_error(d, p, EPERM, "sequence %u belongs to another client", id);
    return r < 0 ? NULL : s;
}

static int handle_close_seq(struct vased *d, struct vase_client *c, const struct peer *p,
                             const Vase__CloseSeq *req) {
    struct vase_seq *s = own_seq(d, c, p, req->seq_id);
    if (!s)
        return 0;
    vased_publish_seq(d, s, false);
    vase_registry_close_seq(d->reg, d->allocs[s->arena_id], s);
    reply_ok(d, p);
    vased_check_pressure(d, false);
    return 0;
}

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

/* Builds the run of an eviction request: copies of everything the threads will read. Returns 0
 * or a positive errno with msg filled. */
static int build_run(struct vased *d, struct vase_seq *s, const Vase__EvictRequest *req,
                     struct vase_plan_run *run, char *msg, size_t msg_len) {
    const struct vase_model *m = s->model;
    const struct vase_arena *a = d->arenas[s->arena_id];
    unsigned needs = vase_policy_needs(s->policy);
    uint32_t L = m->geo.layers, H = m->geo.kv_heads, W = s->params.window;
    uint32_t n = req->len - W;
    size_t per_layer = (size_t)H * n;

    run->seq_id = s->id;
    run->round = s->rounds;
    run->len = req->len;
    run->n = n;
    run->keep = s->keep;
    run->layers = L;
    run->kv_heads = H;
    run->q_heads = m->geo.q_heads;
    run->head_dim = m->geo.head_dim;
    run->dtype = m->geo.dtype;
    run->policy = s->policy;
    run->params = s->params;
    run->seed = s->seed;
    run->arena = a;
    run->arena_base = a->map;
    run->layout = m->layout;
    run->ring_first = req->ring_first;
    run->plans_per_page = s->plans_per_page;
    run->n_pages = s->n_pages;
    run->n_plan_pages = s->n_plan_pages;
    run->owner = s;

    run->pages = malloc((size_t)s->n_pages * sizeof(uint32_t));
    run->plan_pages = malloc((size_t)s->n_plan_pages * sizeof(uint32_t));
    run->keep_lists = malloc((size_t)L * H * s->keep * sizeof(uint32_t));
    if (!run->pages || !run->plan_pages || !run->keep_lists)
        goto oom;
    memcpy(run->pages, s->pages, (size_t)s->n_pages * sizeof(uint32_t));
    memcpy(run->plan_pages, s->plan_pages, (size_t)s->n_plan_pages * sizeof(uint32_t));
    if (s->n_ring_pages) {
        run->ring_pages = malloc((size_t)s->n_ring_pages * sizeof(uint32_t));
        if (!run->ring_pages)
            goto oom;
        memcpy(run->ring_pages, s->ring_pages, (size_t)s->n_ring_pages * sizeof(uint32_t));
    }

    if (req->n_exp_draws) {
        if (req->n_exp_draws != (size_t)L * per_layer) {
            snprintf(msg, msg_len, "exp_draws has %zu floats; layers * kv_heads * (len - window) "
                     "= %zu", req->n_exp_draws, (size_t)L * per_layer);
            return EINVAL;
        }
        if (!all_finite(req->exp_draws, req->n_exp_draws, true)) {
            snprintf(msg, msg_len, "exp_draws must be finite and non-negative");
            return EINVAL;
        }
        if (!(run->exp_draws = copy_floats(req->exp_draws, req->n_exp_draws)))
            goto oom;
    }
    if (req->n_gauss) {
        size_t want = (size_t)m->geo.head_dim * s->params.rank;
        if (req->n_gauss != want) {
            snprintf(msg, msg_len, "gauss has %zu floats; head_dim * rank = %zu", req->n_gauss,
                     want);
            return EINVAL;
        }
        if (!all_finite(req->gauss, req->n_gauss, false)) {
            snprintf(msg, msg_len, "gauss must be finite");
            return EINVAL;
        }
        if (!(run->gauss = copy_floats(req->gauss, req->n_gauss)))
            goto oom;
    }

    if (needs & VASE_NEEDS_ACC) {
        /* A snapshot: AttnStats may keep adding to the live accumulators meanwhile. */
        run->acc = calloc((size_t)L * per_layer, sizeof(float));
        if (!run->acc)
            goto oom;
        if (s->acc)
            for (uint32_t l = 0; l < L; l++)
                for (uint32_t h = 0; h < H; h++)
                    memcpy(run->acc + l * per_layer + (size_t)h * n,
                           s->acc + ((size_t)l * H + h) * s->acc_stride, n * sizeof(float));
    }

    if (needs & VASE_NEEDS_Q) {
        bool all_layers_scored = true;
        run->scores = calloc(L, sizeof(float *));
        if (!run->scores)
            goto oom;
        for (uint32_t l = 0; l < L; l++) {
            if (!s->scores[l]) {
                all_layers_scored = false;
                continue;
            }
            if (s->scores_len[l] < n) {
                snprintf(msg, msg_len, "window scores pushed for layer %u cover %u slots; the "
                         "plan needs %u", l, s->scores_len[l], n);
                return EINVAL;
            }
            run->scores[l] = malloc(per_layer * sizeof(float));
            if (!run->scores[l])
                goto oom;
            for (uint32_t h = 0; h < H; h++)
                memcpy(run->scores[l] + (size_t)h * n,
                       s->scores[l] + (size_t)h * s->scores_len[l], n * sizeof(float));
        }
        if (!all_layers_scored && (s->n_ring_pages == 0 || req->ring_first >= 2 * W)) {
            snprintf(msg, msg_len, "ring_first %u is not a ring entry (0 .. %u)", req->ring_first,
                     2 * W - 1);
            return EINVAL;
        }
    }
    return 0;

oom:
    snprintf(msg, msg_len, "out of memory");
    return ENOMEM;
}

static int handle_evict_request(struct vased *d, struct vase_client *c, const struct peer *p,
                                 const Vase__EvictRequest *req) {
    struct vase_seq *s = own_seq(d, c, p, req->seq_id);
    if (!s)
        return 0;
    uint32_t W = s->params.window;
    if (d->stopping)
        return reply_error(d, p, ESHUTDOWN, "the daemon is shutting down");
    if (s->state != VASE_SEQ_IDLE)
        return reply_error(d, p, EBUSY, "sequence %u has an uncommitted eviction (round %u, %s)",
                           s->id, s->rounds, vase_seq_state_to_string(s->state));
    if (req->len <= s->params.budget || req->len % W != 0)
        return reply_error(d, p, EINVAL, "len %u must be above budget %u and a multiple of "
                           "window %u", req->len, s->params.budget, W);
    if (req->len > s->capacity)
        return reply_error(d, p, EINVAL, "len %u exceeds the sequence's capacity %u", req->len,
                           s->capacity);
    if (req->position < req->len)
        return reply_error(d, p, EINVAL, "position %llu is below len %u",
                           (unsigned long long)req->position, req->len);

    struct vase_plan_run *run;
    char msg[256];
    int code;
    if (vase_plan_run_new(&run) < 0)
        return reply_error(d, p, ENOMEM, "out of memory");
    code = build_run(d, s, req, run, msg, sizeof(msg));
    /* Pushed window scores serve one plan attempt, whatever its outcome. */
    vase_seq_drop_scores(s);
    if (code) {
        vase_plan_run_free(run);
        return reply_error(d, p, code, "bad evict_request for sequence %u: %s", s->id, msg);
    }
    if (p->id_len > sizeof(run->routing_id)) {
        vase_plan_run_free(run);
        return reply_error(d, p, EINVAL, "routing id too long");
    }
    memcpy(run->routing_id, p->id, p->id_len);
    run->routing_id_len = p->id_len;
    run->request_id = p->request_id;
    run->tenant = c->id;

    int r = vase_evictor_submit(d->evictor, run);
    if (r < 0) {
        vase_plan_run_free(run);
        return reply_error(d, p, -r, "cannot queue the plan: %s", strerror(-r));
    }
    s->run = run;
    s->state = VASE_SEQ_PLANNING;
    s->len = req->len;
    s->position = req->position;
    d->evictions_in_flight++;
    return 0;
}

/* The plan of a finished run, as the engine gets it and as the eviction event publishes it. */
static void evict_plan_of(const struct vase_seq *s, const struct vase_plan_run *run,
                          Vase__EvictPlan *ret) {
    vase__evict_plan__init(ret);
    ret->seq_id = s->id;
    ret->round = run->round;
    ret->n = run->n;
    ret->len = run->len;
    ret->keep = run->keep;
    ret->plan_seconds = run->seconds;
}

void vase_control_plan_done(struct vased *d, struct vase_plan_run *run) {
    struct vase_seq *s = run->owner;

    d->evictions_in_flight--;
    if (!s->client) {
        /* Closed, or its client died, while the plan was computed: now its pages are free. */
        log_debug("Plan of closed sequence %u finished; releasing its pages.", s->id);
        vase_registry_reap(d->reg, d->allocs[s->arena_id], s);
        vased_check_pressure(d, false);
        return;
    }

    /* The reply goes to whoever asked; the run's copy of its routing id dies with the run. */
    uint8_t id[sizeof(run->routing_id)];
    memcpy(id, run->routing_id, run->routing_id_len);
    struct peer p = {.id = id, .id_len = run->routing_id_len, .request_id = run->request_id};

    if (run->error) {
        int r = run->error;
        uint32_t layer = run->error_layer;
        s->run = vase_plan_run_free(run);
        s->state = VASE_SEQ_IDLE;
        /* Everything else was checked before the plan started, and pushed statistics are
         * checked when they arrive, so -EINVAL here means the rows the plan read from the
         * arena. The sequence stays usable: the engine may fix its data and ask again. */
        if (r == -EINVAL)
            reply_error(d, &p, EINVAL, "NaN or Inf in the keys/values/queries of layer %u of "
                        "sequence %u; no plan", layer, s->id);
        else
            reply_error(d, &p, -r, "planning layer %u of sequence %u failed: %s", layer, s->id,
                        strerror(-r));
        return;
    }
    s->state = VASE_SEQ_PLAN_READY;
    s->last_plan_seconds = run->seconds;
    d->evictions_total++;

    Vase__EvictPlan ep;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    evict_plan_of(s, run, &ep);
    e.body_case = VASE__ENVELOPE__BODY_EVICT_PLAN;
    e.evict_plan = &ep;
    send_envelope(d, &p, &e);
}

static int handle_evict_commit(struct vased *d, struct vase_client *c, const struct peer *p,
                                const Vase__EvictCommit *req) {
    struct vase_seq *s = own_seq(d, c, p, req->seq_id);
    if (!s)
        return 0;
    if (s->state != VASE_SEQ_PLAN_READY)
        return reply_error(d, p, EINVAL, "sequence %u has no plan to commit (it is %s)", s->id,
                           vase_seq_state_to_string(s->state));
    struct vase_plan_run *run = s->run;
    if (req->round != run->round)
        return reply_error(d, p, EINVAL, "commit of round %u, but the plan of sequence %u is "
                           "round %u", req->round, s->id, run->round);

    uint32_t K = s->keep, N = run->n, budget = s->params.budget;
    /* new_len = K + len_now - N with run->len <= len_now <= capacity. */
    uint64_t len_now = (uint64_t)req->new_len + N - K;
    if (req->new_len < K || len_now < run->len || len_now > s->capacity)
        return reply_error(d, p, EINVAL, "new_len %u does not fit: it must be K + len - N with "
                           "len between the request's %u and the capacity %u (K %u, N %u)",
                           req->new_len, run->len, s->capacity, K, N);

    if (s->acc) {
        for (uint32_t l = 0; l < s->layers; l++) {
            int r = vase_compact_f32(s->acc + (size_t)l * s->kv_heads * s->acc_stride,
                                     s->kv_heads, s->acc_stride,
                                     run->keep_lists + (size_t)l * s->kv_heads * K, K, N,
                                     (uint32_t)len_now);
            if (r < 0) {
                /* Half-compacted statistics would mislead every later plan; none is better. */
                log_warning_errno(r, "Cannot compact the accumulated attention of sequence %u; "
                                  "dropping it: %m", s->id);
                vase_seq_drop_acc(s);
                break;
            }
        }
    }

    /* Pages a long prompt needed beyond the steady state go back now; keep what the current
     * length still needs, the rest returns at a later commit. */
    uint32_t tpp = s->tokens_per_page;
    uint32_t steady = (uint32_t)(((uint64_t)budget + s->params.window + s->slack + tpp - 1) / tpp);
    uint32_t need = (uint32_t)(((uint64_t)req->new_len + tpp - 1) / tpp);
    uint32_t target = steady > need ? steady : need;
    int r = vase_seq_shrink(s, d->allocs[s->arena_id], target);
    if (r < 0)
        log_error_errno(r, "Cannot release surplus pages of sequence %u: %m", s->id);

    Vase__EvictPlan ep;
    evict_plan_of(s, run, &ep);
    Vase__Event ev = VASE__EVENT__INIT;
    ev.body_case = VASE__EVENT__BODY_EVICTION;
    ev.eviction = &ep;
    vase_events_publish(d->events, "evict", &ev);

    s->rounds++;
    s->len = req->new_len;
    s->state = VASE_SEQ_IDLE;
    s->run = vase_plan_run_free(run);

    Vase__CommitReply cr = VASE__COMMIT_REPLY__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    cr.seq_id = s->id;
    cr.capacity = s->capacity;
    cr.n_pages = s->n_pages;
    cr.pages = s->pages;
    e.body_case = VASE__ENVELOPE__BODY_COMMIT_REPLY;
    e.commit_reply = &cr;
    send_envelope(d, p, &e);
    if (r > 0)
        vased_check_pressure(d, false);
    return 0;
}

static int handle_attn_stats(struct vased *d, struct vase_client *c, const struct peer *p,
                              const Vase__AttnStats *req) {
    struct vase_seq *s = own_seq(d, c, p, req->seq_id);
    if (!s)
        return 0;
    uint32_t H = s->kv_heads;
    if (req->layer >= s->layers)
        return reply_error(d, p, EINVAL, "attn_stats: layer %u of %u", req->layer, s->layers);
    if (req->kind != VASE__STATS_KIND__STATS_ACC_ADD &&
        req->kind != VASE__STATS_KIND__STATS_WINDOW_SCORES)
        return reply_error(d, p, EINVAL, "attn_stats: unknown kind %d", (int)req->kind);
    if (req->len == 0 || req->len > s->capacity)
        return reply_error(d, p, EINVAL, "attn_stats: len %u must be 1 .. capacity %u", req->len,
                           s->capacity);
    if (req->n_values != (size_t)H * req->len)
        return reply_error(d, p, EINVAL, "attn_stats: %zu values; kv_heads * len = %zu",
                           req->n_values, (size_t)H * req->len);
    if (!all_finite(req->values, req->n_values, false))
        return reply_error(d, p, EINVAL, "attn_stats: NaN or Inf in the values of layer %u",
                           req->layer);

    /* What the daemon keeps of this message is charged to the client first: its heap is
     * shared by every client. */
    uint64_t quota = d->cfg.max_stats_bytes_per_client;
    uint64_t add = req->kind == VASE__STATS_KIND__STATS_ACC_ADD
                       ? (s->acc ? 0 : vase_seq_acc_bytes(s))
                       : req->n_values * sizeof(float);
    uint64_t freed = req->kind == VASE__STATS_KIND__STATS_WINDOW_SCORES && s->scores[req->layer]
                         ? (uint64_t)s->scores_len[req->layer] * H * sizeof(float)
                         : 0;
    if (add > freed && !vase_seq_stats_fit(s, add - freed, quota))
        return reply_error(d, p, EDQUOT, "attn_stats: keeping %llu more bytes would take the "
                           "client's statistics over max_stats_bytes_per_client (%llu; it holds "
                           "%llu)", (unsigned long long)(add - freed),
                           (unsigned long long)quota, (unsigned long long)c->stats_bytes);

    if (req->kind == VASE__STATS_KIND__STATS_ACC_ADD) {
        if (!s->acc) {
            s->acc = calloc((size_t)s->layers * H * s->acc_stride, sizeof(float));
            if (!s->acc)
                return reply_error(d, p, ENOMEM, "attn_stats: out of memory");
            vase_seq_stats_charge(s, (int64_t)add);
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
            return reply_error(d, p, ENOMEM, "attn_stats: out of memory");
        vase_seq_stats_charge(s, -(int64_t)freed);
        vase_seq_stats_charge(s, (int64_t)add);
        free(s->scores[req->layer]);
        s->scores[req->layer] = copy;
        s->scores_len[req->layer] = req->len;
    }
    d->stats_messages_total++;
    return 0;
}

/* ---- admin requests ---- */

static int handle_ping(struct vased *d, const struct peer *p, const Vase__Ping *req) {
    Vase__Pong pong = VASE__PONG__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    pong.payload = req->payload;
    e.body_case = VASE__ENVELOPE__BODY_PONG;
    e.pong = &pong;
    send_envelope(d, p, &e);
    return 0;
}

static int handle_status(struct vased *d, const struct peer *p, const struct vased_peer *who) {
    Vase__ArenaStatus as[VASED_MAX_ARENAS], *asp[VASED_MAX_ARENAS];
    Vase__StatusReply sr = VASE__STATUS_REPLY__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    size_t n = 0;

    /* Anyone who can reach the socket may ask; the arenas shown are those the peer may use. */
    for (uint32_t i = 0; i < d->n_arenas; i++) {
        if (!who->admin && !(who->arenas & (1u << i)))
            continue;
        vase__arena_status__init(&as[n]);
        as[n].id = d->arenas[i]->id;
        as[n].name = (char *)d->arena_names[i];
        as[n].kind = d->arenas[i]->kind;
        as[n].page_bytes = d->arenas[i]->page_bytes;
        as[n].pages_total = d->allocs[i]->num_pages;
        as[n].pages_free = d->allocs[i]->n_free;
        asp[n] = &as[n];
        n++;
    }
    sr.incarnation = d->incarnation;
    sr.version = (char *)VASED_VERSION;
    sr.uptime_seconds = vased_now() - d->started_at;
    sr.n_arenas = n;
    sr.arenas = asp;
    sr.clients = d->reg->n_clients;
    sr.seqs = d->reg->n_seqs;
    sr.evictions_total = d->evictions_total;
    sr.stats_messages_total = d->stats_messages_total;
    sr.requests_total = d->requests_total;
    sr.errors_total = d->errors_total;
    sr.evictions_in_flight = d->evictions_in_flight;
    struct vase_evictor_counts q;
    vase_evictor_get_counts(d->evictor, &q);
    sr.plans_queued = q.plans_queued;
    sr.plans_running = q.plans_running;
    sr.clients_waiting = q.clients_waiting;
    e.body_case = VASE__ENVELOPE__BODY_STATUS_REPLY;
    e.status_reply = &sr;
    send_envelope(d, p, &e);
    return 0;
}

static int handle_list_clients(struct vased *d, const struct peer *p,
                               const struct vased_peer *who) {
    uint32_t n = d->reg->n_clients;
    ProtobufCMessage **entries = repeated_new(n, sizeof(Vase__ClientInfo));
    if (!entries)
        return reply_error(d, p, ENOMEM, "out of memory");
    size_t i = 0;
    for (struct vase_client *c = d->reg->clients; c && i < n; c = c->next)
        if (client_visible(who, c))
            vase_control_client_info(d, c, (Vase__ClientInfo *)entries[i++]);
    Vase__ClientsReply cr = VASE__CLIENTS_REPLY__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    cr.n_clients = i;
    cr.clients = (Vase__ClientInfo **)entries;
    e.body_case = VASE__ENVELOPE__BODY_CLIENTS_REPLY;
    e.clients_reply = &cr;
    send_envelope(d, p, &e);
    free(entries);
    return 0;
}

static int handle_list_seqs(struct vased *d, const struct peer *p, const Vase__ListSeqs *req,
                            const struct vased_peer *who) {
    struct vase_client *only = NULL;
    if (req->client_id) {
        only = vase_registry_find_client(d->reg, req->client_id);
        if (!only || !client_visible(who, only))
            return reply_error(d, p, ENOENT, "no client %u", req->client_id);
    }
    size_t n = 0;
    for (struct vase_client *c = d->reg->clients; c; c = c->next)
        if (!only || c == only)
            n += c->n_seqs;
    ProtobufCMessage **entries = repeated_new(n, sizeof(Vase__SeqInfo));
    if (!entries)
        return reply_error(d, p, ENOMEM, "out of memory");
    size_t i = 0;
    for (struct vase_client *c = d->reg->clients; c; c = c->next)
        if (!only || c == only)
            for (struct vase_seq *s = c->seqs; s && i < n; s = s->next)
                if (seq_visible(who, s))
                    vase_control_seq_info(s, (Vase__SeqInfo *)entries[i++]);
    Vase__SeqsReply sr = VASE__SEQS_REPLY__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    sr.n_seqs = i;
    sr.seqs = (Vase__SeqInfo **)entries;
    e.body_case = VASE__ENVELOPE__BODY_SEQS_REPLY;
    e.seqs_reply = &sr;
    send_envelope(d, p, &e);
    free(entries);
    return 0;
}

static int handle_get_seq(struct vased *d, const struct peer *p, const Vase__GetSeq *req,
                          const struct vased_peer *who) {
    struct vase_seq *s = vase_registry_find_seq(d->reg, req->seq_id);
    if (!s || !seq_visible(who, s))
        return reply_error(d, p, ENOENT, "no sequence %u", req->seq_id);
    Vase__SeqInfo info;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    vase_control_seq_info(s, &info);
    e.body_case = VASE__ENVELOPE__BODY_SEQ_INFO;
    e.seq_info = &info;
    send_envelope(d, p, &e);
    return 0;
}

/* One ConfigEntry; value is the caller's buffer. */
static void config_entry(const struct vased *d, const struct vase_setting *s, char *value,
                         size_t len, Vase__ConfigEntry *ret) {
    vase__config_entry__init(ret);
    vase_config_format(&d->cfg, s, value, len);
    ret->key = (char *)s->name;
    ret->value = value;
    ret->type = (char *)vase_setting_type_name(s->type);
    ret->default_value = (char *)s->def;
    ret->runtime = s->runtime;
    ret->description = (char *)s->description;
}

#define CONFIG_VALUE_MAX 4097

static int reply_config(struct vased *d, const struct peer *p, const struct vase_setting *only) {
    size_t n = only ? 1 : vase_settings_count;
    ProtobufCMessage **entries = repeated_new(n, sizeof(Vase__ConfigEntry));
    char *values = calloc(n, CONFIG_VALUE_MAX);
    if (!entries || !values) {
        free(entries);
        free(values);
        return reply_error(d, p, ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++)
        config_entry(d, only ? only : &vase_settings[i], values + i * CONFIG_VALUE_MAX,
                     CONFIG_VALUE_MAX, (Vase__ConfigEntry *)entries[i]);
    Vase__ConfigReply cr = VASE__CONFIG_REPLY__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    cr.n_entries = n;
    cr.entries = (Vase__ConfigEntry **)entries;
    e.body_case = VASE__ENVELOPE__BODY_CONFIG_REPLY;
    e.config_reply = &cr;
    send_envelope(d, p, &e);
    free(entries);
    free(values);
    return 0;
}

static int handle_config_get(struct vased *d, const struct peer *p, const Vase__ConfigGet *req) {
    const struct vase_setting *s = NULL;
    if (req->key[0]) {
        s = vase_setting_find(req->key);
        if (!s)
            return reply_error(d, p, ENOENT, "no setting \"%s\"", req->key);
    }
    reply_config(d, p, s);
    return 0;
}

static int handle_config_set(struct vased *d, const struct peer *p, const Vase__ConfigSet *req) {
    const struct vase_setting *s = vase_setting_find(req->key);
    if (!s)
        return reply_error(d, p, ENOENT, "no setting \"%s\"", req->key);
    char old[CONFIG_VALUE_MAX];
    vase_config_format(&d->cfg, s, old, sizeof(old));
    int r = vase_config_set(&d->cfg, req->key, req->value, VASE_CONFIG_RUNTIME);
    if (r == -EPERM)
        return reply_error(d, p, EPERM, "%s cannot change while vased runs; edit the "
                           "configuration file and restart", s->name);
    if (r == -ERANGE)
        return reply_error(d, p, ERANGE, "%s: \"%s\" is out of range", s->name, req->value);
    if (r == -EINVAL)
        return reply_error(d, p, EINVAL, "%s: \"%s\" is not a valid %s", s->name, req->value,
                           vase_setting_type_name(s->type));
    if (r < 0)
        return reply_error(d, p, -r, "%s: %s", s->name, strerror(-r));
    vased_apply_setting(d, s->name);
    char now[CONFIG_VALUE_MAX];
    vase_config_format(&d->cfg, s, now, sizeof(now));
    log_notice("Setting %s changed from \"%s\" to \"%s\" by uid %u (pid %d).", s->name, old, now,
               (unsigned)p->cred.uid, (int)p->cred.pid);
    reply_config(d, p, s);
    return 0;
}

/* ---- dispatch ---- */

/*
 * Whether the peer may send e, from the kernel's credentials of its connection (p->cred) and
 * nothing the message says; replies the refusal itself. *who is filled for the requests whose
 * answer depends on the peer.
 */
static bool authorize(struct vased *d, struct vase_client *c, const struct peer *p,
                      const Vase__Envelope *e, struct vased_peer *who) {
    enum vase_control_access need = vase_control_access_of(e->body_case);
    *who = (struct vased_peer){0};
    if (need == VASE_CONTROL_ACCESS_SESSION) {
        /* The token routes the request to the client; the connection must also be its uid's,
         * so a token that leaked does not let another user act as the client. */
        if (!p->cred_known || p->cred.uid != c->uid) {
            reply_error(d, p, EPERM, "%s on the session of uid %u came from uid %u",
                        vase_wire_body_name(e), (unsigned)c->uid, (unsigned)p->cred.uid);
            return false;
        }
        return true;
    }
    /* Ping and ConfigGet depend on no one's rights; the rest look the peer's groups up. */
    bool needs_peer =
        need != VASE_CONTROL_ACCESS_ANY || e->body_case == VASE__ENVELOPE__BODY_STATUS;
    if (needs_peer && p->cred_known && vased_peer_lookup(d, &p->cred, who) < 0) {
        reply_error(d, p, ENOMEM, "out of memory");
        return false;
    }
    if (need == VASE_CONTROL_ACCESS_ALLOWED && !who->allowed) {
        reply_error(d, p, EPERM, "%s needs a uid that allow_users/allow_groups admit (uid %u "
                    "is not)", vase_wire_body_name(e), (unsigned)p->cred.uid);
        return false;
    }
    if (need == VASE_CONTROL_ACCESS_ADMIN && !who->admin) {
        reply_error(d, p, EPERM, "changing settings needs root, the daemon's user (uid %u) or "
                    "a member of admin_group; uid %u is none of them", (unsigned)d->self_uid,
                    (unsigned)p->cred.uid);
        return false;
    }
    return true;
}

static int dispatch(struct vased *d, struct vase_client *c, const struct peer *p,
                     const Vase__Envelope *e) {
    struct vased_peer who;
    if (!authorize(d, c, p, e, &who))
        return -EPERM;
    switch (e->body_case) {
    case VASE__ENVELOPE__BODY_PING:
        return handle_ping(d, p, e->ping);
    case VASE__ENVELOPE__BODY_STATUS:
        return handle_status(d, p, &who);
    case VASE__ENVELOPE__BODY_LIST_CLIENTS:
        return handle_list_clients(d, p, &who);
    case VASE__ENVELOPE__BODY_LIST_SEQS:
        return handle_list_seqs(d, p, e->list_seqs, &who);
    case VASE__ENVELOPE__BODY_GET_SEQ:
        return handle_get_seq(d, p, e->get_seq, &who);
    case VASE__ENVELOPE__BODY_CONFIG_GET:
        return handle_config_get(d, p, e->config_get);
    case VASE__ENVELOPE__BODY_CONFIG_SET:
        return handle_config_set(d, p, e->config_set);
    case VASE__ENVELOPE__BODY_REGISTER_MODEL:
        return handle_register_model(d, c, p, e->register_model);
    case VASE__ENVELOPE__BODY_OPEN_SEQ:
        return handle_open_seq(d, c, p, e->open_seq);
    case VASE__ENVELOPE__BODY_CLOSE_SEQ:
        return handle_close_seq(d, c, p, e->close_seq);
    case VASE__ENVELOPE__BODY_EVICT_REQUEST:
        return handle_evict_request(d, c, p, e->evict_request);
    case VASE__ENVELOPE__BODY_EVICT_COMMIT:
        return handle_evict_commit(d, c, p, e->evict_commit);
    case VASE__ENVELOPE__BODY_ATTN_STATS:
        return handle_attn_stats(d, c, p, e->attn_stats);
    default:
        return reply_error(d, p, EINVAL, "%s is not a request", vase_wire_body_name(e));
    }
    return 0;
}

static int handle_frame(struct vased *d, const void *id, size_t id_len, const void *buf,
                         size_t len, bool extra_frames, const char *peer_address) {
    struct peer p = {.id = id, .id_len = id_len};
    p.cred_known = vase_control_peer_cred(peer_address, &p.cred) == 0;
    if (!p.cred_known)
        p.cred = (struct ucred){.uid = (uid_t)-1, .gid = (gid_t)-1, .pid = -1};
    struct vase_control_error err;
    Vase__Envelope *e = NULL;

    d->requests_total++;
    if (extra_frames)
        return reply_error(d, &p, EBADMSG, "a control message is one frame; got several");
    if (vase_control_unpack(buf, len, d->cfg.max_message_bytes, &e, &err) < 0)
        return reply_control_error(d, &p, &err);

    struct vase_client *c = vase_registry_find_token(d->reg, id, id_len);
    uint64_t lost;
    p.request_id = e->request_id;
    if (vase_control_check_peer(e, d->incarnation, c != NULL, c ? &c->last_client_seq : NULL,
                                &lost, &err) < 0) {
        reply_control_error(d, &p, &err);
    } else {
        if (lost && vased_client_log_ok(c))
            log_notice("Client %u: client_seq jumped to %llu, %llu messages lost.", c->id,
                       (unsigned long long)e->client_seq, (unsigned long long)lost);
        dispatch(d, c, &p, e);
    }
    vase__envelope__free_unpacked(e, NULL);
    return 0;
}

static bool has_more(void *socket) {
    int more = 0;
    size_t sz = sizeof(more);
    return zmq_getsockopt(socket, ZMQ_RCVMORE, &more, &sz) == 0 && more;
}

void vase_control_process(struct vased *d) {
    /* A bounded batch, so that sessions, signals and plan results are not starved. */
    for (int i = 0; i < 256; i++) {
        zmq_msg_t id, body;
        zmq_msg_init(&id);
        if (zmq_msg_recv(&id, d->router, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&id);
            return;
        }
        if (!has_more(d->router)) { /* A ROUTER always prefixes the routing id; be safe. */
            zmq_msg_close(&id);
            continue;
        }
        zmq_msg_init(&body);
        if (zmq_msg_recv(&body, d->router, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&body);
            zmq_msg_close(&id);
            continue;
        }
        bool extra = false;
        while (has_more(d->router)) {
            zmq_msg_t junk;
            zmq_msg_init(&junk);
            if (zmq_msg_recv(&junk, d->router, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&junk);
                break;
            }
            zmq_msg_close(&junk);
            extra = true;
        }
        handle_frame(d, zmq_msg_data(&id), zmq_msg_size(&id), zmq_msg_data(&body),
                     zmq_msg_size(&body), extra, zmq_msg_gets(&body, "Peer-Address"));
        zmq_msg_close(&body);
        zmq_msg_close(&id);
    }
}
