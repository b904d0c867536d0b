/* SPDX-License-Identifier: MIT */

/*
 * The settings table and everything it drives. Invariants: every value in a struct
 * vase_config has passed its setting's parser and bounds (defaults included: they are strings
 * parsed by the same code); a failed set leaves the struct unchanged; string settings are
 * always allocated (never NULL after vase_config_init()). Numbers never go through atoi:
 * vase_parse_*() reject junk with -EINVAL and overflow with -ERANGE.
 */

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <ini.h>
#include <inttypes.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "log.h"

#define OFF(field) offsetof(struct vase_config, field)

const struct vase_setting vase_settings[] = {
    {"runtime_dir", VASE_SETTING_STRING, OFF(runtime_dir), 0, 0, "", false,
     "Directory of session.sock, control.sock and events.sock, created with mode 0755 if "
     "missing; refused if anyone but the daemon's user and root can write it (or if it is a "
     "symlink or owned by another user). Empty: $VASE_RUNTIME_DIR, else $RUNTIME_DIRECTORY (set "
     "by systemd), else ./run."},
    {"arena", VASE_SETTING_STRING, OFF(arena), 0, 0, "host", false,
     "Where the KV arena lives: \"host\" (a memfd shared with SCM_RIGHTS), or a GPU as "
     "\"cuda:N\" (device N as this process numbers them) or \"cuda:GPU-<uuid>\" (as nvidia-smi "
     "-L prints it; stable across containers). CUDA arenas need a vased built with CUDA and a "
     "device in compute mode Default."},
    {"cuda_share", VASE_SETTING_STRING, OFF(cuda_share), 0, 0, "ipc", false,
     "How a CUDA arena is shared with engines: \"ipc\" (cudaMalloc, legacy CUDA IPC handle) or "
     "\"vmm\" (cuMemCreate, POSIX file descriptor passed over the session socket)."},
    {"arena_bytes", VASE_SETTING_SIZE, OFF(arena_bytes), 1 << 16, INT64_C(1) << 40, "256M", false,
     "Size of the arena in bytes (K, M, G, T suffixes); a multiple of page_bytes."},
    {"page_bytes", VASE_SETTING_SIZE, OFF(page_bytes), 4096, INT64_C(1) << 30, "2M", false,
     "Size of one page, the unit of allocation and of the shared budget; a multiple of 4096 "
     "that divides arena_bytes."},
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
    {"max_pages_per_client", VASE_SETTING_U32, OFF(max_pages_per_client), 0, INT32_MAX, "0", true,
     "Most pages one client may hold (EDQUOT beyond); 0: no quota."},
    {"max_models_per_client", VASE_SETTING_U32, OFF(max_models_per_client), 1, 1024, "16", true,
     "Most model geometries one client may register (EDQUOT beyond)."},
    {"max_stats_bytes_per_client", VASE_SETTING_SIZE, OFF(max_stats_bytes_per_client), 0,
     INT64_C(1) << 40, "128M", true,
     "Most daemon memory the attention statistics one client pushes (accumulated attention and "
     "window scores) may hold; beyond it AttnStats is refused with EDQUOT. 0 accepts no "
     "statistics at all (it is not \"no limit\")."},
    {"max_message_bytes", VASE_SETTING_SIZE, OFF(max_message_bytes), 1 << 16, 256 << 20, "16M",
     false,
     "Largest control message accepted; larger ones are refused with EMSGSIZE before they "
     "are parsed."},
    {"evictor_threads", VASE_SETTING_U32, OFF(evictor_threads), 0, 256, "0", false,
     "Threads computing eviction plans; 0: one per CPU."},
    {"stats_interval", VASE_SETTING_U32, OFF(stats_interval), 0, 86400, "10", true,
     "Seconds between STATUS= updates and pressure events; 0: only on changes."},
    {"shutdown_timeout", VASE_SETTING_U32, OFF(shutdown_timeout), 0, 600, "10", true,
     "Seconds a clean shutdown waits for plans being computed."},
    {"log_level", VASE_SETTING_LOG_LEVEL, OFF(log_level), 0, 7, "info", true,
     "Most verbose messages logged: emerg, alert, crit, err, warning, notice, info, debug."},
    {"default_slack", VASE_SETTING_I32, OFF(default_slack), -1, 1 << 20, "-1", true,
     "Slots a sequence may fill beyond budget + window while a plan is computed, when "
     "OpenSeq asks for the default; -1: one window."},
};

const size_t vase_settings_count = sizeof(vase_settings) / sizeof(vase_settings[0]);

static bool key_equal(const char *a, const char *b) {
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
        if (key_equal(vase_settings[i].name, key))
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
    }
    return "?";
}

/* ---- checked number parsers ---- */

/* A decimal number; with suffix, optionally followed by K, M, G or T (then nothing, B or iB)
 * for 2^10 .. 2^40. strtoull() would also accept leading blanks and a minus sign; this accepts
 * neither. */
static int parse_number(const char *s, bool suffix, uint64_t *ret) {
    if (!s || !ret)
        return -EINVAL;
    if (!isdigit((unsigned char)s[0]))
        return -EINVAL;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno == ERANGE)
        return -ERANGE;
    if (errno || (*end && !suffix))
        return -EINVAL;

    unsigned shift = 0;
    switch (*end) {
    case '\0':
        break;
    case 'k': case 'K': shift = 10; break;
    case 'm': case 'M': shift = 20; break;
    case 'g': case 'G': shift = 30; break;
    case 't': case 'T': shift = 40; break;
    default:
        return -EINVAL;
    }
    if (shift) {
        end++;
        if (strcmp(end, "") != 0 && strcmp(end, "B") != 0 && strcmp(end, "iB") != 0)
            return -EINVAL;
    }
    if (shift && v > (UINT64_MAX >> shift))
        return -ERANGE;
    *ret = (uint64_t)v << shift;
    return 0;
}

int vase_parse_u64(const char *s, uint64_t *ret) {
    return parse_number(s, false, ret);
}

int vase_parse_i64(const char *s, int64_t *ret) {
    if (!s || !ret)
        return -EINVAL;
    const char *p = s[0] == '-' || s[0] == '+' ? s + 1 : s;
    if (!isdigit((unsigned char)p[0]))
        return -EINVAL;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno == ERANGE)
        return -ERANGE;
    if (errno || *end)
        return -EINVAL;
    *ret = v;
    return 0;
}

int vase_parse_size(const char *s, uint64_t *ret) {
    return parse_number(s, true, ret);
}

void vase_format_size(uint64_t v, char *buf, size_t len) {
    static const char suffix[] = "KMGT";
    int i = -1;
    while (v && i < 3 && v % 1024 == 0) {
        v /= 1024;
        i++;
    }
    if (i < 0)
        snprintf(buf, len, "%" PRIu64, v);
    else
        snprintf(buf, len, "%" PRIu64 "%c", v, suffix[i]);
}

/* ---- values ---- */

static void *field(const struct vase_config *c, const struct vase_setting *s) {
    return (char *)c + s->offset;
}

/* Parses value for s into *ret_num (numbers) or nothing (strings); checks bounds. */
static int parse_value(const struct vase_setting *s, const char *value, int64_t *ret_num) {
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
    int r = parse_value(s, value, &num);
    if (r < 0)
        return r;

    void *p = field(c, s);
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
        *(int *)p = (int)num;
        break;
    }
    return 0;
}

int vase_config_format(const struct vase_config *c, const struct vase_setting *s, char *buf,
                       size_t len) {
    if (!c || !s || !buf || len == 0)
        return -EINVAL;
    const void *p = field(c, s);
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
    if (s->type == VASE_SETTING_STRING && *(char *const *)field(c, s))
        len = strlen(*(char *const *)field(c, s)) + 1;
    char *buf = malloc(len);
    if (!buf)
        return -ENOMEM;
    vase_config_format(c, s, buf, len);
    *ret = buf;
    return 0;
}

void vase_config_done(struct vase_config *c) {
    if (!c)
        return;
    for (size_t i = 0; i < vase_settings_count; i++)
        if (vase_settings[i].type == VASE_SETTING_STRING) {
            char **p = field(c, &vase_settings[i]);
            free(*p);
            *p = NULL;
        }
}

int vase_config_init(struct vase_config *c) {
    if (!c)
        return -EINVAL;
    *c = (struct vase_config){0};
    for (size_t i = 0; i < vase_settings_count; i++) {
        int r = vase_config_set(c, vase_settings[i].name, vase_settings[i].def, 0);
        if (r < 0) {
            vase_config_done(c);
            return r;
        }
    }
    return 0;
}

int vase_config_check(const struct vase_config *c, const char **ret_msg) {
    const char *msg = NULL;

    if (c->page_bytes % 4096 != 0)
        msg = "page_bytes must be a multiple of 4096";
    else if (c->arena_bytes % c->page_bytes != 0)
        msg = "page_bytes must divide arena_bytes";
    else if (c->arena_bytes / c->page_bytes > INT32_MAX)
        msg = "arena_bytes / page_bytes must be below 2^31 pages";
    else if (c->arena_bytes / c->page_bytes < 2)
        msg = "the arena must hold at least 2 pages";
    else if (c->cuda_share && strcmp(c->cuda_share, "ipc") != 0 &&
             strcmp(c->cuda_share, "vmm") != 0)
        msg = "cuda_share must be \"ipc\" or \"vmm\"";
    if (ret_msg)
        *ret_msg = msg;
    return msg ? -EINVAL : 0;
}

/* ---- INI files ---- */

struct ini_ctx {
    struct vase_config *c;
    const char *source;
    int error;       /* the first bad line's -errno */
    char what[512];  /* and what was wrong with it */
};

static int on_ini_line(void *user, const char *section, const char *name, const char *value) {
    struct ini_ctx *ctx = user;
    int r;

    if (section[0] && strcmp(section, "vased") != 0) {
        snprintf(ctx->what, sizeof(ctx->what), "unknown section [%s] (settings go in [vased])",
                 section);
        r = -EINVAL;
    } else {
        r = vase_config_set(ctx->c, name, value, 0);
        if (r == -ENOENT) {
            snprintf(ctx->what, sizeof(ctx->what), "unknown setting \"%s\"", name);
            r = -EINVAL;
        } else if (r < 0) {
            snprintf(ctx->what, sizeof(ctx->what), "bad value \"%s\" for %s: %s", value, name,
                     strerror(-r));
        }
    }
    if (r < 0 && !ctx->error)
        ctx->error = r;
    /* Returning 0 makes inih report this line's number as its result. */
    return r < 0 ? 0 : 1;
}

static int ini_result(struct ini_ctx *ctx, int r) {
    if (r == -1)
        return -ENOENT;
    if (r == -2)
        return -ENOMEM;
    if (ctx->error) {
        log_error("%s:%d: %s", ctx->source, r, ctx->what);
        return ctx->error;
    }
    if (r > 0) {
        log_error("%s:%d: syntax error", ctx->source, r);
        return -EINVAL;
    }
    return 0;
}

int vase_config_parse_file(struct vase_config *c, const char *path) {
    struct ini_ctx ctx = {.c = c, .source = path};
    FILE *f = fopen(path, "re");
    if (!f)
        return -errno;
    int r = ini_parse_file(f, on_ini_line, &ctx);
    fclose(f);
    return ini_result(&ctx, r);
}

int vase_config_parse_string(struct vase_config *c, const char *text) {
    struct ini_ctx ctx = {.c = c, .source = "(string)"};
    return ini_result(&ctx, ini_parse_string(text, on_ini_line, &ctx));
}

/* Writes text as '#' comment lines of at most ~90 columns. */
static void comment_wrapped(FILE *f, const char *text) {
    const size_t width = 88;
    while (*text) {
        size_t n = strlen(text);
        if (n > width) {
            n = width;
            while (n > 0 && text[n] != ' ')
                n--;
            if (n == 0)
                n = width;
        }
        fprintf(f, "# %.*s\n", (int)n, text);
        text += n;
        while (*text == ' ')
            text++;
    }
}

static void bounds_text(const struct vase_setting *s, char *buf, size_t len) {
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

int vase_config_dump(const struct vase_config *c, FILE *f) {
    fprintf(f, "# vased configuration (INI). Generated by `vased --dump-config`: every setting\n"
               "# with its default. Each may also be given as --name=value on the command line;\n"
               "# settings marked \"runtime\" are re-read on SIGHUP and may be changed with\n"
               "# `vasectl config`.\n\n[vased]\n");
    for (size_t i = 0; i < vase_settings_count; i++) {
        const struct vase_setting *s = &vase_settings[i];
        char value[PATH_MAX + 1], bounds[96];
        vase_config_format(c, s, value, sizeof(value));
        bounds_text(s, bounds, sizeof(bounds));
        fprintf(f, "\n");
        comment_wrapped(f, s->description);
        fprintf(f, "# (%s; default \"%s\"%s)\n%s =%s%s\n", bounds, s->def,
                s->runtime ? "; runtime" : "", s->name, value[0] ? " " : "", value);
    }
    return fflush(f) == 0 && !ferror(f) ? 0 : -EIO;
}

void vase_config_help(FILE *f, const char *program) {
    fprintf(f,
            "%s [OPTIONS...]\n\n"
            "The vase daemon: owns the KV-cache arena of this host and plans evictions.\n\n"
            "  -h --help            Show this help\n"
            "     --version         Show the version\n"
            "     --config=PATH     Read settings from PATH (default " VASE_CONFIG_DEFAULT_PATH
            ", if it exists)\n"
            "     --dump-config     Print a complete documented configuration file with every\n"
            "                       default, and exit\n\n"
            "Settings (also in the configuration file, section [vased]; '-' or '_' in names):\n",
            program);
    for (size_t i = 0; i < vase_settings_count; i++) {
        const struct vase_setting *s = &vase_settings[i];
        char bounds[96];
        bounds_text(s, bounds, sizeof(bounds));
        fprintf(f, "  --%s=VALUE\n      %s\n      (%s; default \"%s\"%s)\n", s->name,
                s->description, bounds, s->def, s->runtime ? "; changeable at run time" : "");
    }
}

/* ---- command line ---- */

enum {
    ARG_VERSION = 0x100,
    ARG_CONFIG,
    ARG_DUMP_CONFIG,
    ARG_SETTING, /* + index into vase_settings */
};

void vase_cmdline_done(struct vase_cmdline *cmd) {
    if (!cmd)
        return;
    free(cmd->config_path);
    for (size_t i = 0; i < cmd->n_overrides; i++) {
        free(cmd->keys[i]);
        free(cmd->values[i]);
    }
    free(cmd->keys);
    free(cmd->values);
    *cmd = (struct vase_cmdline){0};
}

static int add_override(struct vase_cmdline *cmd, const char *key, const char *value) {
    char **k = realloc(cmd->keys, (cmd->n_overrides + 1) * sizeof(char *));
    if (!k)
        return -ENOMEM;
    cmd->keys = k;
    char **v = realloc(cmd->values, (cmd->n_overrides + 1) * sizeof(char *));
    if (!v)
        return -ENOMEM;
    cmd->values = v;
    char *kk = strdup(key), *vv = strdup(value);
    if (!kk || !vv) {
        free(kk);
        free(vv);
        return -ENOMEM;
    }
    cmd->keys[cmd->n_overrides] = kk;
    cmd->values[cmd->n_overrides] = vv;
    cmd->n_overrides++;
    return 0;
}

int vase_cmdline_parse(int argc, char **argv, struct vase_cmdline *ret) {
    /* Two spellings per setting (runtime_dir and runtime-dir), the fixed options and the end. */
    size_t n = 2 * vase_settings_count + 5;
    struct option *opts = calloc(n, sizeof(*opts));
    char *names = calloc(vase_settings_count, 64);
    struct vase_cmdline cmd = {0};
    int r = -ENOMEM;

    if (!opts || !names)
        goto finish;
    size_t o = 0;
    opts[o++] = (struct option){"help", no_argument, NULL, 'h'};
    opts[o++] = (struct option){"version", no_argument, NULL, ARG_VERSION};
    opts[o++] = (struct option){"config", required_argument, NULL, ARG_CONFIG};
    opts[o++] = (struct option){"dump-config", no_argument, NULL, ARG_DUMP_CONFIG};
    for (size_t i = 0; i < vase_settings_count; i++) {
        char *dashed = names + i * 64;
        snprintf(dashed, 64, "%s", vase_settings[i].name);
        for (char *p = dashed; *p; p++)
            if (*p == '_')
                *p = '-';
        opts[o++] = (struct option){vase_settings[i].name, required_argument, NULL,
                                    ARG_SETTING + (int)i};
        if (strcmp(dashed, vase_settings[i].name) != 0)
            opts[o++] = (struct option){dashed, required_argument, NULL, ARG_SETTING + (int)i};
    }

    /* getopt keeps its state in globals; 0 restarts it, so this may run more than once. */
    optind = 0;
    opterr = 0;
    int c;
    r = 0;
    while (r == 0 && (c = getopt_long(argc, argv, "h", opts, NULL)) >= 0) {
        switch (c) {
        case 'h':
            cmd.help = true;
            break;
        case ARG_VERSION:
            cmd.version = true;
            break;
        case ARG_DUMP_CONFIG:
            cmd.dump_config = true;
            break;
        case ARG_CONFIG:
            free(cmd.config_path);
            cmd.config_path = strdup(optarg);
            if (!cmd.config_path)
                r = -ENOMEM;
            break;
        case '?':
            if (optopt >= ARG_SETTING || optopt == ARG_CONFIG)
                r = log_error_errno(-EINVAL, "Option %s needs a value (--name=value).",
                                    argv[optind - 1]);
            else if (optopt)
                r = log_error_errno(-EINVAL, "Unknown option -%c.", optopt);
            else
                r = log_error_errno(-EINVAL, "Unknown option %s (see --help).",
                                    argv[optind - 1]);
            break;
        default:
            if (c >= ARG_SETTING && (size_t)(c - ARG_SETTING) < vase_settings_count)
                r = add_override(&cmd, vase_settings[c - ARG_SETTING].name, optarg);
            else
                r = -EINVAL;
            break;
        }
    }
    if (r == 0 && optind < argc)
        r = log_error_errno(-EINVAL, "Unexpected argument \"%s\" (settings are --name=value).",
                            argv[optind]);
    if (r == 0) {
        *ret = cmd;
        cmd = (struct vase_cmdline){0};
        r = ret->help || ret->dump_config || ret->version ? 1 : 0;
    }
finish:
    vase_cmdline_done(&cmd);
    free(opts);
    free(names);
    return r;
}

int vase_config_load(struct vase_config *c, const struct vase_cmdline *cmd) {
    int r = vase_config_init(c);
    if (r < 0)
        return log_oom();

    const char *path = cmd ? cmd->config_path : NULL;
    r = vase_config_parse_file(c, path ? path : VASE_CONFIG_DEFAULT_PATH);
    if (r == -ENOENT && !path)
        r = 0; /* The default file is optional; one named on the command line is not. */
    else if (r == -ENOENT || r == -EACCES)
        return log_error_errno(r, "Failed to read %s: %m", path ? path : VASE_CONFIG_DEFAULT_PATH);
    if (r < 0)
        return r;

    for (size_t i = 0; cmd && i < cmd->n_overrides; i++) {
        r = vase_config_set(c, cmd->keys[i], cmd->values[i], 0);
        if (r < 0)
            return log_error_errno(r, "Bad value \"%s\" for --%s: %m", cmd->values[i],
                                   cmd->keys[i]);
    }

    const char *msg;
    r = vase_config_check(c, &msg);
    if (r < 0)
        return log_error_errno(r, "Invalid configuration: %s.", msg);
    return 0;
}
