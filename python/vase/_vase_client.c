/* SPDX-License-Identifier: MIT */

/*
 * vase.Client, a connection to vased (vase.connect()): its pins, which defer the disconnect while
 * a tensor or a call in flight needs the C client, its calls (ping, arena, register_model, which
 * makes a vase.Model), and close.
 */

#include "_vase.h"

#include <errno.h>

static void disconnect_now(ClientObject *self) {
    struct vase_client *c = self->c;
    self->c = NULL;
    Py_BEGIN_ALLOW_THREADS
        vase_disconnect(c);
    Py_END_ALLOW_THREADS
}

void vpy_client_unpin(ClientObject *self) {
    if (--self->pins == 0 && self->closed && self->c)
        disconnect_now(self);
}

/* Pins the client for a call; EBADF if it was closed. */
int vpy_client_enter(ClientObject *self) {
    if (self->closed || !self->c) {
        vpy_raise(-EBADF, "the client is closed");
        return -1;
    }
    self->pins++;
    return 0;
}

static void client_dealloc(ClientObject *self) {
    PyTypeObject *tp = Py_TYPE((PyObject *)self);
    /* Nothing pins a client without a reference to it. */
    if (self->c)
        disconnect_now(self);
    PyObject_Free(self);
    Py_DECREF(tp);
}

PyObject *vpy_connect(PyObject *mod, PyObject *args, PyObject *kw) {
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
        return vpy_raisef(r, "cannot connect to vased in %s",
                          runtime_dir ? runtime_dir : "the default runtime directory");
    ClientObject *self = PyObject_New(ClientObject, vpy_client_type);
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
    if (vpy_client_enter(self) < 0)
        return NULL;
    struct errbuf e;
    int r;
    Py_BEGIN_ALLOW_THREADS
        r = vase_ping(self->c);
        if (r < 0)
            vpy_save_error(self->c, &e);
    Py_END_ALLOW_THREADS
    vpy_client_unpin(self);
    if (r < 0)
        return vpy_raise(r, e.msg);
    Py_RETURN_NONE;
}

static PyObject *client_arena(ClientObject *self, PyObject *arg) {
    const char *name = vpy_get_str(arg, "name");
    if (!name || vpy_client_enter(self) < 0)
        return NULL;
    uint32_t id;
    int r = vase_arena_find(self->c, name, &id);
    vpy_client_unpin(self);
    if (r < 0)
        return vpy_raisef(r, "no arena '%s' for this client", name);
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
        vpy_get_u32(o[0], "layers", &g.layers) < 0 ||
        vpy_get_u32(o[1], "q_heads", &g.q_heads) < 0 ||
        vpy_get_u32(o[2], "kv_heads", &g.kv_heads) < 0 ||
        vpy_get_u32(o[3], "head_dim", &g.head_dim) < 0 ||
        vpy_opt_u32(ob, "block_tokens", &g.block_tokens) < 0 ||
        vpy_opt_u32(oa, "arena", &g.arena) < 0)
        return NULL;
    if (vase_dtype_from_string(dtype_name, &g.dtype) < 0)
        return vpy_raisef(-EINVAL, "unknown dtype '%s' (f32, f16, bf16)", dtype_name);
    g.name = name;
    if (vpy_client_enter(self) < 0)
        return NULL;
    struct vase_model *m = NULL;
    struct errbuf e;
    int r;
    Py_BEGIN_ALLOW_THREADS
        r = vase_model_register(self->c, &g, &m);
        if (r < 0)
            vpy_save_error(self->c, &e);
    Py_END_ALLOW_THREADS
    struct vase_tensor t;
    if (r >= 0 && (r = vase_model_kv_tensor(m, 0, VASE_K, &t)) < 0)
        vpy_save_error(self->c, &e);
    vpy_client_unpin(self);
    if (r < 0)
        return vpy_raise(r, e.msg);
    ModelObject *mo = PyObject_New(ModelObject, vpy_model_type);
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
    mo->device = vpy_dl_device(t.device);
    return (PyObject *)mo;
}

PyObject *vpy_self_enter(PyObject *self, PyObject *unused) {
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
    {"__enter__", vpy_self_enter, METH_NOARGS, NULL},
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

PyType_Spec vpy_client_spec = {
    .name = "vase.Client",
    .basicsize = sizeof(ClientObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = client_slots,
};
