#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""abi_check.py RELEASED CURRENT: vase.proto's ABI rule, checked.

libvase hands out the structs protobuf-c generates from proto/vase.proto (lib/vase_admin.h):
a program built against one release reads their members at the offsets of that release. They
stay where they were only while a message gains fields at its end. So, against RELEASED (the
schema of the last release, proto/released/vase.proto), CURRENT may:
  - add messages and enums, and values to enums;
  - add fields at the end of a message (after every released field), numbered above all of that
    message's released fields; a field joining a released oneof must be a message or a string
    (a pointer: the union it shares keeps its size);
and nothing else: each released message keeps its fields in the same order with the same name,
number, type, label (repeated, optional) and oneof; each released enum value keeps its name and
number. Comments and layout do not count.

Prints one line per breach and exits 1 if there is any, 0 otherwise; 2 when a file cannot be
read or holds a construct this reader does not know (it refuses rather than guesses).
"""

import re
import sys

TOKEN = re.compile(r'\s+|//[^\n]*|/\*.*?\*/|"(?:[^"\\]|\\.)*"|[A-Za-z_][\w.]*|-?\d+|[{}\[\]<>;=,()]',
                   re.S)
SCALARS = {"double", "float", "int32", "int64", "uint32", "uint64", "sint32", "sint64", "fixed32",
           "fixed64", "sfixed32", "sfixed64", "bool", "string", "bytes"}


class ProtoError(Exception):
    pass


def tokens(text, path):
    out, pos = [], 0
    while pos < len(text):
        m = TOKEN.match(text, pos)
        if not m:
            line = text.count("\n", 0, pos) + 1
            raise ProtoError(f"{path}:{line}: cannot read {text[pos:pos + 20]!r}")
        t = m.group(0)
        if not (t.isspace() or t.startswith("//") or t.startswith("/*")):
            out.append(t)
        pos = m.end()
    return out


class Reader:
    def __init__(self, toks, path):
        self.toks, self.i, self.path = toks, 0, path
        self.messages = {}  # name: [(name, number, type, label, oneof)] in declaration order
        self.enums = {}     # name: {value name: number}

    def peek(self):
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, want=None):
        t = self.peek()
        if t is None or (want is not None and t != want):
            raise ProtoError(f"{self.path}: expected {want or 'more'}, found {t}")
        self.i += 1
        return t

    def skip_statement(self):
        while self.take() != ";":
            pass

    def skip_options(self):
        if self.peek() == "[":
            while self.take() != "]":
                pass

    def file(self):
        while self.peek() is not None:
            t = self.take()
            if t in ("syntax", "package", "option", "import"):
                self.skip_statement()
            elif t == "message":
                self.message("")
            elif t == "enum":
                self.enum("")
            elif t != ";":
                raise ProtoError(f"{self.path}: unknown top-level construct {t!r}")

    def enum(self, scope):
        name = scope + self.take()
        values = self.enums.setdefault(name, {})
        self.take("{")
        while (t := self.take()) != "}":
            if t in ("option", "reserved"):
                self.skip_statement()
                continue
            self.take("=")
            values[t] = int(self.take())
            self.skip_options()
            self.take(";")

    def field(self, fields, oneof):
        t = self.take()
        label = ""
        if t in ("repeated", "optional"):
            label, t = t, self.take()
        ftype = t
        if t == "map":
            ftype = "map" + "".join(self.take() for _ in range(5))  # <K,V>
        name = self.take()
        self.take("=")
        number = int(self.take())
        self.skip_options()
        self.take(";")
        fields.append((name, number, ftype, label, oneof))

    def message(self, scope):
        name = scope + self.take()
        fields = self.messages.setdefault(name, [])
        self.take("{")
        while (t := self.peek()) != "}":
            if t in ("option", "reserved", "extensions"):
                self.skip_statement()
            elif t == ";":
                self.take()
            elif t == "message":
                self.take()
                self.message(name + ".")
            elif t == "enum":
                self.take()
                self.enum(name + ".")
            elif t == "oneof":
                self.take()
                oneof = self.take()
                self.take("{")
                while self.peek() != "}":
                    if self.peek() == "option":
                        self.skip_statement()
                    else:
                        self.field(fields, oneof)
                self.take("}")
            elif t is None:
                raise ProtoError(f"{self.path}: message {name} is not closed")
            else:
                self.field(fields, "")
        self.take("}")


def read(path):
    with open(path, encoding="utf-8") as f:
        r = Reader(tokens(f.read(), path), path)
    r.file()
    return r


def describe(f):
    name, number, ftype, label, oneof = f
    where = f" in oneof {oneof}" if oneof else ""
    return f"{(label + ' ') if label else ''}{ftype} {name} = {number}{where}"


def pointer_sized(ftype, cur):
    return ftype == "string" or ftype not in SCALARS and ftype not in cur.enums


def compare(rel, cur):
    """The breaches of the rule, one string each."""
    out = []
    for msg, old in rel.messages.items():
        new = cur.messages.get(msg)
        if new is None:
            out.append(f"message {msg}: removed or renamed")
            continue
        for k, f in enumerate(old):
            if k >= len(new):
                out.append(f"message {msg}: field {describe(f)} removed")
                continue
            if new[k] == f:
                continue
            names = [g[0] for g in new]
            if f[0] in names[k + 1:]:
                out.append(f"message {msg}: field {describe(new[k])} stands where {describe(f)} "
                           "did: fields inserted or reordered (new fields go at the end)")
            elif new[k][0] != f[0] and new[k][0] not in [g[0] for g in old]:
                out.append(f"message {msg}: field {describe(f)} became {describe(new[k])}: "
                           "removed, renamed or replaced")
            else:
                out.append(f"message {msg}: field {describe(f)} became {describe(new[k])}: "
                           "renamed, renumbered, retyped, relabelled or moved")
        top = max((f[1] for f in old), default=0)
        oneofs = {f[4] for f in old if f[4]}
        for f in new[len(old):]:
            if f[1] <= top:
                out.append(f"message {msg}: new field {describe(f)} is not numbered above the "
                           f"released fields (highest {top})")
            if f[4] in oneofs and not pointer_sized(f[2], cur):
                out.append(f"message {msg}: new field {describe(f)} joins a released oneof but is "
                           "not a message or a string: the union could grow")
    for enum, old in rel.enums.items():
        new = cur.enums.get(enum)
        if new is None:
            out.append(f"enum {enum}: removed or renamed")
            continue
        for name, number in old.items():
            if new.get(name) != number:
                out.append(f"enum {enum}: value {name} = {number} removed, renamed or renumbered")
    return out


def main(argv):
    if len(argv) != 3:
        print("usage: abi_check.py RELEASED CURRENT", file=sys.stderr)
        return 2
    try:
        rel, cur = read(argv[1]), read(argv[2])
    except (OSError, ProtoError, ValueError) as e:
        print(f"abi_check: {e}", file=sys.stderr)
        return 2
    breaches = compare(rel, cur)
    for b in breaches:
        print(f"{argv[2]}: {b}")
    if breaches:
        print(f"abi_check: {argv[2]} breaks the ABI of {argv[1]} (the rule: vase.proto, "
              "lib/vase_admin.h)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
