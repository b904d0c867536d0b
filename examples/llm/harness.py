#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The quality harness: what each eviction policy does to a model's predictions.

For each held-out document, the model reads the first `prompt` tokens in one step, then the
rest one token at a time (teacher forcing), through a vase cache of each policy and budget, in
sync mode (the plans of the reference implementation, applied before the next token) and in
async mode (the engine runs ahead while plans are computed). A plain cache that keeps every
token is the reference. For every predicted token it records the log-probability of the true
next token, the argmax, and the whole next-token distribution, and reports per policy, budget
and mode:

- perplexity over the predicted tokens (per byte for the byte-level model);
- top-1 agreement with the full cache (the share of positions with the same argmax);
- the mean KL divergence KL(full || policy) of the next-token distributions;
- the evictions applied, and what vase cost the engine for the sequence (libvase's counters):
  the time its compactions took and the time appends waited for a plan (stalls).

By default all policies and budgets of a mode run as one batch (one forward pass per token for
all of them): the model's time is shared, and the time table gives per policy what is its own,
the daemon's plan time for its evictions and the time the engine spent in its vase calls
(push_stats, append, poll: in sync mode they wait for the plan), next to the wall time of each
batch. `--batch-per-policy` runs each policy's budgets as a batch of their own instead, which
takes longer in all but gives each policy's wall time, model included.

A `full` row runs through vase with a budget above the document's length: no eviction, and its
perplexity must equal the plain cache's (the harness checks it). Output: a Markdown table and a
CSV file, and a PNG plot of perplexity and KL against the budget, in --out.

`--elastic-half` runs elastic_half.py instead of the sweep: the quality of elastic sequences whose
budget is halved in the middle of the document, against static ones at both budgets.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Dict, List

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The vase package of the repository's build (make builds it into build/python, or the build
# directory VASE_BUILD_DIR names), after an installed one.
sys.path.append(os.path.join(
    os.environ.get("VASE_BUILD_DIR") or
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build"), "python"))

from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache  # noqa: E402

import vase  # noqa: E402
import vase.hf  # noqa: E402
from vase.torch import ATTENTION, DTYPES, SeqSpec  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
POLICIES = ["vase-attnv", "vase-dkv", "snapkv", "rkv", "h2o", "streaming", "random"]


@dataclass
class Run:
    policy: str
    budget: int
    mode: str
    nll: List[float]
    top1: List[bool]
    kl: List[float]
    compact: float
    stall: float
    evictions: int
    plan: float = 0.0  # the daemon's plan seconds of the evictions applied
    calls: float = 0.0  # the engine's seconds in the sequence's vase calls

    def perplexity(self) -> float:
        return math.exp(sum(self.nll) / len(self.nll))


def score_batch(net, tokens: torch.Tensor, prompt: int, cache, batch: int,
                on_step=None) -> torch.Tensor:
    """Feeds tokens to every one of the `batch` sequences of cache: the prompt in one step, then
    one token per step. Returns the log-probabilities [batch, len(tokens) - prompt, vocab] of the
    predictions of tokens prompt .. end (token i is predicted by the step that read token i - 1).
    on_step(i), if given, runs after the step that read token i (the prompt: i = prompt - 1)."""
    out = []
    for i, logp in score_steps(net, tokens, prompt, cache, batch):
        out.append(logp)
        if on_step:
            on_step(i)
    return torch.stack(out, dim=1)


def score_steps(net, tokens: torch.Tensor, prompt: int, cache, batch: int,
                positions: bool = False):
    """score_batch() one step at a time, for callers that interleave several caches: yields
    (i, log-probabilities [batch, vocab]) after the step that read token i. positions: give the
    model each token's position (position_ids) instead of letting it count them from the
    cache's length, which a cache that drops tokens (kvpress's) makes shorter."""
    def step(a: int, b: int):
        ids = tokens[a:b].unsqueeze(0).expand(batch, -1)
        pos = torch.arange(a, b, device=tokens.device).expand(batch, -1) if positions else None
        with torch.no_grad():  # per step: grad mode must not leak into the caller's other steps
            logits = net(input_ids=ids, past_key_values=cache, use_cache=True,
                         position_ids=pos).logits
        return torch.log_softmax(logits[:, -1].float(), -1)

    yield prompt - 1, step(0, prompt)
    for i in range(prompt, tokens.numel() - 1):
        yield i, step(i, i + 1)


def compare(ref: torch.Tensor, got: torch.Tensor, targets: torch.Tensor):
    """Per position: NLL of the target under got, whether got's argmax is ref's, KL(ref||got)."""
    nll = (-got.gather(1, targets.unsqueeze(1)).squeeze(1)).tolist()
    top1 = (got.argmax(-1) == ref.argmax(-1)).tolist()
    kl = (ref.exp() * (ref - got)).sum(-1).clamp_min(0).tolist()
    return nll, top1, kl


def run_document(net, cfg, client, tokens, args, budgets, runs: Dict[tuple, Run],
                 walls: Dict[str, float], record=None) -> float:
    """Runs one document through the plain cache and every policy, budget and mode; adds the
    results to runs. Returns the plain cache's perplexity on it. record(mode, keys, logp,
    cache), if given, gets each batch's log-probabilities [len(keys), predictions, vocab] and
    its VaseCache, still open; the plain cache's first, as mode "-", keys [("plain", 0)] and no
    cache."""
    prompt = args.prompt
    targets = tokens[prompt:]
    ref, plain_nll = run_plain(net, tokens, prompt, runs, walls)
    if record:
        record("-", [("plain", 0)], ref.unsqueeze(0), None)
    budget_full = full_budget(args, tokens.numel())
    for mode in args.modes:
        # Every policy and budget of a mode in one batch: one forward pass per token for all of
        # them. The full cache through vase runs apart: its many more slots would pad the rest.
        if args.batch_per_policy:
            batches = [[("full", 0)]] + [[(p, b) for b in budgets] for p in args.policies]
        else:
            batches = [[("full", 0)], [(p, b) for p in args.policies for b in budgets]]
        for keys in batches:
            specs = [
                SeqSpec(
                    policy="streaming" if policy == "full" else policy,
                    budget=budget_full if policy == "full" else b,
                    window=args.window,
                    mode=mode,
                    seed=args.seed,
                )
                for policy, b in keys
            ]
            t0 = time.monotonic()
            with make_cache(client, cfg, specs, args) as cache:
                got = score_batch(net, tokens, prompt, cache, len(specs))
                evictions = cache.evictions()
                counters = cache.counters()
                plans, calls = cache.plan_seconds, cache.call_seconds
                if record:
                    record(mode, keys, got, cache)
            batch = f"{mode} {keys[0][0]}" if len({p for p, _ in keys}) == 1 else f"{mode} all"
            walls[batch] = walls.get(batch, 0.0) + time.monotonic() - t0
            for i, (policy, b) in enumerate(keys):
                nll, top1, kl = compare(ref, got[i], targets)
                key = (policy, b, mode)
                r = runs.setdefault(key, Run(policy, b, mode, [], [], [], 0.0, 0.0, 0))
                r.nll += nll
                r.top1 += top1
                r.kl += kl
                r.compact += counters[i]["compact_seconds"]
                r.stall += counters[i]["stall_seconds"]
                r.evictions += evictions[i]
                r.plan += plans[i]
                r.calls += calls[i]
    return math.exp(sum(plain_nll) / len(plain_nll))


def full_budget(args, doc_len: int) -> int:
    """The budget of the full row: above the document's length, so nothing is evicted."""
    return args.window * (doc_len // args.window + 2)


def run_plain(net, tokens, prompt: int, runs: Dict[tuple, Run], walls: Dict[str, float]):
    """The reference: the document through a plain cache that keeps every token. Adds it to runs
    as ("plain", 0, "-"); returns its log-probabilities and NLL per predicted token."""
    t0 = time.monotonic()
    ref = score_batch(net, tokens, prompt, DynamicCache(config=net.config), 1)[0]
    walls["plain"] = walls.get("plain", 0.0) + time.monotonic() - t0
    plain_nll, _, _ = compare(ref, ref, tokens[prompt:])
    r = runs.setdefault(("plain", 0, "-"), Run("plain", 0, "-", [], [], [], 0.0, 0.0, 0))
    r.nll += plain_nll
    r.top1 += [True] * len(plain_nll)
    r.kl += [0.0] * len(plain_nll)
    return ref, plain_nll


def make_cache(client, cfg, specs: List[SeqSpec], args) -> "vase.hf.VaseCache":
    """A transformers Cache whose rows are vase sequences of specs (vase.hf)."""
    return vase.hf.VaseCache(client, cfg, specs=specs, block_tokens=args.block,
                             attention=args.attention, name="quality-harness")


def documents(args, tok) -> List[torch.Tensor]:
    docs = []
    for path in args.docs:
        with open(path, "rb") as f:
            data = f.read()
        try:
            ids = tok(data.decode("utf-8"))["input_ids"]
        except UnicodeDecodeError as e:
            raise SystemExit(f"{path}: not UTF-8 ({e})")
        if len(ids) < args.doc_tokens:
            raise SystemExit(f"{path}: {len(ids)} tokens, fewer than --doc-tokens {args.doc_tokens}")
        docs.append(torch.tensor(ids[: args.doc_tokens], dtype=torch.long))
    return docs


def write_outputs(args, runs: Dict[tuple, Run], doc_len: int, walls: Dict[str, float]) -> str:
    os.makedirs(args.out, exist_ok=True)
    rows = sorted(runs.values(), key=lambda r: (r.mode, r.policy != "plain", r.policy != "full",
                                                 r.policy, r.budget))
    with open(os.path.join(args.out, "quality.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["mode", "policy", "budget", "budget_share", "perplexity", "top1_agreement",
                    "mean_kl", "evictions", "compaction_seconds", "stall_seconds",
                    "plan_seconds", "vase_call_seconds"])
        for r in rows:
            w.writerow([r.mode, r.policy, r.budget, f"{r.budget / doc_len:.4f}" if r.budget else "",
                        f"{r.perplexity():.4f}", f"{sum(r.top1) / len(r.top1):.4f}",
                        f"{sum(r.kl) / len(r.kl):.5f}", r.evictions, f"{r.compact:.3f}",
                        f"{r.stall:.3f}", f"{r.plan:.3f}", f"{r.calls:.3f}"])
    lines = ["| mode | policy | budget | perplexity | top-1 agreement | mean KL | evictions | "
             "compaction ms | stall ms |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        budget = "all" if r.budget == 0 else f"{r.budget} ({r.budget / doc_len:.3g})"
        lines.append(f"| {r.mode} | {r.policy} | {budget} | {r.perplexity():.3f} | "
                     f"{sum(r.top1) / len(r.top1):.3f} | {sum(r.kl) / len(r.kl):.4f} | "
                     f"{r.evictions} | {r.compact * 1e3:.1f} | {r.stall * 1e3:.1f} |")
    lines += ["", "Time per policy, over its budgets and the documents: evictions, the daemon's plan "
              "time for them, and the engine's time in the policy's vase calls (push_stats, "
              "append, poll; sync mode waits there for each plan), compaction included.", "",
              "| mode | policy | evictions | plan s | vase calls s | compaction s | stall s |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for (mode, policy), rs in per_policy(rows).items():
        lines.append(f"| {mode} | {policy} | {sum(r.evictions for r in rs)} | "
                     f"{sum(r.plan for r in rs):.3f} | {sum(r.calls for r in rs):.3f} | "
                     f"{sum(r.compact for r in rs):.3f} | {sum(r.stall for r in rs):.3f} |")
    lines.append("")
    lines.append("Wall time per batch (model and vase): "
                 + ", ".join(f"{k} {v:.1f} s" for k, v in walls.items()) + ".")
    table = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "quality.md"), "w") as f:
        f.write(table)
    plot(args, rows, doc_len)
    return table


def per_policy(rows: List[Run]) -> Dict[tuple, List[Run]]:
    out: Dict[tuple, List[Run]] = {}
    for r in rows:
        if r.policy != "plain":
            out.setdefault((r.mode, r.policy), []).append(r)
    return out


def plot(args, rows: List[Run], doc_len: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(args.modes), 2, figsize=(11, 4 * len(args.modes)), squeeze=False)
    plain = next(r for r in rows if r.policy == "plain")
    for mi, mode in enumerate(args.modes):
        for ci, (what, fn) in enumerate([("perplexity", Run.perplexity),
                                         ("mean KL from the full cache",
                                          lambda r: sum(r.kl) / len(r.kl))]):
            ax = axes[mi][ci]
            for policy in args.policies:
                pts = sorted((r.budget / doc_len, fn(r)) for r in rows
                             if r.mode == mode and r.policy == policy)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=policy)
            if ci == 0:
                ax.axhline(plain.perplexity(), color="black", linestyle="--", label="full cache")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("budget / document length")
            ax.set_ylabel(what)
            ax.set_title(f"{what}, {mode} mode")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "quality.png"), dpi=100)


def common_arguments(description: str, out: str) -> argparse.ArgumentParser:
    """The options of the sweeps over documents, policies and budgets (this harness and
    compare_kvpress.py); finish_args() completes what they parse."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model", default=os.path.join(HERE, "model"), help="checkpoint directory")
    p.add_argument("--runtime-dir", default=None, help="vased's runtime directory")
    p.add_argument("--docs", nargs="+", default=None,
                   help="held-out documents (files; default: one, /usr/include/linux/keyboard.h)")
    p.add_argument("--doc-tokens", type=int, default=2048, help="tokens of each document used")
    p.add_argument("--prompt", type=int, default=64, help="tokens read in one step first")
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--budgets", default="0.125,0.25,0.5",
                   help="budgets as shares of the document length")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--block", type=int, default=16, help="block_tokens of the vase model")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default=out)
    p.add_argument("--device", default="cpu", help="where the model runs: the arena's device")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES),
                   help="the model's and the cache's element type")
    p.add_argument("--attention", default="auto", choices=ATTENTION,
                   help="how attention reads the cache (auto: a paged kernel when one applies)")
    return p


def finish_args(args):
    """--quick's document, prompt and window; the lists of --policies and --budgets."""
    if args.quick:
        args.doc_tokens, args.prompt, args.window = 256, 32, 16
    args.policies = [x for x in args.policies.split(",") if x]
    args.budget_shares = [float(x) for x in args.budgets.split(",")]
    return args


def parse_args(argv=None):
    p = common_arguments(__doc__.split("\n\n")[0], "build/quality")
    p.add_argument("--modes", default="sync,async")
    p.add_argument("--batch-per-policy", action="store_true",
                   help="one batch per policy (its budgets): a wall time per policy, but slower")
    p.add_argument("--elastic-half", action="store_true",
                   help="instead of the sweep: per policy and budget B, static B and B/2 against "
                        "an elastic sequence capped from B to B/2 at the document's midpoint "
                        "(elastic_half.py; elastic.md and elastic.csv in --out)")
    p.add_argument("--quick", action="store_true",
                   help="a smoke test: one short document, small budgets, both modes")
    args = finish_args(p.parse_args(argv))
    args.modes = [x for x in args.modes.split(",") if x]
    return args


def load_model(path: str, dtype: str, device: str):
    """The checkpoint as a transformers model in dtype on device, attending through vase.hf's
    attention function (SDPA for any cache but a vase.hf.VaseCache)."""
    net = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype),
                                               attn_implementation=vase.hf.ATTENTION)
    return net.eval().to(device)


def budgets_for(args, doc_len: int) -> List[int]:
    out = []
    for share in args.budget_shares:
        b = int(round(share * doc_len / args.window)) * args.window
        b = max(b, 2 * args.window)
        if b not in out:
            out.append(b)
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    net = load_model(args.model, args.dtype, args.device)
    cfg = net.config
    tok = AutoTokenizer.from_pretrained(args.model)
    if args.docs is None:
        args.docs = default_documents(args)
    docs = [d.to(args.device) for d in documents(args, tok)]
    budgets = budgets_for(args, args.doc_tokens)
    print(f"harness: {len(docs)} documents of {args.doc_tokens} tokens, prompt {args.prompt}, "
          f"window {args.window}, budgets {budgets}, policies {args.policies}, modes {args.modes}")
    if args.elastic_half:
        import elastic_half

        with vase.connect(runtime_dir=args.runtime_dir, name="quality-harness") as client:
            return elastic_half.main(args, net, cfg, client, docs, budgets)
    runs: Dict[tuple, Run] = {}
    walls: Dict[str, float] = {}
    t0 = time.monotonic()
    with vase.connect(runtime_dir=args.runtime_dir, name="quality-harness") as client:
        for d in docs:
            ppl = run_document(net, cfg, client, d, args, budgets, runs, walls)
            print(f"harness: document done, full-cache perplexity {ppl:.3f}")
    table = write_outputs(args, runs, args.doc_tokens, walls)
    print(table)
    print(f"harness: {time.monotonic() - t0:.1f} s; {args.out}/quality.md, quality.csv, quality.png")
    # Every perplexity is a number: a NaN or Inf anywhere is a failure, not a row.
    bad = [f"{r.policy} {r.budget} {r.mode}" for r in runs.values()
           if not math.isfinite(r.perplexity())]
    if bad:
        print(f"harness: perplexity not finite for {', '.join(bad)}", file=sys.stderr)
        return 1
    # The table is complete: every policy at every budget in every mode.
    missing = [(p, b, m) for m in args.modes for p in args.policies for b in budgets
               if (p, b, m) not in runs]
    if missing:
        print(f"harness: no results for {missing}", file=sys.stderr)
        return 1
    # The full row went through vase without eviction: it must be the plain model.
    plain = runs[("plain", 0, "-")].perplexity()
    for mode in args.modes:
        full = runs[("full", 0, mode)]
        if full.evictions or abs(full.perplexity() - plain) > 1e-3 * plain:
            print(f"harness: the full cache through vase ({mode}) gives perplexity "
                  f"{full.perplexity():.6f} with {full.evictions} evictions; the plain model "
                  f"{plain:.6f}", file=sys.stderr)
            return 1
    return 0


# Held-out documents (data.is_heldout) in packages every machine that builds vase has:
# linux-libc-dev and libc6-dev.
DEFAULT_DOCUMENTS = [
    "/usr/include/linux/keyboard.h",
    "/usr/include/linux/nitro_enclaves.h",
    "/usr/include/inttypes.h",
]


def default_documents(args) -> List[str]:
    import data

    docs = [p for p in DEFAULT_DOCUMENTS
            if data.is_heldout(p) and os.path.exists(p) and os.path.getsize(p) >= args.doc_tokens]
    if not docs:
        raise SystemExit(f"harness: none of {DEFAULT_DOCUMENTS} here; give --docs")
    return docs[:1]


if __name__ == "__main__":
    sys.exit(main())
