/* SPDX-License-Identifier: MIT */

/*
 * vasectl top: a live view of a daemon, built from samples of Status, ListClients and ListSeqs
 * taken one interval apart. This file takes the samples and shows the frames that
 * vasectl_top_view.c computes from them (rates, models, sorting, rendering). Each frame is
 * rendered as plain text into memory first; the live view then cuts it to the terminal's size
 * and draws it on the alternate screen with ANSI escape sequences, and the plain output writes
 * it as it is.
 *
 * The terminal: stdin in non-canonical mode without echo (signals stay on, so Ctrl-C is a
 * SIGINT), the alternate screen, the cursor hidden; all restored before vasectl_top() returns,
 * whatever ended the view ('q', SIGINT, SIGTERM, SIGHUP, an error).
 */

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "vase.h"
#include "vase_admin.h"
#include "vasectl.h"
#include "vasectl_top.h"

/* ---- samples ---- */

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sample_clear(struct top_sample *s) {
    if (s->status)
        protobuf_c_message_free_unpacked(&s->status->base, NULL);
    if (s->clients)
        protobuf_c_message_free_unpacked(&s->clients->base, NULL);
    if (s->seqs)
        protobuf_c_message_free_unpacked(&s->seqs->base, NULL);
    *s = (struct top_sample){0};
}

/* Why request what failed with r, in err: the daemon's words when it gave some. Returns r. */
static int describe(struct vase_admin *a, const char *what, int r, char *err, size_t size) {
    const char *why = vase_admin_last_error(a);

    if (r == -ETIMEDOUT)
        snprintf(err, size, "cannot reach vased at %s: no reply within %d ms", vase_admin_path(a),
                 vase_admin_timeout(a));
    else if (*why)
        snprintf(err, size, "%s: %s (%s)", what, why, vase_strerror(r));
    else
        snprintf(err, size, "%s: %s", what, vase_strerror(r));
    return r;
}

/* Takes a sample into *ret (cleared first). 0, or -errno with the reason in err. */
static int sample_take(struct vase_admin *a, struct top_sample *ret, char *err, size_t size) {
    struct top_sample s = {0};
    int r;

    sample_clear(ret);
    if ((r = vase_admin_status(a, &s.status)) < 0)
        return describe(a, "status", r, err, size);
    if ((r = vase_admin_clients(a, &s.clients)) < 0) {
        sample_clear(&s);
        return describe(a, "clients", r, err, size);
    }
    if ((r = vase_admin_seqs(a, 0, &s.seqs)) < 0) {
        sample_clear(&s);
        return describe(a, "seqs", r, err, size);
    }
    s.when = now_seconds();
    *ret = s;
    return 0;
}

/* ---- plain output ---- */

static int run_plain(struct vase_admin *a, const struct vasectl_top_options *o, char *err,
                     size_t size) {
    struct top_sample samples[2] = {{.when = 0}, {.when = 0}};
    struct top_view v = {0};
    struct top_ui ui = {.sort = COL_EVICT, .interval = o->interval};
    long long n = o->iterations >= 0 ? o->iterations : 2;
    int r = 0;

    for (long long k = 0; k < n; k++) {
        struct top_sample *cur = &samples[k % 2], *prev = &samples[(k + 1) % 2];
        if (k > 0) {
            double t = o->interval;
            struct timespec ts = {.tv_sec = (time_t)t, .tv_nsec = (long)((t - floor(t)) * 1e9)};
            while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
                ;
        }
        if ((r = sample_take(a, cur, err, size)) < 0)
            break;
        if ((r = vasectl_top_view_build(&v, k > 0 ? prev : NULL, cur)) < 0) {
            snprintf(err, size, "top: %s", vase_strerror(r));
            break;
        }
        vasectl_top_sort(&v, &ui);
        if (o->json)
            vasectl_top_json(stdout, &v);
        else {
            if (k > 0)
                putchar('\n');
            if ((r = vasectl_top_render(stdout, &v, &ui)) < 0) {
                snprintf(err, size, "top: %s", vase_strerror(r));
                break;
            }
        }
        fflush(stdout);
    }
    vasectl_top_view_clear(&v);
    sample_clear(&samples[0]);
    sample_clear(&samples[1]);
    return r;
}

/* ---- the live view ---- */

static volatile sig_atomic_t got_quit, got_winch;

static void on_quit(int sig) {
    (void)sig;
    got_quit = 1;
}

static void on_winch(int sig) {
    (void)sig;
    got_winch = 1;
}

/* The terminal as it was, to put back. */
struct term {
    bool raw;
    struct termios saved;
    struct sigaction old[4];
    sigset_t old_mask;
};

static const int term_signals[4] = {SIGINT, SIGTERM, SIGHUP, SIGWINCH};

static int term_enter(struct term *t) {
    sigset_t block;

    sigemptyset(&block);
    for (int k = 0; k < 4; k++) {
        struct sigaction sa = {.sa_handler = term_signals[k] == SIGWINCH ? on_winch : on_quit};
        sigemptyset(&sa.sa_mask);
        sigaction(term_signals[k], &sa, &t->old[k]);
        sigaddset(&block, term_signals[k]);
    }
    /* Delivered only inside ppoll(), so that none is lost between a check and the wait. */
    sigprocmask(SIG_BLOCK, &block, &t->old_mask);
    got_quit = got_winch = 0;

    if (isatty(STDIN_FILENO)) {
        struct termios raw;
        if (tcgetattr(STDIN_FILENO, &t->saved) < 0)
            return -errno;
        raw = t->saved;
        raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
        raw.c_cc[VMIN] = 0;
        raw.c_cc[VTIME] = 0;
        if (tcsetattr(STDIN_FILENO, TCSAFLUSH, &raw) < 0)
            return -errno;
        t->raw = true;
    }
    /* The alternate screen, the cursor hidden, the screen cleared. */
    fputs("\x1b[?1049h\x1b[?25l\x1b[H\x1b[2J", stdout);
    fflush(stdout);
    return 0;
}

static void term_leave(struct term *t) {
    fputs("\x1b[?25h\x1b[?1049l", stdout);
    fflush(stdout);
    if (t->raw)
        tcsetattr(STDIN_FILENO, TCSAFLUSH, &t->saved);
    for (int k = 0; k < 4; k++)
        sigaction(term_signals[k], &t->old[k], NULL);
    sigprocmask(SIG_SETMASK, &t->old_mask, NULL);
}

static void term_size(unsigned *rows, unsigned *cols) {
    struct winsize ws;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row && ws.ws_col) {
        *rows = ws.ws_row;
        *cols = ws.ws_col;
    } else {
        *rows = 24;
        *cols = 80;
    }
}

/* The bytes of the first cols columns of line (len bytes): UTF-8 continuation bytes take
 * none. */
static size_t top_cut(const char *line, size_t len, unsigned cols) {
    size_t k = 0;
    unsigned used = 0;
    for (; k < len; k++) {
        if (((unsigned char)line[k] & 0xc0) == 0x80)
            continue;
        if (used == cols)
            break;
        used++;
    }
    return k;
}

/* Draws text, lines cut to the terminal's size, over the screen from its top left corner. */
static void draw(const char *text, unsigned rows, unsigned cols) {
    const char *p = text;
    unsigned row = 0;

    fputs("\x1b[H", stdout);
    while (*p && row < rows) {
        size_t len = strcspn(p, "\n");
        fputs("\x1b[2K", stdout);
        fwrite(p, 1, top_cut(p, len, cols), stdout);
        p += len + (p[len] == '\n');
        if (++row < rows)
            fputs("\r\n", stdout);
    }
    if (row < rows)
        fputs("\x1b[J", stdout);
    fflush(stdout);
}

/* Renders v and draws it. 0 or -ENOMEM. */
static int redraw(const struct top_view *v, struct top_ui *ui) {
    char *text = NULL;
    size_t len = 0;
    unsigned rows, cols;
    FILE *f = open_memstream(&text, &len);
    int r;

    if (!f)
        return -ENOMEM;
    term_size(&rows, &cols);
    /* The clients and models leave at least half the screen to the sequences. */
    ui->max_rows = rows / 4 > 2 ? rows / 4 - 2 : 1;
    r = vasectl_top_render(f, v, ui);
    if (fclose(f) != 0 && r == 0)
        r = -ENOMEM;
    if (r == 0)
        draw(text, rows, cols);
    free(text);
    return r;
}

/* A sample for the live view, reconnecting first when the last one failed (*a NULL). */
static int live_sample(struct vase_admin **a, const struct vasectl_top_options *o,
                       struct top_sample *s, char *err, size_t size) {
    int r;

    if (!*a) {
        if ((r = vase_admin_new(&o->admin, a)) < 0) {
            snprintf(err, size, "top: %s", vase_strerror(r));
            return r;
        }
        if ((r = vase_admin_connect(*a)) < 0) {
            snprintf(err, size, "cannot reach vased at %s: %s", vase_admin_path(*a),
                     vase_strerror(r));
            *a = vase_admin_free(*a);
            return r;
        }
    }
    r = sample_take(*a, s, err, size);
    /* A fresh connection next time: the daemon may come back as another process. */
    if (r < 0)
        *a = vase_admin_free(*a);
    return r;
}

/* The live view between two frames: the last two samples, the view of the newer, how it is
 * drawn, the terminal to put back. */
struct live {
    struct top_sample samples[2], *cur, *prev;
    struct top_view v;
    struct top_ui ui;
    struct term t;
    char why[1024]; /* why the last sample failed; "" if it did not */
    long long taken;
    double next; /* when the next sample is due */
};

/* What live_tick() returns when the samples asked for are all taken. */
#define LIVE_DONE 2

/* Takes the sample that is due, if one is, and builds its view. 1: the frame changed, 0: no
 * sample was due, LIVE_DONE, or -ENOMEM. A sample that failed shows as the frame's error. */
static int live_tick(struct live *l, struct vase_admin **a, const struct vasectl_top_options *o) {
    double t0 = now_seconds();
    struct top_sample s = {0};

    if (t0 < l->next)
        return 0;
    if (o->iterations >= 0 && l->taken >= o->iterations)
        return LIVE_DONE;
    if (live_sample(a, o, &s, l->why, sizeof(l->why)) == 0) {
        sample_clear(l->prev);
        *l->prev = *l->cur;
        *l->cur = s;
        l->why[0] = 0;
        int r = vasectl_top_view_build(&l->v, l->prev, l->cur);
        if (r < 0)
            return r;
    }
    l->ui.error = l->why[0] ? l->why : NULL;
    l->taken++;
    l->next += o->interval;
    if (l->next < t0)
        l->next = t0 + o->interval;
    return 1;
}

/* Reads the keys pressed and applies them to ui; 'q', or input that ended, sets got_quit.
 * Returns whether the order changed (and the view goes on). */
static bool live_keys(struct top_ui *ui) {
    char keys[64];
    ssize_t n = read(STDIN_FILENO, keys, sizeof(keys));
    bool changed = false;

    if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN))
        got_quit = 1; /* end of input: nobody can press 'q' any more */
    for (ssize_t j = 0; j < n; j++) {
        if (keys[j] == 'q')
            got_quit = 1;
        else
            changed |= vasectl_top_key(ui, keys[j]);
    }
    return changed && !got_quit;
}

/* Waits until the next sample is due, a key is pressed or a signal comes. Returns whether a key
 * changed the order. */
static bool live_wait(struct live *l) {
    double wait = l->next - now_seconds();
    if (wait < 0)
        wait = 0;
    struct timespec ts = {.tv_sec = (time_t)wait, .tv_nsec = (long)((wait - floor(wait)) * 1e9)};
    struct pollfd pfd = {.fd = STDIN_FILENO, .events = POLLIN};
    int k = ppoll(&pfd, l->t.raw ? 1 : 0, &ts, &l->t.old_mask);

    if (k > 0 && (pfd.revents & (POLLHUP | POLLERR | POLLNVAL))) {
        got_quit = 1; /* the terminal is gone */
        return false;
    }
    return k > 0 && (pfd.revents & POLLIN) && live_keys(&l->ui);
}

/* Sorts the view as ui says and draws it. 0 or -ENOMEM. */
static int live_redraw(struct live *l) {
    vasectl_top_sort(&l->v, &l->ui);
    return redraw(&l->v, &l->ui);
}

static int run_live(struct vase_admin **a, const struct vasectl_top_options *o, char *err,
                    size_t size) {
    struct live l = {
        .ui = {.sort = COL_EVICT, .interval = o->interval, .keys = true},
        .next = now_seconds(),
    };
    int r;

    l.cur = &l.samples[0];
    l.prev = &l.samples[1];
    l.v.cur = l.cur;
    if ((r = term_enter(&l.t)) < 0) {
        term_leave(&l.t);
        snprintf(err, size, "top: cannot set up the terminal: %s", strerror(-r));
        return r;
    }
    while (!got_quit && r == 0) {
        int due = live_tick(&l, a, o);
        if (due == LIVE_DONE)
            break;
        if (due < 0) {
            r = due;
            break;
        }
        if (got_winch) {
            got_winch = 0;
            due = 1;
        }
        if (due)
            r = live_redraw(&l);
        if (r == 0 && live_wait(&l))
            r = live_redraw(&l);
    }
    term_leave(&l.t);
    if (r < 0)
        snprintf(err, size, "top: %s", vase_strerror(r));
    vasectl_top_view_clear(&l.v);
    sample_clear(&l.samples[0]);
    sample_clear(&l.samples[1]);
    return r;
}

int vasectl_top(struct vase_admin **a, const struct vasectl_top_options *o, char *err,
                size_t err_size) {
    if (!o->json && isatty(STDOUT_FILENO))
        return run_live(a, o, err, err_size);
    return run_plain(*a, o, err, err_size);
}
