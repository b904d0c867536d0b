/* SPDX-License-Identifier: MIT */

/*
 * libvase as an engine sees it: this file is compiled against the staged public headers alone
 * (the Makefile's PUBLIC_INCLUDE, with no -Ikernels, -Iclient or -Iproto) and linked twice, once
 * against libvase.a with its libraries and once against libvase.so. It fails to build if a
 * public header includes something that is not public, and fails to run if a function the
 * headers promise is missing from either library. It needs no daemon.
 */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "vase.h"

/* vase.h must not hand an engine the kernels' interface. */
#ifdef VASE_RNG_HEAD_SHARED
#error "vase.h exposes the kernels' header"
#endif
#ifndef VASE_NEEDS_K
#error "vase.h lacks vase_policy_needs()'s flags"
#endif
/* Nor the layout module the library and the daemon share. */
#ifdef VASE_LAYOUT_MAX_LAYERS
#error "vase.h exposes the layout module's header"
#endif

static void test_error_codes(void **state) {
    (void)state;
    /* The protocol's codes, one definition for both ends. */
    assert_int_equal(VASE_EPROTOVERSION, 1000);
    assert_int_equal(VASE_ESTALE, 1001);
    assert_string_equal(vase_strerror(-VASE_ESTALE), vase_strerror(VASE_ESTALE));
    assert_string_not_equal(vase_strerror(-VASE_EPROTOVERSION), vase_strerror(-VASE_ESTALE));
    assert_string_equal(vase_strerror(-ENOENT), "No such file or directory");
}

static void test_types(void **state) {
    enum vase_dtype dt;
    enum vase_policy p;

    (void)state;
    assert_int_equal(vase_dtype_from_string("bf16", &dt), 0);
    assert_int_equal(dt, VASE_DTYPE_BF16);
    assert_int_equal(vase_dtype_size(dt), 2);
    assert_string_equal(vase_dtype_to_string(VASE_DTYPE_F32), "f32");
    assert_int_equal(vase_dtype_from_string("f8", &dt), -EINVAL);

    assert_int_equal(vase_policy_from_string("snapkv", &p), 0);
    assert_int_equal(p, VASE_POLICY_SNAPKV);
    assert_string_equal(vase_policy_to_string(p), "snapkv");
    assert_true(vase_policy_needs(p) & VASE_NEEDS_Q);

    struct vase_params params = vase_params_default(512);
    assert_int_equal(params.budget, 512);
    assert_int_equal(vase_params_check(&params, VASE_POLICY_VASE_ATTNV), 0);
    params.budget = VASE_MAX_BUDGET + 1;
    assert_int_equal(vase_params_check(&params, VASE_POLICY_VASE_ATTNV), -EINVAL);

    assert_int_equal(vase_f32_to_bf16(1.0f), 0x3f80);
    assert_true(vase_f16_to_f32(vase_f32_to_f16(0.5f)) == 0.5f);
}

static void test_view(void **state) {
    float data[2][3][4]; /* [heads][rows][dim] */
    float row[4];

    (void)state;
    for (int i = 0; i < 24; i++)
        ((float *)data)[i] = (float)i;
    struct vase_view v = vase_view_contiguous(data, VASE_DTYPE_F32, 2, 3, 4);
    assert_ptr_equal(vase_view_row(&v, 2, 1), &data[1][2][0]);
    assert_int_equal(vase_view_read_row(&v, 1, 0, row), 0);
    assert_true(row[0] == 4.0f && row[3] == 7.0f);
}

/* The calls of paged attention: a model's per-layer tensors and a sequence's block table. */
static void test_paged_calls(void **state) {
    (void)state;
    struct vase_geometry g = {.layers = 2,
                              .q_heads = 4,
                              .kv_heads = 2,
                              .head_dim = 8,
                              .dtype = VASE_DTYPE_BF16,
                              .block_tokens = 256};
    struct vase_tensor t = {.ndim = 4, .device = -1};
    const int32_t *table = NULL;
    uint32_t n = 7;
    enum vase_kv kv = VASE_V;

    assert_int_equal(g.block_tokens, 256);
    assert_int_equal(sizeof(t.shape) / sizeof(t.shape[0]), 4);
    assert_int_equal(sizeof(t.strides[0]), sizeof(int64_t));
    assert_int_equal(vase_model_kv_tensor(NULL, 0, kv, &t), -EINVAL);
    assert_int_equal(t.ndim, 4);
    assert_int_equal(vase_model_page_bytes(NULL), 0);
    assert_int_equal(vase_model_tokens_per_page(NULL), 0);
    assert_int_equal(vase_seq_block_table(NULL, &table, &n), -EINVAL);
    assert_null(table);
    assert_int_equal(n, 7);
    assert_null(vase_seq_block_table_device(NULL));
}

/* Elastic budgets and labels: the configuration's fields and the calls, in both libraries. */
static void test_elastic_calls(void **state) {
    (void)state;
    struct vase_seq_config cfg = {.params = vase_params_default(1024),
                                  .min_budget = 512,
                                  .weight = VASE_MAX_WEIGHT,
                                  .label = "cmpl-1"};
    struct vase_open *o = NULL;
    struct vase_seq *s = NULL;
    assert_int_equal(VASE_MAX_WEIGHT, 1000);
    assert_int_equal(cfg.min_budget, 512);
    assert_int_equal(vase_seq_budget(NULL), 0);
    assert_int_equal(vase_seq_min_budget(NULL), 0);
    assert_int_equal(vase_seq_set_budget(NULL, 512), -EINVAL);
    /* Labels: the member added in libvase.so.2, its bound and getter. */
    assert_int_equal(VASE_SEQ_LABEL_MAX, 64);
    assert_string_equal(cfg.label, "cmpl-1");
    assert_string_equal(vase_seq_label(NULL), "");
    assert_int_equal(vase_seq_open_async(NULL, NULL, &cfg, &o), -EINVAL);
    assert_null(o);
    assert_int_equal(vase_open_poll(NULL, &s), -EINVAL);
    assert_null(s);
    vase_open_cancel(NULL);
    struct vase_seq_stats st = {.budget_changes = 1};
    assert_int_equal(st.budget_changes, 1);
}

static void test_connect_no_daemon(void **state) {
    char dir[] = "/tmp/vase-public-XXXXXX";
    struct vase_client *c = NULL;

    (void)state;
    assert_non_null(mkdtemp(dir));
    /* No daemon listens in an empty runtime directory: the call fails, c is untouched. */
    int r = vase_connect(&(struct vase_connect_options){.runtime_dir = dir, .timeout_ms = 200}, &c);
    assert_true(r == -ENOENT || r == -ECONNREFUSED);
    assert_null(c);
    assert_null(vase_disconnect(NULL));
    assert_int_equal(rmdir(dir), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_codes), cmocka_unit_test(test_types),
        cmocka_unit_test(test_view),        cmocka_unit_test(test_elastic_calls),
        cmocka_unit_test(test_paged_calls), cmocka_unit_test(test_connect_no_daemon),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
