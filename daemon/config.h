/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * vased's settings: one table (config.c) gives each setting its name, type, bounds, default,
 * whether it may change while the daemon runs, and a description. The table drives the INI
 * file (libinih), the --key=value flags, --help, --dump-config, and ConfigGet/ConfigSet.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define VASE_CONFIG_DEFAULT_PATH "/etc/vase/vased.conf"

struct vase_config {
    char *runtime_dir;
    char *arena;
    char *cuda_share;
    uint64_t arena_bytes;
    uint64_t page_bytes;
    char *arena_users; /* who may use the default arena; both empty: everyone admitted */
    char *arena_groups;
    char *allow_users;
    char *allow_groups;
    char *socket_group;
    char *admin_group; /* members may change settings through the control socket */
    uint32_t max_clients;
    uint32_t max_seqs_per_client;
    uint32_t max_pages_per_client;
    uint32_t max_models_per_client;
    uint64_t max_stats_bytes_per_client; /* 0: no attention statistics accepted */
    uint64_t max_message_bytes;
    uint32_t evictor_threads;
    uint32_t stats_interval;
    uint32_t shutdown_timeout;
    int log_level;
    int32_t default_slack;
};

enum vase_setting_type {
    VASE_SETTING_STRING,
    VASE_SETTING_U32,
    VASE_SETTING_SIZE, /* uint64_t, accepts K/M/G/T suffixes (powers of 1024) */
    VASE_SETTING_I32,
    VASE_SETTING_LOG_LEVEL,
};

struct vase_setting {
    const char *name;
    enum vase_setting_type type;
    size_t offset;
    int64_t min, max; /* numbers only */
    const char *def;  /* parsed like any value, so the defaults pass the same checks */
    bool runtime;     /* may change while the daemon runs (ConfigSet, SIGHUP) */
    const char *description;
};

/* The table, and its length. */
extern const struct vase_setting vase_settings[];
extern const size_t vase_settings_count;

/* The setting named key ('-' and '_' are the same), or NULL. */
const struct vase_setting *vase_setting_find(const char *key);
/* "string", "uint32", "size", "int32", "log-level". */
const char *vase_setting_type_name(enum vase_setting_type t);

/* Checked parsers: 0, -EINVAL (not a number, trailing junk, empty), -ERANGE (does not fit). */
int vase_parse_u64(const char *s, uint64_t *ret);
int vase_parse_i64(const char *s, int64_t *ret);
/* A byte count with an optional K, M, G or T suffix (powers of 1024; "KiB", "KB" also). */
int vase_parse_size(const char *s, uint64_t *ret);
/* Formats a byte count with the largest exact suffix ("256M"). */
void vase_format_size(uint64_t v, char *buf, size_t len);

/* Fills c with every default. 0 or -ENOMEM (c is then empty but safe to vase_config_done()). */
int vase_config_init(struct vase_config *c);
/* Frees what c owns; c may be zeroed or half-initialised. */
void vase_config_done(struct vase_config *c);

#define VASE_CONFIG_RUNTIME (1u << 0) /* refuse settings that cannot change while running */

/*
 * Sets key to value. 0 on success (also when the value is unchanged); -ENOENT: no such
 * setting; -EINVAL: malformed value; -ERANGE: out of bounds; -EPERM: VASE_CONFIG_RUNTIME was
 * given and the setting cannot change while running; -ENOMEM. c is unchanged on failure.
 */
int vase_config_set(struct vase_config *c, const char *key, const char *value, unsigned flags);
/* The value of key as a string, malloc'd into *ret. -ENOENT or -ENOMEM. */
int vase_config_get(const struct vase_config *c, const char *key, char **ret);
/* Same, into a caller's buffer (truncated to len). -ENOENT. */
int vase_config_format(const struct vase_config *c, const struct vase_setting *s, char *buf,
                       size_t len);

/* Checks relations between settings (page_bytes divides arena_bytes...). 0 or -EINVAL, the
 * reason in *ret_msg (static) when ret_msg is not NULL. */
int vase_config_check(const struct vase_config *c, const char **ret_msg);

/*
 * Parses an INI file (section [vased], or keys before any section) into c. -ENOENT if the file
 * does not exist; -EINVAL/-ERANGE for the first bad line (unknown key or section, bad value),
 * logged with its line number; settings before the bad line stay applied.
 */
int vase_config_parse_file(struct vase_config *c, const char *path);
/* The same for INI text in memory. */
int vase_config_parse_string(struct vase_config *c, const char *text);

/* Writes a complete, documented INI file holding c's values. 0 or -EIO. */
int vase_config_dump(const struct vase_config *c, FILE *f);
/* Writes the usage text listing every setting. */
void vase_config_help(FILE *f, const char *program);

/* What the command line asked for. */
struct vase_cmdline {
    char *config_path; /* --config=PATH; NULL: VASE_CONFIG_DEFAULT_PATH if it exists */
    bool help, dump_config, version;
    size_t n_overrides;
    char **keys, **values; /* --key=value in command-line order */
};

/*
 * Parses argv (getopt_long; every setting is --name=value, with '-' or '_'). Returns 0 (run),
 * > 0 (help/dump/version asked: print and exit 0), -EINVAL (bad option, logged) or -ENOMEM.
 * On success *ret is filled; free it with vase_cmdline_done().
 */
int vase_cmdline_parse(int argc, char **argv, struct vase_cmdline *ret);
void vase_cmdline_done(struct vase_cmdline *cmd);

/* Defaults, then the file, then the command line's overrides, then vase_config_check(); into a
 * fresh *c (initialised here; vase_config_done() it even on failure). 0 or -errno, logged. */
int vase_config_load(struct vase_config *c, const struct vase_cmdline *cmd);
