"""Byte-level tokenizer: ids 0-255 are the bytes, then BOS and EOS."""

import json

BOS_ID = 256
EOS_ID = 257
VOCAB_SIZE = 258


class ByteTokenizer:
    def __init__(self, bos_id=BOS_ID, eos_id=EOS_ID, vocab_size=VOCAB_SIZE):
        self.bos_id, self.eos_id, self.vocab_size = bos_id, eos_id, vocab_size

    def encode(self, data, bos=True):
        if isinstance(data, str):
            data = data.encode("utf-8")
        return ([self.bos_id] if bos else []) + list(data)

    def decode(self, ids):
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def to_dict(self):
        return {"type": "bytes", "byte_ids": [0, 255], "bos_id": self.bos_id,
                "eos_id": self.eos_id, "vocab_size": self.vocab_size,
                "description": "id b in 0..255 is the byte b; each document starts with bos_id"}

    def save(self, path):
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=2)
            f.write("\n")

    @classmethod
    def load(cls, path):
        with open(path) as f:
            d = json.load(f)
        if d.get("type") != "bytes":
            raise ValueError(f"{path}: not a byte tokenizer")
        return cls(d["bos_id"], d["eos_id"], d["vocab_size"])
