#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""kvpress side by side with vase: decode-time KV-cache compression, the same model and documents.

NVIDIA kvpress compresses a transformers `DynamicCache` while a model decodes with its
`DecodingPress`: forward hooks on every attention layer count the decoding steps (the prompt's
forward pass is not one) and, every `compression_interval` steps, cut each layer's cache down
to `target_size` tokens per KV head, keeping those its scorer press ranks highest (a top-k per
KV head of scores over every cached token, the newest included). vase evicts a sequence down
to `budget` slots when a decoding step brings its length to a multiple of `window` above the
budget. With window = compression interval, budget = target size and a prompt that is a
multiple of the window, both compress after the same tokens and keep the same number of them
(the newest token and any protected window included), so the caches differ only in which
tokens they keep. The script checks that the compressions fall on the same tokens.

Every vase policy (through `vase.hf.VaseCache`, sync mode: each plan is applied before the next
token) and every kvpress press (`with DecodingPress(press, window, budget)(model):` over a
`DynamicCache`) runs at every budget, teacher-forced as harness.py does (the prompt in one
forward pass, then one true token per pass, each at its true position: kvpress's pipeline passes
position_ids too, since a compressed DynamicCache is shorter than the tokens read), against the
plain `DynamicCache` as the reference. Each run is a batch of one with its own copy of the model
and its own cache; `ObservedAttentionPress` reads the attention weights, so its copies use
transformers' eager attention. The runs take turns, one forward pass each, so that a machine
shared with other work slows them alike. Per method and budget it reports perplexity, top-1
agreement and mean KL from the full cache, decode tokens/s (the median decoding step; the steps
that compress are in the mean), peak KV bytes (vase: the pages the sequence holds; kvpress: the
keys and values the DynamicCache holds), and, where vase and kvpress implement the same named
policy, how far they keep the same tokens: after each compression, the positions each keeps per
layer and KV head are found by matching the cache's key rows with the keys of every position
the run gave it, and compared (Jaccard).

Output, in --out: kvpress.md (the table), kvpress.csv, kvpress.png. The exit status is 1 if a
perplexity is not finite or a pair did not compress after the same tokens.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

# This directory's safetensors.py would hide the safetensors package that transformers imports:
# the directory goes last on the path until transformers is in (harness.py puts it first).
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [HERE]

import torch  # noqa: E402

# kvpress wraps every attention function registered when it is imported (for its head-wise
# presses); imported before harness (and so vase.hf), the "vase" one stays as it is.
import kvpress  # noqa: E402
from transformers import AutoTokenizer, DynamicCache  # noqa: E402

import harness  # noqa: E402
import vase  # noqa: E402
from vase.torch import SeqSpec  # noqa: E402

VASE_POLICIES = ["vase-attnv", "vase-dkv", "snapkv", "h2o", "streaming", "random"]

# The scorer presses DecodingPress wraps, made for the window of a run. kvpress asserts that
# SnapKV's observation window is shorter than the hidden states buffered since the previous
# compression (one per decoding step, so window of them): window - 1 queries is the most it
# takes. RandomPress draws from torch's generator, which every run seeds.
PRESSES: Dict[str, Callable] = {
    "SnapKVPress": lambda w: kvpress.SnapKVPress(window_size=w - 1, kernel_size=5),
    "StreamingLLMPress": lambda w: kvpress.StreamingLLMPress(n_sink=4),
    "KnormPress": lambda w: kvpress.KnormPress(),
    "RandomPress": lambda w: kvpress.RandomPress(),
    "ObservedAttentionPress": lambda w: kvpress.ObservedAttentionPress(),
    "ExpectedAttentionPress": lambda w: kvpress.ExpectedAttentionPress(),
}
# Presses that read the attention weights, which only transformers' eager attention returns.
EAGER = {"ObservedAttentionPress"}
# Distances computed directly: the matrix-product form loses the last bits of a zero distance.
EXACT = "donot_use_mm_for_euclid_dist"
# The same named policy on both sides: vase policy -> kvpress press.
PAIRS = {"snapkv": "SnapKVPress", "streaming": "StreamingLLMPress", "random": "RandomPress",
         "h2o": "ObservedAttentionPress"}


@dataclass
class Result:
    side: str  # "vase", "kvpress" or "full"
    method: str
    budget: int
    nll: List[float] = field(default_factory=list)
    top1: List[bool] = field(default_factory=list)
    kl: List[float] = field(default_factory=list)
    steps: List[float] = field(default_factory=list)  # seconds of each decoding step
    peak_bytes: int = 0
    # After each compression, keyed by the index of the token whose step compressed: per layer,
    # per KV head, the set of positions the cache holds.
    kept: Dict[int, List[List[set]]] = field(default_factory=dict)
    overlap: Optional[dict] = None  # Jaccard with the same named policy of the other side

    def perplexity(self) -> float:
        mean = sum(self.nll) / len(self.nll)
        return math.inf if mean >= 700 else math.exp(mean)  # inf or NaN: main() fails

    def tokens_per_second(self, how=statistics.median) -> float:
        return 1.0 / how(self.steps)


class Run:
    """One method at one budget reading the document through its own copy of the model and its
    own cache, a step at a time (harness.score_steps, at true positions), so that the runs can
    take turns; what it measures goes into result: each decoding step's time, the peak bytes of
    its keys and values, and after each compression the positions the cache holds, found by
    matching its key rows with the keys (post-RoPE) of every position the run gave it.

    held(layer) gives the keys the cache holds, [kv_heads, len, head_dim]; rounds() the
    compressions so far (None: a step after which the cache is no longer than before it
    compressed); nbytes() the bytes of K and V it holds, read after every layer's update when
    `during` (kvpress compresses a layer inside the forward pass), else after every step."""

    def __init__(self, result: Result, net, cache, tokens: torch.Tensor, prompt: int, held,
                 nbytes, rounds=None, during=False):
        self.result, self.prompt = result, prompt
        self.held, self.nbytes, self.rounds, self.during = held, nbytes, rounds, during
        self.history: List[List[torch.Tensor]] = [[] for _ in range(net.config.num_hidden_layers)]
        self.logps: List[torch.Tensor] = []
        self.last_rounds = self.length = 0
        self.steps = harness.score_steps(net, tokens, prompt, cache, 1, positions=True)
        update = cache.update

        def tracked(k, v, layer, cache_kwargs=None):
            self.history[layer].append(k[0].detach().clone())
            out = update(k, v, layer, cache_kwargs)
            if self.during:
                self.result.peak_bytes = max(self.result.peak_bytes, self.nbytes())
            return out

        cache.update = tracked  # the attention layers call cache.update(): this one first

    def step(self) -> bool:
        """Reads the next token (the prompt first); False once the document is read."""
        t0 = time.perf_counter()
        try:
            i, logp = next(self.steps)
        except StopIteration:
            return False
        if i >= self.prompt:
            self.result.steps.append(time.perf_counter() - t0)
        self.logps.append(logp[0])
        if not self.during:
            self.result.peak_bytes = max(self.result.peak_bytes, self.nbytes())
        if self.rounds is not None:
            rounds = self.rounds()
            compressed, self.last_rounds = rounds != self.last_rounds, rounds
        else:
            length = self.held(0).shape[1]
            compressed, self.length = length <= self.length, length
        if compressed:
            kept = [self.positions(layer) for layer in range(len(self.history))]
            if any(len(head) != self.result.budget for layer in kept for head in layer):
                raise RuntimeError(f"a compression after token {i} kept other than "
                                   f"{self.result.budget} tokens")
            self.result.kept[i] = kept
        return True

    def positions(self, layer: int) -> List[set]:
        """Per KV head, the positions whose keys the cache holds: each held key row is the
        nearest (to rounding) of the keys the run gave the layer, and no two are the same."""
        self.history[layer] = [torch.cat(self.history[layer], dim=1)]
        seen = self.history[layer][0].float()  # [kv_heads, tokens, d]
        held = self.held(layer).float()
        out = []
        for h in range(held.shape[0]):
            dist, pos = torch.cdist(held[h], seen[h], compute_mode=EXACT).min(dim=1)
            kept = set(pos.tolist())
            if bool((dist > 1e-4 * (1.0 + held[h].norm(dim=-1))).any()) or \
                    len(kept) != held.shape[1]:
                raise RuntimeError(f"layer {layer} head {h} holds keys that match no position "
                                   f"(distance {float(dist.max()):.3g}) or one twice")
            out.append(kept)
        return out


def dynamic_bytes(cache: DynamicCache) -> int:
    return sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers
               if getattr(layer, "keys", None) is not None)


def vase_keys(cache: "vase.hf.VaseCache", layer: int) -> torch.Tensor:
    """The keys the cache's one sequence holds in the arena, [kv_heads, len, head_dim]."""
    return cache.held(0, layer)[0]


def dynamic_run(result: Result, net, tokens, args) -> Run:
    """A run through a plain DynamicCache (which a kvpress press may compress)."""
    cache = DynamicCache(config=net.config)
    return Run(result, net, cache, tokens, args.prompt,
               lambda layer: cache.layers[layer].keys[0], lambda: dynamic_bytes(cache),
               during=True)


def vase_run(net, tokens, policy: str, budget: int, args, stack) -> Run:
    """One vase sequence of the policy and budget, in sync mode, on a connection of its own (a
    client may register only so many models, and each cache registers one)."""
    spec = SeqSpec(policy=policy, budget=budget, window=args.window, mode="sync", seed=args.seed)
    client = stack.enter_context(vase.connect(runtime_dir=args.runtime_dir,
                                              name="compare-kvpress"))
    cache = stack.enter_context(harness.make_cache(client, net.config, [spec], args))
    return Run(Result("vase", policy, budget), net, cache, tokens, args.prompt,
               lambda layer: vase_keys(cache, layer), cache.kv_bytes,
               rounds=lambda: cache.evictions()[0])


def kvpress_run(net, tokens, name: str, budget: int, args, stack) -> Run:
    """A DynamicCache under kvpress's DecodingPress of the press, which compresses it every
    window decoding steps to budget tokens: the press's hooks stay on this run's model."""
    if name in EAGER:
        net.set_attn_implementation("eager")
    press = kvpress.DecodingPress(base_press=PRESSES[name](args.window),
                                  compression_interval=args.window, target_size=budget)
    stack.enter_context(press(net))
    return dynamic_run(Result("kvpress", name, budget), net, tokens, args)


def jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def overlap(v: Result, k: Result, window: int) -> dict:
    """How far two runs kept the same tokens, over the compressions both made (on the same
    tokens, or the pair is misaligned): Jaccard of the kept positions per layer and KV head,
    averaged over all compressions, at the first one (until then both held every token, so
    their inputs were the same), and over the positions older than the last window (the
    candidates; vase always keeps the window itself)."""
    steps = sorted(set(v.kept) & set(k.kept))
    out = dict(aligned=sorted(v.kept) == sorted(k.kept), compressions=(len(v.kept), len(k.kept)))
    if not steps:
        return out
    every, first, older, per_layer = [], [], [], {}
    for i in steps:
        edge = i + 1 - window
        for layer, (hv, hk) in enumerate(zip(v.kept[i], k.kept[i])):
            for a, b in zip(hv, hk):
                j = jaccard(a, b)
                every.append(j)
                per_layer.setdefault(layer, []).append(j)
                older.append(jaccard({p for p in a if p < edge}, {p for p in b if p < edge}))
                if i == steps[0]:
                    first.append(j)
    mean = statistics.fmean
    out.update(all=mean(every), first=mean(first), older=mean(older),
               layers=[mean(per_layer[layer]) for layer in sorted(per_layer)])
    return out


def method_label(r: Result) -> str:
    return r.method if r.side == "full" else f"{r.side} {r.method}"


def write_outputs(args, results: List[Result], doc_len: int, wall: float) -> str:
    os.makedirs(args.out, exist_ok=True)
    head = ["method", "budget", "perplexity", "top1_agreement", "mean_kl",
            "decode_tokens_per_s_median", "decode_tokens_per_s_mean", "peak_kv_bytes",
            "compressions", "jaccard_all", "jaccard_first", "jaccard_older"]
    md = ["| method | budget | perplexity | top-1 agreement | mean KL | decode tok/s (median, "
          "mean) | peak KV bytes | compressions | kept-token Jaccard with the same policy: "
          "all, first compression, older than the window |",
          "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    rows = []
    for r in results:
        o = r.overlap or {}
        jac = [f"{o[x]:.3f}" if x in o else "" for x in ("all", "first", "older")]
        rows.append([method_label(r), r.budget, f"{r.perplexity():.4f}",
                     f"{statistics.fmean(r.top1):.4f}", f"{statistics.fmean(r.kl):.5f}",
                     f"{r.tokens_per_second():.1f}",
                     f"{r.tokens_per_second(statistics.fmean):.1f}", r.peak_bytes,
                     len(r.kept)] + jac)
        budget = "all" if r.budget == 0 else f"{r.budget} ({r.budget / doc_len:.3g})"
        md.append(f"| {rows[-1][0]} | {budget} | {rows[-1][2]} | {statistics.fmean(r.top1):.3f} "
                  f"| {statistics.fmean(r.kl):.4f} | {rows[-1][5]}, {rows[-1][6]} | "
                  f"{r.peak_bytes:,} | {len(r.kept)} | {', '.join(jac) if o else ''} |")
    with open(os.path.join(args.out, "kvpress.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(head)
        w.writerows(rows)
    md += ["", f"{len(args.docs)} document ({', '.join(args.docs)}), {doc_len} tokens, prompt "
           f"{args.prompt}, window = compression interval {args.window}, budget = target size; "
           f"model {args.model} ({args.dtype}, {args.device}, {args.threads} torch thread(s)), "
           "teacher-forced, batches of one taking turns a forward pass each; "
           f"{wall:.0f} s in all. vase in sync mode; kvpress {kvpress_version()} "
           "DecodingPress, SnapKVPress(window_size=window - 1), ObservedAttentionPress with "
           "eager attention. Jaccard: per layer and KV head, of the token positions kept after "
           "the same compressions by vase and kvpress's same named policy."]
    table = "\n".join(md) + "\n"
    with open(os.path.join(args.out, "kvpress.md"), "w") as f:
        f.write(table)
    plot(args, results, doc_len)
    return table


def kvpress_version() -> str:
    from importlib.metadata import version

    return version("kvpress")


def plot(args, results: List[Result], doc_len: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    full = next(r for r in results if r.side == "full")
    measures = [("perplexity", Result.perplexity),
                ("top-1 agreement with the full cache", lambda r: statistics.fmean(r.top1)),
                ("mean KL from the full cache", lambda r: statistics.fmean(r.kl)),
                ("decode tokens/s (median)", Result.tokens_per_second)]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8.5))
    methods = list(dict.fromkeys((r.side, r.method) for r in results if r.side != "full"))
    # A vase policy and the kvpress press of the same name share a colour.
    same = {press: policy for policy, press in PAIRS.items()}
    hues = list(dict.fromkeys(same.get(m, m) for _, m in methods))
    colours = plt.get_cmap("tab10")
    for ax, (what, fn) in zip(axes.flat, measures):
        for side, method in methods:
            pts = sorted((r.budget / doc_len, fn(r)) for r in results
                         if (r.side, r.method) == (side, method))
            hue = colours(hues.index(same.get(method, method)) % 10)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=hue,
                    linestyle="-" if side == "vase" else "--",
                    marker="o" if side == "vase" else "s", markersize=4,
                    label=f"{side} {method}")
        ax.axhline(fn(full), color="black", linestyle=":", label="full cache")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("budget / document length")
        ax.set_title(what, fontsize=10)
        ax.grid(True, alpha=0.3)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8)
    fig.suptitle(f"vase (solid) and kvpress DecodingPress (dashed), {doc_len} tokens, window "
                 f"{args.window}", fontsize=11)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(os.path.join(args.out, "kvpress.png"), dpi=80)


def byte_tokenizer(path: str):
    """The checkpoint's Hugging Face tokenizer, or, where it has none, its byte-level ids (BOS,
    then the document's bytes) in the shape harness.documents() calls."""
    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as e:  # noqa: BLE001 (transformers raises many kinds for a missing one)
        from data import BOS_ID

        print(f"compare_kvpress: no Hugging Face tokenizer in {path} ({type(e).__name__}: {e}); "
              f"byte ids, BOS {BOS_ID} first")
        return lambda text: {"input_ids": [BOS_ID] + list(text.encode("utf-8"))}


def parse_args(argv=None):
    p = harness.common_arguments(__doc__.split("\n\n")[0], "build/kvpress")
    p.set_defaults(policies=",".join(VASE_POLICIES))
    p.add_argument("--presses", default=",".join(PRESSES),
                   help=f"kvpress scorer presses under DecodingPress ({', '.join(PRESSES)})")
    p.add_argument("--quick", action="store_true",
                   help="a smoke test: one document of 256 tokens, prompt 32, window 16, budgets "
                        "32, 64 and 128")
    p.add_argument("--threads", type=int, default=1,
                   help="torch's threads (more than one, on cores shared with other work, spend "
                        "the steps of this small model waiting for each other)")
    args = harness.finish_args(p.parse_args(argv))
    args.presses = [x for x in args.presses.split(",") if x]
    unknown = [x for x in args.presses if x not in PRESSES]
    if unknown:
        p.error(f"--presses: unknown {unknown}; known: {', '.join(PRESSES)}")
    return args


def run(args, net, tokens: torch.Tensor, budgets: List[int]) -> List[Result]:
    """Every method at every budget, and the full cache; each its own copy of the model."""
    torch.manual_seed(args.seed)
    with contextlib.ExitStack() as stack:
        runs = [dynamic_run(Result("full", "full cache", 0), copy.deepcopy(net), tokens, args)]
        for budget in budgets:
            runs += [vase_run(copy.deepcopy(net), tokens, p, budget, args, stack)
                     for p in args.policies]
            runs += [kvpress_run(copy.deepcopy(net), tokens, p, budget, args, stack)
                     for p in args.presses]
        # The runs take turns, a step each, from a different one every round: on a machine
        # shared with other work, whatever slows one step down slows every run's alike.
        live, turn = list(runs), 0
        while live:
            first = turn % len(live)
            for r in live[first:] + live[:first]:
                try:
                    more = r.step()
                except Exception as e:
                    raise RuntimeError(f"{method_label(r.result)} at budget {r.result.budget}: "
                                       f"{e}") from e
                if not more:
                    live.remove(r)
            turn += 1
            if turn % 256 == 0:
                print(f"compare_kvpress: {turn} of {tokens.numel() - args.prompt} steps",
                      flush=True)
    ref = torch.stack(runs[0].logps)
    for r in runs:
        r.result.nll, r.result.top1, r.result.kl = harness.compare(
            ref, torch.stack(r.logps), tokens[args.prompt:])
    results = [r.result for r in runs]
    by = {(r.side, r.method, r.budget): r for r in results}
    for policy, press in PAIRS.items():
        for budget in budgets:
            v, k = by.get(("vase", policy, budget)), by.get(("kvpress", press, budget))
            if v and k:
                v.overlap = k.overlap = overlap(v, k, args.window)
    return results


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.prompt % args.window:
        print(f"compare_kvpress: prompt {args.prompt} is not a multiple of window {args.window}: "
              "kvpress compresses after prompt + k * window tokens, vase after multiples of the "
              "window above the budget", file=sys.stderr)
    net = harness.load_model(args.model, args.dtype, args.device)
    if args.docs is None:
        args.docs = harness.default_documents(args)
    args.docs = args.docs[:1] if args.quick else args.docs
    docs = harness.documents(args, byte_tokenizer(args.model))
    budgets = harness.budgets_for(args, args.doc_tokens)
    print(f"compare_kvpress: {len(docs)} document(s) of {args.doc_tokens} tokens, prompt "
          f"{args.prompt}, window {args.window}, budgets {budgets}, vase {args.policies}, "
          f"kvpress {args.presses}", flush=True)
    if len(docs) != 1:
        print("compare_kvpress: one document at a time (--docs FILE)", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    results = run(args, net, docs[0].to(args.device), budgets)
    wall = time.monotonic() - t0
    print(write_outputs(args, results, args.doc_tokens, wall))
    for r in results:
        if r.overlap:
            print(f"compare_kvpress: {method_label(r)} budget {r.budget}: Jaccard per layer "
                  + ", ".join(f"{j:.3f}" for j in r.overlap.get("layers", [])))
    print(f"compare_kvpress: {wall:.1f} s; {args.out}/kvpress.md, kvpress.csv, kvpress.png")
    status = 0
    for r in results:
        if not math.isfinite(r.perplexity()):
            print(f"compare_kvpress: {method_label(r)} at budget {r.budget}: perplexity "
                  f"{r.perplexity()}", file=sys.stderr)
            status = 1
        if r.overlap and not r.overlap["aligned"]:
            print(f"compare_kvpress: {method_label(r)} at budget {r.budget}: vase and kvpress "
                  f"compressed after different tokens ({r.overlap['compressions']} compressions)",
                  file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
