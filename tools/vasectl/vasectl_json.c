/* SPDX-License-Identifier: MIT */

/*
 * vasectl's JSON output, produced from the protobuf descriptors, so that every field of the
 * schema shows up without this file having to list it. Strings are escaped and invalid UTF-8
 * is replaced by U+FFFD, so the output always parses, whatever a client named itself; C1
 * controls and format characters (vase_admin_hidden_char()) are written as \u escapes, so the
 * output is the same text but also safe to read on a terminal.
 */

#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "vasectl.h"

/* The length of the valid UTF-8 sequence at p (at most avail bytes) with its code point in
 * *ret_cp, 0 if there is none. The range the second byte must be in rules out overlong forms,
 * surrogates and values past U+10FFFF. */
static size_t utf8_len(const unsigned char *p, size_t avail, uint32_t *ret_cp) {
    unsigned char ch = p[0], lo = 0x80, hi = 0xbf;
    size_t n = 0;

    if (ch >= 0xc2 && ch <= 0xdf)
        n = 2;
    else if (ch >= 0xe0 && ch <= 0xef) {
        n = 3;
        lo = ch == 0xe0 ? 0xa0 : 0x80;
        hi = ch == 0xed ? 0x9f : 0xbf;
    } else if (ch >= 0xf0 && ch <= 0xf4) {
        n = 4;
        lo = ch == 0xf0 ? 0x90 : 0x80;
        hi = ch == 0xf4 ? 0x8f : 0xbf;
    }
    if (n == 0 || n > avail || p[1] < lo || p[1] > hi)
        return 0;
    uint32_t cp = ch & (0x7f >> n);
    for (size_t k = 1; k < n; k++) {
        if (p[k] < 0x80 || p[k] > 0xbf)
            return 0;
        cp = cp << 6 | (p[k] & 0x3f);
    }
    *ret_cp = cp;
    return n;
}

/* One character of a JSON string as \uXXXX, beyond the BMP as a UTF-16 surrogate pair. */
static void json_u_escape(FILE *f, uint32_t cp) {
    if (cp <= 0xffff) {
        fprintf(f, "\\u%04x", (unsigned)cp);
        return;
    }
    cp -= 0x10000;
    fprintf(f, "\\u%04x\\u%04x", (unsigned)(0xd800 + (cp >> 10)),
            (unsigned)(0xdc00 + (cp & 0x3ff)));
}

void vasectl_json_string(FILE *f, const char *s, size_t len) {
    const unsigned char *p = (const unsigned char *)s;
    fputc('"', f);
    for (size_t i = 0; i < len;) {
        unsigned char ch = p[i];
        uint32_t cp = 0;
        size_t n = 1;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch == '\n')
            fputs("\\n", f);
        else if (ch == '\t')
            fputs("\\t", f);
        else if (ch < 0x20 || ch == 0x7f)
            fprintf(f, "\\u%04x", ch);
        else if (ch < 0x80)
            fputc(ch, f);
        else if ((n = utf8_len(p + i, len - i, &cp)) > 0 && vase_admin_hidden_char(cp))
            json_u_escape(f, cp); /* the same string, with nothing a terminal acts on */
        else if (n > 0)
            fwrite(p + i, 1, n, f);
        else {
            fputs("\\ufffd", f);
            n = 1;
        }
        i += n;
    }
    fputc('"', f);
}

static void json_double(FILE *f, double d) {
    if (isfinite(d))
        fprintf(f, "%.17g", d);
    else
        fputs("null", f); /* JSON has no NaN or infinity */
}

/* An enum value's name without its type prefix, lowercased: MODE_ASYNC -> "async". */
static void json_enum(FILE *f, const ProtobufCEnumDescriptor *d, int value) {
    const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(d, value);
    if (!v) {
        fprintf(f, "%d", value);
        return;
    }
    const char *name = v->name;
    const char *u = strchr(name, '_');
    if (u && u[1])
        name = u + 1;
    char buf[64];
    size_t n = 0;
    for (; name[n] && n < sizeof(buf) - 1; n++)
        buf[n] = (char)((name[n] >= 'A' && name[n] <= 'Z') ? name[n] - 'A' + 'a' : name[n]);
    vasectl_json_string(f, buf, n);
}

static void json_message(FILE *f, const ProtobufCMessage *m);

static void json_value(FILE *f, const ProtobufCFieldDescriptor *fd, const void *p) {
    switch (fd->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        fprintf(f, "%" PRId32, *(const int32_t *)p);
        break;
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        fprintf(f, "%" PRIu32, *(const uint32_t *)p);
        break;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        fprintf(f, "%" PRId64, *(const int64_t *)p);
        break;
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        /* The incarnation is an identifier, and above 2^53 many JSON readers round numbers. */
        if (strcmp(fd->name, "incarnation") == 0)
            fprintf(f, "\"0x%016" PRIx64 "\"", *(const uint64_t *)p);
        else
            fprintf(f, "%" PRIu64, *(const uint64_t *)p);
        break;
    case PROTOBUF_C_TYPE_FLOAT:
        json_double(f, *(const float *)p);
        break;
    case PROTOBUF_C_TYPE_DOUBLE:
        json_double(f, *(const double *)p);
        break;
    case PROTOBUF_C_TYPE_BOOL:
        fputs(*(const protobuf_c_boolean *)p ? "true" : "false", f);
        break;
    case PROTOBUF_C_TYPE_ENUM:
        json_enum(f, fd->descriptor, *(const int *)p);
        break;
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(char *const *)p;
        s = s ? s : "";
        vasectl_json_string(f, s, strlen(s));
        break;
    }
    case PROTOBUF_C_TYPE_BYTES: {
        const ProtobufCBinaryData *b = p;
        fputc('"', f);
        for (size_t i = 0; i < b->len; i++)
            fprintf(f, "%02x", b->data[i]);
        fputc('"', f);
        break;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *sub = *(ProtobufCMessage *const *)p;
        if (sub)
            json_message(f, sub);
        else
            fputs("null", f);
        break;
    }
    }
}

static size_t value_size(const ProtobufCFieldDescriptor *fd) {
    switch (fd->type) {
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE:
        return 8;
    case PROTOBUF_C_TYPE_STRING:
    case PROTOBUF_C_TYPE_MESSAGE:
        return sizeof(void *);
    case PROTOBUF_C_TYPE_BYTES:
        return sizeof(ProtobufCBinaryData);
    case PROTOBUF_C_TYPE_BOOL:
        return sizeof(protobuf_c_boolean);
    default:
        return 4;
    }
}

/* Every field of m, by the descriptor, as the members of a JSON object (no braces; a comma
 * first unless first): repeated fields as arrays, a oneof only for its set member, proto3
 * scalars always (zero is a value worth showing in a status). */
void vasectl_json_fields(FILE *f, const ProtobufCMessage *m, bool first) {
    const ProtobufCMessageDescriptor *d = m->descriptor;
    const char *base = (const char *)m;

    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *fd = &d->fields[i];
        if (fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            uint32_t which = *(const uint32_t *)(base + fd->quantifier_offset);
            if (which != fd->id)
                continue;
        }
        fprintf(f, "%s\"%s\":", first ? "" : ",", fd->name);
        first = false;
        if (fd->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(base + fd->quantifier_offset);
            const char *arr = *(char *const *)(base + fd->offset);
            size_t sz = value_size(fd);
            fputc('[', f);
            for (size_t k = 0; k < n; k++) {
                if (k)
                    fputc(',', f);
                json_value(f, fd, arr + k * sz);
            }
            fputc(']', f);
        } else
            json_value(f, fd, base + fd->offset);
    }
}

static void json_message(FILE *f, const ProtobufCMessage *m) {
    fputc('{', f);
    vasectl_json_fields(f, m, true);
    fputc('}', f);
}

void vasectl_json_line(const ProtobufCMessage *m) {
    json_message(stdout, m);
    putchar('\n');
}
