# SPDX-License-Identifier: MIT
"""The Python binding (python/vase, built into build/python/vase) against a private vased.

Run by `make check` as `python3 -X dev -m pytest -q tests/python`, with PYTHONPATH=build/python;
VASE_BUILD_DIR names the build whose vased is started (default: ./build).
"""

import ctypes
import errno
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import vase

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("VASE_BUILD_DIR", os.path.join(REPO, "build"))

ES = {"f32": 4, "f16": 2, "bf16": 2}
TORCH_DTYPE = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


@pytest.fixture
def client(daemon):
    c = vase.connect(daemon, name="test_binding")
    yield c
    c.close()


def model(client, dtype="f32", block_tokens=16):
    return client.register_model(layers=2, q_heads=4, kv_heads=2, head_dim=8, dtype=dtype,
                                 block_tokens=block_tokens)


def connected_clients(run):
    """The ids of the clients vased lists (vasectl --json clients)."""
    out = subprocess.run([os.path.join(BUILD, "vasectl"), f"--runtime-dir={run}", "--json",
                          "clients"], check=True, capture_output=True, text=True).stdout
    return {c["client_id"] for c in json.loads(out)["clients"]}


def fill(seq, n):
    """Appends n tokens one at a time; how many appends applied a plan."""
    return sum(seq.append(1) for _ in range(n))


def append_until(seq, done, limit, what):
    """Appends tokens one at a time until done() holds; fails after limit tokens."""
    for _ in range(limit):
        if done():
            return
        seq.append(1)
    assert done(), what


def test_connect_ping_ids(daemon):
    with vase.connect(runtime_dir=daemon, name="ids", timeout_ms=2000) as c:
        assert isinstance(c, vase.Client)
        c.ping()
        assert c.client_id > 0
        assert c.incarnation != 0
        with vase.connect(daemon) as d:
            assert d.client_id != c.client_id
            assert d.incarnation == c.incarnation
        assert c.arena("default") == 0
        assert not c.closed
    assert c.closed
    c.close()  # idempotent
    with pytest.raises(vase.VaseError) as e:
        c.ping()
    assert e.value.errno == errno.EBADF


def test_connect_without_daemon(tmp_path):
    with pytest.raises(vase.VaseError) as e:
        vase.connect(str(tmp_path))
    assert e.value.errno == errno.ENOENT
    assert isinstance(e.value, OSError)
    with pytest.raises(ValueError):
        vase.connect(str(tmp_path), timeout_ms=-1)


def test_register(client):
    for dtype, names in [("f32", ["f32", "float32"]), ("f16", ["f16", "float16"]),
                         ("bf16", ["bf16", "bfloat16"])]:
        for name in names:
            m = client.register_model(3, 8, 2, 16, dtype=name, block_tokens=32, name="m")
            assert (m.layers, m.q_heads, m.kv_heads, m.head_dim) == (3, 8, 2, 16)
            assert m.dtype == dtype
            assert m.block_tokens == 32
            assert m.arena == 0
            assert m.page_bytes == 32 * 3 * 2 * 2 * 16 * ES[dtype]
    assert model(client, block_tokens=0).block_tokens == 16


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_kv_tensor(client, dtype):
    m = model(client, dtype)
    es = ES[dtype]
    k, v = m.kv_tensor(0, "k"), m.kv_tensor(layer=1, kv="v")
    blocks = (64 << 20) // m.page_bytes
    assert k.shape == (blocks, 16, 2, 8)
    assert k.strides == (m.page_bytes // es, 16, 8, 1)
    assert k.ndim == 4 and k.dtype == dtype and k.device == "cpu"
    assert k.__dlpack_device__() == (1, 0)
    # [layer][K,V][token][kv_head][dim] in a page: V of layer 1 is three K-sized blocks on.
    assert v.address - k.address == 3 * 16 * 2 * 8 * es

    tk = torch.from_dlpack(k)
    assert tk.dtype == TORCH_DTYPE[dtype]
    assert tuple(tk.shape) == k.shape and tk.stride() == k.strides
    assert tk.data_ptr() == k.address
    assert not tk.is_contiguous()
    # Newer consumers' keywords: the same view, never a copy or another device.
    assert torch.from_dlpack(k.__dlpack__(stream=None, max_version=(1, 0), dl_device=(1, 0),
                                          copy=False)).data_ptr() == k.address
    with pytest.raises(BufferError):
        k.__dlpack__(copy=True)
    with pytest.raises(BufferError):
        k.__dlpack__(dl_device=(2, 0))
    if dtype != "bf16":  # NumPy has no bfloat16
        a = np.from_dlpack(k)
        assert a.dtype == np.dtype("float32" if dtype == "f32" else "float16")
        assert a.shape == k.shape
        assert a.strides == tuple(s * es for s in k.strides)
        assert a.ctypes.data == k.address


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_write_through_torch_read_back(client, dtype):
    m = model(client, dtype)
    with m.open("streaming", budget=128) as s:
        k = torch.from_dlpack(m.kv_tensor(1, "k"))
        table = np.from_dlpack(s.block_table())
        slot = 21  # block table entry 1, token 5
        row = torch.arange(16, dtype=torch.float32).reshape(2, 8).to(TORCH_DTYPE[dtype]) + 1
        k[table[slot // 16], slot % 16] = row
        view = s.kv_slot(1, "k", slot)
        assert view.shape == (2, 8) and view.strides == (8, 1) and view.dtype == dtype
        # The same memory: the address libvase gives for the slot is the torch element's.
        assert view.address == k[table[slot // 16], slot % 16].data_ptr()
        assert torch.equal(torch.from_dlpack(view), row)
        raw = ctypes.string_at(view.address, 16 * ES[dtype])
        assert raw == row.contiguous().view(torch.uint8).numpy().tobytes()
        # V of the slot is elsewhere and untouched by the K write.
        assert s.kv_slot(1, "v", slot).address != view.address
        assert not torch.from_dlpack(s.kv_slot(1, "v", slot)).any()
        with pytest.raises(vase.VaseError) as e:
            s.kv_slot(1, "k", s.capacity)
        assert e.value.errno == errno.EINVAL


def test_block_table(client):
    m = model(client)
    with m.open("streaming", budget=128, window=64) as s:
        t = s.block_table()
        assert t.dtype == "int32" and t.ndim == 1 and t.device == "cpu"
        a = np.from_dlpack(t)
        assert a.dtype == np.int32
        assert len(a) == s.capacity // m.block_tokens
        blocks = (64 << 20) // m.page_bytes
        assert ((a >= 0) & (a < blocks)).all()
        assert len(set(a.tolist())) == len(a)
        tt = torch.from_dlpack(s.block_table())
        assert tt.dtype == torch.int32 and tt.tolist() == a.tolist()
        assert s.block_table_device() is None  # the host arena


def test_query_slot(client):
    m = model(client)
    with m.open("vase-attnv", budget=128, window=64) as s:
        q = s.query_slot(0, 0)
        assert q.shape == (4, 8) and q.strides == (8, 1) and q.dtype == "f32"
        tq = torch.from_dlpack(q)
        tq.copy_(torch.arange(32, dtype=torch.float32).reshape(4, 8))
        assert tq.data_ptr() == q.address
        assert np.frombuffer(ctypes.string_at(q.address, 128), np.float32).tolist() == \
            list(range(32))
        # The ring holds 2 * window entries: position 128 comes back to the entry of 0.
        assert s.query_slot(0, 128).address == q.address
        assert s.query_slot(0, 1).address != q.address
        assert s.query_slot(1, 0).address != q.address
        with pytest.raises(vase.VaseError) as e:
            s.query_slot(2, 0)
        assert e.value.errno == errno.EINVAL and "layer 2, but the model has 2 layers" in str(e.value)
    with m.open("streaming", budget=128) as s:
        with pytest.raises(vase.VaseError) as e:
            s.query_slot(0, 0)
        assert e.value.errno == errno.EINVAL
        # The rule that failed, and the policies that do keep a ring.
        assert "policy streaming reads no queries" in str(e.value)
        assert "vase-attnv" in str(e.value) and "snapkv" in str(e.value)


def test_eviction_sync(client):
    m = model(client)
    with m.open("streaming", budget=128, window=64, mode="sync") as s:
        assert fill(s, 191) == 0 and s.rounds == 0
        assert s.append(1) is True  # len 192 > budget and a multiple of the window
        assert s.rounds == 1 and s.len == 128 and s.position == 192
        assert s.poll() is False and s.wait() is False
        assert s.stats["evictions"] == 1
        s.flush()


def test_eviction_async(client):
    m = model(client)
    with m.open("streaming", budget=128, window=64, mode="async") as s:
        applied = fill(s, 192)
        applied += s.wait()
        assert applied == 1
        assert s.rounds == 1 and s.len == 128 + (s.position - 192)
        assert s.wait() is False
        assert s.stats["evictions"] == 1
        assert set(s.stats) == {"evictions", "stalls", "stall_seconds", "compact_seconds",
                                "last_plan_seconds", "budget_changes"}
        assert s.stats["budget_changes"] == 0


def test_table_shrinks_after_long_prompt(client):
    m = model(client)
    with m.open("streaming", budget=128, window=64, prompt_len=1000, mode="sync") as s:
        before = np.from_dlpack(s.block_table()).copy()
        assert len(before) * 16 >= 1000 + 64
        assert s.append(1000) is False
        applied = fill(s, 24)  # len 1024: the first trigger after the prompt
        assert applied == 1
        s.flush()
        after = np.from_dlpack(s.block_table())
        assert len(after) < len(before)
        assert (after == before[:len(after)]).all()
        assert s.capacity == len(after) * 16


def test_push_stats(client):
    m = model(client)
    with m.open("h2o", budget=128, window=64) as s:
        fill(s, 10)
        s.push_stats(0, "acc_add", np.ones((2, 10), np.float32))
        s.push_stats(layer=1, kind="window_scores", values=np.full((2, 4), 0.5, np.float32))
        s.flush()  # a refused push would be returned here
        with pytest.raises(ValueError):
            s.push_stats(0, "acc_add", np.ones((3, 10), np.float32))
        with pytest.raises(TypeError):
            s.push_stats(0, "acc_add", np.ones((2, 10), np.float64))
        with pytest.raises(TypeError):
            s.push_stats(0, "acc_add", np.ones((10, 2), np.float32).T)  # not C-contiguous
        with pytest.raises(vase.VaseError) as e:
            s.push_stats(0, "acc_add", np.full((2, 10), math.nan, np.float32))
        assert e.value.errno == errno.EINVAL
        with pytest.raises(vase.VaseError) as e:
            s.push_stats(0, "acc_add", np.ones((2, 11), np.float32))  # longer than len
        assert e.value.errno == errno.EINVAL
        with pytest.raises(vase.VaseError) as e:
            s.push_stats(0, "bogus", np.ones((2, 10), np.float32))
        assert e.value.errno == errno.EINVAL
        s.append(1)  # nothing deferred: the sequence still works


def test_set_draws(client):
    m = model(client)
    with m.open("vase-dkv", budget=128, window=64) as s:
        s.set_draws(gauss=np.ones((8, 20), np.float32))
        s.set_draws(exp_draws=np.ones(4, np.float32), gauss=None)
        with pytest.raises(vase.VaseError) as e:
            s.set_draws(exp_draws=np.full(4, -1.0, np.float32))
        assert e.value.errno == errno.EINVAL


def test_open_parameters(client):
    m = model(client)
    with m.open(policy="vase-attnv", budget=256, window=32, n_sink=2, n_large=16,
                temperature=0.5, rank=4, lambda_=0.25, smooth=3, metric="l2", seed=7,
                slack=0) as s:
        assert s.id > 0 and s.len == 0 and s.position == 0
    with pytest.raises(TypeError):
        m.open("streaming")  # no budget
    with pytest.raises(ValueError):
        m.open("streaming", budget=-1)


def test_admission_wait(client):
    m = model(client)
    # One sequence of about 50 MB fills the 64 MiB arena; a second one finds no room.
    with m.open("streaming", budget=196608, window=64, admission_wait_ms=0) as s:
        assert s.id > 0
        with pytest.raises(vase.VaseError) as e:
            m.open("streaming", budget=196608, window=64, admission_wait_ms=0)
        assert e.value.errno == errno.ENOSPC and "waited" not in str(e.value)
        with pytest.raises(vase.VaseError) as e:
            m.open("streaming", budget=196608, window=64, admission_wait_ms=100)
        assert e.value.errno == errno.ENOSPC and "waited 100 ms" in str(e.value)
    with pytest.raises(ValueError):
        m.open("streaming", budget=128, admission_wait_ms=-2)
    with pytest.raises(ValueError):
        m.open("streaming", budget=128, admission_wait_ms=600001)
    # The default (-1) is the daemon's setting, 0 here: there is room now, so it opens.
    with m.open("streaming", budget=196608, window=64) as s:
        assert s.id > 0


def test_elastic_open(client):
    m = model(client)
    with m.open("streaming", budget=128, window=32) as s:
        assert s.budget == 128 and s.min_budget == 128  # not elastic
        s.set_budget(128)  # its only budget
        with pytest.raises(vase.VaseError) as e:
            s.set_budget(64)
        assert e.value.errno == errno.EINVAL and "min_budget 128" in str(e.value)
    with m.open("streaming", budget=256, window=32, min_budget=64, weight=1000) as s:
        assert s.budget == 256 and s.min_budget == 64
    with m.open("streaming", budget=256, window=32, min_budget=None, weight=None) as s:
        assert s.min_budget == 256
    # min_budget: a multiple of window, above it, at most budget; weight at most 1000.
    for kw in (dict(min_budget=32), dict(min_budget=48), dict(min_budget=288),
               dict(min_budget=64, weight=1001)):
        with pytest.raises(vase.VaseError) as e:
            m.open("streaming", budget=256, window=32, **kw)
        assert e.value.errno == errno.EINVAL, kw
        assert ("weight" if "weight" in kw else "min_budget") in str(e.value)
    for kw in (dict(min_budget=-1), dict(weight=-1), dict(min_budget=1 << 32)):
        with pytest.raises(ValueError):
            m.open("streaming", budget=256, window=32, **kw)
    with pytest.raises(TypeError):
        m.open("streaming", budget=256, window=32, min_budget="64")


def test_protect_prompt(client):
    """random with the prompt protected: the prompt's rows stay in slots 0 .. prompt_len - 1."""
    m = model(client)
    with m.open("random", budget=128, window=32, prompt_len=40, mode="sync",
                protect_prompt=True) as s:
        for slot in range(40):
            torch.from_dlpack(s.kv_slot(0, "k", slot))[:] = slot + 1
        assert s.append(40) is False
        assert fill(s, 200) > 0 and s.rounds > 0
        for slot in range(40):
            assert (torch.from_dlpack(s.kv_slot(0, "k", slot)) == slot + 1).all(), slot
    # The prompt and the window must fit the budget.
    with pytest.raises(vase.VaseError) as e:
        m.open("random", budget=128, window=32, prompt_len=97, protect_prompt=True)
    assert e.value.errno == errno.EINVAL and "protect_prompt needs prompt_len" in str(e.value)
    with m.open("random", budget=128, window=32, prompt_len=97) as s:  # off: any prompt
        assert s.id > 0


def seq_info(run, seq_id):
    """The daemon's SeqInfo of a sequence (vasectl --json seq ID)."""
    out = subprocess.run([os.path.join(BUILD, "vasectl"), f"--runtime-dir={run}", "--json",
                          "seq", str(seq_id)], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def test_label(daemon, client):
    """label=: the daemon's SeqInfo and Seq.label have it; None and "" are none; labels the rule
    refuses (too long, a newline, a quote, non-ASCII, a NUL) raise VaseError(EINVAL) with
    libvase's reason, and open nothing."""
    m = model(client)
    label = "chatcmpl-8f2c:0/a@b+c=d.e_f-" + "9" * 36
    assert len(label) == 64
    with m.open("streaming", budget=128, window=32, label=label) as s:
        assert s.label == label
        assert seq_info(daemon, s.id)["label"] == label
    for none in (None, ""):
        with m.open("streaming", budget=128, window=32, label=none) as s:
            assert s.label == ""
            assert seq_info(daemon, s.id).get("label", "") == ""
    with m.open("streaming", budget=128, window=32) as s:
        assert s.label == ""
    refused = {"x" * 65: "label is longer than 64 bytes",
               "req\n1": "label byte 3 is 0x0a",
               'req"1': "label byte 3 is 0x22",
               "caf\u00e9": "label byte 3 is 0xc3",
               "req\x001": "label byte 3 is 0x00"}
    for bad, why in refused.items():
        with pytest.raises(vase.VaseError) as e:
            m.open("streaming", budget=128, window=32, label=bad)
        assert e.value.errno == errno.EINVAL, bad
        assert why in str(e.value), (bad, str(e.value))
    with pytest.raises(TypeError):
        m.open("streaming", budget=128, window=32, label=b"req-1")
    assert connected_clients(daemon)  # the daemon is still there
    out = subprocess.run([os.path.join(BUILD, "vasectl"), f"--runtime-dir={daemon}", "--json",
                          "seqs", str(client.client_id)], check=True, capture_output=True,
                         text=True).stdout
    assert json.loads(out).get("seqs", []) == []


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_set_budget(client, mode):
    m = model(client)
    with m.open("streaming", budget=128, window=32, min_budget=64, mode=mode) as s:
        fill(s, 200)
        assert s.rounds > 0 and s.budget == 128 and s.capacity == 192
        assert s.stats["budget_changes"] == 0
        for bad in (32, 96 + 1, 160):
            with pytest.raises(vase.VaseError) as e:
                s.set_budget(bad)
            assert e.value.errno == errno.EINVAL and "[min_budget 64, 128]" in str(e.value)
        s.set_budget(64)
        assert s.budget == 128  # until the next plan
        # The next plan keeps 64 tokens: the budget, length and capacity drop with it.
        rounds = s.rounds
        append_until(s, lambda: s.budget != 128, 3 * 32, "the lower budget was not applied")
        assert s.budget == 64
        # Capacity: the budget, a window of new tokens and one of slack (async runs ahead).
        assert s.rounds > rounds and s.capacity == 64 + 32 + 32
        assert s.stats["budget_changes"] == 1
        fill(s, 100)  # it stays there, evicting at its lower budget
        assert s.budget == 64 and s.capacity == 128 and s.len <= 128
        if mode == "sync":
            assert s.len <= 64 + 32
        # Back to 128: at a later commit, memory being free, the budget grows again.
        s.set_budget(128)
        rounds = s.rounds
        append_until(s, lambda: s.budget != 64, 3 * 32, "the budget did not grow back")
        assert s.budget == 128 and s.rounds > rounds and s.capacity == 192
        assert s.stats["budget_changes"] == 2
        # It holds more than a capacity of 128 (the lower budget's) could again.
        append_until(s, lambda: s.len > 128, 3 * 32, "no more than the lower budget's capacity")
        assert s.budget == 128
        with pytest.raises(vase.VaseError) as e:
            s.set_budget(48)
        assert e.value.errno == errno.EINVAL
        with pytest.raises(ValueError):
            s.set_budget(-1)
    with pytest.raises(vase.VaseError) as e:
        s.set_budget(64)
    assert e.value.errno == errno.EBADF


def test_errors(client):
    m = model(client)
    with pytest.raises(vase.VaseError) as e:
        m.open("no-such-policy", budget=128)
    assert e.value.errno == errno.EINVAL
    assert e.value.strerror == os.strerror(errno.EINVAL)
    assert "no-such-policy" in str(e.value)
    with pytest.raises(vase.VaseError) as e:
        m.open("streaming", budget=100, window=64)  # not a multiple of the window
    assert e.value.errno == errno.EINVAL
    assert "budget must be a multiple of window (budget 100, window 64; 64 or 128 would be)" in str(
        e.value
    )
    with pytest.raises(vase.VaseError) as e:
        m.open("snapkv", budget=64, window=64)
    assert "budget must be larger than window (budget 64 <= window 64)" in str(e.value)
    with pytest.raises(vase.VaseError) as e:
        m.open("vase-dkv", budget=128, window=32, smooth=4)
    assert "smooth must be odd, 1 .. 63 (smooth 4)" in str(e.value)
    with pytest.raises(vase.VaseError) as e:
        m.open("streaming", budget=128, mode="later")
    assert e.value.errno == errno.EINVAL
    with pytest.raises(vase.VaseError) as e:
        client.arena("no-such-arena")
    assert e.value.errno == errno.ENOENT
    with pytest.raises(vase.VaseError) as e:
        client.register_model(2, 4, 2, 8, arena=77)
    assert e.value.errno == errno.EINVAL
    with pytest.raises(vase.VaseError) as e:
        client.register_model(2, 4, 2, 8, block_tokens=1 << 22)
    assert e.value.errno == errno.EINVAL and "block_tokens" in str(e.value)
    with pytest.raises(vase.VaseError) as e:
        client.register_model(2, 4, 2, 8, dtype="f64")
    assert e.value.errno == errno.EINVAL
    with pytest.raises(vase.VaseError) as e:
        m.kv_tensor(2, "k")
    assert e.value.errno == errno.EINVAL and "layer 2 of 2" in str(e.value)
    with pytest.raises(vase.VaseError):
        m.kv_tensor(0, "q")
    with pytest.raises(TypeError):
        m.kv_tensor("0", "k")

    s = m.open("streaming", budget=128)
    s.close()
    s.close()  # idempotent
    assert s.closed
    for call in (lambda: s.append(1), s.poll, s.wait, s.flush, s.block_table,
                 lambda: s.len, lambda: s.kv_slot(0, "k", 0), lambda: s.budget,
                 lambda: s.min_budget, lambda: s.set_budget(128)):
        with pytest.raises(vase.VaseError) as e:
            call()
        assert e.value.errno == errno.EBADF
    with pytest.raises(TypeError):
        vase.Seq()


def test_views_keep_the_client_alive(daemon):
    c = vase.connect(daemon)
    m = model(c)
    s = m.open("vase-attnv", budget=128)
    kt = m.kv_tensor(0, "k")
    base = sys.getrefcount(kt)
    cap = kt.__dlpack__()
    assert sys.getrefcount(kt) == base + 1  # the capsule's DLManagedTensor holds it
    del cap  # never consumed: its destructor frees it
    assert sys.getrefcount(kt) == base
    k = torch.from_dlpack(kt)
    assert sys.getrefcount(kt) == base + 1
    # A consumer that refuses the capsule (NumPy has no bf16) leaves it to its destructor.
    bt = c.register_model(2, 4, 2, 8, dtype="bf16").kv_tensor(0, "v")
    bbase = sys.getrefcount(bt)
    with pytest.raises(RuntimeError, match="dtype"):
        np.from_dlpack(bt)
    assert sys.getrefcount(bt) == bbase
    del bt
    q = np.from_dlpack(s.query_slot(0, 3))  # read-only in NumPy 1.x
    qt = torch.from_dlpack(s.query_slot(0, 3))
    del kt
    c.close()
    assert c.closed
    with pytest.raises(vase.VaseError) as e:
        s.append(1)
    assert e.value.errno == errno.EBADF
    with pytest.raises(vase.VaseError) as e:
        m.kv_tensor(0, "k")
    assert e.value.errno == errno.EBADF
    # The mapping is still there under the views: write and read both.
    k[5, 3] = 7.0
    assert float(k[5, 3].sum()) == 7.0 * 16
    qt.fill_(2.0)
    assert float(q.sum()) == 2.0 * 32
    assert c.client_id in connected_clients(daemon)  # the disconnect waits for the views
    s.close()
    del k, q, qt, s, m  # the last views go: now the client disconnects
    for _ in range(500):  # the daemon sees the closed socket in its own time
        if c.client_id not in connected_clients(daemon):
            break
        time.sleep(0.01)
    assert c.client_id not in connected_clients(daemon)


def test_close_without_views_disconnects(daemon):
    c = vase.connect(daemon)
    model(c).open("streaming", budget=128)
    assert c.client_id in connected_clients(daemon)
    c.close()
    for _ in range(500):
        if c.client_id not in connected_clients(daemon):
            break
        time.sleep(0.01)
    assert c.client_id not in connected_clients(daemon)


def test_exception_type():
    e = vase.VaseError(errno.EINVAL, "Invalid argument", "what went wrong")
    assert isinstance(e, OSError) and e.errno == errno.EINVAL
    assert str(e) == "[Errno 22] Invalid argument: what went wrong"
    assert str(vase.VaseError(5, "Input/output error")) == "[Errno 5] Input/output error"


def test_close_while_another_thread_calls(daemon):
    """Calls release the GIL; a close() meanwhile waits for them, and later calls refuse."""
    import threading
    c = vase.connect(daemon)
    s = model(c).open("streaming", budget=128, window=64, mode="async")
    started = threading.Event()
    result = {"appended": 0}

    def engine():
        try:
            while True:
                s.append(1)
                s.poll()
                result["appended"] += 1
                started.set()
        except vase.VaseError as e:
            result["errno"] = e.errno
        started.set()

    t = threading.Thread(target=engine)
    t.start()
    started.wait()
    c.close()
    t.join()
    assert result["errno"] == errno.EBADF
    assert result["appended"] > 0
