/* SPDX-License-Identifier: MIT */

/*
 * The settings table and what every consumer of it shares: finding a row, the checked number
 * parsers, setting, getting and formatting a value, and the checks of relations between
 * settings (an arena's geometry, the [arena NAME] sections, host memory). Invariants: every
 * value in a struct vase_config has passed its setting's parser and bounds (defaults included:
 * they are strings parsed by the same code); a failed set leaves the struct unchanged; string
 * settings are always allocated (never NULL after vase_config_init()). Numbers never go through
 * atoi: vase_parse_*() reject junk with -EINVAL and overflow with -ERANGE. The INI file is
 * config_ini.c's, the command line config_cmdline.c's; both reach the table only through the
 * functions here and in config_internal.h.
 */

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/balance.h"
#include "config.h"
#include "config_internal.h"
#include "core/log.h"

#define OFF(field) offsetof(struct vase_config, field)

const struct vase_setting vase_settings[] = {
    {"runtime_dir", VASE_SETTING_STRING, OFF(runtime_dir), 0, 0, "", false,
     "Directory of session.sock, control.sock and events.sock, created with mode 0755 if "
     "missing; refused if anyone but the daemon's user and root can write it (or if it is a "
     "symlink or owned by another user). Empty: $VASE_RUNTIME_DIR, else $RUNTIME_DIRECTORY (set "
     "by systemd), else ./run."},
    {"config_dir", VASE_SETTING_STRING, OFF(config_dir), 0, 0, "", false,
     "Directory of drop-in files read after the main configuration file, in lexical order, "
     "later ones overriding earlier ones: every NAME.conf in it (not dotfiles), each in the "
     "main file's format. Empty: vased.conf.d next to the main file (/etc/vase/vased.conf.d for "
     "/etc/vase/vased.conf); none for a main file that is no file (/dev/null). The directory "
     "and each drop-in must belong to root or the daemon's user and be writable by no one else; "
     "a drop-in must be a regular file, not a symlink. `vasectl config set --persist` writes "
     "90-vasectl.conf there."},
    {"arena", VASE_SETTING_STRING, OFF(arena), 0, 0, "host", false,
     "Where the KV arena lives: \"host\" (a memfd shared with SCM_RIGHTS), or a GPU as "
     "\"cuda:N\" (device N as this process numbers them) or \"cuda:GPU-<uuid>\" (as nvidia-smi "
     "-L prints it; stable across containers). CUDA arenas need a vased built with CUDA and a "
     "device in compute mode Default."},
    {"cuda_share", VASE_SETTING_STRING, OFF(cuda_share), 0, 0, "ipc", false,
     "How a CUDA arena is shared with engines: \"ipc\" (cudaMalloc, legacy CUDA IPC handle) or "
     "\"vmm\" (cuMemCreate, POSIX file descriptor passed over the session socket)."},
    {"arena_bytes", VASE_SETTING_SIZE, OFF(arena_bytes), 1 << 16, INT64_C(1) << 40, "1G", false,
     "Size of the arena in bytes (K, M, G, T suffixes); a multiple of granule_bytes."},
    {"granule_bytes", VASE_SETTING_SIZE, OFF(granule_bytes), 4096, INT64_C(1) << 30, "2M", false,
     "Size of a granule, the unit in which the arena is managed: a granule holds pages of one "
     "size at a time (a model's KV pages, query ring or plan pages) and returns to the free "
     "pool when its last page is released; a multiple of 4096 that divides arena_bytes."},
    {"arena_users", VASE_SETTING_STRING, OFF(arena_users), 0, 0, "", false,
     "Users (names or numeric uids, separated by commas or spaces) who may use the default "
     "arena (arena 0). With arena_groups, both empty: everyone admitted by allow_users and "
     "allow_groups; name them once [arena NAME] sections give other tenants arenas of their "
     "own."},
    {"arena_groups", VASE_SETTING_STRING, OFF(arena_groups), 0, 0, "", false,
     "Groups (names or numeric gids) whose members, by primary or supplementary group, may use "
     "the default arena."},
    {"allow_users", VASE_SETTING_STRING, OFF(allow_users), 0, 0, "", true,
     "Users (names or numeric uids, separated by commas or spaces) allowed to open a "
     "session. Root and the daemon's own user always may; with both lists empty, no one else."},
    {"allow_groups", VASE_SETTING_STRING, OFF(allow_groups), 0, 0, "", true,
     "Groups (names or numeric gids) whose members, by primary or supplementary group, may "
     "open a session."},
    {"socket_group", VASE_SETTING_STRING, OFF(socket_group), 0, 0, "", false,
     "Group given to the sockets (mode 0660). Empty: the daemon's group."},
    {"admin_group", VASE_SETTING_STRING, OFF(admin_group), 0, 0, "", false,
     "Group whose members, by primary or supplementary group, may change settings through the "
     "control socket (vasectl config set), besides root and the daemon's own user. Empty: no "
     "one else."},
    {"max_clients", VASE_SETTING_U32, OFF(max_clients), 1, 4096, "64", true,
     "Most sessions open at once; more are refused at the handshake."},
    {"max_seqs_per_client", VASE_SETTING_U32, OFF(max_seqs_per_client), 1, 65536, "1024", true,
     "Most sequences one client may have open (EDQUOT beyond)."},
    {"max_bytes_per_client", VASE_SETTING_SIZE, OFF(max_bytes_per_client), 0, INT64_C(1) << 40, "0",
     true,
     "Most arena bytes one client's sequences may hold (KV, query ring and plan pages; EDQUOT "
     "beyond); 0: no quota."},
    {"max_models_per_client", VASE_SETTING_U32, OFF(max_models_per_client), 1, 1024, "16", true,
     "Most model geometries one client may register (EDQUOT beyond)."},
    {"max_stats_bytes_per_client", VASE_SETTING_SIZE, OFF(max_stats_bytes_per_client), 0,
     INT64_C(1) << 40, "128M", true,
     "Most daemon memory the attention statistics one client pushes (accumulated attention and "
     "window scores) may hold; beyond it AttnStats is refused with EDQUOT. 0 accepts no "
     "statistics at all (it is not \"no limit\")."},
    {"max_sessions_per_uid", VASE_SETTING_U32, OFF(max_sessions_per_uid), 1, 4096, "16", true,
     "Most sessions the clients of one uid may have open at once; more are refused at the "
     "handshake (EUSERS), so one uid cannot take every one of max_clients. Like every per-uid "
     "cap, it does not apply to root and the daemon's own uid."},
    {"max_seqs_per_uid", VASE_SETTING_U32, OFF(max_seqs_per_uid), 1, 1 << 20, "4096", true,
     "Most sequences the clients of one uid may have open together (EDQUOT beyond)."},
    {"max_waiting_opens_per_uid", VASE_SETTING_U32, OFF(max_waiting_opens_per_uid), 0, 1 << 20,
     "1024", true,
     "Most opens of the clients of one uid that may wait for room together (admission wait); "
     "beyond it an open that finds no room is refused with EDQUOT at once."},
    {"max_stats_bytes_per_uid", VASE_SETTING_SIZE, OFF(max_stats_bytes_per_uid), 0,
     INT64_C(1) << 40, "256M", true,
     "Most daemon memory the attention statistics of the clients of one uid may hold together "
     "(EDQUOT beyond). 0 accepts no statistics from such a uid."},
    {"max_message_bytes", VASE_SETTING_SIZE, OFF(max_message_bytes), 1 << 16, 256 << 20, "16M",
     false,
     "Largest control message accepted; larger ones are refused with EMSGSIZE before they "
     "are parsed."},
    {"evictor_threads", VASE_SETTING_U32, OFF(evictor_threads), 0, 256, "0", false,
     "Threads computing eviction plans; 0: one per CPU."},
    {"stats_interval", VASE_SETTING_U32, OFF(stats_interval), 0, 86400, "10", true,
     "Seconds between STATUS= updates and pressure events; 0: only on changes."},
    {"metrics_address", VASE_SETTING_STRING, OFF(metrics_address), 0, 0, "127.0.0.1:9464", false,
     "Where the Prometheus metrics are served over HTTP (GET /metrics): HOST:PORT with an IPv4 "
     "address, or an IPv6 one in brackets ([::1]:9464); port 0 takes a free port (vasectl "
     "status shows it); off: no endpoint. Not authenticated: keep it on a loopback or "
     "otherwise trusted address."},
    {"metrics_tenant_labels", VASE_SETTING_BOOL, OFF(metrics_tenant_labels), 0, 1, "no", true,
     "Whether the metrics name tenants: the model names engines registered (vase_model_bytes) "
     "and the arenas' names (the name label of vase_arena_*), which often name the tenant an "
     "arena is for. Off: arena series carry only the arena's number and kind, and no series "
     "names a model. On: anyone who can connect to metrics_address (every local user, for a "
     "loopback address) reads every tenant's model names and usage."},
    {"metrics_sequence_labels", VASE_SETTING_BOOL, OFF(metrics_sequence_labels), 0, 1, "no", true,
     "Whether the metrics have vase_sequence_info, one series per open sequence naming its id, "
     "arena and the label its engine gave it (a request id, say), and its model with "
     "metrics_tenant_labels. Off by default: a series per sequence grows a Prometheus server's "
     "series with every request served, and anyone who can connect to metrics_address reads "
     "every sequence's label."},
    {"shutdown_timeout", VASE_SETTING_U32, OFF(shutdown_timeout), 0, 600, "10", true,
     "Seconds a clean shutdown waits for plans being computed."},
    {"restore_grace", VASE_SETTING_U32, OFF(restore_grace), 1, 86400, "120", true,
     "Seconds after a restart that kept the host arenas (systemd's file descriptor store) "
     "during which engines may reopen their sequences on the same pages; those not reopened "
     "by then are freed."},
    {"log_level", VASE_SETTING_LOG_LEVEL, OFF(log_level), 0, 7, "info", true,
     "Most verbose messages logged: emerg, alert, crit, err, warning, notice, info, debug."},
    {"default_slack", VASE_SETTING_I32, OFF(default_slack), -1, 1 << 20, "-1", true,
     "Slots a sequence may fill beyond budget + window while a plan is computed, when "
     "OpenSeq asks for the default; -1: one window."},
    {"admission_wait_ms", VASE_SETTING_U32, OFF(admission_wait_ms), 0, 600000, "0", true,
     "Milliseconds an OpenSeq that asks for the default waits for room when its arena is full "
     "(parked, admitted in arrival order as closes free memory) before it is refused with "
     "ENOSPC; 0: refused at once."},
    {"elastic_policy", VASE_SETTING_ELASTIC_POLICY, OFF(elastic_policy), 0, 1, "proportional", true,
     "How the daemon lowers the budgets of elastic sequences (opened with min_budget below "
     "budget) to make room for waiting opens, first among the sequences of the first waiting "
     "open's page size, then among all of the arena's: proportional: every elastic sequence "
     "keeps the same fraction of its budget times its weight (water-filling), none below its "
     "min_budget; priority: sequences of the lowest weight go down to their min_budget first, "
     "proportionally among them, before a higher weight gives anything."},
};

const size_t vase_settings_count = sizeof(vase_settings) / sizeof(vase_settings[0]);
static_assert(sizeof(vase_settings) / sizeof(vase_settings[0]) == VASE_SETTINGS_N,
              "VASE_SETTINGS_N (config_internal.h) is the table's length");

bool vase_setting_key_equal(const char *a, const char *b) {
    for (;; a++, b++) {
        char x = *a == '-' ? '_' : *a, y = *b == '-' ? '_' : *b;
        if (x != y)
            return false;
        if (!x)
            return true;
    }
}

const struct vase_setting *vase_setting_find(const char *key) {
    if (!key)
        return NULL;
    for (size_t i = 0; i < vase_settings_count; i++)
        if (vase_setting_key_equal(vase_settings[i].name, key))
            return &vase_settings[i];
    return NULL;
}

const char *vase_setting_type_name(enum vase_setting_type t) {
    switch (t) {
    case VASE_SETTING_STRING:
        return "string";
    case VASE_SETTING_U32:
        return "uint32";
    case VASE_SETTING_SIZE:
        return "size";
    case VASE_SETTING_I32:
        return "int32";
    case VASE_SETTING_LOG_LEVEL:
        return "log-level";
    case VASE_SETTING_ELASTIC_POLICY:
        return "elastic-policy";
    case VASE_SETTING_BOOL:
        return "bool";
    }
    return "?";
}

/* ---- values ---- */

void *vase_config_field(const struct vase_config *c, const struct vase_setting *s) {
    return (char *)c + s->offset;
}

/* yes/no, true/false, on/off, 1/0 (any case): 1 or 0, else -EINVAL. */
static int parse_bool(const char *s) {
    static const char *const yes[] = {"yes", "true", "on", "1"}, *const no[] = {"no", "false",
                                                                                "off", "0"};
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0)
            return 1;
        if (strcasecmp(s, no[i]) == 0)
            return 0;
    }
    return -EINVAL;
}

int vase_setting_parse(const struct vase_setting *s, const char *value, int64_t *ret_num) {
    uint64_t u;
    int64_t i;
    int r;

    switch (s->type) {
    case VASE_SETTING_STRING:
        return strlen(value) > PATH_MAX ? -ERANGE : 0;
    case VASE_SETTING_U32:
        r = vase_parse_u64(value, &u);
        break;
    case VASE_SETTING_SIZE:
        r = vase_parse_size(value, &u);
        break;
    case VASE_SETTING_I32:
        r = vase_parse_i64(value, &i);
        if (r < 0)
            return r;
        if (i < s->min || i > s->max)
            return -ERANGE;
        *ret_num = i;
        return 0;
    case VASE_SETTING_LOG_LEVEL:
        r = vase_log_level_from_string(value);
        if (r < 0)
            return r;
        *ret_num = r;
        return 0;
    case VASE_SETTING_ELASTIC_POLICY:
        r = vase_elastic_policy_from_string(value);
        if (r < 0)
            return r;
        *ret_num = r;
        return 0;
    case VASE_SETTING_BOOL:
        r = parse_bool(value);
        if (r < 0)
            return r;
        *ret_num = r;
        return 0;
    default:
        return -EINVAL;
    }
    if (r < 0)
        return r;
    if (u > (uint64_t)s->max || u < (uint64_t)s->min)
        return -ERANGE;
    *ret_num = (int64_t)u;
    return 0;
}

int vase_config_set(struct vase_config *c, const char *key, const char *value, unsigned flags) {
    if (!c || !key || !value)
        return -EINVAL;
    const struct vase_setting *s = vase_setting_find(key);
    if (!s)
        return -ENOENT;
    if ((flags & VASE_CONFIG_RUNTIME) && !s->runtime)
        return -EPERM;

    int64_t num = 0;
    int r = vase_setting_parse(s, value, &num);
    if (r < 0)
        return r;

    void *p = vase_config_field(c, s);
    switch (s->type) {
    case VASE_SETTING_STRING: {
        char *copy = strdup(value);
        if (!copy)
            return -ENOMEM;
        free(*(char **)p);
        *(char **)p = copy;
        break;
    }
    case VASE_SETTING_U32:
        *(uint32_t *)p = (uint32_t)num;
        break;
    case VASE_SETTING_SIZE:
        *(uint64_t *)p = (uint64_t)num;
        break;
    case VASE_SETTING_I32:
        *(int32_t *)p = (int32_t)num;
        break;
    case VASE_SETTING_LOG_LEVEL:
    case VASE_SETTING_ELASTIC_POLICY:
        *(int *)p = (int)num;
        break;
    case VASE_SETTING_BOOL:
        *(bool *)p = num != 0;
        break;
    }
    return 0;
}

int vase_config_format(const struct vase_config *c, const struct vase_setting *s, char *buf,
                       size_t len) {
    if (!c || !s || !buf || len == 0)
        return -EINVAL;
    const void *p = vase_config_field(c, s);
    switch (s->type) {
    case VASE_SETTING_STRING:
        snprintf(buf, len, "%s", *(char *const *)p ? *(char *const *)p : "");
        break;
    case VASE_SETTING_U32:
        snprintf(buf, len, "%" PRIu32, *(const uint32_t *)p);
        break;
    case VASE_SETTING_SIZE:
        vase_format_size(*(const uint64_t *)p, buf, len);
        break;
    case VASE_SETTING_I32:
        snprintf(buf, len, "%" PRId32, *(const int32_t *)p);
        break;
    case VASE_SETTING_LOG_LEVEL: {
        const char *n = vase_log_level_to_string(*(const int *)p);
        snprintf(buf, len, "%s", n ? n : "?");
        break;
    }
    case VASE_SETTING_ELASTIC_POLICY: {
        const char *n = vase_elastic_policy_to_string(*(const int *)p);
        snprintf(buf, len, "%s", n ? n : "?");
        break;
    }
    case VASE_SETTING_BOOL:
        snprintf(buf, len, "%s", *(const bool *)p ? "yes" : "no");
        break;
    }
    return 0;
}

int vase_config_get(const struct vase_config *c, const char *key, char **ret) {
    if (!c || !ret)
        return -EINVAL;
    const struct vase_setting *s = vase_setting_find(key);
    if (!s)
        return -ENOENT;
    size_t len = 64;
    if (s->type == VASE_SETTING_STRING && *(char *const *)vase_config_field(c, s))
        len = strlen(*(char *const *)vase_config_field(c, s)) + 1;
    char *buf = malloc(len);
    if (!buf)
        return -ENOMEM;
    vase_config_format(c, s, buf, len);
    *ret = buf;
    return 0;
}

void vase_arena_config_done(struct vase_arena_config *a) {
    free(a->name);
    free(a->arena);
    free(a->cuda_share);
    free(a->users);
    free(a->groups);
    *a = (struct vase_arena_config){0};
}

static void origin_clear_file(struct vase_config_origin *o) {
    free(o->file_value);
    free(o->file_path);
    o->file_value = o->file_path = NULL;
}

void vase_config_done(struct vase_config *c) {
    if (!c)
        return;
    for (size_t i = 0; c->origins && i < vase_settings_count; i++)
        origin_clear_file(&c->origins[i]);
    free(c->origins);
    c->origins = NULL;
    free(c->dropin_dir);
    c->dropin_dir = NULL;
    for (size_t i = 0; i < vase_settings_count; i++)
        if (vase_settings[i].type == VASE_SETTING_STRING) {
            char **p = vase_config_field(c, &vase_settings[i]);
            free(*p);
            *p = NULL;
        }
    for (size_t i = 0; i < c->n_extra_arenas; i++)
        vase_arena_config_done(&c->extra_arenas[i]);
    free(c->extra_arenas);
    c->extra_arenas = NULL;
    c->n_extra_arenas = 0;
}

int vase_config_init(struct vase_config *c) {
    if (!c)
        return -EINVAL;
    *c = (struct vase_config){0};
    c->origins = calloc(vase_settings_count, sizeof(*c->origins));
    if (!c->origins)
        return -ENOMEM;
    for (size_t i = 0; i < vase_settings_count; i++) {
        int r = vase_config_set(c, vase_settings[i].name, vase_settings[i].def, 0);
        if (r < 0) {
            vase_config_done(c);
            return r;
        }
    }
    return 0;
}

void vase_setting_bounds(const struct vase_setting *s, char *buf, size_t len) {
    char a[32], b[32];
    switch (s->type) {
    case VASE_SETTING_U32:
    case VASE_SETTING_I32:
        snprintf(buf, len, "%s, %" PRId64 " .. %" PRId64, vase_setting_type_name(s->type), s->min,
                 s->max);
        break;
    case VASE_SETTING_SIZE:
        vase_format_size((uint64_t)s->min, a, sizeof(a));
        vase_format_size((uint64_t)s->max, b, sizeof(b));
        snprintf(buf, len, "size, %s .. %s", a, b);
        break;
    default:
        snprintf(buf, len, "%s", vase_setting_type_name(s->type));
        break;
    }
}

/* ---- relations between settings ---- */

const char *vase_arena_problem(uint64_t arena_bytes, uint64_t granule_bytes,
                               const char *cuda_share) {
    if (granule_bytes == 0 || granule_bytes % 4096 != 0)
        return "granule_bytes must be a multiple of 4096";
    if (arena_bytes % granule_bytes != 0)
        return "granule_bytes must divide arena_bytes";
    if (arena_bytes / granule_bytes > INT32_MAX)
        return "arena_bytes / granule_bytes must be below 2^31 granules";
    if (arena_bytes / granule_bytes < 2)
        return "the arena must hold at least 2 granules";
    if (cuda_share && strcmp(cuda_share, "ipc") != 0 && strcmp(cuda_share, "vmm") != 0)
        return "cuda_share must be \"ipc\" or \"vmm\"";
    return NULL;
}

bool vase_arena_name_valid(const char *name) {
    size_t n = strlen(name);
    return n >= 1 && n <= VASE_ARENA_NAME_MAX &&
           strspn(name, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-") == n &&
           strcmp(name, "default") != 0;
}

/* Bounds of the table's row for an arena key, checked again for structs not built by the
 * parser. */
static bool in_bounds(const char *setting, uint64_t v) {
    const struct vase_setting *s = vase_setting_find(setting);
    return v >= (uint64_t)s->min && v <= (uint64_t)s->max;
}

int vase_config_check(const struct vase_config *c, const char **ret_msg) {
    /* Messages about an [arena NAME] section name it; this thread's last one lives here. */
    static _Thread_local char buf[160];
    const char *msg = vase_arena_problem(c->arena_bytes, c->granule_bytes, c->cuda_share);

    if (!msg && c->n_extra_arenas > VASE_CONFIG_MAX_EXTRA_ARENAS)
        msg = "too many [arena NAME] sections";
    for (size_t i = 0; !msg && i < c->n_extra_arenas; i++) {
        const struct vase_arena_config *a = &c->extra_arenas[i];
        const char *what = NULL;
        if (!a->name || !vase_arena_name_valid(a->name)) {
            msg = "an arena name must be 1 to 32 letters, digits, '_' or '-', and not \"default\"";
            break;
        }
        for (size_t j = 0; j < i && !what; j++)
            if (strcmp(c->extra_arenas[j].name, a->name) == 0)
                what = "defined twice";
        if (!what && (!a->arena || !a->cuda_share || !a->users || !a->groups))
            what = "a value is missing";
        if (!what && (!in_bounds("arena_bytes", a->arena_bytes) ||
                      !in_bounds("granule_bytes", a->granule_bytes)))
            what = "arena_bytes or granule_bytes out of bounds";
        if (!what)
            what = vase_arena_problem(a->arena_bytes, a->granule_bytes, a->cuda_share);
        if (what) {
            snprintf(buf, sizeof(buf), "[arena %s]: %s", a->name, what);
            msg = buf;
        }
    }
    if (ret_msg)
        *ret_msg = msg;
    return msg ? -EINVAL : 0;
}

uint64_t vase_config_host_arena_bytes(const struct vase_config *c) {
    uint64_t sum = 0;
    if (!c)
        return 0;
    if (c->arena && strcmp(c->arena, "host") == 0)
        sum += c->arena_bytes;
    for (size_t i = 0; i < c->n_extra_arenas; i++)
        if (c->extra_arenas[i].arena && strcmp(c->extra_arenas[i].arena, "host") == 0)
            sum += c->extra_arenas[i].arena_bytes;
    return sum;
}

int vase_config_check_memory(const struct vase_config *c, uint64_t phys_bytes) {
    if (!c || phys_bytes == 0)
        return -EINVAL;
    /* At most 8 arenas of at most 2^40 bytes each: the sum cannot overflow. */
    uint64_t need = vase_config_host_arena_bytes(c);
    if (need > phys_bytes)
        return -ERANGE;
    return need > phys_bytes - phys_bytes / 4 ? 1 : 0;
}

static bool str_equal(const char *a, const char *b) {
    return strcmp(a ? a : "", b ? b : "") == 0;
}

bool vase_config_arenas_equal(const struct vase_config *a, const struct vase_config *b) {
    if (!a || !b)
        return a == b;
    if (a->n_extra_arenas != b->n_extra_arenas)
        return false;
    for (size_t i = 0; i < a->n_extra_arenas; i++) {
        const struct vase_arena_config *x = &a->extra_arenas[i], *y = &b->extra_arenas[i];
        if (!str_equal(x->name, y->name) || !str_equal(x->arena, y->arena) ||
            !str_equal(x->cuda_share, y->cuda_share) || x->arena_bytes != y->arena_bytes ||
            x->granule_bytes != y->granule_bytes || !str_equal(x->users, y->users) ||
            !str_equal(x->groups, y->groups))
            return false;
    }
    return true;
}

/* ---- where values come from ---- */

static struct vase_config_origin *origin_of(const struct vase_config *c,
                                            const struct vase_setting *s) {
    return c && c->origins && s ? &c->origins[s - vase_settings] : NULL;
}

/* Sets o's file_value and file_path to copies of value and path (either may be NULL). */
static int origin_set_file(struct vase_config_origin *o, const char *value, const char *path) {
    char *v = value ? strdup(value) : NULL, *p = path ? strdup(path) : NULL;
    if ((value && !v) || (path && !p)) {
        free(v);
        free(p);
        return -ENOMEM;
    }
    origin_clear_file(o);
    o->file_value = v;
    o->file_path = p;
    return 0;
}

int vase_config_note_file(struct vase_config *c, const struct vase_setting *s, const char *path) {
    struct vase_config_origin *o = origin_of(c, s);
    char value[PATH_MAX + 1];
    if (!o)
        return 0;
    vase_config_format(c, s, value, sizeof(value));
    int r = origin_set_file(o, value, path);
    if (r < 0)
        return r;
    o->from = VASE_CONFIG_FROM_FILE;
    return 0;
}

void vase_config_set_origin(struct vase_config *c, const struct vase_setting *s,
                            enum vase_config_from from, uint32_t uid) {
    struct vase_config_origin *o = origin_of(c, s);
    if (!o)
        return;
    o->from = from;
    o->uid = from == VASE_CONFIG_FROM_RUNTIME ? uid : 0;
}

int vase_config_source(const struct vase_config *c, const struct vase_setting *s, char *buf,
                       size_t len) {
    if (!c || !s || !buf || len == 0)
        return -EINVAL;
    const struct vase_config_origin *o = origin_of(c, s);
    switch (o ? o->from : VASE_CONFIG_FROM_DEFAULT) {
    case VASE_CONFIG_FROM_FILE:
        snprintf(buf, len, "file %s", o->file_path ? o->file_path : "?");
        break;
    case VASE_CONFIG_FROM_CMDLINE:
        snprintf(buf, len, "command line");
        break;
    case VASE_CONFIG_FROM_RUNTIME:
        snprintf(buf, len, "runtime (uid %" PRIu32 ")", o->uid);
        break;
    case VASE_CONFIG_FROM_DEFAULT:
    default:
        snprintf(buf, len, "default");
        break;
    }
    return 0;
}

static bool same_or_both_null(const char *a, const char *b) {
    return a == b || (a && b && strcmp(a, b) == 0);
}

int vase_config_reload_setting(struct vase_config *running, const struct vase_config *loaded,
                               const struct vase_setting *s) {
    struct vase_config_origin *o = origin_of(running, s), *n = origin_of(loaded, s);
    char old[PATH_MAX + 1], now[PATH_MAX + 1];
    int r;

    if (!o || !n || !s->runtime)
        return -EINVAL;
    vase_config_format(running, s, old, sizeof(old));
    vase_config_format(loaded, s, now, sizeof(now));

    /* The files say what they said: whatever set the running value (a ConfigSet, a flag, the
     * files themselves) still stands. Only where they say it may have moved (a drop-in now
     * gives the same value as the main file did). */
    if (same_or_both_null(o->file_value, n->file_value)) {
        if (o->from == VASE_CONFIG_FROM_RUNTIME && strcmp(old, now) != 0)
            log_info("Reload: %s keeps %s, set at run time by uid %" PRIu32
                     " (the configuration files did not change it).",
                     s->name, old, o->uid);
        r = origin_set_file(o, n->file_value, n->file_path);
        if (r < 0)
            return r;
        return 0;
    }

    /* The files changed the key: their value wins, unless a flag gives it (flags win over files,
     * at start as on every reload). */
    bool changed = strcmp(old, now) != 0;
    if (changed && (r = vase_config_set(running, s->name, now, 0)) < 0)
        return r;
    r = origin_set_file(o, n->file_value, n->file_path);
    if (r < 0)
        return r;
    o->from = n->from;
    o->uid = n->uid;
    if (changed) {
        if (n->from == VASE_CONFIG_FROM_FILE)
            log_info("Reload: %s = %s (was %s) from %s.", s->name, now, old, n->file_path);
        else if (n->from == VASE_CONFIG_FROM_CMDLINE)
            log_info("Reload: %s = %s (was %s) from the command line, which wins over the "
                     "configuration files.",
                     s->name, now, old);
        else
            log_info("Reload: %s = %s (was %s), the default: no configuration file gives it any "
                     "more.",
                     s->name, now, old);
    }
    return changed ? 1 : 0;
}
