/* SPDX-License-Identifier: MIT */

/*
 * The checked number parsers of every number vased reads from text (settings, allow-lists,
 * headers): the whole string or nothing, -EINVAL or -ERANGE, never a silent wrap or a partial
 * read. Pure functions: no state, no I/O.
 */

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parse.h"

/* A decimal number; with suffix, optionally followed by K, M, G or T (then nothing, B or iB)
 * for 2^10 .. 2^40. strtoull() would also accept leading blanks and a minus sign; this accepts
 * neither. */
static int parse_number(const char *s, bool suffix, uint64_t *ret) {
    if (!s || !ret)
        return -EINVAL;
    if (!isdigit((unsigned char)s[0]))
        return -EINVAL;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno == ERANGE)
        return -ERANGE;
    if (errno || (*end && !suffix))
        return -EINVAL;

    unsigned shift = 0;
    switch (*end) {
    case '\0':
        break;
    case 'k':
    case 'K':
        shift = 10;
        break;
    case 'm':
    case 'M':
        shift = 20;
        break;
    case 'g':
    case 'G':
        shift = 30;
        break;
    case 't':
    case 'T':
        shift = 40;
        break;
    default:
        return -EINVAL;
    }
    if (shift) {
        end++;
        if (strcmp(end, "") != 0 && strcmp(end, "B") != 0 && strcmp(end, "iB") != 0)
            return -EINVAL;
    }
    if (shift && v > (UINT64_MAX >> shift))
        return -ERANGE;
    *ret = (uint64_t)v << shift;
    return 0;
}

int vase_parse_u64(const char *s, uint64_t *ret) {
    return parse_number(s, false, ret);
}

int vase_parse_i64(const char *s, int64_t *ret) {
    if (!s || !ret)
        return -EINVAL;
    const char *p = s[0] == '-' || s[0] == '+' ? s + 1 : s;
    if (!isdigit((unsigned char)p[0]))
        return -EINVAL;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno == ERANGE)
        return -ERANGE;
    if (errno || *end)
        return -EINVAL;
    *ret = v;
    return 0;
}

int vase_parse_size(const char *s, uint64_t *ret) {
    return parse_number(s, true, ret);
}

void vase_format_size(uint64_t v, char *buf, size_t len) {
    static const char suffix[] = "KMGT";
    int i = -1;
    while (v && i < 3 && v % 1024 == 0) {
        v /= 1024;
        i++;
    }
    if (i < 0)
        snprintf(buf, len, "%" PRIu64, v);
    else
        snprintf(buf, len, "%" PRIu64 "%c", v, suffix[i]);
}
