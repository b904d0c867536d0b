# SPDX-License-Identifier: MIT
"""What the tests of vase.vllm share: vLLM's server (examples/vllm/vllm_server.py) and vasectl."""

import json
import os
import subprocess
import sys

from conftest import BUILD, REPO

sys.path.insert(0, os.path.join(REPO, "examples", "vllm"))

from vllm_server import Server  # noqa: E402,F401


def vasectl(run, *args):
    out = subprocess.run([os.path.join(BUILD, "vasectl"), f"--runtime-dir={run}", "--json",
                          *args], capture_output=True, text=True, timeout=30)
    if out.returncode:
        raise RuntimeError(f"vasectl {' '.join(args)}: {out.stderr.strip()}")
    return json.loads(out.stdout)
