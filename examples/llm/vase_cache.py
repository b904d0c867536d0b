# SPDX-License-Identifier: MIT
"""A KV cache whose keys and values live in vased's shared arena.

`VaseCache` implements the cache interface of `model.py` (append, attend, step_done) for a
batch of sequences, each opened with its own eviction policy and budget. Keys, values and, for
the policies that read them, the post-RoPE queries are written straight into the arena through
the zero-copy tensors of the `vase` binding (`Model.kv_tensor`, `Seq.block_table`,
`Seq.query_slot`); attention reads the cache back through each sequence's block table (a gather,
then the same attention arithmetic as the plain cache). At the end of every forward pass the
new tokens are counted with `Seq.append` and ready plans are applied with `Seq.poll`: from then
on the sequence holds the slots its policy kept, in order.

Slots are not positions: after an eviction slot i holds whichever token the plan kept, so the
keys are stored after RoPE (with their own positions) and attention needs no positions at all.
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


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, first_new: int):
    """Causal attention of new queries over a sequence's cached slots, in float32.

    q: [n_new, q_heads, d]; k, v: [n_slots, kv_heads, d] with the n_new new tokens in the last
    slots; query i sees every slot below first_new + i + 1. Returns the output [n_new, q_heads,
    d] and the attention probabilities [q_heads, n_new, n_slots].
    """
    n_new, q_heads, d = q.shape
    n_slots, kv_heads, _ = k.shape
    group = q_heads // kv_heads
    qf = q.float().transpose(0, 1)  # [q_heads, n_new, d]
    kf = k.float().repeat_interleave(group, dim=1).transpose(0, 1)  # [q_heads, n_slots, d]
    vf = v.float().repeat_interleave(group, dim=1).transpose(0, 1)
    scores = torch.matmul(qf, kf.transpose(1, 2)) / math.sqrt(d)
    rows = torch.arange(n_new).unsqueeze(1)
    cols = torch.arange(n_slots).unsqueeze(0)
    scores = scores.masked_fill(cols > first_new + rows, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, vf).transpose(0, 1)  # [n_new, q_heads, d]
    return out, probs


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
        except BaseException:
            self.close()
            raise
        # Whether each sequence has a query ring (its policy reads the window's queries).
        self._ring = [_has_ring(s) for s in self.seqs]
        self._base: List[int] = []  # per sequence: its length when the current step began
        self._tables: List[torch.Tensor] = []
        # Per sequence and layer, the attention each slot received in this step (h2o).
        self._recv: List[dict] = [{} for _ in self.seqs]
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
        self._base = [s.len for s in self.seqs]
        self._tables = [torch.from_dlpack(s.block_table()).long() for s in self.seqs]
        self._n_new = 0

    def _slots(self, b: int, n: int) -> tuple:
        slots = torch.arange(self._base[b], self._base[b] + n)
        table = self._tables[b]
        if slots.numel() and int(slots[-1]) // self.block >= table.numel():
            raise RuntimeError(
                f"sequence {self.seqs[b].id}: slot {int(slots[-1])} beyond its capacity "
                f"{self.seqs[b].capacity}"
            )
        return table[slots // self.block], slots % self.block

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor, q: torch.Tensor) -> None:
        n = k.shape[1]
        self._n_new = n
        kd, vd = self.k[layer], self.v[layer]
        for b, s in enumerate(self.seqs):
            blocks, offs = self._slots(b, n)
            kd[blocks, offs] = k[b].to(kd.dtype)
            vd[blocks, offs] = v[b].to(vd.dtype)
            if self._ring[b]:
                # Only the last 2 * window queries can still be in the ring after this step.
                pos0 = s.position
                first = max(0, n - 2 * self.specs[b].window)
                for i in range(first, n):
                    slot = torch.from_dlpack(s.query_slot(layer, pos0 + i))
                    slot.copy_(q[b, i].to(slot.dtype))

    def attend(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        n = q.shape[1]
        outs = []
        for b, s in enumerate(self.seqs):
            n_slots = self._base[b] + n
            table = self._tables[b]
            blocks = table[: (n_slots + self.block - 1) // self.block]
            k = self.k[layer][blocks].reshape(-1, self.kv_heads, self.head_dim)[:n_slots]
            v = self.v[layer][blocks].reshape(-1, self.kv_heads, self.head_dim)[:n_slots]
            out, probs = attention(q[b], k, v, self._base[b])
            outs.append(out.to(q.dtype))
            if self.specs[b].policy in STATS_POLICIES:
                # Attention each slot received, summed over the group's query heads and the new
                # queries: [kv_heads][slots].
                group = self.q_heads // self.kv_heads
                self._recv[b][layer] = probs.reshape(self.kv_heads, group, n, n_slots).sum((1, 2))
        return torch.stack(outs)

    def step_done(self, n_new: int) -> None:
        for b, s in enumerate(self.seqs):
            # h2o: the attention the slots cached before this step received (the new tokens are
            # not counted by the sequence until the append).
            base = self._base[b]
            for layer, recv in sorted(self._recv[b].items()):
                if base > 0:
                    s.push_stats(layer, "acc_add", recv[:, :base].contiguous().numpy())
            self._recv[b] = {}
            s.append(n_new)
            s.poll()
        self._begin_step()

    # ---- what the harness reports ----

    def evictions(self) -> List[int]:
        return [s.rounds for s in self.seqs]
