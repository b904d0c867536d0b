# SPDX-License-Identifier: MIT
"""A Hugging Face transformers `Cache` whose keys and values live in vased's arena.

::

    import vase, vase.hf
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="vase")
    tok = AutoTokenizer.from_pretrained(path, padding_side="left")
    with vase.connect() as client:
        inputs = tok(["a prompt", "a longer prompt"], return_tensors="pt", padding=True)
        with vase.hf.VaseCache(client, model.config, policy="vase-attnv", budget=1024) as cache:
            out = model.generate(**inputs, past_key_values=cache, max_new_tokens=4096)

Each row of the batch is one vase sequence, opened at the cache's first forward pass with the
row's tokens as its prompt (padding is neither stored nor counted). Its keys and values are
written into the arena after RoPE, the policies that read queries get the post-RoPE queries,
attention reads what each sequence holds through its block table, and after the last layer of
every forward pass each sequence counts its new tokens and applies a ready plan: from then on
it holds the slots its policy kept, so attention runs over at most budget + window + slack
slots however long the generation goes.

Importing this module registers "vase" with transformers' attention interface
(`AttentionInterface`) and its mask interface (`AttentionMaskInterface`); no file of
transformers is changed. A model loaded with ``attn_implementation="vase"`` (or switched with
``model.set_attn_implementation("vase")``) attends through the vase cache when it is given one,
and through transformers' SDPA attention with any other cache, so the same model also runs with
`DynamicCache`. A `VaseCache` given to a model with another attention implementation refuses its
first update (it would get no queries and no padding mask).

Supported: decoder-only models whose attention modules call ``past_key_values.update()`` and
then the configured attention function with post-RoPE queries, without sliding windows (the
Llama and Qwen3 families); greedy and sampled decoding; batches of prompts of different
lengths (left padding, with ``attention_mask``); plain forward loops. Not supported: beam search
and assisted decoding (`reorder_cache`, `crop`: they would need evicted tokens back).

Errors: what vase refuses raises `vase.VaseError` with its errno (e.g. ENOSPC when the arena
cannot hold a sequence, ECONNRESET-like codes when the daemon goes away); a wrong dtype, device
or shape raises TypeError or ValueError before anything reaches the arena; any use after
close() raises VaseError(EBADF). close() (or the end of a ``with`` block, or the process's end)
returns every page.
"""

from __future__ import annotations

import errno
import threading
from dataclasses import replace
from typing import Any, Optional, Sequence, Tuple

import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

import vase
from vase.torch import DTYPES, SeqSpec
from vase.torch import VaseCache as _Batch

__all__ = ["VaseCache", "ATTENTION"]

# The name under which this module registers its attention and mask functions.
ATTENTION = "vase"

# The update() of the layer being computed on this thread: the attention function that follows
# it takes the keys and values it was given from here (a thread may run several models).
_pending = threading.local()


class _VaseMask:
    """What the "vase" mask function gives the attention layers: the 2D padding mask ([b,
    columns] booleans, None without one) for a VaseCache, and, made only when asked, the SDPA
    mask of the same arguments for any other cache."""

    def __init__(self, padding: Optional[torch.Tensor], sdpa_args: dict):
        self.padding = padding
        self._args = sdpa_args
        self._sdpa: Any = self

    def sdpa(self):
        if self._sdpa is self:
            self._sdpa = sdpa_mask(**self._args)
        return self._sdpa


def _mask(batch_size, cache_position, kv_length, kv_offset=0, mask_function=None,
          attention_mask=None, **kwargs):
    args = dict(batch_size=batch_size, cache_position=cache_position, kv_length=kv_length,
                kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask)
    args.update({k: v for k, v in kwargs.items() if k in ("allow_is_causal_skip", "local_size",
                                                          "allow_is_bidirectional_skip",
                                                          "allow_torch_fix")})
    return _VaseMask(attention_mask, args)


def _attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    p = getattr(_pending, "update", None)
    _pending.update = None
    if p is not None and p[1] is key and p[2] is value:
        return p[0]._attend(module, query, key, value, attention_mask, scaling)
    mask = attention_mask.sdpa() if isinstance(attention_mask, _VaseMask) else attention_mask
    return sdpa_attention_forward(module, query, key, value, mask, dropout=dropout,
                                  scaling=scaling, **kwargs)


AttentionInterface.register(ATTENTION, _attention)
AttentionMaskInterface.register(ATTENTION, _mask)


def _closed() -> vase.VaseError:
    return vase.VaseError(errno.EBADF, "Bad file descriptor", "the VaseCache is closed")


class VaseCache(Cache):
    """A transformers Cache of one batch whose rows are vase sequences in vased's arena.

    client: a `vase.Client`. model_config: the model's `PretrainedConfig` (layers, heads, head
    dimension; its ``_attn_implementation`` must be "vase"). policy, budget, window, mode
    ("sync" or "async"), seed and ``open_kwargs`` (n_sink, n_large, slack, min_budget, ...):
    how every row's sequence is opened (`Model.open`). block_tokens: tokens per arena page.
    attention: how attention reads the arena ("auto", "gather", "flashinfer", "flash-attn";
    `vase.torch.choose_attention`). name: the vase model's name (shown by vasectl). specs: one
    `vase.torch.SeqSpec` per row instead (a batch whose rows run different policies or
    budgets); the batch must then have that many rows.
    """

    def __init__(self, client: "vase.Client", model_config: Any, policy: str = "vase-attnv",
                 budget: int = 1024, window: int = 64, mode: str = "sync", seed: int = 0,
                 block_tokens: int = 16, attention: str = "auto", name: str = "",
                 specs: Optional[Sequence[SeqSpec]] = None, **open_kwargs: Any):
        super().__init__(layers=[])
        self.client = client
        self.config = model_config
        text = getattr(model_config, "get_text_config", lambda: model_config)()
        self.layers_n = int(text.num_hidden_layers)
        self.q_heads = int(text.num_attention_heads)
        self.kv_heads = int(getattr(text, "num_key_value_heads", None) or self.q_heads)
        self.head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // self.q_heads)
        if getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True) \
                and any(t == "sliding_attention" for t in getattr(text, "layer_types", None) or []):
            raise ValueError("vase.hf.VaseCache: models with sliding-window layers are not "
                             "supported (their masks are not the causal one)")
        self.spec = SeqSpec(policy=policy, budget=budget, window=window, mode=mode, seed=seed,
                            extra=dict(open_kwargs))
        if specs is not None and (open_kwargs or not specs):
            raise ValueError("vase.hf.VaseCache: specs, or the open keywords, not both")
        self.specs = None if specs is None else [replace(sp) for sp in specs]
        self.block_tokens, self.attention, self.name = block_tokens, attention, name
        self.batch: Optional[_Batch] = None
        self._seen = 0  # columns of the 2D attention mask seen so far, padding included
        self._closed = False

    # ---- lifetime ----

    def close(self) -> None:
        """Closes every sequence; their pages go back to the arena. Idempotent."""
        self._closed = True
        if self.batch is not None:
            self.batch.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "VaseCache":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- the Cache interface ----

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               cache_kwargs: Optional[dict] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """Takes a layer's new keys and values ([b, kv_heads, n, head_dim], after RoPE); they
        reach the arena, with the queries, when the "vase" attention function runs next."""
        if self._closed:
            raise _closed()
        self._check(key_states, value_states, layer_idx)
        if getattr(self.config, "_attn_implementation", None) != ATTENTION:
            raise ValueError(
                f"vase.hf.VaseCache needs the model's attention implementation to be "
                f"{ATTENTION!r} (load it with attn_implementation={ATTENTION!r} after importing "
                f"vase.hf, or call model.set_attn_implementation({ATTENTION!r})), not "
                f"{getattr(self.config, '_attn_implementation', None)!r}")
        _pending.update = (self, key_states, value_states, layer_idx)
        return key_states, value_states

    def get_seq_length(self, layer_idx: Optional[int] = 0) -> int:
        """The columns seen so far (the positions of the next tokens start there), padding
        included, whatever was evicted: transformers counts positions with it."""
        if self._closed:
            raise _closed()
        return self._seen

    def get_mask_sizes(self, cache_position: torch.Tensor, layer_idx: int) -> Tuple[int, int]:
        return self._seen + cache_position.shape[0], 0

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        return -1

    def __len__(self) -> int:
        return self.layers_n

    def reorder_cache(self, beam_idx: torch.LongTensor):
        raise NotImplementedError("vase.hf.VaseCache does not support beam search")

    def crop(self, max_length: int):
        raise NotImplementedError("vase.hf.VaseCache cannot crop: evicted tokens are gone")

    def batch_repeat_interleave(self, repeats: int):
        raise NotImplementedError("vase.hf.VaseCache: one sequence per row, opened once")

    def batch_select_indices(self, indices: torch.Tensor):
        raise NotImplementedError("vase.hf.VaseCache: one sequence per row, opened once")

    def reset(self):
        raise NotImplementedError("vase.hf.VaseCache: close it and make a new one")

    # ---- what reaches vase ----

    def _check(self, k: torch.Tensor, v: torch.Tensor, layer: int) -> None:
        if not isinstance(k, torch.Tensor) or not isinstance(v, torch.Tensor):
            raise TypeError("vase.hf.VaseCache.update: keys and values must be torch tensors")
        if k.dtype not in (torch.float32, torch.float16, torch.bfloat16) or v.dtype != k.dtype:
            raise TypeError(f"vase.hf.VaseCache.update: keys {k.dtype} and values {v.dtype}: "
                            "both float32, float16 or bfloat16")
        if k.ndim != 4 or v.shape != k.shape or k.shape[1] != self.kv_heads or \
                k.shape[3] != self.head_dim or k.shape[2] < 1:
            raise ValueError(f"vase.hf.VaseCache.update: keys {tuple(k.shape)}, values "
                             f"{tuple(v.shape)}; expected [batch, {self.kv_heads}, n >= 1, "
                             f"{self.head_dim}] both")
        if not 0 <= layer < self.layers_n:
            raise ValueError(f"vase.hf.VaseCache.update: layer {layer} of {self.layers_n}")
        if self.batch is not None:
            if k.shape[0] != len(self.batch.seqs):
                raise ValueError(f"vase.hf.VaseCache: a batch of {k.shape[0]} rows, opened "
                                 f"with {len(self.batch.seqs)}")
            held = self.batch.k[0]
            if k.dtype != held.dtype or k.device != held.device:
                raise ValueError(f"vase.hf.VaseCache: keys {k.dtype} on {k.device}, the cache "
                                 f"holds {held.dtype} on {held.device}")

    def _open(self, real: torch.Tensor, k: torch.Tensor) -> None:
        """Opens a sequence per row, each with its tokens of this first pass as its prompt."""
        dtype = DTYPES.get(str(k.dtype).replace("torch.", ""))
        prompts = real.sum(1).tolist()
        specs = self.specs or [replace(self.spec) for _ in prompts]
        if len(specs) != len(prompts):
            raise ValueError(f"vase.hf.VaseCache: {len(specs)} specs for a batch of "
                             f"{len(prompts)} rows")
        self.batch = _Batch(self.client, self.layers_n, self.q_heads, self.kv_heads,
                            self.head_dim, specs,
                            prompt_len=prompts, dtype=dtype, block_tokens=self.block_tokens,
                            name=self.name, attention=self.attention)
        if self.batch.device != k.device:
            where = self.batch.device
            self.batch.close()
            raise ValueError(f"vase.hf.VaseCache: the model runs on {k.device}, the arena is on "
                             f"{where}: run the model where vased's arena is")

    def _attend(self, module, query, key, value, mask, scaling) -> Tuple[torch.Tensor, None]:
        """The "vase" attention of one layer: the new tokens into the arena, attention over
        what each sequence holds; after the last layer, the step's appends and plans."""
        if self._closed:
            raise _closed()
        layer = int(getattr(module, "layer_idx", -1))
        b, n = key.shape[0], key.shape[2]
        padding = mask.padding if isinstance(mask, _VaseMask) else None
        real = torch.ones(b, n, dtype=torch.bool) if padding is None else \
            padding[:, -n:].to(device="cpu", dtype=torch.bool)
        if self.batch is None:
            self._open(real, key)
        rows = None if padding is None or bool(real.all()) else real
        k, v = key.transpose(1, 2), value.transpose(1, 2)  # [b, n, kv_heads, d]
        q = query.transpose(1, 2)  # [b, n, q_heads, d]
        self.batch.append(layer, k, v, q, rows)
        out = self.batch.attend(layer, q, rows, scaling)
        if layer == self.layers_n - 1:
            self.batch.step_done()
            self._seen += n
        return out, None

    # ---- what vase reports ----

    @property
    def seqs(self):
        """The vase sequences of the rows (empty before the first forward pass)."""
        return [] if self.batch is None else self.batch.seqs

    def held(self, row: int, layer: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """The keys (post-RoPE) and values row's sequence holds now in layer: two new tensors
        [kv_heads, len, head_dim] (`vase.torch.VaseCache.held`). Raises ValueError before the
        first forward pass, VaseError(EBADF) once closed."""
        if self._closed:
            raise _closed()
        if self.batch is None:
            raise ValueError("vase.hf.VaseCache: no sequence before the first forward pass")
        return self.batch.held(row, layer)

    def evictions(self):
        """Evictions (plans applied) of each row's sequence."""
        return [] if self.batch is None else self.batch.evictions()

    def counters(self):
        """libvase's counters of each row's sequence (Seq.stats)."""
        return [] if self.batch is None else self.batch.counters()

    @property
    def plan_seconds(self):
        """Per row: the daemon's plan seconds of the evictions it applied."""
        return [] if self.batch is None else self.batch.plan_seconds

    @property
    def call_seconds(self):
        """Per row: seconds spent in its own vase calls (push_stats, append, poll)."""
        return [] if self.batch is None else self.batch.call_seconds

    def kv_bytes(self) -> int:
        """The arena bytes the rows' sequences hold now (their pages, as vasectl shows them)."""
        if self.batch is None:
            return 0
        slot = self.layers_n * 2 * self.kv_heads * self.head_dim * \
            self.batch.k[0].element_size()
        return sum(s.capacity for s in self.seqs) * slot
