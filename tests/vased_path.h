/* SPDX-License-Identifier: MIT */
/* Where the tests that start vased themselves find it. */
#ifndef VASE_TESTS_VASED_PATH_H
#define VASE_TESTS_VASED_PATH_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/*
 * BUILD/vased into buf: BUILD is $VASE_BUILD_DIR (make check sets it), else, for a test run by
 * hand, the folder above the test program's own (BUILD/tests/NAME). 0, or -1 if neither tells.
 */
static inline int test_vased_path(char *buf, size_t len) {
    const char *bdir = getenv("VASE_BUILD_DIR");
    if (bdir)
        return snprintf(buf, len, "%s/vased", bdir) < (int)len ? 0 : -1;
    if (len < 16)
        return -1;
    ssize_t n = readlink("/proc/self/exe", buf, len - sizeof("/vased"));
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    for (int up = 0; up < 2; up++) {
        char *slash = strrchr(buf, '/');
        if (!slash)
            return -1;
        *slash = '\0';
    }
    strcat(buf, "/vased");
    return 0;
}

#endif
