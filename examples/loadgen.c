/* SPDX-License-Identifier: MIT */

/*
 * loadgen: static against elastic budgets on one arena, under the same bursty load. Three
 * synthetic engines (one client and one model each, of different page sizes) serve sequences
 * that arrive by a seeded two-state Markov-modulated Poisson process; every arrival is served by
 * a thread of its own, which opens the sequence with an admission wait, prefills its prompt,
 * decodes to its length at a fixed simulated step time and closes it. The same arrival schedule
 * runs once per mode, one mode after the other on the same daemon: first with every sequence at
 * a fixed budget (static), then with every sequence elastic (min_budget a fraction of the budget,
 * one run per fraction of --min-frac), and the modes are compared: admitted and refused
 * sequences, admission waits, decode throughput, the arena's occupancy over time (sampled
 * through the administrative API) and the budgets the sequences actually ran with.
 *
 * Threads: the dispatcher (main) starts one thread per arrival; they share their engine's client
 * (libvase serialises the calls, and releases the client's lock while an open waits, so the
 * engine's other sequences keep decoding and, when elastic, give up budget to it). A sampler
 * thread owns the administrative handle while a mode runs. What threads share besides the
 * clients is in atomics (struct gauges); each sequence's record is written by its thread only and
 * read after it was joined.
 *
 * After each mode the generator checks what must hold in any run, load and machine speed aside:
 * every arrival is accounted for exactly once, every admitted sequence decoded to its length and
 * closed, and the arena holds no pages and no sequences afterwards. It exits with 1 otherwise.
 *
 * The files: this one, the settings and main(); loadgen_schedule.c, the arrivals;
 * loadgen_engine.c, the engines and the thread that serves a sequence; loadgen_mode.c, the
 * sampler and one mode from start to end; loadgen_report.c, the summary, the CSV files and the
 * table.
 */

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loadgen.h"

/* ---- settings ---------------------------------------------------------------------------- */

double arg_duration = 30;     /* seconds of arrivals per mode */
double arg_calm_rate = 3;     /* arrivals per second in the calm state */
double arg_burst_rate = 12;   /* ... in the burst state */
double arg_calm_seconds = 4;  /* mean length of a calm period */
double arg_burst_seconds = 3; /* ... of a burst */
double arg_decode_min = 1024; /* decoded tokens per sequence, uniform in [min, max] */
double arg_decode_max = 3072;
double arg_step_ms = 2; /* simulated forward time per decoded token */
double arg_admission_wait_ms = 2000;
/* Elastic: min_budget = this fraction of the budget; one elastic run per fraction. */
double arg_min_fracs[MAX_MIN_FRACS] = {0.5};
size_t arg_n_min_fracs = 1;
double arg_max_inflight = 512; /* sequences opening or running at once */
double arg_seed = 1;
double arg_sample_ms = 100;
const char *arg_modes = "static,elastic";
const char *arg_out = ".";
const char *arg_runtime_dir;

volatile sig_atomic_t stop_requested;

/* ---- command line -------------------------------------------------------------------------- */

/* Every numeric option, checked against its bounds; integers where integral is true. */
static const struct num_option {
    const char *name;
    double *value;
    double min, max;
    bool integral;
    const char *help;
} num_options[] = {
    {"duration", &arg_duration, 0.1, 3600, false, "seconds of arrivals per mode (30)"},
    {"calm-rate", &arg_calm_rate, 0, 10000, false, "arrivals per second while calm (3)"},
    {"burst-rate", &arg_burst_rate, 0, 10000, false, "arrivals per second in a burst (12)"},
    {"calm-seconds", &arg_calm_seconds, 0.001, 3600, false, "mean length of a calm period (4)"},
    {"burst-seconds", &arg_burst_seconds, 0.001, 3600, false, "mean length of a burst (3)"},
    {"decode-min", &arg_decode_min, 1, 1 << 20, true, "fewest tokens a sequence decodes (1024)"},
    {"decode-max", &arg_decode_max, 1, 1 << 20, true, "most tokens a sequence decodes (3072)"},
    {"step-ms", &arg_step_ms, 0, 1000, false, "simulated time per decoded token (2)"},
    {"admission-wait-ms", &arg_admission_wait_ms, 0, VASE_MAX_ADMISSION_WAIT_MS, true,
     "how long an open waits for room, both modes (2000)"},
    {"max-inflight", &arg_max_inflight, 1, 4096, true,
     "sequences opening or running at once; later arrivals are not opened (512)"},
    {"seed", &arg_seed, 0, 9007199254740992.0, true, "seed of the arrival schedule (1)"},
    {"sample-ms", &arg_sample_ms, 10, 10000, false, "interval of the status samples (100)"},
};
#define N_NUM_OPTIONS (sizeof(num_options) / sizeof(num_options[0]))

enum { OPT_MODES = 0x100, OPT_MIN_FRAC, OPT_OUT, OPT_RUNTIME_DIR, OPT_NUM };

static void help(void) {
    printf("Usage: %s [OPTIONS]\n"
           "Serves the same seeded bursty arrivals on one vased arena once with static budgets\n"
           "and once per --min-frac with elastic ones, and writes CSV files of every run and a\n"
           "Markdown table to --out.\n\n",
           program_invocation_short_name);
    for (size_t i = 0; i < N_NUM_OPTIONS; i++)
        printf("      --%s=N%*s%s\n", num_options[i].name, (int)(20 - strlen(num_options[i].name)),
               "", num_options[i].help);
    printf(
        "      --min-frac=F[,F...]     elastic: min_budget as a fraction of the budget,\n"
        "                              rounded down to a multiple of the window, at least\n"
        "                              two windows; one elastic run per fraction, up to 3 (0.5)\n"
        "      --modes=LIST            static, elastic or both, in that order (static,elastic)\n"
        "      --out=DIR               where the CSV files and table.md go (.)\n"
        "      --runtime-dir=DIR       vased's runtime directory ($VASE_RUNTIME_DIR, ...)\n"
        "  -h --help                   show this help\n");
}

static int parse_num(const struct num_option *o, const char *s) {
    char *end;
    double v;

    errno = 0;
    v = strtod(s, &end);
    if (end == s || *end != '\0' || errno != 0 || !isfinite(v) || v < o->min || v > o->max ||
        (o->integral && v != floor(v))) {
        fprintf(stderr, "%s: invalid --%s '%s': want %s in [%g, %g]\n",
                program_invocation_short_name, o->name, s, o->integral ? "an integer" : "a number",
                o->min, o->max);
        return -EINVAL;
    }
    *o->value = v;
    return 0;
}

/* A comma-separated list of fractions in (0, 1]. */
static int parse_fracs(const char *s) {
    static const struct num_option frac = {"min-frac", NULL, 0.001, 1, false, NULL};
    char buf[128], *save = NULL;
    size_t n = 0;

    if (strlen(s) >= sizeof(buf))
        goto bad;
    strcpy(buf, s);
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        struct num_option o = frac;

        if (n == MAX_MIN_FRACS)
            goto bad;
        o.value = &arg_min_fracs[n++];
        if (parse_num(&o, tok) < 0)
            return -EINVAL;
    }
    if (n == 0)
        goto bad;
    arg_n_min_fracs = n;
    return 0;
bad:
    fprintf(stderr,
            "%s: invalid --min-frac '%s': want 1 to %d fractions in (0, 1], comma-separated\n",
            program_invocation_short_name, s, MAX_MIN_FRACS);
    return -EINVAL;
}

/* Returns < 0 on a usage error, 0 to exit successfully (help), > 0 to go on. */
static int parse_argv(int argc, char **argv) {
    struct option options[N_NUM_OPTIONS + 6] = {
        {"modes", required_argument, NULL, OPT_MODES},
        {"min-frac", required_argument, NULL, OPT_MIN_FRAC},
        {"out", required_argument, NULL, OPT_OUT},
        {"runtime-dir", required_argument, NULL, OPT_RUNTIME_DIR},
        {"help", no_argument, NULL, 'h'},
    };
    int c, idx;

    for (size_t i = 0; i < N_NUM_OPTIONS; i++)
        options[5 + i] =
            (struct option){num_options[i].name, required_argument, NULL, OPT_NUM + (int)i};
    while ((c = getopt_long(argc, argv, "h", options, &idx)) >= 0) {
        switch (c) {
        case 'h':
            help();
            return 0;
        case OPT_MODES:
            if (strcmp(optarg, "static") && strcmp(optarg, "elastic") &&
                strcmp(optarg, "static,elastic")) {
                fprintf(stderr, "%s: invalid --modes '%s'\n", program_invocation_short_name,
                        optarg);
                return -EINVAL;
            }
            arg_modes = optarg;
            break;
        case OPT_MIN_FRAC:
            if (parse_fracs(optarg) < 0)
                return -EINVAL;
            break;
        case OPT_OUT:
            arg_out = optarg;
            break;
        case OPT_RUNTIME_DIR:
            arg_runtime_dir = optarg;
            break;
        default:
            if (c >= OPT_NUM && c < OPT_NUM + (int)N_NUM_OPTIONS) {
                if (parse_num(&num_options[c - OPT_NUM], optarg) < 0)
                    return -EINVAL;
                break;
            }
            return -EINVAL;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", program_invocation_short_name,
                argv[optind]);
        return -EINVAL;
    }
    if (arg_decode_min > arg_decode_max) {
        fprintf(stderr, "%s: --decode-min is above --decode-max\n", program_invocation_short_name);
        return -EINVAL;
    }
    for (size_t i = 0; i < N_MODELS; i++) {
        struct vase_params p = vase_params_default(models[i].budget);

        p.window = models[i].window;
        if (vase_params_check(&p, models[i].policy) < 0) {
            fprintf(stderr, "%s: model %s: budget %u and window %u are not valid\n",
                    program_invocation_short_name, models[i].name, models[i].budget,
                    models[i].window);
            return -EINVAL;
        }
        for (size_t k = 0; k < arg_n_min_fracs; k++)
            if (min_budget_of(&models[i], arg_min_fracs[k]) > models[i].budget) {
                fprintf(stderr,
                        "%s: --min-frac=%g gives model %s (window %u) a min_budget above "
                        "its budget %u\n",
                        program_invocation_short_name, arg_min_fracs[k], models[i].name,
                        models[i].window, models[i].budget);
                return -EINVAL;
            }
    }
    return 1;
}

static void on_signal(int sig) {
    (void)sig;
    stop_requested = 1;
}

int main(int argc, char **argv) {
    struct sigaction sa = {.sa_handler = on_signal};
    struct mode_run runs[1 + MAX_MIN_FRACS] = {{.name = "static"}};
    struct summary sums[1 + MAX_MIN_FRACS];
    struct arrival *sched;
    size_t n_sched, n_runs = 0;
    bool ok = true;
    int r;

    r = parse_argv(argc, argv);
    if (r <= 0)
        return r < 0 ? 2 : 0;
    if (strcmp(arg_modes, "elastic") != 0)
        n_runs++;
    for (size_t k = 0; k < arg_n_min_fracs && strcmp(arg_modes, "static") != 0; k++) {
        struct mode_run *m = &runs[n_runs++];

        *m = (struct mode_run){.min_frac = arg_min_fracs[k]};
        if (arg_n_min_fracs == 1)
            snprintf(m->name, sizeof(m->name), "elastic");
        else
            snprintf(m->name, sizeof(m->name), "elastic-%g", arg_min_fracs[k]);
    }
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    if (make_schedule(&sched, &n_sched) < 0) {
        fprintf(stderr, "loadgen: out of memory\n");
        return 1;
    }
    printf("loadgen: %zu arrivals in %.1f s (seed %.0f); modes %s\n", n_sched, arg_duration,
           arg_seed, arg_modes);
    for (size_t k = 0; k < n_runs; k++) {
        struct mode_run *m = &runs[k];
        struct summary *sum = &sums[k];
        uint64_t window_tokens = 0;

        r = stop_requested ? -EINTR : run_mode(m, sched, n_sched, &window_tokens);
        if (r < 0) {
            ok = false;
            n_runs = k;
            break;
        }
        summarize(m, window_tokens, sum);
        if (write_csvs(m) < 0)
            ok = false;
        printf("loadgen: %s: %zu arrived = %zu admitted + %zu refused (ENOSPC) + %zu refused "
               "(other) + %zu not opened; %zu failed while decoding or closing; arena %s "
               "afterwards\n",
               m->name, sum->arrived, sum->admitted, sum->enospc, sum->refused, sum->generator,
               sum->failed, m->empty ? "empty" : "NOT empty");
        if (!sum->consistent || !m->empty || m->sampler_err < 0) {
            fprintf(stderr, "loadgen: %s: the run is not consistent (see above)\n", m->name);
            ok = false;
        }
    }
    if (n_runs > 0 && write_table(runs, sums, n_runs) < 0)
        ok = false;
    for (size_t k = 0; k < 1 + MAX_MIN_FRACS; k++) {
        free(runs[k].recs);
        free(runs[k].samples);
    }
    free(sched);
    return ok && !stop_requested ? 0 : 1;
}
