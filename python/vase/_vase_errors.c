/* SPDX-License-Identifier: MIT */

/*
 * The errors of vase._vase: every failure of libvase reaches Python as vase.VaseError, an
 * OSError whose errno is the call's and whose text is libvase's message for it (vase_last_error(),
 * copied before another thread's call replaces it). vase/__init__.py registers the class.
 */

#include "_vase.h"

#include <stdarg.h>
#include <stdio.h>

static PyObject *VaseError; /* vase.VaseError, registered by vase/__init__.py */

PyObject *vpy_raise(int err, const char *message) {
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

PyObject *vpy_raisef(int err, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    return vpy_raise(err, buf);
}

void vpy_save_error(struct vase_client *c, struct errbuf *e) {
    snprintf(e->msg, sizeof(e->msg), "%s", vase_last_error(c));
}

PyObject *vpy_set_error_type(PyObject *mod, PyObject *cls) {
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
