/* SPDX-License-Identifier: MIT */

/* Unit tests of the control frame checks of daemon/control/control.c, without sockets: sizes before
 * unpacking, malformed frames, versions, bodies, incarnations, sessions and client_seq; and the
 * rule of sequence labels (proto/wire.c) that the daemon applies to OpenSeq. */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../daemon/control/control.h"
#include "../daemon/core/log.h"
#include "wire.h"

#define INC 0x1234567890abcdefull

static void *pack(Vase__Envelope *e, size_t *len) {
    void *buf;
    assert_int_equal(vase_wire_pack(e, &buf, len), 0);
    return buf;
}

static void *ping_frame(uint32_t version, uint64_t inc, uint64_t seq, uint64_t id, size_t *len) {
    static uint8_t payload[] = "abc";
    Vase__Ping ping = VASE__PING__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    ping.payload.data = payload;
    ping.payload.len = 3;
    e.version = version;
    e.incarnation = inc;
    e.client_seq = seq;
    e.request_id = id;
    e.body_case = VASE__ENVELOPE__BODY_PING;
    e.ping = &ping;
    return pack(&e, len);
}

static void test_sizes(void **state) {
    (void)state;
    struct vase_control_error err;
    Vase__Envelope *e = NULL;
    size_t len;
    void *buf = ping_frame(VASE_WIRE_VERSION, INC, 1, 5, &len);

    /* Over the limit: refused before protobuf sees it, even though it would unpack. */
    assert_int_equal(vase_control_unpack(buf, len, len - 1, &e, &err), -EMSGSIZE);
    assert_int_equal(err.code, EMSGSIZE);
    assert_int_equal(err.request_id, 0);
    assert_non_null(strstr(err.message, "max_message_bytes"));
    assert_null(e);
    assert_int_equal(vase_control_unpack(buf, len, len, &e, &err), 0);
    assert_non_null(e);
    assert_int_equal(e->request_id, 5);
    vase__envelope__free_unpacked(e, NULL);
    free(buf);

    /* A big frame of garbage costs nothing. */
    size_t big = 32u << 20;
    char *junk = malloc(big);
    assert_non_null(junk);
    memset(junk, 0xff, big);
    e = NULL;
    assert_int_equal(vase_control_unpack(junk, big, 16u << 20, &e, &err), -EMSGSIZE);
    assert_null(e);
    free(junk);
}

static void test_malformed(void **state) {
    (void)state;
    struct vase_control_error err;
    Vase__Envelope *e = NULL;
    size_t len;

    assert_int_equal(vase_control_unpack("\xff\xff\xff\xff", 4, 1024, &e, &err), -EBADMSG);
    assert_int_equal(err.code, EBADMSG);
    assert_null(e);

    /* An empty frame unpacks to version 0. */
    assert_int_equal(vase_control_unpack("", 0, 1024, &e, &err), -VASE_EPROTOVERSION);
    assert_int_equal(err.code, VASE_EPROTOVERSION);
    assert_null(e);

    void *buf = ping_frame(VASE_WIRE_VERSION + 1, INC, 1, 42, &len);
    assert_int_equal(vase_control_unpack(buf, len, 1024, &e, &err), -VASE_EPROTOVERSION);
    assert_int_equal(err.code, 1000);
    assert_int_equal(err.request_id, 42); /* echoed */
    assert_null(e);
    free(buf);

    Vase__Envelope nb = VASE__ENVELOPE__INIT;
    nb.version = VASE_WIRE_VERSION;
    nb.request_id = 43;
    buf = pack(&nb, &len);
    assert_int_equal(vase_control_unpack(buf, len, 1024, &e, &err), -EINVAL);
    assert_int_equal(err.code, EINVAL);
    assert_int_equal(err.request_id, 43);
    assert_non_null(strstr(err.message, "no body"));
    free(buf);

    /* A reply is not a request. */
    Vase__Pong pong = VASE__PONG__INIT;
    Vase__Envelope pe = VASE__ENVELOPE__INIT;
    pe.version = VASE_WIRE_VERSION;
    pe.request_id = 44;
    pe.body_case = VASE__ENVELOPE__BODY_PONG;
    pe.pong = &pong;
    buf = pack(&pe, &len);
    assert_int_equal(vase_control_unpack(buf, len, 1024, &e, &err), -EINVAL);
    assert_int_equal(err.request_id, 44);
    assert_non_null(strstr(err.message, "not a request"));
    assert_null(e);
    free(buf);

    /* Truncations of a valid frame never crash and never succeed with garbage. */
    buf = ping_frame(VASE_WIRE_VERSION, INC, 1, 45, &len);
    for (size_t cut = 0; cut < len; cut++) {
        e = NULL;
        int r = vase_control_unpack(buf, cut, 1024, &e, &err);
        if (r == 0)
            vase__envelope__free_unpacked(e, NULL);
        else
            assert_int_equal(-r, err.code);
    }
    free(buf);
}

static void test_fuzz(void **state) {
    (void)state;
    struct vase_control_error err;
    uint8_t buf[512];
    uint64_t last = 0;
    srand(11);
    for (int i = 0; i < 20000; i++) {
        size_t len = (size_t)(rand() % (int)sizeof(buf));
        for (size_t j = 0; j < len; j++)
            buf[j] = (uint8_t)rand();
        /* Start some frames like an envelope so the fuzz gets past the first byte. */
        if (len > 2 && i % 2) {
            buf[0] = 0x08;
            buf[1] = 0x01;
        }
        Vase__Envelope *e = NULL;
        int r = vase_control_unpack(buf, len, 400, &e, &err);
        if (r < 0) {
            assert_null(e);
            assert_int_equal(-r, err.code);
            assert_true(err.code > 0);
            continue;
        }
        assert_true(vase_wire_is_request(e->body_case));
        r = vase_control_check_peer(e, INC, i % 3 == 0, &last, NULL, &err);
        assert_true(r == 0 || -r == err.code);
        vase__envelope__free_unpacked(e, NULL);
    }
}

static Vase__Envelope *unpacked(Vase__Envelope__BodyCase body, uint64_t inc, uint64_t seq) {
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    Vase__CloseSeq cs = VASE__CLOSE_SEQ__INIT;
    Vase__Status st = VASE__STATUS__INIT;
    Vase__Envelope *ret = NULL;
    struct vase_control_error err;
    size_t len;
    e.version = VASE_WIRE_VERSION;
    e.incarnation = inc;
    e.client_seq = seq;
    e.request_id = 9;
    e.body_case = body;
    if (body == VASE__ENVELOPE__BODY_CLOSE_SEQ)
        e.close_seq = &cs;
    else
        e.status = &st;
    void *buf = pack(&e, &len);
    assert_int_equal(vase_control_unpack(buf, len, 1024, &ret, &err), 0);
    free(buf);
    return ret;
}

static void test_peer_checks(void **state) {
    (void)state;
    struct vase_control_error err;
    uint64_t last = 0;
    Vase__Envelope *e;

    assert_true(vase_wire_is_admin(VASE__ENVELOPE__BODY_STATUS));
    assert_true(vase_wire_is_admin(VASE__ENVELOPE__BODY_CONFIG_SET));
    assert_false(vase_wire_is_admin(VASE__ENVELOPE__BODY_OPEN_SEQ));
    assert_true(vase_wire_is_request(VASE__ENVELOPE__BODY_OPEN_SEQ));
    assert_false(vase_wire_is_request(VASE__ENVELOPE__BODY_WELCOME));
    assert_false(vase_wire_is_request(VASE__ENVELOPE__BODY_ERROR));

    /* Engine requests: the daemon's incarnation, a session. */
    e = unpacked(VASE__ENVELOPE__BODY_CLOSE_SEQ, INC + 1, 1);
    assert_int_equal(vase_control_check_peer(e, INC, true, &last, NULL, &err), -VASE_ESTALE);
    assert_int_equal(err.code, 1001);
    assert_int_equal(err.request_id, 9);
    vase__envelope__free_unpacked(e, NULL);
    e = unpacked(VASE__ENVELOPE__BODY_CLOSE_SEQ, 0, 1);
    assert_int_equal(vase_control_check_peer(e, INC, true, &last, NULL, &err), -VASE_ESTALE);
    vase__envelope__free_unpacked(e, NULL);
    e = unpacked(VASE__ENVELOPE__BODY_CLOSE_SEQ, INC, 1);
    assert_int_equal(vase_control_check_peer(e, INC, false, NULL, NULL, &err), -ENOTCONN);
    assert_int_equal(err.code, ENOTCONN);
    assert_int_equal(last, 0); /* refused requests do not advance the sequence */
    assert_int_equal(vase_control_check_peer(e, INC, true, &last, NULL, &err), 0);
    assert_int_equal(last, 1);
    /* The same client_seq again is a replay. */
    assert_int_equal(vase_control_check_peer(e, INC, true, &last, NULL, &err), -EPROTO);
    assert_int_equal(err.code, EPROTO);
    vase__envelope__free_unpacked(e, NULL);
    /* A gap is accepted, and its size reported (for a rate-limited log line). */
    e = unpacked(VASE__ENVELOPE__BODY_CLOSE_SEQ, INC, 10);
    uint64_t lost = 0;
    assert_int_equal(vase_control_check_peer(e, INC, true, &last, &lost, &err), 0);
    assert_int_equal(last, 10);
    assert_int_equal(lost, 8);
    vase__envelope__free_unpacked(e, NULL);
    /* client_seq 0 is never above the last one. */
    last = 0;
    e = unpacked(VASE__ENVELOPE__BODY_CLOSE_SEQ, INC, 0);
    assert_int_equal(vase_control_check_peer(e, INC, true, &last, NULL, &err), -EPROTO);
    vase__envelope__free_unpacked(e, NULL);

    /* Admin requests: any peer, incarnation 0 or the daemon's, no client_seq without a
     * session. */
    e = unpacked(VASE__ENVELOPE__BODY_STATUS, 0, 0);
    assert_int_equal(vase_control_check_peer(e, INC, false, NULL, NULL, &err), 0);
    assert_int_equal(vase_control_check_peer(e, INC, false, NULL, NULL, &err), 0);
    vase__envelope__free_unpacked(e, NULL);
    e = unpacked(VASE__ENVELOPE__BODY_STATUS, INC, 0);
    assert_int_equal(vase_control_check_peer(e, INC, false, NULL, NULL, &err), 0);
    vase__envelope__free_unpacked(e, NULL);
    e = unpacked(VASE__ENVELOPE__BODY_STATUS, INC - 1, 0);
    assert_int_equal(vase_control_check_peer(e, INC, false, NULL, NULL, &err), -VASE_ESTALE);
    vase__envelope__free_unpacked(e, NULL);
    /* From a session, admin requests take part in the client_seq order. */
    last = 5;
    e = unpacked(VASE__ENVELOPE__BODY_STATUS, 0, 5);
    assert_int_equal(vase_control_check_peer(e, INC, true, &last, NULL, &err), -EPROTO);
    vase__envelope__free_unpacked(e, NULL);
}

/* The credentials libzmq appends to an ipc peer's address, and nothing else. */
static void test_peer_cred(void **state) {
    (void)state;
    struct ucred c = {0};
    assert_int_equal(vase_control_peer_cred("localhost:1000:100:4242", &c), 0);
    assert_int_equal(c.uid, 1000);
    assert_int_equal(c.gid, 100);
    assert_int_equal(c.pid, 4242);
    assert_int_equal(vase_control_peer_cred("a:b:0:0:1", &c), 0);
    assert_int_equal(c.uid, 0);
    static const char *const bad[] = {
        "",
        "localhost",
        "1:2:3",
        "localhost:1:2",
        "localhost:x:2:3",
        "localhost:1::3",
        "localhost:-1:2:3",
        "localhost:1:2:3 ",
        "localhost:4294967295:2:3",
        "localhost:1:2:99999999999999999999999",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        c = (struct ucred){.uid = 7};
        assert_int_equal(vase_control_peer_cred(bad[i], &c), -ENODATA);
        assert_int_equal(c.uid, 7);
    }
    assert_int_equal(vase_control_peer_cred(NULL, &c), -ENODATA);
}

/* Who may send what: decided per body, from the connection's credentials. */
static void test_access_classes(void **state) {
    (void)state;
    assert_int_equal(vase_control_access_of(VASE__ENVELOPE__BODY_PING), VASE_CONTROL_ACCESS_ANY);
    assert_int_equal(vase_control_access_of(VASE__ENVELOPE__BODY_STATUS), VASE_CONTROL_ACCESS_ANY);
    assert_int_equal(vase_control_access_of(VASE__ENVELOPE__BODY_CONFIG_GET),
                     VASE_CONTROL_ACCESS_ANY);
    assert_int_equal(vase_control_access_of(VASE__ENVELOPE__BODY_LIST_CLIENTS),
                     VASE_CONTROL_ACCESS_ALLOWED);
    assert_int_equal(vase_control_access_of(VASE__ENVELOPE__BODY_LIST_SEQS),
                     VASE_CONTROL_ACCESS_ALLOWED);
    assert_int_equal(vase_control_access_of(VASE__ENVELOPE__BODY_GET_SEQ),
                     VASE_CONTROL_ACCESS_ALLOWED);
    assert_int_equal(vase_control_access_of(VASE__ENVELOPE__BODY_CONFIG_SET),
                     VASE_CONTROL_ACCESS_ADMIN);
    assert_int_equal(vase_control_access_of(VASE__ENVELOPE__BODY_OPEN_SEQ),
                     VASE_CONTROL_ACCESS_SESSION);
    assert_int_equal(vase_control_access_of(VASE__ENVELOPE__BODY_ATTN_STATS),
                     VASE_CONTROL_ACCESS_SESSION);
}

/* The rule of OpenSeq.label both ends apply (proto/wire.c): "" or up to 64 bytes of letters,
 * digits and ._:/@+=-; the reason for a refusal names the byte by offset and value and never
 * holds it. */
static void test_label_rule(void **state) {
    (void)state;
    char why[160], max[VASE_WIRE_LABEL_MAX + 2];
    static const char *const good[] = {
        "", "a", "cmpl-8f2c1d0e9b7a4c3d-0", "chatcmpl_42", "req:7/batch@host+1=x.y-z", "0"};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        if (vase_wire_label_check(good[i], why, sizeof(why)) != 0)
            fail_msg("label \"%s\" refused: %s", good[i], why);
    memset(max, 'q', VASE_WIRE_LABEL_MAX);
    max[VASE_WIRE_LABEL_MAX] = '\0';
    assert_int_equal(vase_wire_label_check(max, NULL, 0), 0);
    /* 65 bytes. */
    max[VASE_WIRE_LABEL_MAX] = 'q';
    max[VASE_WIRE_LABEL_MAX + 1] = '\0';
    assert_int_equal(vase_wire_label_check(max, why, sizeof(why)), -EINVAL);
    assert_string_equal(why, "label is longer than 64 bytes");

    static const struct {
        const char *label, *why;
    } bad[] = {
        {"req\n1", "label byte 3 is 0x0a (want at most 64 bytes of A-Z a-z 0-9 ._:/@+=-)"},
        {"\"quoted\"", "label byte 0 is 0x22"},
        {"caf\xc3\xa9", "label byte 3 is 0xc3"},
        {"a b", "label byte 1 is 0x20"},
        {"x\\y", "label byte 1 is 0x5c"},
        {"\x1b[31m", "label byte 0 is 0x1b"},
        {"a,b", "label byte 1 is 0x2c"},
        {"a{b}", "label byte 1 is 0x7b"},
        {"a\x7f", "label byte 1 is 0x7f"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        why[0] = '\0';
        assert_int_equal(vase_wire_label_check(bad[i].label, why, sizeof(why)), -EINVAL);
        if (strncmp(why, bad[i].why, strlen(bad[i].why)) != 0)
            fail_msg("case %zu: the reason is \"%s\", want \"%s...\"", i, why, bad[i].why);
        for (const char *w = why; *w; w++)
            assert_true(*w >= 0x20 && *w < 0x7f && *w != '"');
    }
    /* No reason asked for: the refusal alone. */
    assert_int_equal(vase_wire_label_check("a\nb", NULL, 0), -EINVAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_peer_cred),  cmocka_unit_test(test_access_classes),
        cmocka_unit_test(test_sizes),      cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_fuzz),       cmocka_unit_test(test_peer_checks),
        cmocka_unit_test(test_label_rule),
    };
    vase_log_set_max_level(LOG_EMERG);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
