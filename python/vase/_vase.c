/* SPDX-License-Identifier: MIT */

/*
 * The Python binding of libvase, the extension module vase._vase, on CPython's limited API (abi3,
 * 3.11: the buffer protocol joined it then). This file is the module: connect(), the hook that
 * registers vase.VaseError, the CPU paged attention (_vase_attend.c), and the four types made from
 * their specs at import. Each type lives in a file of its own (_vase_client.c, _vase_model.c,
 * _vase_seq.c, _vase_tensor.c; errors and argument conversion in _vase_errors.c and _vase_args.c);
 * _vase.h says how they keep libvase's memory alive under Python's objects.
 */

#include "_vase.h"

PyMODINIT_FUNC PyInit__vase(void);

PyTypeObject *vpy_client_type, *vpy_model_type, *vpy_seq_type, *vpy_tensor_type;

static PyMethodDef module_methods[] = {
    {"connect", (PyCFunction)(void (*)(void))vpy_connect, METH_VARARGS | METH_KEYWORDS,
     "connect(runtime_dir=None, name=None, timeout_ms=0)\n--\n\nConnects to vased."},
    {"paged_attention", (PyCFunction)(void (*)(void))vpy_paged_attention,
     METH_VARARGS | METH_KEYWORDS,
     "paged_attention(q, k, v, table, visible, out, scale, threads=1)\n--\n\n"
     "Attention of new queries over a host arena's pages, read in place (kernels/attend.c). "
     "q: float32 [b, n, q_heads, d], contiguous; k, v: a layer's paged K and V, [num_blocks, "
     "block_tokens, kv_heads, d], float32, float16 or bfloat16 (Model.kv_tensor(), or a "
     "strided view of it); table: int32 [b, blocks], contiguous, the block table of each "
     "sequence; visible: int32 [b, n], contiguous: query j of sequence i sees slots 0 .. "
     "visible[i, j] - 1, and 0 makes its output zeros; out: float32 [b, n, q_heads, d], "
     "contiguous, written; scale: the scores' factor; threads: OpenMP threads to run on (each "
     "takes a run of the sequences). Tensors through DLPack (or DLPack capsules), on the CPU. "
     "TypeError for a wrong dtype, ValueError for a wrong shape, stride or device, a visible "
     "count beyond the table's blocks or a table entry read that is not a block of k."},
    {"_set_error_type", vpy_set_error_type, METH_O, NULL},
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
    if (add_type(mod, "Client", &vpy_client_spec, &vpy_client_type) < 0 ||
        add_type(mod, "Model", &vpy_model_spec, &vpy_model_type) < 0 ||
        add_type(mod, "Seq", &vpy_seq_spec, &vpy_seq_type) < 0 ||
        add_type(mod, "Tensor", &vpy_tensor_spec, &vpy_tensor_type) < 0 ||
        add_type(mod, "Batch", &vpy_batch_spec, &vpy_batch_type) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
