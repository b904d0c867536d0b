"""The training corpus: text files shipped in Debian packages, re-creatable on any machine
with the same packages installed.

Documents are the regular files (symlinks skipped) under ROOTS, walked in sorted order, whose
content (after gunzip for *.gz) is 8 KiB to 256 KiB, contains no NUL byte and decodes as UTF-8.
Duplicate contents keep the first path. A document is held out when the first byte of the
SHA-256 of its path is below HELDOUT_BELOW (about 2 %). Each document becomes BOS followed by
its bytes; a split is the concatenation of its documents.
"""

import gzip
import hashlib
import json
import os

import numpy as np

BOS_ID = 256  # <bos> of the byte-level tokenizer (hf_tokenizer.py); ids 0-255 are the bytes
ROOTS = ("/usr/include", "/usr/share/common-licenses", "/usr/share/doc")
MIN_BYTES = 8 * 1024
MAX_BYTES = 256 * 1024
HELDOUT_BELOW = 5  # of 256


def _read(path):
    """The content of path (gunzipped for .gz), or None when it is not a document."""
    try:
        if os.path.islink(path) or not os.path.isfile(path):
            return None
        size = os.path.getsize(path)
        if path.endswith(".gz"):
            if size > MAX_BYTES:
                return None
            with gzip.open(path, "rb") as f:
                data = f.read(MAX_BYTES + 1)
        else:
            if not MIN_BYTES <= size <= MAX_BYTES:
                return None
            with open(path, "rb") as f:
                data = f.read(MAX_BYTES + 1)
    except (OSError, EOFError, gzip.BadGzipFile):
        return None
    if not MIN_BYTES <= len(data) <= MAX_BYTES or b"\0" in data:
        return None
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return data


def is_heldout(path):
    return hashlib.sha256(path.encode("utf-8")).digest()[0] < HELDOUT_BELOW


def collect(roots=ROOTS):
    """[(path, content bytes, split)] in sorted path order."""
    docs, seen = [], set()
    for root in roots:
        paths = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            paths.extend(os.path.join(dirpath, f) for f in filenames)
        for path in sorted(paths):
            data = _read(path)
            if data is None:
                continue
            digest = hashlib.sha256(data).digest()
            if digest in seen:
                continue
            seen.add(digest)
            docs.append((path, data, "heldout" if is_heldout(path) else "train"))
    return docs


def build(manifest_path=None, roots=ROOTS):
    """Returns {"train": uint16 tokens, "heldout": [uint16 tokens per document]} and writes the
    manifest (every document's path, size, SHA-256 and split) to manifest_path if given."""
    docs = collect(roots)
    train, heldout, entries = [], [], []
    for path, data, split in docs:
        toks = np.empty(len(data) + 1, dtype=np.uint16)
        toks[0] = BOS_ID
        toks[1:] = np.frombuffer(data, dtype=np.uint8)
        (heldout if split == "heldout" else train).append(toks)
        entries.append({"path": path, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                        "split": split})
    out = {"train": np.concatenate(train) if train else np.zeros(0, np.uint16), "heldout": heldout}
    if manifest_path:
        summary = {s: {"documents": sum(e["split"] == s for e in entries),
                       "bytes": sum(e["bytes"] for e in entries if e["split"] == s)}
                   for s in ("train", "heldout")}
        man = {"roots": list(roots), "min_bytes": MIN_BYTES, "max_bytes": MAX_BYTES,
               "heldout_rule": f"sha256(path)[0] < {HELDOUT_BELOW}", "separator": "BOS before each document",
               "summary": summary, "documents": entries}
        tmp = manifest_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(man, f, indent=1)
        os.replace(tmp, manifest_path)
    return out


if __name__ == "__main__":
    import sys
    d = build(sys.argv[1] if len(sys.argv) > 1 else None)
    print(f"train {len(d['train'])} tokens, heldout {len(d['heldout'])} documents "
          f"{sum(len(x) for x in d['heldout'])} tokens")
