/* SPDX-License-Identifier: MIT */

/*
 * vasectl: shows and tunes a running vased. It speaks the admin subset of the control protocol
 * (PROTOCOL.md: Ping, Status, ListClients, ListSeqs, GetSeq, ConfigGet, ConfigSet) and follows
 * the event stream, all through libvase's administrative API (vase_admin.h), the one a
 * monitoring tool would use. It holds no session and maps no memory: access to the socket files
 * is the permission. This file parses the command line and runs the commands; those that show
 * the daemon's answers are vasectl_show.c's, the output is vasectl_print.c's (tables for people)
 * and vasectl_json.c's (--json: one JSON document per command, one per line for events, produced
 * from the protobuf descriptors). Its errors go to stderr, as "vasectl: MESSAGE" lines, or
 * under --json as one JSON object each, {"error":"MESSAGE","errno":N} (N the positive errno or
 * vase code). `vasectl top`, the live view, is vasectl_top.c's.
 */

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vase.h"
#include "vase_admin.h"
#include "vasectl.h"

#define DEFAULT_TIMEOUT_MS 5000
/* vasectl is released with vased: the same version (a test compares their --version). */
#define VASECTL_VERSION "0.1.0"
/* What every usage error ends with. */
#define HINT "(try 'vasectl --help')"
/* Bounds of top's --interval, in seconds. */
#define MIN_INTERVAL 0.1
#define MAX_INTERVAL 3600.0

static const char *arg_runtime_dir = NULL;
static bool arg_json = false;
static int arg_timeout_ms = DEFAULT_TIMEOUT_MS;
static long long arg_count = -1;      /* events to print; -1: until SIGINT */
static bool arg_persist = false;      /* config set: also into the daemon's drop-in */
static double arg_interval = 0;       /* top: seconds between samples; 0: 1 */
static long long arg_iterations = -1; /* top: samples; -1: its default */
/* The command words: at most 16 are ever valid (size's KEY=VALUE words, 15 keys); more are
 * counted so that run() can refuse them. */
#define MAX_WORDS 16
static char *arg_command[MAX_WORDS];
static int arg_n_command = 0;

static volatile sig_atomic_t interrupted = 0;

/* ---- small helpers ---- */

static int parse_double(const char *s, double min, double max, double *ret) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || !isfinite(v))
        return -EINVAL;
    if (errno == ERANGE || v < min || v > max)
        return -ERANGE;
    *ret = v;
    return 0;
}

static int parse_ll(const char *s, long long min, long long max, long long *ret) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end || errno == EINVAL)
        return -EINVAL;
    if (errno == ERANGE || v < min || v > max)
        return -ERANGE;
    *ret = v;
    return 0;
}

int vasectl_fail(int error, const char *fmt, ...) {
    int e = error < 0 ? -error : error;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fflush(stdout);
    if (arg_json) {
        fputs("{\"error\":", stderr);
        vasectl_json_string(stderr, msg, strlen(msg));
        fprintf(stderr, ",\"errno\":%d}\n", e);
    } else
        fprintf(stderr, "vasectl: %s\n", msg);
    return -e;
}

static void help(void) {
    printf("Usage: %s [OPTIONS] COMMAND\n"
           "\n"
           "Show and tune a running vased.\n"
           "\n"
           "Commands:\n"
           "  status                 daemon, arenas and counters\n"
           "  clients                connected engines\n"
           "  seqs [CLIENT_ID]       sequences (of one client)\n"
           "  seq ID                 one sequence\n"
           "  config get [KEY]       settings (one setting's value)\n"
           "  config set KEY VALUE   change a setting at run time (VALUE is taken as it is,\n"
           "                         also when it starts with '-': config set default_slack -1);\n"
           "                         it lasts across reloads unless the files change KEY\n"
           "  config set --persist KEY VALUE\n"
           "                         the same, written to vased.conf.d/90-vasectl.conf so that\n"
           "                         it lasts across restarts too\n"
           "  events                 follow the event stream until interrupted\n"
           "  top                    live view of arenas, clients, models and sequences, with\n"
           "                         rates (keys: s/S sort column, r reverse, q quit); plain\n"
           "                         text snapshots when stdout is not a terminal\n"
           "  ping                   round trip to the daemon\n"
           "  reload [PID]           have vased (PID, else $MAINPID) reload its configuration:\n"
           "                         SIGHUP marked so that its log names vasectl reload, or\n"
           "                         systemctl reload when the unit's ExecReload= runs it\n"
           "  size KEY=VALUE...      what one sequence costs in the arena and how many fit,\n"
           "                         without a daemon: layers=, q_heads=, kv_heads=, head_dim=\n"
           "                         (required), dtype= (bf16), block_tokens= (16), policy=\n"
           "                         (vase-attnv), budget= (1024), window= (64), n_sink=,\n"
           "                         n_large=, prompt_len= (0), slack= (window),\n"
           "                         arena_bytes= (1G), granule_bytes= (2M)\n"
           "\n"
           "Options:\n"
           "  -h --help              show this help\n"
           "     --version           show vasectl's version and its protocol version\n"
           "     --runtime-dir=DIR   vased's runtime directory (default: $VASE_RUNTIME_DIR,\n"
           "                         else /run/vase if it exists, else ./run)\n"
           "     --json              print JSON instead of tables (errors too: one object\n"
           "                         {\"error\": MESSAGE, \"errno\": N} on stderr)\n"
           "     --timeout=MS        bound on each wait for the daemon (default %d)\n"
           "     --count=N           events: stop after N events\n"
           "     --persist           config set: also write the value to the daemon's drop-in\n"
           "     --interval=SECONDS  top: time between samples (default 1, %g .. %g)\n"
           "  -n --iterations=N      top: take N samples, then exit (default: until 'q' in\n"
           "                         a terminal, else 2, so that the second shows rates)\n"
           "\n"
           "Options may come before, between or after the command's words; '--' ends them.\n",
           program_invocation_short_name, DEFAULT_TIMEOUT_MS, MIN_INTERVAL, MAX_INTERVAL);
}

static void add_word(char *word) {
    if (arg_n_command < MAX_WORDS)
        arg_command[arg_n_command] = word;
    arg_n_command++;
}

/* Whether the next argument is the VALUE of "config set KEY VALUE", which is never an option:
 * a value may well start with '-' (a negative number). */
static bool value_due(void) {
    return arg_n_command == 3 && strcmp(arg_command[0], "config") == 0 &&
           strcmp(arg_command[1], "set") == 0;
}

/*
 * Returns < 0 on a usage error (already reported), 0 to exit successfully (help), > 0 to run.
 * Options and command words may be mixed, but unlike getopt's own permuting the arguments are
 * taken in order ('+': getopt stops at each word, which is collected here), so that the VALUE
 * of config set can be taken as it is, and "--" makes every later argument a word.
 */
static int parse_argv(int argc, char *argv[]) {
    enum {
        ARG_RUNTIME_DIR = 0x100,
        ARG_JSON,
        ARG_TIMEOUT,
        ARG_COUNT,
        ARG_VERSION,
        ARG_INTERVAL,
        ARG_PERSIST,
    };
    static const struct option options[] = {
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, ARG_VERSION},
        {"runtime-dir", required_argument, NULL, ARG_RUNTIME_DIR},
        {"json", no_argument, NULL, ARG_JSON},
        {"timeout", required_argument, NULL, ARG_TIMEOUT},
        {"count", required_argument, NULL, ARG_COUNT},
        {"persist", no_argument, NULL, ARG_PERSIST},
        {"interval", required_argument, NULL, ARG_INTERVAL},
        {"iterations", required_argument, NULL, 'n'},
        {},
    };
    bool options_ended = false;
    long long v;

    /* Errors are reported here (as JSON under --json), not by getopt. */
    opterr = 0;

    while (optind < argc) {
        if (options_ended || value_due()) {
            add_word(argv[optind++]);
            continue;
        }
        int at = optind;
        int c = getopt_long(argc, argv, "+:hn:", options, NULL);
        if (c < 0) {
            /* A word, or "--" (which getopt steps over). */
            if (optind > at)
                options_ended = true;
            else
                add_word(argv[optind++]);
            continue;
        }
        switch (c) {
        case 'h':
            help();
            return 0;
        case ARG_VERSION:
            printf("vasectl %s (protocol %d)\n", VASECTL_VERSION, VASE_PROTOCOL_VERSION);
            return 0;
        case ARG_RUNTIME_DIR:
            if (!*optarg) {
                return vasectl_fail(-EINVAL, "--runtime-dir must not be empty");
            }
            arg_runtime_dir = optarg;
            break;
        case ARG_JSON:
            arg_json = true;
            break;
        case ARG_TIMEOUT:
            if (parse_ll(optarg, 1, INT_MAX, &v) < 0) {
                return vasectl_fail(-EINVAL,
                                    "invalid --timeout '%s': expected milliseconds, 1 .. %d",
                                    optarg, INT_MAX);
            }
            arg_timeout_ms = (int)v;
            break;
        case ARG_COUNT:
            if (parse_ll(optarg, 0, LLONG_MAX, &v) < 0) {
                return vasectl_fail(-EINVAL, "invalid --count '%s': expected a number >= 0",
                                    optarg);
            }
            arg_count = v;
            break;
        case ARG_PERSIST:
            arg_persist = true;
            break;
        case ARG_INTERVAL:
            if (parse_double(optarg, MIN_INTERVAL, MAX_INTERVAL, &arg_interval) < 0) {
                return vasectl_fail(-EINVAL, "invalid --interval '%s': expected seconds, %g .. %g",
                                    optarg, MIN_INTERVAL, MAX_INTERVAL);
            }
            break;
        case 'n':
            if (parse_ll(optarg, 1, LLONG_MAX, &v) < 0) {
                return vasectl_fail(-EINVAL, "invalid --iterations '%s': expected a number >= 1",
                                    optarg);
            }
            arg_iterations = v;
            break;
        case ':':
            return vasectl_fail(-EINVAL, "option '%s' needs a value " HINT, argv[at]);
        case '?':
            /* argv[at] is the argument getopt was reading: "--name[=value]" or "-xyz". */
            if (strncmp(argv[at], "--", 2) != 0)
                return vasectl_fail(-EINVAL, "unknown option '-%c' " HINT, optopt);
            if (optopt)
                return vasectl_fail(-EINVAL, "option '%.*s' takes no value " HINT,
                                    (int)strcspn(argv[at], "="), argv[at]);
            return vasectl_fail(-EINVAL, "unknown option '%s' " HINT, argv[at]);
        default:
            return -EINVAL;
        }
    }
    if (arg_n_command == 0) {
        return vasectl_fail(-EINVAL, "no command given " HINT);
    }
    return 1;
}

/* ---- talking to the daemon ---- */

int vasectl_report(struct vase_admin *a, const char *what, int r) {
    const char *why = vase_admin_last_error(a);

    if (r == -ETIMEDOUT)
        return vasectl_fail(r, "cannot reach vased at %s: no reply within %d ms",
                            vase_admin_path(a), vase_admin_timeout(a));
    if (*why)
        return vasectl_fail(r, "%s: %s (%s)", what, why, vase_strerror(r));
    return vasectl_fail(r, "%s: %s", what, vase_strerror(r));
}

static int ctl_open(struct vase_admin **ret) {
    struct vase_admin *a;
    int r;

    r = vase_admin_new(
        &(struct vase_admin_options){.runtime_dir = arg_runtime_dir, .timeout_ms = arg_timeout_ms},
        &a);
    if (r < 0) {
        vasectl_fail(r, "runtime directory name too long");
        return r;
    }
    r = vase_admin_connect(a);
    if (r < 0) {
        vasectl_fail(r, "cannot reach vased at %s: %s", vase_admin_path(a),
                     r == -ENOTSOCK ? "not a socket" : vase_strerror(r));
        vase_admin_free(a);
        return r;
    }
    *ret = a;
    return 0;
}

/* ---- commands ---- */

static int cmd_ping(struct vase_admin *a) {
    struct timespec t0, t1;
    uint64_t incarnation;

    clock_gettime(CLOCK_MONOTONIC, &t0);
    int r = vase_admin_ping(a, &incarnation);
    if (r < 0)
        return vasectl_report(a, "ping", r);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    if (arg_json)
        printf("{\"ok\":true,\"incarnation\":\"0x%016" PRIx64 "\",\"rtt_ms\":%.3f}\n", incarnation,
               ms);
    else
        printf("pong from vased at %s (incarnation %016" PRIx64 ") in %.3f ms\n",
               vase_admin_path(a), incarnation, ms);
    return 0;
}

static int cmd_config_set(struct vase_admin *a, const char *key, const char *value) {
    Vase__ConfigReply *cr;
    char what[300];

    snprintf(what, sizeof(what), "config set%s %.256s", arg_persist ? " --persist" : "", key);
    int r = arg_persist ? vase_admin_config_persist(a, key, value, &cr)
                        : vase_admin_config_set(a, key, value, &cr);
    if (r < 0)
        return vasectl_report(a, what, r);
    if (arg_json)
        vasectl_json_line(&cr->base);
    else
        for (size_t i = 0; i < cr->n_entries; i++)
            printf("%s = %s (%s)\n", cr->entries[i]->key, cr->entries[i]->value,
                   cr->entries[i]->source[0] ? cr->entries[i]->source : "source unknown");
    protobuf_c_message_free_unpacked(&cr->base, NULL);
    return 0;
}

static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}

static int cmd_events(struct vase_admin *a) {
    struct sigaction sa = {.sa_handler = on_sigint};
    struct vase_admin_events *ev;
    long long seen = 0;
    int r;

    r = vase_admin_events_subscribe(a, &ev);
    if (r == -ENOENT || r == -EACCES || r == -ENOTSOCK) {
        return vasectl_fail(r, "cannot reach vased at %s/events.sock: %s",
                            vase_admin_runtime_dir(a),
                            r == -ENOTSOCK ? "not a socket" : vase_strerror(r));
    }
    if (r < 0)
        return vasectl_report(a, "events", r);
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    setvbuf(stdout, NULL, _IOLBF, 0);

    r = 0;
    while (!interrupted && (arg_count < 0 || seen < arg_count)) {
        char topic[64];
        Vase__Event *e;
        int k = vase_admin_events_next(ev, topic, sizeof(topic), &e);
        if (k == -EINTR || k == 0)
            continue;
        if (k == -EBADMSG) {
            vasectl_fail(k, "events: dropped a malformed event");
            continue;
        }
        if (k < 0) {
            r = vasectl_report(a, "events", k);
            break;
        }
        vasectl_print_event(topic, e, arg_json);
        protobuf_c_message_free_unpacked(&e->base, NULL);
        seen++;
    }
    vase_admin_events_free(ev);
    return r;
}

static int parse_id(const char *what, const char *s, uint32_t *ret) {
    long long v;
    if (parse_ll(s, 0, UINT32_MAX, &v) < 0) {
        return vasectl_fail(-EINVAL, "invalid %s '%s': expected a number 0 .. %u", what, s,
                            UINT32_MAX);
    }
    *ret = (uint32_t)v;
    return 0;
}

/* Whether the n words after command cmd (args) are right for it; seq and seqs put their id in
 * *ret_id. 1 or 0; -EINVAL after saying what is wrong with an id; -ENOENT: no such command. */
static int words_fit(const char *cmd, int n, char **args, uint32_t *ret_id) {
    if (strcmp(cmd, "status") == 0 || strcmp(cmd, "clients") == 0 || strcmp(cmd, "ping") == 0 ||
        strcmp(cmd, "events") == 0 || strcmp(cmd, "top") == 0)
        return n == 0;
    if (strcmp(cmd, "seqs") == 0 || strcmp(cmd, "seq") == 0) {
        bool one = strcmp(cmd, "seq") == 0;
        if (one ? n != 1 : n > 1)
            return 0;
        /* A bad number has its own message; it is still a usage error. */
        if (n == 1 && parse_id(one ? "sequence id" : "client id", args[0], ret_id) < 0)
            return -EINVAL;
        return 1;
    }
    if (strcmp(cmd, "config") == 0)
        return (n >= 1 && strcmp(args[0], "get") == 0 && n <= 2) ||
               (n == 3 && strcmp(args[0], "set") == 0);
    if (strcmp(cmd, "size") == 0)
        return n >= 1 && n < MAX_WORDS;
    if (strcmp(cmd, "reload") == 0)
        return n <= 1;
    return -ENOENT;
}

/* Whether the options given apply to command cmd (its words args). 0, or -EINVAL after saying
 * which does not. */
static int options_fit(const char *cmd, char **args) {
    if (arg_count >= 0 && strcmp(cmd, "events") != 0)
        return vasectl_fail(-EINVAL, "--count applies to 'events' only");
    if (arg_persist && !(strcmp(cmd, "config") == 0 && strcmp(args[0], "set") == 0))
        return vasectl_fail(-EINVAL, "--persist applies to 'config set' only");
    if ((arg_iterations >= 0 || arg_interval > 0) && strcmp(cmd, "top") != 0)
        return vasectl_fail(-EINVAL, "--interval and --iterations apply to 'top' only");
    return 0;
}

/* Checks the command's words before any socket is opened, so that usage errors are usage
 * errors. 0 (and the id of seq or seqs in *ret_id), or -EINVAL after saying what is wrong. */
static int check_words(uint32_t *ret_id) {
    const char *cmd = arg_command[0];
    int ok = words_fit(cmd, arg_n_command - 1, arg_command + 1, ret_id);

    if (ok == -ENOENT)
        return vasectl_fail(-EINVAL, "unknown command '%s' " HINT, cmd);
    if (ok < 0)
        return ok;
    if (!ok)
        return vasectl_fail(-EINVAL, "wrong arguments for '%s' " HINT, cmd);
    return options_fit(cmd, arg_command + 1);
}

/* The live view, or snapshots when stdout is not a terminal (vasectl_top.c). It may replace
 * *a when the daemon went away and came back. */
static int cmd_top(struct vase_admin **a) {
    struct vasectl_top_options o = {
        .admin = {.runtime_dir = arg_runtime_dir, .timeout_ms = arg_timeout_ms},
        .interval = arg_interval > 0 ? arg_interval : 1,
        .iterations = arg_iterations,
        .json = arg_json,
    };
    char err[1024];

    int r = vasectl_top(a, &o, err, sizeof(err));
    if (r < 0)
        return vasectl_fail(r, "%s", err);
    return 0;
}

/* Runs the checked command. */
static int dispatch(struct vase_admin **ap, uint32_t id) {
    struct vase_admin *a = *ap;
    const char *cmd = arg_command[0];
    int n = arg_n_command - 1;
    char **args = arg_command + 1;

    if (strcmp(cmd, "status") == 0)
        return vasectl_show_status(a, arg_json);
    if (strcmp(cmd, "clients") == 0)
        return vasectl_show_clients(a, arg_json);
    if (strcmp(cmd, "seqs") == 0)
        return vasectl_show_seqs(a, id, arg_json);
    if (strcmp(cmd, "seq") == 0)
        return vasectl_show_seq(a, id, arg_json);
    if (strcmp(cmd, "ping") == 0)
        return cmd_ping(a);
    if (strcmp(cmd, "events") == 0)
        return cmd_events(a);
    if (strcmp(cmd, "top") == 0)
        return cmd_top(ap);
    if (strcmp(args[0], "get") == 0)
        return vasectl_show_config(a, n == 2 ? args[1] : NULL, arg_json);
    return cmd_config_set(a, args[1], args[2]);
}

/* SIGHUP to vased at pid (its own words, else $MAINPID, as systemd sets it for ExecReload=),
 * carrying VASE_RELOAD_SIGVAL (vase_admin.h). A pid that is not vased's is refused: SIGHUP ends
 * most programs. */
static int cmd_reload(const char *word) {
    const char *text = word ? word : getenv("MAINPID");
    if (!text || !text[0])
        return vasectl_fail(
            -EINVAL, "reload: give vased's pid (systemd sets $MAINPID for ExecReload=) " HINT);
    char *end;
    errno = 0;
    long pid = strtol(text, &end, 10);
    if (errno || *end || end == text || pid <= 0 || pid > INT_MAX)
        return vasectl_fail(-EINVAL, "reload: '%.64s' is not a pid " HINT, text);
    char path[64], comm[32] = "";
    snprintf(path, sizeof(path), "/proc/%ld/comm", pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return vasectl_fail(-errno, "reload: no process %ld: %s", pid, strerror(errno));
    if (!fgets(comm, sizeof(comm), f))
        comm[0] = '\0';
    fclose(f);
    comm[strcspn(comm, "\n")] = '\0';
    if (strcmp(comm, "vased") != 0)
        return vasectl_fail(-ESRCH, "reload: process %ld is not vased (it is '%s')", pid, comm);
    union sigval v = {.sival_int = VASE_RELOAD_SIGVAL};
    /* systemd sets INVOCATION_ID in the environment of the unit's processes. */
    const char *inv = getenv("INVOCATION_ID");
    if (inv && inv[0])
        v.sival_int |= VASE_RELOAD_FROM_UNIT;
    if (sigqueue((pid_t)pid, SIGHUP, v) < 0)
        return vasectl_fail(-errno, "reload: cannot signal vased (pid %ld): %s", pid,
                            strerror(errno));
    return 0;
}

/* Exit status: 0 done, 1 the daemon or the system said no, 2 usage. */
static int run(void) {
    struct vase_admin *a;
    uint32_t id = 0;
    int r;

    if (check_words(&id) < 0)
        return 2;
    if (strcmp(arg_command[0], "size") == 0) {
        /* Computed here, by the daemon's code: no daemon to reach. A word it refuses is a usage
         * error. */
        char err[512];
        r = vasectl_size(arg_command + 1, arg_n_command - 1, arg_json, err, sizeof(err));
        if (r < 0) {
            vasectl_fail(r, "%s", err);
            return r == -EINVAL ? 2 : 1;
        }
        return fflush(stdout) == 0 ? 0 : 1;
    }
    if (strcmp(arg_command[0], "reload") == 0) {
        r = cmd_reload(arg_n_command > 1 ? arg_command[1] : NULL);
        return r == -EINVAL ? 2 : r < 0 ? 1 : 0;
    }
    r = ctl_open(&a);
    if (r < 0)
        return 1;
    r = dispatch(&a, id);
    vase_admin_free(a);
    if (fflush(stdout) != 0 && r == 0) {
        int e = errno ? errno : EIO;
        r = vasectl_fail(-e, "cannot write output: %s", strerror(e));
    }
    return r < 0 ? 1 : 0;
}

int main(int argc, char *argv[]) {
    /* --json anywhere before "--" makes even a usage error found before it JSON. */
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
        if (strcmp(argv[i], "--json") == 0)
            arg_json = true;
    int r = parse_argv(argc, argv);
    if (r <= 0)
        return r < 0 ? 2 : 0;
    return run();
}
