/* SPDX-License-Identifier: MIT */

/*
 * vase.Batch (Model.batch()): one engine step over many sequences of a host arena in three
 * calls, for engines whose step is short enough that per-sequence Python calls would dominate
 * it (vase.vllm). begin() takes the step's sequences and the tokens each brings, reads their
 * lengths, positions and block tables once and works out where every new token goes; layer()
 * writes one layer's new keys and values (and the queries of the policies that read them) into
 * the arena and runs the paged attention over what each sequence then holds; finish() counts
 * the tokens (vase_seq_append) and applies ready plans (vase_seq_poll). Between begin() and
 * finish() the sequences are pinned (a close waits for the step's end).
 *
 * The tokens of a step are flat: sequence i's count[i] tokens follow sequence i - 1's, in the
 * order of begin()'s list, and layer()'s tensors are [tokens, heads, head_dim] in that order. A
 * None in the list stands for tokens that are not vase's: their keys and values are not
 * stored, and their output rows are zeros.
 */

#include "_vase.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vase_attend.h"

/* The most tokens one sequence may bring to a step, and a whole step (engines batch thousands). */
#define BATCH_MAX_COUNT (1u << 20)
#define BATCH_MAX_TOKENS (1u << 20)
/* The most entries of the step's tables (each token's row holds its sequence's table): 1 GiB. */
#define BATCH_MAX_TABLE ((uint64_t)1 << 28)

typedef struct {
    PyObject_HEAD ModelObject *model;
    /* Per layer, the arena's K and V (vase_model_kv_tensor()). */
    struct vase_tensor *k, *v;
    /* The step, between begin() and finish(). */
    int active;
    int busy; /* a call runs without the GIL: the others refuse meanwhile */
    Py_ssize_t nseq;
    SeqObject **seqs; /* [nseq]: pinned, or NULL for tokens that are not vase's */
    uint32_t *counts; /* [nseq] */
    uint32_t *lens;   /* [nseq]: the slots each held at begin() */
    uint32_t tokens;  /* their sum */
    int32_t *dest;    /* [tokens]: arena block of the token's slot, -1 when not vase's */
    uint32_t *offset; /* [tokens]: its token within the block */
    int32_t *table;   /* [tokens][width]: the block table of the token's sequence, -1 after */
    int32_t *visible; /* [tokens]: slots the token's query sees, 0 when not vase's */
    uint32_t width;
    void **ring; /* [layers][tokens]: where the token's query goes, or NULL */
    float *qbuf; /* [tokens][q_heads][head_dim]: q made dense when it is not */
    size_t cap_tokens, cap_table, cap_seqs;
} BatchObject;

PyTypeObject *vpy_batch_type;

/* Drops the step's pins. */
static void release(BatchObject *self) {
    for (Py_ssize_t i = 0; i < self->nseq; i++) {
        SeqObject *s = self->seqs[i];
        if (s) {
            self->seqs[i] = NULL;
            vpy_seq_leave(s);
            Py_DECREF((PyObject *)s);
        }
    }
    self->nseq = 0;
    self->active = 0;
}

static void batch_dealloc(BatchObject *self) {
    PyTypeObject *tp = Py_TYPE((PyObject *)self);
    release(self);
    free(self->k);
    free(self->v);
    free(self->seqs);
    free(self->counts);
    free(self->lens);
    free(self->dest);
    free(self->offset);
    free(self->table);
    free(self->visible);
    free(self->ring);
    free(self->qbuf);
    Py_XDECREF((PyObject *)self->model);
    PyObject_Free(self);
    Py_DECREF(tp);
}

/* Refuses a call while another thread's runs without the GIL (-1, RuntimeError). */
static int idle(BatchObject *self) {
    if (!self->busy)
        return 0;
    PyErr_SetString(PyExc_RuntimeError, "the Batch is in use by another thread");
    return -1;
}

/* Grows *p to hold n elements of size bytes; 0 or -1 with MemoryError. */
static int grow(void *pp, size_t n, size_t size) {
    void **p = pp;
    void *q = realloc(*p, (n ? n : 1) * size);
    if (!q) {
        PyErr_NoMemory();
        return -1;
    }
    *p = q;
    return 0;
}

PyObject *vpy_batch_new(ModelObject *m) {
    if (m->device.device_type != kDLCPU) {
        PyErr_SetString(PyExc_ValueError,
                        "Model.batch(): the model's arena is on a CUDA device; a batch writes "
                        "and attends on a host arena");
        return NULL;
    }
    if (m->dtype != VASE_DTYPE_F32) {
        PyErr_SetString(PyExc_ValueError,
                        "Model.batch(): the model stores float16 or bfloat16; a batch takes "
                        "float32");
        return NULL;
    }
    if (vpy_client_enter(m->client) < 0)
        return NULL;
    BatchObject *self = PyObject_New(BatchObject, vpy_batch_type);
    if (!self) {
        vpy_client_unpin(m->client);
        return NULL;
    }
    Py_INCREF((PyObject *)m);
    self->model = m;
    self->active = 0;
    self->busy = 0;
    self->nseq = 0;
    self->seqs = NULL;
    self->counts = NULL;
    self->lens = NULL;
    self->tokens = 0;
    self->dest = NULL;
    self->offset = NULL;
    self->table = NULL;
    self->visible = NULL;
    self->width = 0;
    self->ring = NULL;
    self->qbuf = NULL;
    self->cap_tokens = self->cap_table = self->cap_seqs = 0;
    self->k = calloc(m->layers, sizeof(*self->k));
    self->v = calloc(m->layers, sizeof(*self->v));
    int r = 0;
    if (!self->k || !self->v)
        r = -ENOMEM;
    for (uint32_t l = 0; l < m->layers && !r; l++)
        if ((r = vase_model_kv_tensor(m->m, l, VASE_K, &self->k[l])) == 0)
            r = vase_model_kv_tensor(m->m, l, VASE_V, &self->v[l]);
    vpy_client_unpin(m->client);
    if (r < 0) {
        Py_DECREF((PyObject *)self);
        return r == -ENOMEM ? PyErr_NoMemory() : vpy_raise(r, "the arena's K and V tensors");
    }
    return (PyObject *)self;
}

/* Makes room for a step of nseq sequences and tokens tokens whose tables are width wide. */
static int reserve(BatchObject *self, Py_ssize_t nseq, size_t tokens, size_t width) {
    ModelObject *m = self->model;
    if ((size_t)nseq > self->cap_seqs) {
        if (grow(&self->seqs, (size_t)nseq, sizeof(*self->seqs)) < 0 ||
            grow(&self->counts, (size_t)nseq, sizeof(*self->counts)) < 0 ||
            grow(&self->lens, (size_t)nseq, sizeof(*self->lens)) < 0)
            return -1;
        self->cap_seqs = (size_t)nseq;
    }
    if (tokens > self->cap_tokens) {
        if (grow(&self->dest, tokens, sizeof(*self->dest)) < 0 ||
            grow(&self->offset, tokens, sizeof(*self->offset)) < 0 ||
            grow(&self->visible, tokens, sizeof(*self->visible)) < 0 ||
            grow(&self->ring, tokens * m->layers, sizeof(*self->ring)) < 0 ||
            grow(&self->qbuf, tokens * m->q_heads * m->head_dim, sizeof(*self->qbuf)) < 0)
            return -1;
        self->cap_tokens = tokens;
    }
    if (tokens * width > self->cap_table) {
        if (grow(&self->table, tokens * width, sizeof(*self->table)) < 0)
            return -1;
        self->cap_table = tokens * width;
    }
    return 0;
}

/* begin(seqs, counts): the step's sequences (Seq, or None) and the tokens each brings. */
static PyObject *batch_begin(BatchObject *self, PyObject *args) {
    PyObject *oseqs, *ocounts;
    if (!PyArg_ParseTuple(args, "OO:begin", &oseqs, &ocounts) || idle(self) < 0)
        return NULL;
    release(self);
    if (!PyList_Check(oseqs) || !PyList_Check(ocounts)) {
        PyErr_SetString(PyExc_TypeError, "seqs and counts must be lists");
        return NULL;
    }
    ModelObject *m = self->model;
    const uint32_t B = m->block_tokens;
    Py_ssize_t n = PyList_Size(oseqs);
    if (PyList_Size(ocounts) != n) {
        PyErr_Format(PyExc_ValueError, "%zd sequences but %zd counts", n, PyList_Size(ocounts));
        return NULL;
    }
    if (reserve(self, n, 0, 0) < 0)
        return NULL;
    /* First the sequences, pinned, and the counts. */
    uint64_t tokens = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned long long cv;
        if (vpy_get_int(PyList_GetItem(ocounts, i), "count", 0, BATCH_MAX_COUNT, &cv) < 0)
            goto fail;
        /* Taken after the count, whose conversion may run Python code that changes the lists. */
        if (PyList_Size(oseqs) != n || PyList_Size(ocounts) != n) {
            PyErr_SetString(PyExc_RuntimeError, "seqs or counts changed during begin()");
            goto fail;
        }
        PyObject *o = PyList_GetItem(oseqs, i);
        uint32_t c = (uint32_t)cv;
        self->counts[i] = c;
        self->seqs[i] = NULL;
        self->nseq = i + 1;
        tokens += c;
        if (o == Py_None)
            continue;
        if (!PyObject_TypeCheck(o, vpy_seq_type)) {
            PyErr_Format(PyExc_TypeError, "seqs[%zd] is neither a Seq nor None", i);
            goto fail;
        }
        SeqObject *s = (SeqObject *)o;
        if (s->model != m) {
            PyErr_Format(PyExc_ValueError, "seqs[%zd] (sequence %u) is not of this batch's model",
                         i, s->id);
            goto fail;
        }
        if (vpy_seq_enter(s) < 0)
            goto fail;
        Py_INCREF(o);
        self->seqs[i] = s;
    }
    if (tokens > BATCH_MAX_TOKENS) {
        PyErr_Format(PyExc_ValueError, "%llu tokens in one step: at most %u",
                     (unsigned long long)tokens, BATCH_MAX_TOKENS);
        goto fail;
    }
    /* Then each sequence's state: the width of the widest table the step needs. */
    uint32_t width = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        SeqObject *s = self->seqs[i];
        if (!s)
            continue;
        uint32_t len = self->lens[i] = vase_seq_len(s->s), cap = vase_seq_capacity(s->s);
        if ((uint64_t)len + self->counts[i] > cap) {
            vpy_raisef(-ENOSPC,
                       "sequence %u holds %u slots of %u: %u more do not fit (a step brings "
                       "at most what its window leaves free)",
                       s->id, len, cap, self->counts[i]);
            goto fail;
        }
        uint32_t need = (uint32_t)(((uint64_t)len + self->counts[i] + B - 1) / B);
        width = need > width ? need : width;
    }
    if (tokens * (width ? width : 1) > BATCH_MAX_TABLE) {
        PyErr_Format(PyExc_ValueError,
                     "%llu tokens of sequences of up to %u blocks in one step: at most %llu "
                     "tokens times blocks (split the step)",
                     (unsigned long long)tokens, width, (unsigned long long)BATCH_MAX_TABLE);
        goto fail;
    }
    if (reserve(self, n, tokens, width ? width : 1) < 0)
        goto fail;
    self->tokens = (uint32_t)tokens;
    self->width = width ? width : 1;
    uint32_t t = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        SeqObject *s = self->seqs[i];
        uint32_t c = self->counts[i];
        if (!s) {
            for (uint32_t j = 0; j < c; j++, t++) {
                self->dest[t] = -1;
                self->offset[t] = 0;
                self->visible[t] = 0;
                for (uint32_t w = 0; w < self->width; w++)
                    self->table[(size_t)t * self->width + w] = -1;
                for (uint32_t l = 0; l < m->layers; l++)
                    self->ring[(size_t)l * tokens + t] = NULL;
            }
            continue;
        }
        const int32_t *tab;
        uint32_t nt;
        int r = vase_seq_block_table(s->s, &tab, &nt);
        if (r < 0) {
            vpy_raisef(r, "sequence %u: its block table: %s", s->id, vase_last_error(s->client->c));
            goto fail;
        }
        uint32_t len = self->lens[i];
        uint64_t pos = vase_seq_position(s->s);
        uint32_t need = (uint32_t)(((uint64_t)len + c + B - 1) / B);
        if (need > nt) {
            vpy_raisef(-ENOSPC, "sequence %u: %u slots need %u blocks, its table has %u", s->id,
                       len + c, need, nt);
            goto fail;
        }
        /* Whether its policy reads queries, and the token from which on a query stays in the
         * ring (the ring holds the latest of them: an entry comes back after a full turn). */
        int has_ring = vase_seq_query_ptr(s->s, 0, pos, 0) != NULL;
        uint32_t ring_from = 0;
        if (has_ring && c) {
            void *last = vase_seq_query_ptr(s->s, 0, pos + c - 1, 0);
            for (ring_from = c - 1; ring_from > 0; ring_from--)
                if (vase_seq_query_ptr(s->s, 0, pos + ring_from - 1, 0) == last)
                    break;
        }
        for (uint32_t w = 0; w < need; w++)
            if (tab[w] < 0 || (uint64_t)tab[w] >= (uint64_t)self->k[0].shape[0]) {
                vpy_raisef(-EPROTO, "sequence %u: block %d of its table is not in the arena", s->id,
                           (int)tab[w]);
                goto fail;
            }
        for (uint32_t j = 0; j < c; j++, t++) {
            uint32_t slot = len + j;
            self->dest[t] = tab[slot / B];
            self->offset[t] = slot % B;
            self->visible[t] = (int32_t)(slot + 1);
            int32_t *row = self->table + (size_t)t * self->width;
            for (uint32_t w = 0; w < self->width; w++)
                row[w] = w < need ? tab[w] : -1;
            for (uint32_t l = 0; l < m->layers; l++)
                self->ring[(size_t)l * tokens + t] =
                    has_ring && j >= ring_from ? vase_seq_query_ptr(s->s, l, pos + j, 0) : NULL;
        }
    }
    self->active = 1;
    Py_RETURN_NONE;
fail:
    release(self);
    return NULL;
}

/* Checks one of layer()'s tensors: float32, [>= tokens, heads, head_dim], its last two
 * dimensions dense (rows may be strided, as slices of a fused QKV projection are). */
static int flat_rows(const struct vpy_dl *x, uint32_t tokens, uint32_t heads, uint32_t d,
                     int64_t *ret_row) {
    if (!vpy_dl_is(x, kDLFloat, 32)) {
        PyErr_Format(PyExc_TypeError, "%s must be float32", x->name);
        return -1;
    }
    if (x->t->ndim != 3 || x->t->shape[0] < tokens || x->t->shape[1] != heads ||
        x->t->shape[2] != d) {
        PyErr_Format(PyExc_ValueError,
                     "%s must be [tokens, %u, %u] with at least the step's %u tokens", x->name,
                     heads, d, tokens);
        return -1;
    }
    if (!vpy_dl_dense_from(x, 1) || (tokens > 1 && vpy_dl_stride(x, 0) < (int64_t)heads * d)) {
        PyErr_Format(PyExc_ValueError,
                     "%s: each token's [%u, %u] must be dense, and tokens must not overlap",
                     x->name, heads, d);
        return -1;
    }
    if (!vpy_dl_data(x))
        return -1;
    *ret_row = tokens > 1 ? vpy_dl_stride(x, 0) : (int64_t)heads * d;
    return 0;
}

/* layer(layer, q, k, v, out, scale, threads=1). */
static PyObject *batch_layer(BatchObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"layer", "q", "k", "v", "out", "scale", "threads", NULL};
    PyObject *ol, *o[4], *othreads = NULL;
    double scale;
    uint32_t layer, threads = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOd|O:layer", kwlist, &ol, &o[0], &o[1], &o[2],
                                     &o[3], &scale, &othreads) ||
        vpy_get_u32(ol, "layer", &layer) < 0 ||
        (othreads && vpy_get_u32(othreads, "threads", &threads) < 0))
        return NULL;
    ModelObject *m = self->model;
    if (idle(self) < 0)
        return NULL;
    if (!self->active) {
        PyErr_SetString(PyExc_RuntimeError, "Batch.layer(): no step begun (begin())");
        return NULL;
    }
    if (layer >= m->layers) {
        PyErr_Format(PyExc_ValueError, "layer %u: the model has %u", layer, m->layers);
        return NULL;
    }
    if (!isfinite(scale) || !isfinite((float)scale)) {
        PyErr_SetString(PyExc_ValueError, "scale is not a finite float32");
        return NULL;
    }
    static const char *names[] = {"q", "k", "v", "out"};
    struct vpy_dl x[4] = {0};
    int64_t row[4];
    const uint32_t heads[4] = {m->q_heads, m->kv_heads, m->kv_heads, m->q_heads};
    PyObject *ret = NULL;
    for (int i = 0; i < 4; i++)
        if (vpy_dl_take(o[i], names[i], &x[i]) < 0 ||
            flat_rows(&x[i], self->tokens, heads[i], m->head_dim, &row[i]) < 0)
            goto done;
    if (row[3] != (int64_t)m->q_heads * m->head_dim) {
        PyErr_SetString(PyExc_ValueError, "out must be contiguous");
        goto done;
    }
    const float *q = vpy_dl_data(&x[0]), *k = vpy_dl_data(&x[1]), *v = vpy_dl_data(&x[2]);
    float *out = (float *)vpy_dl_data(&x[3]);
    const struct vase_tensor *kt = &self->k[layer], *vt = &self->v[layer];
    struct vase_attend_cache c = {
        .k = kt->data,
        .v = vt->data,
        .dtype = VASE_ATTEND_F32,
        .blocks = (uint32_t)kt->shape[0],
        .block_tokens = (uint32_t)kt->shape[1],
        .kv_heads = (uint32_t)kt->shape[2],
        .head_dim = (uint32_t)kt->shape[3],
    };
    for (int i = 0; i < 3; i++) {
        c.k_stride[i] = kt->strides[i];
        c.v_stride[i] = vt->strides[i];
    }
    const size_t qrow = (size_t)m->q_heads * m->head_dim, kvrow = (size_t)m->kv_heads * m->head_dim;
    const uint32_t T = self->tokens;
    struct vase_attend_batch bt = {
        .q = row[0] == (int64_t)qrow ? q : self->qbuf,
        .table = self->table,
        .visible = self->visible,
        .b = T,
        .n = 1,
        .q_heads = m->q_heads,
        .width = self->width,
        .scale = (float)scale,
    };
    char why[256] = "";
    int r = 0;
    void **ring = self->ring + (size_t)layer * T;
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS
        /* The new tokens' K and V, and the queries the policies read, into the arena; then the
         * attention over every slot each token's query sees, its own included. */
        for (uint32_t t = 0; t < T; t++) {
            if (self->dest[t] < 0)
                continue;
            int64_t at =
                (int64_t)self->dest[t] * kt->strides[0] + (int64_t)self->offset[t] * kt->strides[1];
            memcpy((float *)kt->data + at, k + (size_t)t * row[1], kvrow * sizeof(float));
            at =
                (int64_t)self->dest[t] * vt->strides[0] + (int64_t)self->offset[t] * vt->strides[1];
            memcpy((float *)vt->data + at, v + (size_t)t * row[2], kvrow * sizeof(float));
            if (ring[t])
                memcpy(ring[t], q + (size_t)t * row[0], qrow * sizeof(float));
        }
        if (bt.q == self->qbuf)
            for (uint32_t t = 0; t < T; t++)
                memcpy(self->qbuf + (size_t)t * qrow, q + (size_t)t * row[0], qrow * sizeof(float));
        if (T)
            r = vpy_attend(&c, &bt, out, threads, why, sizeof(why));
    Py_END_ALLOW_THREADS
    self->busy = 0;
    if (r == -ENOMEM)
        PyErr_NoMemory();
    else if (r < 0)
        PyErr_Format(PyExc_RuntimeError, "Batch.layer(): %s", why);
    else
        ret = Py_NewRef(Py_None);
done:
    for (int i = 0; i < 4; i++)
        vpy_dl_release(&x[i]);
    return ret;
}

/* finish(): each sequence counts its tokens and applies a ready plan. Returns the failures, a
 * list of (index in begin()'s list, errno, message); the others went on. */
static PyObject *batch_finish(BatchObject *self, PyObject *unused) {
    (void)unused;
    if (idle(self) < 0)
        return NULL;
    if (!self->active) {
        PyErr_SetString(PyExc_RuntimeError, "Batch.finish(): no step begun (begin())");
        return NULL;
    }
    Py_ssize_t n = self->nseq;
    int *rc = calloc(n ? (size_t)n : 1, sizeof(int));
    struct errbuf *e = calloc(n ? (size_t)n : 1, sizeof(struct errbuf));
    if (!rc || !e) {
        free(rc);
        free(e);
        release(self);
        return PyErr_NoMemory();
    }
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            SeqObject *s = self->seqs[i];
            if (!s)
                continue;
            int r = self->counts[i] ? vase_seq_append(s->s, self->counts[i]) : 0;
            if (r >= 0)
                r = vase_seq_poll(s->s);
            if (r < 0) {
                rc[i] = r;
                vpy_save_error(s->client->c, &e[i]);
            }
        }
    Py_END_ALLOW_THREADS
    self->busy = 0;
    release(self);
    PyObject *failed = PyList_New(0);
    for (Py_ssize_t i = 0; failed && i < n; i++) {
        if (!rc[i])
            continue;
        PyObject *item = Py_BuildValue("(nis)", i, -rc[i], e[i].msg);
        if (!item || PyList_Append(failed, item) < 0)
            Py_CLEAR(failed);
        Py_XDECREF(item);
    }
    free(rc);
    free(e);
    return failed;
}

/* cancel(): ends a step without counting its tokens (what layer() wrote stays unused). */
static PyObject *batch_cancel(BatchObject *self, PyObject *unused) {
    (void)unused;
    if (idle(self) < 0)
        return NULL;
    release(self);
    Py_RETURN_NONE;
}

static PyObject *batch_get_tokens(BatchObject *self, void *c) {
    (void)c;
    return PyLong_FromUnsignedLong(self->active ? self->tokens : 0);
}

static PyObject *batch_get_active(BatchObject *self, void *c) {
    (void)c;
    return PyBool_FromLong(self->active);
}

static PyMethodDef batch_methods[] = {
    {"begin", (PyCFunction)batch_begin, METH_VARARGS,
     "begin($self, seqs, counts, /)\n--\n\nStarts a step: seqs, a list of Seq of this model "
     "(or None for tokens that are not vase's), and counts, the tokens each brings. Reads each "
     "sequence's length, position and block table once and pins it until finish() or "
     "cancel(). A step still open is cancelled first. VaseError(ENOSPC) when a sequence's new "
     "tokens do not fit its capacity (nothing is pinned then)."},
    {"layer", (PyCFunction)(void (*)(void))batch_layer, METH_VARARGS | METH_KEYWORDS,
     "layer($self, layer, q, k, v, out, scale, threads=1)\n--\n\nOne layer of the step: writes "
     "the new tokens' k and v (float32 [tokens, kv_heads, head_dim], post-RoPE) at each "
     "sequence's next slots and the queries of the policies that read them, then writes to out "
     "(float32 [tokens, q_heads, head_dim], contiguous) the attention of q (float32 [tokens, "
     "q_heads, head_dim]) over the slots each token sees: its sequence's held slots and its "
     "own step's tokens up to itself. Rows of q, k and v may be strided; tensors through DLPack "
     "(an object with __dlpack__, or a capsule), at least the step's tokens long, on the CPU. "
     "threads: OpenMP threads for the attention. Rows of tokens that are not vase's are "
     "zeros."},
    {"finish", (PyCFunction)batch_finish, METH_NOARGS,
     "finish($self, /)\n--\n\nEnds the step: each sequence counts its tokens (Seq.append) and "
     "applies a ready plan (Seq.poll). Returns a list of (index, errno, message), one per "
     "sequence whose calls failed; the others went on."},
    {"cancel", (PyCFunction)batch_cancel, METH_NOARGS,
     "cancel($self, /)\n--\n\nEnds a step without counting its tokens."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef batch_getset[] = {
    {"tokens", (getter)batch_get_tokens, NULL, "The step's tokens (0 outside a step).", NULL},
    {"active", (getter)batch_get_active, NULL, "Whether a step is begun.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot batch_slots[] = {
    {Py_tp_dealloc, batch_dealloc},
    {Py_tp_methods, batch_methods},
    {Py_tp_getset, batch_getset},
    {Py_tp_doc, "A step over many sequences of a host arena, in three calls (Model.batch())."},
    {0, NULL},
};

PyType_Spec vpy_batch_spec = {
    .name = "vase._vase.Batch",
    .basicsize = sizeof(BatchObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = batch_slots,
};
