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
extern PyTypeObject *vpy_client_type, *vpy_model_type, *vpy_seq_type, *vpy_tensor_type,
    *vpy_batch_type;
extern PyType_Spec vpy_client_spec, vpy_model_spec, vpy_seq_spec, vpy_tensor_spec, vpy_batch_spec;

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

/* ---- tensors taken through DLPack, and the paged attention (_vase_attend.c) ---- */

/* A tensor a caller gave: an object's __dlpack__() capsule, or a "dltensor" capsule the caller
 * made (borrowed, left unconsumed), owned until vpy_dl_release(); its DLTensor; its name for
 * the messages. */
struct vpy_dl {
    PyObject *cap;
    const DLTensor *t;
    const char *name;
};
/* Takes obj (0), or raises TypeError/ValueError (-1): not a tensor, not on the CPU. */
int vpy_dl_take(PyObject *obj, const char *name, struct vpy_dl *ret);
void vpy_dl_release(struct vpy_dl *x);
int vpy_dl_is(const struct vpy_dl *x, uint8_t code, uint8_t bits);
/* The element stride of dimension i. */
int64_t vpy_dl_stride(const struct vpy_dl *x, int i);
/* Whether dimensions first .. ndim - 1 are row-major without gaps. */
int vpy_dl_dense_from(const struct vpy_dl *x, int first);
/* The first element's address, or NULL with ValueError when it is not aligned to its type. */
const void *vpy_dl_data(const struct vpy_dl *x);

/* The most threads a paged attention call runs on. */
#define VPY_MAX_THREADS 64u

struct vase_attend_cache;
struct vase_attend_batch;
/* vase_paged_attention() on up to `threads` threads (OpenMP, the pool PyTorch's operators use
 * in the same process): the batch's sequences cut into runs of about equal work, a few per
 * thread, which the threads take as they come free. The whole batch is checked first: a refusal
 * leaves out untouched. Call without the GIL. */
int vpy_attend(const struct vase_attend_cache *c, const struct vase_attend_batch *bt, float *out,
               uint32_t threads, char *why, size_t why_size);
/* vase._vase.paged_attention(). */
PyObject *vpy_paged_attention(PyObject *mod, PyObject *args, PyObject *kw);

/* ---- Seq (_vase_seq.c) ---- */

/* Drops a pin of the sequence; the last one ends a closed sequence in libvase. */
void vpy_seq_unpin(SeqObject *self);
/* Pins the sequence and its client for a call (0), or raises VaseError(EBADF) when either is
 * closed (-1); vpy_seq_leave() drops both pins. */
int vpy_seq_enter(SeqObject *self);
void vpy_seq_leave(SeqObject *self);

/* ---- Batch (_vase_batch.c) ---- */

/* Model.batch(): a Batch of the model (ValueError for a CUDA arena or another dtype than
 * float32). */
PyObject *vpy_batch_new(ModelObject *m);

#endif
