# SPDX-License-Identifier: MIT
"""examples/vllm/quality.py: the quality harness's protocol through vLLM with vase.vllm, beside
vase.hf's; --quick, and its check of the rows that must match between the paths."""

import csv
import os
import subprocess
import sys

from conftest import BUILD, REPO

sys.path.insert(0, os.path.join(REPO, "examples", "vllm"))

import quality  # noqa: E402

SCRIPT = os.path.join(REPO, "examples", "vllm", "quality.py")


def test_quick_paths_agree(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, VASE_BUILD_DIR=BUILD)
    run = subprocess.run([sys.executable, SCRIPT, "--quick", "--out", str(out), "--vased",
                          os.path.join(BUILD, "vased")], capture_output=True, text=True,
                         env=env, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    with open(out / "quality.csv") as f:
        rows = list(csv.DictReader(f))
    got = {(r["mode"], r["policy"]) for r in rows}
    assert got == {("-", "plain"), ("sync", "full"), ("sync", "streaming"),
                   ("sync", "snapkv"), ("sync", "vase-attnv")}
    for r in rows:
        # Fresh daemons: the same sequence ids, so vase-attnv's draws too; every row checked.
        assert r["same_sequence_ids"] == "1" and r["checked"] == "1", r
        assert r["evictions_hf"] == r["evictions_vllm"], r
    assert int(next(r for r in rows if r["policy"] == "streaming")["evictions_vllm"]) > 0
    table = [l for l in (out / "quality.md").read_text().splitlines() if l.startswith("|")]
    assert len(table) == len(rows) + 2


def fake_row(policy, mode, ppl_hf, ppl_vllm, seqs=(1, 2)):
    row = quality.Row(policy, 64, mode)
    for path, ppl, seq in (("hf", ppl_hf, seqs[0]), ("vllm", ppl_vllm, seqs[1])):
        r = row.runs[path]
        r.nll, r.top1, r.kl = [quality.math.log(ppl)], [True], [0.0]
        row.seqs[path] = [seq]
    row.kl, row.top1 = [0.0], [True]
    return row


def test_check_rows():
    args = quality.parse_args(["--quick"])
    assert args.tolerance == 1e-4
    ok = [fake_row("snapkv", "sync", 10.0, 10.0005), fake_row("full", "async", 10.0, 10.0),
          # draws from different sequence ids, or async plans: not checked
          fake_row("random", "sync", 10.0, 11.0), fake_row("streaming", "async", 10.0, 12.0)]
    assert quality.check(args, ok) == []
    bad = [fake_row("snapkv", "sync", 10.0, 10.01),
           fake_row("random", "sync", 10.0, 11.0, seqs=(3, 3)),
           fake_row("full", "async", 10.0, float("nan"))]
    problems = quality.check(args, bad)
    assert len(problems) == 4, problems  # the NaN: not finite, and its perplexity differs
    assert "snapkv 64" in problems[1] and "random 64" in problems[2]
