# SPDX-License-Identifier: MIT
"""A KV cache for PyTorch decoders whose keys and values live in vased's shared arena.

`VaseCache` serves a batch of sequences, each opened with its own eviction policy and budget,
through three calls a decoder makes (the protocol of `examples/llm` and of `vase.hf`):

- ``append(layer, k, v, q)``: the new tokens' keys and values ``[b, n, kv_heads, head_dim]``
  (after RoPE) and their queries ``[b, n, q_heads, head_dim]`` (after RoPE), written straight
  into the arena through the zero-copy tensors of the binding (`Model.kv_tensor`,
  `Seq.query_slot`; the queries only for the policies that read them);
- ``attend(layer, q)``: attention of the new queries over what each sequence holds, read back
  through its block table (`Seq.block_table`): on a CUDA arena FlashInfer (any block size) or
  FlashAttention-2 (blocks of a multiple of 256 tokens) where installed, and on a host arena
  vase's own C kernel (`vase._vase.paged_attention`) when asked for by name, each reading the
  arena's pages through the table itself; otherwise, and for a policy that reads the attention
  each slot received, one gather of the blocks of every sequence, then masked attention over the
  slots each one holds (PyTorch's fused scaled_dot_product_attention, or the explicit softmax
  whose probabilities the policy pushes);
- ``step_done(n)``: the end of a forward pass: the new tokens are counted with `Seq.append`,
  and ready plans are applied with `Seq.poll`; from then on a sequence holds the slots its
  policy kept, in order. ``step_done`` also takes a count per sequence, for batches whose rows
  add different numbers of tokens (padding).

Slots are not positions: after an eviction slot i holds whichever token the plan kept, so keys
are stored after RoPE (with their own positions) and attention needs no positions at all.
"""

from __future__ import annotations

import errno
import math
import time
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple, Union

import torch

import vase

# What a call says when vased went away.
_GONE = {errno.ECONNRESET, errno.EPIPE, errno.ENOTCONN, errno.ESHUTDOWN, errno.ECONNREFUSED}

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


# How attend() reads the cache: "gather" (any device: the blocks copied out, then masked
# attention), the paged kernels reading the arena through the block table ("paged-cpu", vase's
# own, on a host arena, chosen only by name: it copies nothing but is slower than gather's
# fused attention past a few hundred slots; FlashInfer and FlashAttention-2 on a CUDA one), or
# "auto": a CUDA kernel when one applies, else gather.
ATTENTION = ("auto", "gather", "paged-cpu", "flashinfer", "flash-attn")
KERNEL_DTYPES = (torch.float16, torch.bfloat16)
# The torch element types of a model and the vase model's dtype for each.
DTYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def _import_kernel(name: str):
    """The paged attention entry point of `name`, or None when it is not installed."""
    if name == "paged-cpu":
        return vase._vase.paged_attention
    try:
        if name == "flash-attn":
            from flash_attn import flash_attn_with_kvcache

            return flash_attn_with_kvcache
        import flashinfer

        return flashinfer
    except ImportError:
        return None


def choose_attention(requested: str, device: torch.device, dtype: torch.dtype, block: int,
                     needs_probs: bool):
    """The attention backend for a cache: (name, kernel module or function or None).

    An explicit request that cannot be met raises ValueError saying why; "auto" takes
    FlashInfer, then FlashAttention-2, on a CUDA arena of fp16/bf16 when they apply, else
    "gather" ("paged-cpu" is taken only by name). The kernels do not return the attention
    probabilities, so a batch holding a sequence whose policy needs them (h2o) gathers."""
    if requested not in ATTENTION:
        raise ValueError(f"attention {requested!r}: one of {', '.join(ATTENTION)}")
    if requested == "gather":
        return "gather", None
    candidates = ["flashinfer", "flash-attn"] if requested == "auto" else [requested]
    why = []
    for name in candidates:
        kernel = _import_kernel(name)
        if kernel is None:
            why.append(f"{name} is not installed")
        elif needs_probs:
            why.append(f"{name} returns no attention probabilities, which h2o reads")
        elif name == "paged-cpu":
            if device.type == "cpu":
                return name, kernel
            why.append(f"paged-cpu runs on a host arena ({device} here)")
        elif name == "flash-attn" and block % 256:
            why.append(f"flash-attn takes blocks of a multiple of 256 tokens, not {block}")
        elif requested == "auto" and (device.type != "cuda" or dtype not in KERNEL_DTYPES):
            why.append(f"{name} runs on a CUDA arena of fp16/bf16 ({device}, {dtype} here)")
        else:
            return name, kernel
    if requested == "auto":
        return "gather", None
    raise ValueError(f"attention {requested!r}: {'; '.join(why)}")


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor,
                     scale: Optional[float] = None):
    """Grouped-query attention of a batch over slots of different counts, in float32.

    q: [b, n, q_heads, d] (the new tokens); k, v: [b, T, kv_heads, d]; visible: [b, n], the
    slots query j of sequence i sees: slots 0 .. visible[i, j] - 1 (causal attention over a
    sequence that holds base[i] slots before the step and appends its n new ones in order is
    visible[i, j] = base[i] + j + 1). A query that sees no slot gets NaN. scale: the scores'
    factor, 1/sqrt(d) if None. Returns the output [b, n, q_heads, d] in q's dtype and the
    probabilities [b, kv_heads, group, n, T].
    """
    b, n, q_heads, d = q.shape
    T, kv_heads = k.shape[1], k.shape[2]
    g = q_heads // kv_heads
    qf = q.float().reshape(b, n, kv_heads, g, d).permute(0, 2, 3, 1, 4)  # [b, kv, g, n, d]
    kf = k.float().permute(0, 2, 1, 3).unsqueeze(2)  # [b, kv, 1, T, d]
    vf = v.float().permute(0, 2, 1, 3).unsqueeze(2)
    factor = (1.0 / math.sqrt(d)) if scale is None else scale
    scores = torch.matmul(qf, kf.transpose(-1, -2)) * factor
    cols = torch.arange(T, device=q.device).view(1, 1, T)
    hidden = cols >= visible.to(q.device).view(b, n, 1)  # [b, n, T]
    scores = scores.masked_fill(hidden.view(b, 1, 1, n, T), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, vf)  # [b, kv, g, n, d]
    return out.permute(0, 3, 1, 2, 4).reshape(b, n, q_heads, d).to(q.dtype), probs


def sdpa_mask(visible: torch.Tensor, group: int, slots: int,
              device: Optional[torch.device] = None) -> torch.Tensor:
    """The boolean mask `sdpa_attention` gives the fused kernel: [b, 1, group * n, slots], row
    h * n + j (query j of the h-th query head of a KV head's group) True on the slots below
    visible[i, j]."""
    b, n = visible.shape
    cols = torch.arange(slots, device=device).view(1, 1, slots)
    see = cols < visible.to(device).view(b, n, 1)  # [b, n, T]
    return see.unsqueeze(1).expand(b, group, n, slots).reshape(b, 1, group * n, slots)


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor,
                   scale: Optional[float] = None, mask: Optional[torch.Tensor] = None
                   ) -> torch.Tensor:
    """`masked_attention`'s output without its probabilities, through PyTorch's fused
    scaled_dot_product_attention (in float32): each KV head's group of query heads is read as
    g times as many queries of that head, so K and V are neither repeated nor copied. mask:
    `sdpa_mask(visible, g, T, q.device)`, made here if None (a caller that attends several
    layers with the same visible makes it once)."""
    b, n, q_heads, d = q.shape
    T, kv_heads = k.shape[1], k.shape[2]
    g = q_heads // kv_heads
    qf = q.float().reshape(b, n, kv_heads, g, d).permute(0, 2, 3, 1, 4).reshape(b, kv_heads,
                                                                               g * n, d)
    if mask is None:
        mask = sdpa_mask(visible, g, T, q.device)
    out = torch.nn.functional.scaled_dot_product_attention(
        qf, k.float().transpose(1, 2), v.float().transpose(1, 2), attn_mask=mask,
        scale=(1.0 / math.sqrt(d)) if scale is None else scale)
    return out.reshape(b, kv_heads, g, n, d).permute(0, 3, 1, 2, 4).reshape(
        b, n, q_heads, d).to(q.dtype)


def _has_ring(seq: "vase.Seq") -> bool:
    try:
        seq.query_slot(0, 0)
    except vase.VaseError as e:
        if e.errno == errno.EINVAL:
            return False
        raise
    return True


class VaseCache:
    """The cache of a batch of sequences in one vase model (one geometry, one arena).

    One sequence per spec, opened with prompt_len (one count for all, or one per sequence) as
    the tokens its first forward pass brings. Every forward pass appends n columns to every
    sequence; ``real`` ([b, n] booleans, to append() and attend()) marks which columns of a row
    are its tokens, the others being padding that is neither stored nor counted (a row's tokens
    keep their order; its padded queries give zeros). Without ``real`` every column is a token.
    """

    def __init__(
        self,
        client: "vase.Client",
        layers: int,
        q_heads: int,
        kv_heads: int,
        head_dim: int,
        specs: Sequence[SeqSpec],
        prompt_len: Union[int, Sequence[int]] = 0,
        dtype: str = "f32",
        block_tokens: int = 16,
        name: str = "",
        attention: str = "auto",
    ):
        self.layers, self.q_heads, self.kv_heads, self.head_dim = layers, q_heads, kv_heads, head_dim
        self.specs = list(specs)
        prompts = [prompt_len] * len(self.specs) if isinstance(prompt_len, int) else list(prompt_len)
        if len(prompts) != len(self.specs):
            raise ValueError(f"{len(prompts)} prompt lengths for {len(self.specs)} sequences")
        self.seqs: List["vase.Seq"] = []
        self.model = client.register_model(
            layers, q_heads, kv_heads, head_dim, dtype=dtype, block_tokens=block_tokens, name=name
        )
        self.block = self.model.block_tokens
        # Per layer, K and V of the whole arena: [num_blocks][block][kv_heads][head_dim] views.
        self.k = [torch.from_dlpack(self.model.kv_tensor(l, "k")) for l in range(layers)]
        self.v = [torch.from_dlpack(self.model.kv_tensor(l, "v")) for l in range(layers)]
        self.device = self.k[0].device
        self._stats = [sp.policy in STATS_POLICIES for sp in self.specs]
        self.attention, self._kernel = choose_attention(
            attention, self.device, self.k[0].dtype, self.block, any(self._stats))
        self._workspace = None
        try:
            for sp, p in zip(self.specs, prompts):
                self.seqs.append(
                    self.model.open(
                        policy=sp.policy,
                        budget=sp.budget,
                        window=sp.window,
                        prompt_len=p,
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
        # Per sequence: seconds spent in its own vase calls (push_stats, append, poll) and the
        # daemon's plan seconds of the evictions it applied.
        self.call_seconds = [0.0] * len(self.seqs)
        self.plan_seconds = [0.0] * len(self.seqs)
        self._rounds = [0] * len(self.seqs)
        self._recv: dict = {}  # layer -> [b, kv_heads, T]: attention received this step (h2o)
        self._begin_step()

    def close(self) -> None:
        """Closes every sequence (their pages go back to the arena). Idempotent. A daemon that
        is gone (its connection reset) took the pages with it: that is not an error here; any
        other failure is raised once every sequence was tried."""
        seqs, self.seqs = self.seqs, []
        failed = None
        for s in seqs:
            try:
                s.close()
            except vase.VaseError as e:
                if e.errno not in _GONE and failed is None:
                    failed = e
        if failed is not None:
            raise failed

    @property
    def closed(self) -> bool:
        return not self.seqs

    def __enter__(self) -> "VaseCache":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- the cache protocol ----

    def _begin_step(self) -> None:
        # Per sequence, its length and position when the step began, and its block table.
        self._base = torch.tensor([s.len for s in self.seqs], dtype=torch.long)
        self._pos = [s.position for s in self.seqs]
        tables = [torch.from_dlpack(s.block_table()).long() for s in self.seqs]
        width = max((t.numel() for t in tables), default=0)
        self._tables = torch.zeros(len(tables), width, dtype=torch.long)
        for i, t in enumerate(tables):
            self._tables[i, : t.numel()] = t
        self._widths = torch.tensor([t.numel() for t in tables], dtype=torch.long)
        self._step = None  # this step's new tokens, fixed by its first append() or attend()
        self._plan = None  # the paged kernels' per-step inputs, made by the first attend()

    def _tokens(self, n: int, real: Optional[torch.Tensor]) -> dict:
        """This step's new tokens, the same for every layer: where each goes (rows, cols: the
        tokens among the [b, n] columns; blocks, offs: their places in the arena), how many
        each sequence appends (counts), the slots each column's query sees (visible), and the
        padding mask (pad, None when every column is a token)."""
        if self._step is not None:
            if self._step["n"] != n:
                raise ValueError(f"{n} new columns in a step that began with {self._step['n']}")
            return self._step
        b = len(self.seqs)
        if b == 0:
            raise vase.VaseError(9, "Bad file descriptor", "the cache is closed")
        mask = torch.ones(b, n, dtype=torch.bool)
        if real is not None:
            mask = torch.as_tensor(real).to(device="cpu", dtype=torch.bool)
            if tuple(mask.shape) != (b, n):
                raise ValueError(f"real: shape {tuple(mask.shape)}, expected {(b, n)}")
        rank = mask.long().cumsum(1)  # [b, n]: a row's tokens up to and including column j
        rows, cols = mask.nonzero(as_tuple=True)
        slots = (self._base.view(-1, 1) + rank - 1)[rows, cols]
        idx = slots // self.block
        over = idx >= self._widths[rows]
        if bool(over.any()):
            full = sorted({self.seqs[int(r)].id for r in rows[over]})
            raise RuntimeError(f"sequences {full}: more slots than their capacity")
        self._step = dict(
            n=n, rows=rows, cols=cols, blocks=self._tables[rows, idx], offs=slots % self.block,
            counts=rank[:, -1] if n else torch.zeros(b, dtype=torch.long),
            visible=(self._base.view(-1, 1) + rank).clamp(min=1),
            pad=None if bool(mask.all()) else ~mask)
        return self._step

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor, q: torch.Tensor,
               real: Optional[torch.Tensor] = None) -> None:
        st = self._tokens(k.shape[1], real)
        rows, cols = st["rows"].to(k.device), st["cols"].to(k.device)
        kd, vd = self.k[layer], self.v[layer]
        kd[st["blocks"], st["offs"]] = k[rows, cols].to(kd.dtype)
        vd[st["blocks"], st["offs"]] = v[rows, cols].to(vd.dtype)
        for i, writes in self._ring_writes(st):
            ring = self.rings[i][layer]
            for entry, col in writes:
                ring[entry].copy_(q[i, col].to(ring[entry].dtype))

    def _ring_writes(self, st: dict) -> list:
        """Per sequence with a query ring, made once a step: (entry, column) of each new query
        that is still in the ring after the step (only the last 2 * window can be)."""
        if "ring" not in st:
            st["ring"] = []
            for i, ring in enumerate(self.rings):
                if ring is None:
                    continue
                mine = st["cols"][st["rows"] == i].tolist()
                entries = len(ring[0])
                st["ring"].append((i, [((self._pos[i] + r) % entries, mine[r])
                                       for r in range(max(0, len(mine) - entries), len(mine))]))
        return st["ring"]

    def attend(self, layer: int, q: torch.Tensor, real: Optional[torch.Tensor] = None,
               scale: Optional[float] = None, out: Optional[torch.Tensor] = None
               ) -> torch.Tensor:
        # out: where "paged-cpu" may write the result (float32, contiguous, q's shape), saving a
        # copy; the other attentions ignore it. The result is returned either way.
        st = self._tokens(q.shape[1], real)
        if self.attention == "paged-cpu":
            return self._attend_paged_cpu(layer, q, st, scale, out)
        if st["pad"] is None:
            if self.attention == "flash-attn":
                return self._attend_flash_attn(layer, q, scale)
            if self.attention == "flashinfer":
                return self._attend_flashinfer(layer, q, scale)
        b, n = q.shape[0], q.shape[1]
        gather = self._gather_plan(st)
        shape = gather["shape"]
        k = torch.index_select(self.k[layer], 0, gather["blocks"]).view(shape)
        v = torch.index_select(self.v[layer], 0, gather["blocks"]).view(shape)
        if gather["past"] is not None:
            k.view(-1, self.kv_heads, self.head_dim).index_fill_(0, gather["past"], 0)
            v.view(-1, self.kv_heads, self.head_dim).index_fill_(0, gather["past"], 0)
        if any(self._stats):
            out, probs = masked_attention(q, k, v, st["visible"], scale)
        else:
            out = sdpa_attention(q, k, v, st["visible"], scale, gather["mask"])
            probs = None
        if st["pad"] is not None:
            # Padded queries see what the row held (or slot 0): their output is not theirs.
            pad = st["pad"].to(q.device)
            out = out.masked_fill(pad.view(b, n, 1, 1), 0)
            if probs is not None:
                probs = probs.masked_fill(pad.view(b, 1, 1, n, 1), 0)
        if probs is not None:
            # Attention each slot received, summed over the new queries and each KV head's
            # group of query heads: [b, kv_heads, T].
            self._recv[layer] = probs.sum(dim=(2, 3))
        return out

    def _gather_plan(self, st: dict) -> dict:
        """What the gather path needs this step, made once for every layer: the blocks to copy
        out (every sequence's first `width`, padding blocks included), the gathered slots to
        zero, and the fused kernel's mask.

        Slots past what a sequence holds are whatever the arena had there (another sequence's
        data, NaN in another type's reading): a probability of 0 times a NaN of V is NaN, and
        the fused kernel adds its mask to a NaN score rather than replacing it, so K and V are
        zeroed there in the gathered copies (the slots of a last block not yet full, and a
        shorter row's padding blocks)."""
        if "gather" not in st:
            held = self._base + st["counts"]
            width = max(1, int((held.max() + self.block - 1) // self.block))
            slots = width * self.block
            past = (torch.arange(slots).view(1, -1) >= held.view(-1, 1)).view(-1)
            idx = past.nonzero().view(-1)
            st["gather"] = dict(
                shape=(len(self.seqs), slots, self.kv_heads, self.head_dim),
                blocks=self._tables[:, :width].reshape(-1).to(self.device),
                past=idx.to(self.device) if idx.numel() else None,
                mask=sdpa_mask(st["visible"], self.q_heads // self.kv_heads, slots, self.device)
                if not any(self._stats) else None)
        return st["gather"]

    def _paged_cpu_plan(self, st: dict) -> dict:
        """vase's CPU kernel's inputs this step, made once for every layer: each sequence's
        block table, int32, -1 past its own blocks (so that a visible count beyond them is
        refused instead of reading another sequence's blocks), and the slots each column's query
        sees, int32, 0 for a padded query (whose output is then zeros)."""
        if "paged-cpu" not in st:
            width = self._tables.shape[1]
            own = torch.arange(width).view(1, -1) < self._widths.view(-1, 1)
            visible = st["visible"] if st["pad"] is None else st["visible"].masked_fill(
                st["pad"], 0)
            st["paged-cpu"] = dict(
                table=self._tables.masked_fill(~own, -1).to(torch.int32).contiguous(),
                visible=visible.to(torch.int32).contiguous())
        return st["paged-cpu"]

    def _attend_paged_cpu(self, layer: int, q: torch.Tensor, st: dict,
                          scale: Optional[float] = None, out: Optional[torch.Tensor] = None
                          ) -> torch.Tensor:
        # One call reads every sequence's slots in the arena, through its block table, in
        # place; the kernel checks the shapes, the table entries it reads and the counts.
        plan = self._paged_cpu_plan(st)
        qf = q.detach().to(device="cpu", dtype=torch.float32).contiguous()
        if (out is None or out.dtype != torch.float32 or out.shape != qf.shape
                or not out.is_contiguous()):
            out = torch.empty(qf.shape, dtype=torch.float32)
        self._kernel(qf, self.k[layer], self.v[layer], plan["table"], plan["visible"], out,
                     1.0 / math.sqrt(self.head_dim) if scale is None else scale,
                     torch.get_num_threads())
        return out.to(q.dtype)

    def _step_plan(self, n: int) -> dict:
        """What the paged kernels need this step, made once for every layer: per sequence the
        slots it holds once the n new ones are in and the blocks those take, and the block
        tables; on the host and, in int32, on the arena's device."""
        if self._plan is None:
            held = self._base + n
            pages = (held + self.block - 1) // self.block
            table = self._tables[:, : int(pages.max())]
            i32 = dict(dtype=torch.int32, device=self.device)
            self._plan = dict(held=held, pages=pages, table=table, held_dev=held.to(**i32),
                              table_dev=table.to(**i32))
        return self._plan

    def _attend_flash_attn(self, layer: int, q: torch.Tensor,
                           scale: Optional[float] = None) -> torch.Tensor:
        # flash_attn_with_kvcache reads blocks table[i][0 .. ceil(seqlens[i] / block)) of the
        # arena-wide K and V (strided: the block stride is the page's) and masks causally from
        # the bottom right: new query j of sequence i sees slots below base[i] + j + 1.
        plan = self._step_plan(q.shape[1])
        return self._kernel(
            q.to(self.k[layer].dtype),
            self.k[layer],
            self.v[layer],
            cache_seqlens=plan["held_dev"],
            block_table=plan["table_dev"],
            softmax_scale=1.0 / math.sqrt(self.head_dim) if scale is None else scale,
            causal=True,
        ).to(q.dtype)

    def _attend_flashinfer(self, layer: int, q: torch.Tensor,
                           scale: Optional[float] = None) -> torch.Tensor:
        b, n = q.shape[0], q.shape[1]
        if self._plan is None:
            plan = self._step_plan(n)
            held, pages, table = plan["held"], plan["pages"], plan["table"]
            # One plan per step for every layer: the sequences' pages in CSR form.
            keep = torch.arange(table.shape[1]).view(1, -1) < pages.view(-1, 1)
            i32 = dict(dtype=torch.int32, device=self.device)
            if self._workspace is None:
                self._workspace = torch.empty(128 << 20, dtype=torch.uint8, device=self.device)
                self._wrapper = self._kernel.BatchPrefillWithPagedKVCacheWrapper(
                    self._workspace, "NHD")
            self._wrapper.plan(
                torch.arange(0, (b + 1) * n, n, **i32),
                torch.cat([torch.zeros(1, dtype=torch.long), pages.cumsum(0)]).to(**i32),
                table[keep].to(**i32),
                (held - (pages - 1) * self.block).to(**i32),
                self.q_heads,
                self.kv_heads,
                self.head_dim,
                self.block,
                causal=True,
                sm_scale=1.0 / math.sqrt(self.head_dim) if scale is None else scale,
                q_data_type=self.k[layer].dtype,
                kv_data_type=self.k[layer].dtype,
            )
        out = self._wrapper.run(
            q.to(self.k[layer].dtype).reshape(b * n, self.q_heads, self.head_dim),
            (self.k[layer], self.v[layer]),
        )
        return out.reshape(b, n, self.q_heads, self.head_dim).to(q.dtype)

    def step_done(self, n_new: Optional[int] = None) -> None:
        """Ends a forward pass: each sequence counts its new tokens (n_new each, or what this
        step's append() found: its real columns) and applies a plan that is ready."""
        if self._step is not None:
            counts = self._step["counts"].tolist()
            if n_new is not None and (self._step["pad"] is not None or n_new != self._step["n"]):
                raise ValueError(f"step_done({n_new}) after a step of {self._step['n']} columns"
                                 + (" with padding" if self._step["pad"] is not None else ""))
        elif n_new is None:
            raise ValueError("step_done() without n_new before any append()")
        else:
            counts = [n_new] * len(self.seqs)
        for i, s in enumerate(self.seqs):
            t0 = time.perf_counter()
            # h2o: the attention the slots cached before this step received (the new tokens are
            # not counted by the sequence until the append).
            base = int(self._base[i])
            if self._stats[i] and base > 0:
                for layer in range(self.layers):
                    recv = self._recv[layer][i, :, :base].contiguous()
                    s.push_stats(layer, "acc_add", recv.cpu().numpy())
            if counts[i]:
                s.append(counts[i])
            s.poll()
            self.call_seconds[i] += time.perf_counter() - t0
            rounds = s.rounds
            if rounds != self._rounds[i]:
                # At most one plan is applied per poll: its time is the last plan's.
                self.plan_seconds[i] += s.stats["last_plan_seconds"] * (rounds - self._rounds[i])
                self._rounds[i] = rounds
        self._recv = {}
        self._begin_step()

    # ---- what the harness reports ----

    def held(self, i: int, layer: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """The keys and values sequence i holds now in layer, in slot order: two new tensors
        [kv_heads, len, head_dim] in the arena's dtype. After an eviction each KV head holds
        its own tokens (the slot order of a head is the order of its kept tokens), so slot s
        of two heads may be two different positions."""
        seq = self.seqs[i]
        table = torch.from_dlpack(seq.block_table()).long().to(self.device)
        shape = (-1, self.kv_heads, self.head_dim)
        k = self.k[layer][table].reshape(shape)[: seq.len]
        v = self.v[layer][table].reshape(shape)[: seq.len]
        return k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous()

    def evictions(self) -> List[int]:
        return [s.rounds for s in self.seqs]

    def counters(self) -> List[dict]:
        """libvase's counters of each sequence (Seq.stats): evictions, stalls, compaction."""
        return [s.stats for s in self.seqs]
