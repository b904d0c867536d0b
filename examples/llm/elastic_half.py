# SPDX-License-Identifier: MIT
"""harness.py --elastic-half: what a budget halved in the middle of a document costs.

An elastic sequence (opened with a min_budget below its budget) runs at a lower budget while the
daemon makes room for waiting opens, or while the engine caps it (Seq.set_budget). This measures
the quality at the budgets actually used: for each policy and each budget B of the harness whose
half is a multiple of the window above it, one batch per mode holds

- a static sequence at B and one at B / 2 (the natural lower reference), and
- an elastic sequence opened at B with min_budget B / 2, which the engine caps at B / 2 right
  after reading the document's midpoint token; its next plan keeps B / 2 tokens, its commit
  releases the pages, and it runs at B / 2 from there on.

For each sequence: perplexity over the document, and perplexity, top-1 agreement and mean KL
from the full cache over the predictions made after the cap (the static run at B is the same as
the elastic one before it); for the elastic one, the token at which its budget changed, its
budget at the end and libvase's budget_changes counter, and the largest difference of its
log-probabilities from the static run at B before the cap: 0 for a policy without random draws
in sync mode, where plans are exact; a policy that draws (vase-attnv, vase-dkv, random) draws
from a stream keyed by the sequence id, so any two of its sequences differ once they evict, elastic
or not. Output: elastic.md and elastic.csv in --out. Fails (exit 1) if an elastic sequence's
budget did not go down to B / 2 exactly once, or a perplexity is not finite.
"""

from __future__ import annotations

import csv
import math
import os
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import harness
from vase.torch import SeqSpec


@dataclass
class Row:
    policy: str
    mode: str
    budget: int  # the budget it was opened with
    elastic: bool
    nll: List[float] = field(default_factory=list)  # every prediction
    nll_after: List[float] = field(default_factory=list)  # the predictions after the cap
    top1_after: List[bool] = field(default_factory=list)
    kl_after: List[float] = field(default_factory=list)
    evictions: int = 0
    budget_changes: int = 0
    final_budgets: List[int] = field(default_factory=list)  # per document
    changed_at: List[Optional[int]] = field(default_factory=list)  # per document
    diff_before: float = 0.0  # elastic: max |log-prob - static B's| before the cap

    def label(self) -> str:
        return f"elastic {self.budget} → {self.budget // 2}" if self.elastic else \
            f"static {self.budget}"


def ppl(nll: List[float]) -> float:
    return math.exp(sum(nll) / len(nll)) if nll else math.nan


def pairs_for(args, budgets: List[int]) -> List[int]:
    """The budgets B that can be halved: B / 2 a multiple of the window, above it."""
    w = args.window
    return [b for b in budgets if b % (2 * w) == 0 and b // 2 > w]


def run_document(net, cfg, client, tokens, args, budgets: List[int], rows: Dict[tuple, Row],
                 walls: Dict[str, float]) -> None:
    prompt, n = args.prompt, tokens.numel()
    ref, _ = harness.run_plain(net, tokens, prompt, {}, walls)
    targets = tokens[prompt:]
    half = n // 2  # the cap is set after the step that read this token
    after = half + 2 - prompt  # the first prediction made after it
    statics = sorted({b for b in budgets} | {b // 2 for b in budgets}, reverse=True)
    for mode in args.modes:
        keys = [(p, b, False) for p in args.policies for b in statics]
        keys += [(p, b, True) for p in args.policies for b in budgets]
        specs = [SeqSpec(policy=p, budget=b, window=args.window, mode=mode, seed=args.seed,
                         extra={"min_budget": b // 2} if elastic else {})
                 for p, b, elastic in keys]
        elastic_idx = [i for i, k in enumerate(keys) if k[2]]
        changed_at: Dict[int, Optional[int]] = {i: None for i in elastic_idx}
        t0 = time.monotonic()
        with harness.make_cache(client, cfg, specs, args) as cache:

            def on_step(i: int) -> None:
                for j in elastic_idx:
                    seq, b = cache.seqs[j], specs[j].budget
                    if i == half:
                        seq.set_budget(b // 2)
                    if changed_at[j] is None and seq.budget != b:
                        changed_at[j] = i

            got = harness.score_batch(net, tokens, prompt, cache, len(specs), on_step)
            evictions = cache.evictions()
            counters = cache.counters()
            final = [s.budget for s in cache.seqs]
        walls[f"{mode} elastic-half"] = walls.get(f"{mode} elastic-half", 0.0) + \
            time.monotonic() - t0
        index = {k: i for i, k in enumerate(keys)}
        for i, (policy, b, elastic) in enumerate(keys):
            nll, top1, kl = harness.compare(ref, got[i], targets)
            r = rows.setdefault((mode, policy, b, elastic), Row(policy, mode, b, elastic))
            r.nll += nll
            r.nll_after += nll[after:]
            r.top1_after += top1[after:]
            r.kl_after += kl[after:]
            r.evictions += evictions[i]
            r.budget_changes += int(counters[i]["budget_changes"])
            r.final_budgets.append(final[i])
            if elastic:
                r.changed_at.append(changed_at[i])
                same = got[index[(policy, b, False)]]
                r.diff_before = max(r.diff_before,
                                    float((got[i, :after] - same[:after]).abs().max()))


def check(rows: Dict[tuple, Row], docs: int) -> List[str]:
    """What went wrong: elastic budgets that did not halve once per document, NaN perplexity."""
    bad = []
    for r in rows.values():
        for what, v in (("perplexity", ppl(r.nll)), ("perplexity after", ppl(r.nll_after))):
            if not math.isfinite(v):
                bad.append(f"{r.mode} {r.policy} {r.label()}: {what} {v}")
        want = r.budget // 2 if r.elastic else r.budget
        if any(f != want for f in r.final_budgets) or (r.elastic and None in r.changed_at):
            bad.append(f"{r.mode} {r.policy} {r.label()}: budgets at the end {r.final_budgets}, "
                       f"changed at {r.changed_at}; want {want}")
        if r.budget_changes != (docs if r.elastic else 0):
            bad.append(f"{r.mode} {r.policy} {r.label()}: {r.budget_changes} budget changes "
                       f"over {docs} documents")
    return bad


def write_outputs(args, rows: Dict[tuple, Row], walls: Dict[str, float]) -> str:
    os.makedirs(args.out, exist_ok=True)
    order = sorted(rows.values(), key=lambda r: (r.mode, r.policy, -r.budget, r.elastic))
    with open(os.path.join(args.out, "elastic.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["mode", "policy", "run", "budget", "min_budget", "final_budget", "perplexity",
                    "perplexity_after_cap", "top1_after_cap", "mean_kl_after_cap", "evictions",
                    "budget_changes", "budget_changed_at_token", "max_logprob_diff_before_cap"])
        for r in order:
            w.writerow([r.mode, r.policy, "elastic" if r.elastic else "static", r.budget,
                        r.budget // 2 if r.elastic else r.budget,
                        ";".join(map(str, r.final_budgets)), f"{ppl(r.nll):.4f}",
                        f"{ppl(r.nll_after):.4f}",
                        f"{sum(r.top1_after) / len(r.top1_after):.4f}",
                        f"{sum(r.kl_after) / len(r.kl_after):.5f}", r.evictions, r.budget_changes,
                        ";".join(map(str, r.changed_at)),
                        f"{r.diff_before:.3g}" if r.elastic else ""])
    lines = ["| mode | policy | run | perplexity | perplexity after the cap | top-1 after | "
             "KL after | evictions | budget changes | budget changed at token |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in order:
        lines.append(f"| {r.mode} | {r.policy} | {r.label()} | {ppl(r.nll):.3f} | "
                     f"{ppl(r.nll_after):.3f} | {sum(r.top1_after) / len(r.top1_after):.3f} | "
                     f"{sum(r.kl_after) / len(r.kl_after):.4f} | {r.evictions} | "
                     f"{r.budget_changes} | "
                     f"{', '.join(map(str, r.changed_at)) if r.elastic else ''} |")
    diffs = [r for r in order if r.elastic]
    lines += ["", "Largest difference of an elastic run's log-probabilities from the static run "
              "at its opening budget, before the cap (a policy's random draws are keyed by the "
              "sequence id: with draws, two sequences differ once they evict): "
              + ", ".join(f"{r.mode} {r.policy} {r.budget} {r.diff_before:.3g}" for r in diffs)
              + ".", "", "Wall time per batch (model and vase): "
              + ", ".join(f"{k} {v:.1f} s" for k, v in walls.items()) + "."]
    table = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "elastic.md"), "w") as f:
        f.write(table)
    return table


def main(args, net, cfg, client, docs, budgets: List[int]) -> int:
    pairs = pairs_for(args, budgets)
    if not pairs:
        print(f"harness: no budget of {budgets} halves to a multiple of window {args.window} "
              f"above it")
        return 1
    print(f"harness: elastic-half: budgets {pairs} capped to half after token "
          f"{docs[0].numel() // 2}")
    rows: Dict[tuple, Row] = {}
    walls: Dict[str, float] = {}
    for d in docs:
        run_document(net, cfg, client, d, args, pairs, rows, walls)
        print("harness: document done")
    print(write_outputs(args, rows, walls))
    bad = check(rows, len(docs))
    for b in bad:
        print(f"harness: {b}")
    return 1 if bad else 0
