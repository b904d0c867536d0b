/* SPDX-License-Identifier: MIT */

/*
 * Integration tests of sessions, models and admission against a real vased (started by the
 * harness in a temporary runtime directory) through the real libvase: the layout of
 * PROTOCOL.md "Memory" as the engine sees it (addresses of K, V and queries, tokens per page,
 * bytes charged per sequence, block tables), geometries the arena cannot lay out, parameters and
 * labels libvase refuses, labels kept, admission up to and past the arena, per-client quotas,
 * the allow-list, and a daemon restart under a connected client. Every test starts its own daemon,
 * so no state leaks from one to the next.
 */

#include <errno.h>
#include <pwd.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <grp.h>

#include <cmocka.h>

#include "integration/harness.h"

static int setup(void **state) {
    return harness_fixture_setup(state, sizeof(struct harness_fixture), NULL);
}

static int setup_quota(void **state) {
    static const char *const args[] = {"--max-bytes-per-client=768K", "--max-seqs-per-client=2",
                                       NULL};
    return harness_fixture_setup(state, sizeof(struct harness_fixture), args);
}

static int setup_two_clients(void **state) {
    static const char *const args[] = {"--max-clients=2", NULL};
    return harness_fixture_setup(state, sizeof(struct harness_fixture), args);
}

static int setup_allow_nobody(void **state) {
    static const char *const args[] = {"--allow-users=nobody", NULL};
    return harness_fixture_setup(state, sizeof(struct harness_fixture), args);
}

static struct harness_status status_of(const struct harness_daemon *d) {
    struct harness_status st;
    assert_int_equal(harness_status(d, &st), 0);
    return st;
}

/* ---- layout ---- */

struct layout_case {
    struct vase_geometry g;
    uint32_t budget, window;
    enum vase_policy policy;
};

static uint64_t ceil_div(uint64_t a, uint64_t b) {
    return (a + b - 1) / b;
}

/* The PROTOCOL.md formulas, computed here independently of both daemon and library. */
struct expected_layout {
    uint64_t es, token_stride, kv_stride, layer_stride, page_bytes;
    uint64_t ring_row, ring_rows_per_page, ring_page_bytes, plan_page_bytes;
    uint32_t tpp, kv_pages, ring_pages, plan_pages;
    uint64_t bytes; /* all pages of one sequence */
};

static struct expected_layout expect_layout(const struct layout_case *lc) {
    const struct vase_geometry *g = &lc->g;
    struct expected_layout e = {.es = vase_dtype_size(g->dtype)};
    e.tpp = g->block_tokens ? g->block_tokens : 16;
    e.token_stride = (uint64_t)g->kv_heads * g->head_dim * e.es;
    e.kv_stride = e.tpp * e.token_stride;
    e.layer_stride = 2 * e.kv_stride;
    e.page_bytes = g->layers * e.layer_stride;
    uint32_t slack = lc->window; /* the default */
    e.kv_pages = (uint32_t)ceil_div(lc->budget + lc->window + slack, e.tpp);
    e.ring_row = (uint64_t)g->q_heads * g->head_dim * e.es;
    /* A ring page is a KV page unless one entry of every layer is larger: then one entry. */
    e.ring_rows_per_page = e.page_bytes / (g->layers * e.ring_row);
    e.ring_page_bytes = e.page_bytes;
    if (e.ring_rows_per_page == 0) {
        e.ring_rows_per_page = 1;
        e.ring_page_bytes = g->layers * e.ring_row;
    }
    if (vase_policy_needs(lc->policy) & VASE_NEEDS_Q)
        e.ring_pages = (uint32_t)ceil_div(2 * lc->window, e.ring_rows_per_page);
    /* One plan page for every keep list, the smallest power of two of at least 4096 bytes. */
    uint64_t keep = lc->budget - lc->window, lists = g->layers * g->kv_heads;
    for (e.plan_page_bytes = 4096; e.plan_page_bytes < lists * 4 * keep;)
        e.plan_page_bytes *= 2;
    e.plan_pages = 1;
    e.bytes = e.kv_pages * e.page_bytes + e.ring_pages * e.ring_page_bytes +
              e.plan_pages * e.plan_page_bytes;
    return e;
}

static ptrdiff_t kv_diff(const struct vase_seq *s, uint32_t l1, enum vase_kv k1, uint32_t s1,
                         uint32_t h1, uint32_t l0, enum vase_kv k0, uint32_t s0, uint32_t h0) {
    char *a = vase_seq_kv_ptr(s, l1, k1, s1, h1), *b = vase_seq_kv_ptr(s, l0, k0, s0, h0);
    assert_non_null(a);
    assert_non_null(b);
    return a - b;
}

static void check_kv_addresses(const struct vase_model *m, const struct vase_seq *s,
                               const struct layout_case *lc, const struct expected_layout *e) {
    const struct vase_geometry *g = &lc->g;
    uint32_t cap = vase_seq_capacity(s);
    /* Within a page: [layer][K,V][token][kv_head][dim]. */
    for (uint32_t slot = 0; slot < cap; slot++) {
        uint32_t first = slot - slot % e->tpp;
        assert_int_equal(kv_diff(s, 0, VASE_K, slot, 0, 0, VASE_K, first, 0),
                         (ptrdiff_t)((slot % e->tpp) * e->token_stride));
        for (uint32_t l = 0; l < g->layers; l++)
            for (uint32_t h = 0; h < g->kv_heads; h++) {
                assert_int_equal(kv_diff(s, l, VASE_K, slot, h, 0, VASE_K, slot, 0),
                                 (ptrdiff_t)(l * e->layer_stride + h * g->head_dim * e->es));
                assert_int_equal(kv_diff(s, l, VASE_V, slot, h, l, VASE_K, slot, h),
                                 (ptrdiff_t)e->kv_stride);
            }
    }
    /* Pages: distinct, and every one at a multiple of page_bytes from the arena base (the
     * address of block 0 of layer 0's K tensor), at the block its table entry names. */
    struct vase_tensor t;
    const int32_t *table;
    uint32_t n_table;
    assert_int_equal(vase_model_kv_tensor(m, 0, VASE_K, &t), 0);
    assert_int_equal(vase_seq_block_table(s, &table, &n_table), 0);
    assert_int_equal(n_table, e->kv_pages);
    for (uint32_t p = 0; p < cap / e->tpp; p++) {
        ptrdiff_t off = (char *)vase_seq_kv_ptr(s, 0, VASE_K, p * e->tpp, 0) - (char *)t.data;
        assert_int_equal(off % (ptrdiff_t)e->page_bytes, 0);
        assert_int_equal(off / (ptrdiff_t)e->page_bytes, table[p]);
        assert_true(table[p] >= 0 && table[p] < t.shape[0]);
        for (uint32_t q = 0; q < p; q++)
            assert_int_not_equal(table[p], table[q]);
    }
    /* The views the engine's kernels get say the same. */
    for (uint32_t l = 0; l < g->layers; l++) {
        struct vase_view v;
        assert_int_equal(vase_seq_kv_view(s, l, VASE_V, &v), 0);
        assert_int_equal(v.tokens_per_page, e->tpp);
        assert_int_equal(v.page_stride, e->page_bytes);
        assert_int_equal(v.token_stride, e->token_stride);
        assert_int_equal(v.head_stride, g->head_dim * e->es);
        assert_int_equal(v.heads, g->kv_heads);
        assert_int_equal(v.dim, g->head_dim);
        assert_int_equal(v.dtype, g->dtype);
        for (uint32_t slot = 0; slot < cap; slot += 7)
            assert_ptr_equal(vase_view_row(&v, slot, g->kv_heads - 1),
                             vase_seq_kv_ptr(s, l, VASE_V, slot, g->kv_heads - 1));
    }
    /* Out of range: no address. */
    assert_null(vase_seq_kv_ptr(s, 0, VASE_K, cap, 0));
    assert_null(vase_seq_kv_ptr(s, g->layers, VASE_K, 0, 0));
    assert_null(vase_seq_kv_ptr(s, 0, VASE_K, 0, g->kv_heads));
}

static void check_query_addresses(const struct vase_seq *s, const struct layout_case *lc,
                                  const struct expected_layout *e) {
    const struct vase_geometry *g = &lc->g;
    if (!e->ring_pages) {
        assert_null(vase_seq_query_ptr(s, 0, 0, 0));
        return;
    }
    uint32_t entries = 2 * lc->window;
    for (uint64_t pos = 0; pos < entries; pos++) {
        char *q0 = vase_seq_query_ptr(s, 0, pos, 0);
        assert_non_null(q0);
        /* The ring wraps every 2 * window positions. */
        assert_ptr_equal(vase_seq_query_ptr(s, 0, pos + entries, 0), q0);
        for (uint32_t l = 0; l < g->layers; l++)
            for (uint32_t h = 0; h < g->q_heads; h += g->q_heads - 1) {
                char *q = vase_seq_query_ptr(s, l, pos, h);
                assert_int_equal(q - q0, (ptrdiff_t)(l * e->ring_rows_per_page * e->ring_row +
                                                     h * g->head_dim * e->es));
                if (g->q_heads == 1)
                    break;
            }
        if ((pos + 1) % e->ring_rows_per_page != 0 && pos + 1 < entries)
            assert_int_equal((char *)vase_seq_query_ptr(s, 0, pos + 1, 0) - q0,
                             (ptrdiff_t)e->ring_row);
        else if (pos + 1 < entries) /* the next ring page, at a multiple of its size */
            assert_int_equal(((char *)vase_seq_query_ptr(s, 0, pos + 1, 0) -
                              (char *)vase_seq_query_ptr(s, 0, 0, 0)) %
                                 (ptrdiff_t)e->ring_page_bytes,
                             0);
    }
}

/* Every geometry and block size: tokens per page, bytes charged, addresses of K, V and
 * queries. */
static void test_layout_matches_protocol(void **state) {
    struct harness_fixture *f = *state;
    static const struct layout_case cases[] = {
        {{"f32-block64", 2, 4, 2, 32, VASE_DTYPE_F32, 64, 0}, 128, 32, VASE_POLICY_SNAPKV},
        {{"f16-block8", 3, 8, 2, 24, VASE_DTYPE_F16, 8, 0}, 128, 32, VASE_POLICY_VASE_ATTNV},
        {{"bf16-block16", 1, 7, 7, 128, VASE_DTYPE_BF16, 16, 0}, 64, 16, VASE_POLICY_RKV},
        {{"f32-default-block", 4, 16, 4, 64, VASE_DTYPE_F32, 0, 0}, 32, 8, VASE_POLICY_STREAMING},
        {{"one-token-blocks", 16, 8, 8, 64, VASE_DTYPE_F32, 1, 0}, 8, 4, VASE_POLICY_SNAPKV},
        {{"gqa-block1", 2, 8, 2, 16, VASE_DTYPE_F16, 1, 0}, 32, 8, VASE_POLICY_VASE_ATTNV},
        {{"f16-block256", 1, 1, 1, 8, VASE_DTYPE_F16, 256, 0}, 512, 64, VASE_POLICY_SNAPKV},
    };
    assert_int_equal(harness_connect(&f->d, "layout", &f->c[0]), 0);
    struct harness_status st = status_of(&f->d);
    assert_int_equal(st.bytes_total, HARNESS_ARENA_BYTES);
    assert_int_equal(st.bytes_free, HARNESS_ARENA_BYTES);
    assert_int_equal(st.bytes_pages, 0);

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const struct layout_case *lc = &cases[i];
        struct expected_layout e = expect_layout(lc);
        struct vase_model *m;
        int r = vase_model_register(f->c[0], &lc->g, &m);
        if (r < 0)
            fail_msg("%s: vase_model_register: %s", lc->g.name, vase_strerror(r));
        assert_int_equal(vase_model_tokens_per_page(m), e.tpp);
        assert_int_equal(vase_model_page_bytes(m), e.page_bytes);

        struct vase_seq_config cfg =
            harness_seq_config(lc->policy, lc->budget, lc->window, 0, VASE_MODE_SYNC);
        struct vase_seq *s;
        r = vase_seq_open(f->c[0], m, &cfg, &s);
        if (r < 0)
            fail_msg("%s: vase_seq_open: %s", lc->g.name, vase_strerror(r));
        assert_int_equal(vase_seq_capacity(s), e.kv_pages * e.tpp);
        assert_int_equal(vase_seq_len(s), 0);
        uint64_t used = status_of(&f->d).bytes_pages;
        if (used != e.bytes)
            fail_msg("%s: %llu bytes charged, PROTOCOL.md gives %u KV pages of %llu + %u ring "
                     "pages of %llu + %u plan pages of %llu",
                     lc->g.name, (unsigned long long)used, e.kv_pages,
                     (unsigned long long)e.page_bytes, e.ring_pages,
                     (unsigned long long)e.ring_page_bytes, e.plan_pages,
                     (unsigned long long)e.plan_page_bytes);
        check_kv_addresses(m, s, lc, &e);
        check_query_addresses(s, lc, &e);
        assert_int_equal(vase_seq_close(s), 0);
        st = status_of(&f->d);
        assert_int_equal(st.bytes_pages, 0);
        assert_int_equal(st.bytes_free, HARNESS_ARENA_BYTES);
    }
}

/* Two sequences of one client never share a page. */
static void test_sequences_disjoint(void **state) {
    struct harness_fixture *f = *state;
    struct vase_geometry g = harness_geometry();
    struct vase_model *m;
    assert_int_equal(harness_engine_open(&f->d, "disjoint", &g, &f->c[0], &m), 0);
    struct vase_seq_config cfg = harness_seq_config(VASE_POLICY_SNAPKV, 128, 32, 0, 0);
    struct vase_seq *a, *b;
    assert_int_equal(vase_seq_open(f->c[0], m, &cfg, &a), 0);
    assert_int_equal(vase_seq_open(f->c[0], m, &cfg, &b), 0);
    assert_int_not_equal(vase_seq_id(a), vase_seq_id(b));
    uint32_t tpp = vase_model_tokens_per_page(m);
    for (uint32_t i = 0; i < vase_seq_capacity(a); i += tpp)
        for (uint32_t j = 0; j < vase_seq_capacity(b); j += tpp) {
            char *pa = vase_seq_kv_ptr(a, 0, VASE_K, i, 0),
                 *pb = vase_seq_kv_ptr(b, 0, VASE_K, j, 0);
            assert_true(pa - pb >= (ptrdiff_t)HARNESS_PAGE_BYTES ||
                        pb - pa >= (ptrdiff_t)HARNESS_PAGE_BYTES);
        }
    char *qa = vase_seq_query_ptr(a, 0, 0, 0), *qb = vase_seq_query_ptr(b, 0, 0, 0);
    assert_true(qa - qb >= (ptrdiff_t)HARNESS_PAGE_BYTES ||
                qb - qa >= (ptrdiff_t)HARNESS_PAGE_BYTES);
    assert_int_equal(vase_seq_close(a), 0);
    assert_int_equal(vase_seq_close(b), 0);
}

/* Geometries no arena can lay out are refused with -EINVAL and a reason, and the client stays
 * usable. */
static void test_invalid_geometry(void **state) {
    struct harness_fixture *f = *state;
    static const struct {
        struct vase_geometry g;
        const char *why; /* a part of vase_last_error() */
    } bad[] = {
        {{"no-layers", 0, 4, 2, 32, VASE_DTYPE_F32, 1, 0}, "layers"},
        {{"no-kv-heads", 2, 4, 0, 32, VASE_DTYPE_F32, 1, 0}, "kv_heads"},
        {{"no-q-heads", 2, 0, 2, 32, VASE_DTYPE_F32, 1, 0}, "q_heads"},
        {{"group-not-integral", 2, 3, 2, 32, VASE_DTYPE_F32, 1, 0}, "multiple of kv_heads"},
        {{"no-dim", 2, 4, 2, 0, VASE_DTYPE_F32, 1, 0}, "head_dim"},
        {{"dim-too-large", 1, 1, 1, VASE_MAX_DIM + 1, VASE_DTYPE_F32, 1, 0}, "head_dim"},
        {{"bad-dtype", 2, 4, 2, 32, (enum vase_dtype)7, 1, 0}, "dtype"},
        /* 64 layers * 2 * 8 heads * 128 * 4 bytes = 512 KiB per token: a block of 16 tokens
         * is 8 MiB, more than the 4 MiB arena. */
        {{"page-larger-than-arena", 64, 8, 8, 128, VASE_DTYPE_F32, 0, 0}, "block_tokens"},
        /* 4 KiB per token of the harness model: 1024 tokens are 4 MiB + 1 page too many. */
        {{"block-larger-than-arena", 2, 4, 2, 32, VASE_DTYPE_F32, 4097, 0}, "block_tokens"},
        {{"block-too-large", 1, 1, 1, 1, VASE_DTYPE_F16, 65537, 0}, "block_tokens"},
    };
    assert_int_equal(harness_connect(&f->d, "invalid", &f->c[0]), 0);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct vase_model *m = (struct vase_model *)0x1;
        int r = vase_model_register(f->c[0], &bad[i].g, &m);
        if (r != -EINVAL)
            fail_msg("%s: vase_model_register returned %d (%s), want -EINVAL", bad[i].g.name, r,
                     vase_strerror(r));
        assert_ptr_equal(m, (struct vase_model *)0x1);
        const char *why = vase_last_error(f->c[0]);
        if (!strstr(why, bad[i].why))
            fail_msg("%s: vase_last_error() is \"%s\", which does not mention %s", bad[i].g.name,
                     why, bad[i].why);
    }
    /* An arena that does not exist. */
    struct vase_geometry g = harness_geometry();
    g.arena = 7;
    struct vase_model *m;
    int r = vase_model_register(f->c[0], &g, &m);
    if (r != -EINVAL)
        fail_msg("arena 7: vase_model_register returned %d (%s), want -EINVAL", r,
                 vase_strerror(r));
    g.arena = 0;
    assert_int_equal(vase_model_register(f->c[0], &g, &m), 0);
    assert_int_equal(vase_model_tokens_per_page(m), 64);
    assert_int_equal(vase_ping(f->c[0]), 0);
}

/* Sequence parameters the policies cannot run with are refused whole, with nothing held. */
static void test_invalid_seq_params(void **state) {
    struct harness_fixture *f = *state;
    struct vase_geometry g = harness_geometry();
    struct vase_model *m;
    assert_int_equal(harness_engine_open(&f->d, "params", &g, &f->c[0], &m), 0);
    /* Each refusal names the rule it breaks, with the values that break it. */
    struct {
        struct vase_seq_config cfg;
        const char *why; /* a part of vase_last_error() */
    } bad[] = {
        {harness_seq_config(VASE_POLICY_SNAPKV, 100, 32, 0, 0),
         "budget must be a multiple of window (budget 100, window 32; 96 or 128 would be)"},
        {harness_seq_config(VASE_POLICY_SNAPKV, 32, 32, 0, 0),
         "budget must be larger than window (budget 32 <= window 32)"},
        {harness_seq_config(VASE_POLICY_SNAPKV, 128, 0, 0, 0), "window must be positive"},
        {harness_seq_config((enum vase_policy)99, 128, 32, 0, 0), "unknown policy 99"},
        {harness_seq_config(VASE_POLICY_SNAPKV, 128, 32, 0, (enum vase_mode)5), "mode 5"},
        {harness_seq_config(VASE_POLICY_SNAPKV, 128, 32, 0, 0), "n_sink must not exceed budget "
                                                                "(n_sink 129 > budget 128)"},
        {harness_seq_config(VASE_POLICY_VASE_DKV, 128, 32, 0, 0), "rank must be 1 .. 256 (rank 0)"},
        {harness_seq_config(VASE_POLICY_SNAPKV, 128, 32, 0, 0), "smooth must be odd"},
        /* Labels libvase refuses itself, its own words (the daemon's would say "bad open_seq"):
         * 65 bytes, a newline, a quote, UTF-8. */
        {harness_seq_config(VASE_POLICY_SNAPKV, 128, 32, 0, 0),
         "vase_seq_open: label is longer than 64 bytes"},
        {harness_seq_config(VASE_POLICY_SNAPKV, 128, 32, 0, 0),
         "vase_seq_open: label byte 3 is 0x0a (want at most 64 bytes of A-Z a-z 0-9 ._:/@+=-)"},
        {harness_seq_config(VASE_POLICY_SNAPKV, 128, 32, 0, 0),
         "vase_seq_open: label byte 3 is 0x22"},
        {harness_seq_config(VASE_POLICY_SNAPKV, 128, 32, 0, 0),
         "vase_seq_open: label byte 3 is 0xc3"},
    };
    char long_label[VASE_SEQ_LABEL_MAX + 2];
    memset(long_label, 'x', VASE_SEQ_LABEL_MAX + 1);
    long_label[VASE_SEQ_LABEL_MAX + 1] = '\0';
    bad[5].cfg.params.n_sink = 129;
    bad[6].cfg.params.rank = 0;
    bad[7].cfg.params.smooth = 4;
    bad[8].cfg.label = long_label;
    bad[9].cfg.label = "req\n1";
    bad[10].cfg.label = "req\"1";
    bad[11].cfg.label = "caf\xc3\xa9";
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct vase_seq *s = NULL;
        int r = vase_seq_open(f->c[0], m, &bad[i].cfg, &s);
        if (r != -EINVAL)
            fail_msg("case %zu: vase_seq_open returned %d (%s), want -EINVAL", i, r,
                     vase_strerror(r));
        if (!strstr(vase_last_error(f->c[0]), bad[i].why))
            fail_msg("case %zu: vase_last_error() is \"%s\", which does not say \"%s\"", i,
                     vase_last_error(f->c[0]), bad[i].why);
        assert_null(s);
    }
    struct harness_status st = status_of(&f->d);
    assert_int_equal(st.bytes_free, st.bytes_total);
    assert_int_equal(st.bytes_pages, 0);
    assert_int_equal(st.seqs, 0);
}

/*
 * A sequence's label: as opened (64 bytes, every kind of byte the rule allows) in the daemon's
 * SeqInfo and in vase_seq_label(), from libvase's own copy (the engine's buffer may change after
 * the call), through vase_seq_open_async() too; NULL and "" are no label.
 */
static void test_seq_label(void **state) {
    struct harness_fixture *f = *state;
    struct vase_geometry g = harness_geometry();
    struct vase_model *m;
    assert_int_equal(harness_engine_open(&f->d, "labels", &g, &f->c[0], &m), 0);
    char label[VASE_SEQ_LABEL_MAX + 1], want[VASE_SEQ_LABEL_MAX + 1];
    memset(label, '9', VASE_SEQ_LABEL_MAX);
    memcpy(label, "cmpl-8f2c.d_0:a/b@c+d=e-", 24);
    label[VASE_SEQ_LABEL_MAX] = '\0';
    memcpy(want, label, sizeof(want));

    struct vase_seq_config cfg = harness_seq_config(VASE_POLICY_STREAMING, 128, 32, 0, 0);
    struct vase_seq *s[4];
    cfg.label = label;
    assert_int_equal(vase_seq_open(f->c[0], m, &cfg, &s[0]), 0);
    label[5] = 'A'; /* the first sequence keeps the label it was opened with */
    struct vase_open *o;
    assert_int_equal(vase_seq_open_async(f->c[0], m, &cfg, &o), 0);
    memset(label, '?', VASE_SEQ_LABEL_MAX); /* and the second the one it was sent with */
    int r;
    while ((r = vase_open_poll(o, &s[1])) == 0)
        harness_sleep_ms(1);
    assert_int_equal(r, 1);
    cfg.label = NULL;
    assert_int_equal(vase_seq_open(f->c[0], m, &cfg, &s[2]), 0);
    cfg.label = "";
    assert_int_equal(vase_seq_open(f->c[0], m, &cfg, &s[3]), 0);

    char want_async[VASE_SEQ_LABEL_MAX + 1];
    memcpy(want_async, want, sizeof(want));
    want_async[5] = 'A';
    const char *const labels[4] = {want, want_async, "", ""};
    for (int i = 0; i < 4; i++) {
        assert_string_equal(vase_seq_label(s[i]), labels[i]);
        Vase__Envelope *info;
        assert_int_equal(harness_get_seq(&f->d, vase_seq_id(s[i]), &info), 0);
        assert_string_equal(info->seq_info->label, labels[i]);
        vase__envelope__free_unpacked(info, NULL);
    }
    assert_string_equal(vase_seq_label(NULL), "");
    harness_close_all(s, 4);
}

/* max_models_per_client (default 16): the 17th registration is over quota. */
static void test_model_quota(void **state) {
    struct harness_fixture *f = *state;
    assert_int_equal(harness_connect(&f->d, "models", &f->c[0]), 0);
    struct vase_geometry g = harness_geometry();
    struct vase_model *m, *first = NULL;
    char name[16];
    g.name = name;
    for (int i = 0; i < 16; i++) {
        snprintf(name, sizeof(name), "m%d", i);
        assert_int_equal(vase_model_register(f->c[0], &g, &m), 0);
        if (!first)
            first = m;
    }
    snprintf(name, sizeof(name), "m16");
    assert_int_equal(vase_model_register(f->c[0], &g, &m), -EDQUOT);
    /* The same geometry under a name already registered is that model: no new one, no quota. */
    snprintf(name, sizeof(name), "m0");
    assert_int_equal(vase_model_register(f->c[0], &g, &m), 0);
    assert_ptr_equal(m, first);
    /* The quota is per client. */
    assert_int_equal(harness_connect(&f->d, "models-2", &f->c[1]), 0);
    assert_int_equal(vase_model_register(f->c[1], &g, &m), 0);
}

/* ---- admission ---- */

static int open_until_full(struct vase_client *c, struct vase_model *m,
                           const struct vase_seq_config *cfg, struct vase_seq **seqs, int max,
                           int *ret_err) {
    int n = 0;
    for (; n < max; n++) {
        int r = vase_seq_open(c, m, cfg, &seqs[n]);
        if (r < 0) {
            *ret_err = r;
            return n;
        }
    }
    *ret_err = 0;
    return n;
}

/* Granules that n streaming sequences of the harness model with budget 128 and window 32 take:
 * 3 KV pages of one granule each, and n plan pages of 4096 bytes (4 keep lists of 96 slots),
 * packed into granules of their own. */
static uint32_t streaming_granules(uint32_t n) {
    return 3 * n + (uint32_t)ceil_div((uint64_t)n * 4096, HARNESS_PAGE_BYTES);
}

/* Sequences are admitted until the arena is full, then refused whole with -ENOSPC; after
 * everything closes (and after clients disconnect) every page is free again. */
static void test_admission_enospc(void **state) {
    struct harness_fixture *f = *state;
    struct vase_geometry g = harness_geometry();
    struct vase_model *m0, *m1;
    assert_int_equal(harness_engine_open(&f->d, "admit-0", &g, &f->c[0], &m0), 0);
    assert_int_equal(harness_engine_open(&f->d, "admit-1", &g, &f->c[1], &m1), 0);
    struct harness_status st = status_of(&f->d);
    assert_int_equal(st.bytes_free, HARNESS_ARENA_BYTES);
    assert_int_equal(st.clients, 2);

    /* streaming, budget 128, window 32: 3 KV pages + a plan page of 4096 bytes, no ring. */
    struct vase_seq_config cfg = harness_seq_config(VASE_POLICY_STREAMING, 128, 32, 0, 0);
    const uint64_t per_seq = harness_seq_bytes(3, 0, 96);
    uint32_t fit = 0;
    while (streaming_granules(fit + 1) <= HARNESS_ARENA_PAGES)
        fit++;
    struct vase_seq *seqs[2][64] = {{0}};
    int err;
    int n0 = open_until_full(f->c[0], m0, &cfg, seqs[0], 10, &err);
    assert_int_equal(n0, 10);
    int n1 = open_until_full(f->c[1], m1, &cfg, seqs[1], 64, &err);
    assert_int_equal(err, -ENOSPC);
    assert_int_equal((uint32_t)(n0 + n1), fit);
    assert_string_equal(vase_strerror(err), "No space left on device");
    st = status_of(&f->d);
    assert_int_equal(st.bytes_pages, fit * per_seq);
    assert_int_equal(st.bytes_free,
                     HARNESS_ARENA_BYTES - streaming_granules(fit) * (uint64_t)HARNESS_PAGE_BYTES);
    assert_int_equal(st.seqs, (uint32_t)(n0 + n1));

    /* Refusals hold nothing, on either client. */
    struct vase_seq *s = NULL;
    assert_int_equal(vase_seq_open(f->c[0], m0, &cfg, &s), -ENOSPC);
    assert_null(s);
    assert_int_equal(status_of(&f->d).bytes_pages, fit * per_seq);

    /* One sequence closes: exactly one fits again; one a KV page larger than the free
     * granules (spare ones and the 3 the closed sequence left) does not. */
    uint32_t spare = HARNESS_ARENA_PAGES - streaming_granules(fit);
    assert_int_equal(vase_seq_close(seqs[1][0]), 0);
    seqs[1][0] = NULL;
    assert_int_equal(status_of(&f->d).bytes_pages, (fit - 1) * per_seq);
    assert_int_equal(status_of(&f->d).bytes_free, (spare + 3) * (uint64_t)HARNESS_PAGE_BYTES);
    /* (spare + 4) KV pages of 64 tokens: budget + window + slack = (spare + 4) * 64. */
    struct vase_seq_config big =
        harness_seq_config(VASE_POLICY_STREAMING, (spare + 4) * 64 - 64, 32, 0, 0);
    assert_int_equal(vase_seq_open(f->c[1], m1, &big, &s), -ENOSPC);
    assert_int_equal(status_of(&f->d).bytes_pages, (fit - 1) * per_seq);
    assert_int_equal(vase_seq_open(f->c[1], m1, &cfg, &seqs[1][0]), 0);

    /* Close everything of client 0, disconnect client 1 with its sequences open. */
    for (int i = 0; i < n0; i++)
        assert_int_equal(vase_seq_close(seqs[0][i]), 0);
    f->c[1] = vase_disconnect(f->c[1]);
    assert_int_equal(harness_wait_bytes_pages(&f->d, 0, HARNESS_WAIT_MS, NULL), 0);
    st = status_of(&f->d);
    assert_int_equal(st.bytes_free, HARNESS_ARENA_BYTES);
    assert_int_equal(st.seqs, 0);
    assert_int_equal(st.clients, 1);
}

static void config_set(const struct harness_daemon *d, const char *key, const char *value) {
    int r = harness_config_set(d, key, value);
    if (r < 0)
        fail_msg("ConfigSet %s=%s: %s", key, value, vase_strerror(r));
}

/* Per-client quotas (768 KiB, 2 sequences): -EDQUOT, nothing held, other clients unaffected,
 * and a runtime ConfigSet of the quota takes effect. */
static void test_quota_edquot(void **state) {
    struct harness_fixture *f = *state;
    struct vase_geometry g = harness_geometry();
    struct vase_model *m0, *m1;
    assert_int_equal(harness_engine_open(&f->d, "quota-0", &g, &f->c[0], &m0), 0);
    assert_int_equal(harness_engine_open(&f->d, "quota-1", &g, &f->c[1], &m1), 0);

    struct vase_seq_config cfg = harness_seq_config(VASE_POLICY_STREAMING, 128, 32, 0, 0);
    const uint64_t small = harness_seq_bytes(3, 0, 96);
    struct vase_seq *a, *b, *c = NULL;
    assert_int_equal(vase_seq_open(f->c[0], m0, &cfg, &a), 0);
    assert_int_equal(vase_seq_open(f->c[0], m0, &cfg, &b), 0);
    /* A third sequence: over the sequence quota. */
    assert_int_equal(vase_seq_open(f->c[0], m0, &cfg, &c), -EDQUOT);
    assert_null(c);
    assert_int_equal(status_of(&f->d).bytes_pages, 2 * small);

    /* Client 1: 768 KiB at most. budget 512: 9 KV pages + a plan page of 8 KiB fit; then a
     * small sequence would take it over. */
    struct vase_seq_config big = harness_seq_config(VASE_POLICY_STREAMING, 512, 32, 0, 0);
    const uint64_t large = harness_seq_bytes(9, 0, 480);
    struct vase_seq *d1, *d2 = NULL;
    assert_int_equal(vase_seq_open(f->c[1], m1, &big, &d1), 0);
    assert_true(large <= 768 * 1024 && large + small > 768 * 1024);
    assert_int_equal(vase_seq_open(f->c[1], m1, &cfg, &d2), -EDQUOT);
    assert_null(d2);
    assert_non_null(strstr(vase_last_error(f->c[1]), "max_bytes_per_client"));
    /* Over the quota and over the free memory (56 KV pages): the client's own limit is what it
     * hears. */
    struct vase_seq_config huge = harness_seq_config(VASE_POLICY_STREAMING, 3520, 32, 0, 0);
    assert_int_equal(vase_seq_open(f->c[1], m1, &huge, &d2), -EDQUOT);
    assert_string_equal(vase_strerror(-EDQUOT), "Disk quota exceeded");
    assert_int_equal(status_of(&f->d).bytes_pages, 2 * small + large);

    /* Raise the sequence quota while running. */
    config_set(&f->d, "max_seqs_per_client", "3");
    assert_int_equal(vase_seq_open(f->c[0], m0, &cfg, &c), 0);
    assert_int_equal(status_of(&f->d).bytes_pages, 3 * small + large);
}

/*
 * vase_last_error() says why the last call failed and nothing older: the daemon's message for
 * its refusal, libvase's own for a call it refuses itself (never the daemon's earlier words), ""
 * after a call that succeeds and after a failure that has no words.
 */
static void test_last_error(void **state) {
    struct harness_fixture *f = *state;
    struct vase_geometry g = harness_geometry();
    struct vase_model *m;
    assert_int_equal(harness_engine_open(&f->d, "words", &g, &f->c[0], &m), 0);
    struct vase_client *c = f->c[0];
    assert_string_equal(vase_last_error(c), "");

    /* Refused by the daemon: more pages than the arena has. */
    struct vase_seq_config huge = harness_seq_config(VASE_POLICY_STREAMING, 8192, 32, 0, 0);
    struct vase_seq *s = NULL, *none = NULL;
    assert_int_equal(vase_seq_open(c, m, &huge, &none), -ENOSPC);
    char daemon[256];
    snprintf(daemon, sizeof(daemon), "%s", vase_last_error(c));
    if (!strstr(daemon, "cannot open the sequence"))
        fail_msg("after the daemon's refusal, vase_last_error() is \"%s\"", daemon);

    /* Refused by libvase before a word to the daemon: its own reason. */
    struct vase_seq_config cfg = harness_seq_config(VASE_POLICY_SNAPKV, 128, 32, 0, 0);
    struct vase_seq_config bad = cfg;
    bad.slack = -2;
    assert_int_equal(vase_seq_open(c, m, &bad, &none), -EINVAL);
    if (!strstr(vase_last_error(c), "slack -2"))
        fail_msg("after a local refusal, vase_last_error() is \"%s\"", vase_last_error(c));
    struct vase_model *m2 = NULL;
    g.arena = 7;
    assert_int_equal(vase_model_register(c, &g, &m2), -EINVAL);
    assert_string_equal(vase_last_error(c), "no arena 7");
    g.arena = 0;

    /* The daemon's words again, then a call that succeeds. */
    assert_int_equal(vase_seq_open(c, m, &huge, &none), -ENOSPC);
    assert_string_equal(vase_last_error(c), daemon);
    assert_int_equal(vase_ping(c), 0);
    assert_string_equal(vase_last_error(c), "");

    /* The same for the calls on a sequence. */
    assert_int_equal(vase_seq_open(c, m, &cfg, &s), 0);
    assert_string_equal(vase_last_error(c), "");
    assert_int_equal(vase_seq_open(c, m, &huge, &none), -ENOSPC);
    float values[2] = {1, 2};
    assert_int_equal(vase_seq_push_stats(s, g.layers, VASE_STATS_ACC_ADD, values, 1), -EINVAL);
    if (!strstr(vase_last_error(c), "layer 2 of 2"))
        fail_msg("after a refused push, vase_last_error() is \"%s\"", vase_last_error(c));
    assert_int_equal(vase_seq_append(s, 1), 0);
    assert_string_equal(vase_last_error(c), "");
    /* Statistics are attention, never negative: refused before anything is sent. */
    float negative[2] = {0.5f, -1.0f};
    assert_int_equal(vase_seq_push_stats(s, 0, VASE_STATS_ACC_ADD, negative, 1), -EINVAL);
    if (!strstr(vase_last_error(c), "is -1"))
        fail_msg("after a negative push, vase_last_error() is \"%s\"", vase_last_error(c));
    assert_int_equal(vase_ping(c), 0);
    assert_int_equal(vase_seq_open(c, m, &huge, &none), -ENOSPC);
    assert_int_equal(vase_seq_append(s, vase_seq_capacity(s)), -ENOSPC);
    if (!strstr(vase_last_error(c), "do not fit"))
        fail_msg("after a full sequence, vase_last_error() is \"%s\"", vase_last_error(c));
    struct vase_view view;
    assert_int_equal(vase_seq_kv_view(s, 0, VASE_K, &view), 0);
    assert_string_equal(vase_last_error(c), "");

    /* A failure the errno says all about: "", not the daemon's earlier message. */
    assert_int_equal(vase_seq_open(c, m, &huge, &none), -ENOSPC);
    assert_int_equal(harness_daemon_stop(&f->d, SIGKILL, NULL), 0);
    assert_int_equal(vase_ping(c), -ECONNRESET);
    assert_string_equal(vase_last_error(c), "");
    assert_null(none);
}

/* max_clients sessions at once; the next handshake is refused with -EUSERS, and a place that
 * frees up is taken again. */
static void test_client_limit(void **state) {
    struct harness_fixture *f = *state;
    assert_int_equal(harness_connect(&f->d, "one", &f->c[0]), 0);
    assert_int_equal(harness_connect(&f->d, "two", &f->c[1]), 0);
    struct vase_client *c = (struct vase_client *)0x1;
    assert_int_equal(harness_connect(&f->d, "three", &c), -EUSERS);
    assert_ptr_equal(c, (struct vase_client *)0x1);
    f->c[0] = vase_disconnect(f->c[0]);
    assert_int_equal(harness_wait_clients(&f->d, 1, HARNESS_WAIT_MS), 0);
    assert_int_equal(harness_connect(&f->d, "three", &f->c[2]), 0);
    assert_int_equal(vase_ping(f->c[2]), 0);
}

/* ---- the allow-list ---- */

struct identity {
    const struct harness_daemon *d;
    uid_t uid;
    gid_t gid;
    int want; /* what vase_connect must return */
};

/* In a child: become uid/gid with no supplementary groups and connect. Exit 0 when
 * vase_connect returned what was wanted (and a Ping works after a success). */
static int connect_as(void *arg) {
    const struct identity *id = arg;
    if (setgroups(0, NULL) < 0 || setgid(id->gid) < 0 || setuid(id->uid) < 0) {
        fprintf(stderr, "child: cannot become %u:%u\n", (unsigned)id->uid, (unsigned)id->gid);
        return 2;
    }
    struct vase_client *c = NULL;
    int r = harness_connect(id->d, "allow-list", &c);
    if (r != id->want) {
        fprintf(stderr, "child %u:%u: vase_connect returned %d (%s), want %d (%s)\n",
                (unsigned)id->uid, (unsigned)id->gid, r, vase_strerror(r), id->want,
                vase_strerror(id->want));
        vase_disconnect(c);
        return 3;
    }
    r = c ? vase_ping(c) : 0;
    vase_disconnect(c);
    if (r < 0) {
        fprintf(stderr, "child %u:%u: vase_ping: %s\n", (unsigned)id->uid, (unsigned)id->gid,
                vase_strerror(r));
        return 4;
    }
    return 0;
}

static void assert_connect_as(const struct harness_daemon *d, uid_t uid, gid_t gid, int want) {
    struct identity id = {.d = d, .uid = uid, .gid = gid, .want = want};
    pid_t pid;
    int status;
    assert_int_equal(harness_fork(connect_as, &id, &pid), 0);
    assert_int_equal(harness_wait_pid(pid, HARNESS_RUN_MS, &status), 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("connecting as %u:%u did not give %d (%s); status 0x%x", (unsigned)uid,
                 (unsigned)gid, want, vase_strerror(want), status);
}

#define STRANGER 12345 /* a uid and gid on no list and in no group */

/*
 * allow_users=nobody. Root and the daemon's own user are always admitted (daemon/core/session.c:
 * root could take the memory anyway); so the refusal is checked from children that drop to
 * other ids, after the socket files are opened to everyone so that the daemon's check is the
 * only gate: a stranger is refused with -EPERM at the handshake, nobody is admitted, and the
 * runtime-changeable allow_users/allow_groups admit the stranger by uid or by primary group.
 */
static void test_allow_list(void **state) {
    struct harness_fixture *f = *state;
    if (getuid() != 0)
        fail_msg("this test must run as root (it switches to other users)");
    struct passwd *nobody = getpwnam("nobody");
    if (!nobody)
        fail_msg("no user \"nobody\" on this system");

    static const char *const socks[] = {"session.sock", "control.sock", "events.sock"};
    assert_int_equal(chmod(f->d.dir, 0755), 0);
    for (size_t i = 0; i < 3; i++) {
        char path[128];
        harness_daemon_path(&f->d, socks[i], path, sizeof(path));
        assert_int_equal(chmod(path, 0666), 0);
    }

    assert_connect_as(&f->d, STRANGER, STRANGER, -EPERM);
    assert_connect_as(&f->d, nobody->pw_uid, nobody->pw_gid, 0);
    assert_int_equal(harness_connect(&f->d, "root", &f->c[0]), 0);
    struct harness_status st = status_of(&f->d);
    assert_int_equal(st.clients, 1);
    /* No ZeroMQ context may live across the next fork. */
    f->c[0] = vase_disconnect(f->c[0]);
    assert_int_equal(harness_wait_clients(&f->d, 0, HARNESS_WAIT_MS), 0);

    config_set(&f->d, "allow_groups", "4242");
    assert_connect_as(&f->d, STRANGER, STRANGER, -EPERM);
    assert_connect_as(&f->d, STRANGER + 1, 4242, 0);
    config_set(&f->d, "allow_users", "nobody, 12345");
    assert_connect_as(&f->d, STRANGER, STRANGER, 0);
    assert_int_equal(harness_wait_clients(&f->d, 0, HARNESS_WAIT_MS), 0);
}

/* ---- restart ---- */

static bool mentions_daemon(const char *msg) {
    return strcasestr(msg, "daemon") || strcasestr(msg, "vased") || strcasestr(msg, "restart");
}

/*
 * SIGTERM stops vased cleanly (exit 0); a client's next call fails at once with -ECONNRESET
 * (the daemon is gone). A new vased on the same runtime directory has a new incarnation; the
 * old clients' next calls that reach for the daemon (a Ping; an append that fires an eviction)
 * fail at once with -ECONNRESET or -VASE_ESTALE, never after a timeout; the old clients can be
 * freed and vase_connect works again. "At once" is shown by the error: a call that waited for
 * its timeout (HARNESS_CLIENT_MS) would return -ETIMEDOUT. The times are printed, not asserted.
 */
static void test_daemon_restart(void **state) {
    struct harness_fixture *f = *state;
    struct vase_geometry g = harness_geometry();
    struct vase_model *m[3];
    struct vase_seq *s[3];
    /* Sync snapkv, budget 128, window 32: the append that makes len 160 fires an eviction. */
    struct vase_seq_config cfg = harness_seq_config(VASE_POLICY_SNAPKV, 128, 32, 16, 1);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(harness_engine_open(&f->d, "before", &g, &f->c[i], &m[i]), 0);
        assert_int_equal(vase_seq_open(f->c[i], m[i], &cfg, &s[i]), 0);
        assert_int_equal(harness_append_tokens(s[i], &g, 0, 16, true), 0);
        assert_int_equal(harness_append_tokens(s[i], &g, 0, 159 - 16, false), 0);
    }
    uint64_t old_incarnation = vase_client_incarnation(f->c[0]);
    assert_int_equal(old_incarnation, f->d.incarnation);

    int status;
    double t = harness_now();
    assert_int_equal(harness_daemon_stop(&f->d, SIGTERM, &status), 0);
    printf("vased stopped by SIGTERM in %.1f ms, wait status 0x%x\n", (harness_now() - t) * 1e3,
           status);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("SIGTERM did not stop vased cleanly: wait status 0x%x (%s %d)", status,
                 WIFSIGNALED(status) ? "killed by signal" : "exit code",
                 WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));

    /* Daemon gone: client 0 notices on its next call, without waiting for its timeout. */
    t = harness_now();
    int r = vase_ping(f->c[0]);
    double dt = harness_now() - t;
    printf("call with the daemon gone: %d (%s) after %.2f ms\n", r, vase_strerror(r), dt * 1e3);
    assert_int_equal(r, -ECONNRESET);
    /* ... and keeps failing the same way, also on sequence calls. */
    assert_int_equal(harness_write_token(s[0], &g, 0, 159, 159), 0);
    assert_int_equal(vase_seq_append(s[0], 1), -ECONNRESET);

    assert_int_equal(harness_daemon_start(&f->d, NULL), 0);
    assert_int_not_equal(f->d.incarnation, old_incarnation);

    /* Clients 1 and 2 have not called since the restart. */
    for (int i = 1; i < 3; i++) {
        t = harness_now();
        r = i == 1 ? vase_ping(f->c[i]) : harness_append_tokens(s[i], &g, 0, 1, false);
        dt = harness_now() - t;
        printf("first call after the restart (%s): %d (%s) after %.2f ms\n",
               i == 1 ? "ping" : "append firing an eviction", r, vase_strerror(r), dt * 1e3);
        if (r != -ECONNRESET && r != -VASE_ESTALE)
            fail_msg("got %d (%s), want -ECONNRESET or -VASE_ESTALE", r, vase_strerror(r));
        if (r == -VASE_ESTALE)
            assert_true(mentions_daemon(vase_strerror(r)));
        assert_int_equal(vase_ping(f->c[i]), r);
    }

    /* Freeing the old clients sends nothing and waits for nothing; reconnecting works. */
    t = harness_now();
    for (int i = 0; i < 3; i++)
        f->c[i] = vase_disconnect(f->c[i]);
    printf("three old clients freed in %.2f ms\n", (harness_now() - t) * 1e3);
    assert_int_equal(harness_engine_open(&f->d, "after", &g, &f->c[0], &m[0]), 0);
    assert_int_equal(vase_client_incarnation(f->c[0]), f->d.incarnation);
    assert_int_equal(vase_seq_open(f->c[0], m[0], &cfg, &s[0]), 0);
    assert_int_equal(harness_append_tokens(s[0], &g, 0, 16, true), 0);
    struct harness_status st = status_of(&f->d);
    assert_int_equal(st.clients, 1);
    assert_int_equal(st.seqs, 1);
}

/* A daemon that dies (SIGKILL) leaves its socket files behind: its clients notice at once
 * (-ECONNRESET, not -ETIMEDOUT), and a new daemon takes the runtime directory over. */
static void test_daemon_killed(void **state) {
    struct harness_fixture *f = *state;
    struct vase_geometry g = harness_geometry();
    struct vase_model *m;
    assert_int_equal(harness_engine_open(&f->d, "orphan", &g, &f->c[0], &m), 0);
    int status;
    assert_int_equal(harness_daemon_stop(&f->d, SIGKILL, &status), 0);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    char path[128];
    harness_daemon_path(&f->d, "session.sock", path, sizeof(path));
    assert_int_equal(access(path, F_OK), 0);

    double t = harness_now();
    int r = vase_ping(f->c[0]);
    double dt = harness_now() - t;
    printf("call after the daemon was killed: %d (%s) after %.2f ms\n", r, vase_strerror(r),
           dt * 1e3);
    assert_int_equal(r, -ECONNRESET);
    f->c[0] = vase_disconnect(f->c[0]);

    assert_int_equal(harness_daemon_start(&f->d, NULL), 0);
    assert_int_equal(harness_engine_open(&f->d, "after", &g, &f->c[0], &m), 0);
    struct harness_status st = status_of(&f->d);
    assert_int_equal(st.clients, 1);
    assert_int_equal(st.bytes_free, st.bytes_total);
    assert_int_equal(st.bytes_pages, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_layout_matches_protocol, setup,
                                        harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_sequences_disjoint, setup, harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_invalid_geometry, setup, harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_invalid_seq_params, setup, harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_seq_label, setup, harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_model_quota, setup, harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_admission_enospc, setup, harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_last_error, setup, harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_quota_edquot, setup_quota, harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_client_limit, setup_two_clients,
                                        harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_allow_list, setup_allow_nobody,
                                        harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_daemon_restart, setup, harness_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_daemon_killed, setup, harness_fixture_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
