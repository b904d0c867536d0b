/* SPDX-License-Identifier: MIT */

/*
 * The administrative requests: the daemon's status, listings of clients and sequences, one
 * sequence, and the settings. Who may send each was decided by control.c from the kernel's
 * credentials; here a listing shows only what that peer may see (access.c), and Status only the
 * arenas it may use. A settings change is logged with the uid and the old and new value, and
 * reloads (SIGHUP) go through the same vase_admin_apply_setting().
 */

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve/access.h"
#include "admin.h"
#include "core/alloc.h"
#include "core/arena.h"
#include "serve/elastic.h"
#include "plan/evictor.h"
#include "core/log.h"
#include "serve/metrics_http.h"
#include "serve/publish.h"
#include "core/registry.h"
#include "reply.h"
#include "serve/restore.h"
#include "state.h"
#include "wire.h"

static int handle_ping(struct vased *d, const struct vase_reply_to *p, const Vase__Ping *req) {
    Vase__Pong pong = VASE__PONG__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    pong.payload = req->payload;
    e.body_case = VASE__ENVELOPE__BODY_PONG;
    e.pong = &pong;
    vase_reply_send(d, p, &e);
    return 0;
}

static int handle_status(struct vased *d, const struct vase_reply_to *p,
                         const struct vased_peer *who) {
    Vase__ArenaStatus as[VASED_MAX_ARENAS], *asp[VASED_MAX_ARENAS];
    Vase__StatusReply sr = VASE__STATUS_REPLY__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    size_t n = 0;

    /* Anyone who can reach the socket may ask; the arenas shown are those the peer may use. */
    for (uint32_t i = 0; i < d->n_arenas; i++) {
        if (!who->admin && !(who->arenas & (1u << i)))
            continue;
        vase_publish_arena_status(d, i, &as[n]);
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
    sr.admin_errors_total = d->admin_errors_total;
    sr.metrics_address =
        d->metrics_http ? (char *)vase_metrics_http_address(d->metrics_http) : (char *)"";
    sr.metrics_unavailable = (char *)d->metrics_unavailable;
    sr.evictions_in_flight = d->evictions_in_flight;
    struct vase_evictor_counts q;
    vase_evictor_get_counts(d->evictor, &q);
    sr.plans_queued = q.plans_queued;
    sr.plans_running = q.plans_running;
    sr.clients_waiting = q.clients_waiting;
    sr.clients_draining = d->reg->n_draining;
    sr.opens_waiting = d->admitq.n;
    sr.bytes_draining = vase_registry_draining_bytes(d->reg);
    sr.budget_shrinks_total = d->budget_shrinks_total;
    sr.budget_grows_total = d->budget_grows_total;
    sr.bytes_reclaiming = vase_elastic_reclaiming(d, &sr.seqs_shrunk);
    sr.seqs_restored = d->reg->n_restored;
    sr.bytes_restored = vase_restore_bytes(d);
    e.body_case = VASE__ENVELOPE__BODY_STATUS_REPLY;
    e.status_reply = &sr;
    vase_reply_send(d, p, &e);
    return 0;
}

static int handle_list_clients(struct vased *d, const struct vase_reply_to *p,
                               const struct vased_peer *who) {
    uint32_t n = d->reg->n_clients + d->reg->n_draining;
    ProtobufCMessage **entries = vase_reply_repeated_new(n, sizeof(Vase__ClientInfo));
    if (!entries)
        return vase_reply_error(d, p, ENOMEM, "out of memory");
    size_t i = 0;
    /* Connected clients, then those whose pages wait for their process to exit. */
    for (struct vased_client *c = d->reg->clients; c && i < n; c = c->next)
        if (vase_access_client_visible(who, c))
            vase_publish_client_info(d, c, (Vase__ClientInfo *)entries[i++]);
    for (struct vased_client *c = d->reg->draining; c && i < n; c = c->next)
        if (vase_access_client_visible(who, c))
            vase_publish_client_info(d, c, (Vase__ClientInfo *)entries[i++]);
    vase_reply_listing(d, p, VASE__ENVELOPE__BODY_CLIENTS_REPLY, entries, i);
    return 0;
}

static int handle_list_seqs(struct vased *d, const struct vase_reply_to *p,
                            const Vase__ListSeqs *req, const struct vased_peer *who) {
    struct vased_client *only = NULL;
    if (req->client_id) {
        only = vase_registry_find_client(d->reg, req->client_id);
        if (!only || !vase_access_client_visible(who, only))
            return vase_reply_error(d, p, ENOENT, "no client %u", req->client_id);
    }
    size_t n = 0;
    for (struct vased_client *c = d->reg->clients; c; c = c->next)
        if (!only || c == only)
            n += c->n_seqs;
    ProtobufCMessage **entries = vase_reply_repeated_new(n, sizeof(Vase__SeqInfo));
    if (!entries)
        return vase_reply_error(d, p, ENOMEM, "out of memory");
    size_t i = 0;
    for (struct vased_client *c = d->reg->clients; c; c = c->next)
        if (!only || c == only)
            for (struct vased_seq *s = c->seqs; s && i < n; s = s->next)
                if (vase_access_seq_visible(who, s))
                    vase_publish_seq_info(s, (Vase__SeqInfo *)entries[i++]);
    vase_reply_listing(d, p, VASE__ENVELOPE__BODY_SEQS_REPLY, entries, i);
    return 0;
}

static int handle_get_seq(struct vased *d, const struct vase_reply_to *p, const Vase__GetSeq *req,
                          const struct vased_peer *who) {
    struct vased_seq *s = vase_registry_find_seq(d->reg, req->seq_id);
    if (!s || !vase_access_seq_visible(who, s))
        return vase_reply_error(d, p, ENOENT, "no sequence %u", req->seq_id);
    Vase__SeqInfo info;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    vase_publish_seq_info(s, &info);
    e.body_case = VASE__ENVELOPE__BODY_SEQ_INFO;
    e.seq_info = &info;
    vase_reply_send(d, p, &e);
    return 0;
}

#define CONFIG_VALUE_MAX 4097
#define CONFIG_SOURCE_MAX (4097 + 16)

/* One ConfigEntry; text is the caller's buffer of CONFIG_VALUE_MAX + CONFIG_SOURCE_MAX bytes, for
 * the value and the source. */
static void config_entry(const struct vased *d, const struct vase_setting *s, char *text,
                         Vase__ConfigEntry *ret) {
    vase__config_entry__init(ret);
    vase_config_format(&d->cfg, s, text, CONFIG_VALUE_MAX);
    vase_config_source(&d->cfg, s, text + CONFIG_VALUE_MAX, CONFIG_SOURCE_MAX);
    ret->key = (char *)s->name;
    ret->value = text;
    ret->type = (char *)vase_setting_type_name(s->type);
    ret->default_value = (char *)s->def;
    ret->runtime = s->runtime;
    ret->description = (char *)s->description;
    ret->source = text + CONFIG_VALUE_MAX;
    size_t i = (size_t)(s - vase_settings);
    ret->pending =
        d->pending_settings && d->pending_settings[i] ? d->pending_settings[i] : (char *)"";
}

static int reply_config(struct vased *d, const struct vase_reply_to *p,
                        const struct vase_setting *only) {
    const size_t each = CONFIG_VALUE_MAX + CONFIG_SOURCE_MAX;
    size_t n = only ? 1 : vase_settings_count;
    ProtobufCMessage **entries = vase_reply_repeated_new(n, sizeof(Vase__ConfigEntry));
    char *texts = calloc(n, each);
    if (!entries || !texts) {
        free(entries);
        free(texts);
        return vase_reply_error(d, p, ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++)
        config_entry(d, only ? only : &vase_settings[i], texts + i * each,
                     (Vase__ConfigEntry *)entries[i]);
    vase_reply_listing(d, p, VASE__ENVELOPE__BODY_CONFIG_REPLY, entries, n);
    free(texts);
    return 0;
}

static int handle_config_get(struct vased *d, const struct vase_reply_to *p,
                             const Vase__ConfigGet *req) {
    const struct vase_setting *s = NULL;
    if (req->key[0]) {
        s = vase_setting_find(req->key);
        if (!s)
            return vase_reply_error(d, p, ENOENT, "no setting \"%s\"", req->key);
    }
    reply_config(d, p, s);
    return 0;
}

/* Whether vased's command line gives s: a flag wins over every file, so a value persisted in a
 * drop-in would not last. */
static bool given_by_flag(const struct vased *d, const struct vase_setting *s) {
    for (size_t i = 0; d->cmdline && i < d->cmdline->n_overrides; i++)
        if (vase_setting_find(d->cmdline->keys[i]) == s)
            return true;
    return false;
}

/* The drop-in that gives s and is read after VASE_CONFIG_PERSIST_NAME, so that it would win over
 * a persisted value at the next reload or start; NULL when none does. */
static const char *given_by_later_dropin(const struct vased *d, const struct vase_setting *s) {
    const char *dir = d->cfg.dropin_dir;
    const char *path = d->cfg.origins ? d->cfg.origins[s - vase_settings].file_path : NULL;
    size_t n = dir ? strlen(dir) : 0;
    if (!path || !dir || strncmp(path, dir, n) != 0 || path[n] != '/')
        return NULL;
    return strcmp(path + n + 1, VASE_CONFIG_PERSIST_NAME) > 0 ? path : NULL;
}

static int handle_config_set(struct vased *d, const struct vase_reply_to *p,
                             const Vase__ConfigSet *req) {
    const struct vase_setting *s = vase_setting_find(req->key);
    if (!s)
        return vase_reply_error(d, p, ENOENT, "no setting \"%s\"", req->key);
    if (req->persist && s->runtime && given_by_flag(d, s))
        return vase_reply_error(d, p, EBUSY,
                                "%s not changed: vased's command line gives it (--%s), which wins "
                                "over the configuration files, so a persisted value would not "
                                "last; change it without --persist, or change the flag",
                                s->name, s->name);
    const char *later = req->persist && s->runtime ? given_by_later_dropin(d, s) : NULL;
    if (later)
        return vase_reply_error(d, p, EBUSY,
                                "%s not changed: %s gives it and is read after %s, so a persisted "
                                "value would not last; change it there, or without --persist",
                                s->name, later, VASE_CONFIG_PERSIST_NAME);
    /* --config=/dev/null and no config_dir: no directory of this daemon's own to write in. */
    if (req->persist && s->runtime && !d->cfg.dropin_dir)
        return vase_reply_error(
            d, p, ENOTSUP,
            "%s not changed: vased has no drop-in directory to persist it in "
            "(its configuration, %s, is not a file, and config_dir is "
            "empty); change it without --persist, or start vased with "
            "--config-dir=DIR",
            s->name, d->cmdline && d->cmdline->config_path ? d->cmdline->config_path : "/dev/null");
    char old[CONFIG_VALUE_MAX];
    vase_config_format(&d->cfg, s, old, sizeof(old));
    int r = vase_config_set(&d->cfg, req->key, req->value, VASE_CONFIG_RUNTIME);
    if (r == -EPERM)
        return vase_reply_error(d, p, EPERM,
                                "%s cannot change while vased runs; edit the "
                                "configuration file and restart",
                                s->name);
    if (r == -ERANGE)
        return vase_reply_error(d, p, ERANGE, "%s: \"%s\" is out of range", s->name, req->value);
    if (r == -EINVAL)
        return vase_reply_error(d, p, EINVAL, "%s: \"%s\" is not a valid %s", s->name, req->value,
                                vase_setting_type_name(s->type));
    if (r < 0)
        return vase_reply_error(d, p, -r, "%s: %s", s->name, strerror(-r));
    char now[CONFIG_VALUE_MAX];
    vase_config_format(&d->cfg, s, now, sizeof(now));
    if (req->persist) {
        /* Persisted or not changed at all: a value that would be lost at the next restart is
         * not what the operator asked for. */
        char *path = NULL;
        r = vase_config_persist(d->cfg.dropin_dir, s, now, p->cred.uid, time(NULL), &path);
        if (r < 0) {
            vase_config_set(&d->cfg, s->name, old, 0);
            log_error_errno(r, "Setting %s to \"%s\" for uid %u not persisted in %s/%s: %m",
                            s->name, now, (unsigned)p->cred.uid, d->cfg.dropin_dir,
                            VASE_CONFIG_PERSIST_NAME);
            return vase_reply_error(
                d, p, -r, "%s not changed: cannot persist it in %s/%s: %s%s", s->name,
                d->cfg.dropin_dir, VASE_CONFIG_PERSIST_NAME, strerror(-r),
                r == -EPERM || r == -ELOOP
                    ? " (vased refused the directory or the file: a symlink, not a regular file, "
                      "or writable by others than its owner; its log says which and why)"
                    : "");
        }
        r = vase_config_note_file(&d->cfg, s, path);
        if (r < 0)
            log_error_errno(r, "Cannot record that %s comes from %s: %m", s->name, path);
        log_notice("Setting %s changed from \"%s\" to \"%s\" and persisted in %s by uid %u "
                   "(pid %d).",
                   s->name, old, now, path, (unsigned)p->cred.uid, (int)p->cred.pid);
        free(path);
    } else {
        vase_config_set_origin(&d->cfg, s, VASE_CONFIG_FROM_RUNTIME, p->cred.uid);
        log_notice("Setting %s changed from \"%s\" to \"%s\" by uid %u (pid %d).", s->name, old,
                   now, (unsigned)p->cred.uid, (int)p->cred.pid);
    }
    vase_admin_apply_setting(d, s->name);
    reply_config(d, p, s);
    return 0;
}

int vase_admin_apply_setting(struct vased *d, const char *key) {
    const struct vase_setting *s = vase_setting_find(key);
    if (!s)
        return -ENOENT;
    if (strcmp(s->name, "log_level") == 0) {
        vase_log_set_max_level(d->cfg.log_level);
    } else if (strcmp(s->name, "allow_users") == 0 || strcmp(s->name, "allow_groups") == 0) {
        /* Sessions already open stay open; the new lists decide from the next connection. */
        struct vase_allow a;
        int r = vase_allow_parse(d->cfg.allow_users, d->cfg.allow_groups, &a);
        if (r < 0)
            return log_error_errno(r, "Cannot apply the new allow-list, keeping the old: %m");
        vase_allow_done(&d->allow);
        d->allow = a;
    }
    /* Everything else is read where it is used. */
    return 0;
}

int vase_admin_handle(struct vased *d, const struct vase_reply_to *p, const Vase__Envelope *e,
                      const struct vased_peer *who) {
    switch (e->body_case) {
    case VASE__ENVELOPE__BODY_PING:
        return handle_ping(d, p, e->ping);
    case VASE__ENVELOPE__BODY_STATUS:
        return handle_status(d, p, who);
    case VASE__ENVELOPE__BODY_LIST_CLIENTS:
        return handle_list_clients(d, p, who);
    case VASE__ENVELOPE__BODY_LIST_SEQS:
        return handle_list_seqs(d, p, e->list_seqs, who);
    case VASE__ENVELOPE__BODY_GET_SEQ:
        return handle_get_seq(d, p, e->get_seq, who);
    case VASE__ENVELOPE__BODY_CONFIG_GET:
        return handle_config_get(d, p, e->config_get);
    case VASE__ENVELOPE__BODY_CONFIG_SET:
        return handle_config_set(d, p, e->config_set);
    default:
        return vase_reply_error(d, p, EINVAL, "%s is not a request", vase_wire_body_name(e));
    }
}
