/* SPDX-License-Identifier: MIT */

/*
 * Elastic budgets against a real vased. Sequences opened with a min_budget give up budget to
 * an open that waits for room: their next plan keeps a lower budget, its commit releases pages,
 * the open is admitted; when nothing waits any more they grow back at a later commit. Shown
 * here through libvase, Status, GetSeq and the event stream: the shrink and the growth, with
 * the data intact and the books balanced at every step; nothing moves for sequences that are
 * not elastic, nor for an open the minimums cannot make room for; a plan in flight keeps the
 * budget it was asked with; an open that gives up leaves every target back at its cap; a client
 * that dies while its sequences shrink leaves nothing behind; the engine's own cap
 * (vase_seq_set_budget()). Every ordering comes from Status or GetSeq, never from sleeping.
 */

#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "integration/harness.h"
#include "vase_admin.h"

#define LONG_WAIT_MS 120000
/* The sequences here: streaming, window 32, slack 32, 64-token pages of one granule. Budget
 * 704 holds 12 KV pages; min_budget 320 holds 6. */
#define MAX_BUDGET 704u
#define MIN_BUDGET 320u
#define MAX_SEQS 64

static int setup(void **state) {
    return harness_fixture_setup(state, sizeof(struct harness_fixture), NULL);
}

static struct vase_seq_config seq_cfg(uint32_t min_budget, int32_t wait_ms) {
    struct vase_seq_config cfg =
        harness_seq_config(VASE_POLICY_STREAMING, MAX_BUDGET, 32, 0, VASE_MODE_ASYNC);
    cfg.min_budget = min_budget;
    cfg.admission_wait_ms = wait_ms;
    return cfg;
}

/* What GetSeq says of s (freed by the caller with vase__envelope__free_unpacked). */
static Vase__Envelope *info_of(const struct harness_daemon *d, const struct vase_seq *s) {
    Vase__Envelope *e;
    assert_int_equal(harness_get_seq(d, vase_seq_id(s), &e), 0);
    assert_int_equal(e->body_case, VASE__ENVELOPE__BODY_SEQ_INFO);
    return e;
}

/* The books: the bytes in pages of sequences are those the open sequences hold, each one's
 * as GetSeq reports it; its budget and capacity are the engine's once the engine's commits are
 * in (flushed). */
static void assert_balanced(const struct harness_daemon *d, struct vase_seq **a, int na,
                            struct vase_seq *extra) {
    uint64_t held = 0;
    for (int i = 0; i <= na; i++) {
        struct vase_seq *s = i < na ? a[i] : extra;
        if (!s)
            continue;
        assert_int_equal(vase_seq_flush(s), 0);
        Vase__Envelope *e = info_of(d, s);
        const Vase__SeqInfo *si = e->seq_info;
        assert_int_equal(si->budget, vase_seq_budget(s));
        assert_int_equal(si->capacity, vase_seq_capacity(s));
        assert_true(si->min_budget <= si->budget && si->budget <= si->max_budget);
        assert_true(si->min_budget <= si->target_budget && si->target_budget <= si->cap_budget);
        held += si->bytes;
        vase__envelope__free_unpacked(e, NULL);
    }
    assert_int_equal(harness_status_of(d).bytes_pages, held);
}

/* The rows of every slot of s are those of the tokens (salt 1) written there: compactions
 * moved whole rows and nothing else wrote them. */
static void assert_intact(const struct vase_seq *s) {
    struct vase_geometry g = harness_geometry();
    int32_t *tokens;
    uint32_t len;
    assert_int_equal(harness_snapshot(s, &g, 1, &tokens, &len), 0);
    free(tokens);
}

/* Two engines on the harness model: c[0] as name, whose model is *ret_m0, and the newcomer's
 * c[1], whose model is *ret_m1; then c[0] fills the arena with sequences of min_budget (from
 * seqs[first] on, after those already there). The number c[0] opened. */
static int two_engines(struct harness_fixture *f, const char *name, uint32_t min_budget,
                       struct vase_model **ret_m0, struct vase_model **ret_m1,
                       struct vase_seq **seqs, int first) {
    struct vase_geometry g = harness_geometry();
    assert_int_equal(harness_engine_open(&f->d, name, &g, &f->c[0], ret_m0), 0);
    assert_int_equal(harness_engine_open(&f->d, "newcomer", &g, &f->c[1], ret_m1), 0);
    if (first < 0)
        return 0;
    return harness_fill(f->c[0], *ret_m0, seq_cfg(min_budget, 0), seqs + first, MAX_SEQS - first);
}

typedef bool (*until_fn)(void *arg);

/* Decodes every open sequence of seqs, a window of tokens each per round, until done(arg). */
static void decode_until(struct vase_seq **seqs, int n, until_fn done, void *arg) {
    struct vase_geometry g = harness_geometry();
    double end = harness_now() + HARNESS_WAIT_MS / 1000.0;
    while (!done(arg)) {
        if (harness_now() > end)
            fail_msg("decoding did not get there");
        for (int i = 0; i < n; i++)
            if (seqs[i]) {
                assert_true(harness_append_tokens(seqs[i], &g, 1, 32, false) >= 0);
                assert_true(vase_seq_poll(seqs[i]) >= 0);
            }
    }
}

static bool opener_done(void *arg) {
    return __atomic_load_n(&((struct harness_opener *)arg)->done, __ATOMIC_ACQUIRE);
}

struct budgets {
    struct vase_seq **seqs;
    int n;
    uint32_t want;
};

static bool all_at(void *arg) {
    const struct budgets *b = arg;
    for (int i = 0; i < b->n; i++)
        if (b->seqs[i] && vase_seq_budget(b->seqs[i]) != b->want)
            return false;
    return true;
}

/* A subscriber that is known to be subscribed: events are made (a sequence opened and closed)
 * until one arrives. */
static struct vase_admin_events *subscribe(const struct harness_daemon *d, struct vase_admin **ret,
                                           struct vase_client *c, struct vase_model *m) {
    struct vase_admin *a;
    struct vase_admin_events *ev;
    struct vase_seq_config cfg = seq_cfg(0, 0);
    assert_int_equal(
        vase_admin_new(&(struct vase_admin_options){.runtime_dir = d->dir, .timeout_ms = 250}, &a),
        0);
    assert_int_equal(vase_admin_connect(a), 0);
    assert_int_equal(vase_admin_events_subscribe(a, &ev), 0);
    double end = harness_now() + HARNESS_WAIT_MS / 1000.0;
    for (;;) {
        char topic[64];
        Vase__Event *e = NULL;
        struct vase_seq *s;
        assert_int_equal(vase_seq_open(c, m, &cfg, &s), 0);
        assert_int_equal(vase_seq_close(s), 0);
        int r;
        do
            r = vase_admin_events_next(ev, topic, sizeof(topic), &e);
        while (r == -EINTR);
        if (r == 1) {
            protobuf_c_message_free_unpacked(&e->base, NULL);
            break;
        }
        assert_true(r >= 0 && harness_now() < end);
    }
    *ret = a;
    return ev;
}

/* Reads events until a budget_change of seq_id with reason ("make-room" and "cap" lower it,
 * "grow" raises it; old_budget, when not 0, is the budget it changed from); fails if none
 * comes. */
static void expect_budget_event(struct vase_admin_events *ev, uint32_t seq_id, const char *reason,
                                uint32_t old_budget) {
    double end = harness_now() + HARNESS_WAIT_MS / 1000.0;
    while (harness_now() < end) {
        char topic[64];
        Vase__Event *e = NULL;
        int r = vase_admin_events_next(ev, topic, sizeof(topic), &e);
        if (r == -EINTR || r == 0)
            continue;
        assert_int_equal(r, 1);
        bool found = e->body_case == VASE__EVENT__BODY_BUDGET_CHANGE &&
                     e->budget_change->seq_id == seq_id &&
                     strcmp(e->budget_change->reason, reason) == 0;
        if (found) {
            const Vase__BudgetChange *bc = e->budget_change;
            assert_string_equal(topic, "budget");
            if (old_budget)
                assert_int_equal(bc->old_budget, old_budget);
            if (strcmp(reason, "grow") == 0)
                assert_true(bc->new_budget > bc->old_budget);
            else
                assert_true(bc->new_budget < bc->old_budget);
            assert_true(bc->new_budget >= MIN_BUDGET && bc->new_budget <= MAX_BUDGET);
        }
        protobuf_c_message_free_unpacked(&e->base, NULL);
        if (found)
            return;
    }
    fail_msg("no budget_change %s event for sequence %u", reason, seq_id);
}

/* The arena full of a client's elastic sequences; another client's open waits. Decoding makes
 * the room: the waiting open is admitted, some budgets went down (not below min_budget), the
 * data is intact, the books balance. When the newcomer closes, budgets grow back to the full
 * budget at later commits. */
static void test_shrink_then_grow_back(void **state) {
    struct harness_fixture *f = *state;
    struct vase_geometry g = harness_geometry();
    struct vase_model *m0, *m1;
    struct vase_admin *a;
    assert_int_equal(harness_engine_open(&f->d, "elastic", &g, &f->c[0], &m0), 0);
    assert_int_equal(harness_engine_open(&f->d, "newcomer", &g, &f->c[1], &m1), 0);
    struct vase_admin_events *ev = subscribe(&f->d, &a, f->c[0], m0);
    struct vase_seq *seqs[MAX_SEQS] = {0};
    int n = harness_fill(f->c[0], m0, seq_cfg(MIN_BUDGET, 0), seqs, MAX_SEQS);
    assert_true(n >= 3);
    for (int i = 0; i < n; i++) {
        assert_int_equal(vase_seq_budget(seqs[i]), MAX_BUDGET);
        assert_int_equal(vase_seq_min_budget(seqs[i]), MIN_BUDGET);
    }

    struct harness_opener o = {.c = f->c[1], .m = m1, .cfg = seq_cfg(0, LONG_WAIT_MS)};
    harness_opener_start(&o);
    harness_wait_parked(&f->d, 1);
    /* Parked: targets went down, nothing was released yet. */
    struct harness_status st = harness_status_of(&f->d);
    assert_true(st.bytes_reclaiming >= 12 * (uint64_t)HARNESS_PAGE_BYTES - st.bytes_free);
    assert_int_equal(st.budget_shrinks_total, 0);

    decode_until(seqs, n, opener_done, &o);
    harness_opener_join(&o);
    assert_int_equal(o.r, 0);
    assert_int_equal(vase_seq_budget(o.s), MAX_BUDGET);
    int shrunk = 0;
    for (int i = 0; i < n; i++) {
        uint32_t b = vase_seq_budget(seqs[i]);
        assert_true(b >= MIN_BUDGET && b <= MAX_BUDGET && b % 32 == 0);
        if (b < MAX_BUDGET) {
            shrunk++;
            struct vase_seq_stats ss;
            vase_seq_get_stats(seqs[i], &ss);
            assert_true(ss.budget_changes >= 1);
            /* Compacted to the lower budget, the rows are still the tokens'. */
            assert_intact(seqs[i]);
        }
    }
    assert_true(shrunk >= 1);
    assert_int_equal(harness_status_of(&f->d).opens_waiting, 0);
    assert_true(harness_status_of(&f->d).budget_shrinks_total >= (uint64_t)shrunk);
    assert_balanced(&f->d, seqs, n, o.s);
    int x = 0;
    while (vase_seq_budget(seqs[x]) == MAX_BUDGET)
        x++;
    expect_budget_event(ev, vase_seq_id(seqs[x]), "make-room", MAX_BUDGET);

    /* The newcomer decodes like any other (through evictions), then leaves: everyone grows
     * back. */
    assert_true(harness_append_tokens(o.s, &g, 2, 3 * MAX_BUDGET, false) >= 1);
    assert_int_equal(vase_seq_close(o.s), 0);
    struct budgets full = {.seqs = seqs, .n = n, .want = MAX_BUDGET};
    decode_until(seqs, n, all_at, &full);
    st = harness_status_of(&f->d);
    assert_true(st.budget_grows_total >= (uint64_t)shrunk);
    assert_int_equal(st.seqs_shrunk, 0);
    assert_balanced(&f->d, seqs, n, NULL);
    expect_budget_event(ev, vase_seq_id(seqs[x]), "grow", 0);
    assert_intact(seqs[x]);
    harness_close_all(seqs, n);
    harness_assert_all_free(&f->d);
    assert_null(vase_admin_events_free(ev));
    assert_null(vase_admin_free(a));
}

/* The budget_changes GetSeq counts for s. */
static uint32_t changes_of(const struct harness_daemon *d, const struct vase_seq *s) {
    Vase__Envelope *e = info_of(d, s);
    uint32_t n = e->seq_info->budget_changes;
    vase__envelope__free_unpacked(e, NULL);
    return n;
}

/* The target GetSeq reports for s. */
static uint32_t target_of(const struct harness_daemon *d, const struct vase_seq *s) {
    Vase__Envelope *e = info_of(d, s);
    uint32_t t = e->seq_info->target_budget;
    vase__envelope__free_unpacked(e, NULL);
    return t;
}

/* Sequences opened without a min_budget never change budget: with two of them beside the
 * elastic ones, only the elastic ones make room; with none elastic, the waiting open is refused
 * when its wait passes and nobody's budget moved. */
static void test_not_elastic_never_moves(void **state) {
    struct harness_fixture *f = *state;
    struct vase_model *m0, *m1;
    struct vase_seq *seqs[MAX_SEQS] = {0};
    two_engines(f, "mixed", 0, &m0, &m1, seqs, -1);
    struct vase_seq_config plain = seq_cfg(0, 0);
    assert_int_equal(vase_seq_open(f->c[0], m0, &plain, &seqs[0]), 0);
    assert_int_equal(vase_seq_open(f->c[0], m0, &plain, &seqs[1]), 0);
    int n = 2 + harness_fill(f->c[0], m0, seq_cfg(MIN_BUDGET, 0), seqs + 2, MAX_SEQS - 2);
    assert_true(n >= 4);

    struct harness_opener o = {.c = f->c[1], .m = m1, .cfg = seq_cfg(0, LONG_WAIT_MS)};
    harness_opener_start(&o);
    harness_wait_parked(&f->d, 1);
    assert_int_equal(target_of(&f->d, seqs[0]), MAX_BUDGET);
    decode_until(seqs, n, opener_done, &o);
    harness_opener_join(&o);
    assert_int_equal(o.r, 0);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(vase_seq_budget(seqs[i]), MAX_BUDGET);
        assert_int_equal(changes_of(&f->d, seqs[i]), 0);
        assert_true(vase_seq_rounds(seqs[i]) >= 1); /* they did evict meanwhile */
    }
    assert_balanced(&f->d, seqs, n, o.s);
    assert_int_equal(vase_seq_close(o.s), 0);
    harness_close_all(seqs, n);
    harness_assert_all_free(&f->d);

    /* None elastic: no room is made; the wait passes. */
    uint64_t shrinks = harness_status_of(&f->d).budget_shrinks_total;
    n = harness_fill(f->c[0], m0, plain, seqs, MAX_SEQS);
    struct harness_opener late = {.c = f->c[1], .m = m1, .cfg = seq_cfg(0, 300)};
    harness_opener_start(&late);
    decode_until(seqs, n, opener_done, &late);
    harness_opener_join(&late);
    assert_int_equal(late.r, -ENOSPC);
    assert_non_null(strstr(late.error, "waited 300 ms"));
    for (int i = 0; i < n; i++)
        assert_int_equal(vase_seq_budget(seqs[i]), MAX_BUDGET);
    assert_int_equal(harness_status_of(&f->d).budget_shrinks_total, shrinks);
    harness_close_all(seqs, n);
    harness_assert_all_free(&f->d);
}

/* Minimums that cannot make the room: no target moves for an open that cannot be admitted by
 * lowering them (nothing is changed for anyone), and it is refused when its wait passes. */
static void test_minimums_too_high(void **state) {
    struct harness_fixture *f = *state;
    struct vase_model *m0, *m1;
    struct vase_seq *seqs[MAX_SEQS] = {0};
    /* min_budget 640 keeps 11 of the 12 pages: a few sequences free far less than 12 pages. */
    int n = two_engines(f, "stubborn", 640, &m0, &m1, seqs, 0);
    assert_true(n >= 3 && n < 8);
    struct harness_opener o = {.c = f->c[1], .m = m1, .cfg = seq_cfg(0, 3000)};
    harness_opener_start(&o);
    harness_wait_parked(&f->d, 1);
    for (int i = 0; i < n; i++)
        assert_int_equal(target_of(&f->d, seqs[i]), MAX_BUDGET);
    decode_until(seqs, n, opener_done, &o);
    harness_opener_join(&o);
    assert_int_equal(o.r, -ENOSPC);
    for (int i = 0; i < n; i++) {
        assert_int_equal(vase_seq_budget(seqs[i]), MAX_BUDGET);
        assert_int_equal(changes_of(&f->d, seqs[i]), 0);
    }
    harness_close_all(seqs, n);
    harness_assert_all_free(&f->d);
}

/* The waiting open gives up while the room is being made (no sequence decodes, so none has
 * reached its next plan): every target is back at its cap, and later plans keep the full
 * budget. */
static void test_newcomer_gives_up(void **state) {
    struct harness_fixture *f = *state;
    struct vase_geometry g = harness_geometry();
    struct vase_model *m0, *m1;
    struct vase_seq *seqs[MAX_SEQS] = {0};
    int n = two_engines(f, "idle", MIN_BUDGET, &m0, &m1, seqs, 0);
    struct harness_opener o = {.c = f->c[1], .m = m1, .cfg = seq_cfg(0, 5000)};
    harness_opener_start(&o);
    harness_wait_parked(&f->d, 1);
    bool lowered = false;
    for (int i = 0; i < n; i++)
        lowered |= target_of(&f->d, seqs[i]) < MAX_BUDGET;
    assert_true(lowered);
    assert_true(harness_status_of(&f->d).bytes_reclaiming > 0);
    harness_opener_join(&o);
    assert_int_equal(o.r, -ENOSPC);
    for (int i = 0; i < n; i++)
        assert_int_equal(target_of(&f->d, seqs[i]), MAX_BUDGET);
    assert_int_equal(harness_status_of(&f->d).bytes_reclaiming, 0);
    for (int i = 0; i < n; i++)
        assert_true(harness_append_tokens(seqs[i], &g, 1, 3 * MAX_BUDGET, false) >= 1);
    for (int i = 0; i < n; i++) {
        assert_int_equal(vase_seq_budget(seqs[i]), MAX_BUDGET);
        assert_int_equal(changes_of(&f->d, seqs[i]), 0);
    }
    harness_close_all(seqs, n);
    harness_assert_all_free(&f->d);
}

static bool planning(void *arg) {
    void **a = arg;
    Vase__Envelope *e = info_of(a[0], a[1]);
    bool busy = strcmp(e->seq_info->state, "idle") != 0;
    vase__envelope__free_unpacked(e, NULL);
    return busy;
}

/* A plan asked for before the budget is lowered keeps the budget of its request; the lower one
 * comes with the next plan. */
static void test_plan_in_flight(void **state) {
    struct harness_fixture *f = *state;
    struct vase_geometry g = harness_geometry();
    struct vase_model *m0, *m1;
    struct vase_seq *seqs[MAX_SEQS] = {0};
    int n = two_engines(f, "inflight", MIN_BUDGET, &m0, &m1, seqs, 0);
    /* Up to the first request of seqs[0], which the daemon has taken before the open parks. */
    assert_int_equal(harness_append_tokens(seqs[0], &g, 1, MAX_BUDGET + 32, true), 0);
    decode_until(NULL, 0, planning, (void *[]){&f->d, seqs[0]});
    struct harness_opener o = {.c = f->c[1], .m = m1, .cfg = seq_cfg(0, LONG_WAIT_MS)};
    harness_opener_start(&o);
    harness_wait_parked(&f->d, 1);
    assert_true(target_of(&f->d, seqs[0]) < MAX_BUDGET);
    assert_int_equal(vase_seq_wait(seqs[0]), 1);
    assert_int_equal(vase_seq_rounds(seqs[0]), 1);
    assert_int_equal(vase_seq_budget(seqs[0]), MAX_BUDGET);
    assert_int_equal(vase_seq_len(seqs[0]), MAX_BUDGET);
    assert_balanced(&f->d, seqs, n, NULL);
    decode_until(seqs, n, opener_done, &o);
    harness_opener_join(&o);
    assert_int_equal(o.r, 0);
    assert_balanced(&f->d, seqs, n, o.s);
    assert_int_equal(vase_seq_close(o.s), 0);
    harness_close_all(seqs, n);
    harness_assert_all_free(&f->d);
}

struct child_opener {
    const struct harness_daemon *d;
    int go_fd; /* a byte once the arena is full */
};

/* The child: connects, waits for the word, then opens with a long wait (it is killed while the
 * open waits). */
static int run_child_opener(void *arg) {
    struct child_opener *co = arg;
    struct vase_geometry g = harness_geometry();
    struct vase_client *c;
    struct vase_model *m;
    struct vase_seq *s;
    char b;
    if (harness_engine_open(co->d, "doomed-newcomer", &g, &c, &m) < 0 ||
        read(co->go_fd, &b, 1) != 1)
        return 2;
    struct vase_seq_config cfg = seq_cfg(0, LONG_WAIT_MS);
    return vase_seq_open(c, m, &cfg, &s) == 0 ? 3 : 4;
}

/* A plan asked for after the budget was lowered keeps the lower budget even when the open it
 * made room for is gone (its client died) by the time the plan commits; the budget comes back
 * at a later commit, not at that one (a commit either releases pages or takes them). */
static void test_shrink_after_give_up(void **state) {
    struct harness_fixture *f = *state;
    int go[2];
    assert_int_equal(pipe(go), 0);
    struct child_opener co = {.d = &f->d, .go_fd = go[0]};
    pid_t pid;
    assert_int_equal(harness_fork(run_child_opener, &co, &pid), 0);
    close(go[0]);

    struct vase_geometry g = harness_geometry();
    struct vase_model *m;
    assert_int_equal(harness_engine_open(&f->d, "late", &g, &f->c[0], &m), 0);
    assert_int_equal(harness_wait_clients(&f->d, 2, HARNESS_WAIT_MS), 0);
    struct vase_seq *seqs[MAX_SEQS] = {0};
    int n = harness_fill(f->c[0], m, seq_cfg(MIN_BUDGET, 0), seqs, MAX_SEQS);
    assert_int_equal(write(go[1], "x", 1), 1);
    close(go[1]);
    harness_wait_parked(&f->d, 1);
    int x = 0;
    while (target_of(&f->d, seqs[x]) == MAX_BUDGET)
        x++;
    uint32_t target = target_of(&f->d, seqs[x]);
    /* Its first request now: the plan keeps the target. Then the newcomer dies. */
    assert_int_equal(harness_append_tokens(seqs[x], &g, 1, MAX_BUDGET + 32, true), 0);
    decode_until(NULL, 0, planning, (void *[]){&f->d, seqs[x]});
    assert_int_equal(kill(pid, SIGKILL), 0);
    int status;
    assert_int_equal(harness_wait_pid(pid, HARNESS_WAIT_MS, &status), 0);
    assert_int_equal(harness_wait_clients(&f->d, 1, HARNESS_WAIT_MS), 0);
    assert_int_equal(harness_status_of(&f->d).opens_waiting, 0);
    assert_int_equal(target_of(&f->d, seqs[x]), MAX_BUDGET);

    assert_int_equal(vase_seq_wait(seqs[x]), 1);
    assert_int_equal(vase_seq_flush(seqs[x]), 0);
    assert_int_equal(vase_seq_len(seqs[x]), target);
    assert_int_equal(vase_seq_budget(seqs[x]), target);
    assert_int_equal(changes_of(&f->d, seqs[x]), 1);
    assert_balanced(&f->d, seqs, n, NULL);
    /* Decoding on from the shorter length: the budget comes back at a later commit, into new
     * pages. */
    struct vase_seq *one[1] = {seqs[x]};
    decode_until(one, 1, all_at, &(struct budgets){.seqs = one, .n = 1, .want = MAX_BUDGET});
    assert_int_equal(vase_seq_flush(seqs[x]), 0);
    assert_int_equal(changes_of(&f->d, seqs[x]), 2);
    struct vase_seq_stats st;
    vase_seq_get_stats(seqs[x], &st);
    assert_int_equal(st.budget_changes, 2);
    assert_int_equal(vase_seq_capacity(seqs[x]), 12 * 64);
    assert_balanced(&f->d, seqs, n, NULL);
    assert_true(harness_append_tokens(seqs[x], &g, 1, 2 * MAX_BUDGET, false) >= 1);
    assert_intact(seqs[x]);
    harness_close_all(seqs, n);
    harness_assert_all_free(&f->d);
}

struct child_engine {
    const struct harness_daemon *d;
    int ready_fd; /* a byte once the arena is full */
    int go_fd;    /* a byte when it may decode */
};

/* The child: fills the arena with elastic sequences, says so, and when told decodes until it is
 * killed. */
static int run_child_engine(void *arg) {
    struct child_engine *ce = arg;
    struct vase_geometry g = harness_geometry();
    struct vase_client *c;
    struct vase_model *m;
    struct vase_seq *seqs[MAX_SEQS] = {0};
    struct vase_seq_config cfg = seq_cfg(MIN_BUDGET, 0);
    int n = 0;
    if (harness_engine_open(ce->d, "doomed", &g, &c, &m) < 0)
        return 2;
    while (n < MAX_SEQS && vase_seq_open(c, m, &cfg, &seqs[n]) == 0)
        n++;
    char b;
    if (write(ce->ready_fd, "x", 1) != 1 || read(ce->go_fd, &b, 1) != 1)
        return 3;
    for (;;)
        for (int i = 0; i < n; i++)
            if (harness_append_tokens(seqs[i], &g, 1, 32, false) < 0)
                return 4;
}

/* The client of the shrinking sequences dies in the middle of it (targets lowered, plans
 * perhaps under way): its memory returns, the waiting open is admitted, nothing is left
 * over. */
static void test_client_dies_while_shrinking(void **state) {
    struct harness_fixture *f = *state;
    int ready[2], go[2];
    assert_int_equal(pipe(ready), 0);
    assert_int_equal(pipe(go), 0);
    struct child_engine ce = {.d = &f->d, .ready_fd = ready[1], .go_fd = go[0]};
    pid_t pid;
    assert_int_equal(harness_fork(run_child_engine, &ce, &pid), 0);
    close(ready[1]);
    close(go[0]);
    char b;
    assert_int_equal(read(ready[0], &b, 1), 1);
    close(ready[0]);

    struct vase_geometry g = harness_geometry();
    struct vase_model *m;
    assert_int_equal(harness_engine_open(&f->d, "newcomer", &g, &f->c[0], &m), 0);
    struct harness_opener o = {.c = f->c[0], .m = m, .cfg = seq_cfg(0, LONG_WAIT_MS)};
    harness_opener_start(&o);
    harness_wait_parked(&f->d, 1);
    /* Targets lowered; the child starts its plans and dies with them under way. */
    assert_true(harness_status_of(&f->d).bytes_reclaiming > 0);
    assert_int_equal(write(go[1], "x", 1), 1);
    close(go[1]);
    assert_int_equal(kill(pid, SIGKILL), 0);
    int status;
    assert_int_equal(harness_wait_pid(pid, HARNESS_WAIT_MS, &status), 0);
    assert_true(WIFSIGNALED(status));
    harness_opener_join(&o);
    assert_int_equal(o.r, 0);
    assert_int_equal(harness_wait_clients(&f->d, 1, HARNESS_WAIT_MS), 0);
    struct harness_status st = harness_status_of(&f->d);
    assert_int_equal(st.seqs, 1);
    assert_int_equal(st.bytes_reclaiming, 0);
    assert_balanced(&f->d, NULL, 0, o.s);
    assert_int_equal(vase_seq_close(o.s), 0);
    harness_assert_all_free(&f->d);
}

/* The engine's own cap: lowered, the next plan keeps it and pages go back; raised, the sequence
 * grows back at a later commit. Out of range is refused, by libvase and by the daemon. */
static void test_set_budget(void **state) {
    struct harness_fixture *f = *state;
    struct vase_geometry g = harness_geometry();
    struct vase_model *m;
    struct vase_admin *a;
    assert_int_equal(harness_engine_open(&f->d, "capped", &g, &f->c[0], &m), 0);
    struct vase_admin_events *ev = subscribe(&f->d, &a, f->c[0], m);
    struct vase_seq *s, *plain;
    struct vase_seq_config cfg = seq_cfg(MIN_BUDGET, 0);
    assert_int_equal(vase_seq_open(f->c[0], m, &cfg, &s), 0);
    cfg.min_budget = 0;
    assert_int_equal(vase_seq_open(f->c[0], m, &cfg, &plain), 0);
    assert_int_equal(vase_seq_set_budget(s, 300), -EINVAL);
    assert_int_equal(vase_seq_set_budget(s, MIN_BUDGET - 32), -EINVAL);
    assert_int_equal(vase_seq_set_budget(s, MAX_BUDGET + 32), -EINVAL);
    assert_int_equal(vase_seq_set_budget(plain, MAX_BUDGET - 32), -EINVAL);
    assert_int_equal(vase_seq_set_budget(plain, MAX_BUDGET), 0);
    assert_int_equal(vase_seq_set_budget(NULL, MAX_BUDGET), -EINVAL);

    uint64_t before = harness_status_of(&f->d).bytes_pages;
    assert_int_equal(vase_seq_set_budget(s, MIN_BUDGET), 0);
    assert_int_equal(target_of(&f->d, s), MIN_BUDGET);
    assert_int_equal(vase_seq_budget(s), MAX_BUDGET); /* until the next plan */
    struct vase_seq *one[1] = {s};
    decode_until(one, 1, all_at, &(struct budgets){.seqs = one, .n = 1, .want = MIN_BUDGET});
    expect_budget_event(ev, vase_seq_id(s), "cap", MAX_BUDGET);
    assert_int_equal(vase_seq_flush(s), 0);
    assert_int_equal(vase_seq_capacity(s), 6 * 64);
    assert_int_equal(harness_status_of(&f->d).bytes_pages,
                     before - 6 * (uint64_t)HARNESS_PAGE_BYTES);
    assert_balanced(&f->d, one, 1, plain);

    assert_int_equal(vase_seq_set_budget(s, MAX_BUDGET), 0);
    decode_until(one, 1, all_at, &(struct budgets){.seqs = one, .n = 1, .want = MAX_BUDGET});
    expect_budget_event(ev, vase_seq_id(s), "grow", 0);
    assert_int_equal(vase_seq_capacity(s), 12 * 64);
    assert_int_equal(harness_status_of(&f->d).bytes_pages, before);
    assert_balanced(&f->d, one, 1, plain);
    /* The pages it took back work like the others. */
    assert_true(harness_append_tokens(s, &g, 1, 2 * MAX_BUDGET, false) >= 1);
    assert_intact(s);
    assert_int_equal(vase_seq_close(s), 0);
    assert_int_equal(vase_seq_close(plain), 0);
    harness_assert_all_free(&f->d);
    assert_null(vase_admin_events_free(ev));
    assert_null(vase_admin_free(a));
}

struct polled {
    struct vase_open *o;
    struct vase_seq *s;
    int r;
};

static bool poll_open(void *arg) {
    struct polled *p = arg;
    p->r = vase_open_poll(p->o, &p->s);
    assert_true(p->r >= 0);
    return p->r == 1;
}

/* One thread, one client, as a scheduler loop: the arena full of the engine's own elastic
 * sequences, an open that does not block, and decoding meanwhile makes its room. A cancelled
 * open that is admitted later is closed again by libvase: nothing stays held. */
static void test_single_thread_engine(void **state) {
    struct harness_fixture *f = *state;
    struct vase_geometry g = harness_geometry();
    struct vase_model *m;
    assert_int_equal(harness_engine_open(&f->d, "scheduler", &g, &f->c[0], &m), 0);
    struct vase_seq *seqs[MAX_SEQS] = {0};
    int n = harness_fill(f->c[0], m, seq_cfg(MIN_BUDGET, 0), seqs, MAX_SEQS);
    struct vase_seq_config cfg = seq_cfg(0, LONG_WAIT_MS);
    struct polled p = {.s = NULL};
    assert_int_equal(vase_seq_open_async(f->c[0], m, &cfg, &p.o), 0);
    harness_wait_parked(&f->d, 1);
    assert_int_equal(vase_open_poll(p.o, &p.s), 0);
    assert_null(p.s);
    decode_until(seqs, n, poll_open, &p);
    assert_non_null(p.s);
    assert_int_equal(vase_seq_budget(p.s), MAX_BUDGET);
    assert_true(harness_append_tokens(p.s, &g, 2, 2 * MAX_BUDGET, false) >= 1);
    assert_balanced(&f->d, seqs, n, p.s);
    assert_int_equal(vase_seq_close(p.s), 0);

    /* Refused like vase_seq_open(), at once: a quota. */
    assert_int_equal(harness_config_set(&f->d, "max_seqs_per_client", "1"), 0);
    assert_int_equal(vase_seq_open_async(f->c[0], m, &cfg, &p.o), 0);
    do
        p.r = vase_open_poll(p.o, &p.s);
    while (p.r == 0);
    assert_int_equal(p.r, -EDQUOT);
    assert_non_null(strstr(vase_last_error(f->c[0]), "max_seqs_per_client"));
    assert_int_equal(harness_config_set(&f->d, "max_seqs_per_client", "1024"), 0);
    /* Refused by libvase before anything is sent. */
    struct vase_seq_config bad = seq_cfg(MIN_BUDGET + 1, 0);
    assert_int_equal(vase_seq_open_async(f->c[0], m, &bad, &p.o), -EINVAL);
    assert_int_equal(vase_seq_open_async(f->c[0], m, &cfg, NULL), -EINVAL);
    assert_int_equal(vase_open_poll(NULL, &p.s), -EINVAL);

    /* Given up while parked; the room comes later: admitted, and closed again by libvase.
     * (The newcomer's room is taken again first.) */
    struct vase_seq *more[MAX_SEQS] = {0};
    int n_more = harness_fill(f->c[0], m, seq_cfg(0, 0), more, MAX_SEQS);
    assert_int_equal(vase_seq_open_async(f->c[0], m, &cfg, &p.o), 0);
    harness_wait_parked(&f->d, 1);
    vase_open_cancel(p.o);
    vase_open_cancel(NULL);
    harness_close_all(seqs, n);
    harness_close_all(more, n_more);
    /* The reply is read by the client's next call that reads replies. The daemon may admit the
     * parked open after a Status that counted no sequence: ping until nothing waits or holds. */
    double end = harness_now() + HARNESS_WAIT_MS / 1000.0;
    for (struct harness_status st = harness_status_of(&f->d);
         (st.seqs != 0 || st.opens_waiting != 0 || st.bytes_pages != 0) && harness_now() < end;
         st = harness_status_of(&f->d))
        assert_int_equal(vase_ping(f->c[0]), 0);
    harness_assert_all_free(&f->d);
}

/* An elastic open that does not fit its budget is admitted at once at a lower one that fits
 * (not below min_budget: a quarter of its range at a time), and grows to its budget once memory
 * is free. A plain open in the same place is refused. */
static void test_admitted_below_budget(void **state) {
    struct harness_fixture *f = *state;
    struct vase_geometry g = harness_geometry();
    struct vase_model *m;
    assert_int_equal(harness_engine_open(&f->d, "squeezed", &g, &f->c[0], &m), 0);
    /* Plain sequences fill the arena; one of them makes way for a smaller one, which leaves
     * room for 6 to 11 pages: an elastic sequence's minimum, not its budget. */
    struct vase_seq *seqs[MAX_SEQS] = {0};
    int n = harness_fill(f->c[0], m, seq_cfg(0, 0), seqs, MAX_SEQS);
    assert_int_equal(vase_seq_close(seqs[0]), 0);
    struct vase_seq_config six = harness_seq_config(VASE_POLICY_STREAMING, 320, 32, 0, 0);
    assert_int_equal(vase_seq_open(f->c[0], m, &six, &seqs[0]), 0);
    uint64_t free_pages = harness_status_of(&f->d).bytes_free / HARNESS_PAGE_BYTES;
    assert_true(free_pages >= 6 && free_pages < 12);
    struct vase_seq *s = NULL;
    struct vase_seq_config cfg = seq_cfg(0, 0);
    assert_int_equal(vase_seq_open(f->c[0], m, &cfg, &s), -ENOSPC);
    cfg.min_budget = MIN_BUDGET;
    assert_int_equal(vase_seq_open(f->c[0], m, &cfg, &s), 0);
    /* Budgets tried: 704, 608, 512, 416, 320; the first whose pages fit. */
    uint32_t want = MAX_BUDGET;
    while ((want + 64 + 63) / 64 > free_pages)
        want -= 96;
    if (want < MIN_BUDGET)
        want = MIN_BUDGET;
    assert_int_equal(vase_seq_budget(s), want);
    assert_int_equal(vase_seq_capacity(s), (want + 64 + 63) / 64 * 64);
    assert_true(want < MAX_BUDGET);
    Vase__Envelope *e = info_of(&f->d, s);
    assert_int_equal(e->seq_info->max_budget, MAX_BUDGET);
    assert_int_equal(e->seq_info->target_budget, MAX_BUDGET);
    assert_int_equal(e->seq_info->budget, want);
    vase__envelope__free_unpacked(e, NULL);
    assert_balanced(&f->d, seqs, n, s);
    /* It evicts from the lower budget on (growing into what little room there is). */
    assert_true(harness_append_tokens(s, &g, 1, 2 * want, false) >= 1);
    assert_true(vase_seq_budget(s) >= want && vase_seq_budget(s) < MAX_BUDGET);
    assert_balanced(&f->d, seqs, n, s);
    harness_close_all(seqs, n);
    struct vase_seq *one[1] = {s};
    decode_until(one, 1, all_at, &(struct budgets){.seqs = one, .n = 1, .want = MAX_BUDGET});
    assert_int_equal(vase_seq_flush(s), 0);
    assert_int_equal(vase_seq_capacity(s), 12 * 64);
    assert_true(harness_append_tokens(s, &g, 1, 2 * MAX_BUDGET, false) >= 1);
    assert_intact(s);
    assert_balanced(&f->d, one, 1, NULL);
    assert_int_equal(vase_seq_close(s), 0);
    harness_assert_all_free(&f->d);
}

/* Room for a waiting open is made first by the sequences of its page size, whose released pages
 * it can use at once: the sequences of a model with smaller pages keep their budgets while
 * those can cover it. */
static void test_same_page_size_first(void **state) {
    struct harness_fixture *f = *state;
    struct vase_geometry g = harness_geometry(), g_small = harness_geometry();
    g_small.block_tokens = 32; /* pages of 32 KiB */
    struct vase_model *m, *m_small, *m_new;
    assert_int_equal(harness_engine_open(&f->d, "big-pages", &g, &f->c[0], &m), 0);
    assert_int_equal(vase_model_register(f->c[0], &g_small, &m_small), 0);
    assert_int_equal(harness_engine_open(&f->d, "newcomer", &g, &f->c[1], &m_new), 0);
    struct vase_seq *big[3], *small[MAX_SEQS] = {0};
    struct vase_seq_config cfg = seq_cfg(MIN_BUDGET, 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(vase_seq_open(f->c[0], m, &cfg, &big[i]), 0);
    int n = harness_fill(f->c[0], m_small, cfg, small, MAX_SEQS);
    assert_true(n >= 1);
    struct harness_opener o = {.c = f->c[1], .m = m_new, .cfg = seq_cfg(0, LONG_WAIT_MS)};
    harness_opener_start(&o);
    harness_wait_parked(&f->d, 1);
    bool lowered = false;
    for (int i = 0; i < 3; i++)
        lowered |= target_of(&f->d, big[i]) < MAX_BUDGET;
    assert_true(lowered);
    for (int i = 0; i < n; i++)
        assert_int_equal(target_of(&f->d, small[i]), MAX_BUDGET);
    decode_until(big, 3, opener_done, &o);
    harness_opener_join(&o);
    assert_int_equal(o.r, 0);
    for (int i = 0; i < n; i++)
        assert_int_equal(changes_of(&f->d, small[i]), 0);
    assert_int_equal(vase_seq_close(o.s), 0);
    harness_close_all(big, 3);
    harness_close_all(small, n);
    harness_assert_all_free(&f->d);
}

/* What libvase refuses before anything is sent. */
static void test_open_refusals(void **state) {
    struct harness_fixture *f = *state;
    struct vase_geometry g = harness_geometry();
    struct vase_model *m;
    struct vase_seq *s = NULL;
    assert_int_equal(harness_engine_open(&f->d, "refused", &g, &f->c[0], &m), 0);
    uint32_t bad_min[] = {MIN_BUDGET + 1, 32, 16, MAX_BUDGET + 32};
    for (size_t i = 0; i < sizeof(bad_min) / sizeof(bad_min[0]); i++) {
        struct vase_seq_config cfg = seq_cfg(bad_min[i], 0);
        assert_int_equal(vase_seq_open(f->c[0], m, &cfg, &s), -EINVAL);
        assert_non_null(strstr(vase_last_error(f->c[0]), "min_budget"));
    }
    struct vase_seq_config cfg = seq_cfg(MIN_BUDGET, 0);
    cfg.weight = VASE_MAX_WEIGHT + 1;
    assert_int_equal(vase_seq_open(f->c[0], m, &cfg, &s), -EINVAL);
    assert_null(s);
    cfg.weight = VASE_MAX_WEIGHT;
    cfg.min_budget = MAX_BUDGET; /* elastic in name only: the budget itself */
    assert_int_equal(vase_seq_open(f->c[0], m, &cfg, &s), 0);
    Vase__Envelope *e = info_of(&f->d, s);
    assert_int_equal(e->seq_info->weight, VASE_MAX_WEIGHT);
    assert_int_equal(e->seq_info->min_budget, MAX_BUDGET);
    vase__envelope__free_unpacked(e, NULL);
    assert_int_equal(vase_seq_close(s), 0);
    harness_assert_all_free(&f->d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_shrink_then_grow_back, setup,
                                        harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_not_elastic_never_moves, setup,
                                        harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_minimums_too_high, setup, harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_newcomer_gives_up, setup, harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_plan_in_flight, setup, harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_shrink_after_give_up, setup, harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_client_dies_while_shrinking, setup,
                                        harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_set_budget, setup, harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_admitted_below_budget, setup,
                                        harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_same_page_size_first, setup, harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_open_refusals, setup, harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_single_thread_engine, setup, harness_fixture_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
