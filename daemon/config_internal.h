/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * What config.c, config_ini.c and config_cmdline.c share and nothing else of vased uses: the
 * table's rows as parsers, and the reading of a configuration file for vase_config_load().
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

/* The number of rows of vase_settings[] (checked against the table in config.c), for arrays
 * with one slot per setting. */
#define VASE_SETTINGS_N 28

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

/* Reads and parses the file at path into c, as vase_config_parse_file(). *ret_read tells
 * whether a failure was in reading it (returned unlogged) rather than in what it says (logged
 * with the line). ret_given, when not NULL (VASE_SETTINGS_N entries), is set true for each
 * [vased] key the file gives. */
int vase_config_parse_path(struct vase_config *c, const char *path, bool *ret_read,
                           bool *ret_given);

/* Reads a whole configuration file (at most 1 MiB) into a NUL-terminated buffer (*ret, the
 * caller's). -errno of open() or read(), -EISDIR, -EFBIG, -ENOMEM; nothing is logged. */
int vase_config_read_file(const char *path, char **ret, size_t *ret_len);
