# SPDX-License-Identifier: MIT
"""vLLM's OpenAI-compatible server for the examples and tests of vase.vllm: the shipped
checkpoint, float32, on the CPU, started through serve.sh (the environment the CPU build needs),
with or without the plugin."""

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BUILD = os.environ.get("VASE_BUILD_DIR") or os.path.join(REPO, "build")
MODEL = os.path.join(REPO, "examples", "llm", "model")
SERVE = os.path.join(HERE, "serve.sh")
# The shipped checkpoint has no chat template: each message's text on its own line.
CHAT_TEMPLATE = os.path.join(HERE, "chat_template.jinja")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`vllm serve` of the shipped checkpoint (served as "vase-tiny") on a free port; plugin:
    VASE_VLLM=1 against the daemon of runtime directory run. Its output goes to log_path;
    stop() ends it (SIGTERM to its process group, then SIGKILL)."""

    def __init__(self, log_path, run=None, plugin=False, env=None, args=()):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        e = dict(os.environ)
        e.update(PYTHONPATH=os.path.join(BUILD, "python"), VASE_VLLM="1" if plugin else "0",
                 VASE_BUILD_DIR=BUILD, HF_HUB_OFFLINE="1", PYTHON=sys.executable)
        e.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        if run is not None:
            e["VASE_RUNTIME_DIR"] = run
        e.update(env or {})
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen(
                [SERVE, MODEL, "--host", "127.0.0.1", "--port", str(self.port), "--dtype",
                 "float32", "--enforce-eager", "--max-model-len", "1024", "--seed", "0",
                 "--chat-template", CHAT_TEMPLATE, "--served-model-name", "vase-tiny", *args],
                stdout=log, stderr=subprocess.STDOUT, env=e, start_new_session=True)

    def wait_ready(self, timeout=300):
        end = time.time() + timeout
        while time.time() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode}:\n"
                                   + self.log_errors() + self.log_tail())
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError("vllm serve did not come up:\n" + self.log_tail())

    def log_text(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def log_errors(self, n=12):
        """The log's first n error lines (the cause; its last lines are often a consequence)."""
        lines = [l for l in self.log_text().splitlines(keepends=True)
                 if " ERROR " in l or "Error:" in l or "Error(" in l]
        return "".join(lines[:n]) + ("...\n" if lines else "")

    def log_tail(self, n=40):
        return "".join(self.log_text().splitlines(keepends=True)[-n:])

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode
