/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * A small, strict loader for NumPy .npy files, for the test vectors. It reads format 1.0 and
 * 2.0 files holding a C-order array of little-endian float32 ('<f4') or int32 ('<i4') with up
 * to VASE_NPY_MAX_DIMS dimensions, and refuses everything else.
 */

#include <stddef.h>
#include <stdint.h>

#define VASE_NPY_MAX_DIMS 4

/* The largest data section the loader accepts (1 GiB); test vectors are far smaller. */
#define VASE_NPY_MAX_BYTES ((uint64_t)1 << 30)

struct vase_npy {
    char dtype;                      /* 'f': float32, 'i': int32 */
    unsigned ndim;                   /* 0 (a scalar) .. VASE_NPY_MAX_DIMS */
    size_t shape[VASE_NPY_MAX_DIMS]; /* entries past ndim are 0 */
    size_t count;                    /* product of the shape; 1 for a scalar */
    void *data;                      /* count elements in host byte order, C order; never NULL */
};

/*
 * Loads the file at path into a new array owned by the caller (free it with vase_npy_free()).
 * Returns 0; -EINVAL for a malformed or unsupported file (a one-line reason goes to stderr),
 * -EFBIG for data larger than VASE_NPY_MAX_BYTES, -ENOMEM, or -errno from the file system
 * (-ENOENT when the file does not exist). *ret is untouched on failure.
 */
int vase_npy_load(const char *path, struct vase_npy **ret);

/* Frees an array; accepts NULL. Returns NULL. */
struct vase_npy *vase_npy_free(struct vase_npy *a);

/* The element size of a dtype ('f' or 'i'): 4, or 0 for anything else. */
size_t vase_npy_dtype_size(char dtype);

/* The NumPy spelling of a dtype, "<f4" or "<i4" ("?" for anything else). */
const char *vase_npy_dtype_name(char dtype);
