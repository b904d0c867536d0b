/* SPDX-License-Identifier: MIT */

/*
 * The .npy loader of the test programs. It owns nothing beyond the arrays it returns. A file is
 * trusted only after every part of it has been checked: the magic and version, a header length
 * that fits in the file, a header that is exactly the dict NumPy writes (descr, fortran_order,
 * shape, each once, nothing else), and a data section whose size is exactly what the shape
 * implies. Sizes are computed with overflow checks before anything is allocated, so a hostile
 * header cannot make the loader allocate more than VASE_NPY_MAX_BYTES.
 */

#include "npy.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* NumPy itself refuses headers over 10000 bytes by default; a little more room costs nothing. */
#define MAX_HEADER_LEN 65536u

/* Magic (6), version (2) and the header length (2 in format 1.0, 4 in 2.0). */
#define PREFIX_MAX 12u

static const char magic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};

size_t vase_npy_dtype_size(char dtype) {
    return dtype == 'f' || dtype == 'i' ? 4 : 0;
}

const char *vase_npy_dtype_name(char dtype) {
    switch (dtype) {
    case 'f':
        return "<f4";
    case 'i':
        return "<i4";
    default:
        return "?";
    }
}

struct vase_npy *vase_npy_free(struct vase_npy *a) {
    if (!a)
        return NULL;
    free(a->data);
    free(a);
    return NULL;
}

static int bad(const char *path, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int bad(const char *path, const char *fmt, ...) {
    va_list ap;

    fprintf(stderr, "npy: %s: ", path);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return -EINVAL;
}

/* Reads exactly n bytes at offset off; a file that ends early is malformed (-EINVAL). */
static int read_at(int fd, const char *path, void *buf, size_t n, off_t off) {
    char *p = buf;

    while (n > 0) {
        ssize_t k = pread(fd, p, n, off);

        if (k < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (k == 0)
            return bad(path, "file is truncated");
        p += k;
        n -= (size_t)k;
        off += k;
    }
    return 0;
}

/*
 * A cursor over the header text. The header is a Python dict literal; only the subset NumPy
 * writes is accepted: quoted strings without escapes, True/False, and tuples of non-negative
 * decimal integers.
 */
struct cursor {
    const char *start;
    const char *p;
    const char *end;
    const char *path;
};

static void skip_space(struct cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static bool peek(struct cursor *c, char ch) {
    skip_space(c);
    return c->p < c->end && *c->p == ch;
}

static int expect(struct cursor *c, char ch) {
    if (!peek(c, ch))
        return bad(c->path, "header: expected '%c' at offset %td", ch, c->p - c->start);
    c->p++;
    return 0;
}

static int parse_string(struct cursor *c, char *buf, size_t size) {
    char quote;
    size_t n = 0;

    skip_space(c);
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"'))
        return bad(c->path, "header: expected a quoted string");
    quote = *c->p++;
    while (c->p < c->end && *c->p != quote) {
        /* Escapes never occur in the keys and dtypes NumPy writes; refusing them keeps this
         * parser from having to implement Python's string rules. */
        if (*c->p == '\\' || *c->p == '\n')
            return bad(c->path, "header: unsupported character in a string");
        if (n + 1 >= size)
            return bad(c->path, "header: string too long");
        buf[n++] = *c->p++;
    }
    if (c->p >= c->end)
        return bad(c->path, "header: unterminated string");
    c->p++;
    buf[n] = '\0';
    return 0;
}

static int parse_bool(struct cursor *c, bool *ret) {
    skip_space(c);
    if ((size_t)(c->end - c->p) >= 4 && memcmp(c->p, "True", 4) == 0) {
        c->p += 4;
        *ret = true;
    } else if ((size_t)(c->end - c->p) >= 5 && memcmp(c->p, "False", 5) == 0) {
        c->p += 5;
        *ret = false;
    } else
        return bad(c->path, "header: expected True or False");
    return 0;
}

static bool is_digit(char ch) {
    return ch >= '0' && ch <= '9';
}

/* One dimension: a decimal integer without sign or leading zeros, at most VASE_NPY_MAX_BYTES
 * (no data section could hold a longer axis unless another one is empty). */
static int parse_dim(struct cursor *c, size_t *ret) {
    uint64_t v = 0;
    const char *start;

    skip_space(c);
    start = c->p;
    while (c->p < c->end && is_digit(*c->p)) {
        v = v * 10 + (uint64_t)(*c->p - '0');
        if (v > VASE_NPY_MAX_BYTES) {
            bad(c->path, "header: dimension too large");
            return -EFBIG;
        }
        c->p++;
    }
    if (c->p == start)
        return bad(c->path, "header: expected a dimension");
    if (*start == '0' && c->p - start > 1)
        return bad(c->path, "header: dimension with a leading zero");
    *ret = (size_t)v;
    return 0;
}

/* A shape tuple: "()", "(n,)", "(n, m)", "(n, m,)", ... A parenthesised single integer without
 * a comma is not a tuple in Python and is refused, as NumPy refuses it. */
static int parse_shape(struct cursor *c, size_t shape[static VASE_NPY_MAX_DIMS],
                       unsigned *ret_ndim) {
    unsigned ndim = 0;
    bool comma = false;
    int r;

    r = expect(c, '(');
    if (r < 0)
        return r;
    while (!peek(c, ')')) {
        if (ndim == VASE_NPY_MAX_DIMS)
            return bad(c->path, "header: more than %d dimensions", VASE_NPY_MAX_DIMS);
        r = parse_dim(c, &shape[ndim++]);
        if (r < 0)
            return r;
        comma = peek(c, ',');
        if (!comma)
            break;
        c->p++;
    }
    r = expect(c, ')');
    if (r < 0)
        return r;
    if (ndim == 1 && !comma)
        return bad(c->path, "header: shape is not a tuple");
    *ret_ndim = ndim;
    return 0;
}

/* Parses the header dict into a (still empty) array; every key must appear exactly once. */
static int parse_header(const char *path, const char *text, size_t len, struct vase_npy *a) {
    struct cursor c = {.start = text, .p = text, .end = text + len, .path = path};
    bool have_descr = false, have_order = false, have_shape = false;
    int r;

    r = expect(&c, '{');
    if (r < 0)
        return r;
    while (!peek(&c, '}')) {
        char key[32];

        r = parse_string(&c, key, sizeof key);
        if (r < 0)
            return r;
        r = expect(&c, ':');
        if (r < 0)
            return r;
        if (strcmp(key, "descr") == 0) {
            char descr[32];

            if (have_descr)
                return bad(path, "header: duplicate key 'descr'");
            have_descr = true;
            r = parse_string(&c, descr, sizeof descr);
            if (r < 0)
                return r;
            if (strcmp(descr, "<f4") == 0)
                a->dtype = 'f';
            else if (strcmp(descr, "<i4") == 0)
                a->dtype = 'i';
            else
                return bad(path, "unsupported dtype '%s' (only <f4 and <i4)", descr);
        } else if (strcmp(key, "fortran_order") == 0) {
            bool fortran = false;

            if (have_order)
                return bad(path, "header: duplicate key 'fortran_order'");
            have_order = true;
            r = parse_bool(&c, &fortran);
            if (r < 0)
                return r;
            if (fortran)
                return bad(path, "Fortran-order arrays are not supported");
        } else if (strcmp(key, "shape") == 0) {
            if (have_shape)
                return bad(path, "header: duplicate key 'shape'");
            have_shape = true;
            r = parse_shape(&c, a->shape, &a->ndim);
            if (r < 0)
                return r;
        } else
            return bad(path, "header: unknown key '%s'", key);

        if (!peek(&c, ','))
            break;
        c.p++;
    }
    r = expect(&c, '}');
    if (r < 0)
        return r;
    skip_space(&c);
    if (c.p != c.end)
        return bad(path, "header: trailing characters after the dict");
    if (!have_descr || !have_order || !have_shape)
        return bad(path, "header: missing key '%s'",
                   !have_descr   ? "descr"
                   : !have_order ? "fortran_order"
                                 : "shape");
    return 0;
}

/* The element count of a shape, refusing products over VASE_NPY_MAX_BYTES / esize. Every
 * dimension is already at most VASE_NPY_MAX_BYTES, so count * dim cannot overflow 64 bits. */
static int shape_count(const struct vase_npy *a, size_t esize, size_t *ret) {
    uint64_t count = 1;

    for (unsigned i = 0; i < a->ndim; i++)
        if (a->shape[i] == 0) {
            *ret = 0;
            return 0;
        }
    for (unsigned i = 0; i < a->ndim; i++) {
        count *= a->shape[i];
        if (count > VASE_NPY_MAX_BYTES / esize)
            return -EFBIG;
    }
    *ret = (size_t)count;
    return 0;
}

static bool host_is_little_endian(void) {
    const uint32_t one = 1;
    unsigned char b;

    memcpy(&b, &one, 1);
    return b == 1;
}

static void swap32(void *data, size_t count) {
    unsigned char *p = data;

    for (size_t i = 0; i < count; i++, p += 4) {
        unsigned char t0 = p[0], t1 = p[1];

        p[0] = p[3];
        p[1] = p[2];
        p[2] = t1;
        p[3] = t0;
    }
}

int vase_npy_load(const char *path, struct vase_npy **ret) {
    unsigned char prefix[PREFIX_MAX];
    struct vase_npy *a = NULL;
    char *header = NULL;
    struct stat st;
    uint64_t header_len, data_off, data_bytes, file_size;
    size_t prefix_len, esize;
    int fd, r;

    if (!path || !ret)
        return -EINVAL;

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    if (fstat(fd, &st) < 0) {
        r = -errno;
        goto close_fd;
    }
    if (S_ISDIR(st.st_mode)) {
        r = -EISDIR;
        goto close_fd;
    }
    if (!S_ISREG(st.st_mode)) {
        r = bad(path, "not a regular file");
        goto close_fd;
    }
    file_size = (uint64_t)st.st_size;

    if (file_size < 10) {
        r = bad(path, "too short for a .npy file");
        goto close_fd;
    }
    r = read_at(fd, path, prefix, 10, 0);
    if (r < 0)
        goto close_fd;
    if (memcmp(prefix, magic, sizeof magic) != 0) {
        r = bad(path, "not a .npy file (bad magic)");
        goto close_fd;
    }
    if (prefix[6] == 1 && prefix[7] == 0) {
        prefix_len = 10;
        header_len = (uint64_t)prefix[8] | (uint64_t)prefix[9] << 8;
    } else if (prefix[6] == 2 && prefix[7] == 0) {
        prefix_len = 12;
        if (file_size < prefix_len) {
            r = bad(path, "too short for a .npy file");
            goto close_fd;
        }
        r = read_at(fd, path, prefix + 10, 2, 10);
        if (r < 0)
            goto close_fd;
        header_len = (uint64_t)prefix[8] | (uint64_t)prefix[9] << 8 | (uint64_t)prefix[10] << 16 |
                     (uint64_t)prefix[11] << 24;
    } else {
        r = bad(path, "unsupported format version %u.%u (only 1.0 and 2.0)", prefix[6], prefix[7]);
        goto close_fd;
    }
    if (header_len > MAX_HEADER_LEN || header_len > file_size - prefix_len) {
        r = bad(path, "header length %llu does not fit the file", (unsigned long long)header_len);
        goto close_fd;
    }

    header = malloc((size_t)header_len + 1);
    if (!header) {
        r = -ENOMEM;
        goto close_fd;
    }
    r = read_at(fd, path, header, (size_t)header_len, (off_t)prefix_len);
    if (r < 0)
        goto free_header;
    if (memchr(header, '\0', (size_t)header_len)) {
        r = bad(path, "header contains a NUL byte");
        goto free_header;
    }
    header[header_len] = '\0';

    a = calloc(1, sizeof *a);
    if (!a) {
        r = -ENOMEM;
        goto free_header;
    }
    r = parse_header(path, header, (size_t)header_len, a);
    if (r < 0)
        goto free_array;

    esize = vase_npy_dtype_size(a->dtype);
    r = shape_count(a, esize, &a->count);
    if (r < 0) {
        fprintf(stderr, "npy: %s: array larger than %llu bytes\n", path,
                (unsigned long long)VASE_NPY_MAX_BYTES);
        goto free_array;
    }
    data_bytes = (uint64_t)a->count * esize;
    data_off = prefix_len + header_len;
    if (file_size - data_off != data_bytes) {
        r = bad(path, "data section is %llu bytes, the shape needs %llu",
                (unsigned long long)(file_size - data_off), (unsigned long long)data_bytes);
        goto free_array;
    }

    /* One byte at least, so that data is never NULL even for an empty array. */
    a->data = malloc(data_bytes ? (size_t)data_bytes : 1);
    if (!a->data) {
        r = -ENOMEM;
        goto free_array;
    }
    r = read_at(fd, path, a->data, (size_t)data_bytes, (off_t)data_off);
    if (r < 0)
        goto free_array;
    if (!host_is_little_endian())
        swap32(a->data, a->count);

    free(header);
    close(fd);
    *ret = a;
    return 0;

free_array:
    vase_npy_free(a);
free_header:
    free(header);
close_fd:
    close(fd);
    return r;
}
