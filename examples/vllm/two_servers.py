#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Two vLLM servers on one vased, sharing its arena: static budgets against elastic ones.

Both servers serve the shipped checkpoint with vase.vllm on, against one private vased whose
arena holds `--arena` bytes (by default 8 MiB: 7 sequences at the budget of 256 tokens, 15 at
the elastic floor of 64; `vasectl size` computes such figures). In each phase, `--clients`
OpenAI clients per server send streamed chat completions of
`--tokens` tokens at once (greedy, ignore_eos; more tokens than the budget, so that sequences
evict, which is when an elastic one can shrink), so the two servers ask for more sequences than
the arena holds at the full budget:

- ``static``: every request opens at `--budget`; a request whose sequence does not fit waits
  (in vLLM's queue, its open parked by vased) until another request's sequence closes;
- ``elastic``: requests open with min_budget `--min-budget` (VASE_VLLM_MIN_BUDGET): an open that
  does not fit at the budget takes less, and vased lowers the budgets of running elastic
  sequences (at their next eviction) to make room, so requests run instead of waiting.

The table gives per phase: requests admitted (completed) and failed, the generated tokens per
second of both servers together (all tokens over the phase's wall time), the time to first token
(median and p99, over every request), the arena's peak use (`vasectl status`, sampled) and the
budget changes vased made. One command, which starts the daemon and the servers itself:

    .venv/bin/python examples/vllm/two_servers.py --out build/vllm-two
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from vllm_server import BUILD, Server  # noqa: E402

PROMPTS = ["#include <stdio.h>", "int main(void) {", "/* the cache */", "def f(x):"]


def vasectl(run, *args):
    out = subprocess.run([os.path.join(BUILD, "vasectl"), f"--runtime-dir={run}", "--json",
                          *args], capture_output=True, text=True, timeout=30)
    if out.returncode:
        raise RuntimeError(f"vasectl {' '.join(args)}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def start_vased(run, arena):
    log = open(os.path.join(run, "vased.log"), "w")
    proc = subprocess.Popen([os.path.join(BUILD, "vased"), "--config=/dev/null",
                             f"--runtime-dir={run}", "--metrics-address=off",
                             f"--arena-bytes={arena}", "--granule-bytes=256K"],
                            stdout=log, stderr=subprocess.STDOUT)
    for _ in range(500):
        try:
            vasectl(run, "ping")
            return proc
        except RuntimeError:
            if proc.poll() is not None:
                raise RuntimeError(f"vased exited with {proc.returncode}")
            time.sleep(0.02)
    raise RuntimeError("vased did not come up")


def one_request(server, prompt, tokens, out):
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", timeout=1200,
                           max_retries=0)
    t0 = time.perf_counter()
    first, n = None, 0
    try:
        stream = client.chat.completions.create(
            model="vase-tiny", messages=[{"role": "user", "content": prompt}],
            max_tokens=tokens, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        for chunk in stream:
            if first is None and chunk.choices:  # the first token's chunk (role, content)
                first = time.perf_counter() - t0
            if chunk.usage is not None:
                n = chunk.usage.completion_tokens
        out.append(dict(ok=n == tokens, ttft=first, tokens=n, error=None))
    except openai.APIError as e:
        out.append(dict(ok=False, ttft=first, tokens=n, error=str(e)))


def sample_arena(run, stop, peak):
    while not stop.is_set():
        try:
            status = vasectl(run, "status")
            peak[0] = max(peak[0], sum(a["bytes_pages"] for a in status["arenas"]))
        except RuntimeError:
            pass
        stop.wait(0.05)


def phase(name, args, run, logs):
    env = {"VASE_VLLM_BUDGET": str(args.budget), "VASE_VLLM_WINDOW": str(args.window),
           "VASE_VLLM_POLICY": args.policy, "VASE_VLLM_NAME": "two-servers",
           "VASE_VLLM_MIN_BUDGET": str(args.min_budget if name == "elastic" else 0)}
    # Each server's OpenMP threads on cores of their own (--cores, "0|1": core 0 and core 1).
    cores = args.cores.split("|")
    servers = [Server(os.path.join(logs, f"{name}-{i}.log"), run=run, plugin=True,
                      env=dict(env, VLLM_CPU_OMP_THREADS_BIND=cores[i % len(cores)]))
               for i in range(2)]
    try:
        for s in servers:
            s.wait_ready()
        before = vasectl(run, "status")
        results, threads = [], []
        stop, peak = threading.Event(), [0]
        sampler = threading.Thread(target=sample_arena, args=(run, stop, peak), daemon=True)
        sampler.start()
        t0 = time.perf_counter()
        for i in range(args.clients):
            for s in servers:
                t = threading.Thread(target=one_request,
                                     args=(s, PROMPTS[i % len(PROMPTS)], args.tokens, results))
                t.start()
                threads.append(t)
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        stop.set()
        sampler.join()
        after = vasectl(run, "status")
    finally:
        for s in servers:
            s.stop()
    ttft = sorted(r["ttft"] for r in results if r["ttft"] is not None)
    errors = sorted({r["error"] for r in results if r["error"]})
    return dict(
        phase=name, requests=len(results), admitted=sum(r["ok"] for r in results),
        failed=sum(not r["ok"] for r in results), wall_s=round(wall, 2),
        tok_s=round(sum(r["tokens"] for r in results) / wall, 1),
        ttft_p50_s=round(statistics.median(ttft), 3) if ttft else None,
        ttft_p99_s=round(ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))], 3) if ttft else None,
        peak_arena_mib=round(peak[0] / 2**20, 2),
        budget_shrinks=after["budget_shrinks_total"] - before["budget_shrinks_total"],
        budget_grows=after["budget_grows_total"] - before["budget_grows_total"],
        errors="; ".join(errors)[:200])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arena", default="8M")
    p.add_argument("--clients", type=int, default=8, help="concurrent requests per server")
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--budget", type=int, default=256)
    p.add_argument("--min-budget", type=int, default=64)
    p.add_argument("--window", type=int, default=32)
    p.add_argument("--policy", default="vase-attnv")
    p.add_argument("--cores", default="0|1",
                   help="VLLM_CPU_OMP_THREADS_BIND of the two servers, separated by |")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    out = args.out or tempfile.mkdtemp(prefix="vase-two-")
    os.makedirs(out, exist_ok=True)
    run = tempfile.mkdtemp(prefix="vase-run-")
    daemon = start_vased(run, args.arena)
    try:
        rows = [phase(name, args, run, out) for name in ("static", "elastic")]
        left = vasectl(run, "status")
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
    cols = list(rows[0])
    lines = [f"2 vLLM servers x {args.clients} concurrent requests of {args.tokens} tokens, "
             f"budget {args.budget} (elastic floor {args.min_budget}), window {args.window}, "
             f"{args.policy}, arena {args.arena}; greedy, float32, CPU", "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    lines += ["", f"after both phases: {left['seqs']} sequences open, "
              f"{sum(a['bytes_pages'] for a in left['arenas'])} arena bytes in pages"]
    text = "\n".join(lines) + "\n"
    print(text)
    with open(os.path.join(out, "two_servers.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, "two_servers.json"), "w") as f:
        json.dump(rows, f, indent=1)
    bad = [r for r in rows if r["failed"]] or left["seqs"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
