/* SPDX-License-Identifier: MIT */

/*
 * The commands of vasectl that ask the daemon and show its answer: status, clients, seqs, seq
 * and config get. Each is one request through libvase's administrative API; the reply is printed
 * as tables and lines for people, or under --json as one JSON document (vasectl_json.c), and
 * freed here. Text a client chose (its name, a model's, a sequence's label) is escaped before it
 * reaches a terminal.
 */

#include <inttypes.h>
#include <stdio.h>

#include "vase.h"
#include "vase_admin.h"
#include "vasectl.h"

static int add_arena_row(struct table *t, const Vase__ArenaStatus *a) {
    char b1[32], b2[32], b3[32], b4[32];
    double used = a->bytes_total
                      ? 100.0 * (double)(a->bytes_total - a->bytes_free) / (double)a->bytes_total
                      : 0.0;
    int r;

    if ((r = vasectl_table_add(t, "%" PRIu32, a->id)) < 0 ||
        (r = vasectl_table_add(t, "%s", a->name)) < 0 ||
        (r = vasectl_table_add(t, "%s", a->kind)) < 0 ||
        (r = vasectl_table_add(t, "%s", vasectl_fmt_bytes(a->bytes_total, b1, sizeof(b1)))) < 0 ||
        (r = vasectl_table_add(t, "%s", vasectl_fmt_bytes(a->bytes_free, b2, sizeof(b2)))) < 0 ||
        (r = vasectl_table_add(t, "%s", vasectl_fmt_bytes(a->bytes_pages, b3, sizeof(b3)))) < 0 ||
        (r = vasectl_table_add(t, "%.1f%%", used)) < 0)
        return r;
    return vasectl_table_add(t, "%s", vasectl_fmt_bytes(a->granule_bytes, b4, sizeof(b4)));
}

int vasectl_show_status(struct vase_admin *a, bool json) {
    Vase__StatusReply *s;
    struct table t = {
        .ncols = 8,
        .headers = {">ARENA", "NAME", "KIND", ">SIZE", ">FREE", ">IN PAGES", ">USED", ">GRANULE"}};
    char b1[32], b2[32];
    int r;

    r = vase_admin_status(a, &s);
    if (r < 0)
        return vasectl_report(a, "status", r);
    if (json) {
        vasectl_json_line(&s->base);
        goto out;
    }
    printf("vased %s, incarnation %016" PRIx64 ", up %s\n", s->version, s->incarnation,
           vasectl_fmt_duration(s->uptime_seconds, b1, sizeof(b1)));
    printf("clients %" PRIu32 ", sequences %" PRIu32 ", evictions %s (%" PRIu32 " in flight)\n",
           s->clients, s->seqs, vasectl_fmt_count(s->evictions_total, b2, sizeof(b2)),
           s->evictions_in_flight);
    if (s->clients_draining)
        printf("draining %" PRIu32 " dead clients, holding %s until their processes are gone\n",
               s->clients_draining, vasectl_fmt_bytes(s->bytes_draining, b2, sizeof(b2)));
    if (s->opens_waiting)
        printf("opens waiting for room %" PRIu32 " (admitted in arrival order as memory frees)\n",
               s->opens_waiting);
    if (s->seqs_restored)
        printf("kept across the restart: %" PRIu32 " sequences (%s) waiting for their engines to "
               "reopen them (restore_grace)\n",
               s->seqs_restored, vasectl_fmt_bytes(s->bytes_restored, b2, sizeof(b2)));
    if (s->seqs_shrunk || s->bytes_reclaiming || s->budget_shrinks_total)
        printf("elastic budgets: %" PRIu32 " sequences below their budget, %s to be released at "
               "their next commit; %" PRIu64 " shrinks, %" PRIu64 " grows\n",
               s->seqs_shrunk, vasectl_fmt_bytes(s->bytes_reclaiming, b2, sizeof(b2)),
               s->budget_shrinks_total, s->budget_grows_total);
    printf("plans queued %" PRIu32 " (%" PRIu32 " clients waiting, served in turn), "
           "running %" PRIu32 "\n",
           s->plans_queued, s->clients_waiting, s->plans_running);
    if (s->metrics_address && *s->metrics_address)
        printf("metrics http://%s/metrics\n", s->metrics_address);
    if (s->metrics_unavailable && *s->metrics_unavailable) {
        char why[4 * 160 + 1];
        vase_admin_escape(s->metrics_unavailable, why, sizeof(why));
        printf("metrics NOT SERVED: %s\n", why);
    }
    char n1[32], n2[32], n3[32], n4[32];
    printf("requests %s, errors %s (engines) and %s (administrative), stats messages %s\n\n",
           vasectl_fmt_count(s->requests_total, n1, sizeof(n1)),
           vasectl_fmt_count(s->errors_total, n2, sizeof(n2)),
           vasectl_fmt_count(s->admin_errors_total, n3, sizeof(n3)),
           vasectl_fmt_count(s->stats_messages_total, n4, sizeof(n4)));
    for (size_t i = 0; i < s->n_arenas && r == 0; i++)
        r = add_arena_row(&t, s->arenas[i]);
    if (r == 0 && s->n_arenas)
        vasectl_table_print(&t);
    else if (r == 0)
        printf("no arena is open to this uid\n");
out:
    vasectl_table_free(&t);
    protobuf_c_message_free_unpacked(&s->base, NULL);
    if (r < 0)
        vasectl_fail(r, "status: %s", vase_strerror(r));
    return r;
}

static int add_client_row(struct table *t, const Vase__ClientInfo *c) {
    char b[32], b2[32], name[4 * 256 + 1];
    int r;

    /* A client chose its name: no terminal control sequences from it. */
    vase_admin_escape(c->name, name, sizeof(name));
    if ((r = vasectl_table_add(t, "%" PRIu32, c->client_id)) < 0 ||
        (r = vasectl_table_add(t, "%s", name)) < 0 ||
        (r = vasectl_table_add(t, "%s", c->state[0] ? c->state : "connected")) < 0 ||
        (r = vasectl_table_add(t, "%" PRIu32, c->pid)) < 0 ||
        (r = vasectl_table_add(t, "%" PRIu32, c->uid)) < 0 ||
        (r = vasectl_table_add(t, "%" PRIu32, c->gid)) < 0 ||
        (r = vasectl_table_add(t, "%s", vasectl_fmt_bytes(c->bytes, b2, sizeof(b2)))) < 0 ||
        (r = vasectl_table_add(t, "%" PRIu32, c->seqs)) < 0 ||
        (r = vasectl_table_add(t, "%" PRIu32, c->models)) < 0)
        return r;
    return vasectl_table_add(t, "%s", vasectl_fmt_duration(c->connected_seconds, b, sizeof(b)));
}

int vasectl_show_clients(struct vase_admin *a, bool json) {
    Vase__ClientsReply *cr;
    struct table t = {.ncols = 10,
                      .headers = {">ID", "NAME", "STATE", ">PID", ">UID", ">GID", ">MEMORY",
                                  ">SEQS", ">MODELS", "CONNECTED"}};
    int r;

    r = vase_admin_clients(a, &cr);
    if (r < 0)
        return vasectl_report(a, "clients", r);
    if (json) {
        vasectl_json_line(&cr->base);
        goto out;
    }
    for (size_t i = 0; i < cr->n_clients && r == 0; i++)
        r = add_client_row(&t, cr->clients[i]);
    if (r == 0) {
        if (cr->n_clients)
            vasectl_table_print(&t);
        else
            printf("no clients\n");
    }
out:
    vasectl_table_free(&t);
    protobuf_c_message_free_unpacked(&cr->base, NULL);
    if (r < 0)
        vasectl_fail(r, "clients: %s", vase_strerror(r));
    return r;
}

/* The budget now; an elastic sequence's with its range, "640 (320..704)", and an arrow to
 * the target it is heading for, "704 (320..704) -> 512". */
static int add_budget(struct table *t, const Vase__SeqInfo *s) {
    char range[48] = "", target[24] = "";
    if (s->min_budget && s->min_budget < s->max_budget)
        snprintf(range, sizeof(range), " (%" PRIu32 "..%" PRIu32 ")", s->min_budget, s->max_budget);
    if (s->target_budget && s->target_budget != s->budget)
        snprintf(target, sizeof(target), " -> %" PRIu32, s->target_budget);
    return vasectl_table_add(t, "%" PRIu32 "%s%s", s->budget, range, target);
}

/* A sequence's model for people: "NAME (ID)", or the id alone when it has no name (an orphan's
 * model is gone). A client chose the name: no terminal control sequences from it. */
static const char *model_label(const Vase__SeqInfo *s, char *buf, size_t size) {
    char name[4 * 256 + 1];
    if (!s->model_name || !*s->model_name)
        snprintf(buf, size, "%" PRIu32, s->model_id);
    else {
        vase_admin_escape(s->model_name, name, sizeof(name));
        snprintf(buf, size, "%s (%" PRIu32 ")", name, s->model_id);
    }
    return buf;
}

static int add_seq_row(struct table *t, const Vase__SeqInfo *s) {
    char b[32], n1[32], n2[32], model[4 * 256 + 32], label[4 * VASECTL_LABEL_WIDTH + 1];
    int r;

    if ((r = vasectl_table_add(t, "%" PRIu32, s->seq_id)) < 0 ||
        (r = vasectl_table_add(t, "%s", vasectl_fmt_label(s->label, label, sizeof(label)))) < 0 ||
        (r = vasectl_table_add(t, "%" PRIu32, s->client_id)) < 0 ||
        (r = vasectl_table_add(t, "%" PRIu32, s->arena_id)) < 0 ||
        (r = vasectl_table_add(t, "%s", model_label(s, model, sizeof(model)))) < 0 ||
        (r = vasectl_table_add(t, "%s", s->policy)) < 0 ||
        (r = vasectl_table_add(t, "%s", vasectl_mode_name(s->mode))) < 0 ||
        (r = add_budget(t, s)) < 0 || (r = vasectl_table_add(t, "%" PRIu32, s->window)) < 0 ||
        (r = vasectl_table_add(t, "%" PRIu32, s->len)) < 0 ||
        (r = vasectl_table_add(t, "%" PRIu32, s->capacity)) < 0 ||
        (r = vasectl_table_add(t, "%" PRIu32, s->pages)) < 0 ||
        (r = vasectl_table_add(t, "%s", vasectl_fmt_bytes(s->bytes, b, sizeof(b)))) < 0 ||
        (r = vasectl_table_add(t, "%s", vasectl_fmt_count(s->rounds, n1, sizeof(n1)))) < 0 ||
        (r = vasectl_table_add(t, "%s", vasectl_fmt_count(s->position, n2, sizeof(n2)))) < 0 ||
        (r = vasectl_table_add(t, "%s", s->state)) < 0)
        return r;
    return vasectl_table_add(t, "%s", vasectl_fmt_ms(s->last_plan_seconds, b, sizeof(b)));
}

int vasectl_show_seqs(struct vase_admin *a, uint32_t client_id, bool json) {
    Vase__SeqsReply *sr;
    struct table t = {.ncols = 17,
                      .headers = {">ID", "LABEL", ">CLIENT", ">ARENA", "MODEL", "POLICY", "MODE",
                                  ">BUDGET", ">WINDOW", ">LEN", ">CAPACITY", ">PAGES", ">MEMORY",
                                  ">ROUNDS", ">POSITION", "STATE", ">LAST PLAN"}};
    int r;

    r = vase_admin_seqs(a, client_id, &sr);
    if (r < 0)
        return vasectl_report(a, "seqs", r);
    if (json) {
        vasectl_json_line(&sr->base);
        goto out;
    }
    for (size_t i = 0; i < sr->n_seqs && r == 0; i++)
        r = add_seq_row(&t, sr->seqs[i]);
    if (r == 0) {
        if (sr->n_seqs)
            vasectl_table_print(&t);
        else
            printf("no sequences\n");
    }
out:
    vasectl_table_free(&t);
    protobuf_c_message_free_unpacked(&sr->base, NULL);
    if (r < 0)
        vasectl_fail(r, "seqs: %s", vase_strerror(r));
    return r;
}

int vasectl_show_seq(struct vase_admin *a, uint32_t id, bool json) {
    Vase__SeqInfo *s;
    char what[32];

    snprintf(what, sizeof(what), "seq %" PRIu32, id);
    int r = vase_admin_seq(a, id, &s);
    if (r < 0)
        return vasectl_report(a, what, r);
    if (json)
        vasectl_json_line(&s->base);
    else {
        printf("sequence    %" PRIu32 "\n", s->seq_id);
        /* The whole label: the table cuts a long one. */
        char label[4 * 64 + 1];
        vase_admin_escape(s->label && *s->label ? s->label : "(none)", label, sizeof(label));
        printf("label       %s\n", label);
        printf("client      %" PRIu32 "\n", s->client_id);
        char model[4 * 256 + 32];
        printf("model       %s\n", model_label(s, model, sizeof(model)));
        printf("policy      %s (%s)\n", s->policy, vasectl_mode_name(s->mode));
        printf("budget      %" PRIu32 ", window %" PRIu32 "\n", s->budget, s->window);
        printf("prompt      %" PRIu32 " tokens%s\n", s->prompt_len,
               s->protect_prompt ? ", protected (never evicted)" : "");
        if (s->min_budget && s->min_budget < s->max_budget)
            printf("elastic     %" PRIu32 " .. %" PRIu32 ", weight %" PRIu32 ", cap %" PRIu32
                   ", target %" PRIu32 ", changed %" PRIu32 " times\n",
                   s->min_budget, s->max_budget, s->weight, s->cap_budget, s->target_budget,
                   s->budget_changes);
        char b[32];
        printf("len         %" PRIu32 " of %" PRIu32 " slots (%" PRIu32 " pages of %" PRIu32
               " tokens)\n",
               s->len, s->capacity, s->pages, s->block_tokens);
        printf("memory      %s (KV, query ring and plan pages)\n",
               vasectl_fmt_bytes(s->bytes, b, sizeof(b)));
        printf("position    %" PRIu64 "\n", s->position);
        printf("rounds      %" PRIu32 ", last plan %.3f ms\n", s->rounds,
               s->last_plan_seconds * 1e3);
        printf("engine      %" PRIu64 " stalls (%.3f s waiting for plans), %.3f s compacting\n",
               s->stalls, s->stall_seconds, s->compact_seconds);
        printf("state       %s\n", s->state);
    }
    protobuf_c_message_free_unpacked(&s->base, NULL);
    return 0;
}

static int print_config(const Vase__ConfigReply *cr, bool single, bool json) {
    struct table t = {.ncols = 6,
                      .headers = {"KEY", "VALUE", "SOURCE", "DEFAULT", "RUNTIME", "DESCRIPTION"}};
    int r = 0;

    if (json) {
        vasectl_json_line(&cr->base);
        return 0;
    }
    /* One setting asked for by name: its bare value, for scripts. */
    if (single && cr->n_entries == 1) {
        printf("%s\n", cr->entries[0]->value);
        return 0;
    }
    for (size_t i = 0; i < cr->n_entries && r == 0; i++) {
        const Vase__ConfigEntry *c = cr->entries[i];
        if ((r = vasectl_table_add(&t, "%s", c->key)) < 0 ||
            (r = c->pending && c->pending[0]
                     ? vasectl_table_add(&t, "%s (restart pending: %s)", c->value, c->pending)
                     : vasectl_table_add(&t, "%s", c->value)) < 0 ||
            (r = vasectl_table_add(&t, "%s", c->source[0] ? c->source : "-")) < 0 ||
            (r = vasectl_table_add(&t, "%s", c->default_value)) < 0 ||
            (r = vasectl_table_add(&t, "%s", c->runtime ? "yes" : "no")) < 0 ||
            (r = vasectl_table_add(&t, "%s", c->description)) < 0)
            break;
    }
    if (r == 0)
        vasectl_table_print(&t);
    else
        vasectl_fail(r, "config: %s", vase_strerror(r));
    vasectl_table_free(&t);
    return r;
}

int vasectl_show_config(struct vase_admin *a, const char *key, bool json) {
    Vase__ConfigReply *cr;
    char what[300];

    snprintf(what, sizeof(what), "config get%s%.256s", key ? " " : "", key ? key : "");
    int r = vase_admin_config_get(a, key, &cr);
    if (r < 0)
        return vasectl_report(a, what, r);
    r = print_config(cr, key != NULL, json);
    protobuf_c_message_free_unpacked(&cr->base, NULL);
    return r;
}
