/* SPDX-License-Identifier: MIT */

/*
 * The Python binding of libvase, on CPython's limited API (abi3, 3.11: the buffer protocol
 * joined it then). It owns four types: Client, Model, Seq and Tensor, a DLPack producer of
 * zero-copy views of the arena.
 *
 * Lifetimes. libvase owns models and sequences through their client, and vase_disconnect()
 * frees them and unmaps the arenas. So every Python object that reaches C memory holds a strong
 * reference to its Client, and whatever needs the C client to stay alive "pins" it: a Tensor
 * for its whole life (and with it every DLPack capsule it exported, whose manager_ctx holds the
 * Tensor until the consumer calls the deleter), and each call while it runs with the GIL
 * released. Client.close() marks the client closed (every later call refuses with EBADF) and
 * disconnects at once when nothing pins it, else when the last pin goes. Seq.close() does the
 * same with the sequence for the views and calls that pin it. Invariant: ClientObject.c is
 * non-NULL exactly until vase_disconnect() runs, and SeqObject.s is valid only while it is
 * non-NULL and its client's c is.
 */

#define Py_LIMITED_API 0x030B0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlpack/dlpack.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vase.h"

PyMODINIT_FUNC PyInit__vase(void);

static PyObject *VaseError; /* vase.VaseError, registered by vase/__init__.py */
static PyTypeObject *ClientType, *ModelType, *SeqType, *TensorType;

typedef struct {
    PyObject_HEAD struct vase_client *c; /* NULL once disconnected */
    int closed;                          /* close() was called */
    Py_ssize_t pins;                     /* tensors and calls in flight that need c */
    uint32_t id;
    uint64_t incarnation;
} ClientObject;

typedef struct {
    PyObject_HEAD ClientObject *client;
    struct vase_model *m; /* the client's */
    uint32_t layers, q_heads, kv_heads, head_dim, block_tokens, arena;
    enum vase_dtype dtype;
    uint64_t page_bytes;
    DLDevice device;
} ModelObject;

typedef struct {
    PyObject_HEAD ClientObject *client;
    ModelObject *model;
    struct vase_seq *s; /* NULL once closed in libvase */
    int closed;         /* close() was called */
    Py_ssize_t pins;    /* device block-table views and calls in flight */
    uint32_t id;
    enum vase_policy policy; /* as opened, for the messages of query_slot() */
} SeqObject;

typedef struct {
    PyObject_HEAD ClientObject *client; /* pinned while the tensor lives; NULL if owned */
    SeqObject *seq;                     /* pinned likewise, or NULL */
    void *data;
    void *owned; /* memory the tensor owns (a copied block table), or NULL */
    DLDataType dtype;
    DLDevice device;
    int32_t ndim;
    int64_t shape[4];
    int64_t strides[4];
} TensorObject;

/* ---- errors ---- */

/* Raises VaseError(errno, vase_strerror(), message) for err (negative or positive). */
static PyObject *raise_vase(int err, const char *message) {
    int e = err < 0 ? -err : err;
    if (!VaseError) {
        PyErr_SetString(PyExc_RuntimeError, "vase._vase used without the vase package");
        return NULL;
    }
    PyObject *exc =
        PyObject_CallFunction(VaseError, "iss", e, vase_strerror(-e), message ? message : "");
    if (exc) {
        PyErr_SetObject(VaseError, exc);
        Py_DECREF(exc);
    }
    return NULL;
}

static PyObject *raise_vasef(int err, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    return raise_vase(err, buf);
}

/* The message of the last failed call, copied at once (another thread's call replaces it). */
struct errbuf {
    char msg[512];
};

static void save_error(struct vase_client *c, struct errbuf *e) {
    snprintf(e->msg, sizeof(e->msg), "%s", vase_last_error(c));
}

static PyObject *set_error_type(PyObject *mod, PyObject *cls) {
    (void)mod;
    if (!PyType_Check(cls) || !PyObject_IsSubclass(cls, PyExc_OSError)) {
        PyErr_SetString(PyExc_TypeError, "want a subclass of OSError");
        return NULL;
    }
    Py_INCREF(cls);
    PyObject *old = VaseError;
    VaseError = cls;
    Py_XDECREF(old);
    Py_RETURN_NONE;
}

/* ---- argument conversion ---- */

/* An integer in [lo, hi]; ValueError outside, TypeError for a non-integer. */
static int get_int(PyObject *o, const char *what, long long lo, unsigned long long hi,
                   unsigned long long *ret) {
    PyObject *i = PyNumber_Index(o);
    if (!i)
        return -1;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(i, &overflow);
    if (overflow > 0) {
        unsigned long long u = PyLong_AsUnsignedLongLong(i);
        Py_DECREF(i);
        if (PyErr_Occurred() || u > hi) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "%s out of range", what);
            return -1;
        }
        *ret = u;
        return 0;
    }
    Py_DECREF(i);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (overflow < 0 || v < lo || (v >= 0 && (unsigned long long)v > hi)) {
        PyErr_Format(PyExc_ValueError, "%s out of range (%lld..%llu)", what, lo, hi);
        return -1;
    }
    *ret = (unsigned long long)v;
    return 0;
}

static int get_u32(PyObject *o, const char *what, uint32_t *ret) {
    unsigned long long v;
    if (get_int(o, what, 0, UINT32_MAX, &v) < 0)
        return -1;
    *ret = (uint32_t)v;
    return 0;
}

/* Optional arguments: NULL or None leave *ret alone. */
static int opt_u32(PyObject *o, const char *what, uint32_t *ret) {
    return !o || o == Py_None ? 0 : get_u32(o, what, ret);
}

static int opt_float(PyObject *o, const char *what, float *ret) {
    if (!o || o == Py_None)
        return 0;
    double d = PyFloat_AsDouble(o);
    if (d == -1.0 && PyErr_Occurred()) {
        PyErr_Format(PyExc_TypeError, "%s must be a number", what);
        return -1;
    }
    *ret = (float)d;
    return 0;
}

/* A str argument as UTF-8 (owned by o). */
static const char *get_str(PyObject *o, const char *what) {
    if (!PyUnicode_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be a str", what);
        return NULL;
    }
    return PyUnicode_AsUTF8AndSize(o, NULL);
}

static int get_kv(PyObject *o, enum vase_kv *ret) {
    const char *s = get_str(o, "kv");
    if (!s)
        return -1;
    if (strcmp(s, "k") == 0 || strcmp(s, "v") == 0) {
        *ret = s[0] == 'k' ? VASE_K : VASE_V;
        return 0;
    }
    raise_vasef(-EINVAL, "kv '%s': want \"k\" or \"v\"", s);
    return -1;
}

/* A C-contiguous float32 buffer of o; release with PyBuffer_Release. */
static int get_floats(PyObject *o, const char *what, Py_buffer *view) {
    if (PyObject_GetBuffer(o, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must expose a C-contiguous float32 buffer", what);
        return -1;
    }
    const char *f = view->format ? view->format : "B";
    if (view->itemsize != 4 || !(strcmp(f, "f") == 0 || strcmp(f, "=f") == 0 ||
                                 strcmp(f, "<f") == 0 || strcmp(f, "@f") == 0)) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_TypeError, "%s must be float32 (buffer format '%s')", what, f);
        return -1;
    }
    return 0;
}

/* ---- pins ---- */

static void disconnect_now(ClientObject *self) {
    struct vase_client *c = self->c;
    self->c = NULL;
    Py_BEGIN_ALLOW_THREADS
        vase_disconnect(c);
    Py_END_ALLOW_THREADS
}

static void client_unpin(ClientObject *self) {
    if (--self->pins == 0 && self->closed && self->c)
        disconnect_now(self);
}

/* Pins the client for a call; EBADF if it was closed. */
static int client_enter(ClientObject *self) {
    if (self->closed || !self->c) {
        raise_vase(-EBADF, "the client is closed");
        return -1;
    }
    self->pins++;
    return 0;
}

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
            save_error(cl->c, e);
    Py_END_ALLOW_THREADS
    client_unpin(cl);
    return r;
}

static int seq_enter(SeqObject *self) {
    if (self->closed || !self->s) {
        raise_vasef(-EBADF, "sequence %u is closed", self->id);
        return -1;
    }
    if (client_enter(self->client) < 0)
        return -1;
    self->pins++;
    return 0;
}

static void seq_leave(SeqObject *self) {
    if (--self->pins == 0 && self->closed && self->s)
        seq_close_now(self, NULL);
    client_unpin(self->client);
}

/* ---- Tensor ---- */

static TensorObject *tensor_new(ClientObject *client, SeqObject *seq, void *data, DLDataType dtype,
                                DLDevice device, int32_t ndim, const int64_t *shape,
                                const int64_t *strides) {
    TensorObject *t = PyObject_New(TensorObject, TensorType);
    if (!t)
        return NULL;
    t->client = client;
    t->seq = seq;
    if (client) {
        Py_INCREF((PyObject *)client);
        client->pins++;
    }
    if (seq) {
        Py_INCREF((PyObject *)seq);
        seq->pins++;
    }
    t->data = data;
    t->owned = NULL;
    t->dtype = dtype;
    t->device = device;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        t->strides[i] = strides[i];
    }
    return t;
}

static void tensor_dealloc(TensorObject *self) {
    PyTypeObject *tp = Py_TYPE((PyObject *)self);
    SeqObject *seq = self->seq;
    ClientObject *client = self->client;
    if (seq) {
        if (--seq->pins == 0 && seq->closed && seq->s)
            seq_close_now(seq, NULL);
        Py_DECREF((PyObject *)seq);
    }
    if (client) {
        client_unpin(client);
        Py_DECREF((PyObject *)client);
    }
    free(self->owned);
    PyObject_Free(self);
    Py_DECREF(tp);
}

/* The consumer is done with the tensor: drop the reference manager_ctx holds. The consumer may
 * call this from any thread, with or without the GIL. */
static void dl_deleter(DLManagedTensor *mt) {
    if (Py_IsInitialized()) {
        PyGILState_STATE g = PyGILState_Ensure();
        Py_XDECREF((PyObject *)mt->manager_ctx);
        PyGILState_Release(g);
    }
    free(mt);
}

/* A capsule nobody consumed still owns its DLManagedTensor; a consumed one was renamed
 * "used_dltensor" and belongs to the consumer. */
static void capsule_destructor(PyObject *cap) {
    if (PyCapsule_IsValid(cap, "dltensor")) {
        DLManagedTensor *mt = PyCapsule_GetPointer(cap, "dltensor");
        if (mt && mt->deleter)
            mt->deleter(mt);
    }
}

static PyObject *tensor_dlpack(TensorObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"stream", "max_version", "dl_device", "copy", NULL};
    PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None, *copy = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$OOOO:__dlpack__", kwlist, &stream, &max_version,
                                     &dl_device, &copy))
        return NULL;
    /* stream is not used: libvase has finished every operation on the arena when its calls
     * return (vase.h, "Ordering"), so there is nothing to order on the consumer's stream. The
     * capsule is an unversioned "dltensor" whatever max_version asks, as the array API allows;
     * a view is never copied, nor moved to another device. */
    if (copy != Py_None && PyObject_IsTrue(copy)) {
        PyErr_SetString(PyExc_BufferError, "vase tensors are views: copy=True is not supported");
        return NULL;
    }
    if (dl_device != Py_None) {
        PyObject *mine =
            Py_BuildValue("(ii)", (int)self->device.device_type, (int)self->device.device_id);
        int same = mine ? PyObject_RichCompareBool(mine, dl_device, Py_EQ) : -1;
        Py_XDECREF(mine);
        if (same < 0)
            return NULL;
        if (!same) {
            PyErr_SetString(PyExc_BufferError, "vase tensors are views: no other dl_device");
            return NULL;
        }
    }
    DLManagedTensor *mt = malloc(sizeof(*mt) + 2 * (size_t)self->ndim * sizeof(int64_t));
    if (!mt)
        return PyErr_NoMemory();
    int64_t *shape = (int64_t *)(mt + 1), *strides = shape + self->ndim;
    for (int i = 0; i < self->ndim; i++) {
        shape[i] = self->shape[i];
        strides[i] = self->strides[i];
    }
    *mt = (DLManagedTensor){
        .dl_tensor = {.data = self->data,
                      .device = self->device,
                      .ndim = self->ndim,
                      .dtype = self->dtype,
                      .shape = shape,
                      .strides = strides,
                      .byte_offset = 0},
        .manager_ctx = self,
        .deleter = dl_deleter,
    };
    Py_INCREF((PyObject *)self);
    PyObject *cap = PyCapsule_New(mt, "dltensor", capsule_destructor);
    if (!cap)
        dl_deleter(mt);
    return cap;
}

static PyObject *tensor_dlpack_device(TensorObject *self, PyObject *unused) {
    (void)unused;
    return Py_BuildValue("(ii)", (int)self->device.device_type, (int)self->device.device_id);
}

static PyObject *int_tuple(const int64_t *v, int n) {
    PyObject *t = PyTuple_New(n);
    if (!t)
        return NULL;
    for (int i = 0; i < n; i++) {
        PyObject *x = PyLong_FromLongLong(v[i]);
        if (!x) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SetItem(t, i, x);
    }
    return t;
}

static PyObject *tensor_shape(TensorObject *self, void *c) {
    (void)c;
    return int_tuple(self->shape, self->ndim);
}

static PyObject *tensor_strides(TensorObject *self, void *c) {
    (void)c;
    return int_tuple(self->strides, self->ndim);
}

static const char *dl_dtype_name(DLDataType t) {
    if (t.code == kDLFloat && t.bits == 32)
        return "f32";
    if (t.code == kDLFloat && t.bits == 16)
        return "f16";
    if (t.code == kDLBfloat && t.bits == 16)
        return "bf16";
    return "int32";
}

static PyObject *tensor_dtype(TensorObject *self, void *c) {
    (void)c;
    return PyUnicode_FromString(dl_dtype_name(self->dtype));
}

static PyObject *tensor_device(TensorObject *self, void *c) {
    (void)c;
    if (self->device.device_type == kDLCPU)
        return PyUnicode_FromString("cpu");
    return PyUnicode_FromFormat("cuda:%d", (int)self->device.device_id);
}

static PyObject *tensor_address(TensorObject *self, void *c) {
    (void)c;
    return PyLong_FromVoidPtr(self->data);
}

static PyObject *tensor_ndim(TensorObject *self, void *c) {
    (void)c;
    return PyLong_FromLong(self->ndim);
}

static PyObject *tensor_repr(TensorObject *self) {
    PyObject *shape = tensor_shape(self, NULL);
    if (!shape)
        return NULL;
    PyObject *r =
        PyUnicode_FromFormat("<vase.Tensor %s %R on %s at %p>", dl_dtype_name(self->dtype), shape,
                             self->device.device_type == kDLCPU ? "cpu" : "cuda", self->data);
    Py_DECREF(shape);
    return r;
}

static PyMethodDef tensor_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))tensor_dlpack, METH_VARARGS | METH_KEYWORDS,
     "__dlpack__($self, /, *, stream=None, max_version=None, dl_device=None, copy=None)\n--\n\n"
     "A DLPack capsule (unversioned, \"dltensor\") of the view, zero-copy. stream is accepted "
     "and not used: libvase's work on the arena is complete when its calls return. copy=True "
     "and another dl_device raise BufferError."},
    {"__dlpack_device__", (PyCFunction)tensor_dlpack_device, METH_NOARGS,
     "__dlpack_device__($self, /)\n--\n\n(DLPack device type, device ordinal): (1, 0) for host "
     "memory, (2, ordinal) for a CUDA arena."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef tensor_getset[] = {
    {"shape", (getter)tensor_shape, NULL, "Shape, a tuple of ints.", NULL},
    {"strides", (getter)tensor_strides, NULL, "Strides in elements, a tuple of ints.", NULL},
    {"dtype", (getter)tensor_dtype, NULL, "\"f32\", \"f16\", \"bf16\" or \"int32\".", NULL},
    {"device", (getter)tensor_device, NULL, "\"cpu\" or \"cuda:N\".", NULL},
    {"address", (getter)tensor_address, NULL,
     "Address of element 0 (a device address on a CUDA "
     "arena).",
     NULL},
    {"ndim", (getter)tensor_ndim, NULL, "Number of dimensions.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot tensor_slots[] = {
    {Py_tp_dealloc, tensor_dealloc},
    {Py_tp_methods, tensor_methods},
    {Py_tp_getset, tensor_getset},
    {Py_tp_repr, tensor_repr},
    {Py_tp_doc, "A zero-copy view of vase memory, consumed through DLPack "
                "(torch.from_dlpack(), numpy.from_dlpack()). It keeps its client's mapping alive "
                "as long as it, or any tensor made from it, lives."},
    {0, NULL},
};

static PyType_Spec tensor_spec = {
    .name = "vase.Tensor",
    .basicsize = sizeof(TensorObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = tensor_slots,
};

static DLDataType dl_dtype(enum vase_dtype d) {
    switch (d) {
    case VASE_DTYPE_F16:
        return (DLDataType){.code = kDLFloat, .bits = 16, .lanes = 1};
    case VASE_DTYPE_BF16:
        return (DLDataType){.code = kDLBfloat, .bits = 16, .lanes = 1};
    default:
        return (DLDataType){.code = kDLFloat, .bits = 32, .lanes = 1};
    }
}

static DLDevice dl_device(int device) {
    return device < 0 ? (DLDevice){.device_type = kDLCPU, .device_id = 0}
                      : (DLDevice){.device_type = kDLCUDA, .device_id = device};
}

/* ---- Client ---- */

static void client_dealloc(ClientObject *self) {
    PyTypeObject *tp = Py_TYPE((PyObject *)self);
    /* Nothing pins a client without a reference to it. */
    if (self->c)
        disconnect_now(self);
    PyObject_Free(self);
    Py_DECREF(tp);
}

static PyObject *py_connect(PyObject *mod, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"runtime_dir", "name", "timeout_ms", NULL};
    const char *runtime_dir = NULL, *name = NULL;
    int timeout_ms = 0;
    (void)mod;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|zzi:connect", kwlist, &runtime_dir, &name,
                                     &timeout_ms))
        return NULL;
    if (timeout_ms < 0) {
        PyErr_SetString(PyExc_ValueError, "timeout_ms must be >= 0");
        return NULL;
    }
    struct vase_connect_options o = {
        .runtime_dir = runtime_dir, .name = name ? name : "python", .timeout_ms = timeout_ms};
    struct vase_client *c = NULL;
    int r;
    Py_BEGIN_ALLOW_THREADS
        r = vase_connect(&o, &c);
    Py_END_ALLOW_THREADS
    if (r < 0)
        return raise_vasef(r, "cannot connect to vased in %s",
                           runtime_dir ? runtime_dir : "the default runtime directory");
    ClientObject *self = PyObject_New(ClientObject, ClientType);
    if (!self) {
        vase_disconnect(c);
        return NULL;
    }
    self->c = c;
    self->closed = 0;
    self->pins = 0;
    self->id = vase_client_id(c);
    self->incarnation = vase_client_incarnation(c);
    return (PyObject *)self;
}

static PyObject *client_close(ClientObject *self, PyObject *unused) {
    (void)unused;
    if (!self->closed) {
        self->closed = 1;
        if (self->pins == 0 && self->c)
            disconnect_now(self);
    }
    Py_RETURN_NONE;
}

static PyObject *client_ping(ClientObject *self, PyObject *unused) {
    (void)unused;
    if (client_enter(self) < 0)
        return NULL;
    struct errbuf e;
    int r;
    Py_BEGIN_ALLOW_THREADS
        r = vase_ping(self->c);
        if (r < 0)
            save_error(self->c, &e);
    Py_END_ALLOW_THREADS
    client_unpin(self);
    if (r < 0)
        return raise_vase(r, e.msg);
    Py_RETURN_NONE;
}

static PyObject *client_arena(ClientObject *self, PyObject *arg) {
    const char *name = get_str(arg, "name");
    if (!name || client_enter(self) < 0)
        return NULL;
    uint32_t id;
    int r = vase_arena_find(self->c, name, &id);
    client_unpin(self);
    if (r < 0)
        return raise_vasef(r, "no arena '%s' for this client", name);
    return PyLong_FromUnsignedLong(id);
}

static PyObject *client_register_model(ClientObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"layers",       "q_heads", "kv_heads", "head_dim", "dtype",
                             "block_tokens", "arena",   "name",     NULL};
    PyObject *o[4], *ob = NULL, *oa = NULL;
    const char *dtype_name = "f32", *name = "";
    struct vase_geometry g = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO|sOOs:register_model", kwlist, &o[0], &o[1],
                                     &o[2], &o[3], &dtype_name, &ob, &oa, &name) ||
        get_u32(o[0], "layers", &g.layers) < 0 || get_u32(o[1], "q_heads", &g.q_heads) < 0 ||
        get_u32(o[2], "kv_heads", &g.kv_heads) < 0 || get_u32(o[3], "head_dim", &g.head_dim) < 0 ||
        opt_u32(ob, "block_tokens", &g.block_tokens) < 0 || opt_u32(oa, "arena", &g.arena) < 0)
        return NULL;
    if (vase_dtype_from_string(dtype_name, &g.dtype) < 0)
        return raise_vasef(-EINVAL, "unknown dtype '%s' (f32, f16, bf16)", dtype_name);
    g.name = name;
    if (client_enter(self) < 0)
        return NULL;
    struct vase_model *m = NULL;
    struct errbuf e;
    int r;
    Py_BEGIN_ALLOW_THREADS
        r = vase_model_register(self->c, &g, &m);
        if (r < 0)
            save_error(self->c, &e);
    Py_END_ALLOW_THREADS
    struct vase_tensor t;
    if (r >= 0 && (r = vase_model_kv_tensor(m, 0, VASE_K, &t)) < 0)
        save_error(self->c, &e);
    client_unpin(self);
    if (r < 0)
        return raise_vase(r, e.msg);
    ModelObject *mo = PyObject_New(ModelObject, ModelType);
    if (!mo)
        return NULL;
    Py_INCREF((PyObject *)self);
    mo->client = self;
    mo->m = m;
    mo->layers = g.layers;
    mo->q_heads = g.q_heads;
    mo->kv_heads = g.kv_heads;
    mo->head_dim = g.head_dim;
    mo->dtype = g.dtype;
    mo->arena = g.arena;
    mo->block_tokens = vase_model_tokens_per_page(m);
    mo->page_bytes = vase_model_page_bytes(m);
    mo->device = dl_device(t.device);
    return (PyObject *)mo;
}

static PyObject *self_enter(PyObject *self, PyObject *unused) {
    (void)unused;
    Py_INCREF((PyObject *)self);
    return self;
}

static PyObject *client_exit(ClientObject *self, PyObject *args) {
    (void)args;
    return client_close(self, NULL);
}

static PyObject *client_get_id(ClientObject *self, void *c) {
    (void)c;
    return PyLong_FromUnsignedLong(self->id);
}

static PyObject *client_get_incarnation(ClientObject *self, void *c) {
    (void)c;
    return PyLong_FromUnsignedLongLong(self->incarnation);
}

static PyObject *client_get_closed(ClientObject *self, void *c) {
    (void)c;
    return PyBool_FromLong(self->closed);
}

static PyMethodDef client_methods[] = {
    {"ping", (PyCFunction)client_ping, METH_NOARGS,
     "ping($self, /)\n--\n\nA round trip to the daemon."},
    {"close", (PyCFunction)client_close, METH_NOARGS,
     "close($self, /)\n--\n\nDisconnects: closes every sequence and unmaps the arenas. Idempotent. "
     "Every later call on the client, its models and sequences raises VaseError(EBADF). While "
     "tensors made from the client are alive (or a call on another thread runs), the disconnect "
     "waits for the last of them, so a view never loses its memory."},
    {"arena", (PyCFunction)client_arena, METH_O,
     "arena($self, name, /)\n--\n\nThe id of the arena called name (vase_arena_find)."},
    {"register_model", (PyCFunction)(void (*)(void))client_register_model,
     METH_VARARGS | METH_KEYWORDS,
     "register_model($self, layers, q_heads, kv_heads, head_dim, dtype='f32', block_tokens=0, "
     "arena=0, name='')\n--\n\nRegisters a model geometry (vase_model_register)."},
    {"__enter__", self_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)client_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef client_getset[] = {
    {"client_id", (getter)client_get_id, NULL, "The id the daemon assigned.", NULL},
    {"incarnation", (getter)client_get_incarnation, NULL, "The daemon's incarnation.", NULL},
    {"closed", (getter)client_get_closed, NULL, "Whether close() was called.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot client_slots[] = {
    {Py_tp_dealloc, client_dealloc},
    {Py_tp_methods, client_methods},
    {Py_tp_getset, client_getset},
    {Py_tp_doc, "A connection to vased (vase.connect())."},
    {0, NULL},
};

static PyType_Spec client_spec = {
    .name = "vase.Client",
    .basicsize = sizeof(ClientObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = client_slots,
};

/* ---- Model ---- */

static void model_dealloc(ModelObject *self) {
    PyTypeObject *tp = Py_TYPE((PyObject *)self);
    Py_DECREF((PyObject *)self->client);
    PyObject_Free(self);
    Py_DECREF(tp);
}

static PyObject *model_kv_tensor(ModelObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"layer", "kv", NULL};
    PyObject *ol, *okv;
    uint32_t layer;
    enum vase_kv kv;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO:kv_tensor", kwlist, &ol, &okv) ||
        get_u32(ol, "layer", &layer) < 0 || get_kv(okv, &kv) < 0 || client_enter(self->client) < 0)
        return NULL;
    struct vase_tensor t;
    struct errbuf e;
    int r = vase_model_kv_tensor(self->m, layer, kv, &t);
    if (r < 0)
        save_error(self->client->c, &e);
    PyObject *ret =
        r < 0 ? raise_vase(r, e.msg)
              : (PyObject *)tensor_new(self->client, NULL, t.data, dl_dtype(t.dtype),
                                       dl_device(t.device), (int32_t)t.ndim, t.shape, t.strides);
    client_unpin(self->client);
    return ret;
}

/* ---- Model.open()'s keywords ----
 *
 * One row per keyword of Model.open(), in the order of its signature (the positional order):
 * its name, the parser that reads it and the field of struct vase_seq_config it fills. A keyword
 * not given leaves its field as open_config() starts it; None does too, where the signature
 * allows None (the numbers, metric). budget comes before every field of params: its parser sets
 * them all to vase_params_default(budget). */
struct open_kw {
    const char *name;
    int (*parse)(PyObject *o, const struct open_kw *kw, void *field);
    size_t field;          /* offset in struct vase_seq_config */
    long long lo;          /* kw_int's range */
    unsigned long long hi; /* and its width: INT32_MAX for an int32_t, else a uint64_t */
    int required;
};

static int kw_budget(PyObject *o, const struct open_kw *kw, void *field) {
    uint32_t budget;
    if (get_u32(o, kw->name, &budget) < 0)
        return -1;
    *(struct vase_params *)field = vase_params_default(budget);
    return 0;
}

static int kw_u32(PyObject *o, const struct open_kw *kw, void *field) {
    return opt_u32(o, kw->name, field);
}

static int kw_float(PyObject *o, const struct open_kw *kw, void *field) {
    return opt_float(o, kw->name, field);
}

static int kw_int(PyObject *o, const struct open_kw *kw, void *field) {
    unsigned long long v;
    if (o == Py_None)
        return 0;
    if (get_int(o, kw->name, kw->lo, kw->hi, &v) < 0)
        return -1;
    if (kw->hi <= INT32_MAX)
        *(int32_t *)field = (int32_t)(long long)v;
    else
        *(uint64_t *)field = v;
    return 0;
}

static int kw_flag(PyObject *o, const struct open_kw *kw, void *field) {
    (void)kw;
    int r = PyObject_IsTrue(o);
    if (r < 0)
        return -1;
    *(uint32_t *)field = (uint32_t)r;
    return 0;
}

static int unknown_name(const struct open_kw *kw, const char *s) {
    raise_vasef(-EINVAL, "unknown %s '%s'", kw->name, s);
    return -1;
}

static int kw_policy(PyObject *o, const struct open_kw *kw, void *field) {
    const char *s = get_str(o, kw->name);
    if (!s)
        return -1;
    return vase_policy_from_string(s, field) < 0 ? unknown_name(kw, s) : 0;
}

/* None leaves vase_params_default()'s metric. */
static int kw_metric(PyObject *o, const struct open_kw *kw, void *field) {
    const char *s = o == Py_None ? NULL : get_str(o, kw->name);
    if (o != Py_None && !s)
        return -1;
    return s && vase_metric_from_string(s, field) < 0 ? unknown_name(kw, s) : 0;
}

static int kw_mode(PyObject *o, const struct open_kw *kw, void *field) {
    const char *s = get_str(o, kw->name);
    if (!s)
        return -1;
    if (strcmp(s, "sync") == 0 || strcmp(s, "async") == 0) {
        *(enum vase_mode *)field = s[0] == 's' ? VASE_MODE_SYNC : VASE_MODE_ASYNC;
        return 0;
    }
    raise_vasef(-EINVAL, "unknown mode '%s' (want \"sync\" or \"async\")", s);
    return -1;
}

#define AT(f) offsetof(struct vase_seq_config, f)
static const struct open_kw open_kws[] = {
    {.name = "policy", .parse = kw_policy, .field = AT(policy)},
    {.name = "budget", .parse = kw_budget, .field = AT(params), .required = 1},
    {.name = "window", .parse = kw_u32, .field = AT(params.window)},
    {.name = "prompt_len", .parse = kw_u32, .field = AT(prompt_len)},
    {.name = "mode", .parse = kw_mode, .field = AT(mode)},
    {.name = "slack", .parse = kw_int, .field = AT(slack), .lo = -1, .hi = INT32_MAX},
    {.name = "seed", .parse = kw_int, .field = AT(seed), .lo = 0, .hi = UINT64_MAX},
    {.name = "n_sink", .parse = kw_u32, .field = AT(params.n_sink)},
    {.name = "n_large", .parse = kw_u32, .field = AT(params.n_large)},
    {.name = "temperature", .parse = kw_float, .field = AT(params.temperature)},
    {.name = "rank", .parse = kw_u32, .field = AT(params.rank)},
    {.name = "lambda_", .parse = kw_float, .field = AT(params.lambda)},
    {.name = "smooth", .parse = kw_u32, .field = AT(params.smooth)},
    {.name = "metric", .parse = kw_metric, .field = AT(params.metric)},
    {.name = "admission_wait_ms",
     .parse = kw_int,
     .field = AT(admission_wait_ms),
     .lo = -1,
     .hi = VASE_MAX_ADMISSION_WAIT_MS},
    {.name = "min_budget", .parse = kw_u32, .field = AT(min_budget)},
    {.name = "weight", .parse = kw_u32, .field = AT(weight)},
    {.name = "protect_prompt", .parse = kw_flag, .field = AT(params.protect_prompt)},
};
#undef AT
#define N_OPEN_KWS (sizeof(open_kws) / sizeof(open_kws[0]))

/* The configuration of Model.open(args, kw), or -1 with the exception set. */
static int open_config(PyObject *args, PyObject *kw, struct vase_seq_config *ret) {
    static char *kwlist[N_OPEN_KWS + 1];
    PyObject *o[N_OPEN_KWS] = {0};
    for (size_t i = 0; i < N_OPEN_KWS; i++)
        kwlist[i] = (char *)open_kws[i].name;
    _Static_assert(N_OPEN_KWS == 18, "the format and the pointers below: one per keyword");
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|OOOOOOOOOOOOOOOOOO:open", kwlist, &o[0], &o[1],
                                     &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8], &o[9], &o[10],
                                     &o[11], &o[12], &o[13], &o[14], &o[15], &o[16], &o[17]))
        return -1;
    struct vase_seq_config cfg = {.policy = VASE_POLICY_VASE_ATTNV,
                                  .mode = VASE_MODE_ASYNC,
                                  .slack = -1,
                                  .admission_wait_ms = -1};
    for (size_t i = 0; i < N_OPEN_KWS; i++) {
        const struct open_kw *k = &open_kws[i];
        if (!o[i] && k->required) {
            PyErr_Format(PyExc_TypeError, "open() missing required argument '%s'", k->name);
            return -1;
        }
        if (o[i] && k->parse(o[i], k, (char *)&cfg + k->field) < 0)
            return -1;
    }
    *ret = cfg;
    return 0;
}

static PyObject *model_open(ModelObject *self, PyObject *args, PyObject *kw) {
    struct vase_seq_config cfg;
    if (open_config(args, kw, &cfg) < 0)
        return NULL;
    if (client_enter(self->client) < 0)
        return NULL;
    struct vase_seq *s = NULL;
    struct errbuf e;
    int r;
    Py_BEGIN_ALLOW_THREADS
        r = vase_seq_open(self->client->c, self->m, &cfg, &s);
        if (r < 0)
            save_error(self->client->c, &e);
    Py_END_ALLOW_THREADS
    SeqObject *so = NULL;
    if (r >= 0) {
        so = PyObject_New(SeqObject, SeqType);
        if (so) {
            Py_INCREF((PyObject *)self->client);
            Py_INCREF((PyObject *)self);
            so->client = self->client;
            so->model = self;
            so->s = s;
            so->closed = 0;
            so->pins = 0;
            so->id = vase_seq_id(s);
            so->policy = cfg.policy;
        } else {
            Py_BEGIN_ALLOW_THREADS
                vase_seq_close(s);
            Py_END_ALLOW_THREADS
        }
    }
    client_unpin(self->client);
    if (r < 0)
        return raise_vase(r, e.msg);
    return (PyObject *)so;
}

#define MODEL_U32(field)                                                                           \
    static PyObject *model_get_##field(ModelObject *self, void *c) {                               \
        (void)c;                                                                                   \
        return PyLong_FromUnsignedLong(self->field);                                               \
    }
MODEL_U32(layers)
MODEL_U32(q_heads)
MODEL_U32(kv_heads)
MODEL_U32(head_dim)
MODEL_U32(block_tokens)
MODEL_U32(arena)

static PyObject *model_get_page_bytes(ModelObject *self, void *c) {
    (void)c;
    return PyLong_FromUnsignedLongLong(self->page_bytes);
}

static PyObject *model_get_dtype(ModelObject *self, void *c) {
    (void)c;
    return PyUnicode_FromString(vase_dtype_to_string(self->dtype));
}

static PyMethodDef model_methods[] = {
    {"kv_tensor", (PyCFunction)(void (*)(void))model_kv_tensor, METH_VARARGS | METH_KEYWORDS,
     "kv_tensor($self, layer, kv)\n--\n\nK (kv='k') or V (kv='v') of one layer over the whole "
     "arena, a zero-copy Tensor [num_blocks][block_tokens][kv_heads][head_dim] with block stride "
     "page_bytes (vase_model_kv_tensor)."},
    {"open", (PyCFunction)(void (*)(void))model_open, METH_VARARGS | METH_KEYWORDS,
     "open($self, policy='vase-attnv', budget, window=64, prompt_len=0, mode='async', slack=-1, "
     "seed=0, n_sink=None, n_large=None, temperature=None, rank=None, lambda_=None, smooth=None, "
     "metric=None, admission_wait_ms=-1, min_budget=0, weight=0, protect_prompt=False)\n--\n\n"
     "Opens a sequence "
     "(vase_seq_open); parameters "
     "not given are vase_params_default(budget)'s. budget is required. admission_wait_ms: how "
     "long the open may wait for room when the arena is full (-1: the daemon's "
     "admission_wait_ms setting; 0: refused at once; at most 600000); the wait ends with "
     "VaseError ENOSPC when no room was freed in time. min_budget: the least budget the daemon "
     "may lower it to while opens wait for room (an elastic budget: a multiple of window, above "
     "it, at most budget; 0 or None: budget, not elastic). weight: its weight when budgets are "
     "lowered (0 or None: 1; at most 1000). protect_prompt: never evict the prompt, the first "
     "prompt_len slots, whatever the policy; it counts against the budget, so prompt_len must "
     "be at most budget - window (and min_budget - window when elastic). An invalid min_budget, "
     "weight or protected prompt raises VaseError(EINVAL)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef model_getset[] = {
    {"layers", (getter)model_get_layers, NULL, NULL, NULL},
    {"q_heads", (getter)model_get_q_heads, NULL, NULL, NULL},
    {"kv_heads", (getter)model_get_kv_heads, NULL, NULL, NULL},
    {"head_dim", (getter)model_get_head_dim, NULL, NULL, NULL},
    {"block_tokens", (getter)model_get_block_tokens, NULL, "Tokens per page (block).", NULL},
    {"arena", (getter)model_get_arena, NULL, "The arena id.", NULL},
    {"page_bytes", (getter)model_get_page_bytes, NULL, "Bytes of one page: the block stride.",
     NULL},
    {"dtype", (getter)model_get_dtype, NULL, "\"f32\", \"f16\" or \"bf16\".", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot model_slots[] = {
    {Py_tp_dealloc, model_dealloc},
    {Py_tp_methods, model_methods},
    {Py_tp_getset, model_getset},
    {Py_tp_doc, "A registered model geometry (Client.register_model())."},
    {0, NULL},
};

static PyType_Spec model_spec = {
    .name = "vase.Model",
    .basicsize = sizeof(ModelObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = model_slots,
};

/* ---- Seq ---- */

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
        return raise_vase(r, e.msg);
    Py_RETURN_NONE;
}

static PyObject *seq_exit(SeqObject *self, PyObject *args) {
    (void)args;
    return seq_close(self, NULL);
}

/* The calls that may wait for the daemon: 0/1 from libvase, or an error. */
static int seq_call(SeqObject *self, int (*fn)(struct vase_seq *, uint32_t), uint32_t arg) {
    if (seq_enter(self) < 0)
        return -1;
    struct errbuf e;
    int r;
    Py_BEGIN_ALLOW_THREADS
        r = fn(self->s, arg);
        if (r < 0)
            save_error(self->client->c, &e);
    Py_END_ALLOW_THREADS
    seq_leave(self);
    if (r < 0) {
        raise_vase(r, e.msg);
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
    if (get_u32(arg, "n", &n) < 0)
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
        get_u32(ol, "layer", &layer) < 0)
        return NULL;
    if (strcmp(kind, "acc_add") == 0)
        k = VASE_STATS_ACC_ADD;
    else if (strcmp(kind, "window_scores") == 0)
        k = VASE_STATS_WINDOW_SCORES;
    else
        return raise_vasef(-EINVAL, "unknown stats kind '%s' (acc_add, window_scores)", kind);
    Py_buffer view;
    if (get_floats(values, "values", &view) < 0)
        return NULL;
    uint32_t heads = self->model->kv_heads;
    if (view.ndim != 2 || view.shape[0] != (Py_ssize_t)heads || view.shape[1] > UINT32_MAX) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "values must have shape [kv_heads=%u][len]", heads);
        return NULL;
    }
    uint32_t len = (uint32_t)view.shape[1];
    if (seq_enter(self) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    struct errbuf e;
    int r;
    Py_BEGIN_ALLOW_THREADS
        r = vase_seq_push_stats(self->s, layer, k, view.buf, len);
        if (r < 0)
            save_error(self->client->c, &e);
    Py_END_ALLOW_THREADS
    seq_leave(self);
    PyBuffer_Release(&view);
    if (r < 0)
        return raise_vase(r, e.msg);
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
        if (get_floats(oexp, "exp_draws", &bexp) < 0)
            return NULL;
        have_exp = 1;
    }
    if (ogauss != Py_None) {
        if (get_floats(ogauss, "gauss", &bgauss) < 0)
            goto fail;
        have_gauss = 1;
    }
    if (seq_enter(self) < 0)
        goto fail;
    int r =
        vase_seq_set_draws(self->s, have_exp ? bexp.buf : NULL, have_exp ? (size_t)bexp.len / 4 : 0,
                           have_gauss ? bgauss.buf : NULL, have_gauss ? (size_t)bgauss.len / 4 : 0);
    struct errbuf e;
    if (r < 0)
        save_error(self->client->c, &e);
    seq_leave(self);
    if (have_exp)
        PyBuffer_Release(&bexp);
    if (have_gauss)
        PyBuffer_Release(&bgauss);
    if (r < 0)
        return raise_vase(r, e.msg);
    Py_RETURN_NONE;
fail:
    if (have_exp)
        PyBuffer_Release(&bexp);
    return NULL;
}

static PyObject *seq_block_table(SeqObject *self, PyObject *unused) {
    (void)unused;
    if (seq_enter(self) < 0)
        return NULL;
    const int32_t *table;
    uint32_t n;
    struct errbuf e;
    int32_t *copy = NULL;
    int r = vase_seq_block_table(self->s, &table, &n);
    if (r < 0)
        save_error(self->client->c, &e);
    else if ((copy = malloc((n ? n : 1) * sizeof(*copy))) != NULL)
        memcpy(copy, table, n * sizeof(*copy));
    seq_leave(self);
    if (r < 0)
        return raise_vase(r, e.msg);
    if (!copy)
        return PyErr_NoMemory();
    int64_t shape = n, stride = 1;
    TensorObject *t = tensor_new(NULL, NULL, copy, (DLDataType){kDLInt, 32, 1}, dl_device(-1), 1,
                                 &shape, &stride);
    if (!t) {
        free(copy);
        return NULL;
    }
    t->owned = copy;
    return (PyObject *)t;
}

static PyObject *seq_block_table_device(SeqObject *self, PyObject *unused) {
    (void)unused;
    if (seq_enter(self) < 0)
        return NULL;
    const int32_t *table, *dev = vase_seq_block_table_device(self->s);
    uint32_t n = 0;
    struct errbuf e;
    int r = 0;
    if (dev && (r = vase_seq_block_table(self->s, &table, &n)) < 0)
        save_error(self->client->c, &e);
    PyObject *ret;
    if (r < 0)
        ret = raise_vase(r, e.msg);
    else if (!dev) {
        Py_INCREF(Py_None);
        ret = Py_None;
    } else {
        int64_t shape = n, stride = 1;
        ret = (PyObject *)tensor_new(self->client, self, (void *)dev, (DLDataType){kDLInt, 32, 1},
                                     self->model->device, 1, &shape, &stride);
    }
    seq_leave(self);
    return ret;
}

static PyObject *seq_query_slot(SeqObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"layer", "pos", NULL};
    PyObject *ol, *op;
    uint32_t layer;
    unsigned long long pos;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO:query_slot", kwlist, &ol, &op) ||
        get_u32(ol, "layer", &layer) < 0 || get_int(op, "pos", 0, UINT64_MAX, &pos) < 0 ||
        seq_enter(self) < 0)
        return NULL;
    ModelObject *m = self->model;
    void *p = vase_seq_query_ptr(self->s, layer, pos, 0);
    PyObject *ret;
    if (!p && layer >= m->layers)
        ret = raise_vasef(-EINVAL, "no query slot: layer %u, but the model has %u layers", layer,
                          m->layers);
    else if (!p && !(vase_policy_needs(self->policy) & VASE_NEEDS_Q)) {
        char with[256] = "";
        size_t n = 0;
        for (int q = 0; q < _VASE_POLICY_MAX && n < sizeof(with); q++)
            if (vase_policy_needs((enum vase_policy)q) & VASE_NEEDS_Q)
                n += (size_t)snprintf(with + n, sizeof(with) - n, "%s%s", n ? ", " : "",
                                      vase_policy_to_string((enum vase_policy)q));
        ret = raise_vasef(-EINVAL,
                          "no query slot: policy %s reads no queries, so its sequences keep no "
                          "query ring (the policies that do: %s)",
                          vase_policy_to_string(self->policy), with);
    } else if (!p)
        ret = raise_vasef(-EINVAL, "no query slot for layer %u at position %llu", layer, pos);
    else {
        int64_t shape[2] = {m->q_heads, m->head_dim}, strides[2] = {m->head_dim, 1};
        ret = (PyObject *)tensor_new(self->client, NULL, p, dl_dtype(m->dtype), m->device, 2, shape,
                                     strides);
    }
    seq_leave(self);
    return ret;
}

static PyObject *seq_kv_slot(SeqObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"layer", "kv", "slot", NULL};
    PyObject *ol, *okv, *os;
    uint32_t layer, slot;
    enum vase_kv kv;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO:kv_slot", kwlist, &ol, &okv, &os) ||
        get_u32(ol, "layer", &layer) < 0 || get_kv(okv, &kv) < 0 ||
        get_u32(os, "slot", &slot) < 0 || seq_enter(self) < 0)
        return NULL;
    ModelObject *m = self->model;
    void *p = vase_seq_kv_ptr(self->s, layer, kv, slot, 0);
    PyObject *ret;
    if (!p)
        ret = raise_vasef(-EINVAL, "no KV slot: layer %u of %u, slot %u of capacity %u", layer,
                          m->layers, slot, vase_seq_capacity(self->s));
    else {
        int64_t shape[2] = {m->kv_heads, m->head_dim}, strides[2] = {m->head_dim, 1};
        ret = (PyObject *)tensor_new(self->client, NULL, p, dl_dtype(m->dtype), m->device, 2, shape,
                                     strides);
    }
    seq_leave(self);
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
        if (seq_enter(self) < 0)                                                                   \
            return NULL;                                                                           \
        type v;                                                                                    \
        Py_BEGIN_ALLOW_THREADS                                                                     \
            v = vase_seq_##name(self->s);                                                          \
        Py_END_ALLOW_THREADS                                                                       \
        seq_leave(self);                                                                           \
        return conv(v);                                                                            \
    }
SEQ_GET(len, uint32_t, PyLong_FromUnsignedLong)
SEQ_GET(capacity, uint32_t, PyLong_FromUnsignedLong)
SEQ_GET(position, uint64_t, PyLong_FromUnsignedLongLong)
SEQ_GET(rounds, uint32_t, PyLong_FromUnsignedLong)
SEQ_GET(budget, uint32_t, PyLong_FromUnsignedLong)
SEQ_GET(min_budget, uint32_t, PyLong_FromUnsignedLong)

static int do_set_budget(struct vase_seq *s, uint32_t budget) {
    return vase_seq_set_budget(s, budget);
}

static PyObject *seq_set_budget(SeqObject *self, PyObject *arg) {
    uint32_t budget;
    if (get_u32(arg, "budget", &budget) < 0 || seq_call(self, do_set_budget, budget) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *seq_get_stats(SeqObject *self, void *c) {
    (void)c;
    if (seq_enter(self) < 0)
        return NULL;
    struct vase_seq_stats st = {0};
    Py_BEGIN_ALLOW_THREADS
        vase_seq_get_stats(self->s, &st);
    Py_END_ALLOW_THREADS
    seq_leave(self);
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
    {"__enter__", self_enter, METH_NOARGS, NULL},
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

static PyType_Spec seq_spec = {
    .name = "vase.Seq",
    .basicsize = sizeof(SeqObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = seq_slots,
};

/* ---- module ---- */

static PyMethodDef module_methods[] = {
    {"connect", (PyCFunction)(void (*)(void))py_connect, METH_VARARGS | METH_KEYWORDS,
     "connect(runtime_dir=None, name=None, timeout_ms=0)\n--\n\nConnects to vased."},
    {"_set_error_type", set_error_type, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, .m_name = "vase._vase", .m_size = -1,
                                        .m_methods = module_methods};

static int add_type(PyObject *mod, const char *name, PyType_Spec *spec, PyTypeObject **ret) {
    PyObject *t = PyType_FromSpec(spec);
    if (!t)
        return -1;
    *ret = (PyTypeObject *)t;
    Py_INCREF(t);
    return PyModule_AddObject(mod, name, t) < 0 ? (Py_DECREF(t), -1) : 0;
}

PyMODINIT_FUNC PyInit__vase(void) {
    PyObject *mod = PyModule_Create(&module_def);
    if (!mod)
        return NULL;
    if (add_type(mod, "Client", &client_spec, &ClientType) < 0 ||
        add_type(mod, "Model", &model_spec, &ModelType) < 0 ||
        add_type(mod, "Seq", &seq_spec, &SeqType) < 0 ||
        add_type(mod, "Tensor", &tensor_spec, &TensorType) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
