/* SPDX-License-Identifier: MIT */

/*
 * Envelope framing. Sizes are checked before protobuf-c sees a byte, so an oversized frame
 * costs nothing; a frame of another protocol version is reported as such rather than as a
 * malformed one.
 */

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>

#include "wire.h"

int vase_wire_unpack(const void *buf, size_t len, size_t max, Vase__Envelope **ret) {
    if (!ret || (!buf && len))
        return -EINVAL;
    if (len > max || len > VASE_WIRE_HARD_MAX)
        return -EMSGSIZE;
    Vase__Envelope *e = vase__envelope__unpack(NULL, len, buf);
    if (!e)
        return -EBADMSG;
    *ret = e;
    if (e->version != VASE_WIRE_VERSION)
        return -VASE_EPROTOVERSION;
    if (e->body_case == VASE__ENVELOPE__BODY__NOT_SET)
        return -EINVAL;
    return 0;
}

int vase_wire_pack(const Vase__Envelope *e, void **ret_buf, size_t *ret_len) {
    size_t len = vase__envelope__get_packed_size(e);
    void *buf = malloc(len ? len : 1);
    if (!buf)
        return -ENOMEM;
    vase__envelope__pack(e, buf);
    *ret_buf = buf;
    *ret_len = len;
    return 0;
}

const char *vase_wire_body_name(const Vase__Envelope *e) {
    const ProtobufCFieldDescriptor *f =
        protobuf_c_message_descriptor_get_field(&vase__envelope__descriptor, e->body_case);
    return f ? f->name : "none";
}

size_t vase_wire_escape(const char *in, char *out, size_t out_len) {
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;

    if (out_len == 0)
        return 0;
    for (const unsigned char *p = (const unsigned char *)in; *p; p++) {
        bool control = *p < 0x20 || *p == 0x7f;
        size_t need = control ? 4 : 1;
        if (o + need >= out_len)
            break;
        if (control) {
            out[o++] = '\\';
            out[o++] = 'x';
            out[o++] = hex[*p >> 4];
            out[o++] = hex[*p & 15];
        } else {
            out[o++] = (char)*p;
        }
    }
    out[o] = '\0';
    return o;
}
