/* SPDX-License-Identifier: MIT */

/* Unit tests of daemon/core/admitq.c, the queue of opens waiting for room: arrival order, unlinking
 * anywhere (head, middle, tail), dropping a client's entries, expiry in order, the earliest
 * deadline, and the counts and tail pointer kept right through all of them. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "../daemon/core/admitq.h"

static struct vase_admit_wait *entry(uint32_t client_id, double deadline) {
    struct vase_admit_wait *w = vase_admit_wait_new();
    assert_non_null(w);
    w->client_id = client_id;
    w->deadline = deadline;
    return w;
}

/* The queue holds exactly the deadlines want[0 .. n) in order, with a consistent tail. */
static void assert_queue(const struct vase_admitq *q, const double *want, uint32_t n) {
    const struct vase_admit_wait *w = q->head, *last = NULL;
    for (uint32_t i = 0; i < n; i++) {
        assert_non_null(w);
        assert_true(w->deadline == want[i]);
        last = w;
        w = w->next;
    }
    assert_null(w);
    assert_ptr_equal(q->tail, last);
    assert_int_equal(q->n, n);
}

static void test_fifo_and_unlink(void **state) {
    (void)state;
    struct vase_admitq q = {0};
    assert_true(vase_admitq_next_deadline(&q) == 0);
    assert_null(vase_admitq_pop_expired(&q, 1e9));
    struct vase_admit_wait *w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = entry(1, 10 + i);
        vase_admitq_push(&q, w[i]);
    }
    assert_queue(&q, (double[]){10, 11, 12, 13}, 4);
    /* Middle, tail, head. */
    vase_admitq_unlink(&q, w[1], w[2]);
    free(w[2]);
    assert_queue(&q, (double[]){10, 11, 13}, 3);
    vase_admitq_unlink(&q, w[1], w[3]);
    free(w[3]);
    assert_queue(&q, (double[]){10, 11}, 2);
    vase_admitq_unlink(&q, NULL, w[0]);
    free(w[0]);
    assert_queue(&q, (double[]){11}, 1);
    /* A push after the tail moved goes to the end. */
    vase_admitq_push(&q, entry(1, 14));
    assert_queue(&q, (double[]){11, 14}, 2);
    vase_admitq_clear(&q);
    assert_queue(&q, NULL, 0);
    assert_null(q.head);
}

static void test_drop_client(void **state) {
    (void)state;
    struct vase_admitq q = {0};
    const uint32_t clients[] = {7, 8, 7, 9, 7};
    for (int i = 0; i < 5; i++)
        vase_admitq_push(&q, entry(clients[i], 20 + i));
    assert_int_equal(vase_admitq_count_client(&q, 7), 3);
    assert_int_equal(vase_admitq_count_client(&q, 8), 1);
    assert_int_equal(vase_admitq_count_client(&q, 5), 0);
    q.head->arena_id = 2;
    assert_int_equal(vase_admitq_count_arena(&q, 2), 1);
    assert_int_equal(vase_admitq_count_arena(&q, 0), 4);
    assert_int_equal(vase_admitq_count_arena(&q, 1), 0);
    /* Head, middle and tail entries of client 7 go; the others keep their order. */
    assert_int_equal(vase_admitq_drop_client(&q, 7), 3);
    assert_queue(&q, (double[]){21, 23}, 2);
    assert_int_equal(vase_admitq_drop_client(&q, 7), 0);
    assert_int_equal(vase_admitq_drop_client(&q, 9), 1);
    assert_queue(&q, (double[]){21}, 1);
    assert_int_equal(vase_admitq_drop_client(&q, 8), 1);
    assert_queue(&q, NULL, 0);
    /* An emptied queue works again. */
    vase_admitq_push(&q, entry(1, 5));
    assert_queue(&q, (double[]){5}, 1);
    vase_admitq_clear(&q);
}

static void test_expiry(void **state) {
    (void)state;
    struct vase_admitq q = {0};
    /* Deadlines out of arrival order: waits of different lengths. */
    const double deadlines[] = {30, 10, 40, 20};
    for (int i = 0; i < 4; i++)
        vase_admitq_push(&q, entry((uint32_t)i, deadlines[i]));
    assert_true(vase_admitq_next_deadline(&q) == 10);
    assert_null(vase_admitq_pop_expired(&q, 9.5));
    /* At 25, the entries due at 10 and 20 expire, in queue order; the rest stay. */
    struct vase_admit_wait *w = vase_admitq_pop_expired(&q, 25);
    assert_non_null(w);
    assert_true(w->deadline == 10);
    assert_null(w->next);
    free(w);
    w = vase_admitq_pop_expired(&q, 25);
    assert_non_null(w);
    assert_true(w->deadline == 20);
    free(w);
    assert_null(vase_admitq_pop_expired(&q, 25));
    assert_queue(&q, (double[]){30, 40}, 2);
    assert_true(vase_admitq_next_deadline(&q) == 30);
    /* A deadline equal to now has passed. */
    w = vase_admitq_pop_expired(&q, 30);
    assert_non_null(w);
    free(w);
    assert_queue(&q, (double[]){40}, 1);
    vase_admitq_clear(&q);
    assert_true(vase_admitq_next_deadline(&q) == 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fifo_and_unlink),
        cmocka_unit_test(test_drop_client),
        cmocka_unit_test(test_expiry),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
