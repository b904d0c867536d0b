# SPDX-License-Identifier: MIT
"""The PyTorch engine through vase, without eviction, is the plain model.

The shipped checkpoint (examples/llm/model) reads a held-out document through a VaseCache (keys,
values and queries in vased's arena, attention through each sequence's block table) with a budget
above the sequence's length, and through the plain contiguous cache: the logits of every
position must agree to 1e-5 in float32, for the prompt read in one step and for every token after
it read one at a time, for two sequences of a batch (sync and async mode, pages of 16 and of 1
token in two models of one arena).
"""

import os
import sys

import pytest
import torch

import vase

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "examples", "llm"))

import model as llm  # noqa: E402
from tokenizer import ByteTokenizer  # noqa: E402
from vase_cache import SeqSpec, VaseCache  # noqa: E402

MODEL = os.path.join(REPO, "examples", "llm", "model")
DOCUMENT = os.path.join(REPO, "README.md")
PROMPT, TOKENS = 100, 300


def read(net, tokens, cache, batch):
    """Logits [batch, TOKENS, vocab]: the prompt in one forward, then one token per forward."""
    return llm.score(net, tokens.expand(batch, -1), lambda: cache, chunk=PROMPT)


@pytest.mark.parametrize("block", [16, 1])
def test_logits_through_vase_equal_the_plain_cache(daemon, block):
    torch.manual_seed(0)
    net = llm.Model.load(MODEL).eval()
    cfg = net.config
    tok = ByteTokenizer.load(os.path.join(MODEL, "tokenizer.json"))
    with open(DOCUMENT, "rb") as f:
        tokens = torch.tensor(tok.encode(f.read())[:TOKENS], dtype=torch.long)
    assert tokens.numel() == TOKENS

    plain = read(net, tokens, llm.ContiguousCache(), 2)
    # A budget above the sequence: the trigger never fires.
    specs = [SeqSpec(policy="vase-attnv", budget=384, window=64, mode="sync"),
             SeqSpec(policy="h2o", budget=320, window=64, mode="async")]
    with vase.connect(daemon, name="test_exactness") as client:
        with VaseCache(client, cfg.num_hidden_layers, cfg.num_attention_heads,
                       cfg.num_key_value_heads, cfg.head_dim, specs, prompt_len=PROMPT,
                       block_tokens=block) as cache:
            through = read(net, tokens, cache, 2)
            assert cache.evictions() == [0, 0]
            assert [s.len for s in cache.seqs] == [TOKENS, TOKENS]
    diff = (through - plain).abs().max().item()
    print(f"max_abs_logit_diff={diff:.3g} (block {block}, {TOKENS} tokens, 2 sequences)")
    assert plain.abs().max().item() > 1.0  # the logits are not all zero
    assert diff <= 1e-5
