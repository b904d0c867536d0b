# SPDX-License-Identifier: MIT
"""vase: the engine's side of vased from Python, over libvase (lib/vase.h).

Connect to the daemon, register a model, open sequences, and reach the shared arena through
zero-copy tensors that torch.from_dlpack() and numpy.from_dlpack() take as they are::

    import torch, vase
    with vase.connect() as c:
        m = c.register_model(layers=2, q_heads=4, kv_heads=2, head_dim=64, dtype="f16")
        k = torch.from_dlpack(m.kv_tensor(0, "k"))  # [num_blocks][block_tokens][kv_heads][dim]
        with m.open("streaming", budget=256, window=64) as s:
            table = torch.from_dlpack(s.block_table())  # int32 block indices into k
            ...  # write K and V of slot s.len, then
            s.append(1)

A sequence opened with min_budget below its budget is elastic (vase.h, "Elastic budgets"):
while opens wait for room in the arena the daemon may lower its budget, never below min_budget,
and raise it back once they are admitted; Seq.budget says the budget its plans keep now, and
Seq.set_budget() lets the engine cap it itself. Budgets change only when a plan is applied.

protect_prompt=True keeps the prompt (the first prompt_len slots) in the cache whatever the
policy: it counts against the budget (prompt_len at most budget - window) and the policy chooses
among the other tokens, so m.open("random", budget=..., prompt_len=..., protect_prompt=True) is
"the prompt plus a uniform random subset" (kernels/ALGORITHM.md, "The protected prompt").

Every failure of libvase raises VaseError (an OSError) with its errno, vase_strerror() as
strerror and vase_last_error()'s message; wrong Python types or values raise TypeError and
ValueError. Names of vase enums (dtype, policy, metric, mode, kv, stats kind) are checked as the C
API checks them: VaseError(EINVAL).

Lifetimes: a Tensor keeps its client's arena mapping alive, and so does every DLPack consumer of
it (torch or numpy tensor) until it is freed. Client.close() therefore disconnects at once only
when no tensor made from the client is alive; otherwise every later call on the client, its
models and sequences raises VaseError(EBADF) and the disconnect happens when the last tensor
goes. What a view shows is what the engine and libvase put there: a kv_slot() or query_slot()
view names a fixed place in the arena, which holds the slot's token only until the next applied
plan moves tokens (Seq.append(), poll(), wait()), and the sequence's pages only until it is
closed.
"""

from __future__ import annotations

from typing import Optional

from ._vase import Client, Model, Seq, Tensor
from ._vase import connect as _connect
from ._vase import _set_error_type

__all__ = ["connect", "Client", "Model", "Seq", "Tensor", "VaseError"]


class VaseError(OSError):
    """A failure reported by libvase or vased.

    errno is the positive error code (an errno value, or VASE_EPROTOVERSION 1000 / VASE_ESTALE
    1001), strerror is vase_strerror() of it, and message is what vase_last_error() said about
    the failed call ("" when the code says all there is); str() shows all three.
    """

    def __init__(self, errno: int, strerror: str, message: str = "") -> None:
        super().__init__(errno, strerror)
        self.message = message

    def __str__(self) -> str:
        s = f"[Errno {self.errno}] {self.strerror}"
        return f"{s}: {self.message}" if self.message else s


_set_error_type(VaseError)


def connect(runtime_dir: Optional[str] = None, name: Optional[str] = None,
            timeout_ms: int = 0) -> Client:
    """Connects to vased (vase_connect()).

    runtime_dir: where the daemon's sockets are; None: $VASE_RUNTIME_DIR, else /run/vase if it
    exists, else ./run. name: shown by vasectl ("python" if None). timeout_ms: bound on every
    wait for the daemon, 0 for libvase's default (5000).
    """
    return _connect(runtime_dir, name, timeout_ms)
