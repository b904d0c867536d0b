/* SPDX-License-Identifier: MIT */

/*
 * The paged layout as an attention kernel reads it, against a real vased through the real
 * libvase. For several block sizes and dtypes, an engine writes every token with
 * vase_seq_write_kv(); the test then reads every slot back at the address it computes itself
 * from the published description alone (vase_model_kv_tensor() and vase_seq_block_table()):
 *
 *     data + table[s / B] * byte_strides[0] + (s % B) * byte_strides[1] + h * byte_strides[2]
 *
 * checks that description against the layout's formulas written out here (the per-layer
 * tensors of one arena, layer_stride apart, V kv_stride after K), and does so before and after
 * compactions (a prompt longer than the budget, so that the first one also drops pages from the
 * block table). Rows carry their token, layer, K/V and head, so a slot that holds the wrong row,
 * or a mix of rows, is caught. No layout function of the library is called to find an address.
 */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "integration/harness.h"

#define LAYERS 2u
#define Q_HEADS 4u
#define KV_HEADS 2u
#define DIM 8u
#define BUDGET 128u
#define WINDOW 32u
#define PROMPT 200u

static int setup(void **state) {
    return harness_fixture_setup(state, sizeof(struct harness_fixture), NULL);
}

/* Element d of the row of (token, layer, kv, head): small integers, exact in bf16 too; even
 * elements carry token % 64, odd ones token / 64, plus a mark of layer, K/V, head and d. */
static float element(uint32_t token, uint32_t layer, uint32_t kv, uint32_t h, uint32_t d) {
    uint32_t part = d % 2 == 0 ? token % 64 : token / 64;
    return (float)(part + 64 * ((layer + 2 * kv + 3 * h + d / 2) % 3));
}

static void store(void *row, enum vase_dtype dt, uint32_t d, float x) {
    if (dt == VASE_DTYPE_F32)
        ((float *)row)[d] = x;
    else if (dt == VASE_DTYPE_F16)
        ((uint16_t *)row)[d] = vase_f32_to_f16(x);
    else
        ((uint16_t *)row)[d] = vase_f32_to_bf16(x);
}

static float load(const void *row, enum vase_dtype dt, uint32_t d) {
    if (dt == VASE_DTYPE_F32)
        return ((const float *)row)[d];
    if (dt == VASE_DTYPE_F16)
        return vase_f16_to_f32(((const uint16_t *)row)[d]);
    return vase_bf16_to_f32(((const uint16_t *)row)[d]);
}

struct engine {
    enum vase_dtype dt;
    uint32_t block;
    size_t es;
    struct vase_model *m;
    struct vase_seq *s;
    uint32_t next; /* the next token to write */
};

/* Writes token t into slot `slot` of every layer. */
static void write_token(struct engine *e, uint32_t slot, uint32_t t) {
    uint8_t k[KV_HEADS * DIM * 4], v[KV_HEADS * DIM * 4];
    for (uint32_t l = 0; l < LAYERS; l++) {
        for (uint32_t h = 0; h < KV_HEADS; h++)
            for (uint32_t d = 0; d < DIM; d++) {
                store(k + h * DIM * e->es, e->dt, d, element(t, l, 0, h, d));
                store(v + h * DIM * e->es, e->dt, d, element(t, l, 1, h, d));
            }
        assert_int_equal(vase_seq_write_kv(e->s, l, slot, k, v), 0);
    }
}

/* The published tensors agree with PROTOCOL.md's formulas, computed here. */
static void check_tensors(const struct engine *e) {
    uint64_t token_stride = KV_HEADS * DIM * e->es;
    uint64_t kv_stride = e->block * token_stride, layer_stride = 2 * kv_stride;
    uint64_t page_bytes = LAYERS * layer_stride;
    struct vase_tensor k0;
    assert_int_equal(vase_model_kv_tensor(e->m, 0, VASE_K, &k0), 0);
    assert_int_equal(vase_model_page_bytes(e->m), page_bytes);
    for (uint32_t l = 0; l < LAYERS; l++)
        for (int kv = VASE_K; kv <= VASE_V; kv++) {
            struct vase_tensor t;
            assert_int_equal(vase_model_kv_tensor(e->m, l, (enum vase_kv)kv, &t), 0);
            assert_int_equal(t.ndim, 4);
            assert_int_equal(t.dtype, e->dt);
            assert_int_equal(t.device, -1);
            assert_int_equal((char *)t.data - (char *)k0.data,
                             (ptrdiff_t)(l * layer_stride + (kv == VASE_V ? kv_stride : 0)));
            assert_int_equal(t.shape[0], HARNESS_ARENA_BYTES / page_bytes);
            assert_int_equal(t.shape[1], e->block);
            assert_int_equal(t.shape[2], KV_HEADS);
            assert_int_equal(t.shape[3], DIM);
            const int64_t bytes[4] = {(int64_t)page_bytes, (int64_t)token_stride,
                                      (int64_t)(DIM * e->es), (int64_t)e->es};
            for (int i = 0; i < 4; i++) {
                assert_int_equal(t.byte_strides[i], bytes[i]);
                assert_int_equal(t.strides[i] * (int64_t)e->es, bytes[i]);
            }
        }
    assert_int_equal(vase_model_kv_tensor(e->m, LAYERS, VASE_K, &k0), -EINVAL);
}

/* The row of (slot, head) of layer's K or V at the address the tensor description gives. */
static const void *row_at(const struct engine *e, uint32_t layer, enum vase_kv kv, uint32_t slot,
                          uint32_t h) {
    struct vase_tensor t;
    const int32_t *table;
    uint32_t n;
    assert_int_equal(vase_model_kv_tensor(e->m, layer, kv, &t), 0);
    assert_int_equal(vase_seq_block_table(e->s, &table, &n), 0);
    assert_true(slot / e->block < n);
    int32_t block = table[slot / e->block];
    assert_true(block >= 0 && block < t.shape[0]);
    return (const char *)t.data + block * t.byte_strides[0] +
           (int64_t)(slot % e->block) * t.byte_strides[1] + h * t.byte_strides[2];
}

/* The token slot holds, read from the row of layer 0's K, head 0 (whose mark is 0 in elements 0
 * and 1); -1 if it is no token's row. */
static int64_t token_in(const struct engine *e, uint32_t slot) {
    const void *row = row_at(e, 0, VASE_K, slot, 0);
    float lo = load(row, e->dt, 0), hi = load(row, e->dt, 1);
    if (lo < 0 || lo >= 64 || hi < 0 || hi >= 64)
        return -1;
    return (int64_t)hi * 64 + (int64_t)lo;
}

/* Every slot of the sequence holds, in every layer, K/V and head, exactly the rows of the token
 * want[slot]; and the library reads the same bytes back. */
static void check_slots(const struct engine *e, const uint32_t *want, uint32_t len) {
    assert_int_equal(vase_seq_len(e->s), len);
    uint8_t k[KV_HEADS * DIM * 4], v[KV_HEADS * DIM * 4];
    for (uint32_t slot = 0; slot < len; slot++)
        for (uint32_t l = 0; l < LAYERS; l++) {
            assert_int_equal(vase_seq_read_kv(e->s, l, slot, k, v), 0);
            for (uint32_t h = 0; h < KV_HEADS; h++) {
                const void *kr = row_at(e, l, VASE_K, slot, h), *vr = row_at(e, l, VASE_V, slot, h);
                for (uint32_t d = 0; d < DIM; d++) {
                    float wk = element(want[slot], l, 0, h, d),
                          wv = element(want[slot], l, 1, h, d);
                    if (load(kr, e->dt, d) != wk || load(vr, e->dt, d) != wv)
                        fail_msg("block %u %s: slot %u layer %u head %u dim %u holds K %g V %g, "
                                 "token %u has K %g V %g",
                                 e->block, vase_dtype_to_string(e->dt), slot, l, h, d,
                                 (double)load(kr, e->dt, d), (double)load(vr, e->dt, d), want[slot],
                                 (double)wk, (double)wv);
                }
                assert_memory_equal(kr, k + h * DIM * e->es, DIM * e->es);
                assert_memory_equal(vr, v + h * DIM * e->es, DIM * e->es);
            }
        }
}

/* Decodes tokens one by one until an eviction is applied; then the slots hold the tokens the
 * streaming policy keeps, in order: the n_sink first, then the most recent. */
static void decode_to_eviction(struct engine *e, uint32_t *want) {
    for (;;) {
        uint32_t len = vase_seq_len(e->s);
        write_token(e, len, e->next);
        want[len] = e->next++;
        int r = vase_seq_append(e->s, 1);
        assert_true(r >= 0);
        if (r == 1)
            break;
    }
    uint32_t len = vase_seq_len(e->s);
    assert_int_equal(len, BUDGET);
    uint32_t sinks = 4; /* vase_params_default() */
    for (uint32_t i = 0; i < len; i++) {
        uint32_t t = i < sinks ? i : e->next - (len - i);
        int64_t got = token_in(e, i);
        if (got != (int64_t)t)
            fail_msg("block %u %s: after eviction %u slot %u holds token %lld, want %u", e->block,
                     vase_dtype_to_string(e->dt), vase_seq_rounds(e->s), i, (long long)got, t);
        want[i] = t;
    }
}

static void run_case(struct harness_fixture *f, enum vase_dtype dt, uint32_t block) {
    struct engine e = {.dt = dt, .block = block, .es = vase_dtype_size(dt)};
    struct vase_geometry g = {"layout", LAYERS, Q_HEADS, KV_HEADS, DIM, dt, block, 0};
    assert_int_equal(vase_model_register(f->c[0], &g, &e.m), 0);
    assert_int_equal(vase_model_tokens_per_page(e.m), block);
    check_tensors(&e);
    struct vase_seq_config cfg =
        harness_seq_config(VASE_POLICY_STREAMING, BUDGET, WINDOW, PROMPT, VASE_MODE_SYNC);
    assert_int_equal(vase_seq_open(f->c[0], e.m, &cfg, &e.s), 0);
    const int32_t *table;
    uint32_t n;
    assert_int_equal(vase_seq_block_table(e.s, &table, &n), 0);
    uint32_t open_pages = (PROMPT + 2 * WINDOW + block - 1) / block;
    assert_int_equal(n, open_pages);
    assert_null(vase_seq_block_table_device(e.s));

    uint32_t want[PROMPT + 2 * WINDOW];
    for (uint32_t t = 0; t < PROMPT; t++) {
        write_token(&e, t, t);
        want[t] = t;
    }
    e.next = PROMPT;
    assert_int_equal(vase_seq_append(e.s, PROMPT), 0);
    check_slots(&e, want, PROMPT);

    /* The first eviction compacts and hands the pages beyond the steady state back. */
    decode_to_eviction(&e, want);
    check_slots(&e, want, BUDGET);
    assert_int_equal(vase_seq_block_table(e.s, &table, &n), 0);
    assert_int_equal(n, (BUDGET + 2 * WINDOW + block - 1) / block < open_pages
                            ? (BUDGET + 2 * WINDOW + block - 1) / block
                            : open_pages);
    decode_to_eviction(&e, want);
    check_slots(&e, want, BUDGET);
    assert_int_equal(vase_seq_rounds(e.s), 2);
    assert_int_equal(vase_seq_close(e.s), 0);
}

static void test_tensor_addresses(void **state) {
    struct harness_fixture *f = *state;
    assert_int_equal(harness_connect(&f->d, "layout", &f->c[0]), 0);
    static const struct {
        enum vase_dtype dt;
        uint32_t block;
    } cases[] = {
        {VASE_DTYPE_F32, 1},   {VASE_DTYPE_BF16, 16}, {VASE_DTYPE_F16, 64},
        {VASE_DTYPE_F32, 256}, {VASE_DTYPE_BF16, 3},  {VASE_DTYPE_F16, 48},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        run_case(f, cases[i].dt, cases[i].block);
    struct harness_status st;
    assert_int_equal(harness_status(&f->d, &st), 0);
    assert_int_equal(st.bytes_pages, 0);
    assert_int_equal(st.bytes_free, st.bytes_total);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_tensor_addresses, setup, harness_fixture_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
