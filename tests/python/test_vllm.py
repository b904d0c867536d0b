# SPDX-License-Identifier: MIT
"""vase.vllm: the plugin in vLLM's OpenAI-compatible server (the pinned CPU build), driven by
the openai client; and its loading rules, in fresh interpreters."""

import math
import os
import re
import subprocess
import sys
import time

import openai
import pytest

from conftest import BUILD, private_vased, stop_vased
from vllmutil import HeldRequest, Server, vasectl

# vLLM's line for an aborted request (the server runs with --enable-log-requests).
ABORTED = re.compile(r"Aborted request\(s\) (\S+)\.")

PROMPTS = ["#include <stdio.h>", "int main(void) {", "/* the cache */ static int x =",
           "def f(x):\n    return"]


def run_python(code, **env):
    e = dict(os.environ, PYTHONPATH=os.path.join(BUILD, "python"))
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e,
                          timeout=120)


def test_off_unless_switched_on():
    out = run_python(
        "import vase.vllm as v; v.register();"
        "from vllm.v1.worker.gpu_model_runner import GPUModelRunner as R;"
        "print(hasattr(R.execute_model, '__vase_original__'))", VASE_VLLM="0")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "False"


def test_on_patches_named_functions():
    out = run_python(
        "import vase.vllm as v; v.register(); v.register();"
        "from vllm.v1.worker.gpu_model_runner import GPUModelRunner as R;"
        "from vllm.v1.attention.backends.registry import AttentionBackendEnum as B;"
        "o = R.execute_model.__vase_original__;"
        "print(hasattr(o, '__vase_original__'), B.CPU_ATTN.get_path())", VASE_VLLM="1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-2:] == ["False", "vase.vllm.cpu.VaseCPUAttentionBackend"]


def test_refuses_another_vllm_version():
    out = run_python("import vase.vllm as v; v.vllm_version = lambda: '0.19.0'; v.register()",
                     VASE_VLLM="1")
    assert out.returncode != 0
    assert "vLLM 0.18.1" in out.stderr and "this is vLLM 0.19.0" in out.stderr


def test_bad_server_setting_stops_at_load():
    out = run_python("import vase.vllm as v; v.register()", VASE_VLLM="1",
                     VASE_VLLM_BUDGET="lots")
    assert out.returncode != 0 and "VASE_VLLM_BUDGET='lots': not an integer" in out.stderr


def test_label_is_the_request_id():
    from vase.vllm.runtime import label_of

    assert label_of("chatcmpl-6f1c2a-0") == "chatcmpl-6f1c2a-0"
    assert label_of("cmpl id\n\"é") == "cmpl_id____"
    assert label_of("x" * 80) == "x" * 64


@pytest.mark.parametrize("args, message", [
    ({"vase_budget": "64"}, "vase_budget must be an integer"),
    ({"vase_budget": 0}, "vase_budget 0 is outside"),
    ({"vase_policy": "lru"}, "vase_policy 'lru'"),
    ({"vase_mode": "later"}, "vase_mode 'later'"),
    ({"vase_bugdet": 64}, "unknown key 'vase_bugdet'"),
    ({"vase_weight": True}, "vase_weight must be an integer"),
])
def test_request_settings_checked(args, message):
    import vase.vllm as v

    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        v.check_args(args)
    v.check_args({"other_plugin_key": object()})  # not vase's


# ---- the server ----

@pytest.fixture(scope="module")
def run(tmp_path_factory):
    with private_vased(tmp_path_factory, "--arena-bytes=256M", "--granule-bytes=256K") as run:
        yield run


@pytest.fixture(scope="module")
def servers(run, tmp_path_factory):
    """vLLM without the plugin and vLLM with it, both up."""
    logs = tmp_path_factory.mktemp("vllm")
    plain = Server(str(logs / "plain.log"))
    vased = Server(str(logs / "vase.log"), run=run, plugin=True,
                   env={"VASE_VLLM_BUDGET": "1024", "VASE_VLLM_WINDOW": "32"},
                   args=("--enable-log-requests",))
    try:
        plain.wait_ready()
        vased.wait_ready()
        yield plain, vased
    finally:
        plain.stop()
        vased.stop()


def client_of(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", timeout=300,
                         max_retries=0)


def hold(server, run, prompt):
    """A 900-token streamed request, held live (HeldRequest)."""
    return HeldRequest(server, run, client_of(server), model="vase-tiny", max_tokens=900,
                       temperature=0, messages=[{"role": "user", "content": prompt}],
                       extra_body=dict(ignore_eos=True))


def chat(server, prompt, max_tokens, **extra):
    client = client_of(server)
    return client.chat.completions.create(
        model="vase-tiny", messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens, temperature=0, logprobs=True, top_logprobs=3,
        extra_body=dict(return_token_ids=True, **extra))


def token_ids(resp):
    return list(resp.choices[0].token_ids)


def wait_for(get, what, seconds=60):
    """get()'s first true value, polled for up to `seconds`."""
    deadline = time.monotonic() + seconds
    while not (got := get()):
        assert time.monotonic() < deadline, f"no {what} in {seconds} s"
        time.sleep(0.05)
    return got


def like_vllm(plain, vased):
    """Greedy, the budget above the length: the plugin's tokens are vLLM's."""
    for prompt in PROMPTS:
        a, b = chat(plain, prompt, 64), chat(vased, prompt, 64)
        assert token_ids(a) == token_ids(b), prompt
        # Every position's top-3 log-probabilities, to float32 noise (the two attend through
        # different kernels: vLLM's paged CPU kernel, and vase's over the arena's slots).
        la = [u.logprob for t in a.choices[0].logprobs.content for u in t.top_logprobs]
        lb = [u.logprob for t in b.choices[0].logprobs.content for u in t.top_logprobs]
        assert len(la) == len(lb) == 3 * 64
        assert max(abs(x - y) for x, y in zip(la, lb)) < 5e-5, prompt
    assert "vase.vllm: request" in vased.log_text()  # the requests went through vase


def test_budget_above_length_is_vllm_token_for_token(servers):
    plain, vased = servers
    like_vllm(plain, vased)
    # The default on a host arena of float32: the native step (vase.Batch), on torch's threads.
    assert re.search(r"attention native, \d+ threads", vased.log_text())


def test_gather_attention_is_vllm_token_for_token(servers, run, tmp_path):
    """VASE_VLLM_ATTENTION=gather: the Python step (vase.torch's gather and SDPA)."""
    plain, _ = servers
    server = Server(str(tmp_path / "gather.log"), run=run, plugin=True,
                    env={"VASE_VLLM_BUDGET": "1024", "VASE_VLLM_WINDOW": "32",
                         "VASE_VLLM_ATTENTION": "gather"})
    try:
        server.wait_ready()
        like_vllm(plain, server)
    finally:
        server.stop()
    assert "attention gather;" in server.log_text()


# h2o reads the attention each slot received, which the native step does not compute: its
# steps go through vase.torch's Python step (gather, explicit softmax).
@pytest.mark.parametrize("policy", ["vase-attnv", "h2o"])
def test_budget_below_length_evicts(servers, run, policy):
    plain, vased = servers
    before = vasectl(run, "status")["evictions_total"]
    resp = chat(vased, PROMPTS[0], 400, ignore_eos=True,
                vllm_xargs={"vase_budget": 96, "vase_window": 32, "vase_policy": policy})
    assert resp.usage.completion_tokens == 400
    text = resp.choices[0].message.content
    assert isinstance(text, str) and len(text) > 0
    assert all(math.isfinite(t.logprob) for t in resp.choices[0].logprobs.content)
    after = vasectl(run, "status")["evictions_total"]
    assert after - before >= (400 - 96) // 32 - 1
    log = vased.log_text()
    assert "evictions)" in log


def test_bad_request_settings_are_the_clients_error(servers):
    plain, vased = servers
    with pytest.raises(openai.BadRequestError, match="vase_policy"):
        chat(vased, PROMPTS[0], 8, vllm_xargs={"vase_policy": "lru"})
    assert len(token_ids(chat(vased, PROMPTS[1], 8))) == 8  # the server goes on


def test_sequences_closed_after_requests_and_aborts(servers, run):
    plain, vased = servers
    held = hold(vased, run, PROMPTS[2])
    try:
        held.stream.close()  # the client goes away while the request is live: vLLM aborts it
        ident = wait_for(lambda: ABORTED.findall(vased.log_text()), "vLLM's abort")[-1]
    finally:
        held.resume()
    # The request held a sequence, labelled with vLLM's id of the request (all of whose bytes
    # a label may hold, so the label is the id itself).
    assert re.fullmatch(r"chatcmpl-[0-9a-f-]+", ident)
    assert [s["label"] for s in held.seqs] == [ident]
    wait_for(lambda: not vasectl(run, "seqs")["seqs"], "the aborted request's sequence closed")
    assert len(token_ids(chat(vased, PROMPTS[3], 8))) == 8


# ---- failures: each costs only the requests concerned ----

def stream_tokens(server, prompt, max_tokens, **extra):
    """A streamed chat completion's chunks, one at a time."""
    client = client_of(server)
    return client.chat.completions.create(
        model="vase-tiny", messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens, temperature=0, stream=True,
        extra_body=dict(ignore_eos=True, **extra))


def test_no_room_fails_that_request_alone(servers, run):
    plain, vased = servers
    stream = stream_tokens(vased, PROMPTS[0], 600)
    next(iter(stream))
    # 256 MiB arena: a budget of 2M tokens (256 KiB per 128-token page) cannot be held.
    with pytest.raises(openai.InternalServerError):
        chat(vased, PROMPTS[1], 8, vllm_xargs={"vase_budget": 2000000})
    assert "request" in vased.log_text() and "no vase sequence" in vased.log_text()
    # Streamed, it fails before its first token: the stream ends with an error event.
    with pytest.raises(openai.APIError):
        for _ in stream_tokens(vased, PROMPTS[1], 8, vllm_xargs={"vase_budget": 2000000}):
            pass
    # The streamed request went on to its length, whenever the refusal came.
    assert [c.choices[0].finish_reason for c in stream if c.choices][-1] == "length"
    assert len(token_ids(chat(vased, PROMPTS[1], 8))) == 8


def test_vased_restart_fails_its_requests_then_serves_again(tmp_path):
    from conftest import start_vased

    run = str(tmp_path / "run")
    os.mkdir(run)
    proc = start_vased(run, "--arena-bytes=256M", "--granule-bytes=256K")
    server = Server(str(tmp_path / "vllm.log"), run=run, plugin=True)
    try:
        server.wait_ready()
        assert len(token_ids(chat(server, PROMPTS[0], 8))) == 8
        # Held as soon as its sequence opens: the failure comes before or after its first
        # token, and the stream reports it either way.
        held = hold(server, run, PROMPTS[1])
        try:
            proc.kill()  # vased dies with the live request's sequence
            proc.wait()
        finally:
            held.resume()
        with pytest.raises(openai.APIError):
            for _ in held.stream:
                pass
        held.stream.close()
        proc = start_vased(run, "--arena-bytes=256M", "--granule-bytes=256K")
        assert len(token_ids(chat(server, PROMPTS[2], 16))) == 16  # connected again
        assert vasectl(run, "seqs")["seqs"] == []
    finally:
        server.stop()
        stop_vased(proc)
    assert "vased went away" in server.log_text()


def test_killed_vllm_engine_leaks_no_page(run, tmp_path):
    clients = vasectl(run, "status")["clients"]  # the other server's, if it is connected
    pages = sum(a["bytes_pages"] for a in vasectl(run, "status")["arenas"])
    server = Server(str(tmp_path / "vllm.log"), run=run, plugin=True)
    try:
        server.wait_ready()
        held = hold(server, run, PROMPTS[0])
        assert held.seqs  # the request is live, on vased, when its engine dies
        for p in held.engines:
            p.kill()
        with pytest.raises(openai.APIError):
            for _ in held.stream:
                pass
    finally:
        server.stop()
    for _ in range(100):
        status = vasectl(run, "status")
        if status["clients"] == clients:
            break
        time.sleep(0.1)
    assert status["clients"] == clients
    assert sum(a["bytes_pages"] for a in status["arenas"]) == pages  # its pages came back
