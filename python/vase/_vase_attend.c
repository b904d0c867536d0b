/* SPDX-License-Identifier: MIT */

/*
 * vase._vase.paged_attention(): the CPU paged attention of kernels/attend.c (vase_attend.h) over
 * tensors taken through DLPack. Everything the kernel reads is checked here or by the kernel
 * before out is written: the type, shape, strides and device of each tensor, then the visible
 * counts and the table entries the queries need. The computation runs with the GIL released;
 * the capsules, held until it returns, keep the producers' memory alive.
 */

#include "_vase.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>

#include "vase_attend.h"

void vpy_dl_release(struct vpy_dl *x) {
    Py_CLEAR(x->cap); /* an unconsumed "dltensor" capsule's destructor calls the deleter */
}

int vpy_dl_take(PyObject *obj, const char *name, struct vpy_dl *ret) {
    ret->name = name;
    if (PyCapsule_CheckExact(obj)) {
        /* A capsule the caller made (torch.utils.dlpack.to_dlpack): borrowed, left unconsumed,
         * so that its own destructor frees it. */
        Py_INCREF(obj);
        ret->cap = obj;
    } else {
        PyObject *meth = PyObject_GetAttrString(obj, "__dlpack__");
        if (!meth) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError,
                         "%s must be a tensor (an object with __dlpack__, or a DLPack capsule)",
                         name);
            return -1;
        }
        ret->cap = PyObject_CallNoArgs(meth);
        Py_DECREF(meth);
        if (!ret->cap)
            return -1;
    }
    if (!PyCapsule_IsValid(ret->cap, "dltensor")) {
        PyErr_Format(PyExc_TypeError, "%s: not an unconsumed \"dltensor\" capsule", name);
        return -1;
    }
    const DLManagedTensor *mt = PyCapsule_GetPointer(ret->cap, "dltensor");
    ret->t = &mt->dl_tensor;
    if (ret->t->device.device_type != kDLCPU) {
        PyErr_Format(PyExc_ValueError, "%s is on DLPack device type %d: it runs on the CPU", name,
                     (int)ret->t->device.device_type);
        return -1;
    }
    return 0;
}

int vpy_dl_is(const struct vpy_dl *x, uint8_t code, uint8_t bits) {
    return x->t->dtype.code == code && x->t->dtype.bits == bits && x->t->dtype.lanes == 1;
}

static int need_dims(const struct vpy_dl *x, int ndim) {
    if (x->t->ndim == ndim)
        return 0;
    PyErr_Format(PyExc_ValueError, "%s has %d dimensions, not %d", x->name, (int)x->t->ndim, ndim);
    return -1;
}

int64_t vpy_dl_stride(const struct vpy_dl *x, int i) {
    if (x->t->strides)
        return x->t->strides[i];
    int64_t s = 1;
    for (int j = x->t->ndim - 1; j > i; j--)
        s *= x->t->shape[j];
    return s;
}

int vpy_dl_dense_from(const struct vpy_dl *x, int first) {
    int64_t want = 1;
    for (int i = x->t->ndim - 1; i >= first; i--) {
        if (x->t->shape[i] != 1 && vpy_dl_stride(x, i) != want)
            return 0;
        want *= x->t->shape[i];
    }
    return 1;
}

const void *vpy_dl_data(const struct vpy_dl *x) {
    uintptr_t at = (uintptr_t)x->t->data + (uintptr_t)x->t->byte_offset;
    if (at % (x->t->dtype.bits / 8)) {
        PyErr_Format(PyExc_ValueError, "%s is not aligned to its elements", x->name);
        return NULL;
    }
    return (const void *)at;
}

static int fits_u32(const struct vpy_dl *x) {
    for (int i = 0; i < x->t->ndim; i++)
        if (x->t->shape[i] < 0 || x->t->shape[i] > (int64_t)UINT32_MAX) {
            PyErr_Format(PyExc_ValueError, "%s: dimension %d of %lld", x->name, i,
                         (long long)x->t->shape[i]);
            return 0;
        }
    return 1;
}

/* Checks k and v and fills the kernel's description of them. */
static int cache_of(const struct vpy_dl *k, const struct vpy_dl *v, struct vase_attend_cache *c) {
    if (vpy_dl_is(k, kDLFloat, 32))
        c->dtype = VASE_ATTEND_F32;
    else if (vpy_dl_is(k, kDLFloat, 16))
        c->dtype = VASE_ATTEND_F16;
    else if (vpy_dl_is(k, kDLBfloat, 16))
        c->dtype = VASE_ATTEND_BF16;
    else {
        PyErr_SetString(PyExc_TypeError, "k must be float32, float16 or bfloat16");
        return -1;
    }
    if (k->t->dtype.code != v->t->dtype.code || k->t->dtype.bits != v->t->dtype.bits ||
        v->t->dtype.lanes != 1) {
        PyErr_SetString(PyExc_TypeError, "v must be of k's dtype");
        return -1;
    }
    if (need_dims(k, 4) || need_dims(v, 4) || !fits_u32(k))
        return -1;
    for (int i = 0; i < 4; i++)
        if (k->t->shape[i] != v->t->shape[i]) {
            PyErr_SetString(PyExc_ValueError, "v must be of k's shape");
            return -1;
        }
    for (const struct vpy_dl *x = k; x; x = x == k ? v : NULL)
        if (x->t->shape[3] > 1 && vpy_dl_stride(x, 3) != 1) {
            PyErr_Format(PyExc_ValueError, "%s must be contiguous in its last dimension", x->name);
            return -1;
        }
    if (!(c->k = vpy_dl_data(k)) || !(c->v = vpy_dl_data(v)))
        return -1;
    c->blocks = (uint32_t)k->t->shape[0];
    c->block_tokens = (uint32_t)k->t->shape[1];
    c->kv_heads = (uint32_t)k->t->shape[2];
    c->head_dim = (uint32_t)k->t->shape[3];
    for (int i = 0; i < 3; i++) {
        c->k_stride[i] = vpy_dl_stride(k, i);
        c->v_stride[i] = vpy_dl_stride(v, i);
    }
    if (!c->block_tokens || !c->kv_heads || !c->head_dim) {
        PyErr_SetString(PyExc_ValueError, "k has an empty dimension");
        return -1;
    }
    return 0;
}

/* Checks q, out, table and visible against each other and k, and fills the batch. */
static int batch_of(const struct vpy_dl *q, const struct vpy_dl *table,
                    const struct vpy_dl *visible, const struct vpy_dl *out,
                    const struct vase_attend_cache *c, struct vase_attend_batch *bt) {
    const struct vpy_dl *f32[] = {q, out};
    for (int i = 0; i < 2; i++)
        if (!vpy_dl_is(f32[i], kDLFloat, 32)) {
            PyErr_Format(PyExc_TypeError, "%s must be float32", f32[i]->name);
            return -1;
        }
    const struct vpy_dl *i32[] = {table, visible};
    for (int i = 0; i < 2; i++)
        if (!vpy_dl_is(i32[i], kDLInt, 32)) {
            PyErr_Format(PyExc_TypeError, "%s must be int32", i32[i]->name);
            return -1;
        }
    if (need_dims(q, 4) || !fits_u32(q))
        return -1;
    if (out->t->ndim != 4)
        goto out_shape;
    for (int i = 0; i < 4; i++)
        if (out->t->shape[i] != q->t->shape[i])
            goto out_shape;
    const int64_t *qs = q->t->shape;
    if (qs[2] % c->kv_heads) {
        PyErr_Format(PyExc_ValueError,
                     "q's %lld query heads are not a multiple of k's %u KV heads (grouped-query "
                     "attention: each KV head serves as many)",
                     (long long)qs[2], c->kv_heads);
        return -1;
    }
    if (qs[3] != c->head_dim) {
        PyErr_Format(PyExc_ValueError,
                     "k's last dimension is %u: it must agree with q's head_dim (%lld)",
                     c->head_dim, (long long)qs[3]);
        return -1;
    }
    if (table->t->ndim != 2 || table->t->shape[0] != qs[0] || !fits_u32(table)) {
        PyErr_SetString(PyExc_ValueError, "table must be [b, blocks] with q's b");
        return -1;
    }
    if (visible->t->ndim != 2 || visible->t->shape[0] != qs[0] || visible->t->shape[1] != qs[1]) {
        PyErr_SetString(PyExc_ValueError, "visible must be [b, n] with q's b and n");
        return -1;
    }
    const struct vpy_dl *dense[] = {q, out, table, visible};
    for (int i = 0; i < 4; i++)
        if (!vpy_dl_dense_from(dense[i], 0)) {
            PyErr_Format(PyExc_ValueError, "%s must be contiguous", dense[i]->name);
            return -1;
        }
    if (!(bt->q = vpy_dl_data(q)) || !(bt->table = vpy_dl_data(table)) ||
        !(bt->visible = vpy_dl_data(visible)) || !vpy_dl_data(out))
        return -1;
    bt->b = (uint32_t)qs[0];
    bt->n = (uint32_t)qs[1];
    bt->q_heads = (uint32_t)qs[2];
    bt->width = (uint32_t)table->t->shape[1];
    return 0;
out_shape:
    PyErr_SetString(PyExc_ValueError, "out must be of q's shape");
    return -1;
}

int vpy_attend(const struct vase_attend_cache *c, const struct vase_attend_batch *bt, float *out,
               uint32_t threads, char *why, size_t why_size) {
    if (threads > VPY_MAX_THREADS)
        threads = VPY_MAX_THREADS;
    if (threads <= 1 || bt->b <= 1)
        return vase_paged_attention(c, bt, out, why, why_size);
    int r = vase_paged_attention_check(c, bt, why, why_size);
    if (r < 0)
        return r;
    /* The sequences cut into runs of about equal work (the slots their queries see, which the
     * check found non-negative), a few per thread, which the threads take as they come free: a
     * thread the machine delays holds up one run, not a thread's share. */
    uint32_t parts = 4 * threads < bt->b ? 4 * threads : bt->b;
    uint64_t total = 0;
    for (size_t i = 0; i < (size_t)bt->b * bt->n; i++)
        total += (uint64_t)bt->visible[i] + 1;
    uint32_t first[4 * VPY_MAX_THREADS + 1];
    uint64_t done = 0;
    uint32_t k = 1;
    first[0] = 0;
    for (uint32_t i = 0; i < bt->b && k < parts; i++) {
        for (uint32_t j = 0; j < bt->n; j++)
            done += (uint64_t)bt->visible[(size_t)i * bt->n + j] + 1;
        while (k < parts && done * parts >= total * k)
            first[k++] = i + 1;
    }
    while (k <= parts)
        first[k++] = bt->b;
    int failed = 0;
    const size_t row = (size_t)bt->n * bt->q_heads * c->head_dim;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) reduction(min : failed)
    for (uint32_t t = 0; t < parts; t++) {
        struct vase_attend_batch part = *bt;
        part.b = first[t + 1] - first[t];
        if (!part.b)
            continue;
        part.q = bt->q + first[t] * row;
        part.table = bt->table + (size_t)first[t] * bt->width;
        part.visible = bt->visible + (size_t)first[t] * bt->n;
        char w[64];
        int rc = vase_paged_attention(c, &part, out + first[t] * row, w, sizeof(w));
        failed = rc < failed ? rc : failed;
    }
    /* Everything was checked above: what is left to fail is scratch memory. */
    if (failed < 0)
        snprintf(why, why_size, "out of memory");
    return failed;
}

PyObject *vpy_paged_attention(PyObject *mod, PyObject *args, PyObject *kw) {
    (void)mod;
    static char *kwlist[] = {"q", "k", "v", "table", "visible", "out", "scale", "threads", NULL};
    PyObject *o[6], *othreads = NULL;
    double scale;
    uint32_t threads = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOOd|O:paged_attention", kwlist, &o[0], &o[1],
                                     &o[2], &o[3], &o[4], &o[5], &scale, &othreads) ||
        (othreads && vpy_get_u32(othreads, "threads", &threads) < 0))
        return NULL;
    static const char *names[] = {"q", "k", "v", "table", "visible", "out"};
    struct vpy_dl x[6] = {0};
    PyObject *result = NULL;
    for (int i = 0; i < 6; i++)
        if (vpy_dl_take(o[i], names[i], &x[i]) < 0)
            goto done;
    struct vase_attend_cache c = {0};
    struct vase_attend_batch bt = {0};
    if (cache_of(&x[1], &x[2], &c) < 0 || batch_of(&x[0], &x[3], &x[4], &x[5], &c, &bt) < 0)
        goto done;
    if (!isfinite(scale) || !isfinite((float)scale)) {
        PyErr_SetString(PyExc_ValueError, "scale is not a finite float32");
        goto done;
    }
    bt.scale = (float)scale;
    float *out = (float *)vpy_dl_data(&x[5]);
    char why[256] = "";
    int r;
    Py_BEGIN_ALLOW_THREADS
        ;
        r = vpy_attend(&c, &bt, out, threads, why, sizeof(why));
    Py_END_ALLOW_THREADS;
    if (r == -ENOMEM)
        PyErr_NoMemory();
    else if (r < 0)
        PyErr_Format(PyExc_ValueError, "paged_attention: %s", why);
    else
        result = Py_NewRef(Py_None);
done:
    for (int i = 0; i < 6; i++)
        vpy_dl_release(&x[i]);
    return result;
}
