/* SPDX-License-Identifier: MIT */

/*
 * vased's command line and the order in which a configuration is assembled: argv through
 * getopt_long (every row of the settings table is a --name=value flag, with '-' or '_'),
 * --help, and vase_config_load(): defaults, then the file, then the flags, then the checks.
 * Invariant: a parse that fails leaves the caller's struct vase_cmdline untouched and frees
 * everything it allocated; the flags are only recorded here and applied by vase_config_load(),
 * after the file, so that they win over it.
 */

#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "config_internal.h"
#include "core/log.h"

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
        vase_setting_bounds(s, bounds, sizeof(bounds));
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

/* Two spellings per setting (runtime_dir and runtime-dir), the fixed options and the end. */
#define N_OPTIONS (2 * VASE_SETTINGS_N + 5)
#define OPTION_NAME_MAX 64

/* Fills opts (N_OPTIONS entries, zeroed) with every option; the dashed spellings of the
 * settings' names are written into names (VASE_SETTINGS_N * OPTION_NAME_MAX bytes). */
static void fill_options(struct option *opts, char *names) {
    size_t o = 0;
    opts[o++] = (struct option){"help", no_argument, NULL, 'h'};
    opts[o++] = (struct option){"version", no_argument, NULL, ARG_VERSION};
    opts[o++] = (struct option){"config", required_argument, NULL, ARG_CONFIG};
    opts[o++] = (struct option){"dump-config", no_argument, NULL, ARG_DUMP_CONFIG};
    for (size_t i = 0; i < vase_settings_count; i++) {
        char *dashed = names + i * OPTION_NAME_MAX;
        snprintf(dashed, OPTION_NAME_MAX, "%s", vase_settings[i].name);
        for (char *p = dashed; *p; p++)
            if (*p == '_')
                *p = '-';
        opts[o++] =
            (struct option){vase_settings[i].name, required_argument, NULL, ARG_SETTING + (int)i};
        if (strcmp(dashed, vase_settings[i].name) != 0)
            opts[o++] = (struct option){dashed, required_argument, NULL, ARG_SETTING + (int)i};
    }
}

/* getopt_long() returned '?': says what was wrong with the option just read. -EINVAL. */
static int bad_option(char **argv) {
    if (optopt >= ARG_SETTING || optopt == ARG_CONFIG)
        return log_error_errno(-EINVAL, "Option %s needs a value (--name=value).",
                               argv[optind - 1]);
    if (optopt)
        return log_error_errno(-EINVAL, "Unknown option -%c.", optopt);
    return log_error_errno(-EINVAL, "Unknown option %s (see --help).", argv[optind - 1]);
}

/* Records option c (getopt_long()'s return, its value in optarg) into cmd. */
static int take_option(struct vase_cmdline *cmd, int c, char **argv) {
    switch (c) {
    case 'h':
        cmd->help = true;
        return 0;
    case ARG_VERSION:
        cmd->version = true;
        return 0;
    case ARG_DUMP_CONFIG:
        cmd->dump_config = true;
        return 0;
    case ARG_CONFIG:
        free(cmd->config_path);
        cmd->config_path = strdup(optarg);
        return cmd->config_path ? 0 : -ENOMEM;
    case '?':
        return bad_option(argv);
    default:
        if (c >= ARG_SETTING && (size_t)(c - ARG_SETTING) < vase_settings_count)
            return add_override(cmd, vase_settings[c - ARG_SETTING].name, optarg);
        return -EINVAL;
    }
}

int vase_cmdline_parse(int argc, char **argv, struct vase_cmdline *ret) {
    struct option *opts = calloc(N_OPTIONS, sizeof(*opts));
    char *names = calloc(VASE_SETTINGS_N, OPTION_NAME_MAX);
    struct vase_cmdline cmd = {0};
    int r = -ENOMEM;

    if (!opts || !names)
        goto finish;
    fill_options(opts, names);

    /* getopt keeps its state in globals; 0 restarts it, so this may run more than once. */
    optind = 0;
    opterr = 0;
    int c;
    r = 0;
    while (r == 0 && (c = getopt_long(argc, argv, "h", opts, NULL)) >= 0)
        r = take_option(&cmd, c, argv);
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

/* Parses one configuration file, the main one or a drop-in (kind), into c and notes the keys it
 * gives as theirs. A missing file is no error when optional. 0, 1 for /dev/null (no file), or
 * -errno (logged). */
static int load_file(struct vase_config *c, const char *path, enum vase_config_kind kind,
                     bool optional) {
    bool failed_read, given[VASE_SETTINGS_N] = {false};
    int r = vase_config_parse_path(c, path, kind, &failed_read, given);
    if (r == -ENOENT && failed_read && optional)
        return 0;
    if (r < 0 && failed_read)
        return log_error_errno(r, "Failed to read the configuration file %s: %m", path);
    if (r < 0)
        return r;
    for (size_t i = 0; i < vase_settings_count; i++)
        if (given[i] && vase_config_note_file(c, &vase_settings[i], path) < 0)
            return log_oom();
    return r;
}

/* The drop-in directory: config_dir as the command line or else the main file gives it, or
 * vased.conf.d beside the main file; none (*ret NULL) when main_path is NULL (the main
 * configuration is no file, /dev/null) and config_dir is empty. Into *ret (malloc'd). */
static int find_dropin_dir(const struct vase_config *c, const struct vase_cmdline *cmd,
                           const char *main_path, char **ret) {
    const char *dir = c->config_dir;
    for (size_t i = 0; cmd && i < cmd->n_overrides; i++)
        if (vase_setting_key_equal(cmd->keys[i], "config_dir"))
            dir = cmd->values[i];
    if (dir && *dir)
        *ret = strdup(dir);
    else if (!main_path) {
        *ret = NULL;
        return 0;
    } else {
        const char *slash = strrchr(main_path, '/');
        int n = slash ? (int)(slash - main_path) : 0;
        if (asprintf(ret, "%s%.*s%svased.conf.d", slash == main_path ? "/" : "", n, main_path,
                     n ? "/" : "") < 0)
            *ret = NULL;
    }
    return *ret ? 0 : -ENOMEM;
}

/* The drop-ins of c->dropin_dir, in order, into c; none without a drop-in directory. */
static int load_dropins(struct vase_config *c) {
    char **files;
    size_t n;
    if (!c->dropin_dir)
        return 0;
    int r = vase_config_dropins(c->dropin_dir, &files, &n);
    if (r == -ENOMEM)
        return log_oom();
    if (r == -EPERM || r == -ELOOP)
        return r; /* refused, and logged */
    if (r < 0)
        return log_error_errno(r, "Failed to list the drop-in directory %s: %m", c->dropin_dir);
    for (size_t i = 0; i < n && r >= 0; i++)
        r = load_file(c, files[i], VASE_CONFIG_DROPIN, false);
    vase_config_dropins_free(files, n);
    return r < 0 ? r : 0;
}

int vase_config_load(struct vase_config *c, const struct vase_cmdline *cmd) {
    int r = vase_config_init(c);
    if (r < 0)
        return log_oom();

    /* The default file is optional; one named on the command line is not. Then the drop-ins,
     * then the flags, which win over every file. */
    bool named = cmd && cmd->config_path;
    const char *path = named ? cmd->config_path : VASE_CONFIG_DEFAULT_PATH;
    r = load_file(c, path, VASE_CONFIG_MAIN, !named);
    if (r < 0)
        return r;
    /* /dev/null is no file and has nothing beside it: no drop-ins, and nowhere to persist,
     * unless config_dir names a directory. */
    if (find_dropin_dir(c, cmd, r > 0 ? NULL : path, &c->dropin_dir) < 0)
        return log_oom();
    r = load_dropins(c);
    if (r < 0)
        return r;

    for (size_t i = 0; cmd && i < cmd->n_overrides; i++) {
        r = vase_config_set(c, cmd->keys[i], cmd->values[i], 0);
        if (r < 0)
            return log_error_errno(r, "Bad value \"%s\" for --%s: %m", cmd->values[i],
                                   cmd->keys[i]);
        vase_config_set_origin(c, vase_setting_find(cmd->keys[i]), VASE_CONFIG_FROM_CMDLINE, 0);
    }

    const char *msg;
    r = vase_config_check(c, &msg);
    if (r < 0)
        return log_error_errno(r, "Invalid configuration: %s.", msg);
    return 0;
}
