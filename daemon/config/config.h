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
#include <time.h>

#include "core/parse.h"

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

/* Where a setting's value comes from. */
enum vase_config_from {
    VASE_CONFIG_FROM_DEFAULT,
    VASE_CONFIG_FROM_FILE,    /* the main file or a drop-in: file_path */
    VASE_CONFIG_FROM_CMDLINE, /* a --key=value flag */
    VASE_CONFIG_FROM_RUNTIME, /* ConfigSet (vasectl config set) by uid */
};

/*
 * One setting's origin, and what the configuration files said of it at the last load: a reload
 * compares file_value with the files' new word to tell a key the files changed (they win) from
 * one they left alone (a value set at run time stays).
 */
struct vase_config_origin {
    enum vase_config_from from;
    uint32_t uid;     /* VASE_CONFIG_FROM_RUNTIME: who set it */
    char *file_value; /* the files' value, formatted as vase_config_format() does; NULL: none */
    char *file_path;  /* the last file that gave it (a drop-in overrides the main file) */
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
    /* The same for all the connected clients of one uid together (not root's, not the
     * daemon's own uid's: vase_access_uid_capped()). */
    uint32_t max_sessions_per_uid;
    uint32_t max_seqs_per_uid;
    uint32_t max_waiting_opens_per_uid;
    uint64_t max_stats_bytes_per_uid; /* 0: no attention statistics accepted */
    uint64_t max_message_bytes;
    uint32_t evictor_threads;
    uint32_t stats_interval;
    char *metrics_address;        /* "off": no metrics endpoint (metrics_http.h) */
    bool metrics_tenant_labels;   /* the metrics name models and arenas */
    bool metrics_sequence_labels; /* vase_sequence_info: one series per sequence, its label */
    uint32_t shutdown_timeout;
    uint32_t restore_grace; /* seconds restored sequences wait to be reopened */
    int log_level;
    int32_t default_slack;
    uint32_t admission_wait_ms; /* an OpenSeq's wait for room when it asks for the default */
    int elastic_policy;         /* enum vase_elastic_policy */
    char *config_dir;           /* drop-ins; "": <dir of the main file>/vased.conf.d */

    /* The [arena NAME] sections in file order (arena 1, 2, ...); not settings of the table. */
    struct vase_arena_config *extra_arenas;
    size_t n_extra_arenas; /* at most VASE_CONFIG_MAX_EXTRA_ARENAS */

    /* One per row of vase_settings[], allocated by vase_config_init(); NULL in a zeroed struct. */
    struct vase_config_origin *origins;
    /* The drop-in directory vase_config_load() read (config_dir or its default); NULL before,
     * and NULL when there is none (the main configuration is /dev/null, config_dir empty). */
    char *dropin_dir;
};

enum vase_setting_type {
    VASE_SETTING_STRING,
    VASE_SETTING_U32,
    VASE_SETTING_SIZE, /* uint64_t, accepts K/M/G/T suffixes (powers of 1024) */
    VASE_SETTING_I32,
    VASE_SETTING_LOG_LEVEL,
    VASE_SETTING_ELASTIC_POLICY, /* int: enum vase_elastic_policy (balance.h) */
    VASE_SETTING_BOOL,           /* bool: yes, no (true, false, on, off, 1, 0) */
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
/* "string", "uint32", "size", "int32", "log-level", "elastic-policy", "bool". */
const char *vase_setting_type_name(enum vase_setting_type t);

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

/* Records that the files give s the value c now holds, from path: s comes from that file, and
 * that is the files' value of s for the next reload. 0 or -ENOMEM. */
int vase_config_note_file(struct vase_config *c, const struct vase_setting *s, const char *path);
/* Sets where s's value comes from (a ConfigSet: VASE_CONFIG_FROM_RUNTIME and who). */
void vase_config_set_origin(struct vase_config *c, const struct vase_setting *s,
                            enum vase_config_from from, uint32_t uid);
/* Where s's value comes from, in words, into buf (truncated to len): "default", "file PATH",
 * "command line", "runtime (uid N)". 0 or -EINVAL. */
int vase_config_source(const struct vase_config *c, const struct vase_setting *s, char *buf,
                       size_t len);
/*
 * A reload (SIGHUP) of the runtime setting s: running is the daemon's configuration, loaded the
 * one vase_config_load() just assembled. Where the files give s the same value as at the last
 * load (or still none), running keeps its value and its origin, a ConfigSet's included; where
 * they changed it (added, edited, removed), running takes loaded's value and origin (the files',
 * a flag's where one gives the key, or the default). Logs each change with its origin, and each
 * run-time value kept that the files would have changed. 1: running's value changed (the caller
 * applies it); 0: it did not; -EINVAL (s not runtime, no origins), -ENOMEM (running's value is
 * then loaded's or unchanged, its origin unchanged).
 */
int vase_config_reload_setting(struct vase_config *running, const struct vase_config *loaded,
                               const struct vase_setting *s);

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
 * VASE_CONFIG_MAX_EXTRA_ARENAS in c in all; they are appended to c's). The file must be one
 * vased can trust: a regular file (a symlink to one is followed) that belongs to root or to
 * this process's user and that neither its group nor others may write; /dev/null (the device
 * 1:3) is an empty configuration. Else -EPERM, logged with the path, its owner and mode and
 * the reason (a FIFO is refused without waiting on it). Failures in reading the file are
 * returned without a log message: -errno of open(2)/read(2) (-ENOENT, -EACCES...), -EISDIR (a
 * directory), -EFBIG (over 1 MiB). Failures in what it says stop the parse at the first bad
 * line and are logged with its number:
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

/* The drop-in that `vasectl config set --persist` writes, in the drop-in directory. */
#define VASE_CONFIG_PERSIST_NAME "90-vasectl.conf"
/* The most drop-in files read. */
#define VASE_CONFIG_MAX_DROPINS 256

/*
 * The drop-in files of dir: the paths "dir/NAME" of its entries whose NAME ends in ".conf" and
 * does not start with '.', sorted bytewise. 0 and *ret (free with vase_config_dropins_free()),
 * *ret_n entries; no entries when dir does not exist. -EPERM (logged): dir belongs to another
 * user than root and this process's, or its group or others may write it (a symlink to a
 * directory is followed and what it names checked). -errno of open(2)/readdir(3) (-ENOTDIR...;
 * not logged), -E2BIG (more than VASE_CONFIG_MAX_DROPINS), -ENOMEM. Each entry is checked when
 * it is read: a drop-in must be a regular file of the directory, not a symlink (-ELOOP), owned
 * and moded as dir (-EPERM); both logged.
 */
int vase_config_dropins(const char *dir, char ***ret, size_t *ret_n);
void vase_config_dropins_free(char **list, size_t n);

/*
 * Writes "s = value" into dir/90-vasectl.conf for `vasectl config set --persist`: value as
 * vase_config_format() gives it, without a newline; uid and when go into the comment above it.
 * The other keys of the file stay (each with its comment line), s's line is replaced, a header
 * says who writes the file. dir is created (0755) if missing. The new file is written beside the
 * old one (a dotfile, never read as a drop-in), synced, parsed back, and renamed over it, then
 * the directory is synced: the old file or the new one, never a mix. 0 and the file's path in
 * *ret_path (the caller's); -EINVAL (bad arguments, or the file holds text this writer does not
 * write: logged with its line), -EBADMSG (the new file would not give value back), the parser's
 * errors (logged), -EPERM and -ELOOP (logged: dir or the old file refused as a load refuses
 * them, vase_config_dropins(): a symlinked, non-regular or others-writable 90-vasectl.conf is
 * never read, so its target's text is never copied), -errno of mkdir(2), open(2), write(2),
 * fsync(2), rename(2) (-EACCES, -EROFS, -ENOSPC, -EDQUOT, ...; not logged), -ENOMEM. On failure
 * the directory is left as it was.
 */
int vase_config_persist(const char *dir, const struct vase_setting *s, const char *value,
                        uint32_t uid, time_t when, char **ret_path);

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
 * Defaults, then the main file, then the drop-ins, then the command line's overrides, then
 * vase_config_check(); into a fresh *c (initialised here; vase_config_done() it even on
 * failure), with each setting's origin and the files' value of each key (c->origins) and the
 * drop-in directory read (c->dropin_dir). The main file is the one of --config, which must be
 * readable, or VASE_CONFIG_DEFAULT_PATH, which may be missing (any other failure to read it
 * counts). The drop-ins are vase_config_dropins() of config_dir (as the command line, else the
 * main file gives it) or of vased.conf.d beside the main file, which may be missing; each must
 * be readable and valid, later ones overriding earlier ones. A main configuration that is no
 * file (/dev/null) has nothing beside it: without config_dir no drop-in is read and
 * c->dropin_dir is NULL. Files and directories vased cannot trust are refused (-EPERM,
 * -ELOOP; see vase_config_parse_file() and vase_config_dropins()). 0 or -errno, logged: those of
 * vase_config_parse_file() (-ENOENT, -EACCES, -EISDIR, ... for a file that must be read), of
 * vase_config_dropins() for the directory, of vase_config_set() for a flag, -EINVAL from
 * vase_config_check(). Host memory is not checked here (see vase_config_check_memory()).
 */
int vase_config_load(struct vase_config *c, const struct vase_cmdline *cmd);
