/* SPDX-License-Identifier: MIT */

/*
 * Storage types and strided views. A view maps (row, head, dim) to bytes in place, over the
 * paged arena layout or a plain array, so the kernels read pages without copying them; this
 * file converts what they read to float32 and rejects NaN and Inf on the way. Conversions
 * round to nearest even, as the hardware does.
 */

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

size_t vase_dtype_size(enum vase_dtype dtype) {
    switch (dtype) {
    case VASE_DTYPE_F32:
        return 4;
    case VASE_DTYPE_F16:
    case VASE_DTYPE_BF16:
        return 2;
    default:
        return 0;
    }
}

static const char *const dtype_names[_VASE_DTYPE_MAX] = {
    [VASE_DTYPE_F32] = "f32",
    [VASE_DTYPE_F16] = "f16",
    [VASE_DTYPE_BF16] = "bf16",
};

static const char *const dtype_long_names[_VASE_DTYPE_MAX] = {
    [VASE_DTYPE_F32] = "float32",
    [VASE_DTYPE_F16] = "float16",
    [VASE_DTYPE_BF16] = "bfloat16",
};

const char *vase_dtype_to_string(enum vase_dtype dtype) {
    if ((unsigned)dtype >= _VASE_DTYPE_MAX)
        return NULL;
    return dtype_names[dtype];
}

int vase_dtype_from_string(const char *s, enum vase_dtype *ret) {
    if (!s || !ret)
        return -EINVAL;
    for (unsigned i = 0; i < _VASE_DTYPE_MAX; i++)
        if (strcmp(s, dtype_names[i]) == 0 || strcmp(s, dtype_long_names[i]) == 0) {
            *ret = (enum vase_dtype)i;
            return 0;
        }
    return -EINVAL;
}

/* Half precision: 1 sign, 5 exponent (bias 15), 10 mantissa bits. */
float vase_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu;
    uint32_t u;

    if (em >= 0x7c00u) /* Inf and NaN keep their payload. */
        u = 0x7f800000u | ((em & 0x3ffu) << 13);
    else if (em >= 0x0400u) /* Normal: rebias the exponent. */
        u = (em << 13) + ((127u - 15u) << 23);
    else /* Zero and subnormals: exact as a float product. */
        return sign ? -((float)em * 0x1p-24f) : (float)em * 0x1p-24f;
    return bits_f32(sign | u);
}

uint16_t vase_f32_to_f16(float f) {
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);

    x &= 0x7fffffffu;
    if (x >= 0x7f800000u) /* Inf stays Inf; NaN stays a quiet NaN. */
        return sign | 0x7c00u | (x > 0x7f800000u ? 0x200u : 0);
    if (x >= 0x477ff000u) /* 65520 and above round to Inf. */
        return sign | 0x7c00u;
    if (x < 0x38800000u) {
        /* Below the smallest normal (2^-14): adding 0.5 rounds to a multiple of 2^-24, the
         * subnormal step, and the low bits of the sum are the subnormal mantissa. */
        float t = bits_f32(x) + 0.5f;
        return sign | (uint16_t)(f32_bits(t) - 0x3f000000u);
    }
    uint32_t odd = (x >> 13) & 1u;
    x += ((uint32_t)(15 - 127) << 23) + 0xfffu + odd;
    return sign | (uint16_t)(x >> 13);
}

float vase_bf16_to_f32(uint16_t h) {
    return bits_f32((uint32_t)h << 16);
}

uint16_t vase_f32_to_bf16(float f) {
    uint32_t x = f32_bits(f);

    if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a quiet NaN. */
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

bool vase__all_finite(const float *x, size_t count) {
    uint32_t bad = 0;
    for (size_t i = 0; i < count; i++) {
        uint32_t u = f32_bits(x[i]);
        bad |= (u & 0x7f800000u) == 0x7f800000u;
    }
    return !bad;
}

VASE_HOT static bool convert_f16(const uint16_t *src, uint32_t count, float *out) {
    uint32_t bad = 0;
    for (uint32_t i = 0; i < count; i++) {
        bad |= (src[i] & 0x7fffu) >= 0x7c00u;
        out[i] = vase__f16_value(src[i]);
    }
    return !bad;
}

VASE_HOT static bool convert_bf16(const uint16_t *src, uint32_t count, float *out) {
    uint32_t bad = 0;
    for (uint32_t i = 0; i < count; i++) {
        uint32_t u = (uint32_t)src[i] << 16;
        bad |= (u & 0x7f800000u) == 0x7f800000u;
        out[i] = bits_f32(u);
    }
    return !bad;
}

VASE_HOT static bool convert_f32(const float *src, uint32_t count, float *out) {
    uint32_t bad = 0;
    for (uint32_t i = 0; i < count; i++) {
        float f = src[i];
        bad |= (f32_bits(f) & 0x7f800000u) == 0x7f800000u;
        out[i] = f;
    }
    return !bad;
}

bool vase__convert(const void *src, enum vase_dtype dtype, uint32_t count, float *out) {
    switch (dtype) {
    case VASE_DTYPE_F16:
        return convert_f16(src, count, out);
    case VASE_DTYPE_BF16:
        return convert_bf16(src, count, out);
    default:
        return convert_f32(src, count, out);
    }
}

struct vase_view vase_view_contiguous(void *base, enum vase_dtype dtype, uint32_t heads,
                                      uint32_t rows, uint32_t dim) {
    int64_t es = (int64_t)vase_dtype_size(dtype);
    return (struct vase_view){
        .base = base,
        .heads = heads,
        .dim = dim,
        .dtype = dtype,
        .token_stride = (int64_t)dim * es,
        .head_stride = (int64_t)rows * dim * es,
    };
}

void *vase_view_row(const struct vase_view *v, uint32_t row, uint32_t head) {
    return vase__row(v, row, head);
}

int vase_view_read_row(const struct vase_view *v, uint32_t row, uint32_t head, float *out) {
    return vase__convert(vase_view_row(v, row, head), v->dtype, v->dim, out) ? 0 : -EINVAL;
}

int vase__view_check(const struct vase_view *v, uint32_t rows) {
    if (!v->base || v->heads == 0 || v->heads > VASE_MAX_HEADS || v->dim == 0 ||
        v->dim > VASE_MAX_DIM || vase_dtype_size(v->dtype) == 0)
        return -EINVAL;
    if (v->ring && rows > v->ring)
        return -EINVAL;
    if (v->first && !v->ring)
        return -EINVAL;
    if (v->tokens_per_page == 0 && v->pages)
        return -EINVAL;
    return 0;
}

/* Out of line and never vectorised: GCC's vectoriser drops prefetches from loops it vectorises,
 * and this one must stay a plain loop over the row's cache lines. */
__attribute__((optimize("no-tree-vectorize"))) void
vase__prefetch_row(const struct vase_view *v, uint32_t row, uint32_t head) {
    const char *p = vase__row(v, row, head);
    size_t bytes = (size_t)v->dim * vase_dtype_size(v->dtype);
    for (size_t off = 0; off < bytes; off += 64)
        __builtin_prefetch(p + off, 0, 0);
}

int vase__gather(const struct vase_view *v, uint32_t head, uint32_t n, float *out) {
    bool ok = true;
    for (uint32_t r = 0; r < n; r++) {
        /* One head's rows are token_stride apart, usually a whole 4 KiB memory page or more,
         * where the hardware prefetchers give up; ask for the rows a few steps ahead. */
        if (r + VASE_PREFETCH_AHEAD < n)
            vase__prefetch_row(v, r + VASE_PREFETCH_AHEAD, head);
        ok &= vase__convert(vase__row(v, r, head), v->dtype, v->dim, out + (size_t)r * v->dim);
    }
    return ok ? 0 : -EINVAL;
}

void *vase__ws_get(struct vase_workspace *ws, enum ws_slot slot, size_t bytes) {
    if (bytes == 0)
        bytes = 64;
    if (ws->size[slot] >= bytes)
        return ws->buf[slot];
    /* Grow by half again, so buffers sized by a growing n are not reallocated every call. */
    size_t want = bytes + bytes / 2;
    want = (want + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, want);
    if (!p)
        return NULL;
    free(ws->buf[slot]);
    ws->buf[slot] = p;
    ws->size[slot] = want;
    return p;
}

int vase_workspace_new(struct vase_workspace **ret) {
    if (!ret)
        return -EINVAL;
    struct vase_workspace *ws = calloc(1, sizeof(*ws));
    if (!ws)
        return -ENOMEM;
    *ret = ws;
    return 0;
}

struct vase_workspace *vase_workspace_free(struct vase_workspace *ws) {
    if (!ws)
        return NULL;
    for (unsigned i = 0; i < _WS_MAX; i++)
        free(ws->buf[i]);
    free(ws);
    return NULL;
}
