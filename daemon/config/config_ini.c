/* SPDX-License-Identifier: MIT */

/*
 * The configuration file: opening it only where vased can trust it (vase_config_open(): root's
 * or vased's user's, writable by no one else, a regular file; the checks are made on the open
 * descriptor, never on the path before it), reading it (size-limited, no NUL bytes), parsing
 * it through libinih into a struct vase_config with line numbers in every refusal, the [arena
 * NAME] sections, and --dump-config, which writes a file this parser reads back into the same
 * values. The lines come from config_lines.c, which reads the text through libinih and has the
 * format. Invariants: the parse stops at the first bad line; [vased] keys go through
 * vase_config_set() one by one, so those before the bad line stay applied; an [arena NAME]
 * section is added to the struct whole, every field filled, or not at all, and none is added
 * when the parse fails. Each arena key borrows the parser and bounds of a [vased] row of the
 * table (config.c).
 */

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "config.h"
#include "config_internal.h"
#include "core/log.h"

#define AOFF(f) offsetof(struct vase_arena_config, f)
#define CONFIG_FILE_MAX (1u << 20)

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
    {"granule_bytes", "granule_bytes", AOFF(granule_bytes), true},
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

/* One parse: the line being read and what the text gave so far. */
struct ini_parse {
    struct vase_config *c;
    const char *source;

    const char *line; /* the line being read (not NUL-terminated), its length and number */
    size_t line_len;
    unsigned line_no;

    int r; /* the failure of a line (logged), or 0 */
    enum section section;
    unsigned vased_line;                /* of the [vased] line; 0: none yet */
    unsigned key_line[VASE_SETTINGS_N]; /* where each [vased] key was given; 0: not given */
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
    if (!vase_arena_name_valid(name))
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
    while (i < N_ARENA_KEYS && !vase_setting_key_equal(arena_keys[i].key, key))
        i++;
    if (i == N_ARENA_KEYS)
        return bad_line(p, -EINVAL,
                        "unknown key \"%s\" in [arena %s] (expected arena, cuda_share, "
                        "arena_bytes, granule_bytes, users or groups)",
                        key, sec->a.name);
    if (sec->key_line[i])
        return bad_line(p, -EEXIST, "%s given twice in [arena %s] (lines %u and %u)",
                        arena_keys[i].key, sec->a.name, sec->key_line[i], p->line_no);

    const struct vase_setting *s = vase_setting_find(arena_keys[i].setting);
    int64_t num = 0;
    int r = vase_setting_parse(s, value, &num);
    if (r < 0)
        return bad_line(p, r, "bad value \"%s\" for %s in [arena %s]: %s", value, arena_keys[i].key,
                        sec->a.name, strerror(-r));
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
    return bad_line(p, -EINVAL, "\"%s\" comes before any section (settings go under [vased])", key);
}

/* One line of the text (vase_config_ini_walk()): a key, or the end of a line, which may have
 * opened a section. On failure the error (logged) is kept in p->r. */
static int take_line(void *user, const struct vase_ini_line *l) {
    struct ini_parse *p = user;
    int r = 0;

    p->line = l->text;
    p->line_len = l->len;
    p->line_no = l->no;
    if (l->key)
        r = set_key(p, l->key, l->value);
    else if (l->section)
        r = open_section(p, l->section);
    if (r < 0)
        p->r = r;
    return r;
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
            const void *from = vase_config_field(c, s);
            int r;
            if (!arena_keys[k].inherit)
                r = arena_store(&sec->a, &arena_keys[k], s, "", 0);
            else if (s->type == VASE_SETTING_STRING) {
                const char *v = *(char *const *)from;
                r = arena_store(&sec->a, &arena_keys[k], s, v ? v : "", 0);
            } else
                r = arena_store(&sec->a, &arena_keys[k], s, "", (int64_t) * (const uint64_t *)from);
            if (r < 0)
                return log_oom();
        }
        const char *what =
            vase_arena_problem(sec->a.arena_bytes, sec->a.granule_bytes, sec->a.cuda_share);
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

/* Parses NUL-terminated INI text through libinih; source names it in messages. ret_given as
 * vase_config_parse_path()'s. */
static int parse_text(struct vase_config *c, const char *source, const char *text,
                      bool *ret_given) {
    struct ini_parse p = {.c = c, .source = source};
    int r;

    int e = vase_config_ini_walk(text, take_line, &p, &p.line_no);
    if (p.r < 0)
        r = p.r;
    else if (e == -ENOMEM)
        r = log_oom();
    else if (e == -E2BIG)
        r = bad_line(&p, -EINVAL, "a line longer than %d bytes", VASE_CONFIG_LINE_MAX);
    else if (e < 0)
        r = bad_line(&p, -EINVAL, "expected \"key = value\", \"[section]\" or a comment");
    else
        r = finish_arenas(&p);
    for (size_t i = 0; ret_given && i < VASE_SETTINGS_N; i++)
        ret_given[i] = p.key_line[i] != 0;
    for (size_t i = 0; i < p.n_arenas; i++)
        vase_arena_config_done(&p.arenas[i].a);
    return r < 0 ? r : 0;
}

/* What a message calls a path of kind. */
static const char *kind_name(enum vase_config_kind kind) {
    switch (kind) {
    case VASE_CONFIG_DIR:
        return "drop-in directory";
    case VASE_CONFIG_DROPIN:
        return "drop-in";
    case VASE_CONFIG_MAIN:
    default:
        return "configuration file";
    }
}

/* Whether st is /dev/null's: the character device 1:3, whatever path names it. */
static bool is_dev_null(const struct stat *st) {
    return S_ISCHR(st->st_mode) && major(st->st_rdev) == 1 && minor(st->st_rdev) == 3;
}

int vase_config_open(const char *path, enum vase_config_kind kind, struct stat *ret_st) {
    int flags = O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK;
    if (kind == VASE_CONFIG_DIR)
        flags |= O_DIRECTORY;
    if (kind == VASE_CONFIG_DROPIN)
        flags |= O_NOFOLLOW;
    int fd = open(path, flags);
    if (fd < 0 && errno == ELOOP && kind == VASE_CONFIG_DROPIN)
        return log_error_errno(-ELOOP,
                               "Refusing the drop-in %s: it is a symlink (a drop-in must be a "
                               "regular file of the directory).",
                               path);
    if (fd < 0 && (errno == ELOOP || errno == EPERM))
        return log_error_errno(-errno, "Cannot open the %s %s: %m", kind_name(kind), path);
    if (fd < 0)
        return -errno;

    struct stat st;
    int r;
    if (fstat(fd, &st) < 0) {
        r = -errno;
        goto close_fd;
    }
    static const char risk[] = "; whoever can write vased's configuration can change who "
                               "may use it.";
    const char *why = NULL, *then = risk;
    if (kind == VASE_CONFIG_MAIN && is_dev_null(&st))
        goto done; /* an empty configuration: nothing to trust or to distrust */
    if (kind != VASE_CONFIG_DIR && S_ISDIR(st.st_mode)) {
        r = -EISDIR;
        goto close_fd;
    }
    if (kind != VASE_CONFIG_DIR && !S_ISREG(st.st_mode)) {
        why = S_ISFIFO(st.st_mode)   ? "not a regular file but a FIFO"
              : S_ISSOCK(st.st_mode) ? "not a regular file but a socket"
                                     : "not a regular file but a device";
        then = ".";
    } else if (st.st_uid != 0 && st.st_uid != geteuid())
        why = "it belongs to another user than root and vased's own";
    else if (st.st_mode & (S_IWGRP | S_IWOTH))
        why = "others than its owner can write it (chmod go-w)";
    if (why) {
        r = log_error_errno(-EPERM, "Refusing the %s %s (owner uid %u, mode %04o): %s%s",
                            kind_name(kind), path, (unsigned)st.st_uid,
                            (unsigned)(st.st_mode & 07777), why, then);
        goto close_fd;
    }
done:
    if (ret_st)
        *ret_st = st;
    return fd;

close_fd:
    close(fd);
    return r;
}

int vase_config_read_file(const char *path, enum vase_config_kind kind, char **ret,
                          size_t *ret_len) {
    struct stat st;
    int fd = vase_config_open(path, kind, &st);
    if (fd < 0)
        return fd;

    char *buf = NULL;
    size_t len = 0;
    int r;
    /* /dev/null has no size to trust either: read until the end. */
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
    return S_ISREG(st.st_mode) ? 0 : 1;

free_buf:
    free(buf);
close_fd:
    close(fd);
    return r;
}

int vase_config_parse_path(struct vase_config *c, const char *path, enum vase_config_kind kind,
                           bool *ret_read, bool *ret_given) {
    char *text = NULL;
    size_t len = 0;
    int r = vase_config_read_file(path, kind, &text, &len);
    *ret_read = r < 0 && r != -EPERM && r != -ELOOP;
    if (r < 0)
        return r;
    bool no_file = r > 0;
    /* The reader walks C strings; a NUL byte would hide the rest of the file. */
    if (memchr(text, '\0', len))
        r = log_error_errno(-EINVAL, "%s: a NUL byte; not a configuration file", path);
    else
        r = parse_text(c, path, text, ret_given);
    free(text);
    return r < 0 ? r : no_file;
}

int vase_config_parse_file(struct vase_config *c, const char *path) {
    bool failed_read;
    if (!c || !path)
        return -EINVAL;
    int r = vase_config_parse_path(c, path, VASE_CONFIG_MAIN, &failed_read, NULL);
    return r < 0 ? r : 0;
}

int vase_config_parse_string(struct vase_config *c, const char *text) {
    if (!c || !text)
        return -EINVAL;
    return parse_text(c, "(string)", text, NULL);
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

/* The comment before the [arena NAME] sections of a dump, and the sections themselves. */
static void dump_arenas(const struct vase_config *c, FILE *f) {
    char text[1024];
    snprintf(
        text, sizeof(text),
        "Besides the default arena of [vased] (arena 0), up to %d more, one section each, "
        "numbered 1, 2, ... in the order given. NAME: 1 to %d letters, digits, '_' or '-', "
        "not \"default\". Keys: arena, cuda_share, arena_bytes and granule_bytes as in [vased] "
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
        char arena_bytes[32], granule_bytes[32];
        vase_format_size(a->arena_bytes, arena_bytes, sizeof(arena_bytes));
        vase_format_size(a->granule_bytes, granule_bytes, sizeof(granule_bytes));
        fprintf(f, "\n[arena %s]\n", a->name);
        const char *values[] = {a->arena,      a->cuda_share, arena_bytes,
                                granule_bytes, a->users,      a->groups};
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
               "# to a section, and each is given once. Drop-ins in vased.conf.d/*.conf beside\n"
               "# this file (or config_dir) are read after it in lexical order, each overriding\n"
               "# the files before it; flags override all files. On SIGHUP a key the files do\n"
               "# not change keeps a value set with `vasectl config set`; `vasectl config set\n"
               "# --persist` writes vased.conf.d/90-vasectl.conf. A setting left to its\n"
               "# default is written commented out (#name = value): remove the '#' to set it.\n"
               "\n[vased]\n");
    for (size_t i = 0; i < vase_settings_count; i++) {
        const struct vase_setting *s = &vase_settings[i];
        char value[PATH_MAX + 1], bounds[96];
        vase_config_format(c, s, value, sizeof(value));
        vase_setting_bounds(s, bounds, sizeof(bounds));
        fprintf(f, "\n");
        comment_wrapped(f, s->description);
        bool dflt = (!c->origins || c->origins[i].from == VASE_CONFIG_FROM_DEFAULT) &&
                    strcmp(value, s->def) == 0;
        fprintf(f, "# (%s; default \"%s\"%s)\n%s%s =%s%s\n", bounds, s->def,
                s->runtime ? "; runtime" : "", dflt ? "#" : "", s->name, value[0] ? " " : "",
                value);
    }
    dump_arenas(c, f);
    return fflush(f) == 0 && !ferror(f) ? 0 : -EIO;
}
