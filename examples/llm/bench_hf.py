#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Decode speed of vase.hf.VaseCache against transformers' DynamicCache, on the same model.

    make run                      # another terminal: vased, sockets in ./run
    .venv/bin/python examples/llm/bench_hf.py --runtime-dir=./run [--tokens 8192] [--batch 8]

One batch of `--batch` rows reads a `--prompt`-token prompt (bytes of a file the model did not
train on), then generates `--tokens` tokens greedily (no end-of-sequence stop), once per cache,
in this order: DynamicCache (the reference, transformers' SDPA attention), VaseCache with
`--budget` in sync and in async mode, and VaseCache with a budget above the whole length (no
eviction) beside DynamicCache. Every run starts from the same weights and prompt. For each it
prints the median step time over every `--every` steps (a step: one token for every row), the
tokens per second of the last `--tail` steps and of the whole generation (rows x steps / s),
and the peak KV bytes (DynamicCache: its key and value tensors at the end; VaseCache: the
pages its sequences hold). With `--profile`, the time of the vase runs is broken down by
function (cProfile, the top entries by own time).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time

import torch
from transformers import DynamicCache, LogitsProcessor, LogitsProcessorList

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.append(os.path.join(
    os.environ.get("VASE_BUILD_DIR") or
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build"), "python"))

import vase  # noqa: E402
import vase.hf  # noqa: E402

import harness  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


class Clock(LogitsProcessor):
    """Stamps the time of every decoding step (generate calls it once per step)."""

    def __init__(self):
        self.stamps = []

    def __call__(self, input_ids, scores):
        self.stamps.append(time.perf_counter())
        return scores


def prompt_ids(args) -> torch.Tensor:
    with open(args.prompt_file, "rb") as f:
        data = f.read(args.prompt * args.batch)
    if len(data) < args.prompt * args.batch:
        raise SystemExit(f"{args.prompt_file}: fewer than {args.prompt * args.batch} bytes")
    rows = [[256] + list(data[i * args.prompt:(i + 1) * args.prompt - 1])
            for i in range(args.batch)]
    return torch.tensor(rows, dtype=torch.long)


def kv_bytes_dynamic(cache: DynamicCache) -> int:
    total = 0
    for layer in cache.layers:
        for t in (layer.keys, layer.values):
            total += t.numel() * t.element_size()
    return total


def run(net, ids, cache, args, label, profile=None):
    clock = Clock()
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.no_grad():
        if profile:
            profile.enable()
        net.generate(input_ids=ids, attention_mask=torch.ones_like(ids), past_key_values=cache,
                     max_new_tokens=args.tokens, min_new_tokens=args.tokens, do_sample=False,
                     pad_token_id=0, logits_processor=LogitsProcessorList([clock]))
        if profile:
            profile.disable()
    total = time.perf_counter() - t0
    steps = [b - a for a, b in zip(clock.stamps, clock.stamps[1:])]
    kv = cache.kv_bytes() if isinstance(cache, vase.hf.VaseCache) else kv_bytes_dynamic(cache)
    tail = steps[-args.tail:]
    row = dict(label=label, total=total, tail_tps=args.batch / statistics.median(tail),
               all_tps=args.batch * args.tokens / total, kv=kv,
               medians=[statistics.median(steps[i:i + args.every]) * 1e3
                        for i in range(0, len(steps), args.every)])
    print(f"{label}: {total:.1f} s, {row['all_tps']:.1f} tokens/s overall, "
          f"{row['tail_tps']:.1f} tokens/s over the last {len(tail)} steps, peak KV "
          f"{kv / 2**20:.1f} MiB; median step ms per {args.every} steps: "
          + " ".join(f"{m:.1f}" for m in row["medians"]), flush=True)
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=os.path.join(HERE, "model"))
    p.add_argument("--runtime-dir", default=None)
    p.add_argument("--prompt-file", default="/usr/include/linux/keyboard.h")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--budget", type=int, default=1024)
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--policy", default="vase-attnv")
    p.add_argument("--every", type=int, default=1024, help="steps per printed median")
    p.add_argument("--tail", type=int, default=1024, help="steps of the tail rate")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", default="dynamic,sync,async,noevict")
    p.add_argument("--profile", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    net = harness.load_model(args.model, "float32", "cpu")
    ids = prompt_ids(args)
    length = args.prompt + args.tokens
    print(f"bench_hf: batch {args.batch}, prompt {args.prompt}, {args.tokens} tokens, "
          f"budget {args.budget}, window {args.window}, {args.policy}, {args.threads} threads")
    rows = []
    prof = cProfile.Profile() if args.profile else None
    with vase.connect(runtime_dir=args.runtime_dir, name="bench_hf") as client:
        for what in args.runs.split(","):
            if what == "dynamic":
                rows.append(run(net, ids, DynamicCache(config=net.config), args, "DynamicCache"))
                continue
            budget = args.budget if what != "noevict" else \
                args.window * (length // args.window + 2)
            mode = "async" if what == "async" else "sync"
            with vase.hf.VaseCache(client, net.config, policy=args.policy, budget=budget,
                                   window=args.window, mode=mode, name="bench_hf") as cache:
                rows.append(run(net, ids, cache, args, f"VaseCache {what} (budget {budget}, "
                                f"{mode})", prof))
    base = next((r for r in rows if r["label"] == "DynamicCache"), None)
    if base:
        for r in rows:
            print(f"{r['label']}: {r['tail_tps'] / base['tail_tps']:.2f}x DynamicCache's tail "
                  f"tokens/s, {r['all_tps'] / base['all_tps']:.2f}x overall, KV "
                  f"{r['kv'] / max(1, base['kv']):.3f}x")
    if prof:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
        print(s.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
