/* SPDX-License-Identifier: MIT */

/*
 * `vasectl size KEY=VALUE...`: what one sequence of a model costs in vased's arena and how many
 * fit one, without a daemon. The figures are vase_size_seq()'s, which lays the sequence out and
 * places it with the daemon's own code; this file only parses the words and prints them.
 */

#include <errno.h>
#include <inttypes.h>
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

int vasectl_size(char **words, int n, bool json, char *err, size_t err_size) {
    struct vase_geometry g = {.dtype = VASE_DTYPE_BF16};
    struct vase_seq_config cfg = {.policy = VASE_POLICY_VASE_ATTNV, .slack = -1};
    uint32_t budget = 1024, window = 0, n_sink = UINT32_MAX, n_large = UINT32_MAX;
    uint64_t arena = 1ull << 30, granule = 2ull << 20;
    bool seen_layers = false, seen_q = false, seen_kv = false, seen_dim = false;
    int32_t slack = -1;

    for (int i = 0; i < n; i++) {
        char *eq = strchr(words[i], '=');
        if (!eq || eq == words[i]) {
            snprintf(err, err_size, "size: '%s' is not KEY=VALUE (try 'vasectl --help')", words[i]);
            return -EINVAL;
        }
        size_t klen = (size_t)(eq - words[i]);
        const char *v = eq + 1;
        int r = 0;
#define KEY(k) (klen == strlen(k) && strncmp(words[i], k, klen) == 0)
        if (KEY("layers"))
            r = parse_u32(v, 1, UINT32_MAX, &g.layers), seen_layers = true;
        else if (KEY("q_heads"))
            r = parse_u32(v, 1, UINT32_MAX, &g.q_heads), seen_q = true;
        else if (KEY("kv_heads"))
            r = parse_u32(v, 1, UINT32_MAX, &g.kv_heads), seen_kv = true;
        else if (KEY("head_dim"))
            r = parse_u32(v, 1, UINT32_MAX, &g.head_dim), seen_dim = true;
        else if (KEY("block_tokens"))
            r = parse_u32(v, 1, UINT32_MAX, &g.block_tokens);
        else if (KEY("dtype"))
            r = vase_dtype_from_string(v, &g.dtype);
        else if (KEY("policy"))
            r = vase_policy_from_string(v, &cfg.policy);
        else if (KEY("budget"))
            r = parse_u32(v, 1, UINT32_MAX, &budget);
        else if (KEY("window"))
            r = parse_u32(v, 1, UINT32_MAX, &window);
        else if (KEY("n_sink"))
            r = parse_u32(v, 0, UINT32_MAX - 1, &n_sink);
        else if (KEY("n_large"))
            r = parse_u32(v, 0, UINT32_MAX - 1, &n_large);
        else if (KEY("prompt_len"))
            r = parse_u32(v, 0, UINT32_MAX, &cfg.prompt_len);
        else if (KEY("slack")) {
            uint32_t s = 0;
            r = parse_u32(v, 0, INT32_MAX, &s);
            slack = (int32_t)s;
        } else if (KEY("arena_bytes"))
            r = parse_size(v, UINT64_C(1) << 40, &arena);
        else if (KEY("granule_bytes"))
            r = parse_size(v, UINT64_C(1) << 30, &granule);
        else {
            snprintf(err, err_size,
                     "size: unknown key '%.*s' (layers, q_heads, kv_heads, head_dim, dtype, "
                     "block_tokens, policy, budget, window, n_sink, n_large, prompt_len, slack, "
                     "arena_bytes, granule_bytes)",
                     (int)klen, words[i]);
            return -EINVAL;
        }
#undef KEY
        if (r < 0) {
            snprintf(err, err_size, "size: invalid %.*s '%s'", (int)klen, words[i], v);
            return -EINVAL;
        }
    }
    if (!seen_layers || !seen_q || !seen_kv || !seen_dim) {
        snprintf(err, err_size, "size: layers, q_heads, kv_heads and head_dim are required");
        return -EINVAL;
    }
    cfg.params = vase_params_default(budget);
    if (window)
        cfg.params.window = window;
    if (n_sink != UINT32_MAX)
        cfg.params.n_sink = n_sink;
    if (n_large != UINT32_MAX)
        cfg.params.n_large = n_large;
    cfg.slack = slack;

    struct vase_size z;
    char why[256];
    int r = vase_size_seq(&g, &cfg, arena, granule, &z, why, sizeof(why));
    if (r < 0) {
        snprintf(err, err_size, "size: %s", r == -EINVAL ? why : vase_strerror(r));
        return r;
    }
    uint32_t W = cfg.params.window, slack_used = slack < 0 ? W : (uint32_t)slack;
    uint32_t B = g.block_tokens ? g.block_tokens : 16;
    if (json) {
        printf("{\"layers\":%" PRIu32 ",\"q_heads\":%" PRIu32 ",\"kv_heads\":%" PRIu32
               ",\"head_dim\":%" PRIu32 ",\"dtype\":\"%s\",\"block_tokens\":%" PRIu32
               ",\"policy\":\"%s\",\"budget\":%" PRIu32 ",\"window\":%" PRIu32
               ",\"prompt_len\":%" PRIu32 ",\"slack\":%" PRIu32 ",\"token_bytes\":%" PRIu64
               ",\"page_bytes\":%" PRIu64 ",\"slots\":%" PRIu32 ",\"kv_pages\":%" PRIu32
               ",\"ring_pages\":%" PRIu32 ",\"ring_page_bytes\":%" PRIu64
               ",\"plan_page_bytes\":%" PRIu64 ",\"seq_bytes\":%" PRIu64 ",\"arena_bytes\":%" PRIu64
               ",\"granule_bytes\":%" PRIu64 ",\"seqs\":%" PRIu64 "}\n",
               g.layers, g.q_heads, g.kv_heads, g.head_dim, vase_dtype_to_string(g.dtype), B,
               vase_policy_to_string(cfg.policy), cfg.params.budget, W, cfg.prompt_len, slack_used,
               z.token_bytes, z.page_bytes, z.slots, z.kv_pages, z.ring_pages, z.ring_page_bytes,
               z.plan_page_bytes, z.seq_bytes, arena, granule, z.seqs);
        return 0;
    }
    char b1[32], b2[32], b3[32];
    printf("model       %" PRIu32 " layers, %" PRIu32 " query and %" PRIu32 " KV heads of %" PRIu32
           ", %s, pages of %" PRIu32 " tokens\n",
           g.layers, g.q_heads, g.kv_heads, g.head_dim, vase_dtype_to_string(g.dtype), B);
    printf("per token   %" PRIu64 " bytes (K and V of every layer)\n", z.token_bytes);
    printf("sequence    %s, budget %" PRIu32 ", window %" PRIu32 ", prompt %" PRIu32
           ", slack %" PRIu32 ": %" PRIu32 " slots\n",
           vase_policy_to_string(cfg.policy), cfg.params.budget, W, cfg.prompt_len, slack_used,
           z.slots);
    printf("KV pages    %" PRIu32 " of %" PRIu64 " bytes (%s)\n", z.kv_pages, z.page_bytes,
           vasectl_fmt_bytes((uint64_t)z.kv_pages * z.page_bytes, b1, sizeof(b1)));
    if (z.ring_pages)
        printf("query ring  %" PRIu32 " pages of %" PRIu64 " bytes (%s)\n", z.ring_pages,
               z.ring_page_bytes,
               vasectl_fmt_bytes((uint64_t)z.ring_pages * z.ring_page_bytes, b1, sizeof(b1)));
    else
        printf("query ring  none (%s reads no queries)\n", vase_policy_to_string(cfg.policy));
    printf("plan page   %" PRIu64 " bytes\n", z.plan_page_bytes);
    printf("per seq     %" PRIu64 " bytes (%s)\n", z.seq_bytes,
           vasectl_fmt_bytes(z.seq_bytes, b1, sizeof(b1)));
    printf("arena       %s in granules of %s: %" PRIu64 " sequences\n",
           vasectl_fmt_bytes(arena, b2, sizeof(b2)), vasectl_fmt_bytes(granule, b3, sizeof(b3)),
           z.seqs);
    return 0;
}
