# SPDX-License-Identifier: MIT
"""vase.Batch (Model.batch()): an engine step over many sequences in three native calls, against
VaseCache's Python step over the same tokens (the gather path, then the same appends and polls):
outputs, what the arena holds after evictions, the query rings; tokens that are not vase's; the
refusals, each of which leaves the sequences as they were; and a failure of one sequence's calls
that leaves the others going on."""

import errno

import pytest
import torch

import vase
from vase import _vase
from vase.torch import SeqSpec, VaseCache

from test_attention import arena, random_tables

L, H, KV, D = 2, 8, 2, 32


def flat(counts, width=(H + 2 * KV) * D):
    """The step's q, k and v as vLLM hands them: [tokens, heads, D] slices of one fused QKV
    projection (strided rows), and the [rows, n] gather of the flat tokens into rows."""
    T = sum(counts)
    qkv = torch.randn(T, width)
    q = qkv[:, : H * D].view(T, H, D)
    k = qkv[:, H * D : (H + KV) * D].view(T, KV, D)
    v = qkv[:, (H + KV) * D :].view(T, KV, D)
    n = max(counts)
    idx = torch.zeros(len(counts), n, dtype=torch.long)
    real = torch.zeros(len(counts), n, dtype=torch.bool)
    at = 0
    for i, c in enumerate(counts):
        idx[i, :c] = torch.arange(at, at + c)
        real[i, :c] = True
        at += c
    return q, k, v, idx, real


def pair(daemon, specs, prompts):
    """Two caches of the same sequences, each its own model: VaseCache's Python step (gather)
    and the one that Batch drives."""
    client = vase.connect(runtime_dir=daemon)
    ref = VaseCache(client, L, H, KV, D, specs, prompt_len=prompts, block_tokens=16,
                    attention="gather")
    mine = VaseCache(client, L, H, KV, D, specs, prompt_len=prompts, block_tokens=16,
                     attention="gather")
    return client, ref, mine


def same_state(ref, mine):
    for i in range(len(ref.seqs)):
        assert (ref.seqs[i].len, ref.seqs[i].position, ref.seqs[i].rounds) == (
            mine.seqs[i].len, mine.seqs[i].position, mine.seqs[i].rounds)
        for layer in range(L):
            a, b = ref.held(i, layer), mine.held(i, layer)
            assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), (i, layer)
            if ref.rings[i] is not None:
                for e in range(len(ref.rings[i][layer])):
                    assert torch.equal(ref.rings[i][layer][e], mine.rings[i][layer][e])


@pytest.mark.parametrize("threads", [1, 2])
def test_batch_is_the_python_step(daemon, threads):
    # Two deterministic policies (one reading queries, so its ring is written too), a prefill of
    # different lengths (one longer than the ring: only its last queries stay), then decode
    # steps past several evictions, with a step where one sequence brings no token.
    torch.manual_seed(threads)
    specs = [SeqSpec(policy="snapkv", budget=64, window=16, mode="sync"),
             SeqSpec(policy="streaming", budget=64, window=16, mode="sync")]
    client, ref, mine = pair(daemon, specs, [40, 3])
    batch = mine.model.batch()
    steps = [[40, 3], [1, 1], [0, 2]] + [[1, 1]] * 120
    try:
        for counts in steps:
            q, k, v, idx, real = flat(counts)
            batch.begin(list(mine.seqs), counts)
            assert batch.active and batch.tokens == sum(counts)
            out = torch.full((sum(counts), H, D), 7.0)
            for layer in range(L):
                ref.append(layer, k[idx], v[idx], q[idx], real)
                expect = ref.attend(layer, q[idx], real, 0.2)[real]
                batch.layer(layer, q, k, v, out, 0.2, threads)
                assert (out - expect).abs().max().item() < 2e-6
            ref.step_done()
            assert batch.finish() == []
            assert not batch.active
            same_state(ref, mine)
        assert min(s.rounds for s in mine.seqs) >= 3
    finally:
        ref.close()
        mine.close()
        client.close()


def test_tokens_that_are_not_vases(daemon):
    # A None in the list: its tokens' rows are zeros, nothing of them is stored, and the
    # sequences around it are served as if it were not there.
    torch.manual_seed(3)
    specs = [SeqSpec(policy="streaming", budget=64, window=16, mode="sync")] * 2
    client, ref, mine = pair(daemon, specs, [4, 2])
    batch = mine.model.batch()
    try:
        q, k, v, idx, real = flat([4, 3, 2])
        batch.begin([mine.seqs[0], None, mine.seqs[1]], [4, 3, 2])
        out = torch.full((9, H, D), 7.0)
        keep = torch.tensor([0, 2])
        for layer in range(L):
            ref.append(layer, k[idx[keep]], v[idx[keep]], q[idx[keep]], real[keep])
            expect = ref.attend(layer, q[idx[keep]], real[keep], 0.2)[real[keep]]
            batch.layer(layer, q, k, v, out, 0.2)
            assert bool((out[4:7] == 0).all())
            mask = torch.ones(9, dtype=torch.bool)
            mask[4:7] = False
            assert (out[mask] - expect).abs().max().item() < 2e-6
        ref.step_done()
        assert batch.finish() == []
        same_state(ref, mine)
    finally:
        ref.close()
        mine.close()
        client.close()


def test_refusals_leave_the_sequences_as_they_were(daemon):
    client = vase.connect(runtime_dir=daemon)
    model = client.register_model(L, H, KV, D, block_tokens=16)
    other = client.register_model(L, H, KV, D, block_tokens=16)
    s = model.open(policy="streaming", budget=32, window=16, prompt_len=4)
    t = other.open(policy="streaming", budget=32, window=16, prompt_len=4)
    batch = model.batch()
    try:
        q, k, v, _, _ = flat([4])
        out = torch.zeros(4, H, D)
        with pytest.raises(RuntimeError, match="no step begun"):
            batch.layer(0, q, k, v, out, 0.2)
        with pytest.raises(RuntimeError, match="no step begun"):
            batch.finish()
        with pytest.raises(ValueError, match="1 sequences but 2 counts"):
            batch.begin([s], [4, 1])
        with pytest.raises(TypeError, match="must be lists"):
            batch.begin((s,), (4,))
        with pytest.raises(TypeError, match="neither a Seq nor None"):
            batch.begin([object()], [1])
        with pytest.raises(ValueError, match="not of this batch's model"):
            batch.begin([t], [1])
        with pytest.raises(ValueError, match="count out of range"):
            batch.begin([s], [-1])
        with pytest.raises(ValueError, match="count out of range"):
            batch.begin([None], [(1 << 20) + 1])
        with pytest.raises(ValueError, match=r"tokens in one step: at most 1048576"):
            batch.begin([None, None], [1 << 20, 1])
        # Each token's row holds its sequence's table: a step whose tables would pass 2^28
        # entries is refused (here 2^20 tokens and a sequence of 257 blocks).
        long = model.open(policy="streaming", budget=4096, window=16, prompt_len=4096)
        long.append(4096)
        with pytest.raises(ValueError, match="tokens times blocks"):
            batch.begin([None, long], [(1 << 20) - 1, 1])
        long.close()
        # More tokens than its capacity: refused before anything is written.
        with pytest.raises(vase.VaseError, match="do not fit") as e:
            batch.begin([s], [s.capacity + 1])
        assert e.value.errno == errno.ENOSPC and not batch.active
        batch.begin([s], [4])
        for bad, error, match in [
            (dict(q=q.double()), TypeError, "q must be float32"),
            (dict(k=k[:3]), ValueError, "at least the step's 4 tokens"),
            (dict(v=v.transpose(1, 2)), ValueError, "v must be"),
            (dict(out=torch.zeros(8, H, D)[::2]), ValueError, "out must be contiguous"),
            (dict(q=[1.0]), TypeError, "q must be a tensor"),
            (dict(layer=L), ValueError, f"layer {L}: the model has {L}"),
            (dict(scale=float("inf")), ValueError, "scale is not a finite"),
        ]:
            args = dict(layer=0, q=q, k=k, v=v, out=out, scale=0.2)
            args.update(bad)
            with pytest.raises(error, match=match):
                batch.layer(**args)
        assert s.len == 0 and batch.active
        # A close during the step waits for its end; the step's tokens are counted first.
        s.close()
        for layer in range(L):
            batch.layer(layer, q, k, v, out, 0.2)
        assert batch.finish() == []
        with pytest.raises(vase.VaseError, match="closed"):
            batch.begin([s], [1])
        # Cancel drops a step without counting it.
        u = model.open(policy="streaming", budget=32, window=16, prompt_len=4)
        batch.begin([u], [4])
        batch.cancel()
        assert u.len == 0 and not batch.active
        u.close()
    finally:
        t.close()
        client.close()


def test_one_sequences_failure_leaves_the_others(daemon):
    # NaN keys in one sequence: the daemon refuses its plan, its next call says so, and finish()
    # reports it alone; the other sequence goes on through the same steps.
    torch.manual_seed(5)
    client = vase.connect(runtime_dir=daemon)
    model = client.register_model(L, H, KV, D, block_tokens=16)
    good = model.open(policy="snapkv", budget=32, window=16, prompt_len=4, mode="sync")
    bad = model.open(policy="snapkv", budget=32, window=16, prompt_len=4, mode="sync")
    batch = model.batch()
    failures = []
    try:
        for step in range(80):
            counts = [4, 4] if step == 0 else [1, 1]
            seqs = [good, bad] if not failures else [good, None]
            q, k, v, _, _ = flat(counts)
            if step == 10:
                k[len(k) - 1] = float("nan")
            batch.begin(seqs, counts)
            out = torch.empty(sum(counts), H, D)
            for layer in range(L):
                batch.layer(layer, q, k, v, out, 0.2)
            failed = batch.finish()
            if failed:
                assert not failures
                failures = failed
        assert len(failures) == 1 and failures[0][0] == 1
        assert "NaN" in failures[0][2]
        assert good.rounds >= 3 and good.position == 4 + 79
    finally:
        client.close()


def test_batch_needs_a_host_arena_of_float32(daemon):
    client = vase.connect(runtime_dir=daemon)
    try:
        with pytest.raises(ValueError, match="a batch takes float32"):
            client.register_model(L, H, KV, D, dtype="bf16").batch()
    finally:
        client.close()


@pytest.mark.parametrize("threads", [2, 3, 64, 1000])
def test_threads_give_the_same_bits(threads):
    # The threads split the sequences: every output row is computed by the same code on one
    # thread, so the result does not depend on their number.
    torch.manual_seed(threads)
    _, k, v = arena(64, 16, 2, 32, torch.float32)
    lengths = [1, 40, 200, 17, 0, 90, 300]
    table = random_tables(len(lengths), lengths, 16, 64, 20)
    visible = torch.tensor(lengths, dtype=torch.int32).view(-1, 1)
    q = torch.randn(len(lengths), 1, 8, 32)
    one, many = torch.empty(q.shape), torch.empty(q.shape)
    _vase.paged_attention(q, k, v, table, visible, one, 0.3)
    _vase.paged_attention(q, k, v, table, visible, many, 0.3, threads)
    assert torch.equal(one, many)


def test_threads_refuse_before_any_row_is_written():
    _, k, v = arena(8, 16, 2, 32, torch.float32)
    table = torch.tensor([[0], [1], [2], [9]], dtype=torch.int32)  # the last row's is no block
    visible = torch.full((4, 1), 5, dtype=torch.int32)
    out = torch.full((4, 1, 8, 32), 5.0)
    with pytest.raises(ValueError, match=r"table\[3\]\[0\] = 9"):
        _vase.paged_attention(torch.randn(4, 1, 8, 32), k, v, table, visible, out, 0.3, 2)
    assert bool((out == 5.0).all())
