/* SPDX-License-Identifier: MIT */

/*
 * vasectl top's pure parts on fixed samples: the rates between two samples, the models, the
 * sort keys and orders, the plain frame and the JSON line, and cutting lines to a terminal's
 * width. The live view itself is driven in a terminal by tests/test_top_tmux.sh.
 */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

/* vasectl's own files, compiled into the test: they are not part of libvase, which the client
 * tests link. */
#include "../tools/vasectl/vasectl_json.c"
#include "../tools/vasectl/vasectl_print.c"
#include "../tools/vasectl/vasectl_top.c"
#include "../tools/vasectl/vasectl_top_view.c"

/* Two samples two seconds apart: sequence 1 in both, 2 only in the second (just opened), 3
 * only in the first (closed). Sequences 1 and 2 share model "llama" (of two clients), 4 has
 * an unnamed model. */
struct fixture {
    Vase__ArenaStatus arena;
    Vase__ArenaStatus *arenas[1];
    Vase__StatusReply status[2];
    Vase__ClientInfo client[2];
    Vase__ClientInfo *clients[2];
    Vase__ClientsReply cr[2];
    Vase__SeqInfo before[2], after[3];
    Vase__SeqInfo *p_before[2], *p_after[3];
    Vase__SeqsReply sr[2];
    struct top_sample prev, cur;
};

static Vase__SeqInfo seq_info(uint32_t id, uint32_t client, const char *model, uint32_t rounds,
                              uint64_t stalls, uint64_t bytes, double plan) {
    Vase__SeqInfo s = VASE__SEQ_INFO__INIT;
    s.seq_id = id;
    s.client_id = client;
    s.model_id = id == 4 ? 9 : 1;
    s.model_name = (char *)model;
    s.policy = (char *)"vase-attnv";
    s.budget = 512;
    s.len = 500 + id;
    s.capacity = 640;
    s.rounds = rounds;
    s.stalls = stalls;
    s.bytes = bytes;
    s.last_plan_seconds = plan;
    s.state = (char *)"idle";
    return s;
}

static void fixture_init(struct fixture *f) {
    *f = (struct fixture){0};
    f->arena = (Vase__ArenaStatus)VASE__ARENA_STATUS__INIT;
    f->arena.name = (char *)"default";
    f->arena.kind = (char *)"host";
    f->arena.bytes_total = 1ULL << 30;
    f->arena.bytes_free = 3ULL << 28; /* a quarter used */
    f->arena.bytes_pages = 1ULL << 28;
    f->arenas[0] = &f->arena;
    for (int k = 0; k < 2; k++) {
        f->status[k] = (Vase__StatusReply)VASE__STATUS_REPLY__INIT;
        f->status[k].version = (char *)"0.1.0";
        f->status[k].incarnation = 0x1234;
        f->status[k].uptime_seconds = 60 + 2 * k;
        f->status[k].n_arenas = 1;
        f->status[k].arenas = f->arenas;
        f->status[k].clients = 2;
        f->status[k].seqs = 2 + k;
        f->status[k].evictions_total = k ? 140 : 100;
        f->cr[k] = (Vase__ClientsReply)VASE__CLIENTS_REPLY__INIT;
        f->cr[k].n_clients = 2;
        f->cr[k].clients = f->clients;
        f->sr[k] = (Vase__SeqsReply)VASE__SEQS_REPLY__INIT;
    }
    for (int k = 0; k < 2; k++) {
        f->client[k] = (Vase__ClientInfo)VASE__CLIENT_INFO__INIT;
        f->client[k].client_id = k + 1;
        f->client[k].pid = 100 + k;
        f->client[k].uid = 1000;
        f->client[k].seqs = 2 - k;
        f->client[k].bytes = (2 - k) << 20;
        f->clients[k] = &f->client[k];
    }
    /* A client chose its name: the escape sequence must not reach the terminal. */
    f->client[0].name = (char *)"eng\x1b[2Jine";
    f->client[1].name = (char *)"b";

    f->before[0] = seq_info(1, 1, "llama", 10, 0, 1 << 20, 0.002);
    f->before[1] = seq_info(3, 2, "llama", 50, 0, 1 << 20, 0.001);
    f->after[0] = seq_info(1, 1, "llama", 30, 4, 1 << 20, 0.0125);
    f->after[1] = seq_info(2, 2, "llama", 5, 0, 1 << 20, 0.003);
    f->after[2] = seq_info(4, 1, "", 7, 0, 3 << 20, 0.0005);
    for (int k = 0; k < 2; k++)
        f->p_before[k] = &f->before[k];
    for (int k = 0; k < 3; k++)
        f->p_after[k] = &f->after[k];
    f->sr[0].n_seqs = 2;
    f->sr[0].seqs = f->p_before;
    f->sr[1].n_seqs = 3;
    f->sr[1].seqs = f->p_after;
    f->prev = (struct top_sample){.when = 10, &f->status[0], &f->cr[0], &f->sr[0]};
    f->cur = (struct top_sample){.when = 12, &f->status[1], &f->cr[1], &f->sr[1]};
}

static const struct top_seq *find(const struct top_view *v, uint32_t id) {
    for (size_t k = 0; k < v->n_seqs; k++)
        if (v->seqs[k].info->seq_id == id)
            return &v->seqs[k];
    fail_msg("sequence %u not in the view", id);
    return NULL;
}

static void test_rates(void **state) {
    (void)state;
    struct fixture f;
    struct top_view v = {0};

    fixture_init(&f);
    assert_int_equal(vasectl_top_view_build(&v, &f.prev, &f.cur), 0);
    /* (140 - 100) / 2 s; rounds (30 - 10) / 2 s; stalls (4 - 0) / 2 s. */
    assert_true(v.evictions == 20.0);
    assert_int_equal(v.n_seqs, 3);
    assert_true(find(&v, 1)->evictions == 10.0);
    assert_true(find(&v, 1)->stalls == 2.0);
    /* Opened since the first sample: no rate yet, not one counted from zero. */
    assert_true(find(&v, 2)->evictions < 0);
    assert_true(find(&v, 2)->stalls < 0);
    assert_true(find(&v, 4)->evictions < 0);

    /* The models by memory: the unnamed one (3 MiB) first, then "llama" with two sequences,
     * of which one has a rate. */
    assert_int_equal(v.n_models, 2);
    assert_string_equal(v.models[0].name, "");
    assert_int_equal(v.models[0].model_id, 9);
    assert_true(v.models[0].evictions < 0);
    assert_string_equal(v.models[1].name, "llama");
    assert_int_equal(v.models[1].seqs, 2);
    assert_int_equal(v.models[1].bytes, 2 << 20);
    assert_true(v.models[1].evictions == 10.0);

    /* The first sample has no rates at all. */
    assert_int_equal(vasectl_top_view_build(&v, NULL, &f.cur), 0);
    assert_true(v.evictions < 0);
    assert_true(find(&v, 1)->evictions < 0);
    vasectl_top_view_clear(&v);
}

/* Another daemon (a restart) between the samples, or a counter that went back: no rates. */
static void test_rates_restart(void **state) {
    (void)state;
    struct fixture f;
    struct top_view v = {0};

    fixture_init(&f);
    f.status[1].incarnation = 0x5678;
    assert_int_equal(vasectl_top_view_build(&v, &f.prev, &f.cur), 0);
    assert_true(v.evictions < 0);
    assert_true(find(&v, 1)->evictions < 0);

    fixture_init(&f);
    f.after[0].rounds = 9;
    assert_int_equal(vasectl_top_view_build(&v, &f.prev, &f.cur), 0);
    assert_true(find(&v, 1)->evictions < 0);
    assert_true(find(&v, 1)->stalls == 2.0);
    vasectl_top_view_clear(&v);

    assert_true(top_rate(10, 10, 1) == 0);
    assert_true(top_rate(15, 10, 0.5) == 10);
    assert_true(top_rate(10, 11, 1) < 0);
    assert_true(top_rate(11, 10, 0) < 0);
}

static void expect_order(const struct top_view *v, uint32_t a, uint32_t b, uint32_t c) {
    assert_int_equal(v->seqs[0].info->seq_id, a);
    assert_int_equal(v->seqs[1].info->seq_id, b);
    assert_int_equal(v->seqs[2].info->seq_id, c);
}

static void test_sort(void **state) {
    (void)state;
    struct fixture f;
    struct top_view v = {0};
    struct top_ui ui = {.sort = COL_EVICT};

    fixture_init(&f);
    assert_int_equal(vasectl_top_view_build(&v, &f.prev, &f.cur), 0);
    /* Evictions per second, largest first; the two without a rate by id. */
    vasectl_top_sort(&v, &ui);
    expect_order(&v, 1, 2, 4);
    assert_true(top_descending(&ui));
    assert_true(vasectl_top_key(&ui, 'r'));
    assert_false(top_descending(&ui));
    vasectl_top_sort(&v, &ui);
    expect_order(&v, 2, 4, 1);

    /* A column's letter sorts by it in its own first direction. */
    assert_true(vasectl_top_key(&ui, 'p'));
    assert_int_equal(ui.sort, COL_PLAN);
    assert_false(ui.reverse);
    vasectl_top_sort(&v, &ui);
    expect_order(&v, 1, 2, 4);
    assert_true(vasectl_top_key(&ui, 'm'));
    vasectl_top_sort(&v, &ui);
    expect_order(&v, 4, 1, 2);
    assert_true(vasectl_top_key(&ui, 'i'));
    assert_false(top_descending(&ui));
    vasectl_top_sort(&v, &ui);
    expect_order(&v, 1, 2, 4);
    assert_true(vasectl_top_key(&ui, 'c'));
    vasectl_top_sort(&v, &ui);
    expect_order(&v, 1, 4, 2);

    /* s and S walk the columns and wrap around; other keys change nothing. */
    ui = (struct top_ui){.sort = COL_STATE, .reverse = true};
    assert_true(vasectl_top_key(&ui, 's'));
    assert_int_equal(ui.sort, COL_ID);
    assert_false(ui.reverse);
    assert_true(vasectl_top_key(&ui, 'S'));
    assert_int_equal(ui.sort, COL_STATE);
    assert_true(vasectl_top_key(&ui, 'S'));
    assert_int_equal(ui.sort, COL_STALLS);
    assert_false(vasectl_top_key(&ui, 'x'));
    assert_false(vasectl_top_key(&ui, 0));
    assert_int_equal(ui.sort, COL_STALLS);
    /* By model name: "" (the unnamed) before "llama", the two llamas by id. */
    ui = (struct top_ui){.sort = COL_MODEL};
    vasectl_top_sort(&v, &ui);
    expect_order(&v, 4, 1, 2);
    vasectl_top_view_clear(&v);
}

/* Renders v with ui into a string (the caller frees it). */
static char *render(const struct top_view *v, const struct top_ui *ui) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    assert_int_equal(vasectl_top_render(f, v, ui), 0);
    assert_int_equal(fclose(f), 0);
    return text;
}

static void test_render_plain(void **state) {
    (void)state;
    struct fixture f;
    struct top_view v = {0};
    struct top_ui ui = {.sort = COL_EVICT, .interval = 2};

    fixture_init(&f);
    assert_int_equal(vasectl_top_view_build(&v, &f.prev, &f.cur), 0);
    vasectl_top_sort(&v, &ui);
    char *text = render(&v, &ui);
    const char *want =
        "vased 0.1.0, up 1m 02s, clients 2, seqs 3, opens waiting 0, evictions 140 (20.0/s)\n"
        "sorted by EVICT/S, descending; every 2s\n"
        "\n"
        "ARENA  NAME     KIND     SIZE       FREE   IN PAGES  USED\n"
        "    0  default  host  1.0 GiB  768.0 MiB  256.0 MiB  [###.......]  25.0%\n"
        "\n"
        "CLIENT  NAME           STATE      PID   UID  SEQS   MEMORY\n"
        "     1  eng\\x1b[2Jine  connected  100  1000     2  2.0 MiB\n"
        "     2  b              connected  101  1000     1  1.0 MiB\n"
        "\n"
        "MODEL  SEQS   MEMORY  EVICT/S\n"
        "#9        1  3.0 MiB        -\n"
        "llama     2  2.0 MiB     10.0\n"
        "\n"
        "ID  CLIENT  MODEL  POLICY      BUDGET  LEN/CAP   MEMORY  EVICT/S      PLAN  STALLS/S  "
        "STATE\n"
        " 1       1  llama  vase-attnv     512  501/640  1.0 MiB     10.0   12.5 ms       2.0  "
        "idle\n"
        " 2       2  llama  vase-attnv     512  502/640  1.0 MiB        -   3.00 ms         -  "
        "idle\n"
        " 4       1  #9     vase-attnv     512  504/640  3.0 MiB        -  0.500 ms         -  "
        "idle\n";
    assert_string_equal(text, want);
    free(text);

    /* The live view's frame: its keys, the error of the last sample, and client and model
     * tables cut to max_rows with the rest counted. No escape sequence of any kind. */
    ui.keys = true;
    ui.max_rows = 1;
    /* The daemon's words come escaped: no escape sequence of theirs reaches the terminal. */
    ui.error = "cannot reach vased at /run/vase/control.sock: \x1b[2JNo such file or directory";
    text = render(&v, &ui);
    assert_non_null(strstr(text, "every 2s; keys: s/S column, r reverse"));
    assert_non_null(strstr(text, "\nerror: cannot reach vased at /run/vase/control.sock: "
                                 "\\x1b[2JNo such file or directory\n\n"));
    assert_non_null(strstr(text, "  1000     2  2.0 MiB\n(1 more)\n\n"));
    assert_non_null(strstr(text, "#9        1  3.0 MiB        -\n(1 more)\n\n"));
    assert_null(strchr(text, '\x1b'));
    free(text);

    /* Before the first sample came: the header and the error only. */
    struct top_sample none = {0};
    vasectl_top_view_clear(&v);
    v.cur = &none;
    ui.max_rows = 0;
    text = render(&v, &ui);
    assert_string_equal(
        text,
        "sorted by EVICT/S, descending; every 2s; keys: s/S column, r reverse, e p t m b l i "
        "c sort by, q quit\nerror: cannot reach vased at /run/vase/control.sock: \\x1b[2JNo such "
        "file or directory\n\n");
    free(text);
}

static void test_json(void **state) {
    (void)state;
    struct fixture f;
    struct top_view v = {0};
    struct top_ui ui = {.sort = COL_ID};
    char *text = NULL;
    size_t len = 0;

    fixture_init(&f);
    assert_int_equal(vasectl_top_view_build(&v, &f.prev, &f.cur), 0);
    vasectl_top_sort(&v, &ui);
    FILE *out = open_memstream(&text, &len);
    assert_non_null(out);
    vasectl_top_json(out, &v);
    assert_int_equal(fclose(out), 0);
    /* One line, the daemon's own fields and the rates (null where not known). */
    assert_ptr_equal(strchr(text, '\n'), text + len - 1);
    assert_non_null(strstr(text, "{\"status\":{\"incarnation\":\"0x0000000000001234\""));
    assert_non_null(strstr(text, "},\"evictions_per_second\":20,\"clients\":[{\"client_id\":1,"));
    assert_non_null(strstr(text, "\"name\":\"eng\\u001b[2Jine\""));
    assert_non_null(strstr(text, "\"models\":[{\"model_name\":\"\",\"model_id\":9,\"seqs\":1,"
                                 "\"bytes\":3145728,\"evictions_per_second\":null},"
                                 "{\"model_name\":\"llama\",\"model_id\":1,\"seqs\":2,"
                                 "\"bytes\":2097152,\"evictions_per_second\":10}]"));
    assert_non_null(strstr(text, "\"compact_seconds\":0,\"protect_prompt\":false,"
                                 "\"prompt_len\":0,\"label\":\"\",\"evictions_per_second\":10,"
                                 "\"stalls_per_second\":2},{\"seq_id\":2,"));
    assert_non_null(strstr(text, "\"evictions_per_second\":null,\"stalls_per_second\":null}]}\n"));
    free(text);
    vasectl_top_view_clear(&v);
}

/* Lines are cut to the terminal's columns, counting a UTF-8 character as one. */
static void test_cut(void **state) {
    (void)state;
    assert_int_equal(top_cut("abcdef", 6, 4), 4);
    assert_int_equal(top_cut("abcdef", 6, 10), 6);
    assert_int_equal(top_cut("abcdef", 6, 0), 0);
    /* "aéb": é is two bytes and one column. */
    assert_int_equal(top_cut("a\xc3\xa9"
                             "bc",
                             5, 3),
                     4);
    assert_int_equal(top_cut("a\xc3\xa9"
                             "bc",
                             5, 2),
                     3);
    assert_int_equal(top_cut("a\xc3\xa9"
                             "bc",
                             5, 1),
                     1);
}

static void test_fmt_rate(void **state) {
    (void)state;
    char b[32];
    assert_string_equal(fmt_rate(-1, b, sizeof(b)), "-");
    assert_string_equal(fmt_rate(0, b, sizeof(b)), "0.0");
    assert_string_equal(fmt_rate(2.54, b, sizeof(b)), "2.5");
    assert_string_equal(fmt_rate(99.94, b, sizeof(b)), "99.9");
    assert_string_equal(fmt_rate(99.96, b, sizeof(b)), "100");
    assert_string_equal(fmt_rate(12345.6, b, sizeof(b)), "12.3k");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rates),    cmocka_unit_test(test_rates_restart),
        cmocka_unit_test(test_sort),     cmocka_unit_test(test_render_plain),
        cmocka_unit_test(test_json),     cmocka_unit_test(test_cut),
        cmocka_unit_test(test_fmt_rate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
