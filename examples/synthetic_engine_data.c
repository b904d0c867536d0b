/* SPDX-License-Identifier: MIT */

/*
 * The synthetic data of synthetic_engine: a pool of standard normal draws, converted once to the
 * model's dtype, from which K, V and query rows are cut at random offsets (a small fraction of
 * value rows scaled into outliers), the writes of a token's rows into a sequence, the synthetic
 * attention statistics pushed for h2o, and the count of outliers still cached at the end.
 */

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "synthetic_engine.h"

static uint64_t rng_next(struct rng *r) {
    uint64_t z = (r->state += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in (0, 1]. */
static double rng_uniform(struct rng *r) {
    return ((double)(rng_next(r) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

static uint32_t rng_below(struct rng *r, uint32_t n) {
    return (uint32_t)(((rng_next(r) >> 32) * (uint64_t)n) >> 32);
}

static void store(void *dst, enum vase_dtype dtype, size_t i, float x) {
    switch (dtype) {
    case VASE_DTYPE_F32:
        ((float *)dst)[i] = x;
        break;
    case VASE_DTYPE_F16:
        ((uint16_t *)dst)[i] = vase_f32_to_f16(x);
        break;
    default:
        ((uint16_t *)dst)[i] = vase_f32_to_bf16(x);
        break;
    }
}

/* ---- the row pool ---------------------------------------------------------------------- */

void pool_done(struct pool *p) {
    free(p->raw);
    free(p->f32);
}

int pool_init(struct pool *p, uint32_t dim, enum vase_dtype dtype, uint64_t seed) {
    size_t n = (size_t)POOL_SIZE + dim;
    struct rng r = {.state = seed ^ 0x5eed5eed5eed5eedull};
    float maxabs = 0;

    *p = (struct pool){.es = vase_dtype_size(dtype), .dim = dim};
    p->f32 = malloc(n * sizeof(float));
    p->raw = malloc(n * p->es);
    if (!p->f32 || !p->raw) {
        pool_done(p);
        return -ENOMEM;
    }
    /* Box-Muller; the values pass through the dtype and back so that the threshold below holds
     * for what is actually stored. */
    for (size_t i = 0; i < n; i += 2) {
        double rad = sqrt(-2.0 * log(rng_uniform(&r))), th = 2.0 * M_PI * rng_uniform(&r);

        p->f32[i] = (float)(rad * cos(th));
        if (i + 1 < n)
            p->f32[i + 1] = (float)(rad * sin(th));
    }
    for (size_t i = 0; i < n; i++) {
        store(p->raw, dtype, i, p->f32[i]);
        maxabs = fmaxf(maxabs, fabsf(p->f32[i]));
    }
    /* No ordinary row can have a range above 2 * maxabs; an outlier row (20x) has one far above
     * unless its own range is tiny, which the writer checks when it makes one. */
    p->threshold = 2.0f * maxabs * 1.01f;
    return 0;
}

/* ---- rows of sequences ------------------------------------------------------------------ */

/* Writes one row of dim elements at dst, cut from the pool at a random offset; scaled for an
 * outlier. Returns whether the row is an outlier. */
static bool write_row(const struct pool *p, struct rng *r, void *dst, bool may_be_outlier) {
    uint32_t off = rng_below(r, POOL_SIZE);

    if (may_be_outlier && rng_uniform(r) < OUTLIER_PROB) {
        float lo = INFINITY, hi = -INFINITY;

        for (uint32_t d = 0; d < p->dim; d++) {
            lo = fminf(lo, p->f32[off + d]);
            hi = fmaxf(hi, p->f32[off + d]);
        }
        /* A row that, scaled, would still look ordinary is not worth calling an outlier. */
        if ((hi - lo) * OUTLIER_SCALE > 2.0f * p->threshold) {
            for (uint32_t d = 0; d < p->dim; d++)
                store(dst, arg_dtype, d, p->f32[off + d] * OUTLIER_SCALE);
            return true;
        }
    }
    memcpy(dst, (const char *)p->raw + (size_t)off * p->es, (size_t)p->dim * p->es);
    return false;
}

/* Writes K, V and queries of n tokens at slots len .. len + n - 1 and positions
 * position .. position + n - 1. Only the last 2 * window queries can still be in the ring after
 * the append, so earlier ones are skipped. */
int write_tokens(struct engine *e, struct seq_state *ss, uint32_t n) {
    uint32_t len = vase_seq_len(ss->seq);
    uint64_t pos = vase_seq_position(ss->seq);
    size_t row = (size_t)arg_head_dim * e->pool.es;
    int r;

    for (uint32_t i = 0; i < n; i++)
        for (uint32_t l = 0; l < arg_layers; l++) {
            if (len + i >= vase_seq_capacity(ss->seq)) {
                fprintf(stderr, "%s: sequence %u: no slot %u (capacity %u) for the next token\n",
                        arg_name, vase_seq_id(ss->seq), len + i, vase_seq_capacity(ss->seq));
                return -ENOSPC;
            }
            for (uint32_t h = 0; h < arg_kv_heads; h++) {
                write_row(&e->pool, &ss->rng, (char *)e->k_row + h * row, false);
                if (write_row(&e->pool, &ss->rng, (char *)e->v_row + h * row, true))
                    ss->outliers++;
            }
            r = vase_seq_write_kv(ss->seq, l, len + i, e->k_row, e->v_row);
            if (r < 0)
                return fail(e, "vase_seq_write_kv()", ss, r);
            if (n - i > 2 * arg_window || !ss->has_ring)
                continue;
            for (uint32_t h = 0; h < arg_q_heads; h++)
                write_row(&e->pool, &ss->rng, (char *)e->q_row + h * row, false);
            r = vase_seq_write_query(ss->seq, l, pos + i, e->q_row);
            if (r < 0)
                return fail(e, "vase_seq_write_query()", ss, r);
        }
    return 0;
}

/* Synthetic attention for h2o: per KV head, positive weights over the live slots that sum to 1,
 * with the attention sinks taking a large share as real models do. */
int push_stats(struct seq_state *ss) {
    uint32_t len = vase_seq_len(ss->seq);
    int r;

    if (len == 0)
        return 0;
    if (len > ss->stats_cap) {
        float *p = realloc(ss->stats, (size_t)arg_kv_heads * len * sizeof(float));

        if (!p)
            return -ENOMEM;
        ss->stats = p;
        ss->stats_cap = len;
    }
    for (uint32_t l = 0; l < arg_layers; l++) {
        for (uint32_t h = 0; h < arg_kv_heads; h++) {
            float *row = ss->stats + (size_t)h * len, sum = 0;

            for (uint32_t j = 0; j < len; j++) {
                row[j] = (float)(-log(rng_uniform(&ss->rng))) * (j < 4 ? 50.0f : 1.0f);
                sum += row[j];
            }
            for (uint32_t j = 0; j < len; j++)
                row[j] /= sum;
        }
        r = vase_seq_push_stats(ss->seq, l, VASE_STATS_ACC_ADD, ss->stats, len);
        if (r < 0)
            return r;
    }
    return 0;
}

/* Value rows still cached whose range marks them as outliers. */
int count_outliers(const struct engine *e, const struct seq_state *ss, uint64_t *ret) {
    uint32_t len = vase_seq_len(ss->seq);
    uint64_t count = 0;
    float *row;
    int r = 0;

    row = malloc((size_t)arg_head_dim * sizeof(float));
    if (!row)
        return -ENOMEM;
    /* The token's V rows, read back to the host: [kv_heads][dim], one row per head. */
    struct vase_view view =
        vase_view_contiguous(e->v_row, arg_dtype, arg_kv_heads, 1, arg_head_dim);
    for (uint32_t l = 0; l < arg_layers && r >= 0; l++)
        for (uint32_t s = 0; s < len && r >= 0; s++) {
            r = vase_seq_read_kv(ss->seq, l, s, e->k_row, e->v_row);
            for (uint32_t h = 0; h < arg_kv_heads && r >= 0; h++) {
                float lo = INFINITY, hi = -INFINITY;

                vase_view_read_row(&view, 0, h, row);
                for (uint32_t d = 0; d < arg_head_dim; d++) {
                    lo = fminf(lo, row[d]);
                    hi = fmaxf(hi, row[d]);
                }
                if (hi - lo > e->pool.threshold)
                    count++;
            }
        }
    free(row);
    if (r < 0)
        return r;
    *ret = count;
    return 0;
}
