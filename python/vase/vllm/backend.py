# SPDX-License-Identifier: MIT
"""The attention backends vase.vllm puts in place of vLLM's: subclasses of vLLM's own whose
decoder self-attention goes through vase while a model step is in progress (runtime.Step), and
which are vLLM's unchanged otherwise (warm-up and profiling runs, encoder attention)."""

from __future__ import annotations

from typing import Optional

import torch

from . import runtime


def refuse_unsupported(impl, alibi_slopes, sliding_window, logits_soft_cap, attn_type,
                       kv_sharing_target_layer_name, sinks) -> None:
    """Raises NotImplementedError for what vase's attention does not do: ALiBi, a sliding
    window, a logits soft cap, attention sinks, a layer reading another layer's KV."""
    from vllm.v1.attention.backend import AttentionType

    if attn_type != AttentionType.DECODER:
        return
    found = [name for name, v in (("ALiBi", alibi_slopes), ("a sliding window", sliding_window),
                                  ("a logits soft cap", logits_soft_cap),
                                  ("attention sinks", sinks),
                                  ("KV shared across layers", kv_sharing_target_layer_name))
             if v]
    if found:
        raise NotImplementedError(f"vase.vllm: this model's attention has {', '.join(found)}, "
                                  "which vase's attention does not do; unset VASE_VLLM to serve "
                                  "it without vase")


def vase_forward(impl, layer, query: torch.Tensor, key: Optional[torch.Tensor],
                 value: Optional[torch.Tensor], output: Optional[torch.Tensor]):
    """vase's attention for this layer, or None when vLLM's own path is to run."""
    from vllm.v1.attention.backend import AttentionType

    rt = runtime.current_step()
    if rt is None or impl.attn_type != AttentionType.DECODER or key is None:
        return None
    if output is None:
        raise RuntimeError("vase.vllm: the attention layer gave no output buffer")
    return rt.attend(layer.layer_name, impl.scale, query, key, value, output)


def make_backend(base_backend, base_impl, prefix: str):
    """A subclass of vLLM's attention backend base_backend whose implementation (a subclass of
    base_impl) attends through vase during model steps and refuses what vase does not do."""
    import inspect

    signature = inspect.signature(base_impl.__init__)

    def __init__(self, *args, **kwargs):
        base_impl.__init__(self, *args, **kwargs)
        a = signature.bind(self, *args, **kwargs)
        a.apply_defaults()
        p = a.arguments
        refuse_unsupported(self, p.get("alibi_slopes"), p.get("sliding_window"),
                           p.get("logits_soft_cap"), p.get("attn_type"),
                           p.get("kv_sharing_target_layer_name"), p.get("sinks"))

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None,
                output_scale=None, output_block_scale=None):
        if attn_metadata is not None:
            out = vase_forward(self, layer, query, key, value, output)
            if out is not None:
                return out
        return base_impl.forward(self, layer, query, key, value, kv_cache, attn_metadata,
                                 output, output_scale, output_block_scale)

    impl = type(f"{prefix}AttentionImpl", (base_impl,), {"__init__": __init__,
                                                          "forward": forward})
    backend = type(f"{prefix}AttentionBackend", (base_backend,),
                   {"get_impl_cls": staticmethod(lambda: impl)})
    return backend
