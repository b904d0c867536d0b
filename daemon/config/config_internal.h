/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * What config.c, config_ini.c, config_lines.c, config_dropin.c and config_cmdline.c share and
 * nothing else of vased uses: the table's rows as parsers, the reading of a configuration file
 * for vase_config_load(), and INI text line by line.
 */

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <sys/stat.h>

#include "config.h"

/* The number of rows of vase_settings[] (checked against the table in config.c), for arrays
 * with one slot per setting. */
#define VASE_SETTINGS_N 33

/* Whether two setting names are the same, '-' and '_' being equal. */
bool vase_setting_key_equal(const char *a, const char *b);
/* Where s's value lives in c. */
void *vase_config_field(const struct vase_config *c, const struct vase_setting *s);
/* Parses value as s's type into *ret_num (numbers; untouched for strings) and checks s's
 * bounds. 0, -EINVAL (malformed) or -ERANGE (out of bounds, or a string over PATH_MAX). */
int vase_setting_parse(const struct vase_setting *s, const char *value, int64_t *ret_num);
/* "uint32, 1 .. 64", "size, 4K .. 1G", "string": s's type and bounds for --help and dumps. */
void vase_setting_bounds(const struct vase_setting *s, char *buf, size_t len);

/* Frees what a owns and zeroes it; a may be half-filled. */
void vase_arena_config_done(struct vase_arena_config *a);
/* What is wrong with one arena's geometry and sharing mode (a static string), or NULL. */
const char *vase_arena_problem(uint64_t arena_bytes, uint64_t granule_bytes,
                               const char *cuda_share);
/* Whether name may name an [arena NAME] section. */
bool vase_arena_name_valid(const char *name);

/* What vase_config_open() opens, and so which rules it applies. */
enum vase_config_kind {
    VASE_CONFIG_MAIN,   /* the main file: a symlink is followed; /dev/null is no file, empty */
    VASE_CONFIG_DIR,    /* the drop-in directory: a symlink is followed */
    VASE_CONFIG_DROPIN, /* an entry of the drop-in directory: never a symlink */
};

/*
 * Opens path for reading as a configuration file or directory (kind) and checks what was
 * opened, by fstat(2) of the descriptor, so that nothing can be swapped in between: it must
 * belong to root or to this process's user (geteuid()), no one else may write it (no group or
 * other write bit, whatever the group), and it must be a regular file (a directory for
 * VASE_CONFIG_DIR). Exceptions: VASE_CONFIG_MAIN takes /dev/null (the character device 1:3) as
 * an empty configuration. O_NONBLOCK, so that a FIFO never blocks the open; O_NOFOLLOW for a
 * drop-in. Whoever could write a configuration file could change allow_users or admin_group,
 * and a symlinked drop-in would have --persist copy its target into a world-readable file.
 * Returns the descriptor (O_CLOEXEC; the caller closes it), its fstat in *ret_st when not NULL.
 * -ELOOP (a symlinked drop-in, or a loop) and -EPERM (refused: another owner, writable by
 * others, not a regular file) are logged here, naming the path, its owner and mode, and the
 * reason; any other -errno of open(2) or fstat(2) (-ENOENT, -EACCES, -ENOTDIR), and -EISDIR
 * (a directory where a file is wanted), is returned unlogged.
 */
int vase_config_open(const char *path, enum vase_config_kind kind, struct stat *ret_st);

/* Reads and parses the file at path (opened as kind) into c, as vase_config_parse_file(). 0, or
 * 1 when path is /dev/null (VASE_CONFIG_MAIN only: no file, nothing read). *ret_read tells
 * whether a failure was in reading it (returned unlogged) rather than a refusal of
 * vase_config_open() or what it says (logged). ret_given, when not NULL (VASE_SETTINGS_N
 * entries), is set true for each [vased] key the file gives. */
int vase_config_parse_path(struct vase_config *c, const char *path, enum vase_config_kind kind,
                           bool *ret_read, bool *ret_given);

/* The longest line of INI text, '\n' excluded: room for a string value of PATH_MAX bytes, its
 * key and blanks. */
#define VASE_CONFIG_LINE_MAX (4 * PATH_MAX)

/* A line of INI text as vase_config_ini_walk() hands it on: a key (key and value set), or the
 * end of a line (neither), with section set when that line opened one (its name as libinih read
 * it, blanks kept). text is the whole line as written, not NUL-terminated. */
struct vase_ini_line {
    unsigned no; /* from 1 */
    const char *text;
    size_t len;
    const char *section;
    const char *key, *value;
};

/*
 * Reads NUL-terminated INI text through libinih (config_lines.c: the format) and calls take for
 * each key and at the end of each line, in order; a UTF-8 byte order mark at its start is
 * dropped. take returns 0 to go on, or -errno to stop the walk with it. Returns 0 when every line
 * was read; take's error; -EBADMSG at a line that is none of a key, a section, a comment or
 * blank; -E2BIG at a line longer than VASE_CONFIG_LINE_MAX; -ENOMEM. *ret_line_no is the number
 * of the last line read (where it stopped). Nothing is logged.
 */
int vase_config_ini_walk(const char *text,
                         int (*take)(void *user, const struct vase_ini_line *line), void *user,
                         unsigned *ret_line_no);

/* Reads a whole configuration file (at most 1 MiB), opened by vase_config_open() as kind, into
 * a NUL-terminated buffer (*ret, the caller's). 0, or 1 for /dev/null (*ret empty); the errors
 * of vase_config_open() (-EPERM and -ELOOP logged), -errno of read(), -EFBIG, -ENOMEM; nothing
 * else is logged. */
int vase_config_read_file(const char *path, enum vase_config_kind kind, char **ret,
                          size_t *ret_len);
