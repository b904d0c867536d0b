#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The time of vase.torch.VaseCache.attend() on a host arena, one way against another.

    examples/with_vased.sh build/vased -- .venv/bin/python examples/llm/bench_attention.py

A batch of `--batch` sequences of the shipped model's geometry (8 query and 2 KV heads of 32,
float32 unless --dtype) holds `--slots` tokens each (one prompt step, no eviction: a budget
above it); then, for every attention of --attention (default: gather and paged-cpu), the time
of a decode step's attend() of one new query per sequence, as the median over --reps of:

- ``layer``: one layer's attend(), the step's inputs (block tables, visible counts, the
  gather's mask) already made by an earlier layer of the same step;
- ``step``: the attend() of every layer of a new step (--layers), those inputs made once.

Each run checks that the attentions agree (to 1e-5) before it times them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.append(os.path.join(
    os.environ.get("VASE_BUILD_DIR") or
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build"), "python"))

import vase  # noqa: E402
from vase.torch import SeqSpec, VaseCache  # noqa: E402


def median_us(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def run(client, args, slots: int, block: int) -> dict:
    layers, H, KV, D = args.layers, 8, 2, 32
    specs = [SeqSpec(policy="streaming", budget=slots + 256, window=64, mode="sync")
             for _ in range(args.batch)]
    torch.manual_seed(0)
    with VaseCache(client, layers, H, KV, D, specs, prompt_len=slots, dtype=args.dtype,
                   block_tokens=block, attention="gather") as cache:
        for layer in range(layers):  # the prompt
            cache.append(layer, torch.randn(args.batch, slots, KV, D),
                         torch.randn(args.batch, slots, KV, D),
                         torch.randn(args.batch, slots, H, D))
        cache.step_done()
        q = torch.randn(args.batch, 1, H, D)
        for layer in range(layers):  # this step's new token, written once
            cache.append(layer, torch.randn(args.batch, 1, KV, D),
                         torch.randn(args.batch, 1, KV, D), q)
        kernels = {name: vase.torch.choose_attention(name, cache.device, cache.k[0].dtype,
                                                     block, False)
                   for name in args.attention}
        outs, times = {}, {}

        def use(name):
            cache.attention, cache._kernel = kernels[name]

        def new_step():
            cache._step = None  # the step's inputs are made again by the next attend()
            cache._plan = None

        for name in args.attention:
            use(name)
            new_step()
            outs[name] = cache.attend(0, q)
        first = outs[args.attention[0]]
        for name, out in outs.items():
            diff = (out - first).abs().max().item()
            assert diff <= 1e-5, f"{name} differs from {args.attention[0]} by {diff}"
        for name in args.attention:
            use(name)
            new_step()
            cache.attend(0, q)
            layer_us = median_us(lambda: cache.attend(1 % layers, q), args.reps)

            def step():
                new_step()
                for layer in range(layers):
                    cache.attend(layer, q)

            times[name] = (layer_us, median_us(step, args.reps))
        return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runtime-dir", default=None)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--slots", default="256,1024", help="tokens each sequence holds, a list")
    p.add_argument("--blocks", default="16,128", help="block sizes, a list")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dtype", default="f32", choices=["f32", "bf16", "f16"])
    p.add_argument("--attention", default="gather,paged-cpu")
    p.add_argument("--reps", type=int, default=200)
    args = p.parse_args()
    args.attention = args.attention.split(",")
    print(f"b={args.batch}, n=1, 8/2 heads of 32, {args.dtype}, torch threads "
          f"{torch.get_num_threads()}; median of {args.reps} (microseconds)")
    print("| block | slots | attention | one layer | a step of "
          f"{args.layers} layers |")
    print("|---:|---:|---|---:|---:|")
    with vase.connect(args.runtime_dir, name="bench_attention") as client:
        for block in [int(x) for x in args.blocks.split(",")]:
            for slots in [int(x) for x in args.slots.split(",")]:
                for name, (layer_us, step_us) in run(client, args, slots, block).items():
                    print(f"| {block} | {slots} | {name} | {layer_us:,.0f} | {step_us:,.0f} |",
                          flush=True)


if __name__ == "__main__":
    main()
