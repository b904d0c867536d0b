"""Reading and writing the safetensors format with numpy and torch only.

Layout: an 8-byte little-endian unsigned header length N, N bytes of JSON (an object mapping
tensor names to {"dtype", "shape", "data_offsets": [begin, end]}, plus an optional
"__metadata__" object of string to string), then the data: each tensor's bytes, little-endian,
row-major, at [8 + N + begin, 8 + N + end). The file is treated as untrusted input: the header
is checked before any tensor is read.
"""

import json
import os

import numpy as np
import torch

# safetensors dtype name -> (numpy dtype used to view the bytes, torch dtype of the result)
_DTYPES = {
    "F64": (np.dtype("<f8"), torch.float64),
    "F32": (np.dtype("<f4"), torch.float32),
    "F16": (np.dtype("<f2"), torch.float16),
    "BF16": (np.dtype("<i2"), torch.bfloat16),  # read as int16, reinterpreted as bfloat16
    "I64": (np.dtype("<i8"), torch.int64),
    "I32": (np.dtype("<i4"), torch.int32),
    "I16": (np.dtype("<i2"), torch.int16),
    "I8": (np.dtype("i1"), torch.int8),
    "U8": (np.dtype("u1"), torch.uint8),
    "BOOL": (np.dtype("u1"), torch.bool),
}
_TORCH_TO_NAME = {t: name for name, (_, t) in _DTYPES.items()}

MAX_HEADER = 100 * 1024 * 1024


class SafetensorsError(ValueError):
    """The file is not a valid safetensors file."""


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def parse_header(raw: bytes, data_len: int):
    """Checks a header (the JSON bytes) against a data section of data_len bytes.

    Returns (entries, metadata): entries maps name -> (dtype name, shape tuple, begin, end)."""
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise SafetensorsError("header is not a JSON object")
    metadata = header.pop("__metadata__", None)
    if metadata is not None:
        if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
        ):
            raise SafetensorsError("__metadata__ must map strings to strings")
    entries = {}
    for name, info in header.items():
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise SafetensorsError(f"{name!r}: entry must have exactly dtype, shape, data_offsets")
        dtype, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in _DTYPES:
            raise SafetensorsError(f"{name!r}: unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            raise SafetensorsError(f"{name!r}: shape must be a list of non-negative integers")
        if not (isinstance(offs, list) and len(offs) == 2 and all(_is_int(o) for o in offs)):
            raise SafetensorsError(f"{name!r}: data_offsets must be two integers")
        begin, end = offs
        if not 0 <= begin <= end <= data_len:
            raise SafetensorsError(f"{name!r}: data_offsets {offs} outside the data ({data_len} bytes)")
        count = 1
        for d in shape:
            count *= d
        if end - begin != count * _DTYPES[dtype][0].itemsize:
            raise SafetensorsError(f"{name!r}: {end - begin} bytes for shape {shape} of {dtype}")
        entries[name] = (dtype, tuple(shape), begin, end)
    spans = sorted((b, e, n) for n, (_, _, b, e) in entries.items() if e > b)
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise SafetensorsError(f"{n0!r} and {n1!r} overlap")
    return entries, metadata or {}


def load_file(path, with_metadata=False):
    """Reads a safetensors file; returns {name: tensor} (and the metadata dict if asked)."""
    size = os.path.getsize(path)
    if size < 8:
        raise SafetensorsError("file shorter than the 8-byte header length")
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if n < 2 or n > MAX_HEADER or n > size - 8:
            raise SafetensorsError(f"header length {n} invalid for a file of {size} bytes")
        raw = f.read(n)
    entries, metadata = parse_header(raw, size - 8 - n)
    out = {}
    mm = np.memmap(path, dtype=np.uint8, mode="r") if entries else None
    base = 8 + n
    for name, (dtype, shape, begin, end) in entries.items():
        np_dtype, t_dtype = _DTYPES[dtype]
        # copy out of the mapping so the tensor owns aligned, writable memory
        arr = np.array(mm[base + begin : base + end]).view(np_dtype).reshape(shape)
        t = torch.from_numpy(arr.astype(np_dtype.newbyteorder("="), copy=False))
        if t_dtype == torch.bfloat16:
            t = t.view(torch.bfloat16)
        elif t_dtype == torch.bool:
            t = t.to(torch.bool)
        out[name] = t
    del mm
    return (out, metadata) if with_metadata else out


def save_file(tensors, path, metadata=None):
    """Writes {name: tensor} to path (atomically: a temporary file, then a rename)."""
    header = {}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        if t.dtype not in _TORCH_TO_NAME:
            raise SafetensorsError(f"{name!r}: unsupported dtype {t.dtype}")
        dtype = _TORCH_TO_NAME[t.dtype]
        np_dtype = _DTYPES[dtype][0]
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        elif t.dtype == torch.bool:
            t = t.to(torch.uint8)
        data = t.numpy().astype(np_dtype, copy=False).tobytes()
        header[name] = {"dtype": dtype, "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # pad so the data section starts 8-byte aligned
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)
