/* SPDX-License-Identifier: MIT */

/*
 * Integration tests of the control protocol at the wire level (PROTOCOL.md "Control"), against
 * a real vased, from raw ZeroMQ DEALER sockets and raw sessions instead of libvase: malformed,
 * oversized, multi-frame and wrong-version frames, envelopes without a body, stale
 * incarnations, engine requests from peers without a session, replayed client sequence
 * numbers, other clients' objects, the daemon's own checks of geometries (libvase checks them
 * too, so only a raw session reaches the daemon's) and of sequence labels, the ModelLayout it
 * answers, and a second EvictRequest while one is uncommitted. After every refusal the daemon
 * still answers Ping.
 */

#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <zmq.h>

#include "integration/harness.h"
#include "wire.h"

#define MAX_MESSAGE (64u << 10)

struct fixture {
    struct harness_fixture h;
    struct harness_session s[2];
};

static int setup_with(void **state, const char *const *args) {
    int r = harness_fixture_setup(state, sizeof(struct fixture), args);
    struct fixture *f = *state;
    if (f)
        f->s[0].fd = f->s[1].fd = -1;
    return r;
}

static int setup(void **state) {
    /* Metrics on a free port: test_engine_reports scrapes them. */
    static const char *const args[] = {"--max-message-bytes=64K", "--metrics-address=127.0.0.1:0",
                                       NULL};
    return setup_with(state, args);
}

/* At log level debug: error replies are logged. */
static int setup_debug(void **state) {
    static const char *const args[] = {"--max-message-bytes=64K", "--log-level=debug", NULL};
    return setup_with(state, args);
}

static int teardown(void **state) {
    struct fixture *f = *state;
    for (int i = 0; f && i < 2; i++)
        harness_session_close(&f->s[i]);
    return harness_fixture_teardown(state);
}

/* Checks that reply is an Error with code (and, when request_id is not 0, that id), frees it,
 * and that the daemon still answers Ping. */
static void expect_error(const struct harness_daemon *d, Vase__Envelope *reply, int code,
                         uint64_t request_id, const char *what) {
    assert_non_null(reply);
    if (reply->body_case != VASE__ENVELOPE__BODY_ERROR)
        fail_msg("%s: answered by %s, want Error %d", what, vase_wire_body_name(reply), code);
    if (reply->error->code != code)
        fail_msg("%s: Error %d (%s), want %d", what, reply->error->code, reply->error->message,
                 code);
    assert_true(reply->error->message && reply->error->message[0]);
    if (request_id)
        assert_int_equal(reply->request_id, request_id);
    assert_int_equal(reply->version, VASE_WIRE_VERSION);
    vase__envelope__free_unpacked(reply, NULL);
    assert_int_equal(harness_ping(d), 0);
}

static void send_raw(const struct harness_daemon *d, const void *buf, size_t len, int code,
                     const char *what) {
    Vase__Envelope *reply = NULL;
    int r = harness_send_frame(d, buf, len, NULL, 0, &reply);
    if (r < 0)
        fail_msg("%s: no reply (%s)", what, vase_strerror(r));
    expect_error(d, reply, code, 0, what);
}

/* Packs e (version and request id as given) and sends it from a peer without a session. */
static void send_envelope(const struct harness_daemon *d, Vase__Envelope *e, int code,
                          const char *what) {
    void *buf;
    size_t len;
    assert_int_equal(vase_wire_pack(e, &buf, &len), 0);
    Vase__Envelope *reply = NULL;
    int r = harness_send_frame(d, buf, len, NULL, 0, &reply);
    free(buf);
    if (r < 0)
        fail_msg("%s: no reply (%s)", what, vase_strerror(r));
    expect_error(d, reply, code, e->request_id, what);
}

/* ---- frames ---- */

static void test_garbage(void **state) {
    struct fixture *f = *state;
    /* A varint that never ends: no protobuf parser accepts it. */
    static const uint8_t garbage[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                      0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    send_raw(&f->h.d, garbage, sizeof(garbage), EBADMSG, "garbage");
    /* A field of a wire type that does not exist (7). */
    static const uint8_t bad_type[] = {0x0f, 0x01, 0x02};
    send_raw(&f->h.d, bad_type, sizeof(bad_type), EBADMSG, "wire type 7");
}

static void test_oversized(void **state) {
    struct fixture *f = *state;
    uint8_t *big = calloc(1, MAX_MESSAGE + 1);
    assert_non_null(big);
    send_raw(&f->h.d, big, MAX_MESSAGE + 1, EMSGSIZE, "max_message_bytes + 1");
    free(big);
}

static void test_two_frames(void **state) {
    struct fixture *f = *state;
    char endpoint[128];
    snprintf(endpoint, sizeof(endpoint), "ipc://%s/control.sock", f->h.d.dir);
    void *ctx = zmq_ctx_new();
    void *sock = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0, timeout = HARNESS_REQUEST_MS;
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(sock, ZMQ_RCVTIMEO, &timeout, sizeof(timeout));
    assert_int_equal(zmq_connect(sock, endpoint), 0);
    assert_int_equal(zmq_send(sock, "a", 1, ZMQ_SNDMORE), 1);
    assert_int_equal(zmq_send(sock, "b", 1, 0), 1);
    char buf[4096];
    int n = zmq_recv(sock, buf, sizeof(buf), 0);
    zmq_close(sock);
    zmq_ctx_term(ctx);
    assert_true(n > 0 && n <= (int)sizeof(buf));
    Vase__Envelope *reply = NULL;
    assert_int_equal(vase_wire_unpack(buf, (size_t)n, sizeof(buf), &reply), 0);
    expect_error(&f->h.d, reply, EBADMSG, 0, "two frames");
}

static void test_wrong_version(void **state) {
    struct fixture *f = *state;
    Vase__Ping ping = VASE__PING__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    e.request_id = 77;
    e.body_case = VASE__ENVELOPE__BODY_PING;
    e.ping = &ping;
    /* The version before (its pages were not the layout of today) and the one after. */
    e.version = VASE_WIRE_VERSION - 1;
    send_envelope(&f->h.d, &e, VASE_EPROTOVERSION, "the previous version");
    e.version = VASE_WIRE_VERSION + 1;
    send_envelope(&f->h.d, &e, VASE_EPROTOVERSION, "the next version");
    /* An empty frame is an envelope with every field at its default: version 0. */
    send_raw(&f->h.d, "", 0, VASE_EPROTOVERSION, "empty frame");
}

static void test_no_body(void **state) {
    struct fixture *f = *state;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    e.version = VASE_WIRE_VERSION;
    e.request_id = 78;
    send_envelope(&f->h.d, &e, EINVAL, "no body");
    /* A reply body sent as a request. */
    Vase__Pong pong = VASE__PONG__INIT;
    e.request_id = 79;
    e.body_case = VASE__ENVELOPE__BODY_PONG;
    e.pong = &pong;
    send_envelope(&f->h.d, &e, EINVAL, "pong as a request");
}

static void test_stale_incarnation(void **state) {
    struct fixture *f = *state;
    Vase__Status st = VASE__STATUS__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    e.version = VASE_WIRE_VERSION;
    e.incarnation = f->h.d.incarnation ^ 1;
    e.request_id = 80;
    e.body_case = VASE__ENVELOPE__BODY_STATUS;
    e.status = &st;
    send_envelope(&f->h.d, &e, VASE_ESTALE, "Status with another incarnation");
    /* The daemon's own incarnation and 0 both work for admin requests. */
    Vase__Envelope *reply = NULL;
    e.incarnation = f->h.d.incarnation;
    assert_int_equal(harness_request(&f->h.d, &e, &reply), 0);
    assert_int_equal(reply->body_case, VASE__ENVELOPE__BODY_STATUS_REPLY);
    vase__envelope__free_unpacked(reply, NULL);
}

/* Requests on models and sequences from a routing id that is no session's token. */
static void test_engine_request_without_session(void **state) {
    struct fixture *f = *state;
    Vase__ModelGeometry geo = VASE__MODEL_GEOMETRY__INIT;
    geo.layers = geo.q_heads = geo.kv_heads = 1;
    geo.head_dim = 8;
    Vase__RegisterModel reg = VASE__REGISTER_MODEL__INIT;
    reg.geometry = &geo;
    Vase__OpenSeq open = VASE__OPEN_SEQ__INIT;
    Vase__CloseSeq close_seq = VASE__CLOSE_SEQ__INIT;
    Vase__EvictRequest evict = VASE__EVICT_REQUEST__INIT;
    Vase__EvictCommit commit = VASE__EVICT_COMMIT__INIT;
    Vase__AttnStats stats = VASE__ATTN_STATS__INIT;
    struct {
        Vase__Envelope__BodyCase body;
        void *msg;
    } reqs[] = {
        {VASE__ENVELOPE__BODY_REGISTER_MODEL, &reg},  {VASE__ENVELOPE__BODY_OPEN_SEQ, &open},
        {VASE__ENVELOPE__BODY_CLOSE_SEQ, &close_seq}, {VASE__ENVELOPE__BODY_EVICT_REQUEST, &evict},
        {VASE__ENVELOPE__BODY_EVICT_COMMIT, &commit}, {VASE__ENVELOPE__BODY_ATTN_STATS, &stats},
    };
    for (size_t i = 0; i < sizeof(reqs) / sizeof(reqs[0]); i++) {
        Vase__Envelope e = VASE__ENVELOPE__INIT;
        e.version = VASE_WIRE_VERSION;
        e.incarnation = f->h.d.incarnation;
        e.client_seq = 1;
        e.request_id = 100 + i;
        e.body_case = reqs[i].body;
        e.register_model = reqs[i].msg; /* one member of the body union */
        char what[64];
        snprintf(what, sizeof(what), "%s without a session", vase_wire_body_name(&e));
        send_envelope(&f->h.d, &e, ENOTCONN, what);
        /* Without the incarnation, the staleness is what is reported. */
        e.incarnation = 0;
        send_envelope(&f->h.d, &e, VASE_ESTALE, what);
    }
}

/* Admin requests about things that do not exist. */
static void test_admin_errors(void **state) {
    struct fixture *f = *state;
    Vase__Envelope *reply = NULL;
    assert_int_equal(harness_get_seq(&f->h.d, 4242, &reply), -ENOENT);
    vase__envelope__free_unpacked(reply, NULL);
    Vase__ListSeqs ls = VASE__LIST_SEQS__INIT;
    ls.client_id = 4242;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    e.version = VASE_WIRE_VERSION;
    e.request_id = 90;
    e.body_case = VASE__ENVELOPE__BODY_LIST_SEQS;
    e.list_seqs = &ls;
    send_envelope(&f->h.d, &e, ENOENT, "ListSeqs of no client");
    assert_int_equal(harness_config_set(&f->h.d, "no_such_setting", "1"), -ENOENT);
    Vase__ConfigGet cg = VASE__CONFIG_GET__INIT;
    cg.key = "no_such_setting";
    e.request_id = 91;
    e.body_case = VASE__ENVELOPE__BODY_CONFIG_GET;
    e.config_get = &cg;
    send_envelope(&f->h.d, &e, ENOENT, "ConfigGet of no setting");
}

/* ---- raw sessions ---- */

static Vase__Envelope *session_send(struct harness_session *s, Vase__Envelope *e) {
    Vase__Envelope *reply = NULL;
    int r = harness_session_request(s, e, &reply);
    if (r < 0)
        fail_msg("%s: no reply (%s)", vase_wire_body_name(e), vase_strerror(r));
    return reply;
}

/* A request whose body is msg (body_case selects the member of the body union; every member is
 * a pointer to a message) from the session; the reply. */
static Vase__Envelope *session_call(struct harness_session *s, Vase__Envelope__BodyCase body_case,
                                    void *msg) {
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    e.body_case = body_case;
    e.ping = msg;
    return session_send(s, &e);
}

/* RegisterModel of an f32 geometry in arena 0 (then adjust the rest), the reply. */
static Vase__Envelope *register_model(struct harness_session *s, uint32_t layers, uint32_t q_heads,
                                      uint32_t kv_heads, uint32_t head_dim, uint32_t block_tokens,
                                      Vase__ModelGeometry *geo) {
    Vase__ModelGeometry plain = VASE__MODEL_GEOMETRY__INIT;
    if (!geo)
        geo = &plain;
    geo->name = "raw";
    geo->layers = layers;
    geo->q_heads = q_heads;
    geo->kv_heads = kv_heads;
    geo->head_dim = head_dim;
    geo->block_tokens = block_tokens;
    Vase__RegisterModel reg = VASE__REGISTER_MODEL__INIT;
    reg.geometry = geo;
    return session_call(s, VASE__ENVELOPE__BODY_REGISTER_MODEL, &reg);
}

/* The daemon's own geometry checks, and the ModelLayout of PROTOCOL.md. */
static void test_register_model_raw(void **state) {
    struct fixture *f = *state;
    assert_int_equal(harness_session_open(&f->h.d, &f->s[0]), 0);
    assert_int_equal(f->s[0].incarnation, f->h.d.incarnation);
    assert_int_equal(f->s[0].max_message_bytes, MAX_MESSAGE);
    assert_int_equal(f->s[0].token_len, 16);

    static const uint32_t bad[][5] = {
        /* layers, q_heads, kv_heads, head_dim, block_tokens; the last three: a page larger than
         * the 4 MiB arena (16 tokens of 512 KiB, 4097 of 1 KiB), a block over the limit. */
        {0, 4, 2, 32, 1},   {2, 4, 0, 32, 1},    {2, 0, 2, 32, 1},
        {2, 3, 2, 32, 1},   {2, 4, 2, 0, 1},     {1, 1, 1, VASE_MAX_DIM + 1, 1},
        {64, 8, 8, 128, 0}, {2, 4, 2, 32, 4097}, {1, 1, 1, 1, 65537},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char what[64];
        snprintf(what, sizeof(what), "geometry %zu", i);
        expect_error(
            &f->h.d,
            register_model(&f->s[0], bad[i][0], bad[i][1], bad[i][2], bad[i][3], bad[i][4], NULL),
            EINVAL, 0, what);
    }
    Vase__ModelGeometry geo = VASE__MODEL_GEOMETRY__INIT;
    geo.arena_id = 3;
    expect_error(&f->h.d, register_model(&f->s[0], 2, 4, 2, 32, 1, &geo), EINVAL, 0, "arena 3");

    /* 3 layers, 8 query heads, 2 KV heads, dim 24, f16, blocks of 8 tokens: token_stride 96,
     * pages of 8 * 3 * 2 * 96 = 4608 bytes, 910 of them in the 4 MiB arena; ring entries of
     * 3 * 384 bytes, 4 per ring page of 4608 bytes. */
    geo.arena_id = 0;
    geo.dtype = VASE__DTYPE__DTYPE_F16;
    Vase__Envelope *reply = register_model(&f->s[0], 3, 8, 2, 24, 8, &geo);
    assert_int_equal(reply->body_case, VASE__ENVELOPE__BODY_MODEL_LAYOUT);
    const Vase__ModelLayout *ml = reply->model_layout;
    assert_int_equal(ml->block_tokens, 8);
    assert_int_equal(ml->page_bytes, 4608);
    assert_int_equal(ml->num_blocks, HARNESS_ARENA_BYTES / 4608);
    assert_int_equal(ml->token_stride, 96);
    assert_int_equal(ml->head_stride, 48);
    assert_int_equal(ml->kv_stride, 8 * 96);
    assert_int_equal(ml->layer_stride, 2 * 8 * 96);
    assert_int_equal(ml->ring_rows_per_page, 4);
    assert_int_equal(ml->ring_row_stride, 8 * 24 * 2);
    assert_int_equal(ml->ring_layer_stride, 4 * 8 * 24 * 2);
    assert_int_equal(ml->ring_page_bytes, 4608);
    vase__envelope__free_unpacked(reply, NULL);
}

/* SeqParams of policy, budget and window, the others the defaults. */
static Vase__SeqParams seq_params(const char *policy, uint32_t budget, uint32_t window) {
    Vase__SeqParams params = VASE__SEQ_PARAMS__INIT;
    params.policy = (char *)policy;
    params.budget = budget;
    params.window = window;
    params.n_sink = -1;
    params.n_large = -1;
    params.lambda = -1;
    return params;
}

/* OpenSeq of a streaming sequence, budget 128, window 32, prompt 0, with an admission wait of
 * wait_ms and the budget range min_budget .. 128 of weight; the reply envelope. */
static Vase__Envelope *open_seq_elastic(struct harness_session *s, uint32_t model_id,
                                        int32_t wait_ms, uint32_t min_budget, uint32_t weight) {
    Vase__SeqParams params = seq_params("streaming", 128, 32);
    Vase__OpenSeq open = VASE__OPEN_SEQ__INIT;
    open.model_id = model_id;
    open.params = &params;
    open.slack = -1;
    open.admission_wait_ms = wait_ms;
    open.min_budget = min_budget;
    open.weight = weight;
    return session_call(s, VASE__ENVELOPE__BODY_OPEN_SEQ, &open);
}

/* OpenSeq of a streaming sequence of budget and window, its other parameters the defaults. */
static Vase__Envelope *open_seq_params(struct harness_session *s, uint32_t model_id,
                                       uint32_t budget, uint32_t window) {
    Vase__SeqParams params = seq_params("streaming", budget, window);
    Vase__OpenSeq open = VASE__OPEN_SEQ__INIT;
    open.model_id = model_id;
    open.params = &params;
    open.slack = -1;
    return session_call(s, VASE__ENVELOPE__BODY_OPEN_SEQ, &open);
}

/* OpenSeq of a random sequence of budget 128, window 32 and min_budget (0: not elastic) with its
 * prompt of prompt_len tokens protected. */
static Vase__Envelope *open_seq_protect(struct harness_session *s, uint32_t model_id,
                                        uint32_t prompt_len, uint32_t min_budget) {
    Vase__SeqParams params = seq_params("random", 128, 32);
    params.protect_prompt = true;
    Vase__OpenSeq open = VASE__OPEN_SEQ__INIT;
    open.model_id = model_id;
    open.params = &params;
    open.prompt_len = prompt_len;
    open.slack = -1;
    open.min_budget = min_budget;
    return session_call(s, VASE__ENVELOPE__BODY_OPEN_SEQ, &open);
}

/* OpenSeq of a streaming sequence, budget 128, window 32, named label (NULL: the field unset). */
static Vase__Envelope *open_seq_label(struct harness_session *s, uint32_t model_id,
                                      const char *label) {
    Vase__SeqParams params = seq_params("streaming", 128, 32);
    Vase__OpenSeq open = VASE__OPEN_SEQ__INIT;
    open.model_id = model_id;
    open.params = &params;
    open.slack = -1;
    if (label)
        open.label = (char *)label;
    return session_call(s, VASE__ENVELOPE__BODY_OPEN_SEQ, &open);
}

/* An EINVAL reply whose message holds want: the rule the request broke, with its values. */
static void expect_rule(const struct harness_daemon *d, Vase__Envelope *reply, const char *want) {
    assert_non_null(reply);
    assert_int_equal(reply->body_case, VASE__ENVELOPE__BODY_ERROR);
    if (reply->error->code != EINVAL || !strstr(reply->error->message, want))
        fail_msg("Error %d \"%s\", want EINVAL saying \"%s\"", reply->error->code,
                 reply->error->message, want);
    expect_error(d, reply, EINVAL, 0, want);
}

static Vase__Envelope *open_seq_wait(struct harness_session *s, uint32_t model_id,
                                     int32_t wait_ms) {
    return open_seq_elastic(s, model_id, wait_ms, 0, 0);
}

static Vase__Envelope *set_budget(struct harness_session *s, uint32_t seq_id, uint32_t budget) {
    Vase__SetBudget sb = VASE__SET_BUDGET__INIT;
    sb.seq_id = seq_id;
    sb.budget = budget;
    return session_call(s, VASE__ENVELOPE__BODY_SET_BUDGET, &sb);
}

static Vase__Envelope *open_seq(struct harness_session *s, uint32_t model_id) {
    return open_seq_wait(s, model_id, 0);
}

static Vase__Envelope *close_seq(struct harness_session *s, uint32_t seq_id) {
    Vase__CloseSeq cs = VASE__CLOSE_SEQ__INIT;
    cs.seq_id = seq_id;
    return session_call(s, VASE__ENVELOPE__BODY_CLOSE_SEQ, &cs);
}

static Vase__Envelope *evict_request(struct harness_session *s, uint32_t seq_id, uint32_t len) {
    Vase__EvictRequest req = VASE__EVICT_REQUEST__INIT;
    req.seq_id = seq_id;
    req.len = len;
    req.position = len;
    req.ring_first = (len - 32) % 64;
    return session_call(s, VASE__ENVELOPE__BODY_EVICT_REQUEST, &req);
}

/* The engine's counters a commit reports (EvictCommit 4-6). */
struct engine_report {
    uint64_t stalls;
    double stall_seconds, compact_seconds;
};

static Vase__Envelope *evict_commit_report(struct harness_session *s, uint32_t seq_id,
                                           uint32_t round, uint32_t new_len,
                                           struct engine_report rep) {
    Vase__EvictCommit ec = VASE__EVICT_COMMIT__INIT;
    ec.seq_id = seq_id;
    ec.round = round;
    ec.new_len = new_len;
    ec.stalls = rep.stalls;
    ec.stall_seconds = rep.stall_seconds;
    ec.compact_seconds = rep.compact_seconds;
    return session_call(s, VASE__ENVELOPE__BODY_EVICT_COMMIT, &ec);
}

static Vase__Envelope *evict_commit(struct harness_session *s, uint32_t seq_id, uint32_t round,
                                    uint32_t new_len) {
    return evict_commit_report(s, seq_id, round, new_len, (struct engine_report){0});
}

static Vase__Envelope *attn_stats_kind(struct harness_session *s, uint32_t seq_id, uint32_t layer,
                                       Vase__StatsKind kind, uint32_t len, float *values,
                                       size_t n_values) {
    Vase__AttnStats st = VASE__ATTN_STATS__INIT;
    st.seq_id = seq_id;
    st.layer = layer;
    st.kind = kind;
    st.len = len;
    st.values = values;
    st.n_values = n_values;
    return session_call(s, VASE__ENVELOPE__BODY_ATTN_STATS, &st);
}

static Vase__Envelope *attn_stats(struct harness_session *s, uint32_t seq_id, uint32_t layer,
                                  uint32_t len, float *values, size_t n_values) {
    return attn_stats_kind(s, seq_id, layer, VASE__STATS_KIND__STATS_ACC_ADD, len, values,
                           n_values);
}

/*
 * Ownership, ids and ordering between two raw sessions, and one eviction cycle by hand:
 * ENOENT for ids that do not exist, ENOENT too for another client's objects (the same answer, so
 * ids reveal nothing of other tenants), EPROTO for a replayed client_seq, 1001 for a stale
 * incarnation, EBUSY for a second EvictRequest before the commit; then the plan, the commit, and
 * every page back when the session socket closes.
 */
static void test_session_rules(void **state) {
    struct fixture *f = *state;
    struct harness_status st;
    assert_int_equal(harness_status(&f->h.d, &st), 0);
    assert_int_equal(harness_session_open(&f->h.d, &f->s[0]), 0);
    assert_int_equal(harness_session_open(&f->h.d, &f->s[1]), 0);
    assert_int_not_equal(f->s[0].client_id, f->s[1].client_id);
    assert_memory_not_equal(f->s[0].token, f->s[1].token, 16);

    Vase__Envelope *reply = register_model(&f->s[0], 2, 4, 2, 32, 64, NULL);
    assert_int_equal(reply->body_case, VASE__ENVELOPE__BODY_MODEL_LAYOUT);
    uint32_t model = reply->model_layout->model_id;
    assert_int_equal(reply->model_layout->block_tokens, 64);
    assert_int_equal(reply->model_layout->num_blocks, HARNESS_ARENA_PAGES);
    vase__envelope__free_unpacked(reply, NULL);

    expect_error(&f->h.d, open_seq(&f->s[0], model + 1000), ENOENT, 0, "OpenSeq of no model");
    expect_error(&f->h.d, open_seq(&f->s[1], model), ENOENT, 0, "OpenSeq of another's model");
    expect_error(&f->h.d, open_seq_wait(&f->s[0], model, -2), EINVAL, 0,
                 "OpenSeq with admission_wait_ms -2");
    expect_error(&f->h.d, open_seq_wait(&f->s[0], model, 600001), EINVAL, 0,
                 "OpenSeq with admission_wait_ms 600001");
    expect_error(&f->h.d, open_seq_elastic(&f->s[0], model, 0, 80, 0), EINVAL, 0,
                 "OpenSeq with min_budget 80 (not a multiple of the window)");
    expect_error(&f->h.d, open_seq_elastic(&f->s[0], model, 0, 32, 0), EINVAL, 0,
                 "OpenSeq with min_budget 32 (the window)");
    expect_error(&f->h.d, open_seq_elastic(&f->s[0], model, 0, 160, 0), EINVAL, 0,
                 "OpenSeq with min_budget 160 (above the budget)");
    expect_error(&f->h.d, open_seq_elastic(&f->s[0], model, 0, 64, 1001), EINVAL, 0,
                 "OpenSeq with weight 1001");
    /* The daemon names the rule the parameters break, as libvase does before it sends them. */
    expect_rule(&f->h.d, open_seq_params(&f->s[0], model, 100, 32),
                "bad open_seq: budget must be a multiple of window (budget 100, window 32; 96 or "
                "128 would be)");
    expect_rule(&f->h.d, open_seq_params(&f->s[0], model, 32, 32),
                "bad open_seq: budget must be larger than window (budget 32 <= window 32)");
    /* A protected prompt must leave room for the window, at every budget the sequence may have:
     * the daemon checks it whatever the client did. */
    static const struct {
        uint32_t prompt_len, min_budget;
        const char *rule;
    } prompt_rules[] = {
        {128, 0,
         "bad open_seq: protect_prompt needs prompt_len at most budget - window, so that the "
         "prompt and the window fit the budget (prompt_len 128, budget 128, window 32: at most "
         "96)"},
        {97, 0, "(prompt_len 97, budget 128, window 32: at most 96)"},
        {40, 64,
         "bad open_seq: at min_budget: protect_prompt needs prompt_len at most budget - window, "
         "so that the prompt and the window fit the budget (prompt_len 40, budget 64, window 32: "
         "at most 32)"},
    };
    for (size_t i = 0; i < sizeof(prompt_rules) / sizeof(prompt_rules[0]); i++)
        expect_rule(&f->h.d,
                    open_seq_protect(&f->s[0], model, prompt_rules[i].prompt_len,
                                     prompt_rules[i].min_budget),
                    prompt_rules[i].rule);

    reply = open_seq(&f->s[0], model);
    assert_int_equal(reply->body_case, VASE__ENVELOPE__BODY_SEQ_LAYOUT);
    const Vase__SeqLayout *sl = reply->seq_layout;
    uint32_t seq = sl->seq_id;
    assert_int_equal(sl->capacity, 192);
    assert_int_equal(sl->n_pages, 3);
    assert_int_equal(sl->n_ring_pages, 0);
    assert_int_equal(sl->n_plan_pages, 1);
    assert_int_equal(sl->keep, 96);
    assert_int_equal(sl->window, 32);
    assert_int_equal(sl->budget, 128);
    assert_int_equal(sl->min_budget, 128); /* not elastic */
    assert_int_equal(sl->weight, 1);
    assert_int_equal(sl->slack, 32);
    /* One plan page of every keep list: 4 lists of 96 slots in 4096 bytes. */
    assert_int_equal(sl->plans_per_page, 4);
    assert_int_equal(sl->plan_page_bytes, 4096);
    for (size_t i = 0; i < sl->n_pages; i++)
        assert_true(sl->pages[i] < HARNESS_ARENA_PAGES);
    vase__envelope__free_unpacked(reply, NULL);
    assert_int_equal(harness_status(&f->h.d, &st), 0);
    assert_int_equal(st.bytes_pages, harness_seq_bytes(3, 0, 96));

    expect_error(&f->h.d, close_seq(&f->s[1], seq), ENOENT, 0, "CloseSeq of another's sequence");
    expect_error(&f->h.d, close_seq(&f->s[0], seq + 1000), ENOENT, 0, "CloseSeq of no sequence");
    expect_error(&f->h.d, evict_request(&f->s[1], seq, 160), ENOENT, 0,
                 "EvictRequest of another's");
    expect_error(&f->h.d, set_budget(&f->s[1], seq, 128), ENOENT, 0, "SetBudget of another's");
    expect_error(&f->h.d, set_budget(&f->s[0], seq + 1000, 128), ENOENT, 0,
                 "SetBudget of no sequence");
    expect_error(&f->h.d, set_budget(&f->s[0], seq, 96), EINVAL, 0, "SetBudget below min_budget");
    reply = set_budget(&f->s[0], seq, 128);
    assert_int_equal(reply->body_case, VASE__ENVELOPE__BODY_OK);
    vase__envelope__free_unpacked(reply, NULL);

    /* A replayed client_seq, then a stale incarnation, from the owner. */
    Vase__Ping ping = VASE__PING__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    e.body_case = VASE__ENVELOPE__BODY_CLOSE_SEQ;
    Vase__CloseSeq cs = VASE__CLOSE_SEQ__INIT;
    cs.seq_id = seq;
    e.close_seq = &cs;
    e.client_seq = 1;
    expect_error(&f->h.d, session_send(&f->s[0], &e), EPROTO, 0, "replayed client_seq");
    Vase__Envelope e2 = VASE__ENVELOPE__INIT;
    e2.body_case = VASE__ENVELOPE__BODY_CLOSE_SEQ;
    e2.close_seq = &cs;
    e2.incarnation = f->h.d.incarnation + 1;
    expect_error(&f->h.d, session_send(&f->s[0], &e2), VASE_ESTALE, 0, "stale incarnation");
    /* The session's Ping carries the session's own sequence and works. */
    reply = session_call(&f->s[0], VASE__ENVELOPE__BODY_PING, &ping);
    assert_int_equal(reply->body_case, VASE__ENVELOPE__BODY_PONG);
    vase__envelope__free_unpacked(reply, NULL);

    /* Requests that do not fit the sequence (PROTOCOL.md, "Decisions the daemon made"). */
    expect_error(&f->h.d, evict_commit(&f->s[0], seq, 0, 128), EINVAL, 0, "commit, no plan");
    expect_error(&f->h.d, evict_request(&f->s[0], seq, 150), EINVAL, 0, "len % window");
    expect_error(&f->h.d, evict_request(&f->s[0], seq, 128), EINVAL, 0, "len == budget");
    expect_error(&f->h.d, evict_request(&f->s[0], seq, 224), EINVAL, 0, "len > capacity");
    float values[2 * 8] = {0};
    expect_error(&f->h.d, attn_stats(&f->s[0], seq, 2, 8, values, 16), EINVAL, 0,
                 "stats of layer 2 of 2");
    expect_error(&f->h.d, attn_stats(&f->s[0], seq, 0, 8, values, 15), EINVAL, 0,
                 "stats with kv_heads * len - 1 values");
    expect_error(&f->h.d, attn_stats(&f->s[0], seq, 0, 0, values, 0), EINVAL, 0, "stats of len 0");
    /* Attention a slot received, and window scores, are means of probabilities: never below 0
     * (a negative one would lower an accumulator every later plan reads, or weigh a sample). */
    values[5] = -0.25f;
    expect_error(&f->h.d, attn_stats(&f->s[0], seq, 0, 8, values, 16), EINVAL, 0,
                 "stats with a negative value");
    expect_error(
        &f->h.d,
        attn_stats_kind(&f->s[0], seq, 0, VASE__STATS_KIND__STATS_WINDOW_SCORES, 8, values, 16),
        EINVAL, 0, "window scores with a negative value");
    values[5] = NAN;
    expect_error(&f->h.d, attn_stats(&f->s[0], seq, 0, 8, values, 16), EINVAL, 0,
                 "stats with a NaN");
    expect_error(&f->h.d, attn_stats(&f->s[1], seq, 0, 8, values, 16), ENOENT, 0,
                 "stats on another's sequence");

    /* One eviction by hand: 160 slots, 128 candidates, keep 96. */
    reply = evict_request(&f->s[0], seq, 160);
    if (reply->body_case != VASE__ENVELOPE__BODY_EVICT_PLAN)
        fail_msg("EvictRequest answered by %s", vase_wire_body_name(reply));
    assert_int_equal(reply->evict_plan->seq_id, seq);
    assert_int_equal(reply->evict_plan->round, 0);
    assert_int_equal(reply->evict_plan->n, 128);
    assert_int_equal(reply->evict_plan->len, 160);
    assert_int_equal(reply->evict_plan->keep, 96);
    vase__envelope__free_unpacked(reply, NULL);
    expect_error(&f->h.d, evict_request(&f->s[0], seq, 160), EBUSY, 0, "second EvictRequest");

    expect_error(&f->h.d, evict_commit(&f->s[0], seq, 1, 128), EINVAL, 0, "commit, round 1");
    expect_error(&f->h.d, evict_commit(&f->s[0], seq, 0, 127), EINVAL, 0, "commit below budget");
    expect_error(&f->h.d, evict_commit(&f->s[1], seq, 0, 128), ENOENT, 0, "commit by another");
    reply = evict_commit(&f->s[0], seq, 0, 128);
    assert_int_equal(reply->body_case, VASE__ENVELOPE__BODY_COMMIT_REPLY);
    assert_int_equal(reply->commit_reply->seq_id, seq);
    assert_int_equal(reply->commit_reply->capacity, 192);
    assert_int_equal(reply->commit_reply->n_pages, 3);
    vase__envelope__free_unpacked(reply, NULL);
    assert_int_equal(harness_get_seq(&f->h.d, seq, &reply), 0);
    assert_int_equal(reply->seq_info->rounds, 1);
    assert_int_equal(reply->seq_info->len, 128);
    assert_string_equal(reply->seq_info->state, "idle");
    vase__envelope__free_unpacked(reply, NULL);

    /* Closing the session socket ends the client and returns its pages. */
    harness_session_close(&f->s[0]);
    assert_int_equal(harness_wait_bytes_pages(&f->h.d, 0, HARNESS_WAIT_MS, NULL), 0);
    assert_int_equal(harness_wait_clients(&f->h.d, 1, HARNESS_WAIT_MS), 0);
    harness_session_close(&f->s[1]);
    assert_int_equal(harness_wait_clients(&f->h.d, 0, HARNESS_WAIT_MS), 0);
    assert_int_equal(harness_get_seq(&f->h.d, seq, &reply), -ENOENT);
    vase__envelope__free_unpacked(reply, NULL);
}

/* The engine's counters of seq as SeqInfo shows them, asserted equal to want. */
static void expect_seq_report(const struct harness_daemon *d, uint32_t seq,
                              struct engine_report want) {
    Vase__Envelope *reply;
    assert_int_equal(harness_get_seq(d, seq, &reply), 0);
    assert_int_equal(reply->seq_info->stalls, want.stalls);
    assert_true(reply->seq_info->stall_seconds == want.stall_seconds);
    assert_true(reply->seq_info->compact_seconds == want.compact_seconds);
    vase__envelope__free_unpacked(reply, NULL);
}

/* The streaming totals of the engine's counters and the ignored reports, as scraped. */
static void expect_metric_report(const struct harness_daemon *d, struct engine_report want,
                                 double ignored) {
    char *resp;
    const char *text;
    assert_int_equal(harness_scrape(d, &resp, &text), 0);
    assert_true(harness_metric(text, "vase_engine_stalls_total{policy=\"streaming\"}") ==
                (double)want.stalls);
    assert_true(harness_metric(text, "vase_engine_stall_seconds_total{policy=\"streaming\"}") ==
                want.stall_seconds);
    assert_true(harness_metric(text, "vase_engine_compact_seconds_total{policy=\"streaming\"}") ==
                want.compact_seconds);
    assert_true(harness_metric(text, "vase_engine_reports_ignored_total") == ignored);
    free(resp);
}

/*
 * The engine's counters that a commit carries are untrusted: a NaN, a negative value or one
 * below the last accepted is ignored (SeqInfo and the metrics keep their values) while the
 * commit itself succeeds; good reports add their increase to the totals.
 */
static void test_engine_reports(void **state) {
    struct fixture *f = *state;
    assert_int_equal(harness_session_open(&f->h.d, &f->s[0]), 0);
    Vase__Envelope *reply = register_model(&f->s[0], 2, 4, 2, 32, 64, NULL);
    assert_int_equal(reply->body_case, VASE__ENVELOPE__BODY_MODEL_LAYOUT);
    uint32_t model = reply->model_layout->model_id;
    vase__envelope__free_unpacked(reply, NULL);
    reply = open_seq(&f->s[0], model);
    assert_int_equal(reply->body_case, VASE__ENVELOPE__BODY_SEQ_LAYOUT);
    uint32_t seq = reply->seq_layout->seq_id;
    vase__envelope__free_unpacked(reply, NULL);

    const struct engine_report good1 = {2, 0.5, 0.25}, good2 = {5, 1.5, 0.375};
    /* Jumps no client's time connected allows: not counted, but the next reports count from
     * them (a reopened sequence carries its engine's earlier totals). */
    const uint64_t big = UINT64_C(1) << 33;
    const struct engine_report jump1 = {5 + big, 1.5, 0.375}, jump2 = {5 + big + 1, 1e308, 0.375},
                               after = {5 + big + 3, 1e308, 0.5}, total = {7, 1.5, 0.5};
    const struct engine_report reports[] = {
        good1,
        {3, NAN, 0.5},       /* not finite */
        {3, 0.75, INFINITY}, /* not finite */
        {3, 0.75, -1.0},     /* negative */
        {1, 0.75, 0.5},      /* stalls going backwards */
        {3, 0.25, 0.5},      /* stall_seconds going backwards */
        good2,
        jump1, /* stalls up by 2^33 */
        jump2, /* stall_seconds up by 1e308 */
        after, /* counted from jump2: 2 stalls, 0.125 s compacting */
    };
    const struct engine_report expect[] = {good1, good1, good1, good1, good1,
                                           good1, good2, jump1, jump2, after};
    const struct engine_report totals[] = {good1, good1, good1, good1, good1,
                                           good1, good2, good2, good2, total};
    const double ignored[] = {0, 1, 2, 3, 4, 5, 5, 6, 7, 7};
    for (uint32_t round = 0; round < sizeof(reports) / sizeof(reports[0]); round++) {
        /* One eviction by hand: 160 slots, 128 candidates, keep 96, back to 128. */
        reply = evict_request(&f->s[0], seq, 160);
        assert_int_equal(reply->body_case, VASE__ENVELOPE__BODY_EVICT_PLAN);
        vase__envelope__free_unpacked(reply, NULL);
        reply = evict_commit_report(&f->s[0], seq, round, 128, reports[round]);
        if (reply->body_case != VASE__ENVELOPE__BODY_COMMIT_REPLY)
            fail_msg("commit of round %u answered by %s", round, vase_wire_body_name(reply));
        vase__envelope__free_unpacked(reply, NULL);
        expect_seq_report(&f->h.d, seq, expect[round]);
        expect_metric_report(&f->h.d, totals[round], ignored[round]);
    }
    struct harness_status st = harness_status_of(&f->h.d);
    assert_int_equal(st.evictions_total, 10);
    assert_int_equal(st.errors_total, 0);
}

/*
 * OpenSeq.label from a raw session, past libvase's own check: the daemon refuses a label that is
 * too long or holds a byte outside the set (a newline, a quote, an escape sequence, UTF-8) with
 * EINVAL, naming the byte by offset and value; its log has the reason but never the bytes. A
 * label it takes is the sequence's in SeqInfo, GetSeq and ListSeqs alike; none is "".
 */
static void test_open_label(void **state) {
    struct fixture *f = *state;
    const struct harness_daemon *d = &f->h.d;
    assert_int_equal(harness_session_open(d, &f->s[0]), 0);
    Vase__Envelope *reply = register_model(&f->s[0], 2, 4, 2, 32, 64, NULL);
    assert_int_equal(reply->body_case, VASE__ENVELOPE__BODY_MODEL_LAYOUT);
    uint32_t model = reply->model_layout->model_id;
    vase__envelope__free_unpacked(reply, NULL);

    char long_label[VASE_WIRE_LABEL_MAX + 2];
    memset(long_label, 'x', VASE_WIRE_LABEL_MAX + 1);
    long_label[VASE_WIRE_LABEL_MAX + 1] = '\0';
    const struct {
        const char *label, *rule;
    } bad[] = {
        {"req\n1", "bad open_seq: label byte 3 is 0x0a (want at most 64 bytes of A-Z a-z 0-9 "
                   "._:/@+=-)"},
        {"req\"1", "bad open_seq: label byte 3 is 0x22"},
        {"caf\xc3\xa9-7", "bad open_seq: label byte 3 is 0xc3"},
        {"x\x1b[2Jy", "bad open_seq: label byte 1 is 0x1b"},
        {"a b", "bad open_seq: label byte 1 is 0x20"},
        {long_label, "bad open_seq: label is longer than 64 bytes"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        expect_rule(d, open_seq_label(&f->s[0], model, bad[i].label), bad[i].rule);
    struct harness_status st;
    assert_int_equal(harness_status(d, &st), 0);
    assert_int_equal(st.seqs, 0);
    assert_int_equal(st.bytes_pages, 0);

    /* Taken: 64 bytes of every kind the rule allows; none. */
    char label[VASE_WIRE_LABEL_MAX + 1];
    memset(label, '7', VASE_WIRE_LABEL_MAX);
    memcpy(label, "cmpl-8f2c.d_0:a/b@c+d=e", 23);
    label[VASE_WIRE_LABEL_MAX] = '\0';
    uint32_t seq[2];
    for (int i = 0; i < 2; i++) {
        reply = open_seq_label(&f->s[0], model, i == 0 ? label : NULL);
        assert_int_equal(reply->body_case, VASE__ENVELOPE__BODY_SEQ_LAYOUT);
        seq[i] = reply->seq_layout->seq_id;
        vase__envelope__free_unpacked(reply, NULL);
    }
    assert_int_equal(harness_get_seq(d, seq[0], &reply), 0);
    assert_string_equal(reply->seq_info->label, label);
    vase__envelope__free_unpacked(reply, NULL);
    assert_int_equal(harness_get_seq(d, seq[1], &reply), 0);
    assert_string_equal(reply->seq_info->label, "");
    vase__envelope__free_unpacked(reply, NULL);
    Vase__ListSeqs ls = VASE__LIST_SEQS__INIT;
    assert_int_equal(harness_call(d, VASE__ENVELOPE__BODY_LIST_SEQS, &ls, &reply), 0);
    assert_int_equal(reply->seqs_reply->n_seqs, 2);
    for (size_t i = 0; i < 2; i++)
        assert_string_equal(reply->seqs_reply->seqs[i]->label,
                            reply->seqs_reply->seqs[i]->seq_id == seq[0] ? label : "");
    vase__envelope__free_unpacked(reply, NULL);

    /* The log: each refusal's reason, none of the refused bytes, the label it took. */
    FILE *log = fopen(d->log, "r");
    assert_non_null(log);
    static char text[1 << 18];
    size_t n = fread(text, 1, sizeof(text) - 1, log);
    fclose(log);
    text[n] = '\0';
    if (!strstr(text, "bad open_seq: label byte 3 is 0x0a") ||
        !strstr(text, "bad open_seq: label byte 1 is 0x1b") || !strstr(text, label))
        fail_msg("the log lacks the refusals or the label taken:\n%s", text);
    if (strstr(text, "req\n1") || strstr(text, "req\\x0a1") || strstr(text, "\x1b") ||
        strstr(text, "[2J") || strstr(text, "caf") || strstr(text, long_label))
        fail_msg("the log holds a refused label:\n%s", text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_garbage, setup, teardown),
        cmocka_unit_test_setup_teardown(test_oversized, setup, teardown),
        cmocka_unit_test_setup_teardown(test_two_frames, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wrong_version, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_body, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stale_incarnation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_engine_request_without_session, setup, teardown),
        cmocka_unit_test_setup_teardown(test_admin_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_register_model_raw, setup, teardown),
        cmocka_unit_test_setup_teardown(test_session_rules, setup, teardown),
        cmocka_unit_test_setup_teardown(test_engine_reports, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_label, setup_debug, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
