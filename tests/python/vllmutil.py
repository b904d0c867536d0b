# SPDX-License-Identifier: MIT
"""What the tests of vase.vllm share: vLLM's server (examples/vllm/vllm_server.py) and vasectl."""

import json
import os
import subprocess
import sys
import threading
import time

from conftest import BUILD, REPO

sys.path.insert(0, os.path.join(REPO, "examples", "vllm"))

from vllm_server import Server  # noqa: E402,F401


def vasectl(run, *args):
    out = subprocess.run([os.path.join(BUILD, "vasectl"), f"--runtime-dir={run}", "--json",
                          *args], capture_output=True, text=True, timeout=30)
    if out.returncode:
        raise RuntimeError(f"vasectl {' '.join(args)}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def engine_cores(server):
    """The processes of vLLM's engine core under the server (they run the model and vase)."""
    import psutil

    found = [p for p in psutil.Process(server.proc.pid).children(recursive=True)
             if "EngineCore" in " ".join(p.cmdline()) + p.name()]
    assert found, "no EngineCore process"
    return found


class HeldRequest:
    """A streamed chat completion held while it runs: it is sent from a thread; as soon as
    vased lists a sequence, the server's engine core is stopped (SIGSTOP), so that the request
    can neither finish nor go on until resume(). Whatever a test then does to it (reads its
    sequence, aborts it, kills the engine) happens while it is live, however slow the machine.
    vased must hold no other sequence meanwhile."""

    def __init__(self, server, run, client, **create):
        self.engines = engine_cores(server)
        self.stream, self.error = None, None
        sender = threading.Thread(target=self._send, args=(client, create), daemon=True)
        sender.start()
        deadline = time.monotonic() + 120
        while not vasectl(run, "seqs")["seqs"]:
            assert time.monotonic() < deadline, "the request's sequence never opened"
            assert sender.is_alive() or self.stream is not None, self.error
            time.sleep(0.01)
        for p in self.engines:
            p.suspend()
        try:
            self.seqs = vasectl(run, "seqs")["seqs"]  # listed while the request cannot move
            sender.join(60)  # the server answers with its headers without the engine
            assert self.stream is not None, self.error or "no answer from the server"
        except BaseException:
            self.resume()
            raise

    def _send(self, client, create):
        try:
            self.stream = client.chat.completions.create(stream=True, **create)
        except BaseException as e:  # reported by the waiting thread
            self.error = e

    def resume(self):
        import psutil

        for p in self.engines:
            try:
                p.resume()
            except psutil.NoSuchProcess:
                pass  # killed by the test
