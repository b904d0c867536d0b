"""Tests of examples/llm: the safetensors reader/writer and the decoder with its KV cache."""

import json
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "llm"))
import safetensors  # noqa: E402
from model import Config, ContiguousCache, Model, score  # noqa: E402

torch.set_num_threads(2)


def tiny_config(**kw):
    d = dict(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=8, model_type="qwen3",
             tie_word_embeddings=False, rope_theta=1000.0)
    d.update(kw)
    return Config(**d)


def tiny_model(seed=0, **kw):
    torch.manual_seed(seed)
    m = Model(tiny_config(**kw))
    m.init_weights(std=0.1)
    # norms away from 1 so a wrongly loaded norm would show
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return m.eval()


def test_safetensors_round_trip(tmp_path):
    torch.manual_seed(0)
    tensors = {
        "a": torch.randn(3, 5),
        "b16": torch.randn(7, 2).to(torch.bfloat16),
        "h": torch.randn(4).to(torch.float16),
        "i": torch.arange(-3, 6, dtype=torch.int64).view(3, 3),
        "j": torch.arange(5, dtype=torch.int32),
        "empty": torch.zeros(0, 4),
    }
    path = str(tmp_path / "t.safetensors")
    safetensors.save_file(tensors, path, {"format": "pt"})
    back, meta = safetensors.load_file(path, with_metadata=True)
    assert meta == {"format": "pt"}
    assert set(back) == set(tensors)
    for k, t in tensors.items():
        assert back[k].dtype == t.dtype and back[k].shape == t.shape
        assert torch.equal(back[k], t), k
    # the bf16 bytes on disk are the upper halves of the float32 values, little-endian
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        b, e = header["b16"]["data_offsets"]
        f.seek(8 + n + b)
        raw = f.read(e - b)
    first = tensors["b16"].flatten()[0].float().view(torch.int32).item() >> 16
    assert int.from_bytes(raw[:2], "little") == first & 0xFFFF


def _write_raw(path, header, data=b""):
    raw = json.dumps(header).encode() if not isinstance(header, bytes) else header
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw + data)


@pytest.mark.parametrize("header,data", [
    ({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 16]}}, bytes(8)),  # past the end
    ({"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8)),  # size mismatch
    ({"x": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}}, bytes(8)),  # unknown dtype
    ({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "y": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(12)),  # overlap
    ({"x": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, bytes(8)),  # negative dim
    ({"x": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}, bytes(8)),  # reversed
    ({"__metadata__": {"a": 1}}, b""),  # metadata value not a string
    (b"[1, 2]", b""),  # not an object
    (b"{\"x\": ", b""),  # truncated JSON
])
def test_safetensors_refuses_malformed(tmp_path, header, data):
    path = str(tmp_path / "bad.safetensors")
    _write_raw(path, header, data)
    with pytest.raises(safetensors.SafetensorsError):
        safetensors.load_file(path)


def test_safetensors_refuses_bad_header_length(tmp_path):
    path = str(tmp_path / "bad.safetensors")
    with open(path, "wb") as f:
        f.write((1 << 40).to_bytes(8, "little") + b"{}")
    with pytest.raises(safetensors.SafetensorsError):
        safetensors.load_file(path)
    with open(path, "wb") as f:
        f.write(b"\x01\x00")
    with pytest.raises(safetensors.SafetensorsError):
        safetensors.load_file(path)


@pytest.mark.parametrize("model_type,tied", [("qwen3", False), ("llama", True)])
def test_incremental_equals_full_forward(model_type, tied):
    m = tiny_model(model_type=model_type, tie_word_embeddings=tied)
    torch.manual_seed(1)
    T = 37
    tokens = torch.randint(0, 40, (2, T))
    pos = torch.arange(T).unsqueeze(0).expand(2, T)
    with torch.no_grad():
        full = m(tokens, pos, ContiguousCache())
        one = score(m, tokens, ContiguousCache, chunk=1)
        mixed = score(m, tokens, ContiguousCache, chunk=20)
        # causal: the logits of a prefix do not depend on what follows it
        prefix = m(tokens[:, :10], pos[:, :10], ContiguousCache())
    assert full.shape == (2, T, 40) and full.dtype == torch.float32
    assert full.std().item() > 0.1  # logits far from flat, so the comparisons below mean something
    assert (one - full).abs().max().item() < 1e-5
    assert (mixed - full).abs().max().item() < 1e-5
    assert (prefix - full[:, :10]).abs().max().item() < 1e-5
    # RoPE is relative: shifting every position alike changes nothing, while a gap in the
    # positions (as after evicted tokens) changes the logits after it
    with torch.no_grad():
        shifted = m(tokens, pos + 5, ContiguousCache())
        gap = pos.clone()
        gap[:, 20:] += 3
        gapped = m(tokens, gap, ContiguousCache())
    assert (shifted - full).abs().max().item() < 1e-4
    assert (gapped[:, :20] - full[:, :20]).abs().max().item() < 1e-5
    assert (gapped[:, 20:] - full[:, 20:]).abs().max().item() > 1e-3


def test_attention_against_naive():
    from model import attention
    torch.manual_seed(2)
    q = torch.randn(2, 5, 4, 8)
    k = torch.randn(2, 12, 2, 8)
    v = torch.randn(2, 12, 2, 8)
    out = attention(q, k, v, n_past=7, block=2)
    for b in range(2):
        for i in range(5):
            for h in range(4):
                kv = h // 2
                s = k[b, : 8 + i, kv] @ q[b, i, h] / 8 ** 0.5
                ref = torch.softmax(s, 0) @ v[b, : 8 + i, kv]
                assert torch.allclose(out[b, i, h], ref, atol=1e-5)


@pytest.mark.parametrize("tied", [False, True])
def test_save_load_identical_logits(tmp_path, tied):
    m = tiny_model(seed=3, tie_word_embeddings=tied)
    m.save(str(tmp_path))
    names = set(safetensors.load_file(str(tmp_path / "model.safetensors")))
    assert ("lm_head.weight" in names) == (not tied)
    assert "model.layers.1.self_attn.q_norm.weight" in names
    assert "model.layers.0.mlp.gate_proj.weight" in names
    m2 = Model.load(str(tmp_path)).eval()
    tokens = torch.randint(0, 40, (1, 16))
    pos = torch.arange(16).unsqueeze(0)
    with torch.no_grad():
        assert torch.equal(m(tokens, pos, ContiguousCache()), m2(tokens, pos, ContiguousCache()))
    # a tensor of the wrong shape is refused
    sd = safetensors.load_file(str(tmp_path / "model.safetensors"))
    sd["model.norm.weight"] = torch.ones(7)
    safetensors.save_file(sd, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError):
        Model.load(str(tmp_path))
