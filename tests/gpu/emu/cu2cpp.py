#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Rewrites every launch `kernel<<<grid, block, smem, stream>>>(args)` of a .cu file into
`emu::launch(dim3(grid), dim3(block), kernel, args)`, for the CPU emulation of tests/gpu/emu.
Reads the file named by the first argument, writes C++ to stdout."""
import re, sys

def split_top(s):
    parts, depth, cur = [], 0, ''
    for ch in s:
        if ch in '([{': depth += 1
        elif ch in ')]}': depth -= 1
        if ch == ',' and depth == 0:
            parts.append(cur.strip()); cur = ''
        else:
            cur += ch
    if cur.strip(): parts.append(cur.strip())
    return parts

src = open(sys.argv[1]).read()
out = ''
i = 0
while True:
    j = src.find('<<<', i)
    if j < 0:
        out += src[i:]; break
    # kernel name: identifier possibly followed by <...>, possibly then whitespace
    k = j
    while src[k-1].isspace():
        k -= 1
    if src[k-1] == '>':
        depth = 0
        while True:
            k -= 1
            if src[k] == '>': depth += 1
            elif src[k] == '<':
                depth -= 1
                if depth == 0: break
    m = re.search(r'[A-Za-z_][A-Za-z_0-9]*$', src[:k])
    name_start = m.start()
    name = src[name_start:j]
    e = src.find('>>>', j)
    cfg = split_top(src[j+3:e])
    assert src[e+3] == '(', src[e:e+20]
    # matching paren
    depth, p = 0, e + 3
    while True:
        if src[p] == '(': depth += 1
        elif src[p] == ')':
            depth -= 1
            if depth == 0: break
        p += 1
    args = src[e+4:p]
    out += src[i:name_start] + 'emu::launch(dim3(%s), dim3(%s), %s%s)' % (cfg[0], cfg[1], name, (', ' + args) if args.strip() else '')
    i = p + 1
sys.stdout.write(out)
