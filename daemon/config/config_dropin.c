/* SPDX-License-Identifier: MIT */

/*
 * The drop-in directory (vased.conf.d next to the main configuration file, or config_dir):
 * which files in it count, in what order, and the one file of it that vased itself writes,
 * 90-vasectl.conf, for `vasectl config set --persist`. Invariants: only names ending in ".conf"
 * and not starting with '.' count, sorted bytewise (strcmp, not the locale's order), so that a
 * temporary file of the writer (a dotfile) is never read; the writer replaces the file whole
 * (temporary file, fsync, rename, fsync of the directory), so a reader sees the old file or the
 * new one, never a mix, and a file that does not parse back is never put in place. The
 * directory and every drop-in pass vase_config_open() (config_ini.c) before they are read, the
 * writer's directory and old file included: a drop-in is a regular file of the directory, never
 * a symlink, and neither it nor the directory may be written by others than root and vased's
 * user.
 */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "config_internal.h"
#include "core/log.h"

static int compare_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool is_dropin_name(const char *name) {
    size_t n = strlen(name);
    return name[0] != '.' && n > 5 && strcmp(name + n - 5, ".conf") == 0;
}

void vase_config_dropins_free(char **list, size_t n) {
    for (size_t i = 0; list && i < n; i++)
        free(list[i]);
    free(list);
}

int vase_config_dropins(const char *dir, char ***ret, size_t *ret_n) {
    if (!dir || !ret || !ret_n)
        return -EINVAL;
    int fd = vase_config_open(dir, VASE_CONFIG_DIR, NULL);
    if (fd == -ENOENT) {
        *ret = NULL;
        *ret_n = 0;
        return 0;
    }
    if (fd < 0)
        return fd;
    DIR *d = fdopendir(fd);
    if (!d) {
        int r = -errno;
        close(fd);
        return r;
    }
    char **list = NULL;
    size_t n = 0;
    int r = 0;
    for (;;) {
        errno = 0;
        struct dirent *e = readdir(d);
        if (!e) {
            r = -errno;
            break;
        }
        if (!is_dropin_name(e->d_name))
            continue;
        if (n == VASE_CONFIG_MAX_DROPINS) {
            r = -E2BIG;
            break;
        }
        char **grown = realloc(list, (n + 1) * sizeof(*list));
        if (!grown) {
            r = -ENOMEM;
            break;
        }
        list = grown;
        if (asprintf(&list[n], "%s/%s", dir, e->d_name) < 0) {
            r = -ENOMEM;
            break;
        }
        n++;
    }
    closedir(d);
    if (r < 0) {
        vase_config_dropins_free(list, n);
        return r;
    }
    if (n)
        qsort(list, n, sizeof(*list), compare_names);
    *ret = list;
    *ret_n = n;
    return 0;
}

/* ---- 90-vasectl.conf ---- */

/* A growing text. */
struct text {
    char *buf;
    size_t len, cap;
    bool oom;
};

static void text_add(struct text *t, const char *s, size_t n) {
    if (t->oom)
        return;
    if (t->len + n + 1 > t->cap) {
        size_t cap = (t->len + n + 1) * 2;
        char *b = realloc(t->buf, cap);
        if (!b) {
            t->oom = true;
            return;
        }
        t->buf = b;
        t->cap = cap;
    }
    memcpy(t->buf + t->len, s, n);
    t->len += n;
    t->buf[t->len] = '\0';
}

static void text_line(struct text *t, const char *s, size_t n) {
    text_add(t, s, n);
    text_add(t, "\n", 1);
}

static const char header[] =
    "# Written by `vasectl config set --persist`: each key below is the last value persisted\n"
    "# for it, with who set it and when in the comment above it. vased reads this file after\n"
    "# the main configuration file and the drop-ins named before it; a drop-in named after it\n"
    "# overrides it. vased rewrites it whole; edit it only in the same form.\n"
    "\n"
    "[vased]\n";

/* What keep_entries() keeps: the lines of old for out but s's, and the comment line above the
 * line being read. */
struct keep {
    const char *path;
    const struct vase_setting *s;
    struct text *out;
    const char *comment; /* NULL: the line above is no comment */
    size_t comment_len;
};

/* The line l of text, blanks on both ends dropped: *ret_len bytes at the result. */
static const char *trimmed(const struct vase_ini_line *l, size_t *ret_len) {
    const char *p = l->text;
    size_t len = l->len;
    while (len && (p[len - 1] == '\r' || p[len - 1] == ' ' || p[len - 1] == '\t'))
        len--;
    while (len && (*p == ' ' || *p == '\t')) {
        p++;
        len--;
    }
    *ret_len = len;
    return p;
}

/* A line of the old file (vase_config_ini_walk()): a key's line is kept with the comment above
 * it, unless it is s's; a comment is remembered for the key below it. -EINVAL (logged) for a
 * section other than [vased] or a key that is no setting. */
static int keep_line(void *user, const struct vase_ini_line *l) {
    struct keep *k = user;
    size_t len;
    const char *p = trimmed(l, &len);

    if (l->key) {
        const struct vase_setting *s = vase_setting_find(l->key);
        if (!s)
            return log_error_errno(-EINVAL, "%s:%u: unknown setting \"%s\"", k->path, l->no,
                                   l->key);
        if (s != k->s) {
            text_add(k->out, "\n", 1);
            if (k->comment)
                text_line(k->out, k->comment, k->comment_len);
            text_line(k->out, p, len);
        }
        return 0;
    }
    if (l->section && strcmp(l->section, "vased") != 0)
        return log_error_errno(-EINVAL, "%s:%u: only [vased] belongs in this file", k->path, l->no);
    /* The end of a line: a comment is kept for the key below it, anything else ends it. */
    bool comment = len && (*p == '#' || *p == ';');
    k->comment = comment ? p : NULL;
    k->comment_len = comment ? len : 0;
    return 0;
}

/*
 * The lines of old (this file as it was) to keep, read as vased reads a drop-in: every
 * "key = value" line of [vased] but s's, each with the comment line right above it. 0, or
 * -EINVAL for text this writer does not write (another section, a line of another kind), logged
 * with its line number; -ENOMEM.
 */
static int keep_entries(const char *path, const char *old, const struct vase_setting *s,
                        struct text *out) {
    struct keep k = {.path = path, .s = s, .out = out};
    unsigned line_no;
    int r = vase_config_ini_walk(old, keep_line, &k, &line_no);

    if (r == -EBADMSG || r == -E2BIG) {
        const char *line = old;
        for (unsigned i = 1; i < line_no && strchr(line, '\n'); i++)
            line = strchr(line, '\n') + 1;
        line += strspn(line, " \t");
        return log_error_errno(-EINVAL, "%s:%u: %s", path, line_no,
                               *line == '[' ? "only [vased] belongs in this file"
                                            : "expected \"key = value\"");
    }
    return r == -ENOMEM ? log_oom() : r;
}

/* Writes the whole of t to fd. 0 or -errno. */
static int write_all(int fd, const char *buf, size_t len) {
    while (len) {
        ssize_t n = write(fd, buf, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Whether the file at path gives s the value value, parsed as vased parses it. 0, -EBADMSG
 * (it gives another value or none), or the parser's error (logged). */
static int check_parses_back(const char *path, const struct vase_setting *s, const char *value) {
    struct vase_config c;
    bool given[VASE_SETTINGS_N] = {false}, failed_read;
    char now[PATH_MAX + 1];
    int r = vase_config_init(&c);
    if (r >= 0)
        r = vase_config_parse_path(&c, path, VASE_CONFIG_DROPIN, &failed_read, given);
    if (r >= 0) {
        vase_config_format(&c, s, now, sizeof(now));
        if (!given[s - vase_settings] || strcmp(now, value) != 0)
            r = -EBADMSG;
    }
    vase_config_done(&c);
    return r;
}

/* The new file's text: header, the entries kept, then s's with a comment of who and when. */
static int compose(const char *path, const char *old, const struct vase_setting *s,
                   const char *value, uint32_t uid, time_t when, struct text *out) {
    char stamp[64] = "?";
    struct tm tm;
    text_add(out, header, strlen(header));
    int r = keep_entries(path, old, s, out);
    if (r < 0)
        return r;
    if (gmtime_r(&when, &tm))
        strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S UTC", &tm);
    char who[160];
    int n = snprintf(who, sizeof(who), "\n# %s: set by uid %" PRIu32 " at %s\n%s = ", s->name, uid,
                     stamp, s->name);
    text_add(out, who, (size_t)n);
    text_add(out, value, strlen(value));
    text_add(out, "\n", 1);
    return out->oom ? -ENOMEM : 0;
}

/* Opens dir (created with mode 0755 if missing) as a directory fd, checked as the drop-in
 * directory is at start. -errno (-EPERM, -ELOOP logged). */
static int open_dir(const char *dir) {
    int fd = vase_config_open(dir, VASE_CONFIG_DIR, NULL);
    if (fd == -ENOENT) {
        if (mkdir(dir, 0755) < 0 && errno != EEXIST)
            return -errno;
        fd = vase_config_open(dir, VASE_CONFIG_DIR, NULL);
    }
    return fd;
}

int vase_config_persist(const char *dir, const struct vase_setting *s, const char *value,
                        uint32_t uid, time_t when, char **ret_path) {
    char *path = NULL, *tmp = NULL, *old = NULL;
    struct text t = {0};
    size_t old_len;
    int r, fd = -1;

    if (!dir || !*dir || !s || !value || !ret_path || strchr(value, '\n'))
        return -EINVAL;
    if (asprintf(&path, "%s/" VASE_CONFIG_PERSIST_NAME, dir) < 0)
        return -ENOMEM;
    if (asprintf(&tmp, "%s/." VASE_CONFIG_PERSIST_NAME ".XXXXXX", dir) < 0) {
        r = -ENOMEM;
        goto free_path;
    }
    int dfd = open_dir(dir);
    if (dfd < 0) {
        r = dfd;
        goto free_tmp;
    }

    /* The old file is read as a drop-in is: a symlink, a FIFO or a file others can write is
     * refused, not copied into the new file. */
    r = vase_config_read_file(path, VASE_CONFIG_DROPIN, &old, &old_len);
    if (r == -ENOENT)
        r = 0;
    if (r < 0)
        goto close_dir;
    r = compose(path, old ? old : "", s, value, uid, when, &t);
    if (r < 0)
        goto free_text;

    fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        r = -errno;
        goto free_text;
    }
    if (fchmod(fd, 0644) < 0 || (r = write_all(fd, t.buf, t.len)) < 0 || fsync(fd) < 0) {
        r = r < 0 ? r : -errno;
        close(fd);
        goto unlink_tmp;
    }
    if (close(fd) < 0) {
        r = -errno;
        goto unlink_tmp;
    }
    r = check_parses_back(tmp, s, value);
    if (r < 0)
        goto unlink_tmp;
    if (rename(tmp, path) < 0) {
        r = -errno;
        goto unlink_tmp;
    }
    /* The rename lasts once the directory is on disk. */
    if (fsync(dfd) < 0)
        log_warning_errno(-errno, "Failed to sync the directory %s after writing %s: %m", dir,
                          path);
    *ret_path = path;
    path = NULL;
    r = 0;
    goto free_text;

unlink_tmp:
    unlink(tmp);
free_text:
    free(t.buf);
    free(old);
close_dir:
    close(dfd);
free_tmp:
    free(tmp);
free_path:
    free(path);
    return r;
}
