#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Generates text with a Llama/Qwen3-style checkpoint whose KV cache lives in vase.

    make run                      # another terminal: vased, sockets in ./run
    python3 examples/llm/generate.py --runtime-dir=./run --policy=vase-attnv --budget=256 \\
        --tokens=1000 --prompt-file=/usr/include/stdio.h

The prompt is read in one step, then tokens are sampled one at a time (greedy with
--temperature=0); every step writes its keys, values and queries into the arena and counts the
new token with vase, which evicts down to --budget slots whenever the trigger fires. Prints the
text and, per sequence, the evictions and vase's counters.

On a daemon whose arena is on a GPU (`arena_device = cuda:0`), run the model there too:
`--device=cuda:0 --dtype=bfloat16` (a vase model of bf16; the checkpoint is converted as it
loads), and attention reads the arena's pages through the block table with FlashInfer or
FlashAttention-2 when installed (`--attention`, default auto).
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

import vase  # noqa: E402

import model as llm  # noqa: E402
from tokenizer import ByteTokenizer  # noqa: E402
from vase.torch import ATTENTION, DTYPES, SeqSpec, VaseCache  # noqa: E402

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
    dtype = getattr(torch, args.dtype)
    net = llm.Model.load(args.model, dtype=dtype).eval().to(args.device)
    cfg = net.config
    tok = ByteTokenizer.load(os.path.join(args.model, "tokenizer.json"))
    if args.prompt_file:
        with open(args.prompt_file, "rb") as f:
            text = f.read(args.prompt_bytes)
    else:
        text = args.prompt.encode()
    ids = tok.encode(text)
    prompt = torch.tensor(ids, dtype=torch.long, device=args.device).unsqueeze(0)
    spec = SeqSpec(policy=args.policy, budget=args.budget, window=args.window, mode=args.mode,
                   seed=args.seed)
    out = []
    t0 = time.monotonic()
    with vase.connect(runtime_dir=args.runtime_dir, name="generate.py") as client, VaseCache(
        client,
        layers=cfg.num_hidden_layers,
        q_heads=cfg.num_attention_heads,
        kv_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        specs=[spec],
        prompt_len=prompt.shape[1],
        dtype=DTYPES[args.dtype],
        block_tokens=args.block,
        name="generate",
        attention=args.attention,
    ) as cache, torch.no_grad():
        if cache.device != torch.device(args.device):
            raise SystemExit(f"generate.py: the arena is on {cache.device}; run with "
                             f"--device={cache.device}")
        logits = net.forward(prompt, torch.arange(prompt.shape[1], device=args.device)
                             .unsqueeze(0), cache)
        pos = prompt.shape[1]
        for _ in range(args.tokens):
            last = logits[0, -1].float()
            if args.temperature > 0:
                nxt = int(torch.multinomial(torch.softmax(last / args.temperature, -1), 1))
            else:
                nxt = int(last.argmax())
            out.append(nxt)
            logits = net.forward(torch.tensor([[nxt]], device=args.device),
                                 torch.tensor([[pos]], device=args.device), cache)
            pos += 1
        seq = cache.seqs[0]
        stats = seq.stats
        rounds, length = seq.rounds, seq.len
    seconds = time.monotonic() - t0
    sys.stdout.write(tok.decode(ids + out))
    print(f"\n---\n{len(ids)} prompt tokens, {len(out)} generated in {seconds:.1f} s; policy "
          f"{args.policy}, budget {args.budget}, {args.mode}: {rounds} evictions, {length} slots "
          f"cached at the end; stalls {stats['stalls']}, compaction {stats['compact_seconds']:.3f} s; "
          f"attention {cache.attention}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
