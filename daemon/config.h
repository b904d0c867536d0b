/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * vased's settings: one table (config.c) gives each setting its name, type, bounds, default,
 * whether it may change while the daemon runs, and a description. The table drives the INI
 * file, the --key=value flags, --help, --dump-config, and ConfigGet/ConfigSet. Besides the
 * default arena of the [vased] section, the file may describe further arenas in sections
 * [arena NAME]; those come only from the file and never change while the daemon runs.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define VASE_CONFIG_DEFAULT_PATH "/etc/vase/vased.conf"

/* Arenas in all: the default one of [vased] (arena 0) and at most 7 [arena NAME] sections. */
#define VASED_MAX_ARENAS 8
#define VASE_CONFIG_MAX_EXTRA_ARENAS (VASED_MAX_ARENAS - 1)
/* Longest arena name, without the NUL. Names are [A-Za-z0-9_-]{1,32} and not "default". */
#define VASE_ARENA_NAME_MAX 32

/*
 * One [arena NAME] section, every field filled. Of the keys the section leaves out, arena,
 * cuda_share, arena_bytes and granule_bytes hold the value the [vased] section of the same file
 * gives (or that setting's default; command-line flags change only the default arena), users
 * and groups are empty. Strings are allocated, never NULL.
 */
struct vase_arena_config {
    char *name;       /* the NAME of [arena NAME]; the default arena is not listed */
    char *arena;      /* "host", "cuda:N", "cuda:GPU-<uuid>" (checked by vase_arena_new()) */
    char *cuda_share; /* "ipc" or "vmm" */
    uint64_t arena_bytes, granule_bytes;
    char *users, *groups; /* who may use it; both empty: everyone the daemon admits */
};

struct vase_config {
    char *runtime_dir;
    char *arena;
    char *cuda_share;
    uint64_t arena_bytes;
    uint64_t granule_bytes;
    char *arena_users; /* who may use the default arena; both empty: everyone admitted */
    char *arena_groups;
    char *allow_users;
    char *allow_groups;
    char *socket_group;
    char *admin_group; /* members may change settings through the control socket */
    uint32_t max_clients;
    uint32_t max_seqs_per_client;
    uint64_t max_bytes_per_client; /* 0: no quota */
    uint32_t max_models_per_client;
    uint64_t max_stats_bytes_per_client; /* 0: no attention statistics accepted */
    uint64_t max_message_bytes;
    uint32_t evictor_threads;
    uint32_t stats_interval;
    uint32_t shutdown_timeout;
    uint32_t restore_grace; /* seconds restored sequences wait to be reopened */
    int log_level;
    int32_t default_slack;
    uint32_t admission_wait_ms; /* an OpenSeq's wait for room when it asks for the default */
    int elastic_policy;         /* enum vase_elastic_policy */

    /* The [arena NAME] sections in file order (arena 1, 2, ...); not settings of the table. */
    struct vase_arena_config *extra_arenas;
    size_t n_extra_arenas; /* at most VASE_CONFIG_MAX_EXTRA_ARENAS */
};

enum vase_setting_type {
    VASE_SETTING_STRING,
    VASE_SETTING_U32,
    VASE_SETTING_SIZE, /* uint64_t, accepts K/M/G/T suffixes (powers of 1024) */
    VASE_SETTING_I32,
    VASE_SETTING_LOG_LEVEL,
    VASE_SETTING_ELASTIC_POLICY, /* int: enum vase_elastic_policy (balance.h) */
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

/* Fills c with every default, and no [arena NAME] sections. 0 or -ENOMEM (c is then empty but
 * safe to vase_config_done()). */
int vase_config_init(struct vase_config *c);
/* Frees what c owns, the arena sections included; c may be zeroed or half-initialised. */
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

/*
 * Checks relations between settings, for the default arena and each [arena NAME] section:
 * granule_bytes a multiple of 4096 that divides arena_bytes, at least 2 and below 2^31 granules,
 * cuda_share "ipc" or "vmm"; arena names valid and distinct, at most
 * VASE_CONFIG_MAX_EXTRA_ARENAS of them. 0 or -EINVAL, the reason in *ret_msg when ret_msg is
 * not NULL (a static string, or a per-thread buffer valid until this thread's next call).
 */
int vase_config_check(const struct vase_config *c, const char **ret_msg);

/* The bytes of all host arenas (arena = "host"): the default one and the [arena NAME] ones. */
uint64_t vase_config_host_arena_bytes(const struct vase_config *c);
/*
 * Checks the host arenas against phys_bytes, the machine's physical memory (the caller gives
 * it: sysconf(_SC_PHYS_PAGES) * the page size in vased, any figure in tests). 0: they fit;
 * 1: they fit but take more than 3/4 of it (worth a warning); -ERANGE: they take more than
 * all of it; -EINVAL: c NULL or phys_bytes 0.
 */
int vase_config_check_memory(const struct vase_config *c, uint64_t phys_bytes);

/* Whether a and b have the same [arena NAME] sections, in the same order, with the same
 * values. Arena sections cannot change while vased runs; a reload that sees them differ can
 * only ask for a restart. */
bool vase_config_arenas_equal(const struct vase_config *a, const struct vase_config *b);

/*
 * Parses an INI file into c: settings in [vased], arenas in [arena NAME] (at most
 * VASE_CONFIG_MAX_EXTRA_ARENAS in c in all; they are appended to c's). Failures in reading the
 * file are returned without a log message: -errno of open(2)/read(2) (-ENOENT, -EACCES...),
 * -EISDIR (a directory), -EFBIG (over 1 MiB). Failures in what it says stop the parse at the
 * first bad line and are logged with its number:
 *   -EINVAL  a key before any section, an unknown key or section, a malformed value or line,
 *            a bad arena name, an arena whose granule_bytes and arena_bytes do not fit;
 *   -ERANGE  a value out of its bounds;
 *   -EEXIST  a key given twice in one section, or a section given twice (both lines named);
 *   -E2BIG   more arena sections than VASE_CONFIG_MAX_EXTRA_ARENAS;
 *   -ENOMEM.
 * On failure, [vased] settings before the bad line stay applied and no arena section is added.
 * Of the keys an arena section leaves out, the arena's shape takes the [vased] section's value
 * in the same text (or the default); users and groups are empty (struct vase_arena_config).
 */
int vase_config_parse_file(struct vase_config *c, const char *path);
/* The same for INI text in memory (logged as "(string):LINE"). */
int vase_config_parse_string(struct vase_config *c, const char *text);

/* Writes a complete, documented INI file holding c's values, its arena sections included, that
 * vase_config_parse_string() reads back into the same values. 0, -EINVAL or -EIO. */
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
 * > 0 (help/dump/version asked: print and exit; a dump loads the configuration first),
 * -EINVAL (bad option, logged) or -ENOMEM. On success *ret is filled; free it with
 * vase_cmdline_done().
 */
int vase_cmdline_parse(int argc, char **argv, struct vase_cmdline *ret);
void vase_cmdline_done(struct vase_cmdline *cmd);

/*
 * Defaults, then the file, then the command line's overrides, then vase_config_check(); into a
 * fresh *c (initialised here; vase_config_done() it even on failure). The file is the one of
 * --config, which must be readable, or VASE_CONFIG_DEFAULT_PATH, which may be missing (any
 * other failure to read it counts). 0 or -errno, logged: those of vase_config_parse_file()
 * (-ENOENT, -EACCES, -EISDIR, ... for the file named with --config), of vase_config_set() for
 * a flag, -EINVAL from vase_config_check(). Host memory is not checked here (see
 * vase_config_check_memory()).
 */
int vase_config_load(struct vase_config *c, const struct vase_cmdline *cmd);
