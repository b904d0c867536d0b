/* SPDX-License-Identifier: MIT */

/*
 * The settings table and everything it drives. Invariants: every value in a struct
 * vase_config has passed its setting's parser and bounds (defaults included: they are strings
 * parsed by the same code); a failed set leaves the struct unchanged; string settings are
 * always allocated (never NULL after vase_config_init()). Numbers never go through atoi:
 * vase_parse_*() reject junk with -EINVAL and overflow with -ERANGE. The [arena NAME] sections
 * are not rows of the table: each of their keys borrows the parser and bounds of a [vased] row,
 * and a section is added to the struct whole, every field filled, or not at all. The INI syntax
 * is libinih's; this file adds line numbers, section bookkeeping and the refusals (see "INI
 * files" below).
 */

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ini.h>

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

static void arena_config_done(struct vase_arena_config *a) {
    free(a->name);
    free(a->arena);
    free(a->cuda_share);
    free(a->users);
    free(a->groups);
    *a = (struct vase_arena_config){0};
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
    for (size_t i = 0; i < c->n_extra_arenas; i++)
        arena_config_done(&c->extra_arenas[i]);
    free(c->extra_arenas);
    c->extra_arenas = NULL;
    c->n_extra_arenas = 0;
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

/* ---- relations between settings ---- */

/* What is wrong with one arena's geometry and sharing mode, or NULL. */
static const char *arena_problem(uint64_t arena_bytes, uint64_t page_bytes,
                                 const char *cuda_share) {
    if (page_bytes == 0 || page_bytes % 4096 != 0)
        return "page_bytes must be a multiple of 4096";
    if (arena_bytes % page_bytes != 0)
        return "page_bytes must divide arena_bytes";
    if (arena_bytes / page_bytes > INT32_MAX)
        return "arena_bytes / page_bytes must be below 2^31 pages";
    if (arena_bytes / page_bytes < 2)
        return "the arena must hold at least 2 pages";
    if (cuda_share && strcmp(cuda_share, "ipc") != 0 && strcmp(cuda_share, "vmm") != 0)
        return "cuda_share must be \"ipc\" or \"vmm\"";
    return NULL;
}

static bool arena_name_valid(const char *name) {
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
    const char *msg = arena_problem(c->arena_bytes, c->page_bytes, c->cuda_share);

    if (!msg && c->n_extra_arenas > VASE_CONFIG_MAX_EXTRA_ARENAS)
        msg = "too many [arena NAME] sections";
    for (size_t i = 0; !msg && i < c->n_extra_arenas; i++) {
        const struct vase_arena_config *a = &c->extra_arenas[i];
        const char *what = NULL;
        if (!a->name || !arena_name_valid(a->name)) {
            msg = "an arena name must be 1 to 32 letters, digits, '_' or '-', and not \"default\"";
            break;
        }
        for (size_t j = 0; j < i && !what; j++)
            if (strcmp(c->extra_arenas[j].name, a->name) == 0)
                what = "defined twice";
        if (!what && (!a->arena || !a->cuda_share || !a->users || !a->groups))
            what = "a value is missing";
        if (!what && (!in_bounds("arena_bytes", a->arena_bytes) ||
                      !in_bounds("page_bytes", a->page_bytes)))
            what = "arena_bytes or page_bytes out of bounds";
        if (!what)
            what = arena_problem(a->arena_bytes, a->page_bytes, a->cuda_share);
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
            x->page_bytes != y->page_bytes || !str_equal(x->users, y->users) ||
            !str_equal(x->groups, y->groups))
            return false;
    }
    return true;
}

/* ---- INI files ---- */

/*
 * The format is libinih's: lines starting with '#' or ';' are comments; "[vased]" opens the
 * daemon's section and "[arena NAME]" one more arena; "key = value" (libinih also takes
 * "key: value") sets a key of the section above it. Blanks around keys, values and names are
 * dropped, a CR before the newline too, and a ';' after a blank starts a comment. Multi-line
 * values are off: an indented line is a line like any other, not the continuation of the
 * value above it.
 *
 * An operator's slips are refused with the line they are on rather than half applied: a key
 * before any section, a key or section given twice (both lines named), a line that is none of
 * the above, text after a section's ']'. libinih stops at the first bad line. Its handler is
 * told neither line numbers nor section lines (Debian's build does not call it for a new
 * section), so the reader that hands it the text line by line counts the lines, and after each
 * one hands it two lines of its own: "=", a key whose handler call (recognised by the reader's
 * flag) reports the section libinih holds after that line, and "[\n]", a section no line of a
 * text can name, so that the next report tells whether the line in between opened a section.
 * That is how an empty section, or one given twice, is seen. libinih looks for a UTF-8 byte
 * order mark on its first line only, which is the reader's "[\n]": the reader drops the mark.
 *
 * libinih's switches are process-wide globals. They are set once, in ini_setup(); nothing else
 * in vased parses INI text, and code that does must want the same settings.
 */

#define N_SETTINGS (sizeof(vase_settings) / sizeof(vase_settings[0]))
#define AOFF(f) offsetof(struct vase_arena_config, f)
#define CONFIG_FILE_MAX (1u << 20)
/* The longest line, '\n' excluded: room for a string value of PATH_MAX bytes, its key and
 * blanks. */
#define CONFIG_LINE_MAX (4 * PATH_MAX)
/* The section the reader sets between two lines of the text. */
#define NO_SECTION "\n"

/* The keys of an [arena NAME] section, each parsed and bounded by a row of the table. What a
 * section leaves out is the [vased] value for the arena's shape, and empty for who may use it:
 * the default arena's tenants are not another arena's. */
static const struct arena_key {
    const char *key;
    const char *setting;
    size_t offset;
    bool inherit; /* left out: the setting's value in [vased]; else "" */
} arena_keys[] = {
    {"arena", "arena", AOFF(arena), true},
    {"cuda_share", "cuda_share", AOFF(cuda_share), true},
    {"arena_bytes", "arena_bytes", AOFF(arena_bytes), true},
    {"page_bytes", "page_bytes", AOFF(page_bytes), true},
    {"users", "arena_users", AOFF(users), false},
    {"groups", "arena_groups", AOFF(groups), false},
};
#define N_ARENA_KEYS (sizeof(arena_keys) / sizeof(arena_keys[0]))

struct arena_section {
    struct vase_arena_config a;
    unsigned line;                   /* of its [arena NAME] line */
    unsigned key_line[N_ARENA_KEYS]; /* where each key was given; 0: not given */
};

enum section { SECTION_NONE, SECTION_VASED, SECTION_ARENA };

/* What libinih is handed next: the reader's "[\n]", a line of the text, the reader's "=". */
enum feed { FEED_RESET, FEED_LINE, FEED_REPORT };

/* One parse: the reader's position in the text and the handler's view of it. */
struct ini_parse {
    struct vase_config *c;
    const char *source;

    const char *next; /* the rest of the text; NULL: all of it handed out */
    const char *line; /* the line libinih parses (not NUL-terminated), its length */
    size_t line_len;
    unsigned line_no; /* of line; 0 before the first */
    enum feed feed;
    bool reporting; /* the handler's next call is for the reader's "=" */
    bool too_long;  /* the reader stopped at a line longer than libinih's buffer */

    int r; /* the handler's failure (logged), or 0 */
    enum section section;
    unsigned vased_line;           /* of the [vased] line; 0: none yet */
    unsigned key_line[N_SETTINGS]; /* where each [vased] key was given; 0: not given */
    struct arena_section arenas[VASE_CONFIG_MAX_EXTRA_ARENAS];
    size_t n_arenas;
};

/* Logs "source:line: message" and returns r. */
static int bad_line(const struct ini_parse *p, int r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bad_line(const struct ini_parse *p, int r, const char *fmt, ...) {
    char what[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    return log_error_errno(r, "%s:%u: %s", p->source, p->line_no, what);
}

static void ini_setup_once(void) {
    static char comment_prefixes[] = ";#", inline_comment_prefixes[] = ";";
    ini_allow_multiline = false; /* the reader's "[\n]" before each line also ends one */
    ini_allow_bom = false;       /* the reader drops it */
    ini_start_comment_prefixes = comment_prefixes;
    ini_allow_inline_comments = true;
    ini_inline_comment_prefixes = inline_comment_prefixes;
    /* One buffer of CONFIG_LINE_MAX + 1 bytes on the heap, never grown: the reader refuses
     * longer lines rather than have libinih read their rest as lines of their own. */
    ini_use_stack = false;
    ini_allow_realloc = false;
    ini_initial_alloc = CONFIG_LINE_MAX + 1;
    ini_max_line = CONFIG_LINE_MAX + 1;
    ini_stop_on_first_error = true;
    ini_allow_no_value = false;
}

static void ini_setup(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, ini_setup_once);
}

/* libinih's ini_reader: the next line into buf (size bytes, room for the NUL included), NULL
 * at the end. See the comment at the top of this part for the lines between the text's. */
static char *read_line(char *buf, int size, void *stream) {
    struct ini_parse *p = stream;
    const char *text;
    size_t len;

    switch (p->feed) {
    case FEED_RESET:
        if (!p->next)
            return NULL;
        text = "[" NO_SECTION "]";
        len = strlen(text);
        p->feed = FEED_LINE;
        break;
    case FEED_LINE: {
        const char *nl = strchr(p->next, '\n');
        text = p->line = p->next;
        len = p->line_len = nl ? (size_t)(nl - p->next) : strlen(p->next);
        p->line_no++;
        p->next = nl && nl[1] ? nl + 1 : NULL;
        p->feed = FEED_REPORT;
        break;
    }
    case FEED_REPORT:
    default:
        text = "=";
        len = 1;
        p->reporting = true;
        p->feed = FEED_RESET;
        break;
    }
    if (len >= (size_t)size) {
        p->too_long = true;
        return NULL;
    }
    memcpy(buf, text, len);
    buf[len] = '\0';
    return buf;
}

static char *trim(char *s) {
    while (isspace((unsigned char)*s))
        s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        e--;
    *e = '\0';
    return s;
}

/* libinih ends a section's name at the first ']' of its line and ignores the rest; only blanks
 * and a comment may follow it here, as after a value. */
static bool text_after_section(const char *line, size_t len) {
    const char *end = line + len, *after = memchr(line, ']', len);
    assert(after);
    const char *q = ++after;
    while (q < end && isspace((unsigned char)*q))
        q++;
    return q < end && !(*q == ';' && q > after);
}

static int open_arena(struct ini_parse *p, const char *name) {
    if (!arena_name_valid(name))
        return bad_line(p, -EINVAL,
                        "bad arena name \"%s\" in [arena NAME]: 1 to %d letters, digits, '_' or "
                        "'-', and not \"default\" (the [vased] section's arena)",
                        name, VASE_ARENA_NAME_MAX);
    for (size_t i = 0; i < p->n_arenas; i++)
        if (strcmp(p->arenas[i].a.name, name) == 0)
            return bad_line(p, -EEXIST, "arena \"%s\" defined twice (lines %u and %u)", name,
                            p->arenas[i].line, p->line_no);
    for (size_t i = 0; i < p->c->n_extra_arenas; i++)
        if (strcmp(p->c->extra_arenas[i].name, name) == 0)
            return bad_line(p, -EEXIST, "arena \"%s\" is defined already", name);
    if (p->c->n_extra_arenas + p->n_arenas >= VASE_CONFIG_MAX_EXTRA_ARENAS)
        return bad_line(p, -E2BIG,
                        "more than %d [arena NAME] sections (vased serves at most %d arenas, "
                        "the default one included)",
                        VASE_CONFIG_MAX_EXTRA_ARENAS, VASED_MAX_ARENAS);

    struct arena_section *s = &p->arenas[p->n_arenas];
    *s = (struct arena_section){.line = p->line_no, .a.name = strdup(name)};
    if (!s->a.name)
        return log_oom();
    p->n_arenas++;
    p->section = SECTION_ARENA;
    return 0;
}

/* The line just parsed opened section, as libinih read it (blanks kept). */
static int open_section(struct ini_parse *p, const char *section) {
    char copy[64]; /* libinih keeps at most 49 bytes of a section's name */
    if (text_after_section(p->line, p->line_len))
        return bad_line(p, -EINVAL, "text after the section's ']'");

    snprintf(copy, sizeof(copy), "%s", section);
    char *name = trim(copy);
    if (strcmp(name, "vased") == 0) {
        if (p->vased_line)
            return bad_line(p, -EEXIST, "section [vased] given twice (lines %u and %u)",
                            p->vased_line, p->line_no);
        p->vased_line = p->line_no;
        p->section = SECTION_VASED;
        return 0;
    }
    if (strncmp(name, "arena", 5) == 0 && (name[5] == '\0' || isspace((unsigned char)name[5])))
        return open_arena(p, trim(name + 5));
    return bad_line(p, -EINVAL, "unknown section [%s] (expected [vased] or [arena NAME])", name);
}

static int set_vased(struct ini_parse *p, const char *key, const char *value) {
    const struct vase_setting *s = vase_setting_find(key);
    if (!s)
        return bad_line(p, -EINVAL, "unknown setting \"%s\" in [vased]", key);
    size_t i = (size_t)(s - vase_settings);
    if (p->key_line[i])
        return bad_line(p, -EEXIST, "%s given twice in [vased] (lines %u and %u)", s->name,
                        p->key_line[i], p->line_no);
    int r = vase_config_set(p->c, s->name, value, 0);
    if (r < 0)
        return bad_line(p, r, "bad value \"%s\" for %s: %s", value, s->name, strerror(-r));
    p->key_line[i] = p->line_no;
    return 0;
}

/* Stores value into an arena field of s's type: a copy of the string, or the number. */
static int arena_store(struct vase_arena_config *a, const struct arena_key *k,
                       const struct vase_setting *s, const char *value, int64_t num) {
    void *f = (char *)a + k->offset;
    if (s->type == VASE_SETTING_STRING) {
        char *copy = strdup(value);
        if (!copy)
            return -ENOMEM;
        free(*(char **)f);
        *(char **)f = copy;
    } else {
        assert(s->type == VASE_SETTING_SIZE);
        *(uint64_t *)f = (uint64_t)num;
    }
    return 0;
}

static int set_arena(struct ini_parse *p, const char *key, const char *value) {
    struct arena_section *sec = &p->arenas[p->n_arenas - 1];
    size_t i = 0;
    while (i < N_ARENA_KEYS && !key_equal(arena_keys[i].key, key))
        i++;
    if (i == N_ARENA_KEYS)
        return bad_line(p, -EINVAL,
                        "unknown key \"%s\" in [arena %s] (expected arena, cuda_share, "
                        "arena_bytes, page_bytes, users or groups)",
                        key, sec->a.name);
    if (sec->key_line[i])
        return bad_line(p, -EEXIST, "%s given twice in [arena %s] (lines %u and %u)",
                        arena_keys[i].key, sec->a.name, sec->key_line[i], p->line_no);

    const struct vase_setting *s = vase_setting_find(arena_keys[i].setting);
    int64_t num = 0;
    int r = parse_value(s, value, &num);
    if (r < 0)
        return bad_line(p, r, "bad value \"%s\" for %s in [arena %s]: %s", value,
                        arena_keys[i].key, sec->a.name, strerror(-r));
    r = arena_store(&sec->a, &arena_keys[i], s, value, num);
    if (r < 0)
        return log_oom();
    sec->key_line[i] = p->line_no;
    return 0;
}

static int set_key(struct ini_parse *p, const char *key, const char *value) {
    if (!*key)
        return bad_line(p, -EINVAL, "no key before '='");
    switch (p->section) {
    case SECTION_VASED:
        return set_vased(p, key, value);
    case SECTION_ARENA:
        return set_arena(p, key, value);
    case SECTION_NONE:
        break;
    }
    return bad_line(p, -EINVAL, "\"%s\" comes before any section (settings go under [vased])",
                    key);
}

/* libinih's ini_handler: a key of the text, or the reader's report after a line. Nonzero to go
 * on; on failure the error (logged) is kept in p->r. */
static int handle_ini(void *user, const char *section, const char *name, const char *value) {
    struct ini_parse *p = user;
    int r = 0;

    if (p->reporting) {
        p->reporting = false;
        if (strcmp(section, NO_SECTION) != 0)
            r = open_section(p, section);
    } else
        r = set_key(p, name, value);
    if (r < 0)
        p->r = r;
    return r >= 0;
}

/* Fills in what each arena section left out, checks the result and hands the sections to the
 * config. */
static int finish_arenas(struct ini_parse *p) {
    struct vase_config *c = p->c;
    for (size_t i = 0; i < p->n_arenas; i++) {
        struct arena_section *sec = &p->arenas[i];
        for (size_t k = 0; k < N_ARENA_KEYS; k++) {
            if (sec->key_line[k])
                continue;
            const struct vase_setting *s = vase_setting_find(arena_keys[k].setting);
            const void *from = field(c, s);
            int r;
            if (!arena_keys[k].inherit)
                r = arena_store(&sec->a, &arena_keys[k], s, "", 0);
            else if (s->type == VASE_SETTING_STRING) {
                const char *v = *(char *const *)from;
                r = arena_store(&sec->a, &arena_keys[k], s, v ? v : "", 0);
            } else
                r = arena_store(&sec->a, &arena_keys[k], s, "", (int64_t)*(const uint64_t *)from);
            if (r < 0)
                return log_oom();
        }
        const char *what = arena_problem(sec->a.arena_bytes, sec->a.page_bytes,
                                         sec->a.cuda_share);
        if (what) {
            p->line_no = sec->line;
            return bad_line(p, -EINVAL, "[arena %s]: %s", sec->a.name, what);
        }
    }
    if (p->n_arenas == 0)
        return 0;

    struct vase_arena_config *all =
        realloc(c->extra_arenas, (c->n_extra_arenas + p->n_arenas) * sizeof(*all));
    if (!all)
        return log_oom();
    c->extra_arenas = all;
    for (size_t i = 0; i < p->n_arenas; i++) {
        all[c->n_extra_arenas++] = p->arenas[i].a;
        p->arenas[i].a = (struct vase_arena_config){0};
    }
    p->n_arenas = 0;
    return 0;
}

/* Parses NUL-terminated INI text through libinih; source names it in messages. */
static int parse_text(struct vase_config *c, const char *source, const char *text) {
    struct ini_parse p = {.c = c, .source = source, .next = text};
    int r;

    ini_setup();
    if (strncmp(p.next, "\xEF\xBB\xBF", 3) == 0)
        p.next += 3; /* a UTF-8 byte order mark */
    if (!*p.next)
        p.next = NULL;
    int e = ini_parse_stream(read_line, &p, handle_ini, &p);
    if (p.r < 0)
        r = p.r;
    else if (e < 0) /* -2: libinih could not allocate its line buffer */
        r = log_oom();
    else if (p.too_long)
        r = bad_line(&p, -EINVAL, "a line longer than %d bytes", CONFIG_LINE_MAX);
    else if (e > 0)
        r = bad_line(&p, -EINVAL, "expected \"key = value\", \"[section]\" or a comment");
    else
        r = finish_arenas(&p);
    for (size_t i = 0; i < p.n_arenas; i++)
        arena_config_done(&p.arenas[i].a);
    return r < 0 ? r : 0;
}

/* Reads a whole configuration file (at most CONFIG_FILE_MAX bytes) into a NUL-terminated
 * buffer. -errno of open() or read(), -EISDIR, -EFBIG, -ENOMEM; nothing is logged. */
static int read_file(const char *path, char **ret, size_t *ret_len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return -errno;

    struct stat st;
    char *buf = NULL;
    size_t len = 0;
    int r;
    if (fstat(fd, &st) < 0) {
        r = -errno;
        goto close_fd;
    }
    if (S_ISDIR(st.st_mode)) {
        r = -EISDIR;
        goto close_fd;
    }
    /* A FIFO or a device (/dev/null) has no size to trust: read until the end. */
    buf = malloc(CONFIG_FILE_MAX + 1);
    if (!buf) {
        r = -ENOMEM;
        goto close_fd;
    }
    for (;;) {
        ssize_t n = read(fd, buf + len, CONFIG_FILE_MAX + 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            r = -errno;
            goto free_buf;
        }
        if (n == 0)
            break;
        len += (size_t)n;
        if (len > CONFIG_FILE_MAX) {
            r = -EFBIG;
            goto free_buf;
        }
    }
    buf[len] = '\0';
    close(fd);
    *ret = buf;
    *ret_len = len;
    return 0;

free_buf:
    free(buf);
close_fd:
    close(fd);
    return r;
}

/* Reads and parses the file at path. *ret_read tells whether a failure was in reading it
 * (returned unlogged) rather than in what it says (logged with the line). */
static int parse_path(struct vase_config *c, const char *path, bool *ret_read) {
    char *text = NULL;
    size_t len = 0;
    int r = read_file(path, &text, &len);
    *ret_read = r < 0;
    if (r < 0)
        return r;
    /* The reader walks C strings; a NUL byte would hide the rest of the file. */
    if (memchr(text, '\0', len))
        r = log_error_errno(-EINVAL, "%s: a NUL byte; not a configuration file", path);
    else
        r = parse_text(c, path, text);
    free(text);
    return r;
}

int vase_config_parse_file(struct vase_config *c, const char *path) {
    bool failed_read;
    if (!c || !path)
        return -EINVAL;
    return parse_path(c, path, &failed_read);
}

int vase_config_parse_string(struct vase_config *c, const char *text) {
    if (!c || !text)
        return -EINVAL;
    return parse_text(c, "(string)", text);
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

/* The comment before the [arena NAME] sections of a dump, and the sections themselves. */
static void dump_arenas(const struct vase_config *c, FILE *f) {
    char text[1024];
    snprintf(text, sizeof(text),
             "Besides the default arena of [vased] (arena 0), up to %d more, one section each, "
             "numbered 1, 2, ... in the order given. NAME: 1 to %d letters, digits, '_' or '-', "
             "not \"default\". Keys: arena, cuda_share, arena_bytes and page_bytes as in [vased] "
             "(a key left out takes the [vased] section's value; command-line flags change only "
             "the default arena); users and groups, who may use the arena (as allow_users and "
             "allow_groups). With users and groups both empty, everyone the daemon admits may "
             "use it: name them. Host arenas together must fit in this machine's memory. Arena "
             "sections are read at start; a change needs a restart (SIGHUP only warns). For "
             "example:",
             VASE_CONFIG_MAX_EXTRA_ARENAS, VASE_ARENA_NAME_MAX);
    fprintf(f, "\n# ---- Further arenas: [arena NAME] sections ----\n");
    comment_wrapped(f, text);
    fprintf(f, "#\n#   [arena bob]\n#   arena = cuda:1\n#   arena_bytes = 8G\n#   users = bob\n");
    for (size_t i = 0; i < c->n_extra_arenas; i++) {
        const struct vase_arena_config *a = &c->extra_arenas[i];
        char arena_bytes[32], page_bytes[32];
        vase_format_size(a->arena_bytes, arena_bytes, sizeof(arena_bytes));
        vase_format_size(a->page_bytes, page_bytes, sizeof(page_bytes));
        fprintf(f, "\n[arena %s]\n", a->name);
        const char *values[] = {a->arena,   a->cuda_share, arena_bytes,
                                page_bytes, a->users,      a->groups};
        static_assert(sizeof(values) / sizeof(values[0]) == N_ARENA_KEYS, "one value per key");
        for (size_t k = 0; k < N_ARENA_KEYS; k++) {
            const char *v = values[k] ? values[k] : "";
            fprintf(f, "%s =%s%s\n", arena_keys[k].key, v[0] ? " " : "", v);
        }
    }
}

int vase_config_dump(const struct vase_config *c, FILE *f) {
    if (!c || !f)
        return -EINVAL;
    fprintf(f, "# vased configuration (INI). Generated by `vased --dump-config`: every setting\n"
               "# with its value, its bounds and default in the comment above it. Each may also\n"
               "# be given as --name=value on the command line; settings marked \"runtime\" are\n"
               "# re-read on SIGHUP and may be changed with `vasectl config`. Every key belongs\n"
               "# to a section, and each is given once.\n\n[vased]\n");
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
    dump_arenas(c, f);
    return fflush(f) == 0 && !ferror(f) ? 0 : -EIO;
}

void vase_config_help(FILE *f, const char *program) {
    fprintf(f,
            "%s [OPTIONS...]\n\n"
            "The vase daemon: owns the KV-cache arenas of this host and plans evictions.\n\n"
            "  -h --help            Show this help\n"
            "     --version         Show the version\n"
            "     --config=PATH     Read settings from PATH (default " VASE_CONFIG_DEFAULT_PATH
            ", if it exists)\n"
            "     --dump-config     Print the configuration in effect (defaults, file, flags) as\n"
            "                       a complete documented configuration file, and exit\n\n"
            "Settings (also in the configuration file, section [vased]; '-' or '_' in names).\n"
            "Further arenas are [arena NAME] sections of the file; --dump-config describes them.\n",
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

    /* The default file is optional; one named on the command line is not. */
    bool named = cmd && cmd->config_path;
    const char *path = named ? cmd->config_path : VASE_CONFIG_DEFAULT_PATH;
    bool failed_read;
    r = parse_path(c, path, &failed_read);
    if (r == -ENOENT && failed_read && !named)
        r = 0;
    else if (r < 0 && failed_read)
        return log_error_errno(r, "Failed to read the configuration file %s: %m", path);
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
