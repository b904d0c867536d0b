# SPDX-License-Identifier: MIT
"""Fixtures shared by the Python tests: a private vased for each test module."""

import contextlib
import os
import signal
import subprocess
import time

import pytest

import vase

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("VASE_BUILD_DIR", os.path.join(REPO, "build"))


def start_vased(run, *settings):
    """Starts build/vased on runtime directory run and waits until it accepts a client."""
    log = open(os.path.join(run, "vased.log"), "w")
    proc = subprocess.Popen(
        [os.path.join(BUILD, "vased"), "--config=/dev/null", f"--runtime-dir={run}",
         "--metrics-address=off", *settings],
        stdout=log, stderr=subprocess.STDOUT)
    log.close()
    for _ in range(500):
        try:
            vase.connect(run).close()
            return proc
        except vase.VaseError:
            if proc.poll() is not None:
                raise RuntimeError(f"vased exited with {proc.returncode}")
            time.sleep(0.01)
    stop_vased(proc)
    raise RuntimeError("vased did not come up")


def stop_vased(proc, sig=signal.SIGTERM):
    proc.send_signal(sig)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def private_vased(tmp_path_factory, *settings):
    """A vased with these settings on a fresh runtime directory, which it yields."""
    run = str(tmp_path_factory.mktemp("run"))
    proc = start_vased(run, *settings)
    try:
        yield run
    finally:
        stop_vased(proc)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    """The runtime directory of a vased with a 64 MiB host arena of 64 KiB granules."""
    with private_vased(tmp_path_factory, "--arena-bytes=64M", "--granule-bytes=64K") as run:
        yield run
