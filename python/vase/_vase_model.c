/* SPDX-License-Identifier: MIT */

/*
 * vase.Model, a registered model geometry (Client.register_model()): its K and
 * V tensors over the whole arena, and Model.open(), which reads its keywords
 * through one table and opens a vase.Seq.
 */

#include "_vase.h"

#include <errno.h>
#include <stddef.h>
#include <string.h>

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
        vpy_get_u32(ol, "layer", &layer) < 0 || vpy_get_kv(okv, &kv) < 0 ||
        vpy_client_enter(self->client) < 0)
        return NULL;
    struct vase_tensor t;
    struct errbuf e;
    int r = vase_model_kv_tensor(self->m, layer, kv, &t);
    if (r < 0)
        vpy_save_error(self->client->c, &e);
    PyObject *ret = r < 0
                        ? vpy_raise(r, e.msg)
                        : (PyObject *)vpy_tensor_new(self->client, NULL, t.data,
                                                     vpy_dl_dtype(t.dtype), vpy_dl_device(t.device),
                                                     (int32_t)t.ndim, t.shape, t.strides);
    vpy_client_unpin(self->client);
    return ret;
}

/* ---- Model.open()'s keywords ----
 *
 * One row per keyword of Model.open(), in the order of its signature (the
 * positional order): its name, the parser that reads it and the field of struct
 * vase_seq_config it fills. A keyword not given leaves its field as
 * open_config() starts it; None does too, where the signature allows None (the
 * numbers, metric). budget comes before every field of params: its parser sets
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
    if (vpy_get_u32(o, kw->name, &budget) < 0)
        return -1;
    *(struct vase_params *)field = vase_params_default(budget);
    return 0;
}

static int kw_u32(PyObject *o, const struct open_kw *kw, void *field) {
    return vpy_opt_u32(o, kw->name, field);
}

static int kw_float(PyObject *o, const struct open_kw *kw, void *field) {
    return vpy_opt_float(o, kw->name, field);
}

static int kw_int(PyObject *o, const struct open_kw *kw, void *field) {
    unsigned long long v;
    if (o == Py_None)
        return 0;
    if (vpy_get_int(o, kw->name, kw->lo, kw->hi, &v) < 0)
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
    vpy_raisef(-EINVAL, "unknown %s '%s'", kw->name, s);
    return -1;
}

static int kw_policy(PyObject *o, const struct open_kw *kw, void *field) {
    const char *s = vpy_get_str(o, kw->name);
    if (!s)
        return -1;
    return vase_policy_from_string(s, field) < 0 ? unknown_name(kw, s) : 0;
}

/* None leaves vase_params_default()'s metric. */
static int kw_metric(PyObject *o, const struct open_kw *kw, void *field) {
    const char *s = o == Py_None ? NULL : vpy_get_str(o, kw->name);
    if (o != Py_None && !s)
        return -1;
    return s && vase_metric_from_string(s, field) < 0 ? unknown_name(kw, s) : 0;
}

/* A str, kept by the arguments until vase_seq_open() copied it; None leaves no label. libvase
 * checks it (VaseError EINVAL for one its rule refuses), as a C string: a NUL inside would cut
 * it short unseen, so it is refused here. */
static int kw_label(PyObject *o, const struct open_kw *kw, void *field) {
    if (o == Py_None)
        return 0;
    if (!PyUnicode_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be a str or None", kw->name);
        return -1;
    }
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(o, &n);
    if (!s)
        return -1;
    if (strlen(s) != (size_t)n) {
        vpy_raisef(-EINVAL, "label byte %zu is 0x00", strlen(s));
        return -1;
    }
    *(const char **)field = s;
    return 0;
}

static int kw_mode(PyObject *o, const struct open_kw *kw, void *field) {
    const char *s = vpy_get_str(o, kw->name);
    if (!s)
        return -1;
    if (strcmp(s, "sync") == 0 || strcmp(s, "async") == 0) {
        *(enum vase_mode *)field = s[0] == 's' ? VASE_MODE_SYNC : VASE_MODE_ASYNC;
        return 0;
    }
    vpy_raisef(-EINVAL, "unknown mode '%s' (want \"sync\" or \"async\")", s);
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
    {.name = "label", .parse = kw_label, .field = AT(label)},
};
#undef AT
#define N_OPEN_KWS (sizeof(open_kws) / sizeof(open_kws[0]))

/* The configuration of Model.open(args, kw), or -1 with the exception set. */
static int open_config(PyObject *args, PyObject *kw, struct vase_seq_config *ret) {
    static char *kwlist[N_OPEN_KWS + 1];
    PyObject *o[N_OPEN_KWS] = {0};
    for (size_t i = 0; i < N_OPEN_KWS; i++)
        kwlist[i] = (char *)open_kws[i].name;
    _Static_assert(N_OPEN_KWS == 19, "the format and the pointers below: one per keyword");
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|OOOOOOOOOOOOOOOOOOO:open", kwlist, &o[0], &o[1],
                                     &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8], &o[9], &o[10],
                                     &o[11], &o[12], &o[13], &o[14], &o[15], &o[16], &o[17],
                                     &o[18]))
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
    if (vpy_client_enter(self->client) < 0)
        return NULL;
    struct vase_seq *s = NULL;
    struct errbuf e;
    int r;
    Py_BEGIN_ALLOW_THREADS
        r = vase_seq_open(self->client->c, self->m, &cfg, &s);
        if (r < 0)
            vpy_save_error(self->client->c, &e);
    Py_END_ALLOW_THREADS
    SeqObject *so = NULL;
    if (r >= 0) {
        so = PyObject_New(SeqObject, vpy_seq_type);
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
    vpy_client_unpin(self->client);
    if (r < 0)
        return vpy_raise(r, e.msg);
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

static PyObject *model_batch(ModelObject *self, PyObject *unused) {
    (void)unused;
    return vpy_batch_new(self);
}

static PyMethodDef model_methods[] = {
    {"batch", (PyCFunction)model_batch, METH_NOARGS,
     "batch($self, /)\n--\n\nA Batch of this model: an engine step over many sequences in "
     "three calls (begin, layer per layer, finish), on a host arena of float32."},
    {"kv_tensor", (PyCFunction)(void (*)(void))model_kv_tensor, METH_VARARGS | METH_KEYWORDS,
     "kv_tensor($self, layer, kv)\n--\n\nK (kv='k') or V (kv='v') of one layer "
     "over the whole "
     "arena, a zero-copy Tensor [num_blocks][block_tokens][kv_heads][head_dim] "
     "with block stride "
     "page_bytes (vase_model_kv_tensor)."},
    {"open", (PyCFunction)(void (*)(void))model_open, METH_VARARGS | METH_KEYWORDS,
     "open($self, policy='vase-attnv', budget, window=64, prompt_len=0, "
     "mode='async', slack=-1, "
     "seed=0, n_sink=None, n_large=None, temperature=None, rank=None, "
     "lambda_=None, smooth=None, "
     "metric=None, admission_wait_ms=-1, min_budget=0, weight=0, "
     "protect_prompt=False, label=None)\n--\n\n"
     "Opens a sequence "
     "(vase_seq_open); parameters "
     "not given are vase_params_default(budget)'s. budget is required. "
     "admission_wait_ms: how "
     "long the open may wait for room when the arena is full (-1: the daemon's "
     "admission_wait_ms setting; 0: refused at once; at most 600000); the wait "
     "ends with "
     "VaseError ENOSPC when no room was freed in time. min_budget: the least "
     "budget the daemon "
     "may lower it to while opens wait for room (an elastic budget: a multiple "
     "of window, above "
     "it, at most budget; 0 or None: budget, not elastic). weight: its weight "
     "when budgets are "
     "lowered (0 or None: 1; at most 1000). protect_prompt: never evict the "
     "prompt, the first "
     "prompt_len slots, whatever the policy; it counts against the budget, so "
     "prompt_len must "
     "be at most budget - window (and min_budget - window when elastic). "
     "label: what the engine calls the sequence (its request id, say), shown by "
     "vasectl seqs: None or \"\" for none, else at most 64 characters of A-Z a-z 0-9 "
     "and ._:/@+=- (Seq.label). An invalid min_budget, "
     "weight, protected prompt or label raises VaseError(EINVAL)."},
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

PyType_Spec vpy_model_spec = {
    .name = "vase.Model",
    .basicsize = sizeof(ModelObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = model_slots,
};
