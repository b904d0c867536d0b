#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""vLLM with and without vase.vllm: tokens/s and KV bytes, measured in one run.

Three configurations, each a fresh vLLM (offline `LLM`, the shipped checkpoint, float32, CPU,
greedy, ignore_eos) generating `--batch` requests of `--tokens` tokens each from short prompts:

- ``vllm``: vLLM without the plugin (VASE_VLLM=0);
- ``vase-full``: the plugin with a budget above every request's length (no eviction);
- ``vase-quarter``: the plugin with a budget of a quarter of the output length.

The plugin's two configurations run once per attention of `--attention` (VASE_VLLM_ATTENTION;
``gather`` and ``paged-cpu`` by default: on this host arena of float32, ``paged-cpu`` is the
native step, vase.Batch, and ``gather`` the Python one, vase.torch's gather). They run
`--rounds` times, interleaved (vllm, then each plugin configuration, then vllm again, ...), each
round in its own process against the same private vased; the table gives the median tokens/s
(generated tokens over generate()'s wall time, engine start excluded), the ratio to vLLM's
median, and the median over the rounds of each round's ratio to vLLM's of the same round (the
rounds are interleaved, so on a machine whose speed drifts this pairs runs minutes apart). KV
bytes: for vLLM, the blocks its block manager gives the batch at its longest
(ceil(tokens / block) per request, times the bytes of a block of every layer); for the plugin,
the most arena bytes vased's sequences held (`vasectl status`, sampled every 20 ms while the
round ran). Output: a Markdown table on stdout and in --out (bench.md, bench.csv).

    examples/with_vased.sh build/vased --arena-bytes=1G -- \\
        .venv/bin/python examples/vllm/bench.py --out build/vllm-bench
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BUILD = os.environ.get("VASE_BUILD_DIR") or os.path.join(REPO, "build")
MODEL = os.path.join(REPO, "examples", "llm", "model")
PROMPTS = ["#include <stdio.h>\n", "int main(void) {\n", "/* the cache */\n", "def f(x):\n",
           "struct page {\n", "static int count = ", "for (i = 0; i < n; i++)", "return 0;\n"]
CONFIGS = ("vllm", "vase-full", "vase-quarter")


def child(args) -> None:
    """One round of one configuration: writes its figures, JSON, to --result."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=args.model, dtype="float32", enforce_eager=True, max_model_len=args.max_len,
              seed=0, max_num_seqs=args.batch)
    xargs = None
    if args.config != "vllm":
        budget = args.max_len if args.config == "vase-full" else args.tokens // 4
        xargs = {"vase_budget": budget, "vase_window": args.window,
                 "vase_policy": args.policy, "vase_mode": "async"}
    sp = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True,
                        extra_args=xargs)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.batch)]
    llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=4, extra_args=xargs),
                 use_tqdm=False)  # warm-up
    t0 = time.perf_counter()
    outs = llm.generate(prompts, sp, use_tqdm=False)
    wall = time.perf_counter() - t0
    gen = sum(len(o.outputs[0].token_ids) for o in outs)
    longest = max(len(o.prompt_token_ids) + len(o.outputs[0].token_ids) for o in outs)
    cfg = llm.llm_engine.vllm_config
    mc, block = cfg.model_config, cfg.cache_config.block_size
    pc = cfg.parallel_config
    block_bytes = (block * mc.get_num_layers(pc) * 2 * mc.get_num_kv_heads(pc)
                   * mc.get_head_size() * 4)
    vllm_kv = sum(-(-(len(o.prompt_token_ids) + len(o.outputs[0].token_ids)) // block)
                  for o in outs) * block_bytes
    # A file of its own: the engine's processes share this one's stdout.
    with open(args.result, "w") as f:
        json.dump(dict(config=args.config, tokens=gen, wall=wall, longest=longest,
                       vllm_kv_bytes=vllm_kv), f)


def vased_bytes(stop: threading.Event, peak: list) -> None:
    run = os.environ.get("VASE_RUNTIME_DIR", "")
    while not stop.is_set():
        out = subprocess.run([os.path.join(BUILD, "vasectl"), f"--runtime-dir={run}", "--json",
                              "status"], capture_output=True, text=True)
        if out.returncode == 0:
            status = json.loads(out.stdout)
            peak[0] = max(peak[0], sum(a["bytes_pages"] for a in status["arenas"]))
        stop.wait(0.02)


def serve_env(plugin: bool) -> dict:
    env = dict(os.environ, VASE_VLLM="1" if plugin else "0", HF_HUB_OFFLINE="1",
               PYTHONPATH=os.path.join(BUILD, "python"),
               VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    libs = []
    for name, roots in (("libtcmalloc_minimal.so.4", ["/usr/lib/x86_64-linux-gnu",
                                                      "/usr/lib/aarch64-linux-gnu"]),
                        ("libiomp5.so", [os.path.join(sys.prefix, "lib")])):
        found = [os.path.join(r, name) for r in roots if os.path.exists(os.path.join(r, name))]
        if not found:
            raise SystemExit(f"bench.py: {name} not found (examples/vllm/serve.sh says where "
                             "it comes from)")
        libs.append(found[0])
    env["LD_PRELOAD"] = ":".join(libs + [p for p in [os.environ.get("LD_PRELOAD")] if p])
    return env


def one_round(args, config: str, attention: str) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", config, "--batch",
           str(args.batch), "--tokens", str(args.tokens), "--window", str(args.window),
           "--policy", args.policy, "--max-len", str(args.max_len), "--model", args.model]
    stop, peak = threading.Event(), [0]
    sampler = threading.Thread(target=vased_bytes, args=(stop, peak), daemon=True)
    sampler.start()
    env = serve_env(config != "vllm")
    env["VASE_VLLM_ATTENTION"] = attention
    with tempfile.TemporaryDirectory(prefix="vase-bench-") as tmp:
        result = os.path.join(tmp, "result.json")
        try:
            out = subprocess.run(cmd + ["--result", result], capture_output=True, text=True,
                                 env=env, timeout=1800)
        finally:
            stop.set()
            sampler.join()
        if out.returncode or not os.path.exists(result):
            raise SystemExit(f"bench.py: {config} failed ({out.returncode}):\n"
                             f"{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
        with open(result) as f:
            r = json.load(f)
    r["vase_kv_bytes"] = peak[0]
    return r


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--tokens", type=int, default=768, help="tokens generated per request")
    p.add_argument("--window", type=int, default=32)
    p.add_argument("--policy", default="vase-attnv")
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--model", default=MODEL,
                   help="the checkpoint (the shipped one; examples/vllm/make_model.py makes "
                        "larger ones)")
    p.add_argument("--attention", default="gather,paged-cpu",
                   help="vase.torch attentions of the plugin's rows, a comma-separated list")
    p.add_argument("--out", default=None)
    p.add_argument("--child", choices=CONFIGS, dest="config", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.config:
        child(args)
        return 0
    if not os.environ.get("VASE_RUNTIME_DIR"):
        raise SystemExit("bench.py: run it under examples/with_vased.sh (VASE_RUNTIME_DIR)")
    runs = [("vllm", "-")] + [(c, a) for a in args.attention.split(",") for c in CONFIGS[1:]]
    results = {r: [] for r in runs}
    for i in range(args.rounds):
        for c, a in runs:
            r = one_round(args, c, a if a != "-" else "auto")
            results[(c, a)].append(r)
            print(f"round {i + 1} {c} ({a}): {r['tokens'] / r['wall']:.1f} tok/s "
                  f"({r['tokens']} tokens in {r['wall']:.2f} s), vased peak "
                  f"{r['vase_kv_bytes'] / 2**20:.1f} MiB", flush=True)
    base_rounds = [r["tokens"] / r["wall"] for r in results[("vllm", "-")]]
    base = statistics.median(base_rounds)
    rows = []
    for c, a in runs:
        got = results[(c, a)]
        tps = statistics.median(r["tokens"] / r["wall"] for r in got)
        # Each round against vLLM's of the same round (they ran minutes apart at most): the
        # median of those ratios is steadier than the ratio of the medians on a busy machine.
        paired = statistics.median(r["tokens"] / r["wall"] / b for r, b in zip(got, base_rounds))
        kv = (max(r["vllm_kv_bytes"] for r in got) if c == "vllm"
              else max(r["vase_kv_bytes"] for r in got))
        budget = {"vllm": "-", "vase-full": str(args.max_len),
                  "vase-quarter": str(args.tokens // 4)}[c]
        rows.append(dict(config=c, attention=a, budget=budget, tok_s=round(tps, 1),
                         x_vllm=round(tps / base, 3), x_vllm_paired=round(paired, 3),
                         kv_mib=round(kv / 2**20, 2),
                         rounds=" ".join(f"{r['tokens'] / r['wall']:.1f}" for r in got)))
    lines = [f"{args.batch} requests x {args.tokens} tokens, greedy, float32, CPU; median of "
             f"{args.rounds} rounds; policy {args.policy}, window {args.window}; model "
             f"{os.path.relpath(args.model, REPO)}", "",
             "| configuration | attention | budget | tok/s | x vLLM | x vLLM, per round | peak "
             "KV MiB | tok/s per round |", "|---|---|---:|---:|---:|---:|---:|---|"]
    lines += [f"| {r['config']} | {r['attention']} | {r['budget']} | {r['tok_s']} | "
              f"{r['x_vllm']} | {r['x_vllm_paired']} | {r['kv_mib']} | {r['rounds']} |"
              for r in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bench.md"), "w") as f:
            f.write(text)
        with open(os.path.join(args.out, "bench.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
