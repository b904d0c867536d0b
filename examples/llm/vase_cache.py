# SPDX-License-Identifier: MIT
"""A KV cache whose keys and values live in vased's shared arena.

`VaseCache` implements the cache interface of `model.py` (append, attend, step_done) for a
batch of sequences, each opened with its own eviction policy and budget. Keys, values and, for
the policies that read them, the post-RoPE queries are written straight into the arena through
the zero-copy tensors of the `vase` binding (`Model.kv_tensor`, `Seq.query_slot`); attention
reads the cache back through each sequence's block table (`Seq.block_table`): one gather of the
blocks of every sequence, then masked attention over the slots each one holds. At the end of
every forward pass the new tokens are counted with `Seq.append`, and ready plans are applied
with `Seq.poll`: from then on a sequence holds the slots its policy kept, in order.

Slots are not positions: after an eviction slot i holds whichever token the plan kept, so keys
are stored after RoPE (with their own positions) and attention needs no positions at all.
"""

from __future__ import annotations

import errno
import math
from dataclasses import dataclass, field
from typing import List, Sequence

import torch

import vase

# Policies that read the attention each slot received, pushed by the engine.
STATS_POLICIES = {"h2o"}


@dataclass
class SeqSpec:
    """How one sequence of the batch is opened."""

    policy: str = "vase-attnv"
    budget: int = 1024
    window: int = 64
    mode: str = "sync"
    seed: int = 0
    extra: dict = field(default_factory=dict)  # further Model.open() keywords


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, base: torch.Tensor):
    """Causal grouped-query attention of a batch over slots of different counts, in float32.

    q: [b, n, q_heads, d] (the new tokens); k, v: [b, T, kv_heads, d] where sequence i holds
    base[i] + n slots, the n new ones last, and slots beyond are padding. Query j of sequence i
    sees slots below base[i] + j + 1. Returns the output [b, n, q_heads, d] in q's dtype and the
    probabilities [b, kv_heads, group, n, T].
    """
    b, n, q_heads, d = q.shape
    T, kv_heads = k.shape[1], k.shape[2]
    g = q_heads // kv_heads
    qf = q.float().reshape(b, n, kv_heads, g, d).permute(0, 2, 3, 1, 4)  # [b, kv, g, n, d]
    kf = k.float().permute(0, 2, 1, 3).unsqueeze(2)  # [b, kv, 1, T, d]
    vf = v.float().permute(0, 2, 1, 3).unsqueeze(2)
    scores = torch.matmul(qf, kf.transpose(-1, -2)) * (1.0 / math.sqrt(d))
    cols = torch.arange(T).view(1, 1, T)
    rows = torch.arange(n).view(1, n, 1)
    hidden = cols > base.view(b, 1, 1) + rows  # [b, n, T]
    scores = scores.masked_fill(hidden.view(b, 1, 1, n, T), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, vf)  # [b, kv, g, n, d]
    return out.permute(0, 3, 1, 2, 4).reshape(b, n, q_heads, d).to(q.dtype), probs


def _has_ring(seq: "vase.Seq") -> bool:
    try:
        seq.query_slot(0, 0)
    except vase.VaseError as e:
        if e.errno == errno.EINVAL:
            return False
        raise
    return True


class VaseCache:
    """The cache of a batch of sequences in one vase model (one geometry, one arena)."""

    def __init__(
        self,
        client: "vase.Client",
        layers: int,
        q_heads: int,
        kv_heads: int,
        head_dim: int,
        specs: Sequence[SeqSpec],
        prompt_len: int = 0,
        dtype: str = "f32",
        block_tokens: int = 16,
        name: str = "",
    ):
        self.layers, self.q_heads, self.kv_heads, self.head_dim = layers, q_heads, kv_heads, head_dim
        self.model = client.register_model(
            layers, q_heads, kv_heads, head_dim, dtype=dtype, block_tokens=block_tokens, name=name
        )
        self.block = self.model.block_tokens
        # Per layer, K and V of the whole arena: [num_blocks][block][kv_heads][head_dim] views.
        self.k = [torch.from_dlpack(self.model.kv_tensor(l, "k")) for l in range(layers)]
        self.v = [torch.from_dlpack(self.model.kv_tensor(l, "v")) for l in range(layers)]
        self.specs = list(specs)
        self.seqs: List["vase.Seq"] = []
        try:
            for sp in self.specs:
                self.seqs.append(
                    self.model.open(
                        policy=sp.policy,
                        budget=sp.budget,
                        window=sp.window,
                        prompt_len=prompt_len,
                        mode=sp.mode,
                        seed=sp.seed,
                        **sp.extra,
                    )
                )
            # The query ring of each sequence whose policy reads queries: per layer, its 2 *
            # window entries as views (ring pages never move), entry pos % (2 * window).
            self.rings = [
                [
                    [torch.from_dlpack(s.query_slot(l, e)) for e in range(2 * sp.window)]
                    for l in range(layers)
                ]
                if _has_ring(s)
                else None
                for s, sp in zip(self.seqs, self.specs)
            ]
        except BaseException:
            self.close()
            raise
        self._stats = [sp.policy in STATS_POLICIES for sp in self.specs]
        self._recv: dict = {}  # layer -> [b, kv_heads, T]: attention received this step (h2o)
        self._begin_step()

    def close(self) -> None:
        for s in self.seqs:
            s.close()
        self.seqs = []

    def __enter__(self) -> "VaseCache":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- the cache interface of model.py ----

    def _begin_step(self) -> None:
        # Per sequence, its length and position when the step began, and its block table.
        self._base = torch.tensor([s.len for s in self.seqs], dtype=torch.long)
        self._pos = [s.position for s in self.seqs]
        tables = [torch.from_dlpack(s.block_table()).long() for s in self.seqs]
        width = max(t.numel() for t in tables)
        self._tables = torch.zeros(len(tables), width, dtype=torch.long)
        for i, t in enumerate(tables):
            self._tables[i, : t.numel()] = t
        self._widths = torch.tensor([t.numel() for t in tables])
        self._where = None

    def _new_slots(self, n: int):
        """The blocks and offsets of the n new tokens of every sequence: [b * n] each."""
        if self._where is None:
            slots = self._base.view(-1, 1) + torch.arange(n).view(1, -1)  # [b, n]
            idx = slots // self.block
            if bool((idx >= self._widths.view(-1, 1)).any()):
                full = [s.id for s, w in zip(self.seqs, (idx >= self._widths.view(-1, 1)).any(1)) if w]
                raise RuntimeError(f"sequences {full}: more slots than their capacity")
            blocks = self._tables.gather(1, idx)
            self._where = (blocks.reshape(-1), (slots % self.block).reshape(-1))
        return self._where

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor, q: torch.Tensor) -> None:
        b, n = k.shape[0], k.shape[1]
        blocks, offs = self._new_slots(n)
        kd, vd = self.k[layer], self.v[layer]
        kd[blocks, offs] = k.reshape(b * n, self.kv_heads, self.head_dim).to(kd.dtype)
        vd[blocks, offs] = v.reshape(b * n, self.kv_heads, self.head_dim).to(vd.dtype)
        for i, ring in enumerate(self.rings):
            if ring is None:
                continue
            # Only the last 2 * window queries can still be in the ring after this step.
            entries = len(ring[layer])
            for j in range(max(0, n - entries), n):
                slot = ring[layer][(self._pos[i] + j) % entries]
                slot.copy_(q[i, j].to(slot.dtype))

    def attend(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        b, n = q.shape[0], q.shape[1]
        held = self._base + n
        width = int((held.max() + self.block - 1) // self.block)
        blocks = self._tables[:, :width]  # padding blocks are read, then masked
        shape = (b, width * self.block, self.kv_heads, self.head_dim)
        k = self.k[layer][blocks].reshape(shape)
        v = self.v[layer][blocks].reshape(shape)
        out, probs = masked_attention(q, k, v, self._base)
        if any(self._stats):
            # Attention each slot received, summed over the new queries and each KV head's
            # group of query heads: [b, kv_heads, T].
            self._recv[layer] = probs.sum(dim=(2, 3))
        return out

    def step_done(self, n_new: int) -> None:
        for i, s in enumerate(self.seqs):
            # h2o: the attention the slots cached before this step received (the new tokens are
            # not counted by the sequence until the append).
            base = int(self._base[i])
            if self._stats[i] and base > 0:
                for layer in range(self.layers):
                    recv = self._recv[layer][i, :, :base].contiguous()
                    s.push_stats(layer, "acc_add", recv.numpy())
            s.append(n_new)
            s.poll()
        self._recv = {}
        self._begin_step()

    # ---- what the harness reports ----

    def evictions(self) -> List[int]:
        return [s.rounds for s in self.seqs]

    def counters(self) -> List[dict]:
        """libvase's counters of each sequence (Seq.stats): evictions, stalls, compaction."""
        return [s.stats for s in self.seqs]
