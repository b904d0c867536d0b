/* SPDX-License-Identifier: MIT */

/* The daemon's log captured for tests (log_capture.h): stderr redirected to a memfd. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "log_capture.h"

static int saved_stderr = -1, capture_fd = -1;
static char captured[8192];

void log_capture_begin(void) {
    fflush(stderr);
    capture_fd = memfd_create("log", MFD_CLOEXEC);
    assert_true(capture_fd >= 0);
    saved_stderr = dup(STDERR_FILENO);
    assert_true(saved_stderr >= 0);
    assert_int_equal(dup2(capture_fd, STDERR_FILENO), STDERR_FILENO);
}

const char *log_capture_end(void) {
    fflush(stderr);
    assert_int_equal(dup2(saved_stderr, STDERR_FILENO), STDERR_FILENO);
    close(saved_stderr);
    ssize_t n = pread(capture_fd, captured, sizeof(captured) - 1, 0);
    close(capture_fd);
    captured[n > 0 ? n : 0] = '\0';
    return captured;
}
