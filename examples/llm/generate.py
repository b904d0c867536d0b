#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Generates text with a Hugging Face checkpoint whose KV cache lives in vase.

    make run                      # another terminal: vased, sockets in ./run
    .venv/bin/python examples/llm/generate.py --runtime-dir=./run --policy=vase-attnv \\
        --budget=256 --tokens=1000 --prompt-file=/usr/include/stdio.h

transformers' `generate()` runs the model with a `vase.hf.VaseCache` as its `past_key_values`:
the prompt is read in one step, then tokens are sampled one at a time (greedy with
--temperature=0); every step writes its keys, values and queries into the arena and counts the
new token with vase, which evicts down to --budget slots whenever the trigger fires. Prints the
text and the sequence's evictions and vase's counters.

On a daemon whose arena is on a GPU (`arena_device = cuda:0`), run the model there too:
`--device=cuda:0 --dtype=bfloat16` (a vase model of bf16), and attention reads the arena's pages
through the block table with FlashInfer or FlashAttention-2 when installed (`--attention`,
default auto).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The vase package of the repository's build (make builds it into build/python, or the build
# directory VASE_BUILD_DIR names), after an installed one.
sys.path.append(os.path.join(
    os.environ.get("VASE_BUILD_DIR") or
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build"), "python"))

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

import vase  # noqa: E402
import vase.hf  # noqa: E402
from vase.torch import ATTENTION, DTYPES  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=os.path.join(HERE, "model"))
    p.add_argument("--runtime-dir", default=None)
    p.add_argument("--prompt", default="/* ")
    p.add_argument("--prompt-file", default=None)
    p.add_argument("--prompt-bytes", type=int, default=1024, help="bytes of --prompt-file read")
    p.add_argument("--tokens", type=int, default=400)
    p.add_argument("--policy", default="vase-attnv")
    p.add_argument("--budget", type=int, default=256)
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--mode", default="async", choices=["sync", "async"])
    p.add_argument("--block", type=int, default=16)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", default="cpu", help="where the model runs: the arena's device")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES),
                   help="the model's and the cache's element type")
    p.add_argument("--attention", default="auto", choices=ATTENTION,
                   help="how attention reads the cache (auto: a paged kernel when one applies)")
    args = p.parse_args(argv)

    torch.manual_seed(args.seed)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    net = AutoModelForCausalLM.from_pretrained(
        args.model, dtype=getattr(torch, args.dtype),
        attn_implementation=vase.hf.ATTENTION).eval().to(args.device)
    tok = AutoTokenizer.from_pretrained(args.model)
    if args.prompt_file:
        with open(args.prompt_file, "rb") as f:
            text = f.read(args.prompt_bytes).decode("utf-8", errors="replace")
    else:
        text = args.prompt
    inputs = tok(text, return_tensors="pt").to(args.device)
    t0 = time.monotonic()
    with vase.connect(runtime_dir=args.runtime_dir, name="generate.py") as client, \
            vase.hf.VaseCache(client, net.config, policy=args.policy, budget=args.budget,
                              window=args.window, mode=args.mode, seed=args.seed,
                              block_tokens=args.block, attention=args.attention,
                              name="generate") as cache, torch.no_grad():
        sample = dict(do_sample=True, temperature=args.temperature, top_k=0) \
            if args.temperature > 0 else dict(do_sample=False)
        out = net.generate(**inputs, past_key_values=cache, max_new_tokens=args.tokens,
                           pad_token_id=tok.pad_token_id, **sample)
        seq = cache.seqs[0]
        stats = seq.stats
        rounds, length = seq.rounds, seq.len
        attention = cache.batch.attention
    seconds = time.monotonic() - t0
    prompt_len = inputs["input_ids"].shape[1]
    sys.stdout.write(tok.decode(out[0], skip_special_tokens=True))
    print(f"\n---\n{prompt_len} prompt tokens, {out.shape[1] - prompt_len} generated in "
          f"{seconds:.1f} s; policy {args.policy}, budget {args.budget}, {args.mode}: {rounds} "
          f"evictions, {length} slots cached at the end; stalls {stats['stalls']}, compaction "
          f"{stats['compact_seconds']:.3f} s; attention {attention}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
