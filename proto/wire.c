/* SPDX-License-Identifier: MIT */

/*
 * Envelope framing. Sizes are checked before protobuf-c sees a byte, so an oversized frame
 * costs nothing; a frame of another protocol version is reported as such rather than as a
 * malformed one.
 */

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

bool vase_wire_is_admin(Vase__Envelope__BodyCase body) {
    switch (body) {
    case VASE__ENVELOPE__BODY_PING:
    case VASE__ENVELOPE__BODY_STATUS:
    case VASE__ENVELOPE__BODY_LIST_CLIENTS:
    case VASE__ENVELOPE__BODY_LIST_SEQS:
    case VASE__ENVELOPE__BODY_GET_SEQ:
    case VASE__ENVELOPE__BODY_CONFIG_GET:
    case VASE__ENVELOPE__BODY_CONFIG_SET:
        return true;
    default:
        return false;
    }
}

bool vase_wire_is_request(Vase__Envelope__BodyCase body) {
    switch (body) {
    case VASE__ENVELOPE__BODY_REGISTER_MODEL:
    case VASE__ENVELOPE__BODY_OPEN_SEQ:
    case VASE__ENVELOPE__BODY_CLOSE_SEQ:
    case VASE__ENVELOPE__BODY_SET_BUDGET:
    case VASE__ENVELOPE__BODY_EVICT_REQUEST:
    case VASE__ENVELOPE__BODY_EVICT_COMMIT:
    case VASE__ENVELOPE__BODY_ATTN_STATS:
        return true;
    default:
        return vase_wire_is_admin(body);
    }
}

size_t vase_wire_utf8_len(const unsigned char *p, size_t avail, uint32_t *ret_cp) {
    unsigned char ch = p[0], lo = 0x80, hi = 0xbf;
    size_t n = 0;
    uint32_t cp;

    if (avail == 0)
        return 0;
    if (ch < 0x80) {
        *ret_cp = ch;
        return 1;
    }
    /* The range the second byte must be in rules out overlong forms, surrogates and values
     * past U+10FFFF. */
    if (ch >= 0xc2 && ch <= 0xdf) {
        n = 2;
        cp = ch & 0x1f;
    } else if (ch >= 0xe0 && ch <= 0xef) {
        n = 3;
        cp = ch & 0x0f;
        lo = ch == 0xe0 ? 0xa0 : 0x80;
        hi = ch == 0xed ? 0x9f : 0xbf;
    } else if (ch >= 0xf0 && ch <= 0xf4) {
        n = 4;
        cp = ch & 0x07;
        lo = ch == 0xf0 ? 0x90 : 0x80;
        hi = ch == 0xf4 ? 0x8f : 0xbf;
    } else {
        return 0;
    }
    if (n > avail || p[1] < lo || p[1] > hi)
        return 0;
    for (size_t k = 1; k < n; k++) {
        if (p[k] < 0x80 || p[k] > 0xbf)
            return 0;
        cp = cp << 6 | (p[k] & 0x3f);
    }
    *ret_cp = cp;
    return n;
}

/* Format characters (general category Cf, Unicode 15), the line and paragraph separators, and
 * the C1 controls: a terminal acts on them, or they change what the text around them shows
 * (U+202E writes the rest of a line backwards, U+200B hides a difference between two names). */
static const struct {
    uint32_t first, last;
} hidden_ranges[] = {
    {0x0080, 0x009f},   {0x00ad, 0x00ad},   {0x0600, 0x0605},   {0x061c, 0x061c},
    {0x06dd, 0x06dd},   {0x070f, 0x070f},   {0x0890, 0x0891},   {0x08e2, 0x08e2},
    {0x180e, 0x180e},   {0x200b, 0x200f},   {0x2028, 0x202e},   {0x2060, 0x2064},
    {0x2066, 0x206f},   {0xfeff, 0xfeff},   {0xfff9, 0xfffb},   {0x110bd, 0x110bd},
    {0x110cd, 0x110cd}, {0x13430, 0x1343f}, {0x1bca0, 0x1bca3}, {0x1d173, 0x1d17a},
    {0xe0001, 0xe0001}, {0xe0020, 0xe007f},
};

bool vase_wire_hidden_char(uint32_t cp) {
    if (cp < 0x20 || cp == 0x7f)
        return true;
    for (size_t i = 0; i < sizeof(hidden_ranges) / sizeof(hidden_ranges[0]); i++)
        if (cp >= hidden_ranges[i].first && cp <= hidden_ranges[i].last)
            return true;
    return false;
}

size_t vase_wire_escape(const char *in, char *out, size_t out_len) {
    const unsigned char *p = (const unsigned char *)in;
    size_t o = 0, left = strlen(in);

    if (out_len == 0)
        return 0;
    while (left > 0) {
        uint32_t cp = 0;
        size_t n = vase_wire_utf8_len(p, left, &cp);
        char esc[16];
        const char *piece = (const char *)p;
        size_t need = n;

        if (n == 0) { /* not UTF-8: the byte itself (a raw 0x9b is CSI to an 8-bit terminal) */
            need = (size_t)snprintf(esc, sizeof(esc), "\\x%02x", *p);
            piece = esc;
            n = 1;
        } else if (vase_wire_hidden_char(cp)) {
            if (cp < 0x80)
                need = (size_t)snprintf(esc, sizeof(esc), "\\x%02x", (unsigned)cp);
            else if (cp <= 0xffff)
                need = (size_t)snprintf(esc, sizeof(esc), "\\u%04x", (unsigned)cp);
            else
                need = (size_t)snprintf(esc, sizeof(esc), "\\U%08x", (unsigned)cp);
            piece = esc;
        }
        if (o + need >= out_len)
            break;
        memcpy(out + o, piece, need);
        o += need;
        p += n;
        left -= n;
    }
    out[o] = '\0';
    return o;
}

static bool label_byte(unsigned char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           (ch && strchr(VASE_WIRE_LABEL_PUNCT, ch));
}

int vase_wire_label_check(const char *label, char *why, size_t why_size) {
    const unsigned char *p = (const unsigned char *)label;
    size_t i = 0;

    while (i < VASE_WIRE_LABEL_MAX && p[i] && label_byte(p[i]))
        i++;
    if (p[i] == '\0')
        return 0;
    if (why && why_size) {
        if (i == VASE_WIRE_LABEL_MAX)
            snprintf(why, why_size, "label is longer than %u bytes", VASE_WIRE_LABEL_MAX);
        else
            snprintf(why, why_size,
                     "label byte %zu is 0x%02x (want at most %u bytes of A-Z a-z 0-9 %s)", i, p[i],
                     VASE_WIRE_LABEL_MAX, VASE_WIRE_LABEL_PUNCT);
    }
    return -EINVAL;
}
