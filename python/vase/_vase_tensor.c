/* SPDX-License-Identifier: MIT */

/*
 * vase.Tensor, the DLPack producer of vase._vase: a zero-copy view of arena memory (a layer's K
 * or V, one slot, a query ring entry, the device block table) or of a copy it owns (the host block
 * table). A tensor pins its client, and the sequence whose memory it shows, for its whole life, and
 * each capsule it exports holds the tensor until the consumer calls the deleter; so a view never
 * outlives the mapping it points into (_vase.h, "Lifetimes").
 */

#include "_vase.h"

#include <stdlib.h>

TensorObject *vpy_tensor_new(ClientObject *client, SeqObject *seq, void *data, DLDataType dtype,
                             DLDevice device, int32_t ndim, const int64_t *shape,
                             const int64_t *strides) {
    TensorObject *t = PyObject_New(TensorObject, vpy_tensor_type);
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
        vpy_seq_unpin(seq);
        Py_DECREF((PyObject *)seq);
    }
    if (client) {
        vpy_client_unpin(client);
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

PyType_Spec vpy_tensor_spec = {
    .name = "vase.Tensor",
    .basicsize = sizeof(TensorObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = tensor_slots,
};

DLDataType vpy_dl_dtype(enum vase_dtype d) {
    switch (d) {
    case VASE_DTYPE_F16:
        return (DLDataType){.code = kDLFloat, .bits = 16, .lanes = 1};
    case VASE_DTYPE_BF16:
        return (DLDataType){.code = kDLBfloat, .bits = 16, .lanes = 1};
    default:
        return (DLDataType){.code = kDLFloat, .bits = 32, .lanes = 1};
    }
}

DLDevice vpy_dl_device(int device) {
    return device < 0 ? (DLDevice){.device_type = kDLCPU, .device_id = 0}
                      : (DLDevice){.device_type = kDLCUDA, .device_id = device};
}
