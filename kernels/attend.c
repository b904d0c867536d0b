/* SPDX-License-Identifier: MIT */

/*
 * Paged attention on the CPU (vase_attend.h). For each query column and KV head, the group of
 * query heads that share the head is scored against each slot the column sees, block by block
 * through the sequence's table, so each K row is read once per group; then a softmax per query
 * head (minus its maximum, vase__exp_neg), then the probability-weighted sum of the V rows.
 * Everything in float32: rows of float16 or bfloat16 are widened as they are read.
 *
 * Two paths. The portable one transposes a block's K rows so that its scores are computed across
 * slots; no loop reassociates a sum the C source does not, so every instruction-set clone
 * (VASE_HOT) rounds the same. Where the CPU has AVX-512 and the pages are float32 with rows of a
 * multiple of 16 elements, 16 slots' rows are multiplied lane by lane with a query head's and their
 * lanes summed together, and the weighted sum of V keeps its rows in registers, with fused
 * multiply-adds: it rounds differently from the portable path (both within a few float32 ulps of
 * exact attention; tests/test_attend.c checks both on one machine through
 * vase__attend_portable). It also runs a query column's KV heads inside the loop over blocks, so
 * that a block's token rows, which hold every head, come from memory once for all of them (the
 * next block's are prefetched meanwhile).
 */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"
#include "vase_attend.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define ATTEND_AVX512 1
#else
#define ATTEND_AVX512 0
#endif

/* Checks every visible count and every table entry a query will read; nothing is read from the
 * cache. 0 and the most slots any query sees in *ret_most, or -EINVAL with why. */
static int check(const struct vase_attend_cache *c, const struct vase_attend_batch *bt,
                 uint32_t *ret_most, char *why, size_t why_size) {
    uint64_t most = (uint64_t)bt->width * c->block_tokens;
    uint32_t seen = 0;
    for (uint32_t i = 0; i < bt->b; i++) {
        int32_t row_max = 0;
        for (uint32_t j = 0; j < bt->n; j++) {
            int32_t vis = bt->visible[(size_t)i * bt->n + j];
            if (vis < 0 || (uint64_t)vis > most) {
                snprintf(why, why_size, "visible[%u][%u] = %d: want 0 to %llu", i, j, (int)vis,
                         (unsigned long long)most);
                return -EINVAL;
            }
            if (vis > row_max)
                row_max = vis;
        }
        uint32_t need = (uint32_t)(((uint64_t)row_max + c->block_tokens - 1) / c->block_tokens);
        for (uint32_t p = 0; p < need; p++) {
            int32_t blk = bt->table[(size_t)i * bt->width + p];
            if (blk < 0 || (uint32_t)blk >= c->blocks) {
                snprintf(why, why_size,
                         "table[%u][%u] = %d: not one of the %u blocks (a query of sequence %u "
                         "sees %d slots)",
                         i, p, (int)blk, c->blocks, i, (int)row_max);
                return -EINVAL;
            }
        }
        seen = (uint32_t)row_max > seen ? (uint32_t)row_max : seen;
    }
    *ret_most = seen;
    return 0;
}

/* Row (block, token, head) of K or V as float32: the row itself for float32, else widened into
 * tmp (vase__convert, whose finiteness report is not needed here). */
static inline const float *row(const void *base, enum vase_attend_dtype t, const int64_t stride[3],
                               int32_t block, uint32_t token, uint32_t head, uint32_t d,
                               float *restrict tmp) {
    int64_t at =
        (int64_t)block * stride[0] + (int64_t)token * stride[1] + (int64_t)head * stride[2];
    if (t == VASE_ATTEND_F32)
        return (const float *)base + at;
    (void)vase__convert((const uint16_t *)base + at,
                        t == VASE_ATTEND_BF16 ? VASE_DTYPE_BF16 : VASE_DTYPE_F16, d, tmp);
    return tmp;
}

/* The rows of one block's tokens 0 .. span - 1 of K (one head), as float32, transposed: out[e *
 * width + t] is element e of token t (width >= span; the columns past span are left as they
 * are). tmp: d floats. */
static inline void block_t(const struct vase_attend_cache *c, int32_t block, uint32_t span,
                           uint32_t width, uint32_t head, float *restrict tmp,
                           float *restrict out) {
    for (uint32_t tok = 0; tok < span; tok++) {
        const float *r = row(c->k, c->dtype, c->k_stride, block, tok, head, c->head_dim, tmp);
        for (uint32_t e = 0; e < c->head_dim; e++)
            out[(size_t)e * width + tok] = r[e];
    }
}

/* Slots at a time in the scores' registers. */
#define ATTEND_TILE 16

/* The width of a block's transposed K: block_tokens rounded up to ATTEND_TILE. */
static uint32_t kt_width(const struct vase_attend_cache *c) {
    return (c->block_tokens + ATTEND_TILE - 1) / ATTEND_TILE * ATTEND_TILE;
}

/* The floats of the scratch attend_group() takes: group * vis scores, group * d accumulators, a
 * block's K transposed (d rows of block_tokens rounded up to ATTEND_TILE), and group sums. */
static size_t scratch_floats(const struct vase_attend_cache *c, uint32_t group, uint32_t vis) {
    return (size_t)group * vis + (size_t)group * c->head_dim + (size_t)c->head_dim * kt_width(c) +
           group;
}

/* The floats of the scratch attend_column() takes: attend_group()'s (the portable path, one KV
 * head at a time), or [q_heads][vis] scores, q_heads * d accumulators and q_heads sums. */
static size_t column_floats(const struct vase_attend_cache *c, uint32_t q_heads, uint32_t vis,
                            bool avx512) {
    size_t group = scratch_floats(c, q_heads / c->kv_heads, vis);
    size_t all = (size_t)q_heads * ((size_t)vis + c->head_dim + 1);
    return avx512 && all > group ? all : group;
}

/* The scores of one query column's group of query heads against its vis slots, into
 * scores[g * vis + slot], times scale. kt: a block's K transposed (d rows of block_tokens rounded
 * up to ATTEND_TILE); tmp: d floats. The loop runs across slots, a tile of them in registers. */
VASE_HOT static void scores_portable(const struct vase_attend_cache *c, const int32_t *table,
                                     const float *q, uint32_t group, uint32_t head, uint32_t vis,
                                     float scale, float *scores, float *kt, float *tmp) {
    const uint32_t d = c->head_dim, bt = c->block_tokens;
    const uint32_t width = kt_width(c);
    for (uint32_t s0 = 0, p = 0; s0 < vis; s0 += bt, p++) {
        uint32_t span = vis - s0 < bt ? vis - s0 : bt;
        block_t(c, table[p], span, width, head, tmp, kt);
        for (uint32_t t0 = 0; t0 < span; t0 += ATTEND_TILE) {
            uint32_t m = span - t0 < ATTEND_TILE ? span - t0 : ATTEND_TILE;
            for (uint32_t g = 0; g < group; g++) {
                const float *qg = q + (size_t)g * d;
                float a[ATTEND_TILE] = {0};
                for (uint32_t e = 0; e < d; e++) {
                    const float qe = qg[e], *ke = kt + (size_t)e * width + t0;
                    for (uint32_t l = 0; l < ATTEND_TILE; l++)
                        a[l] += qe * ke[l];
                }
                float *sc = scores + (size_t)g * vis + s0 + t0;
                for (uint32_t l = 0; l < m; l++)
                    sc[l] = a[l] * scale;
            }
        }
    }
}

/* Each query head's scores become exp(score - its maximum); total[g] their sum (eight lanes,
 * added pairwise). */
VASE_HOT static void softmax(float *scores, uint32_t group, uint32_t vis, float *total) {
    for (uint32_t g = 0; g < group; g++) {
        float *sc = scores + (size_t)g * vis;
        float top[8], part[8];
        for (uint32_t l = 0; l < 8; l++)
            top[l] = sc[0], part[l] = 0;
        uint32_t s = 0;
        for (; s + 8 <= vis; s += 8)
            for (uint32_t l = 0; l < 8; l++)
                top[l] = sc[s + l] > top[l] ? sc[s + l] : top[l];
        for (; s < vis; s++)
            top[0] = sc[s] > top[0] ? sc[s] : top[0];
        float m = top[0];
        for (uint32_t l = 1; l < 8; l++)
            m = top[l] > m ? top[l] : m;
        for (s = 0; s < vis; s++)
            sc[s] = vase__exp_neg(sc[s] - m);
        for (s = 0; s + 8 <= vis; s += 8)
            for (uint32_t l = 0; l < 8; l++)
                part[l] += sc[s + l];
        float tail = 0;
        for (; s < vis; s++)
            tail += sc[s];
        total[g] = ((part[0] + part[4]) + (part[1] + part[5])) +
                   ((part[2] + part[6]) + (part[3] + part[7])) + tail;
    }
}

/* out[g] = sum over the slots of p[g][slot] v[slot] / total[g]. acc: group * d floats; tmp: d
 * floats for a widened row. */
VASE_HOT static void values_portable(const struct vase_attend_cache *c, const int32_t *table,
                                     const float *scores, const float *total, uint32_t group,
                                     uint32_t head, uint32_t vis, float *acc, float *tmp,
                                     float *out) {
    const uint32_t d = c->head_dim, bt = c->block_tokens;
    memset(acc, 0, (size_t)group * d * sizeof(float));
    for (uint32_t s0 = 0, p = 0; s0 < vis; s0 += bt, p++) {
        uint32_t span = vis - s0 < bt ? vis - s0 : bt;
        for (uint32_t t = 0; t < span; t++) {
            const float *v = row(c->v, c->dtype, c->v_stride, table[p], t, head, d, tmp);
            for (uint32_t g = 0; g < group; g++) {
                const float w = scores[(size_t)g * vis + s0 + t];
                float *a = acc + (size_t)g * d;
                for (uint32_t e = 0; e < d; e++)
                    a[e] += w * v[e];
            }
        }
    }
    for (uint32_t g = 0; g < group; g++) {
        const float inv = 1.0f / total[g];
        for (uint32_t e = 0; e < d; e++)
            out[(size_t)g * d + e] = acc[(size_t)g * d + e] * inv;
    }
}

#if ATTEND_AVX512
/* The sums of the 16 lanes of each of v[0..15], lane i of the result the sum of v[i]: pairs
 * added within 128-bit lanes, then the 128-bit lanes transposed and added. */
__attribute__((target("avx512f"))) static inline __m512 sum16(const __m512 *v) {
    __m512 t[8], u[4];
    for (int i = 0; i < 8; i++)
        t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++)
        u[i] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * i], t[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(t[2 * i], t[2 * i + 1], 0xee));
    __m512 x0 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88),
                              _mm512_shuffle_f32x4(u[0], u[1], 0xdd));
    __m512 x1 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88),
                              _mm512_shuffle_f32x4(u[2], u[3], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(x0, x1, 0x88), _mm512_shuffle_f32x4(x0, x1, 0xdd));
}

/* Asks for the token rows (every head) of the block after the one at slot s0 of a column that
 * sees vis slots, if there is one, to be brought into the cache while this block is computed.
 * base, stride: K or V of the cache. */
__attribute__((target("avx512f"))) static inline void
prefetch_next(const struct vase_attend_cache *c, const float *base, const int64_t stride[3],
              const int32_t *table, uint32_t p, uint32_t s0, uint32_t vis) {
    const uint32_t bt = c->block_tokens, row_bytes = c->kv_heads * c->head_dim * 4;
    if (s0 + bt >= vis)
        return;
    const uint32_t span = vis - s0 - bt < bt ? vis - s0 - bt : bt;
    const char *next = (const char *)(base + (int64_t)table[p + 1] * stride[0]);
    for (uint32_t t = 0; t < span; t++)
        for (uint32_t b = 0; b < row_bytes; b += 64)
            _mm_prefetch(next + (int64_t)t * stride[1] * 4 + b, _MM_HINT_T0);
}

/* The AVX-512 scores of one block's tokens 0 .. span - 1 (blk: its rows of one KV head) for the
 * group of query heads q that share the head, into sc[g * vis + t], times scale: 16 slots at a
 * time, each slot's row read whole (16 elements a register), multiplied lane by lane with a query
 * head's row, then the 16 products' lanes summed together (sum16). Inlined once per common
 * head_dim (d a constant: the products stay in registers). */
__attribute__((target("avx512f"), always_inline)) static inline void
scores_block(const float *blk, int64_t ts, const float *q, uint32_t group, uint32_t span,
             uint32_t vis, __m512 sv, float *sc, const uint32_t d) {
    for (uint32_t t0 = 0; t0 < span; t0 += 16) {
        const uint32_t m = span - t0 < 16 ? span - t0 : 16;
        const float *k0 = blk + (int64_t)t0 * ts;
        for (uint32_t g = 0; g < group; g++) {
            const float *qg = q + (size_t)g * d;
            __m512 prod[16];
#pragma GCC unroll 16
            for (uint32_t t = 0; t < 16; t++) {
                if (t < m) {
                    const float *k = k0 + (int64_t)t * ts;
                    __m512 a = _mm512_mul_ps(_mm512_loadu_ps(qg), _mm512_loadu_ps(k));
                    for (uint32_t e = 16; e < d; e += 16)
                        a = _mm512_fmadd_ps(_mm512_loadu_ps(qg + e), _mm512_loadu_ps(k + e), a);
                    prod[t] = a;
                } else {
                    prod[t] = _mm512_setzero_ps();
                }
            }
            _mm512_mask_storeu_ps(sc + (size_t)g * vis + t0, (__mmask16)((1u << m) - 1u),
                                  _mm512_mul_ps(sum16(prod), sv));
        }
    }
}

/* acc[g] += sum over the block's tokens 0 .. span - 1 of w[g * vis + t] v[t] (blk: the block's
 * V rows of one KV head), for the group of query heads sharing the head: 32 elements of the
 * rows at a time, in two registers per query head, four query heads at a time. */
__attribute__((target("avx512f"))) static inline void values_block(const float *blk, int64_t ts,
                                                                   const float *w, uint32_t group,
                                                                   uint32_t span, uint32_t vis,
                                                                   uint32_t d, float *acc) {
    for (uint32_t g0 = 0; g0 < group; g0 += 4) {
        const uint32_t gn = group - g0 < 4 ? group - g0 : 4;
        for (uint32_t e0 = 0; e0 < d; e0 += 32) {
            const int two = d - e0 >= 32;
            __m512 a[4][2];
            for (uint32_t g = 0; g < gn; g++) {
                a[g][0] = _mm512_loadu_ps(acc + (size_t)(g0 + g) * d + e0);
                a[g][1] = two ? _mm512_loadu_ps(acc + (size_t)(g0 + g) * d + e0 + 16)
                              : _mm512_setzero_ps();
            }
            for (uint32_t t = 0; t < span; t++) {
                const float *v = blk + (int64_t)t * ts + e0;
                __m512 v0 = _mm512_loadu_ps(v), v1 = two ? _mm512_loadu_ps(v + 16) : v0;
                for (uint32_t g = 0; g < gn; g++) {
                    __m512 x = _mm512_set1_ps(w[(size_t)(g0 + g) * vis + t]);
                    a[g][0] = _mm512_fmadd_ps(x, v0, a[g][0]);
                    a[g][1] = _mm512_fmadd_ps(x, v1, a[g][1]);
                }
            }
            for (uint32_t g = 0; g < gn; g++) {
                _mm512_storeu_ps(acc + (size_t)(g0 + g) * d + e0, a[g][0]);
                if (two)
                    _mm512_storeu_ps(acc + (size_t)(g0 + g) * d + e0 + 16, a[g][1]);
            }
        }
    }
}

/* The scores of every query head of one query column against its vis slots, block by block and,
 * within a block, KV head by KV head: a block's rows are read from memory once for all the heads
 * (they share its token rows), and stay in the cache while each head takes its part. scores:
 * [q_heads][vis]. */
__attribute__((target("avx512f"), always_inline)) static inline void
scores_column(const struct vase_attend_cache *c, const int32_t *table, const float *q,
              uint32_t group, uint32_t vis, float scale, float *scores, const uint32_t d) {
    const uint32_t bt = c->block_tokens, kv = c->kv_heads;
    const int64_t ts = c->k_stride[1];
    const __m512 sv = _mm512_set1_ps(scale);
    for (uint32_t s0 = 0, p = 0; s0 < vis; s0 += bt, p++) {
        const uint32_t span = vis - s0 < bt ? vis - s0 : bt;
        const float *blk = (const float *)c->k + (int64_t)table[p] * c->k_stride[0];
        prefetch_next(c, c->k, c->k_stride, table, p, s0, vis);
        for (uint32_t h = 0; h < kv; h++)
            scores_block(blk + (int64_t)h * c->k_stride[2], ts, q + (size_t)h * group * d, group,
                         span, vis, sv, scores + (size_t)h * group * vis + s0, d);
    }
}

__attribute__((target("avx512f"))) static void scores_avx512(const struct vase_attend_cache *c,
                                                             const int32_t *table, const float *q,
                                                             uint32_t group, uint32_t vis,
                                                             float scale, float *scores) {
    switch (c->head_dim) {
    case 32:
        scores_column(c, table, q, group, vis, scale, scores, 32);
        break;
    case 64:
        scores_column(c, table, q, group, vis, scale, scores, 64);
        break;
    case 128:
        scores_column(c, table, q, group, vis, scale, scores, 128);
        break;
    default:
        scores_column(c, table, q, group, vis, scale, scores, c->head_dim);
    }
}

/* out[h] = sum over the slots of p[h][slot] v[slot] / total[h] for every query head h of one
 * column, block by block as scores_column() reads K. acc: q_heads * d floats. */
__attribute__((target("avx512f"))) static void
values_avx512(const struct vase_attend_cache *c, const int32_t *table, const float *scores,
              const float *total, uint32_t q_heads, uint32_t vis, float *acc, float *out) {
    const uint32_t d = c->head_dim, bt = c->block_tokens, kv = c->kv_heads, group = q_heads / kv;
    const int64_t ts = c->v_stride[1];
    memset(acc, 0, (size_t)q_heads * d * sizeof(float));
    for (uint32_t s0 = 0, p = 0; s0 < vis; s0 += bt, p++) {
        const uint32_t span = vis - s0 < bt ? vis - s0 : bt;
        const float *blk = (const float *)c->v + (int64_t)table[p] * c->v_stride[0];
        prefetch_next(c, c->v, c->v_stride, table, p, s0, vis);
        for (uint32_t h = 0; h < kv; h++)
            values_block(blk + (int64_t)h * c->v_stride[2], ts,
                         scores + (size_t)h * group * vis + s0, group, span, vis, d,
                         acc + (size_t)h * group * d);
    }
    for (uint32_t h = 0; h < q_heads; h++) {
        const __m512 inv = _mm512_set1_ps(1.0f / total[h]);
        for (uint32_t e = 0; e < d; e += 16)
            _mm512_storeu_ps(out + (size_t)h * d + e,
                             _mm512_mul_ps(_mm512_loadu_ps(acc + (size_t)h * d + e), inv));
    }
}
#endif

int vase__attend_portable = 0;

/* Whether the AVX-512 path reads this cache: float32 pages, rows of a multiple of 16 elements,
 * on a CPU that has it. */
static bool use_avx512(const struct vase_attend_cache *c) {
#if ATTEND_AVX512
    static int have = -1;
    if (have < 0)
        have = __builtin_cpu_supports("avx512f") ? 1 : 0;
    return have && !vase__attend_portable && c->dtype == VASE_ATTEND_F32 && c->head_dim % 16 == 0;
#else
    (void)c;
    return false;
#endif
}

/* The output rows of one query column's group of query heads over its vis slots, on the
 * portable path. scratch: at least scratch_floats(c, group, vis) floats. */
static void attend_group(const struct vase_attend_cache *c, const int32_t *table, const float *q,
                         uint32_t group, uint32_t head, uint32_t vis, float scale, float *scratch,
                         float *out) {
    const uint32_t d = c->head_dim;
    float *scores = scratch, *acc = scores + (size_t)group * vis, *kt = acc + (size_t)group * d;
    const uint32_t width = kt_width(c);
    float *total = kt + (size_t)d * width;
    scores_portable(c, table, q, group, head, vis, scale, scores, kt, acc);
    softmax(scores, group, vis, total);
    values_portable(c, table, scores, total, group, head, vis, acc, kt, out);
}

/* The output rows of one query column (every query head) over its vis slots. scratch: at least
 * column_floats(c, q_heads, vis) floats. */
static void attend_column(const struct vase_attend_cache *c, const int32_t *table, const float *q,
                          uint32_t q_heads, uint32_t vis, float scale, bool avx512, float *scratch,
                          float *out) {
    const uint32_t d = c->head_dim, group = q_heads / c->kv_heads;
#if ATTEND_AVX512
    if (avx512) {
        /* [q_heads][vis] scores, q_heads * d accumulators, q_heads sums. */
        float *scores = scratch, *acc = scores + (size_t)q_heads * vis,
              *total = acc + (size_t)q_heads * d;
        scores_avx512(c, table, q, group, vis, scale, scores);
        softmax(scores, q_heads, vis, total);
        values_avx512(c, table, scores, total, q_heads, vis, acc, out);
        return;
    }
#else
    (void)avx512;
#endif
    for (uint32_t h = 0; h < c->kv_heads; h++)
        attend_group(c, table, q + (size_t)h * group * d, group, h, vis, scale, scratch,
                     out + (size_t)h * group * d);
}

/* The arguments' checks: 0 and the most slots a query sees, or -EINVAL with why. */
static int check_all(const struct vase_attend_cache *c, const struct vase_attend_batch *bt,
                     uint32_t *ret_most, char *why, size_t why_size) {
    if (!c || !bt || !c->k || !c->v || !bt->q || !bt->table || !bt->visible || !c->kv_heads ||
        !c->head_dim || !c->block_tokens || bt->q_heads % c->kv_heads ||
        (c->dtype != VASE_ATTEND_F32 && c->dtype != VASE_ATTEND_F16 &&
         c->dtype != VASE_ATTEND_BF16)) {
        snprintf(why, why_size, "bad arguments");
        return -EINVAL;
    }
    return check(c, bt, ret_most, why, why_size);
}

int vase_paged_attention_check(const struct vase_attend_cache *c,
                               const struct vase_attend_batch *bt, char *why, size_t why_size) {
    uint32_t most;
    return check_all(c, bt, &most, why, why_size);
}

int vase_paged_attention(const struct vase_attend_cache *c, const struct vase_attend_batch *bt,
                         float *out, char *why, size_t why_size) {
    uint32_t most;
    int r = out ? check_all(c, bt, &most, why, why_size) : -EINVAL;
    if (!out)
        snprintf(why, why_size, "bad arguments");
    if (r < 0)
        return r;
    const uint32_t d = c->head_dim;
    const bool avx512 = use_avx512(c);
    float *scratch = calloc(column_floats(c, bt->q_heads, most, avx512), sizeof(float));
    if (!scratch) {
        snprintf(why, why_size, "out of memory");
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < bt->b; i++) {
        const int32_t *table = bt->table + (size_t)i * bt->width;
        for (uint32_t j = 0; j < bt->n; j++) {
            size_t col = (size_t)i * bt->n + j;
            uint32_t vis = (uint32_t)bt->visible[col];
            const float *q = bt->q + col * bt->q_heads * d;
            float *o = out + col * bt->q_heads * d;
            if (!vis) {
                memset(o, 0, (size_t)bt->q_heads * d * sizeof(float));
                continue;
            }
            attend_column(c, table, q, bt->q_heads, vis, bt->scale, avx512, scratch, o);
        }
    }
    free(scratch);
    return 0;
}
