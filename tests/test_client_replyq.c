/* SPDX-License-Identifier: MIT */

/*
 * Tests of lib/replyq.c: replies are taken by request id whatever order they arrived in,
 * each exactly once; dropping and clearing free them (valgrind and ASan check that nothing
 * leaks or is freed twice).
 */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "replyq.h"
#include "wire.h"

/* An envelope allocated the way vase_wire_unpack() allocates one, so the queue may free it. */
static Vase__Envelope *make_reply(uint64_t request_id) {
    Vase__Pong pong = VASE__PONG__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    Vase__Envelope *out = NULL;
    void *buf;
    size_t len;

    e.version = VASE_WIRE_VERSION;
    e.request_id = request_id;
    e.body_case = VASE__ENVELOPE__BODY_PONG;
    e.pong = &pong;
    assert_int_equal(vase_wire_pack(&e, &buf, &len), 0);
    assert_int_equal(vase_wire_unpack(buf, len, VASE_WIRE_DEFAULT_MAX, &out), 0);
    free(buf);
    return out;
}

static void test_out_of_order(void **state) {
    (void)state;
    struct vase__replyq q = {0};

    for (uint64_t id = 1; id <= 20; id++)
        assert_int_equal(vase__replyq_push(&q, make_reply(id)), 0);
    assert_int_equal(q.n, 20);
    assert_true(vase__replyq_has(&q, 7));
    assert_false(vase__replyq_has(&q, 21));
    assert_null(vase__replyq_take(&q, 21));

    /* Take them in an order unrelated to arrival. */
    const uint64_t order[] = {7, 20, 1, 13, 2};
    for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
        Vase__Envelope *e = vase__replyq_take(&q, order[i]);
        assert_non_null(e);
        assert_int_equal(e->request_id, order[i]);
        vase__envelope__free_unpacked(e, NULL);
        /* Exactly once. */
        assert_null(vase__replyq_take(&q, order[i]));
    }
    assert_int_equal(q.n, 15);

    vase__replyq_drop(&q, 3);
    vase__replyq_drop(&q, 3); /* a second drop of the same id is harmless */
    vase__replyq_drop(&q, 99);
    assert_int_equal(q.n, 14);
    assert_false(vase__replyq_has(&q, 3));

    /* The rest keep their arrival order. */
    const uint64_t rest[] = {4, 5, 6, 8, 9, 10, 11, 12, 14, 15, 16, 17, 18, 19};
    for (size_t i = 0; i < q.n; i++)
        assert_int_equal(q.items[i]->request_id, rest[i]);

    vase__replyq_clear(&q);
    assert_int_equal(q.n, 0);
    assert_null(q.items);
    /* Usable again after a clear. */
    assert_int_equal(vase__replyq_push(&q, make_reply(42)), 0);
    vase__replyq_clear(&q);
}

static void test_duplicate_ids(void **state) {
    (void)state;
    struct vase__replyq q = {0};

    /* Two replies with one id (a confused peer): each take returns one, oldest first. */
    Vase__Envelope *a = make_reply(5), *b = make_reply(5);
    assert_int_equal(vase__replyq_push(&q, a), 0);
    assert_int_equal(vase__replyq_push(&q, b), 0);
    Vase__Envelope *x = vase__replyq_take(&q, 5);
    assert_ptr_equal(x, a);
    Vase__Envelope *y = vase__replyq_take(&q, 5);
    assert_ptr_equal(y, b);
    vase__envelope__free_unpacked(x, NULL);
    vase__envelope__free_unpacked(y, NULL);
    vase__replyq_clear(&q);
}

static void test_empty(void **state) {
    (void)state;
    struct vase__replyq q = {0};
    assert_null(vase__replyq_take(&q, 1));
    assert_false(vase__replyq_has(&q, 1));
    vase__replyq_drop(&q, 1);
    vase__replyq_clear(&q);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_out_of_order),
        cmocka_unit_test(test_duplicate_ids),
        cmocka_unit_test(test_empty),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
