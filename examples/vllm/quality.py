#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The quality harness's protocol through vLLM with vase.vllm, beside vase.hf's, on the same
documents.

examples/llm/harness.py feeds each held-out document to the model through vase.hf: the first
`prompt` tokens in one step, then the rest one token per step (teacher forcing), through a vase
cache of each policy and budget. Here the same documents, policies, budgets, window, modes and
seed also go through vLLM 0.18.1 (the CPU build) with the plugin: each (document, policy,
budget, mode) is one request whose prompt is the document's first `prompt` tokens and whose
decoding is forced to follow the document (`Forcing`, a v1 logits processor that leaves only
the next token of the document finite). vLLM returns the log-probabilities of the raw logits
(logprobs_mode "raw_logprobs", computed before any logits processor) of all 258 tokens at each
position: the model's next-token distribution, as the harness records it.

Three children, one after the other: the harness's own run_document() (vase.hf, against a
plain DynamicCache), vLLM without the plugin (its reference, one request per document), and
vLLM with the plugin (every request submitted at once; each enters the batch once its sequence
is open and reads its whole prompt in its first step, which the child checks). Each vase path
gets a fresh vased (examples/with_vased.sh) and opens its sequences in the harness's order
(vLLM: one opener thread, VASE_VLLM_OPENERS=1), so both get the same sequence ids, and with
them the same draws for the sampling policies (Philox is keyed by the seed and counts the
sequence id and the eviction round); the children report the ids, and the table says whether
they matched. --runtime-dir runs both against that one daemon instead (the ids, and so the
draws, then differ).

Output in --out: quality.md and quality.csv, per mode, policy and budget, both paths side by
side (perplexity; top-1 agreement and mean KL from the path's own full-cache reference;
evictions) with their differences, and between the paths position by position: the largest
difference of a log-probability, the mean KL(vase.hf || vLLM) and the share of equal argmaxes;
and the children's logs. The exit status is 1 when a value is not finite, or when a checked
row's perplexity differs between the paths by more than --tolerance (relative): the references,
the full rows and, in sync mode, every policy whose plans are a function of what the cache
holds (all of them when the sequence ids matched, else those without draws).
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import subprocess
import sys
import time
from typing import Dict, List, Tuple

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "examples", "llm"))

import harness  # noqa: E402  (puts the build's vase on sys.path)

sys.path.insert(0, HERE)

import bench  # noqa: E402  (examples/vllm/bench.py: the environment vLLM's CPU build needs)

BUILD = bench.BUILD
WITH_VASED = os.path.join(REPO, "examples", "with_vased.sh")
# Policies whose plans take no random draws: the same cache contents give the same plan.
DRAW_FREE = {"snapkv", "rkv", "streaming", "h2o", "range-attn", "evict-large-range"}
QUICK_POLICIES = "streaming,snapkv,vase-attnv"
QUICK_BUDGETS = "0.25"
PATHS = ("hf", "vllm")


# ---- vLLM: teacher forcing as a logits processor ----

def forcing_processor():
    """The logits processor class (vLLM is imported only by the child that runs it)."""
    from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

    class Forcing(AdapterLogitsProcessor):
        """Teacher forcing: a request whose extra_args has "forced_tokens" samples token
        forced_tokens[k] at its k-th output position, whatever its sampling parameters (every
        other logit is -inf). Not argmax-invariant, so vLLM applies it before greedy sampling;
        the log-probabilities vLLM returns (raw_logprobs) are taken before it."""

        def is_argmax_invariant(self) -> bool:
            return False

        def new_req_logits_processor(self, params):
            forced = (params.extra_args or {}).get("forced_tokens")
            return None if forced is None else _Force(forced)

    return Forcing


class _Force:
    def __init__(self, forced: List[int]):
        self.forced = forced

    def __call__(self, output_ids: List[int], logits: torch.Tensor) -> torch.Tensor:
        k = len(output_ids)  # the tokens sampled so far: this step samples token k
        if k < len(self.forced):
            t = self.forced[k]
            kept = logits[t].clone()
            logits.fill_(float("-inf"))
            logits[t] = kept
        return logits


def run_vllm(args, docs: List[torch.Tensor], budgets: List[int]) -> List[dict]:
    """The vLLM child: every request in one generate(); returns one record per request."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    import vase.vllm

    plugin = vase.vllm.enabled()
    keys = request_keys(args, len(docs), budgets) if plugin else \
        [(d, "plain", 0, "-") for d in range(len(docs))]
    seqs = watch_sequences() if plugin else {}
    prompt, n = args.prompt, args.doc_tokens
    llm = LLM(model=args.model, dtype=args.dtype, enforce_eager=True, max_model_len=n, seed=0,
              block_size=args.block, logits_processors=[forcing_processor()],
              max_logprobs=-1, logprobs_mode="raw_logprobs", max_num_seqs=len(keys),
              max_num_batched_tokens=max(len(keys) * prompt, n))
    vocab = llm.llm_engine.model_config.get_vocab_size()
    params = []
    for i, (d, policy, budget, mode) in enumerate(keys):
        extra = dict(forced_tokens=docs[d][prompt:].tolist(), quality_index=i)
        if plugin:
            extra.update(vase_policy="streaming" if policy == "full" else policy,
                         vase_budget=harness.full_budget(args, n) if policy == "full" else budget,
                         vase_window=args.window, vase_mode=mode, vase_seed=args.seed)
        params.append(SamplingParams(temperature=0, max_tokens=n - prompt, ignore_eos=True,
                                     logprobs=vocab, flat_logprobs=True, detokenize=False,
                                     extra_args=extra))
    t0 = time.monotonic()
    outs = llm.generate([TokensPrompt(prompt_token_ids=docs[d][:prompt].tolist())
                         for d, *_ in keys], params, use_tqdm=False)
    wall = time.monotonic() - t0
    if plugin:
        from vase.vllm import runtime

        for req in runtime.get().cache.open_reqs.values():  # the last step's: still open
            seen_request(seqs, req)
    records = []
    for i, (key, out) in enumerate(zip(keys, outs)):
        c = out.outputs[0]
        if list(c.token_ids) != docs[key[0]][prompt:].tolist():
            raise SystemExit(f"vllm: request {key}: the output is not the forced document")
        seq = seqs.get(i, {}) if plugin else dict(seq=None, evictions=0, first_step=prompt)
        if seq.get("first_step") != prompt:
            raise SystemExit(f"vllm: request {key}: its first step read "
                             f"{seq.get('first_step')} tokens through vase, not the prompt's "
                             f"{prompt} in one (chunked prefill?)")
        records.append(dict(key=key, logp=dense_logprobs(c.logprobs, vocab), seq=seq["seq"],
                            evictions=seq["evictions"]))
    print(f"vllm: {len(keys)} requests, {n - prompt} tokens each, in {wall:.1f} s")
    return records


def watch_sequences() -> Dict[int, dict]:
    """Request index -> its vase sequence's id, evictions and first step's tokens, filled as
    vase.vllm opens and closes sequences (this process runs vLLM's engine:
    VLLM_ENABLE_V1_MULTIPROCESSING=0). Reads only."""
    from vase.vllm import runtime

    seen: Dict[int, dict] = {}
    spec_of, begin = runtime.Runtime.spec_of, runtime.Runtime.begin
    close_request = runtime.Requests.close_request

    def indexed_spec(rt, req_state):
        spec = spec_of(rt, req_state)
        spec.index = (req_state.sampling_params.extra_args or {}).get("quality_index")
        return spec

    def beginning(rt, runner, scheduler_output):
        begin(rt, runner, scheduler_output)
        for req_id, count in zip(rt.step.req_ids, rt.step.counts):
            req = rt.cache.open_reqs[req_id]
            if req.seq.position == 0:  # its prompt: in one step, as the harness reads it
                seen_request(seen, req)["first_step"] = count

    def closing(requests, req_id):
        r = requests.open_reqs.get(req_id)
        if r is not None:
            seen_request(seen, r)
        return close_request(requests, req_id)

    runtime.Runtime.spec_of, runtime.Runtime.begin = indexed_spec, beginning
    runtime.Requests.close_request = closing
    return seen


def seen_request(seen: Dict[int, dict], req) -> dict:
    d = seen.setdefault(getattr(req.spec, "index", None), {})
    d.update(seq=req.seq.id, evictions=req.seq.rounds)
    return d


def dense_logprobs(flat, vocab: int) -> torch.Tensor:
    """vLLM's FlatLogprobs of a request as [positions, vocab]; every entry must be there."""
    starts, ends = torch.tensor(flat.start_indices), torch.tensor(flat.end_indices)
    pos = torch.repeat_interleave(torch.arange(len(starts)), ends - starts)
    out = torch.full((len(starts), vocab), float("nan"))
    out[pos, torch.tensor(flat.token_ids)] = torch.tensor(flat.logprobs, dtype=torch.float32)
    if bool(out.isnan().any()):
        raise SystemExit("vllm: a position lacks some token's log-probability")
    if bool((out.isfinite().sum(1) < 2).any()):  # the forced token's alone: after Forcing
        raise SystemExit("vllm: log-probabilities after the logits processors, not raw ones")
    return out


def request_keys(args, n_docs: int, budgets: List[int]) -> List[tuple]:
    """(document, policy, budget, mode) in the order harness.run_document opens sequences."""
    return [(d, policy, b, mode) for d in range(n_docs) for mode in args.modes
            for policy, b in [("full", 0)] + [(p, b) for p in args.policies for b in budgets]]


# ---- vase.hf: the harness itself ----

def run_hf(args, docs: List[torch.Tensor], budgets: List[int]) -> List[dict]:
    import vase

    torch.manual_seed(args.seed)
    net = harness.load_model(args.model, args.dtype, args.device)
    records: List[dict] = []
    d = 0

    def record(mode, keys, logp, cache):
        seqs = cache.seqs if cache is not None else [None] * len(keys)
        evictions = cache.evictions() if cache is not None else [0] * len(keys)
        for i, (policy, b) in enumerate(keys):
            records.append(dict(key=(d, policy, b, mode), logp=logp[i].cpu(),
                                seq=seqs[i].id if seqs[i] is not None else None,
                                evictions=evictions[i]))

    args.batch_per_policy = False
    t0 = time.monotonic()
    with vase.connect(runtime_dir=args.runtime_dir, name="quality-harness") as client:
        for d, tokens in enumerate(docs):
            harness.run_document(net, net.config, client, tokens.to(args.device), args, budgets,
                                 {}, {}, record)
    print(f"hf: {len(records)} rows in {time.monotonic() - t0:.1f} s")
    return records


# ---- the parent: the children, the comparison ----

def run_child(args, argv: List[str], what: str, vase: bool,
              walls: Dict[str, float]) -> List[dict]:
    """Runs this script as the child `what` (hf, or vllm with the plugin if vase, else
    without) and returns its records; its wall time goes to walls."""
    data = os.path.join(args.out, f"{what}{'' if vase else '-plain'}.pt")
    cmd = [sys.executable, os.path.abspath(__file__), *argv, "--child", what,
           "--child-out", data]
    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, "python"))
    if what == "vllm":
        # The engine in this process (the hooks of watch_sequences() see its worker); one
        # thread opens the sequences, in the requests' order (the harness's ids); documents
        # longer than the checkpoint's 1,024 positions as in vase.hf, which does not stop there.
        env = dict(bench.serve_env(vase), VLLM_ENABLE_V1_MULTIPROCESSING="0",
                   VASE_VLLM_OPENERS="1", VLLM_ALLOW_LONG_MAX_MODEL_LEN="1")
    if vase and args.runtime_dir is None:
        cmd = [WITH_VASED, args.vased, "--arena-bytes=256M", "--"] + cmd
    name = os.path.basename(data)[:-3]
    log = os.path.join(args.out, f"{name}.log")
    t0 = time.monotonic()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
    walls[name] = time.monotonic() - t0
    print(f"quality: {name} in {walls[name]:.1f} s (log {log})", flush=True)
    if rc:
        with open(log, errors="replace") as f:
            sys.stderr.write("".join(f.readlines()[-30:]))
        raise SystemExit(f"quality: the {what} child exited with {rc}")
    records = torch.load(data)
    os.remove(data)
    return records


class Row:
    """One (mode, policy, budget) of both paths, over the documents."""

    def __init__(self, policy: str, budget: int, mode: str):
        self.policy, self.budget, self.mode = policy, budget, mode
        self.runs = {p: harness.Run(policy, budget, mode, [], [], [], 0.0, 0.0, 0)
                     for p in PATHS}
        self.seqs: Dict[str, list] = {p: [] for p in PATHS}
        self.max_diff = 0.0
        self.kl: List[float] = []  # KL(vase.hf || vLLM) per position
        self.top1: List[bool] = []  # the same argmax in both paths

    def metrics(self, path: str) -> Tuple[float, float, float]:
        r = self.runs[path]
        return r.perplexity(), sum(r.top1) / len(r.top1), sum(r.kl) / len(r.kl)

    def ppl_diff(self) -> float:
        """The relative difference of the perplexities, vLLM's against vase.hf's."""
        h, v = self.runs["hf"].perplexity(), self.runs["vllm"].perplexity()
        return (v - h) / h

    def same_seqs(self) -> bool:
        return self.seqs["hf"] == self.seqs["vllm"]

    def values(self) -> List[float]:
        return [x for p in PATHS for x in self.metrics(p)] + [self.max_diff, mean(self.kl)]


def mean(xs) -> float:
    return sum(xs) / len(xs)


def compare_paths(args, docs, records: Dict[str, List[dict]]) -> List[Row]:
    """The harness's metrics per path (against the path's own plain reference), and the
    position-by-position differences between the paths."""
    by_key = {p: {r["key"]: r for r in rs} for p, rs in records.items()}
    rows: Dict[tuple, Row] = {}
    for key, h in by_key["hf"].items():
        d, policy, b, mode = key
        v = by_key["vllm"].get(key)
        if v is None:
            raise SystemExit(f"quality: vLLM has no result for {key}")
        row = rows.setdefault((mode, policy, b), Row(policy, b, mode))
        targets = docs[d][args.prompt:]
        for p, r in (("hf", h), ("vllm", v)):
            ref = by_key[p][(d, "plain", 0, "-")]["logp"]
            nll, top1, kl = harness.compare(ref, r["logp"], targets)
            run = row.runs[p]
            run.nll += nll
            run.top1 += top1
            run.kl += kl
            run.evictions += r["evictions"]
            row.seqs[p].append(r["seq"])
        _, top1, kl = harness.compare(h["logp"], v["logp"], targets)
        row.top1 += top1
        row.kl += kl
        row.max_diff = max(row.max_diff, float((h["logp"] - v["logp"]).abs().max()))
    return sorted(rows.values(), key=lambda r: (r.mode != "-", r.mode, r.policy != "full",
                                                r.policy, r.budget))


def checked(row: Row) -> bool:
    """Whether the row must match between the paths: the references, the full rows, and in
    sync mode the policies without draws, or every policy when the sequence ids (and so the
    draws) matched."""
    if row.policy in ("plain", "full"):
        return True
    return row.mode == "sync" and (row.policy in DRAW_FREE or row.same_seqs())


def write_outputs(args, rows: List[Row], doc_len: int, note: str) -> str:
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "quality.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["mode", "policy", "budget", "evictions_hf", "evictions_vllm",
                    "perplexity_hf", "perplexity_vllm", "perplexity_rel_diff", "top1_hf",
                    "top1_vllm", "mean_kl_hf", "mean_kl_vllm", "paths_max_abs_logprob_diff",
                    "paths_mean_kl", "paths_top1", "same_sequence_ids", "checked"])
        for r in rows:
            (ph, th, kh), (pv, tv, kv) = r.metrics("hf"), r.metrics("vllm")
            w.writerow([r.mode, r.policy, r.budget, r.runs["hf"].evictions,
                        r.runs["vllm"].evictions, f"{ph:.6f}", f"{pv:.6f}",
                        f"{r.ppl_diff():.3e}", f"{th:.4f}", f"{tv:.4f}", f"{kh:.6f}",
                        f"{kv:.6f}", f"{r.max_diff:.3e}", f"{mean(r.kl):.3e}",
                        f"{mean(r.top1):.4f}", int(r.same_seqs()), int(checked(r))])
    lines = [
        "| mode | policy | budget | evictions hf / vLLM | perplexity hf | perplexity vLLM | "
        "Δ ppl (rel.) | top-1 hf | top-1 vLLM | mean KL hf | mean KL vLLM | "
        "paths: max abs Δ log p | paths: mean KL | paths: same argmax | same seq ids |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        (ph, th, kh), (pv, tv, kv) = r.metrics("hf"), r.metrics("vllm")
        budget = "all" if r.budget == 0 else f"{r.budget} ({r.budget / doc_len:.3g})"
        same = "-" if r.policy == "plain" else ("yes" if r.same_seqs() else "no")
        lines.append(
            f"| {r.mode} | {r.policy} | {budget} | {r.runs['hf'].evictions} / "
            f"{r.runs['vllm'].evictions} | {ph:.4f} | {pv:.4f} | {r.ppl_diff():+.1e} | "
            f"{th:.3f} | {tv:.3f} | {kh:.5f} | {kv:.5f} | {r.max_diff:.1e} | "
            f"{mean(r.kl):.1e} | {mean(r.top1):.4f} | {same} |")
    table = "\n".join(lines + ["", note]) + "\n"
    with open(os.path.join(args.out, "quality.md"), "w") as f:
        f.write(table)
    return table


def check(args, rows: List[Row]) -> List[str]:
    bad = [f"{r.mode} {r.policy} {r.budget}: a value is not finite" for r in rows
           if not all(math.isfinite(x) for x in r.values())]
    bad += [f"{r.mode} {r.policy} {r.budget}: perplexity {r.metrics('hf')[0]:.6f} through "
            f"vase.hf, {r.metrics('vllm')[0]:.6f} through vLLM ({r.ppl_diff():+.2e}, "
            f"tolerance {args.tolerance:.0e})"
            for r in rows if checked(r) and not abs(r.ppl_diff()) <= args.tolerance]
    return bad


def parse_args(argv=None):
    p = harness.common_arguments(__doc__.split("\n\n")[0], "build/vllm-quality")
    p.add_argument("--modes", default="sync,async")
    p.add_argument("--quick", action="store_true",
                   help=f"a smoke test: one document of 256 tokens, sync mode, policies "
                        f"{QUICK_POLICIES} unless given, budget {QUICK_BUDGETS} unless given")
    p.add_argument("--tolerance", type=float, default=1e-4,
                   help="the largest relative difference of a checked row's perplexity between "
                        "the paths")
    p.add_argument("--vased", default=os.path.join(BUILD, "vased"),
                   help="the daemon each vase path gets a fresh one of (without --runtime-dir)")
    p.add_argument("--child", choices=PATHS, help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    given = set(argv if argv is not None else sys.argv[1:])
    args = p.parse_args(argv)
    if args.quick:
        if "--policies" not in given:
            args.policies = QUICK_POLICIES
        if "--budgets" not in given:
            args.budgets = QUICK_BUDGETS
        if "--modes" not in given:
            args.modes = "sync"
    args = harness.finish_args(args)
    args.modes = [x for x in args.modes.split(",") if x]
    return args


def load_documents(args) -> List[torch.Tensor]:
    from transformers import AutoTokenizer

    if args.docs is None:
        args.docs = harness.default_documents(args)
    return harness.documents(args, AutoTokenizer.from_pretrained(args.model))


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    docs = load_documents(args)
    budgets = harness.budgets_for(args, args.doc_tokens)
    if args.child:
        records = (run_hf if args.child == "hf" else run_vllm)(args, docs, budgets)
        torch.save(records, args.child_out)
        return 0
    print(f"quality: {len(docs)} documents of {args.doc_tokens} tokens, prompt {args.prompt}, "
          f"window {args.window}, budgets {budgets}, policies {args.policies}, "
          f"modes {args.modes}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    t0 = time.monotonic()
    walls: Dict[str, float] = {}
    records = {"hf": run_child(args, argv, "hf", True, walls),
               "vllm": run_child(args, argv, "vllm", False, walls)
               + run_child(args, argv, "vllm", True, walls)}
    rows = compare_paths(args, docs, records)
    note = (f"{len(docs)} document(s) ({', '.join(os.path.basename(d) for d in args.docs)}) of "
            f"{args.doc_tokens} tokens, prompt {args.prompt}, window {args.window}, seed "
            f"{args.seed}, blocks of {args.block} tokens, {args.dtype}; "
            f"{'one daemon' if args.runtime_dir else 'a fresh daemon per path'}. Wall time "
            "per child: " + ", ".join(f"{k} {v:.1f} s" for k, v in walls.items()) + ".")
    table = write_outputs(args, rows, args.doc_tokens, note)
    print(table)
    print(f"quality: {time.monotonic() - t0:.1f} s; {args.out}/quality.md, quality.csv")
    bad = check(args, rows)
    for line in bad:
        print(f"quality: {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
