/* SPDX-License-Identifier: MIT */

/*
 * vase.Seq, a sequence (Model.open()): its pins, which defer the close while a device
 * block-table view or a call in flight needs it, the calls that may wait for the daemon (append,
 * poll, wait, flush, set_budget) with the GIL released, the pushes (stats, draws), the zero-copy
 * views of its slots and block table, and its getters.
 */

#include "_vase.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Ends the sequence in libvase (its pages go back to the daemon). Pins the client meanwhile,
 * so that a disconnect cannot free the sequence under the call. */
static int seq_close_now(SeqObject *self, struct errbuf *e) {
    struct vase_seq *s = self->s;
    self->s = NULL;
    ClientObject *cl = self->client;
    if (!cl->c || cl->closed)
        return 0; /* the disconnect frees it, now or when the client's last pin goes */
    int r;
    cl->pins++;
    Py_BEGIN_ALLOW_THREADS
        r = vase_seq_close(s);
        if (r < 0 && e)
            vpy_save_error(cl->c, e);
    Py_END_ALLOW_THREADS
    vpy_client_unpin(cl);
    return r;
}

int vpy_seq_enter(SeqObject *self) {
    if (self->closed || !self->s) {
        vpy_raisef(-EBADF, "sequence %u is closed", self->id);
        return -1;
    }
    if (vpy_client_enter(self->client) < 0)
        return -1;
    self->pins++;
    return 0;
}

void vpy_seq_unpin(SeqObject *self) {
    if (--self->pins == 0 && self->closed && self->s)
        seq_close_now(self, NULL);
}

void vpy_seq_leave(SeqObject *self) {
    vpy_seq_unpin(self);
    vpy_client_unpin(self->client);
}

static void seq_dealloc(SeqObject *self) {
    PyTypeObject *tp = Py_TYPE((PyObject *)self);
    /* Nothing pins a sequence without a reference to it. */
    if (self->s)
        seq_close_now(self, NULL);
    Py_DECREF((PyObject *)self->model);
    Py_DECREF((PyObject *)self->client);
    PyObject_Free(self);
    Py_DECREF(tp);
}

static PyObject *seq_close(SeqObject *self, PyObject *unused) {
    (void)unused;
    if (self->closed)
        Py_RETURN_NONE;
    self->closed = 1;
    if (self->pins > 0 || !self->s)
        Py_RETURN_NONE;
    struct errbuf e = {""};
    int r = seq_close_now(self, &e);
    if (r < 0)
        return vpy_raise(r, e.msg);
    Py_RETURN_NONE;
}

static PyObject *seq_exit(SeqObject *self, PyObject *args) {
    (void)args;
    return seq_close(self, NULL);
}

/* The calls that may wait for the daemon: 0/1 from libvase, or an error. */
static int seq_call(SeqObject *self, int (*fn)(struct vase_seq *, uint32_t), uint32_t arg) {
    if (vpy_seq_enter(self) < 0)
        return -1;
    struct errbuf e;
    int r;
    Py_BEGIN_ALLOW_THREADS
        r = fn(self->s, arg);
        if (r < 0)
            vpy_save_error(self->client->c, &e);
    Py_END_ALLOW_THREADS
    vpy_seq_leave(self);
    if (r < 0) {
        vpy_raise(r, e.msg);
        return -1;
    }
    return r;
}

static int do_append(struct vase_seq *s, uint32_t n) {
    return vase_seq_append(s, n);
}
static int do_poll(struct vase_seq *s, uint32_t n) {
    (void)n;
    return vase_seq_poll(s);
}
static int do_wait(struct vase_seq *s, uint32_t n) {
    (void)n;
    return vase_seq_wait(s);
}
static int do_flush(struct vase_seq *s, uint32_t n) {
    (void)n;
    return vase_seq_flush(s);
}

static PyObject *seq_append(SeqObject *self, PyObject *arg) {
    uint32_t n;
    if (vpy_get_u32(arg, "n", &n) < 0)
        return NULL;
    int r = seq_call(self, do_append, n);
    return r < 0 ? NULL : PyBool_FromLong(r > 0);
}

static PyObject *seq_poll(SeqObject *self, PyObject *unused) {
    (void)unused;
    int r = seq_call(self, do_poll, 0);
    return r < 0 ? NULL : PyBool_FromLong(r > 0);
}

static PyObject *seq_wait(SeqObject *self, PyObject *unused) {
    (void)unused;
    int r = seq_call(self, do_wait, 0);
    return r < 0 ? NULL : PyBool_FromLong(r > 0);
}

static PyObject *seq_flush(SeqObject *self, PyObject *unused) {
    (void)unused;
    if (seq_call(self, do_flush, 0) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *seq_push_stats(SeqObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"layer", "kind", "values", NULL};
    PyObject *ol, *values;
    const char *kind;
    uint32_t layer;
    enum vase_stats_kind k;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OsO:push_stats", kwlist, &ol, &kind, &values) ||
        vpy_get_u32(ol, "layer", &layer) < 0)
        return NULL;
    if (strcmp(kind, "acc_add") == 0)
        k = VASE_STATS_ACC_ADD;
    else if (strcmp(kind, "window_scores") == 0)
        k = VASE_STATS_WINDOW_SCORES;
    else
        return vpy_raisef(-EINVAL, "unknown stats kind '%s' (acc_add, window_scores)", kind);
    Py_buffer view;
    if (vpy_get_floats(values, "values", &view) < 0)
        return NULL;
    uint32_t heads = self->model->kv_heads;
    if (view.ndim != 2 || view.shape[0] != (Py_ssize_t)heads || view.shape[1] > UINT32_MAX) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "values must have shape [kv_heads=%u][len]", heads);
        return NULL;
    }
    uint32_t len = (uint32_t)view.shape[1];
    if (vpy_seq_enter(self) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    struct errbuf e;
    int r;
    Py_BEGIN_ALLOW_THREADS
        r = vase_seq_push_stats(self->s, layer, k, view.buf, len);
        if (r < 0)
            vpy_save_error(self->client->c, &e);
    Py_END_ALLOW_THREADS
    vpy_seq_leave(self);
    PyBuffer_Release(&view);
    if (r < 0)
        return vpy_raise(r, e.msg);
    Py_RETURN_NONE;
}

static PyObject *seq_set_draws(SeqObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"exp_draws", "gauss", NULL};
    PyObject *oexp = Py_None, *ogauss = Py_None;
    Py_buffer bexp = {0}, bgauss = {0};
    int have_exp = 0, have_gauss = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|OO:set_draws", kwlist, &oexp, &ogauss))
        return NULL;
    if (oexp != Py_None) {
        if (vpy_get_floats(oexp, "exp_draws", &bexp) < 0)
            return NULL;
        have_exp = 1;
    }
    if (ogauss != Py_None) {
        if (vpy_get_floats(ogauss, "gauss", &bgauss) < 0)
            goto fail;
        have_gauss = 1;
    }
    if (vpy_seq_enter(self) < 0)
        goto fail;
    int r =
        vase_seq_set_draws(self->s, have_exp ? bexp.buf : NULL, have_exp ? (size_t)bexp.len / 4 : 0,
                           have_gauss ? bgauss.buf : NULL, have_gauss ? (size_t)bgauss.len / 4 : 0);
    struct errbuf e;
    if (r < 0)
        vpy_save_error(self->client->c, &e);
    vpy_seq_leave(self);
    if (have_exp)
        PyBuffer_Release(&bexp);
    if (have_gauss)
        PyBuffer_Release(&bgauss);
    if (r < 0)
        return vpy_raise(r, e.msg);
    Py_RETURN_NONE;
fail:
    if (have_exp)
        PyBuffer_Release(&bexp);
    return NULL;
}

static PyObject *seq_block_table(SeqObject *self, PyObject *unused) {
    (void)unused;
    if (vpy_seq_enter(self) < 0)
        return NULL;
    const int32_t *table;
    uint32_t n;
    struct errbuf e;
    int32_t *copy = NULL;
    int r = vase_seq_block_table(self->s, &table, &n);
    if (r < 0)
        vpy_save_error(self->client->c, &e);
    else if ((copy = malloc((n ? n : 1) * sizeof(*copy))) != NULL)
        memcpy(copy, table, n * sizeof(*copy));
    vpy_seq_leave(self);
    if (r < 0)
        return vpy_raise(r, e.msg);
    if (!copy)
        return PyErr_NoMemory();
    int64_t shape = n, stride = 1;
    TensorObject *t = vpy_tensor_new(NULL, NULL, copy, (DLDataType){kDLInt, 32, 1},
                                     vpy_dl_device(-1), 1, &shape, &stride);
    if (!t) {
        free(copy);
        return NULL;
    }
    t->owned = copy;
    return (PyObject *)t;
}

static PyObject *seq_block_table_device(SeqObject *self, PyObject *unused) {
    (void)unused;
    if (vpy_seq_enter(self) < 0)
        return NULL;
    const int32_t *table, *dev = vase_seq_block_table_device(self->s);
    uint32_t n = 0;
    struct errbuf e;
    int r = 0;
    if (dev && (r = vase_seq_block_table(self->s, &table, &n)) < 0)
        vpy_save_error(self->client->c, &e);
    PyObject *ret;
    if (r < 0)
        ret = vpy_raise(r, e.msg);
    else if (!dev) {
        Py_INCREF(Py_None);
        ret = Py_None;
    } else {
        int64_t shape = n, stride = 1;
        ret =
            (PyObject *)vpy_tensor_new(self->client, self, (void *)dev, (DLDataType){kDLInt, 32, 1},
                                       self->model->device, 1, &shape, &stride);
    }
    vpy_seq_leave(self);
    return ret;
}

static PyObject *seq_query_slot(SeqObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"layer", "pos", NULL};
    PyObject *ol, *op;
    uint32_t layer;
    unsigned long long pos;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO:query_slot", kwlist, &ol, &op) ||
        vpy_get_u32(ol, "layer", &layer) < 0 || vpy_get_int(op, "pos", 0, UINT64_MAX, &pos) < 0 ||
        vpy_seq_enter(self) < 0)
        return NULL;
    ModelObject *m = self->model;
    void *p = vase_seq_query_ptr(self->s, layer, pos, 0);
    PyObject *ret;
    if (!p && layer >= m->layers)
        ret = vpy_raisef(-EINVAL, "no query slot: layer %u, but the model has %u layers", layer,
                         m->layers);
    else if (!p && !(vase_policy_needs(self->policy) & VASE_NEEDS_Q)) {
        char with[256] = "";
        size_t n = 0;
        for (int q = 0; q < _VASE_POLICY_MAX && n < sizeof(with); q++)
            if (vase_policy_needs((enum vase_policy)q) & VASE_NEEDS_Q)
                n += (size_t)snprintf(with + n, sizeof(with) - n, "%s%s", n ? ", " : "",
                                      vase_policy_to_string((enum vase_policy)q));
        ret = vpy_raisef(-EINVAL,
                         "no query slot: policy %s reads no queries, so its sequences keep no "
                         "query ring (the policies that do: %s)",
                         vase_policy_to_string(self->policy), with);
    } else if (!p)
        ret = vpy_raisef(-EINVAL, "no query slot for layer %u at position %llu", layer, pos);
    else {
        int64_t shape[2] = {m->q_heads, m->head_dim}, strides[2] = {m->head_dim, 1};
        ret = (PyObject *)vpy_tensor_new(self->client, NULL, p, vpy_dl_dtype(m->dtype), m->device,
                                         2, shape, strides);
    }
    vpy_seq_leave(self);
    return ret;
}

static PyObject *seq_kv_slot(SeqObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"layer", "kv", "slot", NULL};
    PyObject *ol, *okv, *os;
    uint32_t layer, slot;
    enum vase_kv kv;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO:kv_slot", kwlist, &ol, &okv, &os) ||
        vpy_get_u32(ol, "layer", &layer) < 0 || vpy_get_kv(okv, &kv) < 0 ||
        vpy_get_u32(os, "slot", &slot) < 0 || vpy_seq_enter(self) < 0)
        return NULL;
    ModelObject *m = self->model;
    void *p = vase_seq_kv_ptr(self->s, layer, kv, slot, 0);
    PyObject *ret;
    if (!p)
        ret = vpy_raisef(-EINVAL, "no KV slot: layer %u of %u, slot %u of capacity %u", layer,
                         m->layers, slot, vase_seq_capacity(self->s));
    else {
        int64_t shape[2] = {m->kv_heads, m->head_dim}, strides[2] = {m->head_dim, 1};
        ret = (PyObject *)vpy_tensor_new(self->client, NULL, p, vpy_dl_dtype(m->dtype), m->device,
                                         2, shape, strides);
    }
    vpy_seq_leave(self);
    return ret;
}

static PyObject *seq_get_id(SeqObject *self, void *c) {
    (void)c;
    return PyLong_FromUnsignedLong(self->id);
}

static PyObject *seq_get_closed(SeqObject *self, void *c) {
    (void)c;
    return PyBool_FromLong(self->closed);
}

/* The getters take the client's mutex, which a wait on another thread may hold: the GIL is
 * released meanwhile. */
#define SEQ_GET(name, type, conv)                                                                  \
    static PyObject *seq_get_##name(SeqObject *self, void *c) {                                    \
        (void)c;                                                                                   \
        if (vpy_seq_enter(self) < 0)                                                               \
            return NULL;                                                                           \
        type v;                                                                                    \
        Py_BEGIN_ALLOW_THREADS                                                                     \
            v = vase_seq_##name(self->s);                                                          \
        Py_END_ALLOW_THREADS                                                                       \
        vpy_seq_leave(self);                                                                       \
        return conv(v);                                                                            \
    }
SEQ_GET(len, uint32_t, PyLong_FromUnsignedLong)
SEQ_GET(capacity, uint32_t, PyLong_FromUnsignedLong)
SEQ_GET(position, uint64_t, PyLong_FromUnsignedLongLong)
SEQ_GET(rounds, uint32_t, PyLong_FromUnsignedLong)
SEQ_GET(budget, uint32_t, PyLong_FromUnsignedLong)
SEQ_GET(min_budget, uint32_t, PyLong_FromUnsignedLong)

static PyObject *seq_get_label(SeqObject *self, void *c) {
    (void)c;
    if (vpy_seq_enter(self) < 0)
        return NULL;
    /* Set once, at the open: read without the client's mutex. */
    PyObject *r = PyUnicode_FromString(vase_seq_label(self->s));
    vpy_seq_leave(self);
    return r;
}

static int do_set_budget(struct vase_seq *s, uint32_t budget) {
    return vase_seq_set_budget(s, budget);
}

static PyObject *seq_set_budget(SeqObject *self, PyObject *arg) {
    uint32_t budget;
    if (vpy_get_u32(arg, "budget", &budget) < 0 || seq_call(self, do_set_budget, budget) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *seq_get_stats(SeqObject *self, void *c) {
    (void)c;
    if (vpy_seq_enter(self) < 0)
        return NULL;
    struct vase_seq_stats st = {0};
    Py_BEGIN_ALLOW_THREADS
        vase_seq_get_stats(self->s, &st);
    Py_END_ALLOW_THREADS
    vpy_seq_leave(self);
    return Py_BuildValue("{sKsKsdsdsdsK}", "evictions", (unsigned long long)st.evictions, "stalls",
                         (unsigned long long)st.stalls, "stall_seconds", st.stall_seconds,
                         "compact_seconds", st.compact_seconds, "last_plan_seconds",
                         st.last_plan_seconds, "budget_changes",
                         (unsigned long long)st.budget_changes);
}

static PyMethodDef seq_methods[] = {
    {"append", (PyCFunction)seq_append, METH_O,
     "append($self, n, /)\n--\n\nCounts n tokens written at slots len .. len + n - 1 "
     "(vase_seq_append). True if a plan was applied."},
    {"poll", (PyCFunction)seq_poll, METH_NOARGS,
     "poll($self, /)\n--\n\nApplies a ready plan without waiting. True if one was applied."},
    {"wait", (PyCFunction)seq_wait, METH_NOARGS,
     "wait($self, /)\n--\n\nWaits for the pending plan and applies it. True if one was applied."},
    {"set_budget", (PyCFunction)seq_set_budget, METH_O,
     "set_budget($self, budget, /)\n--\n\nCaps the budget of an elastic sequence "
     "(vase_seq_set_budget): a multiple of window in [min_budget, the budget it was opened "
     "with], else VaseError(EINVAL). A cap below the budget now takes effect with the next "
     "plan; a higher one lets the budget grow back at a later commit, when memory is free. "
     "Waits for the daemon's answer."},
    {"flush", (PyCFunction)seq_flush, METH_NOARGS,
     "flush($self, /)\n--\n\nWaits until the daemon handled everything sent for the sequence."},
    {"close", (PyCFunction)seq_close, METH_NOARGS,
     "close($self, /)\n--\n\nEnds the sequence; idempotent. Deferred while a device block-table "
     "view of it is alive."},
    {"push_stats", (PyCFunction)(void (*)(void))seq_push_stats, METH_VARARGS | METH_KEYWORDS,
     "push_stats($self, layer, kind, values)\n--\n\nkind 'acc_add' or 'window_scores'; values a "
     "C-contiguous float32 buffer [kv_heads][len]."},
    {"set_draws", (PyCFunction)(void (*)(void))seq_set_draws, METH_VARARGS | METH_KEYWORDS,
     "set_draws($self, exp_draws=None, gauss=None)\n--\n\nThe draws of the next eviction "
     "request (float32 buffers)."},
    {"block_table", (PyCFunction)seq_block_table, METH_NOARGS,
     "block_table($self, /)\n--\n\nThe block table, an int32 Tensor [n] on the host: a copy "
     "owned by the tensor (libvase replaces its table when it shrinks)."},
    {"block_table_device", (PyCFunction)seq_block_table_device, METH_NOARGS,
     "block_table_device($self, /)\n--\n\nThe device copy of the block table on a CUDA arena "
     "(zero-copy, its first n entries), or None on the host arena."},
    {"query_slot", (PyCFunction)(void (*)(void))seq_query_slot, METH_VARARGS | METH_KEYWORDS,
     "query_slot($self, layer, pos)\n--\n\nZero-copy Tensor [q_heads][head_dim] of the query "
     "ring entry of the token at position pos."},
    {"kv_slot", (PyCFunction)(void (*)(void))seq_kv_slot, METH_VARARGS | METH_KEYWORDS,
     "kv_slot($self, layer, kv, slot)\n--\n\nZero-copy Tensor [kv_heads][head_dim] of K or V "
     "of one slot."},
    {"__enter__", vpy_self_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)seq_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef seq_getset[] = {
    {"id", (getter)seq_get_id, NULL, "The sequence id.", NULL},
    {"closed", (getter)seq_get_closed, NULL, "Whether close() was called.", NULL},
    {"len", (getter)seq_get_len, NULL, "Slots filled now.", NULL},
    {"capacity", (getter)seq_get_capacity, NULL, "Slots the block table holds now.", NULL},
    {"position", (getter)seq_get_position, NULL, "Tokens appended since the open.", NULL},
    {"rounds", (getter)seq_get_rounds, NULL, "Eviction rounds applied.", NULL},
    {"budget", (getter)seq_get_budget, NULL,
     "The budget its plans keep now: between min_budget and the budget it was opened with for "
     "an elastic sequence (it changes at eviction boundaries), that budget otherwise.",
     NULL},
    {"min_budget", (getter)seq_get_min_budget, NULL,
     "The least budget it accepts (its budget when it is not elastic).", NULL},
    {"label", (getter)seq_get_label, NULL,
     "The label it was opened with (Model.open()'s label=), \"\" when none.", NULL},
    {"stats", (getter)seq_get_stats, NULL,
     "vase_seq_get_stats() as a dict: evictions, stalls, stall_seconds, compact_seconds, "
     "last_plan_seconds, budget_changes (plans that lowered the budget, commits that raised it).",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot seq_slots[] = {
    {Py_tp_dealloc, seq_dealloc},
    {Py_tp_methods, seq_methods},
    {Py_tp_getset, seq_getset},
    {Py_tp_doc, "A sequence (Model.open())."},
    {0, NULL},
};

PyType_Spec vpy_seq_spec = {
    .name = "vase.Seq",
    .basicsize = sizeof(SeqObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = seq_slots,
};
