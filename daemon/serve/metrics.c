/* SPDX-License-Identifier: MIT */

/*
 * Prometheus metrics (docs/metrics.md lists each one). The main loop counts into struct
 * vase_metrics as things happen; a scrape renders every family from those counters and from the
 * live state (arenas, registry, evictor queue) on the main thread, so nothing here takes a lock
 * and nothing is copied between threads. Counters only grow over the daemon's life: SIGHUP and
 * settings changes reset nothing. Label values that clients chose (model names) are escaped and
 * cut to a bounded length; every other label value is ours. Whatever names a tenant (model names,
 * arena names) is rendered only with metrics_tenant_labels, and the series per sequence (its
 * label) only with metrics_sequence_labels: the endpoint is open to every local user, who may
 * have no access to the daemon's sockets at all.
 */

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/arena.h"
#include "elastic.h"
#include "core/events.h"
#include "plan/evictor.h"
#include "metrics.h"
#include "metrics_http.h"
#include "core/registry.h"
#include "state.h"
#include "vase.pb-c.h"
#include "wire.h"

const double vase_metrics_plan_bounds[VASE_METRICS_PLAN_BUCKETS] = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
};

void vase_metrics_observe_plan(struct vase_metrics *m, enum vase_policy p, double seconds) {
    if ((unsigned)p >= _VASE_POLICY_MAX)
        return;
    struct vase_metrics_policy *mp = &m->policy[p];
    size_t i = 0;
    if (!(seconds >= 0)) /* NaN from a broken clock counts as 0, never as a negative sum */
        seconds = 0;
    while (i < VASE_METRICS_PLAN_BUCKETS && seconds > vase_metrics_plan_bounds[i])
        i++;
    mp->plan_buckets[i]++;
    mp->plan_seconds += seconds;
    mp->evictions++;
}

enum vase_metrics_refusal vase_metrics_refusal_of(int error) {
    switch (error) {
    case -ENOSPC:
        return VASE_METRICS_REFUSAL_NOSPACE;
    case -EDQUOT:
        return VASE_METRICS_REFUSAL_QUOTA;
    case -ETIMEDOUT:
        return VASE_METRICS_REFUSAL_TIMEOUT;
    case -EINVAL:
    case -ENOENT:
    case -EPERM:
        return VASE_METRICS_REFUSAL_INVALID;
    default:
        return VASE_METRICS_REFUSAL_OTHER;
    }
}

/* ---- the text format ---- */

static void buf_append(struct vase_metrics_buf *b, const char *s, size_t n) {
    if (b->error)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->data, cap);
        if (!p) {
            b->error = -ENOMEM;
            return;
        }
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

static void buf_printf(struct vase_metrics_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void buf_printf(struct vase_metrics_buf *b, const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    /* Every caller's text is bounded (names and escaped labels are short); a longer one would be
     * a programming error, cut rather than overrun. */
    buf_append(b, line, (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1);
}

/* The length of the UTF-8 character at s (at most left bytes), or 0 when s does not start one. */
static size_t utf8_char_len(const unsigned char *s, size_t left) {
    size_t n;
    unsigned min;
    if (s[0] < 0x80)
        return 1;
    if ((s[0] & 0xe0) == 0xc0)
        n = 2, min = 0x80;
    else if ((s[0] & 0xf0) == 0xe0)
        n = 3, min = 0x800;
    else if ((s[0] & 0xf8) == 0xf0)
        n = 4, min = 0x10000;
    else
        return 0;
    if (n > left)
        return 0;
    unsigned cp = s[0] & (0x7f >> n);
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    /* Overlong forms, surrogates and code points past Unicode are not UTF-8. */
    if (cp < min || (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
        return 0;
    return n;
}

size_t vase_metrics_escape(const char *value, char *out, size_t out_len) {
    const unsigned char *s = (const unsigned char *)value;
    size_t full = strlen(value), i = 0, o = 0;
    size_t in = full < VASE_METRICS_LABEL_MAX ? full : VASE_METRICS_LABEL_MAX;

    while (i < in) {
        char esc[2];
        size_t n = utf8_char_len(s + i, full - i), e = 0;
        if (n && i + n > in)
            break; /* a character the length limit cuts: dropped whole */
        if (s[i] == '\\' || s[i] == '"' || s[i] == '\n') {
            esc[0] = '\\';
            esc[1] = s[i] == '\n' ? 'n' : (char)s[i];
            e = 2;
        } else if (n == 0) {
            esc[0] = '?';
            e = 1;
            n = 1;
        }
        size_t need = e ? e : n;
        if (o + need + 1 > out_len)
            break;
        memcpy(out + o, e ? esc : (const char *)s + i, need);
        o += need;
        i += n;
    }
    out[o] = '\0';
    return o;
}

void vase_metrics_family(struct vase_metrics_buf *b, const char *name, const char *type,
                         const char *help) {
    buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* name{labels[, extra]} with the labels escaped. */
static void write_series(struct vase_metrics_buf *b, const char *name,
                         const struct vase_metrics_label *labels, size_t n_labels,
                         const char *extra) {
    buf_append(b, name, strlen(name));
    if (n_labels == 0 && !extra)
        return;
    buf_append(b, "{", 1);
    for (size_t i = 0; i < n_labels; i++) {
        char v[VASE_METRICS_LABEL_MAX * 2 + 1];
        vase_metrics_escape(labels[i].value, v, sizeof(v));
        buf_printf(b, "%s%s=\"%s\"", i ? "," : "", labels[i].name, v);
    }
    if (extra)
        buf_printf(b, "%s%s", n_labels ? "," : "", extra);
    buf_append(b, "}", 1);
}

static void write_value(struct vase_metrics_buf *b, double value) {
    if (isnan(value))
        buf_printf(b, " NaN\n");
    else if (isinf(value))
        buf_printf(b, " %cInf\n", value > 0 ? '+' : '-');
    else if (value == floor(value) && fabs(value) < 1e15)
        buf_printf(b, " %.0f\n", value);
    else
        buf_printf(b, " %.17g\n", value);
}

void vase_metrics_sample(struct vase_metrics_buf *b, const char *name,
                         const struct vase_metrics_label *labels, size_t n_labels, double value) {
    write_series(b, name, labels, n_labels, NULL);
    write_value(b, value);
}

void vase_metrics_histogram(struct vase_metrics_buf *b, const char *name,
                            const struct vase_metrics_label *labels, size_t n_labels,
                            const double *bounds, const uint64_t *counts, size_t n, double sum) {
    char series[128], le[48];
    uint64_t total = 0;
    snprintf(series, sizeof(series), "%s_bucket", name);
    for (size_t i = 0; i <= n; i++) {
        total += counts[i];
        if (i < n)
            snprintf(le, sizeof(le), "le=\"%g\"", bounds[i]);
        else
            snprintf(le, sizeof(le), "le=\"+Inf\"");
        write_series(b, series, labels, n_labels, le);
        write_value(b, (double)total);
    }
    snprintf(series, sizeof(series), "%s_sum", name);
    vase_metrics_sample(b, series, labels, n_labels, sum);
    snprintf(series, sizeof(series), "%s_count", name);
    vase_metrics_sample(b, series, labels, n_labels, (double)total);
}

/* ---- the daemon's metrics ---- */

static void gauge(struct vase_metrics_buf *b, const char *name, const char *help, double value) {
    vase_metrics_family(b, name, "gauge", help);
    vase_metrics_sample(b, name, NULL, 0, value);
}

static void counter(struct vase_metrics_buf *b, const char *name, const char *help,
                    uint64_t value) {
    vase_metrics_family(b, name, "counter", help);
    vase_metrics_sample(b, name, NULL, 0, (double)value);
}

static void render_arenas(const struct vased *d, struct vase_metrics_buf *b) {
    static const struct {
        const char *name, *help;
    } families[] = {
        {"vase_arena_bytes", "Size of the arena."},
        {"vase_arena_free_bytes", "Bytes of the arena in granules no page touches."},
        {"vase_arena_pages_bytes", "Bytes of the arena in pages of sequences."},
    };
    for (size_t f = 0; f < sizeof(families) / sizeof(families[0]); f++) {
        vase_metrics_family(b, families[f].name, "gauge", families[f].help);
        for (uint32_t i = 0; i < d->n_arenas; i++) {
            const struct vase_alloc *a = d->allocs[i];
            char id[16];
            snprintf(id, sizeof(id), "%u", d->arenas[i]->id);
            /* The arena's name only with metrics_tenant_labels: it often names a tenant. */
            struct vase_metrics_label named[] = {
                {"arena", id}, {"name", d->arena_names[i]}, {"kind", d->arenas[i]->kind}};
            struct vase_metrics_label bare[] = {{"arena", id}, {"kind", d->arenas[i]->kind}};
            uint64_t v = f == 0   ? a->arena_bytes
                         : f == 1 ? vase_alloc_free_bytes(a)
                                  : a->used_bytes;
            if (d->cfg.metrics_tenant_labels)
                vase_metrics_sample(b, families[f].name, named, 3, (double)v);
            else
                vase_metrics_sample(b, families[f].name, bare, 2, (double)v);
        }
    }
}

struct model_bytes {
    const char *name; /* the first raw name seen of those that escape to label */
    char label[VASE_METRICS_LABEL_MAX * 2 + 1];
    uint32_t arena;
    uint64_t bytes;
};

static size_t find_model(const struct model_bytes *mb, size_t n, const char *label,
                         uint32_t arena) {
    size_t i = 0;
    while (i < n && (mb[i].arena != arena || strcmp(mb[i].label, label) != 0))
        i++;
    return i;
}

/* Bytes of the live sequences per (model name, arena): several clients may register one model
 * name, and a series must appear once; names are told apart as their label values are (escaped
 * and cut), so two that the format writes alike add up in one series. Past
 * VASE_METRICS_MAX_MODELS names, the rest add up under model "" (one row per arena at most).
 * Only with metrics_tenant_labels: a model name tells whose engine it is. */
static int render_models(const struct vased *d, struct vase_metrics_buf *b) {
    if (!d->cfg.metrics_tenant_labels)
        return 0;
    struct model_bytes *mb = calloc(VASE_METRICS_MAX_MODELS + VASED_MAX_ARENAS, sizeof(*mb));
    size_t n = 0;
    if (!mb)
        return -ENOMEM;
    for (const struct vased_client *c = d->reg->clients; c; c = c->next)
        for (const struct vased_seq *s = c->seqs; s; s = s->next) {
            const char *name = s->model && s->model->name ? s->model->name : "";
            char label[VASE_METRICS_LABEL_MAX * 2 + 1];
            vase_metrics_escape(name, label, sizeof(label));
            size_t i = find_model(mb, n, label, s->arena_id);
            if (i == n && n >= VASE_METRICS_MAX_MODELS && label[0]) {
                label[0] = '\0';
                name = "";
                i = find_model(mb, n, label, s->arena_id);
            }
            if (i == n) {
                mb[n] = (struct model_bytes){.name = name, .arena = s->arena_id};
                memcpy(mb[n].label, label, sizeof(label));
                n++;
            }
            mb[i].bytes += vase_registry_seq_bytes(s);
        }
    vase_metrics_family(b, "vase_model_bytes", "gauge",
                        "Arena bytes the open sequences of a model hold (model as registered).");
    for (size_t i = 0; i < n; i++) {
        char arena[16];
        snprintf(arena, sizeof(arena), "%u", mb[i].arena);
        struct vase_metrics_label l[] = {{"model", mb[i].name}, {"arena", arena}};
        vase_metrics_sample(b, "vase_model_bytes", l, 2, (double)mb[i].bytes);
    }
    free(mb);
    return 0;
}

/* vase_sequence_info, only with metrics_sequence_labels: one series per live sequence, always 1,
 * naming its id, its label, its arena, and its model's name with metrics_tenant_labels too (a
 * model name tells whose engine it is). A series per sequence is one per request an engine
 * serves, each kept by Prometheus for its retention: hence a setting, off by default. The label
 * passed the wire's rule (nothing in it needs escaping) and is escaped like any value anyway. */
static void render_sequences(const struct vased *d, struct vase_metrics_buf *b) {
    if (!d->cfg.metrics_sequence_labels)
        return;
    vase_metrics_family(b, "vase_sequence_info", "gauge",
                        "Always 1, one series per open sequence: its id, the label its engine "
                        "gave it, its arena (and its model with metrics_tenant_labels).");
    for (const struct vased_client *c = d->reg->clients; c; c = c->next)
        for (const struct vased_seq *s = c->seqs; s; s = s->next) {
            char id[16], arena[16];
            snprintf(id, sizeof(id), "%u", s->id);
            snprintf(arena, sizeof(arena), "%u", s->arena_id);
            struct vase_metrics_label l[] = {
                {"seq", id},
                {"label", s->label},
                {"arena", arena},
                {"model", s->model && s->model->name ? s->model->name : ""}};
            vase_metrics_sample(b, "vase_sequence_info", l, d->cfg.metrics_tenant_labels ? 4 : 3,
                                1);
        }
}

/* One counter family over the policies, from a field of struct vase_metrics_policy. */
static void render_policy_counter(const struct vased *d, struct vase_metrics_buf *b,
                                  const char *name, const char *help, size_t offset,
                                  bool is_double) {
    vase_metrics_family(b, name, "counter", help);
    for (int p = 0; p < _VASE_POLICY_MAX; p++) {
        const char *field = (const char *)&d->metrics.policy[p] + offset;
        double v = is_double ? *(const double *)field : (double)*(const uint64_t *)field;
        struct vase_metrics_label l = {"policy", vase_policy_to_string((enum vase_policy)p)};
        vase_metrics_sample(b, name, &l, 1, v);
    }
}

static void render_policies(const struct vased *d, struct vase_metrics_buf *b) {
    render_policy_counter(d, b, "vase_evictions_total", "Eviction plans computed, by policy.",
                          offsetof(struct vase_metrics_policy, evictions), false);
    vase_metrics_family(b, "vase_plan_seconds", "histogram",
                        "Time the evictor threads took to compute a plan, by policy.");
    for (int p = 0; p < _VASE_POLICY_MAX; p++) {
        const struct vase_metrics_policy *mp = &d->metrics.policy[p];
        struct vase_metrics_label l = {"policy", vase_policy_to_string((enum vase_policy)p)};
        vase_metrics_histogram(b, "vase_plan_seconds", &l, 1, vase_metrics_plan_bounds,
                               mp->plan_buckets, VASE_METRICS_PLAN_BUCKETS, mp->plan_seconds);
    }
    render_policy_counter(d, b, "vase_engine_stalls_total",
                          "Appends that waited for a plan, as engines reported them with their "
                          "commits, by policy.",
                          offsetof(struct vase_metrics_policy, engine_stalls), false);
    render_policy_counter(d, b, "vase_engine_stall_seconds_total",
                          "Seconds engines waited for plans, as they reported them, by policy.",
                          offsetof(struct vase_metrics_policy, engine_stall_seconds), true);
    render_policy_counter(d, b, "vase_engine_compact_seconds_total",
                          "Seconds engines spent compacting, as they reported them, by policy.",
                          offsetof(struct vase_metrics_policy, engine_compact_seconds), true);
}

/* A counter family over message types: those that are requests, and "invalid". */
static void render_by_type(struct vase_metrics_buf *b, const char *name, const char *help,
                           const uint64_t *counts) {
    vase_metrics_family(b, name, "counter", help);
    for (unsigned t = 0; t < VASE_METRICS_MSG_TYPES; t++) {
        const char *type = "invalid";
        if (t) {
            const ProtobufCFieldDescriptor *f =
                protobuf_c_message_descriptor_get_field(&vase__envelope__descriptor, (int)t);
            if (!f || !vase_wire_is_request((Vase__Envelope__BodyCase)t))
                continue;
            type = f->name;
        }
        struct vase_metrics_label l = {"type", type};
        vase_metrics_sample(b, name, &l, 1, (double)counts[t]);
    }
}

static void render_requests(const struct vased *d, struct vase_metrics_buf *b) {
    static const char *const reasons[_VASE_METRICS_REFUSAL_MAX] = {
        [VASE_METRICS_REFUSAL_NOSPACE] = "nospace",
        [VASE_METRICS_REFUSAL_QUOTA] = "quota",
        [VASE_METRICS_REFUSAL_TIMEOUT] = "timeout",
        [VASE_METRICS_REFUSAL_INVALID] = "invalid",
        [VASE_METRICS_REFUSAL_OTHER] = "other"};
    render_by_type(b, "vase_requests_total",
                   "Control requests received, by message type (invalid: unreadable frames).",
                   d->metrics.requests);
    render_by_type(b, "vase_errors_total", "Error replies to engines' requests, by message type.",
                   d->metrics.engine_errors);
    render_by_type(b, "vase_admin_errors_total",
                   "Error replies to administrative requests (operator mistakes), by type.",
                   d->metrics.admin_errors);
    vase_metrics_family(b, "vase_admission_refusals_total", "counter",
                        "Sequence opens refused, by reason.");
    for (int i = 0; i < _VASE_METRICS_REFUSAL_MAX; i++) {
        struct vase_metrics_label l = {"reason", reasons[i]};
        vase_metrics_sample(b, "vase_admission_refusals_total", &l, 1,
                            (double)d->metrics.refusals[i]);
    }
    counter(b, "vase_engine_reports_ignored_total",
            "Commits whose stall and compaction counters were not taken (not finite, negative or "
            "lower than the sequence's last).",
            d->metrics.engine_reports_ignored);
    counter(b, "vase_stats_messages_total", "Attention statistics messages taken.",
            d->stats_messages_total);
}

int vase_metrics_render(const struct vased *d, struct vase_metrics_buf *b) {
    char protocol[16];
    snprintf(protocol, sizeof(protocol), "%d", VASE_WIRE_VERSION);
    struct vase_metrics_label build[] = {{"version", VASED_VERSION}, {"protocol", protocol}};
    vase_metrics_family(b, "vase_build_info", "gauge",
                        "Always 1; the labels name the daemon's version and protocol version.");
    vase_metrics_sample(b, "vase_build_info", build, 2, 1);
    gauge(b, "vase_start_time_seconds", "When the daemon started, in seconds since the epoch.",
          d->metrics.started_at);
    gauge(b, "vase_uptime_seconds", "Seconds since the daemon started.",
          vased_now() - d->started_at);

    render_arenas(d, b);
    if (render_models(d, b) < 0)
        return -ENOMEM;
    render_sequences(d, b);
    gauge(b, "vase_sequences", "Open sequences.", d->reg->n_seqs);
    gauge(b, "vase_clients", "Connected clients (engines).", d->reg->n_clients);
    gauge(b, "vase_clients_draining",
          "Clients gone, holding device pages until their process exits.", d->reg->n_draining);
    gauge(b, "vase_draining_bytes", "Bytes that draining clients hold.",
          (double)vase_registry_draining_bytes(d->reg));
    gauge(b, "vase_opens_waiting", "Sequence opens parked until their arena has room.",
          d->admitq.n);
    struct vase_evictor_counts q = {0};
    if (d->evictor)
        vase_evictor_get_counts(d->evictor, &q);
    gauge(b, "vase_plans_queued", "Eviction plans no evictor thread has started.", q.plans_queued);
    gauge(b, "vase_plans_running", "Eviction plans being computed.", q.plans_running);

    render_policies(d, b);
    render_requests(d, b);

    counter(b, "vase_events_published_total", "Events handed to the events socket.",
            d->events ? vase_events_count(d->events) - vase_events_dropped(d->events) : 0);
    counter(b, "vase_events_dropped_total",
            "Events not sent (out of memory, or the socket refused them); ZeroMQ's drops for a "
            "slow subscriber show as gaps in event_seq instead.",
            d->events ? vase_events_dropped(d->events) : 0);

    vase_metrics_family(b, "vase_metrics_connections_dropped_total", "counter",
                        "Connections to this endpoint dropped or refused, by reason.");
    for (int i = 0; i < _VASE_METRICS_DROP_MAX; i++) {
        struct vase_metrics_label l = {"reason", vase_metrics_drop_to_string(i)};
        vase_metrics_sample(b, "vase_metrics_connections_dropped_total", &l, 1,
                            (double)vase_metrics_http_dropped(d->metrics_http, i));
    }

    uint32_t shrunk = 0;
    uint64_t reclaiming = vase_elastic_reclaiming(d, &shrunk);
    counter(b, "vase_budget_shrinks_total", "Plans that lowered a sequence's elastic budget.",
            d->budget_shrinks_total);
    counter(b, "vase_budget_grows_total", "Commits that gave elastic budget back.",
            d->budget_grows_total);
    gauge(b, "vase_reclaiming_bytes", "Bytes sequences will release at their next commit.",
          (double)reclaiming);
    gauge(b, "vase_sequences_shrunk", "Sequences running below the budget they opened with.",
          shrunk);
    return b->error;
}
