# SPDX-License-Identifier: MIT
"""vase.hf.VaseCache as transformers uses it: generate() and forward loops, Llama and Qwen3,
batches of prompts of different lengths, with and without eviction, and bad input.

Without eviction the logits are DynamicCache's to 1e-5 (float32) and greedy generation is the
same token for token. With eviction, the transformers path gives the same kept tokens (the K of
every slot in the arena) and the same logits as the binding driven directly by a decoder written
here (vase.torch.VaseCache's append/attend/step_done, over the same weights).
"""

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from transformers import DynamicCache

import vase
import vase.hf
from vase.torch import SeqSpec
from vase.torch import VaseCache as Batch

from conftest import BUILD, start_vased, stop_vased
from hfutil import REPO, document, read, shipped, tiny

BATCH_LENGTHS = (12, 7, 3)  # the prompts of a batch of 3, left-padded to 12


def padded_batch(vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (len(BATCH_LENGTHS), max(BATCH_LENGTHS)), generator=g)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(BATCH_LENGTHS):
        mask[i, ids.shape[1] - n:] = 1
    return ids.masked_fill(mask == 0, 0), mask


def generate(net, cache, ids, mask, n, **kw):
    with torch.no_grad():
        return net.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n,
                            past_key_values=cache, output_logits=True,
                            return_dict_in_generate=True, pad_token_id=0, **kw)


@pytest.mark.parametrize("family", ["llama", "qwen3", "shipped"])
def test_generate_without_eviction_is_dynamic_cache(daemon, family):
    net = shipped() if family == "shipped" else tiny(family)
    ids, mask = padded_batch(net.config.vocab_size)
    ref = generate(net, DynamicCache(config=net.config), ids, mask, 24, do_sample=False)
    with vase.connect(daemon, name="test_hf") as client:
        with vase.hf.VaseCache(client, net.config, policy="vase-attnv", budget=256,
                               window=16) as cache:
            got = generate(net, cache, ids, mask, 24, do_sample=False)
            assert cache.evictions() == [0, 0, 0]
            # Padding is neither stored nor counted: each row holds its own tokens.
            assert [s.len for s in cache.seqs] == [n + 23 for n in BATCH_LENGTHS]
    assert torch.equal(got.sequences, ref.sequences)
    diff = max((a - b).abs().max().item() for a, b in zip(got.logits, ref.logits))
    print(f"{family}: max_abs_logit_diff={diff:.3g} over 24 steps of 3 rows")
    assert diff <= 1e-5


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_sampled_generation_evicts_and_stays_finite(daemon, mode):
    net = tiny("qwen3", seed=3)
    ids, mask = padded_batch(net.config.vocab_size, seed=1)
    torch.manual_seed(5)
    with vase.connect(daemon, name="test_hf") as client:
        with vase.hf.VaseCache(client, net.config, policy="vase-attnv", budget=32, window=16,
                               mode=mode) as cache:
            got = generate(net, cache, ids, mask, 160, do_sample=True, top_k=20)
            assert min(cache.evictions()) >= 5
            # At most budget + window + slack slots, however long the generation.
            assert max(s.len for s in cache.seqs) <= max(s.capacity for s in cache.seqs) <= 96
            assert cache.kv_bytes() > 0
    assert got.sequences.shape == (3, 12 + 160)
    assert all(bool(torch.isfinite(step).all()) for step in got.logits)


class Direct:
    """The binding driven directly: the same weights as a transformers Qwen3 model, decoded by
    the cache protocol of vase.torch (RoPE, q/k norms and GQA written here)."""

    def __init__(self, net):
        self.net = net
        self.m = net.model
        cfg = net.config
        self.heads, self.kv, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, \
            cfg.head_dim

    def forward(self, ids, start, cache: Batch):
        b, n = ids.shape
        pos = torch.arange(start, start + n).unsqueeze(0).expand(b, -1)
        h = self.m.embed_tokens(ids)
        cos, sin = self.m.rotary_emb(h, pos)
        for layer, blk in enumerate(self.m.layers):
            a = blk.self_attn
            x = blk.input_layernorm(h)
            q = a.q_norm(a.q_proj(x).view(b, n, self.heads, self.d))
            k = a.k_norm(a.k_proj(x).view(b, n, self.kv, self.d))
            v = a.v_proj(x).view(b, n, self.kv, self.d)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            cache.append(layer, k, v, q)
            o = cache.attend(layer, q)
            h = h + a.o_proj(o.reshape(b, n, -1))
            h = h + blk.mlp(blk.post_attention_layernorm(h))
        cache.step_done(n)
        return self.net.lm_head(self.m.norm(h))


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.unsqueeze(2) + rot * sin.unsqueeze(2)


def arena_k(cache_like, layer, seq_i):
    """The K of every slot a sequence holds, read through its block table."""
    s = cache_like.seqs[seq_i]
    table = torch.from_dlpack(s.block_table()).long()
    k = torch.from_dlpack(s.kv_slot(layer, "k", 0))  # a slot's view: its shape
    m = cache_like.k[layer] if hasattr(cache_like, "k") else cache_like.batch.k[layer]
    rows = m[table].reshape(-1, *k.shape)
    return rows[: s.len].clone()


@pytest.mark.parametrize("policy", ["snapkv", "h2o", "streaming"])
def test_evictions_match_the_binding_driven_directly(daemon, policy):
    # Sync mode and deterministic policies, so that both runs plan the same; the sampling
    # policies (vase-attnv, ...) draw with keys of the sequence's id, which differs between the
    # two runs, so their kept tokens would not be the same.
    net = shipped()
    tokens = document(160)
    prompt = 40
    specs = [SeqSpec(policy=policy, budget=64, window=16, mode="sync"),
             SeqSpec(policy=policy, budget=96, window=32, mode="sync")]
    with vase.connect(daemon, name="test_hf") as client:
        with vase.hf.VaseCache(client, net.config, specs=specs) as cache:
            hf = read(net, tokens, cache, 2, prompt)
            hf_ev = cache.evictions()
            hf_k = [arena_k(cache, 1, i) for i in range(2)]
            held = [cache.held(i, 1) for i in range(2)]
        cfg = net.config
        direct = Direct(net)
        with Batch(client, cfg.num_hidden_layers, cfg.num_attention_heads,
                   cfg.num_key_value_heads, cfg.head_dim, specs, prompt_len=prompt) as batch:
            rows = tokens.unsqueeze(0).expand(2, -1)
            with torch.no_grad():
                out = [direct.forward(rows[:, :prompt], 0, batch)]
                for i in range(prompt, tokens.numel()):
                    out.append(direct.forward(rows[:, i:i + 1], i, batch))
            got = torch.cat(out, dim=1).float()
            got_ev = batch.evictions()
            got_k = [arena_k(batch, 1, i) for i in range(2)]
    assert hf_ev == got_ev and min(hf_ev) > 0
    # held() reads the same slots: the keys, and values of the same count.
    for (k, v), a in zip(held, hf_k):
        assert torch.equal(k, a.transpose(0, 1))
        assert v.shape == k.shape and bool(torch.isfinite(v).all())
    for a, b in zip(hf_k, got_k):
        assert a.shape == b.shape
        assert (a - b).abs().max().item() <= 1e-5
    diff = (hf - got).abs().max().item()
    print(f"{policy}: evictions {hf_ev}, max_abs_logit_diff={diff:.3g}")
    assert diff <= 1e-4


# ---- bad input ----


class Module:
    def __init__(self, layer):
        self.layer_idx = layer


def test_bad_input_is_refused_clearly(daemon):
    net = tiny("llama")
    cfg = net.config
    with vase.connect(daemon, name="test_hf") as client:
        cache = vase.hf.VaseCache(client, cfg, budget=64, window=16)
        k = torch.zeros(1, 2, 4, 16)
        with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
            cache.update(k.long(), k.long(), 0)
        with pytest.raises(ValueError, match=r"expected \[batch, 2, n >= 1, 16\]"):
            cache.update(torch.zeros(1, 3, 4, 16), torch.zeros(1, 3, 4, 16), 0)
        with pytest.raises(ValueError, match="layer 5 of 2"):
            cache.update(k, k, 5)
        # A model on another device than the arena (meta stands for a GPU here).
        meta = torch.zeros(1, 2, 4, 16, device="meta")
        out = cache.update(meta, meta, 0)
        with pytest.raises(ValueError, match="the arena is on cpu"):
            vase.hf._attention(Module(0), torch.zeros(1, 4, 4, 16, device="meta"), *out, None)
        cache.close()
        with pytest.raises(vase.VaseError) as e:
            cache.update(k, k, 0)
        assert e.value.errno == errno.EBADF
        # A model loaded with another attention implementation would get no queries.
        other = tiny("llama")
        other.set_attn_implementation("sdpa")
        with vase.hf.VaseCache(client, other.config) as c2, pytest.raises(ValueError,
                                                                         match="'vase'"):
            other(input_ids=torch.ones(1, 3, dtype=torch.long), past_key_values=c2)


def test_a_sequence_the_arena_cannot_hold(daemon):
    cfg = tiny("qwen3").config
    with vase.connect(daemon, name="test_hf") as client:
        with vase.hf.VaseCache(client, cfg, budget=64, window=16) as cache:
            n = 400_000  # 400k slots of 2 layers x 2 x 2 heads x 16 f32: far over 64 MiB
            k = torch.zeros(1, 2, n, 16)
            out = cache.update(k, k, 0)
            with pytest.raises(vase.VaseError) as e:
                vase.hf._attention(Module(0), torch.zeros(1, 4, n, 16), *out, None)
            assert e.value.errno in (errno.ENOSPC, errno.EINVAL, errno.E2BIG)
            assert cache.seqs == []


def test_generate_after_close(daemon):
    net = tiny("qwen3")
    ids, mask = padded_batch(net.config.vocab_size)
    with vase.connect(daemon, name="test_hf") as client:
        cache = vase.hf.VaseCache(client, net.config, budget=64, window=16)
        generate(net, cache, ids, mask, 4, do_sample=False)
        cache.close()
        with pytest.raises(vase.VaseError) as e:
            generate(net, cache, ids, mask, 4, do_sample=False)
        assert e.value.errno == errno.EBADF


def extend(mask, sequences):
    """The attention mask of a batch's prompts extended over what generate() added."""
    ones = torch.ones(mask.shape[0], sequences.shape[1] - mask.shape[1], dtype=mask.dtype)
    return torch.cat([mask, ones], dim=1)


def status(run):
    out = subprocess.run([os.path.join(BUILD, "vasectl"), f"--runtime-dir={run}", "--json",
                          "status"], capture_output=True, text=True, timeout=30, check=True)
    import json

    return json.loads(out.stdout)


def wait_for(what, fn, seconds=20.0):
    end = time.monotonic() + seconds
    while not fn():
        if time.monotonic() > end:
            raise AssertionError(f"not {what} within {seconds} s")
        time.sleep(0.05)


def seqs_of(st):
    return int(st.get("seqs", 0))


CHILD = textwrap.dedent("""
    import os, sys, torch
    sys.path[:0] = [{tests!r}]
    import vase, vase.hf
    from hfutil import tiny
    net = tiny("qwen3")
    client = vase.connect({run!r}, name="doomed")
    cache = vase.hf.VaseCache(client, net.config, budget=64, window=16)
    ids = torch.ones(2, 10, dtype=torch.long)
    with torch.no_grad():
        net.generate(input_ids=ids, max_new_tokens=20, past_key_values=cache, pad_token_id=0)
    print("open", len(cache.seqs), flush=True)
    os.kill(os.getpid(), 9)
""")


def test_a_dead_process_and_a_dead_daemon(tmp_path):
    # A private daemon: this test kills it.
    run = str(tmp_path)
    proc = start_vased(run, "--arena-bytes=64M", "--granule-bytes=64K")
    try:
        net = tiny("qwen3")
        ids, mask = padded_batch(net.config.vocab_size)
        with vase.connect(run, name="survivor") as client:
            cache = vase.hf.VaseCache(client, net.config, budget=64, window=16)
            first = generate(net, cache, ids, mask, 4, do_sample=False)
            assert seqs_of(status(run)) == 3
            # Another process dies with its cache open: its pages come back, ours stay.
            child = subprocess.run([sys.executable, "-c", CHILD.format(
                tests=os.path.dirname(os.path.abspath(__file__)), run=run)],
                capture_output=True, text=True, timeout=120,
                env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
            assert "open 2" in child.stdout, child.stderr
            wait_for("the dead process's sequences closed", lambda: seqs_of(status(run)) == 3)
            # Our cache goes on where it was: the whole text so far, then 4 tokens more.
            before = [s.len for s in cache.seqs]
            text, mask = first.sequences, extend(mask, first.sequences)
            more = generate(net, cache, text, mask, 4, do_sample=False)
            assert [s.len for s in cache.seqs] == [n + 4 for n in before]
            # The daemon dies mid-generation: a VaseError, not a hang or a crash.
            stop_vased(proc, signal.SIGKILL)
            with pytest.raises(vase.VaseError):
                generate(net, cache, more.sequences, extend(mask, more.sequences), 40,
                         do_sample=False)
            cache.close()
    finally:
        if proc.poll() is None:
            stop_vased(proc)


def test_close_returns_every_page(daemon):
    net = tiny("llama")
    ids, mask = padded_batch(net.config.vocab_size)
    before = status(daemon)
    with vase.connect(daemon, name="test_hf") as client:
        with vase.hf.VaseCache(client, net.config, budget=64, window=16) as cache:
            generate(net, cache, ids, mask, 8, do_sample=False)
            assert seqs_of(status(daemon)) == seqs_of(before) + 3
    wait_for("every page back", lambda: seqs_of(status(daemon)) == seqs_of(before))
    arena = lambda st: [(a.get("bytes_free"), a.get("bytes_pages")) for a in st.get("arenas", [])]
    wait_for("the arena whole again", lambda: arena(status(daemon)) == arena(before))



def test_many_caches_on_one_connection(daemon):
    # One model per geometry and name on a connection, however many caches are made: more
    # caches than max_models_per_client (16) one after another, and two at once.
    net = tiny("llama")
    ids, mask = padded_batch(net.config.vocab_size)
    before = seqs_of(status(daemon))
    with vase.connect(daemon, name="test_hf") as client:
        for i in range(20):
            with vase.hf.VaseCache(client, net.config, budget=64, window=16) as cache:
                generate(net, cache, ids, mask, 2, do_sample=False)
        with vase.hf.VaseCache(client, net.config, budget=64, window=16) as a, \
                vase.hf.VaseCache(client, net.config, budget=64, window=16) as b:
            generate(net, a, ids, mask, 2, do_sample=False)
            generate(net, b, ids, mask, 2, do_sample=False)
            assert seqs_of(status(daemon)) >= 6
        with pytest.raises(ValueError, match="first forward pass"):
            vase.hf.VaseCache(client, net.config).held(0, 0)
        closed = vase.hf.VaseCache(client, net.config)
        closed.close()
        with pytest.raises(vase.VaseError) as e:
            closed.held(0, 0)
        assert e.value.errno == errno.EBADF
    wait_for("every sequence closed", lambda: seqs_of(status(daemon)) == before)
