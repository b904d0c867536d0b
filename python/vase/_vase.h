/* SPDX-License-Identifier: MIT */

/*
 * What the files of the extension vase._vase share: its four object types (Client, Model, Seq
 * and Tensor), the pins that keep libvase's client and sequences alive under them, and the
 * helpers every file uses. Names shared between the files start with vpy_; each file's own are
 * static and unprefixed. Every file includes this header before any other: Python.h must come
 * before the standard headers.
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

#ifndef VASE_PYTHON_VASE_H
#define VASE_PYTHON_VASE_H

#define Py_LIMITED_API 0x030B0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlpack/dlpack.h>
#include <stdint.h>

#include "vase.h"

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

/* The types, made from their specs when the module is imported (_vase.c). */
extern PyTypeObject *vpy_client_type, *vpy_model_type, *vpy_seq_type, *vpy_tensor_type;
extern PyType_Spec vpy_client_spec, vpy_model_spec, vpy_seq_spec, vpy_tensor_spec;

/* ---- errors (_vase_errors.c) ---- */

/* The message of the last failed call, copied at once (another thread's call replaces it). */
struct errbuf {
    char msg[512];
};

/* Raise VaseError(errno, vase_strerror(), message) for err (negative or positive); return NULL. */
PyObject *vpy_raise(int err, const char *message);
PyObject *vpy_raisef(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void vpy_save_error(struct vase_client *c, struct errbuf *e);
/* vase._vase._set_error_type(cls): the class vpy_raise() raises, set by vase/__init__.py. */
PyObject *vpy_set_error_type(PyObject *mod, PyObject *cls);

/* ---- argument conversion (_vase_args.c): 0, or -1 with the exception set ---- */

int vpy_get_int(PyObject *o, const char *what, long long lo, unsigned long long hi,
                unsigned long long *ret);
int vpy_get_u32(PyObject *o, const char *what, uint32_t *ret);
int vpy_opt_u32(PyObject *o, const char *what, uint32_t *ret);
int vpy_opt_float(PyObject *o, const char *what, float *ret);
const char *vpy_get_str(PyObject *o, const char *what);
int vpy_get_kv(PyObject *o, enum vase_kv *ret);
int vpy_get_floats(PyObject *o, const char *what, Py_buffer *view);

/* ---- Tensor (_vase_tensor.c) ---- */

/* A view of data that pins client and seq (either may be NULL) while it lives. */
TensorObject *vpy_tensor_new(ClientObject *client, SeqObject *seq, void *data, DLDataType dtype,
                             DLDevice device, int32_t ndim, const int64_t *shape,
                             const int64_t *strides);
DLDataType vpy_dl_dtype(enum vase_dtype d);
DLDevice vpy_dl_device(int device);

/* ---- Client (_vase_client.c) ---- */

/* vase._vase.connect(). */
PyObject *vpy_connect(PyObject *mod, PyObject *args, PyObject *kw);
/* Pins the client for a call (0), or raises VaseError(EBADF) if it was closed (-1). */
int vpy_client_enter(ClientObject *self);
/* Drops a pin; the last one disconnects a closed client. */
void vpy_client_unpin(ClientObject *self);
/* __enter__ of Client and Seq. */
PyObject *vpy_self_enter(PyObject *self, PyObject *unused);

/* ---- paged attention (_vase_attend.c) ---- */

/* vase._vase.paged_attention(). */
PyObject *vpy_paged_attention(PyObject *mod, PyObject *args, PyObject *kw);

/* ---- Seq (_vase_seq.c) ---- */

/* Drops a pin of the sequence; the last one ends a closed sequence in libvase. */
void vpy_seq_unpin(SeqObject *self);

#endif
