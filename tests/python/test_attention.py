# SPDX-License-Identifier: MIT
"""The paged attention kernels' path of VaseCache: the arguments it hands them.

FlashInfer and FlashAttention-2 run on a GPU only, and neither is installed here, so their
entry points are stood in for by small PyTorch models of what their documentation specifies:
`flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=, block_table=, softmax_scale=,
causal=)` reads blocks block_table[i][0 .. ceil(seqlens[i] / page)) of a paged cache
[num_blocks, page, kv_heads, d] and masks causally from the bottom right; FlashInfer's
`BatchPrefillWithPagedKVCacheWrapper.plan(qo_indptr, kv_indptr, kv_indices, kv_last_page_len,
q_heads, kv_heads, d, page, causal=, ...)` then `run(q, (k_cache, v_cache))` does the same over
pages in CSR form. The models check the types and shapes they are given and compute attention one
sequence at a time, apart from the gather path's code. What is shown: with these arguments the
kernels would compute the plain model's logits (to 1e-5) and, with evictions, the gather path's.
What is not: that the real kernels accept the arena's strided tensors on a real GPU.
"""

import math
import sys
import types

import pytest
import torch
from transformers import DynamicCache

import vase
import vase.hf
import vase.torch
from vase.torch import SeqSpec, choose_attention, masked_attention, sdpa_attention

from hfutil import document, read, shipped

PROMPT, TOKENS = 48, 150
CALLS = {"flash-attn": 0, "flashinfer-plan": 0, "flashinfer-run": 0}


def sequence_attention(q, k, v, scale):
    """q [n, H, d] against k, v [T, KV, d], the last n keys being the queries' own: query j sees
    keys below T - n + j + 1. Float64, one head at a time."""
    n, H, d = q.shape
    T, KV = k.shape[0], k.shape[1]
    out = torch.empty(n, H, d, dtype=torch.float64)
    for h in range(H):
        kh, vh = k[:, h // (H // KV)].double(), v[:, h // (H // KV)].double()
        s = q[:, h].double() @ kh.T * scale  # [n, T]
        mask = torch.arange(T).view(1, T) > (T - n + torch.arange(n)).view(n, 1)
        out[:, h] = torch.softmax(s.masked_fill(mask, float("-inf")), -1) @ vh
    return out


def paged(cache, table, held):
    """The first `held` slots of a paged cache [num_blocks, page, KV, d] through its table."""
    page = cache.shape[1]
    blocks = table[: (held + page - 1) // page].long()
    return cache[blocks].reshape(-1, cache.shape[2], cache.shape[3])[:held]


def fake_flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=None, block_table=None,
                                 softmax_scale=None, causal=False):
    CALLS["flash-attn"] += 1
    assert causal and softmax_scale is not None
    assert cache_seqlens.dtype == torch.int32 and block_table.dtype == torch.int32
    assert block_table.shape[0] == q.shape[0] == cache_seqlens.shape[0]
    assert k_cache.stride(-1) == 1 and k_cache.shape == v_cache.shape
    out = torch.empty(q.shape, dtype=torch.float64)
    for i in range(q.shape[0]):
        held = int(cache_seqlens[i])
        out[i] = sequence_attention(q[i], paged(k_cache, block_table[i], held),
                                    paged(v_cache, block_table[i], held), softmax_scale)
    return out.to(q.dtype)


class FakeWrapper:
    def __init__(self, workspace, layout):
        assert layout == "NHD" and workspace.dtype == torch.uint8
        self.args = None

    def plan(self, qo_indptr, kv_indptr, kv_indices, last_page_len, q_heads, kv_heads, head_dim,
             page, causal=False, sm_scale=None, q_data_type=None, kv_data_type=None):
        CALLS["flashinfer-plan"] += 1
        for t in (qo_indptr, kv_indptr, kv_indices, last_page_len):
            assert t.dtype == torch.int32
        assert causal and qo_indptr.numel() == kv_indptr.numel() == last_page_len.numel() + 1
        assert bool((last_page_len >= 1).all()) and bool((last_page_len <= page).all())
        self.args = (qo_indptr, kv_indptr, kv_indices, last_page_len, q_heads, kv_heads,
                     head_dim, page, sm_scale)

    def run(self, q, kv):
        CALLS["flashinfer-run"] += 1
        qo, kvp, idx, last, q_heads, kv_heads, d, page, scale = self.args
        k_cache, v_cache = kv
        assert q.shape[1:] == (q_heads, d) and k_cache.shape[1:] == (page, kv_heads, d)
        out = torch.empty(q.shape, dtype=torch.float64)
        for i in range(qo.numel() - 1):
            pages = idx[kvp[i] : kvp[i + 1]]
            held = (pages.numel() - 1) * page + int(last[i])
            out[qo[i] : qo[i + 1]] = sequence_attention(
                q[qo[i] : qo[i + 1]], paged(k_cache, pages, held), paged(v_cache, pages, held),
                scale)
        return out.to(q.dtype)


@pytest.fixture
def kernels(monkeypatch):
    """flash_attn and flashinfer, importable, as the models above."""
    fa = types.ModuleType("flash_attn")
    fa.flash_attn_with_kvcache = fake_flash_attn_with_kvcache
    fi = types.ModuleType("flashinfer")
    fi.BatchPrefillWithPagedKVCacheWrapper = FakeWrapper
    monkeypatch.setitem(sys.modules, "flash_attn", fa)
    monkeypatch.setitem(sys.modules, "flashinfer", fi)
    for k in CALLS:
        CALLS[k] = 0


def setup_model():
    net = shipped()
    return net, net.config, document(TOKENS)


def plain_logits(net, tokens, batch):
    return read(net, tokens, DynamicCache(config=net.config), batch, PROMPT)


def through(daemon, net, cfg, tokens, specs, block, attention):
    with vase.connect(daemon, name="test_attention") as client:
        with vase.hf.VaseCache(client, cfg, specs=specs, block_tokens=block,
                               attention=attention) as cache:
            got = read(net, tokens, cache, len(specs), PROMPT)
            assert cache.batch.attention == attention
            return got, cache.evictions()


@pytest.mark.parametrize("attention,block", [("flashinfer", 16), ("flash-attn", 256)])
def test_kernel_arguments_give_the_plain_model(daemon, kernels, attention, block):
    net, cfg, tokens = setup_model()
    plain = plain_logits(net, tokens, 2)
    specs = [SeqSpec(policy="vase-attnv", budget=512, window=64, mode="sync"),
             SeqSpec(policy="snapkv", budget=256, window=32, mode="async")]
    got, evictions = through(daemon, net, cfg, tokens, specs, block, attention)
    assert evictions == [0, 0]
    diff = (got - plain).abs().max().item()
    print(f"{attention}: max_abs_logit_diff={diff:.3g} (block {block}, {TOKENS} tokens)")
    assert diff <= 1e-5
    calls = CALLS["flash-attn"] if attention == "flash-attn" else CALLS["flashinfer-run"]
    assert calls == cfg.num_hidden_layers * (TOKENS - PROMPT + 1)
    if attention == "flashinfer":  # one plan per step, for every layer
        assert CALLS["flashinfer-plan"] == TOKENS - PROMPT + 1


@pytest.mark.parametrize("attention,block", [("flashinfer", 16), ("flash-attn", 256)])
def test_kernel_arguments_after_evictions_give_the_gather_path(daemon, kernels, attention,
                                                                block):
    # Sync mode and deterministic policies: the plans are the same whichever path reads the
    # cache, so the block tables, their lengths and the slots kept are too; the logits agree to
    # float32 rounding. (VaSE's draws are keyed by the sequence's id, which differs between
    # the two runs, so its plans would not be the same.)
    net, cfg, tokens = setup_model()
    specs = [SeqSpec(policy="snapkv", budget=96, window=16, mode="sync"),
             SeqSpec(policy="rkv", budget=64, window=16, mode="sync")]
    ref, ref_ev = through(daemon, net, cfg, tokens, specs, block, "gather")
    got, got_ev = through(daemon, net, cfg, tokens, specs, block, attention)
    assert got_ev == ref_ev and min(got_ev) > 0
    assert (got - ref).abs().max().item() <= 1e-4


def test_choose_attention_explains_itself(kernels):
    cpu, f32, bf16 = torch.device("cpu"), torch.float32, torch.bfloat16
    cuda = torch.device("cuda", 0)
    assert choose_attention("auto", cpu, f32, 16, False)[0] == "gather"
    assert choose_attention("auto", cuda, bf16, 16, False)[0] == "flashinfer"
    assert choose_attention("auto", cuda, bf16, 16, True)[0] == "gather"
    assert choose_attention("gather", cuda, bf16, 16, False)[0] == "gather"
    with pytest.raises(ValueError, match="multiple of 256 tokens, not 16"):
        choose_attention("flash-attn", cuda, bf16, 16, False)
    with pytest.raises(ValueError, match="h2o"):
        choose_attention("flashinfer", cuda, bf16, 16, True)
    with pytest.raises(ValueError, match="one of auto, gather"):
        choose_attention("sdpa", cpu, f32, 16, False)


def test_choose_attention_without_the_kernels(monkeypatch):
    monkeypatch.setattr(vase.torch, "_import_kernel", lambda name: None)
    cuda = torch.device("cuda", 0)
    assert choose_attention("auto", cuda, torch.bfloat16, 256, False)[0] == "gather"
    with pytest.raises(ValueError, match="flashinfer is not installed"):
        choose_attention("flashinfer", cuda, torch.bfloat16, 16, False)


def test_sequence_attention_model_is_causal():
    # The stand-ins' own core against the gather path's attention (vase.torch): query j of n
    # sees the keys below T - n + j + 1.
    torch.manual_seed(1)
    q, k, v = torch.randn(5, 4, 8), torch.randn(12, 2, 8), torch.randn(12, 2, 8)
    visible = (12 - 5 + torch.arange(5) + 1).view(1, 5)
    want = masked_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), visible)[0][0]
    got = sequence_attention(q, k, v, 1.0 / math.sqrt(8)).float()
    assert (got - want).abs().max().item() <= 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_attention_is_the_explicit_one(dtype):
    # The gather path's two cores: PyTorch's fused attention (what runs unless a policy reads
    # the probabilities) gives the explicit softmax's output, for a batch whose sequences hold
    # different counts, with GQA (4 query heads per KV head), several new queries, a scale.
    torch.manual_seed(2)
    b, n, T = 3, 4, 37
    q = torch.randn(b, n, 8, 16).to(dtype)
    k, v = torch.randn(b, T, 2, 16).to(dtype), torch.randn(b, T, 2, 16).to(dtype)
    base = torch.tensor([33, 10, 1])
    visible = base.view(-1, 1) + torch.arange(n).view(1, -1) + 1
    for scale in (None, 0.3):
        want = masked_attention(q, k, v, visible, scale)[0]
        got = sdpa_attention(q, k, v, visible, scale)
        assert got.dtype == dtype and got.shape == want.shape
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        assert (got.float() - want.float()).abs().max().item() <= tol


def test_gather_ignores_what_the_arena_held_before(daemon):
    # The slots past a sequence's length that the gather reads (the rest of its last block, the
    # padding of a batch) hold whatever was there before: here NaN everywhere. Masked scores
    # ignore K there, and V is zeroed, so the logits are still the plain model's.
    net, cfg, tokens = setup_model()
    with vase.connect(daemon, name="test_attention") as client:
        m = client.register_model(cfg.num_hidden_layers, cfg.num_attention_heads,
                                  cfg.num_key_value_heads, cfg.head_dim, name="poison")
        for layer in range(cfg.num_hidden_layers):
            for kv in ("k", "v"):
                torch.from_dlpack(m.kv_tensor(layer, kv)).fill_(float("nan"))
    plain = plain_logits(net, tokens, 2)
    specs = [SeqSpec(policy="vase-attnv", budget=512, window=64, mode="sync"),
             SeqSpec(policy="streaming", budget=320, window=64, mode="async")]
    got, evictions = through(daemon, net, cfg, tokens, specs, 16, "gather")
    assert evictions == [0, 0]
    assert (got - plain).abs().max().item() <= 1e-5
