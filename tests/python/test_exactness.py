# SPDX-License-Identifier: MIT
"""A transformers model through vase, without eviction, is the plain model.

The shipped checkpoint (examples/llm/model, loaded by transformers) reads a document through a
vase.hf.VaseCache (keys, values and queries in vased's arena, attention through each
sequence's block table) with a budget above the sequence's length, and through transformers'
DynamicCache: the logits of every position must agree to 1e-5 in float32, for the prompt read
in one step and for every token after it read one at a time, for two sequences of a batch (sync
and async mode, pages of 16 and of 1 token in two models of one arena).
"""

import pytest
import torch
from transformers import DynamicCache

import vase
import vase.hf
from vase.torch import SeqSpec

from hfutil import document, read, shipped

PROMPT, TOKENS = 64, 200


@pytest.mark.parametrize("block", [16, 1])
def test_logits_through_vase_equal_the_plain_cache(daemon, block):
    net = shipped()
    tokens = document(TOKENS)
    plain = read(net, tokens, DynamicCache(config=net.config), 2, PROMPT)
    # A budget above the sequence: the trigger never fires.
    specs = [SeqSpec(policy="vase-attnv", budget=384, window=64, mode="sync"),
             SeqSpec(policy="h2o", budget=320, window=64, mode="async")]
    with vase.connect(daemon, name="test_exactness") as client:
        with vase.hf.VaseCache(client, net.config, specs=specs, block_tokens=block) as cache:
            through = read(net, tokens, cache, 2, PROMPT)
            assert cache.evictions() == [0, 0]
            assert [s.len for s in cache.seqs] == [TOKENS, TOKENS]
    diff = (through - plain).abs().max().item()
    print(f"max_abs_logit_diff={diff:.3g} (block {block}, {TOKENS} tokens, 2 sequences)")
    assert plain.abs().max().item() > 1.0  # the logits are not all zero
    assert diff <= 1e-5
