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

vase's own CPU kernel ("paged-cpu", vase._vase.paged_attention over kernels/attend.c) does run
here: against `masked_attention` and `sdpa_attention` over the gathered slots, on random arenas
laid out as vased's (K and V of a layer strided by the page), and through VaseCache against the
plain model and the gather path; and its refusals of wrong arguments.
"""

import ctypes
import math
import sys
import types

import pytest
import torch
from transformers import DynamicCache

import vase
import vase.hf
import vase.torch
from vase import _vase
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
    # paged-cpu only by name: past a few hundred slots it is slower than gather's fused kernel.
    assert choose_attention("auto", cpu, f32, 16, False)[0] == "gather"
    assert choose_attention("auto", cpu, bf16, 128, False)[0] == "gather"
    assert choose_attention("paged-cpu", cpu, f32, 16, False)[1] is _vase.paged_attention
    with pytest.raises(ValueError, match="paged-cpu runs on a host arena"):
        choose_attention("paged-cpu", cuda, bf16, 16, False)
    with pytest.raises(ValueError, match="h2o"):
        choose_attention("paged-cpu", cpu, f32, 16, True)
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


# ---- vase's CPU kernel (paged-cpu) ----

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def arena(blocks, block, kv, d, dtype, layers=2, layer=1, fill=None):
    """K and V of one layer over an arena laid out as vased's: pages [blocks][layers][K, V]
    [block][kv][d], so each is a strided view [blocks, block, kv, d] whose block stride is the
    page. Random values, or `fill` everywhere."""
    shape = (blocks, layers, 2, block, kv, d)
    pages = torch.full(shape, fill, dtype=dtype) if fill is not None else torch.randn(
        shape).to(dtype)
    return pages, pages[:, layer, 0], pages[:, layer, 1]


def random_tables(b, lengths, block, blocks, width):
    """A table per sequence, of distinct blocks taken at random, -1 past its own."""
    perm = torch.randperm(blocks)
    table = torch.full((b, width), -1, dtype=torch.int32)
    at = 0
    for i, length in enumerate(lengths):
        own = (length + block - 1) // block
        table[i, :own] = perm[at : at + own].to(torch.int32)
        at += own
    return table


def gathered(cache, table, slots):
    """[b, slots, kv, d]: each sequence's first `slots` slots through its table (zeros where the
    table has no block)."""
    b, block = table.shape[0], cache.shape[1]
    out = torch.zeros(b, slots, cache.shape[2], cache.shape[3], dtype=cache.dtype)
    for i in range(b):
        for c in range((slots + block - 1) // block):
            if table[i, c] >= 0:
                span = min(block, slots - c * block)
                out[i, c * block : c * block + span] = cache[int(table[i, c]), :span]
    return out


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class Claimed:
    """A DLPack producer of a float32 CPU tensor's memory that claims another device, or an
    address offset by some bytes (torch makes neither)."""

    def __init__(self, t, device_type=1, offset=0):
        self.t = t  # kept alive with the capsules
        self.shape = (ctypes.c_int64 * t.dim())(*t.shape)
        self.strides = (ctypes.c_int64 * t.dim())(*t.stride())
        self.mt = DLManagedTensor(DLTensor(t.data_ptr(), DLDevice(device_type, 0), t.dim(),
                                           DLDataType(2, 32, 1), self.shape, self.strides,
                                           offset), None, None)

    def __dlpack__(self, stream=None):
        new = ctypes.pythonapi.PyCapsule_New
        new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p,
                                                       ctypes.c_void_p]
        return new(ctypes.addressof(self.mt), b"dltensor", None)


def run_kernel(q, k, v, table, visible, scale):
    out = torch.full(q.shape, 7.0)  # every element must be written
    _vase.paged_attention(q, k, v, table, visible, out, scale)
    return out


def reference(q, k, v, table, visible, scale):
    """masked_attention and sdpa_attention over the gathered slots (rows that see nothing
    dropped: both give NaN there), and a float64 masked_attention."""
    seen = visible.amax(dim=1) > 0
    T = max(1, int(visible.max()))
    kg, vg = gathered(k, table, T)[seen], gathered(v, table, T)[seen]
    qs, vis = q[seen], visible[seen].long()
    explicit = masked_attention(qs, kg, vg, vis, scale)[0]
    fused = sdpa_attention(qs, kg, vg, vis, scale)
    exact = masked_attention(qs.double(), kg.double(), vg.double(), vis, scale)[0]
    return seen, explicit, fused, exact


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("group", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("n", [1, 5])
@pytest.mark.parametrize("block", [16, 128])
def test_paged_cpu_kernel_is_masked_attention(dtype, group, n, block):
    # Sequences of different lengths (one shorter than a block, several over two 64-slot tiles
    # and several blocks, one of no slot: a padded row); n new queries each, causal (query j
    # sees base + j + 1 slots), one row's queries padded but one (visible 0); K and V strided
    # views of a layer of pages. The kernel's float32 against PyTorch's float32 (explicit and
    # fused) and against float64.
    torch.manual_seed(100 * group + 10 * n + block % 7)
    kv, d = 2, 32
    base = torch.tensor([0, 300, 7, 129, 64 - n, 0])
    b = base.numel()
    lengths = (base + n).tolist()
    lengths[-1] = 0
    blocks = sum((x + block - 1) // block for x in lengths) + 3
    width = max((x + block - 1) // block for x in lengths) + 1
    _, k, v = arena(blocks, block, kv, d, DTYPES[dtype])
    table = random_tables(b, lengths, block, blocks, width)
    visible = (base.view(-1, 1) + torch.arange(n).view(1, -1) + 1).to(torch.int32)
    visible[-1] = 0  # a row that is all padding
    visible[2, : n - 1] = 0  # a row whose only token is its last column
    q = torch.randn(b, n, kv * group, d)
    scale = 1.0 / math.sqrt(d)
    got = run_kernel(q, k, v, table, visible, scale)
    seen, explicit, fused, exact = reference(q, k, v, table, visible, scale)
    mine = got[seen]
    live = visible[seen] > 0
    err = {name: (mine - want.float())[live].abs().max().item()
           for name, want in (("explicit", explicit), ("fused", fused), ("float64", exact))}
    print(f"{dtype} group {group} n {n} block {block}: " +
          ", ".join(f"{name} {e:.2g}" for name, e in err.items()))
    # Measured: at most 1.2e-6 from each (the inputs are exact in float32 whatever the arena's
    # type: the kernel and the references read the same values).
    assert max(err.values()) <= 1e-5
    assert bool((got[~seen] == 0).all()) and bool((mine[~live] == 0).all())
    assert bool(torch.isfinite(got).all())


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_paged_cpu_kernel_reads_no_slot_past_visible(dtype):
    # An arena of NaN but for the slots the sequences hold: the rest of their last blocks, the
    # blocks of the table past them, and every other block stay NaN. The output is finite and
    # the same as over a clean arena.
    torch.manual_seed(7)
    block, kv, d, n = 16, 2, 32, 3
    lengths = [40, 5, 16]
    pages, k, v = arena(12, block, kv, d, DTYPES[dtype], fill=float("nan"))
    _, k0, v0 = arena(12, block, kv, d, DTYPES[dtype])
    table = random_tables(3, lengths, block, 12, 4)
    for i, length in enumerate(lengths):
        for s in range(length):
            blk, tok = int(table[i, s // block]), s % block
            k[blk, tok], v[blk, tok] = k0[blk, tok], v0[blk, tok]
    table[1, 1:] = torch.tensor([0, 1, 2], dtype=torch.int32)  # blocks past its own: not read
    visible = (torch.tensor(lengths).view(-1, 1) - n + torch.arange(n).view(1, -1) + 1).to(
        torch.int32)
    q = torch.randn(3, n, 4, d)
    got = run_kernel(q, k, v, table, visible, 0.2)
    assert bool(torch.isfinite(got).all())
    assert torch.equal(got, run_kernel(q, k0, v0, table, visible, 0.2))
    assert bool(torch.isnan(pages).any())


def test_paged_cpu_kernel_refuses_what_it_cannot_read():
    # Every refusal leaves out as it was; nothing is read out of the arena.
    torch.manual_seed(8)
    _, k, v = arena(6, 16, 2, 8, torch.float32)
    q = torch.randn(2, 2, 4, 8)
    table = torch.tensor([[0, 1], [2, -1]], dtype=torch.int32)
    visible = torch.tensor([[20, 21], [3, 4]], dtype=torch.int32)
    out = torch.full(q.shape, 5.0)

    def refused(error, match, **kw):
        args = dict(q=q, k=k, v=v, table=table, visible=visible, out=out, scale=0.5)
        args.update(kw)
        with pytest.raises(error, match=match):
            _vase.paged_attention(**args)
        assert bool((out == 5.0).all())

    bad = table.clone()
    bad[0, 1] = 6
    refused(ValueError, r"table\[0\]\[1\] = 6: not one of the 6 blocks", table=bad)
    bad[0, 1] = -1
    refused(ValueError, r"table\[0\]\[1\] = -1", table=bad)
    over = visible.clone()
    over[1, 1] = 33
    refused(ValueError, r"visible\[1\]\[1\] = 33: want 0 to 32", visible=over)
    over[1, 1] = -1
    refused(ValueError, r"visible\[1\]\[1\] = -1", visible=over)
    over[1, 1] = 17  # row 1's second block is -1
    refused(ValueError, r"table\[1\]\[1\] = -1", visible=over)
    refused(TypeError, "q must be float32", q=q.double())
    refused(TypeError, "table must be int32", table=table.long())
    refused(TypeError, "visible must be int32", visible=visible.long())
    refused(TypeError, "out must be float32", out=out.double())
    refused(TypeError, "k must be float32, float16 or bfloat16", k=k.to(torch.int32))
    refused(TypeError, "v must be of k's dtype", v=v.to(torch.bfloat16))
    refused(TypeError, "q must be a tensor", q=[1.0])
    refused(ValueError, "out must be of q's shape", out=torch.zeros(2, 2, 4, 4))
    refused(ValueError, "q has 3 dimensions, not 4", q=q[0])
    refused(ValueError, "query heads", q=torch.randn(2, 2, 3, 8), out=torch.zeros(2, 2, 3, 8))
    refused(ValueError, "with q's head_dim", q=torch.randn(2, 2, 4, 4),
            out=torch.zeros(2, 2, 4, 4))
    refused(ValueError, "table must be .b, blocks. with q's b", table=table[:1])
    refused(ValueError, "visible must be .b, n. with q's b and n",
            visible=visible[:, :1].contiguous())
    refused(ValueError, "v must be of k's shape", v=v[:5])
    refused(ValueError, "q must be contiguous", q=q.transpose(0, 1).contiguous().transpose(0, 1))
    refused(ValueError, "k must be contiguous in its last dimension",
            k=k.transpose(2, 3).contiguous().transpose(2, 3)[:, :, :, :])
    refused(ValueError, "scale is not a finite float32", scale=float("nan"))
    refused(ValueError, "k is on DLPack device type 2: it runs on the CPU",
            k=Claimed(k, device_type=2))
    refused(ValueError, "k is not aligned to its elements", k=Claimed(k, offset=2))
    # A row whose queries see nothing needs no table entry at all.
    none = visible.clone()
    none[1] = 0
    _vase.paged_attention(q, k, v, torch.tensor([[0, 1], [-1, -1]], dtype=torch.int32), none,
                          out, 0.5)
    assert bool((out[1] == 0).all()) and bool(torch.isfinite(out).all())


@pytest.mark.parametrize("block", [16, 1, 128])
def test_paged_cpu_gives_the_plain_model(daemon, block):
    # The shipped checkpoint through vase.hf with the CPU kernel: the logits of the plain model,
    # prompt and decode steps.
    net, cfg, tokens = setup_model()
    plain = plain_logits(net, tokens, 2)
    specs = [SeqSpec(policy="vase-attnv", budget=512, window=64, mode="sync"),
             SeqSpec(policy="snapkv", budget=256, window=32, mode="async")]
    got, evictions = through(daemon, net, cfg, tokens, specs, block, "paged-cpu")
    assert evictions == [0, 0]
    diff = (got - plain).abs().max().item()
    print(f"paged-cpu: max_abs_logit_diff={diff:.3g} (block {block}, {TOKENS} tokens)")
    assert diff <= 1e-5


def test_paged_cpu_is_the_gather_path_with_padding_and_evictions(daemon):
    # One VaseCache read both ways, the same step: rows of different lengths (evictions
    # shortened two of them), padded columns (real), several new queries. The kernel's output
    # is the gather path's; padded queries give zeros either way.
    torch.manual_seed(9)
    L, H, KV, D, n = 2, 8, 2, 32, 4
    specs = [SeqSpec(policy="snapkv", budget=48, window=16, mode="sync"),
             SeqSpec(policy="streaming", budget=64, window=16, mode="sync"),
             SeqSpec(policy="vase-attnv", budget=512, window=64, mode="sync")]
    with vase.connect(daemon, name="test_attention") as client:
        with vase.torch.VaseCache(client, L, H, KV, D, specs, prompt_len=40,
                                  block_tokens=16, attention="paged-cpu") as cache:
            assert cache.attention == "paged-cpu"
            steps = [(40, None)] + [(n, torch.rand(3, n) < 0.7) for _ in range(30)]
            for width, real in steps:
                q = torch.randn(3, width, H, D)
                for layer in range(L):
                    cache.append(layer, torch.randn(3, width, KV, D),
                                 torch.randn(3, width, KV, D), q, real)
                    got = cache.attend(layer, q, real)
                    cache.attention, cache._kernel = "gather", None
                    want = cache.attend(layer, q, real)
                    cache.attention, cache._kernel = "paged-cpu", _vase.paged_attention
                    assert (got - want).abs().max().item() <= 1e-5
                    if real is not None:
                        assert bool((got[~real] == 0).all())
                cache.step_done()
            assert min(cache.evictions()[:2]) > 0
            assert len({s.len for s in cache.seqs}) == 3
