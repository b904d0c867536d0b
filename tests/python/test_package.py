# SPDX-License-Identifier: MIT
"""The package as a user installs it: `pip install ./python` from the built tree and a wheel
of it (what `make wheel` runs), each into a fresh virtual environment, imported outside the
repository, and model.generate() through vase.hf.VaseCache against a running vased.

The fresh environments get PyTorch and transformers from this test's own environment (a .pth
file naming its site-packages) instead of installing them again: what is checked is the vase
package, built and installed by pip, not PyPI.
"""

import glob
import os
import subprocess
import sys
import sysconfig
import textwrap

from conftest import BUILD
from hfutil import REPO

SCRIPT = textwrap.dedent("""
    import os, sys, torch
    import vase, vase.hf
    from transformers import Qwen3Config, Qwen3ForCausalLM
    where = os.path.dirname(vase.__file__)
    assert where.startswith(sys.prefix), (where, sys.prefix)
    assert vase._vase.__file__.endswith(".abi3.so"), vase._vase.__file__
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                      attn_implementation="vase")
    net = Qwen3ForCausalLM(cfg).eval()
    with vase.connect(sys.argv[1], name="installed") as client, \\
            vase.hf.VaseCache(client, cfg, budget=32, window=16) as cache, torch.no_grad():
        out = net.generate(input_ids=torch.ones(2, 5, dtype=torch.long), max_new_tokens=60,
                           past_key_values=cache, do_sample=False, pad_token_id=0)
        print("generated", tuple(out.shape), "evictions", cache.evictions(), "from", where)
""")


def run(args, **kw):
    p = subprocess.run(args, capture_output=True, text=True, timeout=600, **kw)
    assert p.returncode == 0, f"{args}: exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p.stdout


def fresh_env(path):
    run([sys.executable, "-m", "venv", path])
    py = os.path.join(path, "bin", "python")
    site = run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip()
    with open(os.path.join(site, "outer.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    return py


def pip(py, *args):
    env = dict(os.environ, VASE_BUILD_DIR=BUILD, PIP_NO_INDEX="1")
    env.pop("PYTHONPATH", None)
    return run([py, "-m", "pip", "--disable-pip-version-check", "--no-input", *args], env=env,
               cwd=REPO)


def use(py, daemon, cwd):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = run([py, "-c", SCRIPT, daemon], cwd=cwd, env=env)
    assert "generated (2, 65)" in out and "evictions [0, 0]" not in out, out
    return out


def test_pip_install_and_wheel(daemon, tmp_path):
    before = sorted(os.listdir(os.path.join(REPO, "python")))
    py = fresh_env(str(tmp_path / "env"))
    pip(py, "install", "--no-deps", "--no-build-isolation", "./python")
    print(use(py, daemon, str(tmp_path)))
    # The build left nothing in the source tree (setup.py builds under the build directory).
    assert sorted(os.listdir(os.path.join(REPO, "python"))) == before

    wheels = str(tmp_path / "wheels")
    pip(py, "wheel", "--no-deps", "--no-build-isolation", "-w", wheels, "./python")
    (wheel,) = glob.glob(os.path.join(wheels, "vase-*.whl"))
    assert "-cp311-abi3-" in os.path.basename(wheel), wheel
    pip(py, "uninstall", "--yes", "vase")
    pip(py, "install", "--no-deps", wheel)
    print(use(py, daemon, str(tmp_path)))
