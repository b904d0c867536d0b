# SPDX-License-Identifier: MIT
"""The vLLM examples that docs/performance.md reports, run as documented but cut short:
examples/vllm/bench.py (vLLM, then the plugin with each attention) and
examples/vllm/two_servers.py (two servers on one vased, static then elastic budgets)."""

import csv
import json
import os
import subprocess
import sys

from conftest import BUILD, REPO, private_vased

VLLM = os.path.join(REPO, "examples", "vllm")


def run_example(script, *args, env=None):
    out = subprocess.run([sys.executable, os.path.join(VLLM, script), *args],
                         capture_output=True, text=True, timeout=1200,
                         env=dict(os.environ, VASE_BUILD_DIR=BUILD, **(env or {})))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def test_bench_one_round(tmp_path_factory, tmp_path):
    with private_vased(tmp_path_factory, "--arena-bytes=256M", "--granule-bytes=256K") as run:
        text = run_example("bench.py", "--rounds", "1", "--batch", "2", "--tokens", "256",
                           "--out", str(tmp_path), env={"VASE_RUNTIME_DIR": run})
    with open(tmp_path / "bench.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["config"], r["attention"], r["budget"]) for r in rows] == [
        ("vllm", "-", "-"), ("vase-full", "gather", "1024"), ("vase-quarter", "gather", "64"),
        ("vase-full", "paged-cpu", "1024"), ("vase-quarter", "paged-cpu", "64")]
    assert all(float(r["tok_s"]) > 0 for r in rows)
    # The plugin's rows are measured on vased (its sequences' pages), a quarter budget in
    # fewer of them than a full one; vLLM's from its block manager.
    kv = {(r["config"], r["attention"]): float(r["kv_mib"]) for r in rows}
    for attention in ("gather", "paged-cpu"):
        assert kv[("vase-full", attention)] > kv[("vase-quarter", attention)] > 0
    assert kv[("vllm", "-")] > 0
    assert (tmp_path / "bench.md").read_text() in text


def test_two_servers_both_phases(tmp_path):
    # 4 MiB: three sequences at the budget of 256, so the two servers' four requests of 320
    # tokens do not all fit at once: static ones wait, elastic ones shrink or open lower.
    run_example("two_servers.py", "--arena", "4M", "--clients", "2", "--tokens", "320",
                "--out", str(tmp_path))
    with open(tmp_path / "two_servers.json") as f:
        rows = json.load(f)
    assert [r["phase"] for r in rows] == ["static", "elastic"]
    for r in rows:
        assert r["requests"] == r["admitted"] == 4 and r["failed"] == 0, r
        assert r["tok_s"] > 0 and r["ttft_p99_s"] >= r["ttft_p50_s"] > 0, r
        assert 0 < r["peak_arena_mib"] <= 4, r
    assert rows[0]["budget_shrinks"] == 0
    assert "after both phases: 0 sequences open, 0 arena bytes in pages" in (
        tmp_path / "two_servers.md").read_text()


def test_make_model(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    run_example("make_model.py", "--out", str(tmp_path), "--hidden", "64", "--layers", "3",
                "--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--intermediate", "96")
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32)
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads,
            cfg.num_key_value_heads, cfg.head_dim) == (64, 3, 4, 2, 16)
    assert (tmp_path / "tokenizer.json").exists()
    logits = model(torch.tensor([[256, 65, 66]])).logits
    assert logits.shape == (1, 3, cfg.vocab_size) and bool(torch.isfinite(logits).all())
