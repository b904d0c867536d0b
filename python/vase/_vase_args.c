/* SPDX-License-Identifier: MIT */

/*
 * The argument conversion of vase._vase: Python integers checked against the range of the C
 * field they fill (ValueError outside it, TypeError for a non-integer), floats, str, "k"/"v", and
 * float32 buffers. Optional arguments (opt_*) leave their field alone for None.
 */

#include "_vase.h"

#include <errno.h>
#include <string.h>

/* An integer in [lo, hi]; ValueError outside, TypeError for a non-integer. */
int vpy_get_int(PyObject *o, const char *what, long long lo, unsigned long long hi,
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

int vpy_get_u32(PyObject *o, const char *what, uint32_t *ret) {
    unsigned long long v;
    if (vpy_get_int(o, what, 0, UINT32_MAX, &v) < 0)
        return -1;
    *ret = (uint32_t)v;
    return 0;
}

/* Optional arguments: NULL or None leave *ret alone. */
int vpy_opt_u32(PyObject *o, const char *what, uint32_t *ret) {
    return !o || o == Py_None ? 0 : vpy_get_u32(o, what, ret);
}

int vpy_opt_float(PyObject *o, const char *what, float *ret) {
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
const char *vpy_get_str(PyObject *o, const char *what) {
    if (!PyUnicode_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be a str", what);
        return NULL;
    }
    return PyUnicode_AsUTF8AndSize(o, NULL);
}

int vpy_get_kv(PyObject *o, enum vase_kv *ret) {
    const char *s = vpy_get_str(o, "kv");
    if (!s)
        return -1;
    if (strcmp(s, "k") == 0 || strcmp(s, "v") == 0) {
        *ret = s[0] == 'k' ? VASE_K : VASE_V;
        return 0;
    }
    vpy_raisef(-EINVAL, "kv '%s': want \"k\" or \"v\"", s);
    return -1;
}

/* A C-contiguous float32 buffer of o; release with PyBuffer_Release. */
int vpy_get_floats(PyObject *o, const char *what, Py_buffer *view) {
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
