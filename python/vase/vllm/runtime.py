# SPDX-License-Identifier: MIT
"""The per-process state of vase.vllm in a vLLM worker: one connection to vased, one vase model
(the served model's geometry, vLLM's block size), one vase sequence per running request, and the
step in progress (which requests, in the batch's order, and how many tokens each brings)."""

from __future__ import annotations

import atexit
import logging
import threading
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

import vase
from vase.torch import _GONE, DTYPES, STATS_POLICIES, SeqSpec, VaseCache, _has_ring

from . import defaults

log = logging.getLogger("vllm.vase")


@dataclass
class _Req:
    """A request's vase sequence and what VaseCache keeps per sequence."""

    seq: "vase.Seq"
    spec: SeqSpec
    ring: Optional[list]
    stats: bool
    call_seconds: float = 0.0
    plan_seconds: float = 0.0
    rounds: int = 0


class Requests(VaseCache):
    """A VaseCache whose sequences come and go: vLLM's running requests. Each step takes the
    requests of the batch in the batch's order (begin()), then runs VaseCache's protocol over
    them (append, attend, step_done)."""

    def __init__(self, client: "vase.Client", layers: int, q_heads: int, kv_heads: int,
                 head_dim: int, dtype: str, block_tokens: int, name: str, attention: str):
        super().__init__(client, layers, q_heads, kv_heads, head_dim, specs=[], dtype=dtype,
                         block_tokens=block_tokens, name=name, attention=attention)
        self.open_reqs: Dict[str, _Req] = {}
        self._batch: List[_Req] = []

    def open_request(self, req_id: str, spec: SeqSpec, prompt_len: int) -> "vase.Seq":
        s = self.model.open(policy=spec.policy, budget=spec.budget, window=spec.window,
                            prompt_len=prompt_len, mode=spec.mode, seed=spec.seed, **spec.extra)
        try:
            ring = ([[torch.from_dlpack(s.query_slot(l, e)) for e in range(2 * spec.window)]
                     for l in range(self.layers)] if _has_ring(s) else None)
        except BaseException:
            s.close()
            raise
        self.open_reqs[req_id] = _Req(s, spec, ring, spec.policy in STATS_POLICIES)
        return s

    def close_request(self, req_id: str) -> bool:
        """Closes the request's sequence (its pages go back to the arena); False when it had
        none. A daemon that went away took the pages with it: not an error here."""
        r = self.open_reqs.pop(req_id, None)
        if r is None:
            return False
        try:
            r.seq.close()
        except vase.VaseError as e:
            if e.errno not in _GONE:
                raise
        return True

    def begin(self, req_ids: List[str]) -> None:
        self._batch = [self.open_reqs[r] for r in req_ids]
        self.seqs = [r.seq for r in self._batch]
        self.specs = [r.spec for r in self._batch]
        self.rings = [r.ring for r in self._batch]
        self._stats = [r.stats for r in self._batch]
        self.call_seconds = [r.call_seconds for r in self._batch]
        self.plan_seconds = [r.plan_seconds for r in self._batch]
        self._rounds = [r.rounds for r in self._batch]
        self._recv = {}
        self._begin_step()

    def finish(self) -> None:
        """Ends the step: counts the tokens, applies ready plans, keeps each request's totals."""
        try:
            self.step_done()
        finally:
            for i, r in enumerate(self._batch):
                r.call_seconds = self.call_seconds[i]
                r.plan_seconds = self.plan_seconds[i]
                r.rounds = self._rounds[i]
            self._batch = []
            self.seqs = []

    def attend(self, layer, q, real=None, scale=None):
        # The paged kernels return no attention probabilities: a batch with an h2o request
        # gathers.
        if any(self._stats) and self.attention != "gather":
            chosen, self.attention = self.attention, "gather"
            try:
                return super().attend(layer, q, real, scale)
            finally:
                self.attention = chosen
        return super().attend(layer, q, real, scale)

    def close(self) -> None:
        failed = None
        for req_id in list(self.open_reqs):
            try:
                self.close_request(req_id)
            except vase.VaseError as e:
                failed = failed or e
        self.seqs = []
        if failed is not None:
            raise failed


@dataclass
class Step:
    """The model step in progress: the batch's requests in order, the tokens each brings, and
    the [b, n] gather of the flat token dimension into rows (real: which entries are tokens;
    None when every row brings n)."""

    req_ids: List[str]
    counts: List[int]
    total: int
    index: torch.Tensor
    real: Optional[torch.Tensor]
    rows: Optional[torch.Tensor] = None
    cols: Optional[torch.Tensor] = None
    layers_done: set = field(default_factory=set)


class Runtime:
    """vase.vllm's state in one vLLM worker process."""

    def __init__(self, vllm_config) -> None:
        mc, pc = vllm_config.model_config, vllm_config.parallel_config
        self.defaults = defaults()
        self.layers = mc.get_num_layers(pc)
        self.q_heads = mc.get_num_attention_heads(pc)
        self.kv_heads = mc.get_num_kv_heads(pc)
        self.head_dim = mc.get_head_size()
        dtype = str(mc.dtype).removeprefix("torch.")
        if dtype not in DTYPES:
            raise ValueError(f"vase.vllm: model dtype {dtype}: vase stores "
                             f"{', '.join(DTYPES)}")
        import os

        self.client = vase.connect()
        try:
            self.cache = Requests(self.client, self.layers, self.q_heads, self.kv_heads,
                                  self.head_dim, DTYPES[dtype], vllm_config.cache_config.block_size,
                                  os.environ.get("VASE_VLLM_NAME", "") or "vllm",
                                  os.environ.get("VASE_VLLM_ATTENTION", "") or "auto")
        except BaseException:
            self.client.close()
            raise
        self.step: Optional[Step] = None
        self.scheduler_output = None
        self._layer_of: Dict[str, int] = {}
        self.lock = threading.Lock()
        log.info("vase.vllm: model of %d layers, %d/%d heads of %d, %s, blocks of %d tokens, "
                 "arena %d, attention %s; default %s", self.layers, self.q_heads, self.kv_heads,
                 self.head_dim, dtype, self.cache.block, self.cache.model.arena,
                 self.cache.attention, self.defaults)

    # ---- requests ----

    def spec_of(self, req_state) -> SeqSpec:
        sp = getattr(req_state, "sampling_params", None)
        args = dict(self.defaults)
        args.update({k: v for k, v in ((sp.extra_args if sp else None) or {}).items()
                     if k.startswith("vase_")})
        extra = {}
        if args["vase_min_budget"]:
            extra["min_budget"] = args["vase_min_budget"]
        if args["vase_weight"]:
            extra["weight"] = args["vase_weight"]
        return SeqSpec(policy=args["vase_policy"], budget=args["vase_budget"],
                       window=args["vase_window"], mode=args["vase_mode"], seed=args["vase_seed"],
                       extra=extra)

    def close(self, req_id: str) -> None:
        req = self.cache.open_reqs.get(req_id)
        if req is None:
            return
        seq = req.seq
        try:
            what = (f"{seq.position} tokens, {seq.len} held, {seq.rounds} evictions")
        except vase.VaseError as e:
            what = f"state unknown ({e})"
        self.cache.close_request(req_id)
        log.info("vase.vllm: request %s: sequence %d closed (%s)", req_id, seq.id, what)

    # ---- the step ----

    def layer_of(self, layer_name: str) -> int:
        i = self._layer_of.get(layer_name)
        if i is None:
            from vllm.model_executor.models.utils import extract_layer_index

            i = extract_layer_index(layer_name)
            if not 0 <= i < self.layers:
                raise RuntimeError(f"vase.vllm: attention layer {layer_name!r} is not one of "
                                   f"the model's {self.layers}")
            self._layer_of[layer_name] = i
        return i

    def begin(self, runner, scheduler_output) -> None:
        """Opens the sequences of the batch's new requests and makes the step's gather."""
        batch = runner.input_batch
        req_ids = list(batch.req_ids[: batch.num_reqs])
        counts = [int(scheduler_output.num_scheduled_tokens[r]) for r in req_ids]
        computed = batch.num_computed_tokens_cpu[: batch.num_reqs].tolist()
        for r, done in zip(req_ids, computed):
            req = self.cache.open_reqs.get(r)
            if req is None:
                state = runner.requests[r]
                if done:
                    raise RuntimeError(f"vase.vllm: request {r} starts at token {done}, not 0: "
                                       "its first tokens' KV was never written to vase")
                spec = self.spec_of(state)
                s = self.cache.open_request(r, spec, int(state.num_prompt_tokens))
                log.debug("vase.vllm: request %s -> sequence %d (%s, budget %d)", r, s.id,
                          spec.policy, spec.budget)
            elif req.seq.position != done:
                raise RuntimeError(f"vase.vllm: request {r}: vLLM has computed {done} tokens, "
                                   f"its vase sequence {req.seq.position}")
        self.cache.begin(req_ids)
        b, n = len(req_ids), max(counts) if counts else 0
        cu = torch.tensor([0] + counts, dtype=torch.long).cumsum(0)
        j = torch.arange(n, dtype=torch.long).view(1, n)
        c = torch.tensor(counts, dtype=torch.long).view(b, 1)
        real = j < c
        index = (cu[:-1].view(b, 1) + j).masked_fill(~real, 0)
        uniform = bool(real.all())
        st = Step(req_ids, counts, int(cu[-1]), index, None if uniform else real)
        if not uniform:
            st.rows, st.cols = real.nonzero(as_tuple=True)
        self.step = st

    def attend(self, layer_name: str, scale: float, query: torch.Tensor, key: torch.Tensor,
               value: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        """One attention layer of the step: query [tokens, q_heads, d], key and value
        [tokens, kv_heads, d] (flat, the batch's requests one after another), output
        [tokens, q_heads, d], written and returned."""
        st = self.step
        layer = self.layer_of(layer_name)
        if layer in st.layers_done:
            raise RuntimeError(f"vase.vllm: layer {layer} attended twice in one step")
        st.layers_done.add(layer)
        t = st.total
        idx = st.index.to(query.device)
        q, k, v = query[:t][idx], key[:t][idx], value[:t][idx]  # [b, n, heads, d]
        real = st.real
        self.cache.append(layer, k, v, q, real)
        out = self.cache.attend(layer, q, real, scale)
        if real is None:
            output[:t] = out.reshape(t, *out.shape[2:]).to(output.dtype)
        else:
            output[:t] = out[st.rows.to(out.device), st.cols.to(out.device)].to(output.dtype)
        return output

    def finish(self) -> None:
        st, self.step = self.step, None
        if st is None:
            return
        if st.req_ids and len(st.layers_done) != self.layers:
            self.cache.seqs = []
            raise RuntimeError(f"vase.vllm: the step attended {len(st.layers_done)} of "
                               f"{self.layers} layers")
        self.cache.finish()

    def shutdown(self) -> None:
        try:
            self.cache.close()
        finally:
            self.client.close()


_runtime: Optional[Runtime] = None


def get(vllm_config=None) -> Optional[Runtime]:
    """This process's runtime, made at the first step (vllm_config given) or None."""
    global _runtime
    if _runtime is None and vllm_config is not None:
        _runtime = Runtime(vllm_config)
        atexit.register(_shutdown)
    return _runtime


def current_step() -> Optional[Runtime]:
    """The runtime while a model step is in progress, else None (vLLM's own path runs)."""
    rt = _runtime
    return rt if rt is not None and rt.step is not None else None


def _shutdown() -> None:
    global _runtime
    rt, _runtime = _runtime, None
    if rt is not None:
        try:
            rt.shutdown()
        except Exception as e:  # the process is ending: say it, do not raise
            log.warning("vase.vllm: closing at exit: %s", e)
