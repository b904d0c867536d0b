/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The daemon's log (stderr) captured between two calls, so that a test can check what a
 * failure logged. Failures are cmocka assertions; include <cmocka.h> (and what it needs)
 * before this header. Not reentrant: one capture at a time.
 */

/* Sends stderr to a fresh buffer. */
void log_capture_begin(void);
/* Restores stderr; what was written since log_capture_begin() (at most 8 KiB), NUL-terminated,
 * valid until the next capture. */
const char *log_capture_end(void);
