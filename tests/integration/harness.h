/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The integration tests' harness: a real vased started in a temporary runtime directory, plain
 * control requests from a ZeroMQ DEALER without a session (what vasectl does), helper programs
 * run with their output captured, engine child processes, and the token-identifying KV data
 * the tests write through libvase and read back after evictions.
 *
 * Every wait is bounded. Every process the harness starts is killed and reaped, and every
 * temporary directory removed, by harness_daemon_free() or at exit, also when a test fails;
 * children also die with the test process (PR_SET_PDEATHSIG). Functions return 0 or -errno
 * like the rest of vase and print a one-line reason to stderr on failure.
 */

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "vase.h"
#include "vase.pb-c.h"

/*
 * Bounds on waits for something that must happen: they turn a hang into a failure and expire
 * only when something is broken, never because the machine is loaded or the test runs under
 * valgrind, so they are far above what any of these takes. No test waits for time to pass to
 * order events, and none asserts how long something took: "at once, not after the timeout" is
 * shown by the error code (-ECONNRESET rather than -ETIMEDOUT), with a timeout long enough
 * that it cannot be what ended the wait.
 */
/* A daemon's start and stop, a helper program's or child engine's run, and a control request. */
#define HARNESS_START_MS 30000
#define HARNESS_STOP_MS 30000
#define HARNESS_RUN_MS 60000
#define HARNESS_REQUEST_MS 30000
/* The timeout given to libvase clients. */
#define HARNESS_CLIENT_MS 30000
/* A state the tests poll for (a count in Status, a child that says it is ready). */
#define HARNESS_WAIT_MS 30000

/* The small arena most tests use: 64 granules of 64 KiB. The harness model (harness_geometry())
 * has pages of exactly one granule. */
#define HARNESS_PAGE_BYTES 65536u
#define HARNESS_ARENA_PAGES 64u
#define HARNESS_ARENA_BYTES ((uint64_t)HARNESS_PAGE_BYTES * HARNESS_ARENA_PAGES)

/* Monotonic seconds. */
double harness_now(void);
/* Sleeps ms milliseconds (between polls of a condition, never as synchronisation). */
void harness_sleep_ms(int ms);

/* The path of a program of the build tree ("vased", "vasectl", "tests/replay_engine"): the
 * folder above the running test binary (build/ or build-san/), or $VASE_BUILD_DIR. 0, -ENOENT
 * if it is not there (the message names it), -ENAMETOOLONG. */
int harness_program(const char *name, char *buf, size_t size);

/* ---- the daemon ---- */

struct harness_daemon {
    pid_t pid;    /* 0 when not running */
    char dir[64]; /* runtime directory; "" until the first start */
    char log[96]; /* the daemon's stdout and stderr, appended across restarts */
    uint64_t incarnation;
    /* Set before a start: leave metrics_address to vased's default instead of "off". */
    bool metrics_default;
};

/*
 * Starts build/vased (or the program of the build tree named by $VASE_VASED_PROGRAM, such as
 * "tests/vased_alloc_fail") with --runtime-dir, an empty --config file, --evictor-threads=2, the
 * small arena above and --metrics-address=off (unless d->metrics_default), then args
 * (NULL-terminated "--key=value" strings, later ones win; may be NULL). The first start makes a
 * fresh directory under /tmp; later starts reuse d->dir (a restart on the same runtime directory).
 * Waits until the daemon answers Ping and records its incarnation. On failure the daemon is killed
 * and its log printed. 0 or -errno.
 */
int harness_daemon_start(struct harness_daemon *d, const char *const *args);
/* Sends sig and waits for the exit; after HARNESS_STOP_MS, SIGKILL and -ETIMEDOUT. 0 on a
 * normal exit, with the wait status in *ret_status (may be NULL). */
int harness_daemon_stop(struct harness_daemon *d, int sig, int *ret_status);
/* Kills a running daemon, removes the directory; d is zeroed. Safe on a zeroed d. */
void harness_daemon_free(struct harness_daemon *d);
/* Prints the daemon's log to stderr. */
void harness_daemon_dump_log(const struct harness_daemon *d);
/* A path inside the runtime directory. */
void harness_daemon_path(const struct harness_daemon *d, const char *name, char *buf, size_t size);

/* vase_connect() to the daemon with HARNESS_CLIENT_MS as timeout. */
int harness_connect(const struct harness_daemon *d, const char *name, struct vase_client **ret);

/* ---- engines ---- */

/* The small model most tests use: 2 layers, 4 query heads, 2 KV heads, head dim 32, f32, blocks
 * of 64 tokens: pages of 64 KiB; query ring pages of 64 entries, 64 KiB too. */
struct vase_geometry harness_geometry(void);
/* A sequence configuration: vase_params_default(budget) with window, seed 1, default slack. */
struct vase_seq_config harness_seq_config(enum vase_policy policy, uint32_t budget, uint32_t window,
                                          uint32_t prompt_len, enum vase_mode mode);
/* Connects as name and registers g. 0 or -errno (nothing is left connected then). */
int harness_engine_open(const struct harness_daemon *d, const char *name,
                        const struct vase_geometry *g, struct vase_client **ret_client,
                        struct vase_model **ret_model);

/* Opens cfg without a wait until the arena refuses with -ENOSPC (fails the test on any other
 * error, or when most open); the number opened, in seqs[0 .. n). */
int harness_fill(struct vase_client *c, struct vase_model *m, struct vase_seq_config cfg,
                 struct vase_seq **seqs, int most);
/* Closes the non-NULL seqs[0 .. n) (asserting success) and sets them NULL. */
void harness_close_all(struct vase_seq **seqs, int n);

/* An open on a thread of its own (it blocks while it waits for admission). */
struct harness_opener {
    pthread_t thread;
    struct vase_client *c;
    struct vase_model *m;
    struct vase_seq_config cfg;
    struct vase_seq *s;
    int r;
    char error[512];
    volatile int done; /* set once the open has returned */
};
void harness_opener_start(struct harness_opener *o);
void harness_opener_join(struct harness_opener *o);

/* ---- test fixtures ---- */

#define HARNESS_MAX_CLIENTS 4

/* The start of every test file's fixture: a daemon of its own, clients, the prestate. */
struct harness_fixture {
    struct harness_daemon d;
    struct vase_client *c[HARNESS_MAX_CLIENTS]; /* disconnected by the teardown */
    const void *arg;                            /* the test's cmocka prestate */
};

/* For a cmocka setup: allocates size zeroed bytes (a struct that begins with a struct
 * harness_fixture) into *state, keeping the prestate in arg, and starts a daemon with args.
 * 0, or -1 with the reason printed. */
int harness_fixture_setup(void **state, size_t size, const char *const *args);
/* For a cmocka teardown, after the file's own clean-up: disconnects the clients, kills the
 * daemon if it still runs, removes its directory, frees the fixture. Returns 0. */
int harness_fixture_teardown(void **state);

/* ---- a raw session, for protocol tests ---- */

struct harness_session {
    int fd; /* the session socket; -1 when closed */
    uint8_t token[64];
    size_t token_len;
    uint32_t client_id;
    uint64_t incarnation;
    uint32_t max_message_bytes;
    uint64_t next_seq;        /* client_seq of the next request */
    void *zmq_ctx, *zmq_sock; /* the DEALER whose routing id is the token */
};
/* Opens session.sock, says hello and reads the welcome (closing the arena fds it carries), and
 * connects a DEALER whose routing id is the token. 0; -ECONNREFUSED and friends; the Error
 * code negated if the daemon refused. Close with harness_session_close() (also on a zeroed or
 * failed one: fd -1). */
int harness_session_open(const struct harness_daemon *d, struct harness_session *ret);
void harness_session_close(struct harness_session *s);
/* Sends e on the session's DEALER, version 1,
 * the session's incarnation and the next client_seq unless e has them, and waits for one
 * reply. As harness_request(). */
int harness_session_request(struct harness_session *s, Vase__Envelope *e, Vase__Envelope **ret);

/* ---- control requests without a session ---- */

/*
 * Sends one frame (buf, len) on control.sock from a fresh DEALER (routing id routing_id of
 * id_len bytes, or ZeroMQ's own when NULL) and waits for one reply frame, unpacked into *ret
 * (free with vase__envelope__free_unpacked(, NULL)). 0; -ETIMEDOUT without a reply; -EBADMSG
 * if the reply does not unpack; -EPROTO if it carries another protocol version.
 */
int harness_send_frame(const struct harness_daemon *d, const void *buf, size_t len,
                       const void *routing_id, size_t id_len, Vase__Envelope **ret);
/* Packs e (version 1 and a request id filled in when zero) and sends it as above. */
int harness_request(const struct harness_daemon *d, Vase__Envelope *e, Vase__Envelope **ret);
/* Sends a request whose body is msg (body_case names the member of the body union) from a fresh
 * DEALER and takes the reply into *ret (free it; NULL on transport failure). 0, -errno, or the
 * code of an Error reply negated (*ret set then too). */
int harness_call(const struct harness_daemon *d, Vase__Envelope__BodyCase body_case, void *msg,
                 Vase__Envelope **ret);
/* The error code of a reply: -code of an Error body, 0 for any other body. */
int harness_reply_error(const Vase__Envelope *reply);
/* Whether the daemon answers a Ping with a Pong of the same payload. 0 or -errno. */
int harness_ping(const struct harness_daemon *d);

struct harness_status {
    uint64_t incarnation;
    uint64_t bytes_total, bytes_free, bytes_pages; /* arena 0 (ArenaStatus) */
    uint32_t clients, seqs;
    uint64_t evictions_total, errors_total, stats_messages_total;
    uint64_t admin_errors_total; /* refused administrative requests */
    uint32_t opens_waiting;      /* OpenSeq requests parked for room */
    uint64_t budget_shrinks_total, budget_grows_total, bytes_reclaiming; /* elastic budgets */
    uint32_t seqs_shrunk;
    char metrics_address[64];      /* "" when the metrics are off */
    char metrics_unavailable[192]; /* why none are served when not off, or "" */
};
/* A Status request. 0 or -errno. */
int harness_status(const struct harness_daemon *d, struct harness_status *ret);
/* Status, asserting that it was answered (cmocka). */
struct harness_status harness_status_of(const struct harness_daemon *d);
/* Polls Status until want opens are parked (fails the test after HARNESS_WAIT_MS). */
void harness_wait_parked(const struct harness_daemon *d, uint32_t want);
/* Everything closed (waits for the last pages to come back): the arena is whole again, no open
 * is parked, no sequence is open or shrunk. */
void harness_assert_all_free(const struct harness_daemon *d);
/* Polls Status until clients == want. 0 or -ETIMEDOUT after timeout_ms. */
int harness_wait_clients(const struct harness_daemon *d, uint32_t want, int timeout_ms);
/* A ConfigSet request. 0 when the reply is a ConfigReply, else the Error code negated. */
int harness_config_set(const struct harness_daemon *d, const char *key, const char *value);
/* A GetSeq request; *ret is the whole reply envelope (body seq_info on success). 0, -errno, or
 * the Error code negated. */
int harness_get_seq(const struct harness_daemon *d, uint32_t seq_id, Vase__Envelope **ret);
/*
 * An HTTP/1.0 request "METHOD PATH" to the daemon's metrics endpoint (its address from Status);
 * the whole response, status line and headers included, into *ret (NUL-terminated; free it).
 * 0, -ENOTCONN when the metrics are off, or -errno.
 */
int harness_http(const struct harness_daemon *d, const char *method, const char *path, char **ret);
/* GET /metrics, checked to be a 200 of the text format; *ret points at the body inside the
 * response *ret_response (free that). 0 or -errno (-EPROTO for another answer). */
int harness_scrape(const struct harness_daemon *d, char **ret_response, const char **ret);
/* The value of the sample whose series is exactly `series` (name and labels as the daemon writes
 * them: `vase_requests_total{type="ping"}`), or NAN when there is none. */
double harness_metric(const char *text, const char *series);

/* Polls Status until bytes_pages (arena 0's bytes in pages of sequences) == want; the seconds
 * it took in *ret_seconds. 0 or -ETIMEDOUT after timeout_ms (the last count is printed). */
int harness_wait_bytes_pages(const struct harness_daemon *d, uint64_t want, int timeout_ms,
                             double *ret_seconds);
/* The bytes a sequence of the harness model holds (PROTOCOL.md "Memory", written out here, not
 * taken from the library): kv_pages pages and ring_pages ring pages of 64 KiB, and its plan page
 * for 4 keep lists of keep slots. */
uint64_t harness_seq_bytes(uint32_t kv_pages, uint32_t ring_pages, uint32_t keep);

/* ---- helper programs and child processes ---- */

struct harness_proc {
    pid_t pid;
    int out_fd; /* stdout and stderr together */
    char *out;  /* what was read so far, NUL-terminated */
    size_t len, cap;
};

/* Starts argv[0] (a path) with argv, stdin /dev/null, stdout+stderr into a pipe, and
 * VASE_RUNTIME_DIR set to d's directory when d is not NULL. 0 or -errno. */
int harness_proc_start(struct harness_proc *p, const char *const *argv,
                       const struct harness_daemon *d);
/* Reads output until it contains needle, the process exits, or timeout_ms. 0 when found,
 * -ETIMEDOUT, -ESRCH (output ended without it). */
int harness_proc_wait_output(struct harness_proc *p, const char *needle, int timeout_ms);
/* Reads all output and reaps the process within timeout_ms (then SIGKILL and -ETIMEDOUT).
 * 0 and the wait status in *ret_status. */
int harness_proc_finish(struct harness_proc *p, int timeout_ms, int *ret_status);
/* Kills (if running) and reaps; frees the output. */
void harness_proc_free(struct harness_proc *p);

/* Runs argv to the end (harness_proc_start + finish); the output is in p->out on return, also
 * on failure (free with harness_proc_free()). Returns the exit code (>= 0), -EINTR if it died
 * of a signal, or -errno. */
int harness_run(struct harness_proc *p, const char *const *argv, const struct harness_daemon *d,
                int timeout_ms);

/* Forks a child that runs fn(arg) and exits with its return value (never returning into the
 * test framework). The caller must hold no ZeroMQ context or libvase client at that moment. */
int harness_fork(int (*fn)(void *arg), void *arg, pid_t *ret_pid);
/* Waits for pid within timeout_ms (SIGKILL and -ETIMEDOUT after). 0 and the wait status. */
int harness_wait_pid(pid_t pid, int timeout_ms, int *ret_status);

/* ---- engine data ---- */

/*
 * Token-identifying data. The K row of token t (layer l, KV head h) holds t % 64 and t / 64 in
 * its last two elements (exact in every dtype for t < 4096) and small multiples of 1/64 from a
 * hash of (t, l, h, d) elsewhere; the V row holds hash values everywhere; queries hold hash
 * values and zeros where K carries the token, so attention does not depend on the id.
 * salt tells two engines' data apart.
 */
float harness_kv_value(uint32_t salt, uint32_t token, uint32_t layer, uint32_t head, uint32_t d,
                       enum vase_kv kv, uint32_t dim);

/* Writes K and V of token at slot (every layer and KV head) and its query, when the policy has
 * a query ring, for position token. 0 or -EINVAL (slot or dtype out of range). */
int harness_write_token(struct vase_seq *s, const struct vase_geometry *g, uint32_t salt,
                        uint32_t slot, uint32_t token);
/* Writes the tokens at positions vase_seq_position() .. + n - 1 into slots len .. len + n - 1
 * and appends them: as one vase_seq_append(n) when one_call, else one token per call. Returns
 * the number of plans applied on the way, or the first error. */
int harness_append_tokens(struct vase_seq *s, const struct vase_geometry *g, uint32_t salt,
                          uint32_t n, bool one_call);
/* The token whose K and V rows (layer, head) sit in slot, or -1 if the rows match no token's
 * data (corruption), -EINVAL if slot is out of range. */
int harness_slot_token(const struct vase_seq *s, const struct vase_geometry *g, uint32_t salt,
                       uint32_t layer, uint32_t head, uint32_t slot);
/* Tokens of every (layer, head, slot < len) into tokens[(layer * kv_heads + head) * len + slot]
 * (malloc'd); 0, or -EBADMSG at the first slot whose rows match no token (printed). */
int harness_snapshot(const struct vase_seq *s, const struct vase_geometry *g, uint32_t salt,
                     int32_t **ret_tokens, uint32_t *ret_len);
/*
 * Checks that after (len_after slots) is what compacting before (len_before slots) by a valid
 * plan gives: per (layer, head) the first keep slots hold distinct tokens that were among the
 * candidates [0, n) of before, and the rest hold before's slots n .. in order followed by
 * tokens first_new, first_new + 1, ... (appended after the snapshot). 0 or -EINVAL (the first
 * difference is printed).
 */
int harness_check_plan(const int32_t *before, uint32_t len_before, const int32_t *after,
                       uint32_t len_after, uint32_t lists, uint32_t keep, uint32_t n,
                       uint32_t first_new);
