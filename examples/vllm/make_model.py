#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A checkpoint of the shipped model's architecture at another size, with random weights.

For benchmarks only (examples/vllm/bench.py --model): the text it writes is noise, but a step
costs what a step of a trained model of that size costs. The architecture and tokenizer are those
of examples/llm/model (Qwen3, byte-level); the sizes are the options; the weights are drawn by
transformers' own initialisation under --seed, in float32. Writes config.json,
model.safetensors, generation_config.json and the tokenizer files into --out.

    .venv/bin/python examples/vllm/make_model.py --out build/model-medium
"""

from __future__ import annotations

import argparse
import os
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(os.path.dirname(HERE), "llm", "model")
COPIED = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
          "generation_config.json")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--intermediate", type=int, default=1536)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.heads % args.kv_heads:
        raise SystemExit("make_model.py: --heads must be a multiple of --kv-heads")

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(MODEL)
    cfg.hidden_size, cfg.num_hidden_layers = args.hidden, args.layers
    cfg.num_attention_heads, cfg.num_key_value_heads = args.heads, args.kv_heads
    cfg.head_dim, cfg.intermediate_size = args.head_dim, args.intermediate
    cfg.layer_types = ["full_attention"] * args.layers
    cfg.max_window_layers = args.layers
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    for name in COPIED:
        shutil.copy(os.path.join(MODEL, name), os.path.join(args.out, name))
    params = sum(t.numel() for t in model.parameters())
    print(f"make_model.py: {args.out}: {args.layers} layers of width {args.hidden}, "
          f"{args.heads}/{args.kv_heads} heads of {args.head_dim}, {params / 1e6:.1f}M "
          "parameters")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
