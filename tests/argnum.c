/* SPDX-License-Identifier: MIT */

/*
 * The command-line number parsers of the example engines and the benchmarks. strtoull()
 * alone would accept leading blanks and a minus sign (and wrap it); these accept only digits.
 */

#include "argnum.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int argnum_u64(const char *s, uint64_t min, uint64_t max, uint64_t *ret) {
    unsigned long long v;
    char *end;

    if (s[0] < '0' || s[0] > '9')
        return -EINVAL;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno == ERANGE)
        return -ERANGE;
    if (errno != 0 || end == s || *end != '\0')
        return -EINVAL;
    if (v < min || v > max)
        return -ERANGE;
    *ret = v;
    return 0;
}

int argnum_u32(const char *s, uint32_t min, uint32_t max, uint32_t *ret) {
    uint64_t v;
    int r = argnum_u64(s, min, max, &v);

    if (r < 0)
        return r;
    *ret = (uint32_t)v;
    return 0;
}

int argnum_u32_list(const char *s, uint32_t min, uint32_t max, uint32_t *ret, size_t cap,
                    size_t *ret_n) {
    uint32_t vals[64];
    size_t n = 0;

    if (cap > sizeof(vals) / sizeof(vals[0]))
        cap = sizeof(vals) / sizeof(vals[0]);
    for (const char *p = s;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char item[24];
        if (n == cap || len == 0 || len >= sizeof(item))
            return -EINVAL;
        memcpy(item, p, len);
        item[len] = '\0';
        int r = argnum_u32(item, min, max, &vals[n]);
        if (r < 0)
            return r;
        n++;
        if (!comma)
            break;
        p = comma + 1;
    }
    memcpy(ret, vals, n * sizeof(*ret));
    *ret_n = n;
    return 0;
}
