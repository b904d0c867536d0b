# SPDX-License-Identifier: MIT
"""What the transformers tests share: the shipped checkpoint, small random Llama and Qwen3
models, a document as tokens, and a reader that feeds a model a prompt and then one token per
forward pass."""

import os

import torch
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM)

import vase.hf

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(REPO, "examples", "llm", "model")
BOS = 256  # the shipped byte-level tokenizer's <bos>; ids 0-255 are the bytes

torch.set_num_threads(2)


def shipped(dtype=torch.float32):
    """The shipped checkpoint, attending through vase.hf's attention function."""
    return AutoModelForCausalLM.from_pretrained(MODEL, dtype=dtype,
                                                attn_implementation=vase.hf.ATTENTION).eval()


def tiny(family: str, seed: int = 0, vocab: int = 300):
    """A small random model of family "llama" or "qwen3" (GQA: 4 query heads, 2 KV heads),
    attending through vase.hf's attention function."""
    torch.manual_seed(seed)
    kw = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              max_position_embeddings=2048, attn_implementation=vase.hf.ATTENTION)
    net = Qwen3ForCausalLM(Qwen3Config(**kw)) if family == "qwen3" else \
        LlamaForCausalLM(LlamaConfig(**kw))
    return net.eval()


def document(n: int) -> torch.Tensor:
    """The first n tokens of the protocol's specification (proto/PROTOCOL.md, over 40 KB) as the
    shipped tokenizer reads it."""
    with open(os.path.join(REPO, "proto", "PROTOCOL.md"), "rb") as f:
        data = f.read(n)
    ids = torch.tensor([BOS] + list(data[: n - 1]), dtype=torch.long)
    assert ids.numel() == n
    return ids


def read(net, tokens: torch.Tensor, cache, batch: int, prompt: int) -> torch.Tensor:
    """Logits [batch, len(tokens), vocab]: the prompt in one forward, then one token per
    forward, every row reading the same tokens."""
    rows = tokens.unsqueeze(0).expand(batch, -1)
    out = []
    with torch.no_grad():
        out.append(net(input_ids=rows[:, :prompt], past_key_values=cache).logits)
        for i in range(prompt, tokens.numel()):
            out.append(net(input_ids=rows[:, i:i + 1], past_key_values=cache).logits)
    return torch.cat(out, dim=1).float()
