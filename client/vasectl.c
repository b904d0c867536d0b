/* SPDX-License-Identifier: MIT */

/*
 * vasectl: shows and tunes a running vased. It speaks the admin subset of the control protocol
 * (PROTOCOL.md: Ping, Status, ListClients, ListSeqs, GetSeq, ConfigGet, ConfigSet) over a plain
 * DEALER with a random routing id and incarnation 0, and follows the event stream over a SUB
 * socket. It holds no session and maps no memory: access to the socket files is the permission.
 *
 * Output is an aligned table for people, or with --json one JSON document per command (one per
 * line for events) produced from the protobuf descriptors, so every field of the schema shows up
 * without this file having to list it.
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
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "chan.h"
#include "session.h"
#include "vase.h"
#include "wire.h"

#define DEFAULT_TIMEOUT_MS 5000

static const char *arg_runtime_dir = NULL;
static bool arg_json = false;
static int arg_timeout_ms = DEFAULT_TIMEOUT_MS;
static long long arg_count = -1; /* events to print; -1: until SIGINT */
/* The command words: at most four are ever valid ("config set KEY VALUE"); more are counted so
 * that run() can refuse them. */
#define MAX_WORDS 4
static char *arg_command[MAX_WORDS];
static int arg_n_command = 0;

static volatile sig_atomic_t interrupted = 0;

/* ---- small helpers ---- */

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
           "                         also when it starts with '-': config set default_slack -1)\n"
           "  events                 follow the event stream until interrupted\n"
           "  ping                   round trip to the daemon\n"
           "\n"
           "Options:\n"
           "  -h --help              show this help\n"
           "     --runtime-dir=DIR   vased's runtime directory (default: $VASE_RUNTIME_DIR,\n"
           "                         else /run/vase if it exists, else ./run)\n"
           "     --json              print JSON instead of tables\n"
           "     --timeout=MS        bound on each wait for the daemon (default %d)\n"
           "     --count=N           events: stop after N events\n"
           "\n"
           "Options may come before, between or after the command's words; '--' ends them.\n",
           program_invocation_short_name, DEFAULT_TIMEOUT_MS);
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
    enum { ARG_RUNTIME_DIR = 0x100, ARG_JSON, ARG_TIMEOUT, ARG_COUNT };
    static const struct option options[] = {
        {"help", no_argument, NULL, 'h'},
        {"runtime-dir", required_argument, NULL, ARG_RUNTIME_DIR},
        {"json", no_argument, NULL, ARG_JSON},
        {"timeout", required_argument, NULL, ARG_TIMEOUT},
        {"count", required_argument, NULL, ARG_COUNT},
        {},
    };
    bool options_ended = false;
    long long v;

    while (optind < argc) {
        if (options_ended || value_due()) {
            add_word(argv[optind++]);
            continue;
        }
        int at = optind;
        int c = getopt_long(argc, argv, "+h", options, NULL);
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
        case ARG_RUNTIME_DIR:
            if (!*optarg) {
                fprintf(stderr, "vasectl: --runtime-dir must not be empty\n");
                return -EINVAL;
            }
            arg_runtime_dir = optarg;
            break;
        case ARG_JSON:
            arg_json = true;
            break;
        case ARG_TIMEOUT:
            if (parse_ll(optarg, 1, INT_MAX, &v) < 0) {
                fprintf(stderr, "vasectl: invalid --timeout '%s': expected milliseconds, 1 .. %d\n",
                        optarg, INT_MAX);
                return -EINVAL;
            }
            arg_timeout_ms = (int)v;
            break;
        case ARG_COUNT:
            if (parse_ll(optarg, 0, LLONG_MAX, &v) < 0) {
                fprintf(stderr, "vasectl: invalid --count '%s': expected a number >= 0\n", optarg);
                return -EINVAL;
            }
            arg_count = v;
            break;
        case '?':
            return -EINVAL; /* getopt_long has said what is wrong */
        default:
            return -EINVAL;
        }
    }
    if (arg_n_command == 0) {
        fprintf(stderr, "vasectl: no command given (try --help)\n");
        return -EINVAL;
    }
    return 1;
}

/* ---- JSON ---- */

/* Writes s as a JSON string: quotes, backslashes and control characters escaped; invalid UTF-8
 * replaced by U+FFFD, so the output always parses. */
static void json_string(FILE *f, const char *s, size_t len) {
    const unsigned char *p = (const unsigned char *)s;
    fputc('"', f);
    for (size_t i = 0; i < len;) {
        unsigned char ch = p[i];
        if (ch == '"' || ch == '\\') {
            fprintf(f, "\\%c", ch);
            i++;
        } else if (ch == '\n') {
            fputs("\\n", f);
            i++;
        } else if (ch == '\t') {
            fputs("\\t", f);
            i++;
        } else if (ch < 0x20 || ch == 0x7f) {
            fprintf(f, "\\u%04x", ch);
            i++;
        } else if (ch < 0x80) {
            fputc(ch, f);
            i++;
        } else {
            /* The length of a UTF-8 sequence and the range its second byte must be in (which
             * rules out overlong forms, surrogates and values past U+10FFFF). */
            size_t n = 0;
            unsigned char lo = 0x80, hi = 0xbf;
            if (ch >= 0xc2 && ch <= 0xdf)
                n = 2;
            else if (ch >= 0xe0 && ch <= 0xef) {
                n = 3;
                lo = ch == 0xe0 ? 0xa0 : 0x80;
                hi = ch == 0xed ? 0x9f : 0xbf;
            } else if (ch >= 0xf0 && ch <= 0xf4) {
                n = 4;
                lo = ch == 0xf0 ? 0x90 : 0x80;
                hi = ch == 0xf4 ? 0x8f : 0xbf;
            }
            bool ok = n > 0 && i + n <= len && p[i + 1] >= lo && p[i + 1] <= hi;
            for (size_t k = 2; ok && k < n; k++)
                ok = p[i + k] >= 0x80 && p[i + k] <= 0xbf;
            if (ok) {
                fwrite(p + i, 1, n, f);
                i += n;
            } else {
                fputs("\\ufffd", f);
                i++;
            }
        }
    }
    fputc('"', f);
}

static void json_double(FILE *f, double d) {
    if (isfinite(d))
        fprintf(f, "%.17g", d);
    else
        fputs("null", f); /* JSON has no NaN or infinity */
}

/* An enum value's name without its type prefix, lowercased: MODE_ASYNC -> "async". */
static void json_enum(FILE *f, const ProtobufCEnumDescriptor *d, int value) {
    const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(d, value);
    if (!v) {
        fprintf(f, "%d", value);
        return;
    }
    const char *name = v->name;
    const char *u = strchr(name, '_');
    if (u && u[1])
        name = u + 1;
    char buf[64];
    size_t n = 0;
    for (; name[n] && n < sizeof(buf) - 1; n++)
        buf[n] = (char)((name[n] >= 'A' && name[n] <= 'Z') ? name[n] - 'A' + 'a' : name[n]);
    json_string(f, buf, n);
}

static void json_message(FILE *f, const ProtobufCMessage *m);

static void json_value(FILE *f, const ProtobufCFieldDescriptor *fd, const void *p) {
    switch (fd->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        fprintf(f, "%" PRId32, *(const int32_t *)p);
        break;
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        fprintf(f, "%" PRIu32, *(const uint32_t *)p);
        break;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        fprintf(f, "%" PRId64, *(const int64_t *)p);
        break;
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        /* The incarnation is an identifier, and above 2^53 many JSON readers round numbers. */
        if (strcmp(fd->name, "incarnation") == 0)
            fprintf(f, "\"0x%016" PRIx64 "\"", *(const uint64_t *)p);
        else
            fprintf(f, "%" PRIu64, *(const uint64_t *)p);
        break;
    case PROTOBUF_C_TYPE_FLOAT:
        json_double(f, *(const float *)p);
        break;
    case PROTOBUF_C_TYPE_DOUBLE:
        json_double(f, *(const double *)p);
        break;
    case PROTOBUF_C_TYPE_BOOL:
        fputs(*(const protobuf_c_boolean *)p ? "true" : "false", f);
        break;
    case PROTOBUF_C_TYPE_ENUM:
        json_enum(f, fd->descriptor, *(const int *)p);
        break;
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(char *const *)p;
        s = s ? s : "";
        json_string(f, s, strlen(s));
        break;
    }
    case PROTOBUF_C_TYPE_BYTES: {
        const ProtobufCBinaryData *b = p;
        fputc('"', f);
        for (size_t i = 0; i < b->len; i++)
            fprintf(f, "%02x", b->data[i]);
        fputc('"', f);
        break;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *sub = *(ProtobufCMessage *const *)p;
        if (sub)
            json_message(f, sub);
        else
            fputs("null", f);
        break;
    }
    }
}

static size_t value_size(const ProtobufCFieldDescriptor *fd) {
    switch (fd->type) {
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE:
        return 8;
    case PROTOBUF_C_TYPE_STRING:
    case PROTOBUF_C_TYPE_MESSAGE:
        return sizeof(void *);
    case PROTOBUF_C_TYPE_BYTES:
        return sizeof(ProtobufCBinaryData);
    case PROTOBUF_C_TYPE_BOOL:
        return sizeof(protobuf_c_boolean);
    default:
        return 4;
    }
}

/* Every field of m, by the descriptor, as the members of a JSON object (no braces; a comma
 * first unless first): repeated fields as arrays, a oneof only for its set member, proto3
 * scalars always (zero is a value worth showing in a status). */
static void json_fields(FILE *f, const ProtobufCMessage *m, bool first) {
    const ProtobufCMessageDescriptor *d = m->descriptor;
    const char *base = (const char *)m;

    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *fd = &d->fields[i];
        if (fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            uint32_t which = *(const uint32_t *)(base + fd->quantifier_offset);
            if (which != fd->id)
                continue;
        }
        fprintf(f, "%s\"%s\":", first ? "" : ",", fd->name);
        first = false;
        if (fd->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(base + fd->quantifier_offset);
            const char *arr = *(char *const *)(base + fd->offset);
            size_t sz = value_size(fd);
            fputc('[', f);
            for (size_t k = 0; k < n; k++) {
                if (k)
                    fputc(',', f);
                json_value(f, fd, arr + k * sz);
            }
            fputc(']', f);
        } else
            json_value(f, fd, base + fd->offset);
    }
}

static void json_message(FILE *f, const ProtobufCMessage *m) {
    fputc('{', f);
    json_fields(f, m, true);
    fputc('}', f);
}

/* ---- tables ---- */

#define MAX_COLS 16

/* Rows of formatted cells, printed with every column as wide as its widest cell. A header that
 * starts with '>' marks a right-aligned (numeric) column. */
struct table {
    size_t ncols;
    const char *headers[MAX_COLS];
    char **cells;
    size_t n, cap;
};

static int table_add(struct table *t, const char *fmt, ...) {
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        char **cells = realloc(t->cells, cap * sizeof(*cells));
        if (!cells)
            return -ENOMEM;
        t->cells = cells;
        t->cap = cap;
    }
    va_list ap;
    va_start(ap, fmt);
    int r = vasprintf(&t->cells[t->n], fmt, ap);
    va_end(ap);
    if (r < 0)
        return -ENOMEM;
    /* Names come from clients: keep control characters out of the terminal. */
    for (char *p = t->cells[t->n]; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = '?';
    t->n++;
    return 0;
}

static void table_print(const struct table *t) {
    size_t width[MAX_COLS] = {0};
    for (size_t c = 0; c < t->ncols; c++)
        width[c] = strlen(t->headers[c] + (t->headers[c][0] == '>'));
    for (size_t i = 0; i < t->n; i++) {
        size_t w = strlen(t->cells[i]);
        if (w > width[i % t->ncols])
            width[i % t->ncols] = w;
    }
    for (size_t row = 0; row <= t->n / t->ncols; row++) {
        if (row > 0 && (row - 1) * t->ncols >= t->n)
            break;
        for (size_t c = 0; c < t->ncols; c++) {
            const char *h = t->headers[c];
            bool right = h[0] == '>';
            const char *s = row == 0 ? h + right : t->cells[(row - 1) * t->ncols + c];
            bool last = c + 1 == t->ncols;
            if (right)
                printf("%*s%s", (int)width[c], s, last ? "" : "  ");
            else if (last)
                printf("%s", s);
            else
                printf("%-*s  ", (int)width[c], s);
        }
        putchar('\n');
    }
}

static void table_free(struct table *t) {
    for (size_t i = 0; i < t->n; i++)
        free(t->cells[i]);
    free(t->cells);
}

static const char *fmt_bytes(uint64_t b, char *buf, size_t size) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    unsigned u = 0;
    while (v >= 1024 && u + 1 < sizeof(units) / sizeof(units[0])) {
        v /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, size, "%" PRIu64 " B", b);
    else
        snprintf(buf, size, "%.1f %s", v, units[u]);
    return buf;
}

static const char *fmt_duration(double s, char *buf, size_t size) {
    if (!(s >= 0))
        s = 0;
    uint64_t t = (uint64_t)s;
    if (t >= 86400)
        snprintf(buf, size, "%" PRIu64 "d %02" PRIu64 "h %02" PRIu64 "m", t / 86400,
                 t % 86400 / 3600, t % 3600 / 60);
    else if (t >= 3600)
        snprintf(buf, size, "%" PRIu64 "h %02" PRIu64 "m %02" PRIu64 "s", t / 3600, t % 3600 / 60,
                 t % 60);
    else if (t >= 60)
        snprintf(buf, size, "%" PRIu64 "m %02" PRIu64 "s", t / 60, t % 60);
    else
        snprintf(buf, size, "%.1fs", s);
    return buf;
}

static const char *mode_name(Vase__Mode m) {
    return m == VASE__MODE__MODE_SYNC ? "sync" : "async";
}

/* ---- talking to the daemon ---- */

struct ctl {
    char dir[PATH_MAX];
    char path[PATH_MAX + 32]; /* control.sock, for messages */
    struct vase__chan *chan;
};

static int ctl_open(struct ctl *ctl) {
    char endpoint[PATH_MAX + 64], abs[PATH_MAX];
    struct stat st;
    int r;

    r = vase__runtime_dir(arg_runtime_dir, ctl->dir, sizeof(ctl->dir));
    if (r < 0) {
        fprintf(stderr, "vasectl: runtime directory name too long\n");
        return r;
    }
    snprintf(ctl->path, sizeof(ctl->path), "%s/control.sock", ctl->dir);
    /* ZeroMQ connects in the background and would only time out: find the usual reasons first,
     * so the message says what is wrong. */
    if (stat(ctl->path, &st) < 0 || access(ctl->path, R_OK | W_OK) < 0) {
        r = -errno;
        fprintf(stderr, "vasectl: cannot reach vased at %s: %s\n", ctl->path, strerror(-r));
        return r;
    }
    if (!S_ISSOCK(st.st_mode)) {
        fprintf(stderr, "vasectl: cannot reach vased at %s: not a socket\n", ctl->path);
        return -ENOTSOCK;
    }
    const char *dir = realpath(ctl->dir, abs) ? abs : ctl->dir;
    snprintf(endpoint, sizeof(endpoint), "ipc://%s/control.sock", dir);
    struct vase__chan_options o = {
        .endpoint = endpoint,
        .timeout_ms = arg_timeout_ms,
        .session_fd = -1,
    };
    r = vase__chan_new(&o, &ctl->chan);
    if (r < 0) {
        fprintf(stderr, "vasectl: cannot reach vased at %s: %s\n", ctl->path, vase_strerror(r));
        return r;
    }
    return 0;
}

static void ctl_close(struct ctl *ctl) {
    ctl->chan = vase__chan_free(ctl->chan);
}

/* One request, one reply of body case expect. Errors are reported here, with the daemon's own
 * message when it sent one. */
static int ctl_call(struct ctl *ctl, const char *what, Vase__Envelope *e,
                    Vase__Envelope__BodyCase expect, Vase__Envelope **ret) {
    Vase__Envelope *reply;
    uint64_t id;

    int r = vase__chan_send(ctl->chan, e, &id);
    if (r == 0)
        r = vase__chan_wait(ctl->chan, id, -1, &reply);
    if (r == -ETIMEDOUT) {
        fprintf(stderr, "vasectl: cannot reach vased at %s: no reply within %d ms\n", ctl->path,
                arg_timeout_ms);
        return r;
    }
    if (r < 0) {
        fprintf(stderr, "vasectl: %s: %s\n", what, vase_strerror(r));
        return r;
    }
    if (reply->body_case == VASE__ENVELOPE__BODY_ERROR) {
        r = vase__error_code(reply->error);
        if (*reply->error->message)
            fprintf(stderr, "vasectl: %s: %s (%s)\n", what, reply->error->message,
                    vase_strerror(r));
        else
            fprintf(stderr, "vasectl: %s: %s\n", what, vase_strerror(r));
        vase__envelope__free_unpacked(reply, NULL);
        return r;
    }
    if (reply->body_case != expect) {
        fprintf(stderr, "vasectl: %s: unexpected reply '%s' from vased\n", what,
                vase_wire_body_name(reply));
        vase__envelope__free_unpacked(reply, NULL);
        return -EPROTO;
    }
    *ret = reply;
    return 0;
}

static void print_json_line(const ProtobufCMessage *m) {
    json_message(stdout, m);
    putchar('\n');
}

/* ---- commands ---- */

static int cmd_ping(struct ctl *ctl) {
    Vase__Ping ping = VASE__PING__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    Vase__Envelope *reply;
    struct timespec t0, t1;

    e.body_case = VASE__ENVELOPE__BODY_PING;
    e.ping = &ping;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int r = ctl_call(ctl, "ping", &e, VASE__ENVELOPE__BODY_PONG, &reply);
    if (r < 0)
        return r;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    if (arg_json)
        printf("{\"ok\":true,\"incarnation\":\"0x%016" PRIx64 "\",\"rtt_ms\":%.3f}\n",
               reply->incarnation, ms);
    else
        printf("pong from vased at %s (incarnation %016" PRIx64 ") in %.3f ms\n", ctl->path,
               reply->incarnation, ms);
    vase__envelope__free_unpacked(reply, NULL);
    return 0;
}

static int cmd_status(struct ctl *ctl) {
    Vase__Status st = VASE__STATUS__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    Vase__Envelope *reply;
    struct table t = {.ncols = 8,
                      .headers = {">ARENA", "NAME", "KIND", ">PAGE", ">PAGES", ">FREE", ">USED",
                                  "SIZE"}};
    char b1[32], b2[32];
    int r;

    e.body_case = VASE__ENVELOPE__BODY_STATUS;
    e.status = &st;
    r = ctl_call(ctl, "status", &e, VASE__ENVELOPE__BODY_STATUS_REPLY, &reply);
    if (r < 0)
        return r;
    const Vase__StatusReply *s = reply->status_reply;
    if (arg_json) {
        print_json_line(&s->base);
        goto out;
    }
    printf("vased %s, incarnation %016" PRIx64 ", up %s\n", s->version, s->incarnation,
           fmt_duration(s->uptime_seconds, b1, sizeof(b1)));
    printf("clients %" PRIu32 ", sequences %" PRIu32 ", evictions %" PRIu64 " (%" PRIu32
           " in flight)\n",
           s->clients, s->seqs, s->evictions_total, s->evictions_in_flight);
    printf("plans queued %" PRIu32 " (%" PRIu32 " clients waiting, served in turn), "
           "running %" PRIu32 "\n",
           s->plans_queued, s->clients_waiting, s->plans_running);
    printf("requests %" PRIu64 ", errors %" PRIu64 ", stats messages %" PRIu64 "\n\n",
           s->requests_total, s->errors_total, s->stats_messages_total);
    for (size_t i = 0; i < s->n_arenas && r == 0; i++) {
        const Vase__ArenaStatus *a = s->arenas[i];
        double used = a->pages_total
                          ? 100.0 * (double)(a->pages_total - a->pages_free) / a->pages_total
                          : 0.0;
        if ((r = table_add(&t, "%" PRIu32, a->id)) < 0 || (r = table_add(&t, "%s", a->name)) < 0 ||
            (r = table_add(&t, "%s", a->kind)) < 0 ||
            (r = table_add(&t, "%s", fmt_bytes(a->page_bytes, b1, sizeof(b1)))) < 0 ||
            (r = table_add(&t, "%" PRIu32, a->pages_total)) < 0 ||
            (r = table_add(&t, "%" PRIu32, a->pages_free)) < 0 ||
            (r = table_add(&t, "%.1f%%", used)) < 0 ||
            (r = table_add(&t, "%s",
                           fmt_bytes((uint64_t)a->pages_total * a->page_bytes, b2, sizeof(b2)))) <
                0)
            break;
    }
    if (r == 0 && s->n_arenas)
        table_print(&t);
    else if (r == 0)
        printf("no arena is open to this uid\n");
out:
    table_free(&t);
    vase__envelope__free_unpacked(reply, NULL);
    if (r < 0)
        fprintf(stderr, "vasectl: status: %s\n", vase_strerror(r));
    return r;
}

static int cmd_clients(struct ctl *ctl) {
    Vase__ListClients lc = VASE__LIST_CLIENTS__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    Vase__Envelope *reply;
    struct table t = {.ncols = 9,
                      .headers = {">ID", "NAME", ">PID", ">UID", ">GID", ">PAGES", ">SEQS",
                                  ">MODELS", "CONNECTED"}};
    char b[32], name[4 * 256 + 1];
    int r;

    e.body_case = VASE__ENVELOPE__BODY_LIST_CLIENTS;
    e.list_clients = &lc;
    r = ctl_call(ctl, "clients", &e, VASE__ENVELOPE__BODY_CLIENTS_REPLY, &reply);
    if (r < 0)
        return r;
    const Vase__ClientsReply *cr = reply->clients_reply;
    if (arg_json) {
        print_json_line(&cr->base);
        goto out;
    }
    for (size_t i = 0; i < cr->n_clients && r == 0; i++) {
        const Vase__ClientInfo *c = cr->clients[i];
        /* A client chose its name: no terminal control sequences from it. */
        vase_wire_escape(c->name, name, sizeof(name));
        if ((r = table_add(&t, "%" PRIu32, c->client_id)) < 0 ||
            (r = table_add(&t, "%s", name)) < 0 || (r = table_add(&t, "%" PRIu32, c->pid)) < 0 ||
            (r = table_add(&t, "%" PRIu32, c->uid)) < 0 ||
            (r = table_add(&t, "%" PRIu32, c->gid)) < 0 ||
            (r = table_add(&t, "%" PRIu32, c->pages)) < 0 ||
            (r = table_add(&t, "%" PRIu32, c->seqs)) < 0 ||
            (r = table_add(&t, "%" PRIu32, c->models)) < 0 ||
            (r = table_add(&t, "%s", fmt_duration(c->connected_seconds, b, sizeof(b)))) < 0)
            break;
    }
    if (r == 0) {
        if (cr->n_clients)
            table_print(&t);
        else
            printf("no clients\n");
    }
out:
    table_free(&t);
    vase__envelope__free_unpacked(reply, NULL);
    if (r < 0)
        fprintf(stderr, "vasectl: clients: %s\n", vase_strerror(r));
    return r;
}

static int cmd_seqs(struct ctl *ctl, uint32_t client_id) {
    Vase__ListSeqs ls = VASE__LIST_SEQS__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    Vase__Envelope *reply;
    struct table t = {.ncols = 15,
                      .headers = {">ID", ">CLIENT", ">ARENA", ">MODEL", "POLICY", "MODE", ">BUDGET",
                                  ">WINDOW", ">LEN", ">CAPACITY", ">PAGES", ">ROUNDS", ">POSITION",
                                  "STATE", ">LAST PLAN"}};
    int r;

    ls.client_id = client_id;
    e.body_case = VASE__ENVELOPE__BODY_LIST_SEQS;
    e.list_seqs = &ls;
    r = ctl_call(ctl, "seqs", &e, VASE__ENVELOPE__BODY_SEQS_REPLY, &reply);
    if (r < 0)
        return r;
    const Vase__SeqsReply *sr = reply->seqs_reply;
    if (arg_json) {
        print_json_line(&sr->base);
        goto out;
    }
    for (size_t i = 0; i < sr->n_seqs && r == 0; i++) {
        const Vase__SeqInfo *s = sr->seqs[i];
        if ((r = table_add(&t, "%" PRIu32, s->seq_id)) < 0 ||
            (r = table_add(&t, "%" PRIu32, s->client_id)) < 0 ||
            (r = table_add(&t, "%" PRIu32, s->arena_id)) < 0 ||
            (r = table_add(&t, "%" PRIu32, s->model_id)) < 0 ||
            (r = table_add(&t, "%s", s->policy)) < 0 ||
            (r = table_add(&t, "%s", mode_name(s->mode))) < 0 ||
            (r = table_add(&t, "%" PRIu32, s->budget)) < 0 ||
            (r = table_add(&t, "%" PRIu32, s->window)) < 0 ||
            (r = table_add(&t, "%" PRIu32, s->len)) < 0 ||
            (r = table_add(&t, "%" PRIu32, s->capacity)) < 0 ||
            (r = table_add(&t, "%" PRIu32, s->pages)) < 0 ||
            (r = table_add(&t, "%" PRIu32, s->rounds)) < 0 ||
            (r = table_add(&t, "%" PRIu64, s->position)) < 0 ||
            (r = table_add(&t, "%s", s->state)) < 0 ||
            (r = table_add(&t, "%.3f ms", s->last_plan_seconds * 1e3)) < 0)
            break;
    }
    if (r == 0) {
        if (sr->n_seqs)
            table_print(&t);
        else
            printf("no sequences\n");
    }
out:
    table_free(&t);
    vase__envelope__free_unpacked(reply, NULL);
    if (r < 0)
        fprintf(stderr, "vasectl: seqs: %s\n", vase_strerror(r));
    return r;
}

static int cmd_seq(struct ctl *ctl, uint32_t id) {
    Vase__GetSeq gs = VASE__GET_SEQ__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    Vase__Envelope *reply;
    char what[32];

    snprintf(what, sizeof(what), "seq %" PRIu32, id);
    gs.seq_id = id;
    e.body_case = VASE__ENVELOPE__BODY_GET_SEQ;
    e.get_seq = &gs;
    int r = ctl_call(ctl, what, &e, VASE__ENVELOPE__BODY_SEQ_INFO, &reply);
    if (r < 0)
        return r;
    const Vase__SeqInfo *s = reply->seq_info;
    if (arg_json)
        print_json_line(&s->base);
    else {
        printf("sequence    %" PRIu32 "\n", s->seq_id);
        printf("client      %" PRIu32 "\n", s->client_id);
        printf("model       %" PRIu32 "\n", s->model_id);
        printf("policy      %s (%s)\n", s->policy, mode_name(s->mode));
        printf("budget      %" PRIu32 ", window %" PRIu32 "\n", s->budget, s->window);
        printf("len         %" PRIu32 " of %" PRIu32 " slots (%" PRIu32 " pages)\n", s->len,
               s->capacity, s->pages);
        printf("position    %" PRIu64 "\n", s->position);
        printf("rounds      %" PRIu32 ", last plan %.3f ms\n", s->rounds,
               s->last_plan_seconds * 1e3);
        printf("state       %s\n", s->state);
    }
    vase__envelope__free_unpacked(reply, NULL);
    return 0;
}

static int print_config(const Vase__ConfigReply *cr, bool single) {
    struct table t = {.ncols = 5, .headers = {"KEY", "VALUE", "DEFAULT", "RUNTIME", "DESCRIPTION"}};
    int r = 0;

    if (arg_json) {
        print_json_line(&cr->base);
        return 0;
    }
    /* One setting asked for by name: its bare value, for scripts. */
    if (single && cr->n_entries == 1) {
        printf("%s\n", cr->entries[0]->value);
        return 0;
    }
    for (size_t i = 0; i < cr->n_entries && r == 0; i++) {
        const Vase__ConfigEntry *c = cr->entries[i];
        if ((r = table_add(&t, "%s", c->key)) < 0 || (r = table_add(&t, "%s", c->value)) < 0 ||
            (r = table_add(&t, "%s", c->default_value)) < 0 ||
            (r = table_add(&t, "%s", c->runtime ? "yes" : "no")) < 0 ||
            (r = table_add(&t, "%s", c->description)) < 0)
            break;
    }
    if (r == 0)
        table_print(&t);
    else
        fprintf(stderr, "vasectl: config: %s\n", vase_strerror(r));
    table_free(&t);
    return r;
}

static int cmd_config_get(struct ctl *ctl, const char *key) {
    Vase__ConfigGet cg = VASE__CONFIG_GET__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    Vase__Envelope *reply;
    char what[300];

    snprintf(what, sizeof(what), "config get%s%.256s", key ? " " : "", key ? key : "");
    cg.key = (char *)(key ? key : "");
    e.body_case = VASE__ENVELOPE__BODY_CONFIG_GET;
    e.config_get = &cg;
    int r = ctl_call(ctl, what, &e, VASE__ENVELOPE__BODY_CONFIG_REPLY, &reply);
    if (r < 0)
        return r;
    r = print_config(reply->config_reply, key != NULL);
    vase__envelope__free_unpacked(reply, NULL);
    return r;
}

static int cmd_config_set(struct ctl *ctl, const char *key, const char *value) {
    Vase__ConfigSet cs = VASE__CONFIG_SET__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    Vase__Envelope *reply;
    char what[300];

    snprintf(what, sizeof(what), "config set %.256s", key);
    cs.key = (char *)key;
    cs.value = (char *)value;
    e.body_case = VASE__ENVELOPE__BODY_CONFIG_SET;
    e.config_set = &cs;
    int r = ctl_call(ctl, what, &e, VASE__ENVELOPE__BODY_CONFIG_REPLY, &reply);
    if (r < 0)
        return r;
    const Vase__ConfigReply *cr = reply->config_reply;
    if (arg_json)
        print_json_line(&cr->base);
    else
        for (size_t i = 0; i < cr->n_entries; i++)
            printf("%s = %s\n", cr->entries[i]->key, cr->entries[i]->value);
    vase__envelope__free_unpacked(reply, NULL);
    return 0;
}

static void print_event(const char *topic, const Vase__Event *ev) {
    if (arg_json) {
        /* The Event's own fields, after the topic it came under. */
        fputs("{\"topic\":", stdout);
        json_string(stdout, topic, strlen(topic));
        json_fields(stdout, &ev->base, false);
        fputs("}\n", stdout);
        return;
    }

    char when[64];
    time_t secs = (time_t)ev->time;
    struct tm tm;
    if (localtime_r(&secs, &tm))
        strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
    else
        snprintf(when, sizeof(when), "%.3f", ev->time);
    printf("%s.%03d  %-8s ", when, (int)((ev->time - floor(ev->time)) * 1000), topic);

    switch (ev->body_case) {
    case VASE__EVENT__BODY_CLIENT_JOIN:
    case VASE__EVENT__BODY_CLIENT_LEAVE: {
        const Vase__ClientInfo *c =
            ev->body_case == VASE__EVENT__BODY_CLIENT_JOIN ? ev->client_join : ev->client_leave;
        char name[4 * 256 + 1];
        vase_wire_escape(c->name, name, sizeof(name));
        printf("%s client %" PRIu32 " '%s'",
               ev->body_case == VASE__EVENT__BODY_CLIENT_JOIN ? "join " : "leave", c->client_id,
               name);
        printf(" pid %" PRIu32 " uid %" PRIu32 " pages %" PRIu32 "\n", c->pid, c->uid, c->pages);
        break;
    }
    case VASE__EVENT__BODY_SEQ_OPEN:
    case VASE__EVENT__BODY_SEQ_CLOSE: {
        const Vase__SeqInfo *s =
            ev->body_case == VASE__EVENT__BODY_SEQ_OPEN ? ev->seq_open : ev->seq_close;
        printf("%s seq %" PRIu32 " client %" PRIu32 " %s %s budget %" PRIu32 " window %" PRIu32
               " pages %" PRIu32 " rounds %" PRIu32 "\n",
               ev->body_case == VASE__EVENT__BODY_SEQ_OPEN ? "open " : "close", s->seq_id,
               s->client_id, s->policy, mode_name(s->mode), s->budget, s->window, s->pages,
               s->rounds);
        break;
    }
    case VASE__EVENT__BODY_EVICTION: {
        const Vase__EvictPlan *p = ev->eviction;
        printf("seq %" PRIu32 " round %" PRIu32 " len %" PRIu32 " candidates %" PRIu32
               " keep %" PRIu32 " plan %.3f ms\n",
               p->seq_id, p->round, p->len, p->n, p->keep, p->plan_seconds * 1e3);
        break;
    }
    case VASE__EVENT__BODY_PRESSURE: {
        const Vase__ArenaStatus *a = ev->pressure;
        printf("arena %" PRIu32 " \"%s\" (%s) %" PRIu32 " of %" PRIu32 " pages free\n", a->id,
               a->name, a->kind, a->pages_free, a->pages_total);
        break;
    }
    default:
        printf("(event without a body)\n");
        break;
    }
}

static int events_ping(struct ctl *ctl) {
    Vase__Ping ping = VASE__PING__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    Vase__Envelope *reply;

    e.body_case = VASE__ENVELOPE__BODY_PING;
    e.ping = &ping;
    int r = ctl_call(ctl, "events", &e, VASE__ENVELOPE__BODY_PONG, &reply);
    if (r < 0)
        return r;
    vase__envelope__free_unpacked(reply, NULL);
    return 0;
}

static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}

static int cmd_events(struct ctl *ctl) {
    char endpoint[PATH_MAX + 64], abs[PATH_MAX], path[PATH_MAX + 32];
    struct sigaction sa = {.sa_handler = on_sigint};
    struct stat st;
    void *sub = NULL;
    long long seen = 0;
    int r;

    snprintf(path, sizeof(path), "%s/events.sock", ctl->dir);
    if (stat(path, &st) < 0 || access(path, R_OK | W_OK) < 0) {
        r = -errno;
        fprintf(stderr, "vasectl: cannot reach vased at %s: %s\n", path, strerror(-r));
        return r;
    }
    const char *dir = realpath(ctl->dir, abs) ? abs : ctl->dir;
    snprintf(endpoint, sizeof(endpoint), "ipc://%s/events.sock", dir);

    void *zctx = zmq_ctx_new();
    if (!zctx) {
        r = -errno;
        fprintf(stderr, "vasectl: events: %s\n", zmq_strerror(-r));
        return r;
    }
    int zero = 0;
    sub = zmq_socket(zctx, ZMQ_SUB);
    if (!sub || zmq_setsockopt(sub, ZMQ_LINGER, &zero, sizeof(zero)) < 0 ||
        zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0) < 0 || zmq_connect(sub, endpoint) < 0) {
        r = -errno;
        fprintf(stderr, "vasectl: cannot subscribe to %s: %s\n", endpoint, zmq_strerror(-r));
        goto out;
    }
    /* A Ping proves the daemon is there (PUB/SUB alone would wait silently for ever), and its
     * round trip gives the subscription time to reach the publisher. */
    r = events_ping(ctl);
    if (r < 0)
        goto out;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    setvbuf(stdout, NULL, _IOLBF, 0);

    while (!interrupted && (arg_count < 0 || seen < arg_count)) {
        zmq_pollitem_t item = {.socket = sub, .events = ZMQ_POLLIN};
        int ready = zmq_poll(&item, 1, arg_timeout_ms);
        if (ready < 0) {
            if (errno == EINTR)
                continue;
            r = -errno;
            fprintf(stderr, "vasectl: events: %s\n", zmq_strerror(-r));
            goto out;
        }
        /* A quiet stream and a dead daemon look the same to a subscriber: ask. */
        if (ready == 0) {
            r = events_ping(ctl);
            if (r < 0)
                goto out;
            continue;
        }
        zmq_msg_t topic, body;
        zmq_msg_init(&topic);
        zmq_msg_init(&body);
        if (zmq_msg_recv(&topic, sub, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&topic);
            zmq_msg_close(&body);
            continue;
        }
        bool two = zmq_msg_more(&topic) && zmq_msg_recv(&body, sub, ZMQ_DONTWAIT) >= 0;
        /* Skip whatever else belongs to this message. */
        while (two && zmq_msg_more(&body)) {
            zmq_msg_t extra;
            zmq_msg_init(&extra);
            int k = zmq_msg_recv(&extra, sub, ZMQ_DONTWAIT);
            bool more = k >= 0 && zmq_msg_more(&extra);
            zmq_msg_close(&extra);
            if (!more)
                break;
        }
        Vase__Event *ev = NULL;
        if (two && zmq_msg_size(&body) <= VASE_WIRE_DEFAULT_MAX)
            ev = vase__event__unpack(NULL, zmq_msg_size(&body), zmq_msg_data(&body));
        if (ev) {
            char name[64];
            size_t n =
                zmq_msg_size(&topic) < sizeof(name) ? zmq_msg_size(&topic) : sizeof(name) - 1;
            memcpy(name, zmq_msg_data(&topic), n);
            name[n] = 0;
            print_event(name, ev);
            vase__event__free_unpacked(ev, NULL);
            seen++;
        } else
            fprintf(stderr, "vasectl: events: dropped a malformed event\n");
        zmq_msg_close(&topic);
        zmq_msg_close(&body);
    }
    r = 0;
out:
    if (sub)
        zmq_close(sub);
    zmq_ctx_term(zctx);
    return r;
}

static int parse_id(const char *what, const char *s, uint32_t *ret) {
    long long v;
    if (parse_ll(s, 0, UINT32_MAX, &v) < 0) {
        fprintf(stderr, "vasectl: invalid %s '%s': expected a number 0 .. %u\n", what, s,
                UINT32_MAX);
        return -EINVAL;
    }
    *ret = (uint32_t)v;
    return 0;
}

/* Exit status: 0 done, 1 the daemon or the system said no, 2 usage. */
static int run(void) {
    const char *cmd = arg_command[0];
    int n = arg_n_command - 1;
    char **args = arg_command + 1;
    struct ctl ctl = {0};
    uint32_t id = 0;
    int r;

    /* Check the words before any socket is opened, so usage errors are usage errors. */
    bool ok;
    if (strcmp(cmd, "status") == 0 || strcmp(cmd, "clients") == 0 || strcmp(cmd, "ping") == 0 ||
        strcmp(cmd, "events") == 0)
        ok = n == 0;
    else if (strcmp(cmd, "seqs") == 0 || strcmp(cmd, "seq") == 0) {
        bool one = strcmp(cmd, "seq") == 0;
        ok = one ? n == 1 : n <= 1;
        /* A bad number has its own message; it is still a usage error. */
        if (ok && n == 1 && parse_id(one ? "sequence id" : "client id", args[0], &id) < 0)
            return 2;
    } else if (strcmp(cmd, "config") == 0)
        ok = (n >= 1 && strcmp(args[0], "get") == 0 && n <= 2) ||
             (n == 3 && strcmp(args[0], "set") == 0);
    else {
        fprintf(stderr, "vasectl: unknown command '%s' (try --help)\n", cmd);
        return 2;
    }
    if (!ok) {
        fprintf(stderr, "vasectl: wrong arguments for '%s' (try --help)\n", cmd);
        return 2;
    }
    if (arg_count >= 0 && strcmp(cmd, "events") != 0) {
        fprintf(stderr, "vasectl: --count applies to 'events' only\n");
        return 2;
    }

    r = ctl_open(&ctl);
    if (r < 0)
        return 1;
    if (strcmp(cmd, "status") == 0)
        r = cmd_status(&ctl);
    else if (strcmp(cmd, "clients") == 0)
        r = cmd_clients(&ctl);
    else if (strcmp(cmd, "seqs") == 0)
        r = cmd_seqs(&ctl, id);
    else if (strcmp(cmd, "seq") == 0)
        r = cmd_seq(&ctl, id);
    else if (strcmp(cmd, "ping") == 0)
        r = cmd_ping(&ctl);
    else if (strcmp(cmd, "events") == 0)
        r = cmd_events(&ctl);
    else if (strcmp(args[0], "get") == 0)
        r = cmd_config_get(&ctl, n == 2 ? args[1] : NULL);
    else
        r = cmd_config_set(&ctl, args[1], args[2]);
    ctl_close(&ctl);
    if (fflush(stdout) != 0 && r == 0) {
        fprintf(stderr, "vasectl: cannot write output: %s\n", strerror(errno));
        r = -EIO;
    }
    return r < 0 ? 1 : 0;
}

int main(int argc, char *argv[]) {
    int r = parse_argv(argc, argv);
    if (r <= 0)
        return r < 0 ? 2 : 0;
    return run();
}
