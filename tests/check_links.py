#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Checks the documentation's links: every relative link of README.md and docs/*.md names a file
or folder of the tree, and a heading of the Markdown file it points at when it has a #anchor
(the anchors GitHub makes: the heading's text in lower case, spaces turned into '-', punctuation
other than '-' and '_' dropped, a repeated heading suffixed -1, -2, ...). README.md is a tour:
it may not grow past MAX_README_LINES lines. Prints one line per problem, naming file, line and
link, and exits 1 if there is any.

Usage: tests/check_links.py [ROOT] (default: the repository this script is in)."""

import os
import re
import sys

MAX_README_LINES = 300

# [text](target) and [text](target "title"); images too. Reference-style links are not used.
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose_lines(text):
    """(line number, line) of every line outside fenced code blocks."""
    fence = None
    for n, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif m.group(1) == fence:
                fence = None
            continue
        if fence is None:
            yield n, line


def slug(heading):
    """GitHub's anchor of a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        seen, out = {}, set()
        with open(path, encoding="utf-8") as f:
            for _, line in prose_lines(f.read()):
                m = HEADING.match(line)
                if not m:
                    continue
                s = slug(m.group(2))
                n = seen.get(s, 0)
                seen[s] = n + 1
                out.add(s if n == 0 else f"{s}-{n}")
        cache[path] = out
    return cache[path]


def check_file(root, rel):
    problems = []
    path = os.path.join(root, rel)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for n, line in prose_lines(text):
        line = re.sub(r"`[^`]*`", "``", line)  # code spans hold no links
        for m in LINK.finditer(line):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, mailto:, file: ...
                continue
            file_part, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) \
                if file_part else path
            where = f"{rel}:{n}: link {target}"
            if not os.path.realpath(dest).startswith(os.path.realpath(root) + os.sep):
                problems.append(f"{where}: points outside the repository")
            elif not os.path.exists(dest):
                problems.append(f"{where}: no file {os.path.relpath(dest, root)}")
            elif anchor:
                if not dest.endswith(".md") or os.path.isdir(dest):
                    problems.append(f"{where}: an anchor into a file that is not Markdown")
                elif anchor not in anchors(dest):
                    problems.append(f"{where}: no heading #{anchor} in "
                                    f"{os.path.relpath(dest, root)}")
    return problems


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    docs = os.path.join(root, "docs")
    files = ["README.md"] + sorted(os.path.join("docs", f) for f in os.listdir(docs)
                                   if f.endswith(".md"))
    problems = []
    for rel in files:
        problems += check_file(root, rel)
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        lines = f.read().count("\n")
    if lines > MAX_README_LINES:
        problems.append(f"README.md: {lines} lines, more than {MAX_README_LINES}: move reference "
                        "text to docs/")
    for p in problems:
        print(p, file=sys.stderr)
    print(f"check_links: {len(files)} files, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
