/* SPDX-License-Identifier: MIT */

/*
 * Error names. vase_strerror() must be callable from any thread and its result must stay valid
 * for ever, so it returns only static strings: glibc's own table of errno descriptions
 * (strerrordesc_np, which, unlike strerror, never formats into a shared buffer) and the two
 * vase codes.
 */

#include <limits.h>
#include <string.h>

#include "vase.h"

const char *vase_strerror(int err) {
    if (err == INT_MIN)
        return "Unknown error";
    if (err < 0)
        err = -err;
    switch (err) {
    case 0:
        return "Success";
    case VASE_EPROTOVERSION:
        return "vased speaks another protocol version";
    case VASE_ESTALE:
        return "vased restarted (stale incarnation); reconnect";
    default:
        break;
    }
    const char *s = strerrordesc_np(err);
    return s ? s : "Unknown error";
}
