/* SPDX-License-Identifier: MIT */

/*
 * `vasectl size KEY=VALUE...`: what one sequence of a model costs in vased's arena and how many
 * fit one, without a daemon. The figures are vase_size_seq()'s, which lays the sequence out and
 * places it with the daemon's own code; this file only parses the words and prints them.
 */

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vase.h"
#include "vasectl.h"

/* A number of bytes with an optional binary suffix K, M, G or T, at most max. */
static int parse_size(const char *s, uint64_t max, uint64_t *ret) {
    char *end;
    if (*s < '0' || *s > '9')
        return -EINVAL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || errno == ERANGE)
        return -ERANGE;
    unsigned shift = 0;
    if (*end) {
        const char *units = "KMGT", *u = strchr(units, *end);
        if (!u || end[1])
            return -EINVAL;
        shift = 10 * (unsigned)(u - units + 1);
    }
    if (v > (max >> shift))
        return -ERANGE;
    *ret = (uint64_t)v << shift;
    return 0;
}

static int parse_u32(const char *s, uint32_t min, uint32_t max, uint32_t *ret) {
    uint64_t v;
    int r = parse_size(s, UINT32_MAX, &v);
    if (r < 0 || strpbrk(s, "KMGT"))
        return r < 0 ? r : -EINVAL;
    if (v < min || v > max)
        return -ERANGE;
    *ret = (uint32_t)v;
    return 0;
}

/* What the words give, with the defaults of the words left out. */
struct size_words {
    struct vase_geometry g;
    struct vase_seq_config cfg;
    uint32_t budget, window, n_sink, n_large, slack;
    uint64_t arena, granule;
    uint32_t seen; /* bit i: size_keys[i] was given */
};

enum size_kind { SIZE_U32, SIZE_BYTES, SIZE_DTYPE, SIZE_POLICY };

#define AT(f) offsetof(struct size_words, f)

/* The keys; the first four are required. */
static const struct size_key {
    const char *name;
    enum size_kind kind;
    size_t offset;
    uint64_t min, max;
} size_keys[] = {
    {"layers", SIZE_U32, AT(g.layers), 1, UINT32_MAX},
    {"q_heads", SIZE_U32, AT(g.q_heads), 1, UINT32_MAX},
    {"kv_heads", SIZE_U32, AT(g.kv_heads), 1, UINT32_MAX},
    {"head_dim", SIZE_U32, AT(g.head_dim), 1, UINT32_MAX},
    {"block_tokens", SIZE_U32, AT(g.block_tokens), 1, UINT32_MAX},
    {"dtype", SIZE_DTYPE, AT(g.dtype), 0, 0},
    {"policy", SIZE_POLICY, AT(cfg.policy), 0, 0},
    {"budget", SIZE_U32, AT(budget), 1, UINT32_MAX},
    {"window", SIZE_U32, AT(window), 1, UINT32_MAX},
    {"n_sink", SIZE_U32, AT(n_sink), 0, UINT32_MAX - 1},
    {"n_large", SIZE_U32, AT(n_large), 0, UINT32_MAX - 1},
    {"prompt_len", SIZE_U32, AT(cfg.prompt_len), 0, UINT32_MAX},
    {"slack", SIZE_U32, AT(slack), 0, INT32_MAX},
    {"arena_bytes", SIZE_BYTES, AT(arena), 0, UINT64_C(1) << 40},
    {"granule_bytes", SIZE_BYTES, AT(granule), 0, UINT64_C(1) << 30},
};
#define N_SIZE_KEYS (sizeof(size_keys) / sizeof(size_keys[0]))
#define SIZE_REQUIRED 0xfu
#define SEEN(w, name) ((w)->seen & (1u << key_index(name)))

static size_t key_index(const char *name) {
    size_t i = 0;
    while (i < N_SIZE_KEYS && strcmp(size_keys[i].name, name) != 0)
        i++;
    return i;
}

/* The value v of key k into w. 0, -EINVAL, -ERANGE. */
static int set_key(struct size_words *w, const struct size_key *k, const char *v) {
    void *at = (char *)w + k->offset;
    switch (k->kind) {
    case SIZE_U32:
        return parse_u32(v, (uint32_t)k->min, (uint32_t)k->max, at);
    case SIZE_BYTES:
        return parse_size(v, k->max, at);
    case SIZE_DTYPE:
        return vase_dtype_from_string(v, at);
    case SIZE_POLICY:
    default:
        return vase_policy_from_string(v, at);
    }
}

/* One KEY=VALUE word into w. 0, or -EINVAL with the reason in err. */
static int parse_word(struct size_words *w, const char *word, char *err, size_t err_size) {
    const char *eq = strchr(word, '=');
    if (!eq || eq == word) {
        snprintf(err, err_size, "size: '%s' is not KEY=VALUE (try 'vasectl --help')", word);
        return -EINVAL;
    }
    size_t klen = (size_t)(eq - word), i = 0;
    while (i < N_SIZE_KEYS &&
           !(strlen(size_keys[i].name) == klen && strncmp(word, size_keys[i].name, klen) == 0))
        i++;
    if (i == N_SIZE_KEYS) {
        snprintf(err, err_size,
                 "size: unknown key '%.*s' (layers, q_heads, kv_heads, head_dim, dtype, "
                 "block_tokens, policy, budget, window, n_sink, n_large, prompt_len, slack, "
                 "arena_bytes, granule_bytes)",
                 (int)klen, word);
        return -EINVAL;
    }
    if (set_key(w, &size_keys[i], eq + 1) < 0) {
        snprintf(err, err_size, "size: invalid %.*s '%s'", (int)klen, word, eq + 1);
        return -EINVAL;
    }
    w->seen |= 1u << i;
    return 0;
}

/* The sequence's configuration from the words: its budget's defaults, what the words change. */
static void size_config(struct size_words *w) {
    w->cfg.params = vase_params_default(w->budget);
    if (SEEN(w, "window"))
        w->cfg.params.window = w->window;
    if (SEEN(w, "n_sink"))
        w->cfg.params.n_sink = w->n_sink;
    if (SEEN(w, "n_large"))
        w->cfg.params.n_large = w->n_large;
    w->cfg.slack = SEEN(w, "slack") ? (int32_t)w->slack : -1;
}

static void print_json(const struct size_words *w, const struct vase_size *z, uint32_t B,
                       uint32_t slack) {
    const struct vase_geometry *g = &w->g;
    printf("{\"layers\":%" PRIu32 ",\"q_heads\":%" PRIu32 ",\"kv_heads\":%" PRIu32
           ",\"head_dim\":%" PRIu32 ",\"dtype\":\"%s\",\"block_tokens\":%" PRIu32
           ",\"policy\":\"%s\",\"budget\":%" PRIu32 ",\"window\":%" PRIu32
           ",\"prompt_len\":%" PRIu32 ",\"slack\":%" PRIu32 ",\"token_bytes\":%" PRIu64
           ",\"page_bytes\":%" PRIu64 ",\"slots\":%" PRIu32 ",\"kv_pages\":%" PRIu32
           ",\"ring_pages\":%" PRIu32 ",\"ring_page_bytes\":%" PRIu64
           ",\"plan_page_bytes\":%" PRIu64 ",\"seq_bytes\":%" PRIu64 ",\"arena_bytes\":%" PRIu64
           ",\"granule_bytes\":%" PRIu64 ",\"seqs\":%" PRIu64 "}\n",
           g->layers, g->q_heads, g->kv_heads, g->head_dim, vase_dtype_to_string(g->dtype), B,
           vase_policy_to_string(w->cfg.policy), w->cfg.params.budget, w->cfg.params.window,
           w->cfg.prompt_len, slack, z->token_bytes, z->page_bytes, z->slots, z->kv_pages,
           z->ring_pages, z->ring_page_bytes, z->plan_page_bytes, z->seq_bytes, w->arena,
           w->granule, z->seqs);
}

static void print_text(const struct size_words *w, const struct vase_size *z, uint32_t B,
                       uint32_t slack) {
    const struct vase_geometry *g = &w->g;
    const char *policy = vase_policy_to_string(w->cfg.policy);
    char b1[32], b2[32], b3[32];
    printf("model       %" PRIu32 " layers, %" PRIu32 " query and %" PRIu32 " KV heads of %" PRIu32
           ", %s, pages of %" PRIu32 " tokens\n",
           g->layers, g->q_heads, g->kv_heads, g->head_dim, vase_dtype_to_string(g->dtype), B);
    printf("per token   %" PRIu64 " bytes (K and V of every layer)\n", z->token_bytes);
    printf("sequence    %s, budget %" PRIu32 ", window %" PRIu32 ", prompt %" PRIu32
           ", slack %" PRIu32 ": %" PRIu32 " slots\n",
           policy, w->cfg.params.budget, w->cfg.params.window, w->cfg.prompt_len, slack, z->slots);
    printf("KV pages    %" PRIu32 " of %" PRIu64 " bytes (%s)\n", z->kv_pages, z->page_bytes,
           vasectl_fmt_bytes((uint64_t)z->kv_pages * z->page_bytes, b1, sizeof(b1)));
    if (z->ring_pages)
        printf("query ring  %" PRIu32 " pages of %" PRIu64 " bytes (%s)\n", z->ring_pages,
               z->ring_page_bytes,
               vasectl_fmt_bytes((uint64_t)z->ring_pages * z->ring_page_bytes, b1, sizeof(b1)));
    else
        printf("query ring  none (%s reads no queries)\n", policy);
    printf("plan page   %" PRIu64 " bytes\n", z->plan_page_bytes);
    printf("per seq     %" PRIu64 " bytes (%s)\n", z->seq_bytes,
           vasectl_fmt_bytes(z->seq_bytes, b1, sizeof(b1)));
    printf("arena       %s in granules of %s: %" PRIu64 " sequences\n",
           vasectl_fmt_bytes(w->arena, b2, sizeof(b2)),
           vasectl_fmt_bytes(w->granule, b3, sizeof(b3)), z->seqs);
}

int vasectl_size(char **words, int n, bool json, char *err, size_t err_size) {
    struct size_words w = {.g = {.dtype = VASE_DTYPE_BF16},
                           .cfg = {.policy = VASE_POLICY_VASE_ATTNV},
                           .budget = 1024,
                           .arena = 1ull << 30,
                           .granule = 2ull << 20};

    for (int i = 0; i < n; i++)
        if (parse_word(&w, words[i], err, err_size) < 0)
            return -EINVAL;
    if ((w.seen & SIZE_REQUIRED) != SIZE_REQUIRED) {
        snprintf(err, err_size, "size: layers, q_heads, kv_heads and head_dim are required");
        return -EINVAL;
    }
    size_config(&w);

    struct vase_size z;
    char why[256];
    int r = vase_size_seq(&w.g, &w.cfg, w.arena, w.granule, &z, why, sizeof(why));
    if (r < 0) {
        snprintf(err, err_size, "size: %s", r == -EINVAL ? why : vase_strerror(r));
        return r;
    }
    uint32_t slack = w.cfg.slack < 0 ? w.cfg.params.window : (uint32_t)w.cfg.slack;
    uint32_t B = w.g.block_tokens ? w.g.block_tokens : 16;
    if (json)
        print_json(&w, &z, B, slack);
    else
        print_text(&w, &z, B, slack);
    return 0;
}
