# SPDX-License-Identifier: MIT
"""The per-process state of vase.vllm in a vLLM worker: one connection to vased, one vase model
(the served model's geometry, vLLM's block size), one vase sequence per running request, and the
step in progress (which requests, in the batch's order, and how many tokens each brings)."""

from __future__ import annotations

import atexit
import concurrent.futures
import logging
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch
from torch.utils.dlpack import to_dlpack as _dlpack  # C: a tenth of Tensor.__dlpack__'s cost

import vase
from vase.torch import _GONE, DTYPES, STATS_POLICIES, SeqSpec, VaseCache, _has_ring

from . import _env_int, defaults

log = logging.getLogger("vllm.vase")


_LABEL_BYTES = set(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:/@+=-")


def label_of(req_id: str) -> str:
    """The sequence's label: vLLM's request id in the bytes a label may hold (vase.h,
    VASE_SEQ_LABEL_MAX): others become '_', and an id longer than 64 bytes keeps its first 64."""
    raw = req_id.encode("utf-8", "replace")[:64]
    return bytes(c if c in _LABEL_BYTES else 0x5F for c in raw).decode("ascii")


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
        self._finishing = False
        super().__init__(client, layers, q_heads, kv_heads, head_dim, specs=[], dtype=dtype,
                         block_tokens=block_tokens, name=name, attention=attention)
        self.open_reqs: Dict[str, _Req] = {}
        self._batch: List[_Req] = []

    def open_seq(self, spec: SeqSpec, prompt_len: int, **more) -> "vase.Seq":
        """Opens a sequence for a request (any thread: the wait for room releases the GIL and
        libvase's lock); adopt() makes it the request's."""
        kw = dict(spec.extra, **more)
        return self.model.open(policy=spec.policy, budget=spec.budget, window=spec.window,
                               prompt_len=prompt_len, mode=spec.mode, seed=spec.seed, **kw)

    def adopt(self, req_id: str, s: "vase.Seq", spec: SeqSpec) -> "vase.Seq":
        try:
            ring = ([[torch.from_dlpack(s.query_slot(l, e)) for e in range(2 * spec.window)]
                     for l in range(self.layers)] if _has_ring(s) else None)
        except BaseException:
            s.close()
            raise
        self.open_reqs[req_id] = _Req(s, spec, ring, spec.policy in STATS_POLICIES)
        return s

    def open_request(self, req_id: str, spec: SeqSpec, prompt_len: int) -> "vase.Seq":
        return self.adopt(req_id, self.open_seq(spec, prompt_len, label=label_of(req_id)), spec)

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

    def _begin_step(self) -> None:
        if not self._finishing:  # step_done() ends with one; begin() makes the next
            super()._begin_step()

    def finish(self) -> None:
        """Ends the step: counts the tokens, applies ready plans, keeps each request's totals."""
        self._finishing = True
        try:
            self.step_done()
        finally:
            self._finishing = False
            for i, r in enumerate(self._batch):
                r.call_seconds = self.call_seconds[i]
                r.plan_seconds = self.plan_seconds[i]
                r.rounds = self._rounds[i]
            self._batch = []
            self.seqs = []

    def attend(self, layer, q, real=None, scale=None, out=None):
        # The paged kernels return no attention probabilities: a batch with an h2o request
        # gathers.
        if any(self._stats) and self.attention != "gather":
            chosen, self.attention = self.attention, "gather"
            try:
                return super().attend(layer, q, real, scale)
            finally:
                self.attention = chosen
        return super().attend(layer, q, real, scale, out)

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

    req_ids: List[str]  # the requests vase serves this step, in the batch's order
    counts: List[int]
    total: int  # tokens of the whole batch, failed requests' included
    index: torch.Tensor
    real: Optional[torch.Tensor]
    rows: Optional[torch.Tensor] = None
    cols: Optional[torch.Tensor] = None
    layers_done: set = field(default_factory=set)
    partial: bool = False  # some tokens of the batch are failed requests': their output is 0
    # Every request brings the same count and none failed: the [b, n] rows are the flat tokens
    # in order, views of vLLM's tensors (no gather, the output written in place).
    contiguous: bool = False
    broken: bool = False  # vase failed during the step: every layer's output is 0 from then
    # The step runs through vase.Batch (one native call per layer): the batch's request ids in
    # its order, None for the requests vase does not serve.
    native: Optional[List[Optional[str]]] = None


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
        self.dtype = dtype
        self.block = vllm_config.cache_config.block_size
        self.client: Optional["vase.Client"] = None
        self.cache: Optional[Requests] = None
        # The native step (vase.Batch) on a host arena of float32, unless VASE_VLLM_ATTENTION
        # asks for another attention than vase's own kernel; its attention's threads: PyTorch's.
        self.batch = None
        self.threads = max(1, torch.get_num_threads())
        self.step: Optional[Step] = None
        self.scheduler_output = None
        self._layer_of: Dict[str, int] = {}
        # Requests vase could not serve, and why: the scheduler finishes them with an error
        # (patches._update_from_output) and the others go on.
        self.failed: Dict[str, str] = {}
        # Opens started by the scheduler (admit()) that have not returned: request id ->
        # (future, the cache it opens in). Their requests wait in vLLM's queue meanwhile.
        self.pending: Dict[str, tuple] = {}
        self.wait_ms = _env_int("VASE_VLLM_ADMISSION_WAIT_MS", 60000)
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=_env_int("VASE_VLLM_OPENERS", 16), thread_name_prefix="vase-open")
        try:
            self._connect()
        except vase.VaseError as e:  # its requests fail until vased is back
            log.warning("vase.vllm: vased is not reachable: %s", e)

    def _connect(self) -> None:
        """Connects to vased and registers the model (at start, and after vased went away)."""
        attention = os.environ.get("VASE_VLLM_ATTENTION", "") or "auto"
        client = vase.connect()
        try:
            self.cache = Requests(client, self.layers, self.q_heads, self.kv_heads,
                                  self.head_dim, DTYPES[self.dtype], self.block,
                                  os.environ.get("VASE_VLLM_NAME", "") or "vllm", attention)
            native = (attention in ("auto", "paged-cpu") and self.cache.device.type == "cpu"
                      and self.dtype == "float32")
            self.batch = self.cache.model.batch() if native else None
        except BaseException:
            client.close()
            raise
        self.client = client
        log.info("vase.vllm: process %d: model of %d layers, %d/%d heads of %d, %s, blocks of "
                 "%d tokens, arena %d, attention %s; default %s", os.getpid(), self.layers,
                 self.q_heads, self.kv_heads, self.head_dim, self.dtype, self.cache.block,
                 self.cache.model.arena,
                 f"native, {self.threads} threads" if self.batch is not None
                 else self.cache.attention, self.defaults)

    def _disconnect(self, why: str) -> None:
        """Drops the connection after vased went away: every open request fails (its KV went
        with the daemon's sequences); the next step connects again."""
        cache, client, self.cache, self.client = self.cache, self.client, None, None
        if self.batch is not None:
            self.batch.cancel()
            self.batch = None
        if cache is not None:
            for req_id in list(cache.open_reqs):
                self.fail(req_id, why)
                cache.open_reqs.pop(req_id, None)
        if client is not None:
            try:
                client.close()
            except vase.VaseError:
                pass

    def fail(self, req_id: str, why: str) -> None:
        if req_id not in self.failed:
            log.warning("vase.vllm: request %s fails: %s", req_id, why)
        self.failed[req_id] = why
        if self.cache is not None and req_id in self.cache.open_reqs:
            try:
                self.cache.close_request(req_id)
            except vase.VaseError as e:
                log.warning("vase.vllm: request %s: closing its sequence: %s", req_id, e)

    def admit(self, scheduler) -> list:
        """Admission, before each schedule: starts the open of each new waiting request in a
        thread (the daemon may park it until memory frees or elastic sequences shrink, up to
        VASE_VLLM_ADMISSION_WAIT_MS), adopts the opens that returned, and returns the waiting
        requests whose open has not: the scheduler holds them back, the others go on."""
        if self.cache is None:
            try:
                self._connect()
            except vase.VaseError as e:
                for req in scheduler.waiting:
                    self.fail(req.request_id, f"vased is not reachable: {e}")
                return []
        for req_id, (future, cache) in list(self.pending.items()):
            if future.done():
                del self.pending[req_id]
                self._adopt(scheduler, req_id, future, cache)
        hold = []
        for req in scheduler.waiting:
            req_id = req.request_id
            if req_id in self.cache.open_reqs:
                continue
            if req_id in self.failed:  # finished with its error after this step
                hold.append(req)
                continue
            if req_id not in self.pending:
                if req.num_computed_tokens:
                    continue  # the worker fails it: vase never had its first tokens
                spec = self.spec_of(req)
                self.pending[req_id] = (self._pool.submit(
                    self.cache.open_seq, spec, int(req.num_prompt_tokens),
                    admission_wait_ms=self.wait_ms, label=label_of(req_id)), self.cache)
                self.pending[req_id][0].spec = spec
            hold.append(req)
        return hold

    def _adopt(self, scheduler, req_id: str, future, cache) -> None:
        req = scheduler.requests.get(req_id)
        try:
            seq = future.result()
        except vase.VaseError as e:
            if e.errno in _GONE:
                self._disconnect(f"vased went away: {e}")
            if req is not None and not req.is_finished():
                self.fail(req_id, f"no vase sequence: {e}")
            return
        if cache is not self.cache or req is None or req.is_finished():
            try:  # aborted while it waited, or opened before vased went away
                seq.close()
            except vase.VaseError:
                pass
            return
        try:
            cache.adopt(req_id, seq, future.spec)
        except vase.VaseError as e:
            self.fail(req_id, f"no vase sequence: {e}")

    def take_failed(self) -> Dict[str, str]:
        failed, self.failed = self.failed, {}
        return failed

    # ---- requests ----

    def spec_of(self, req_state) -> SeqSpec:
        sp = getattr(req_state, "sampling_params", None)
        args = dict(self.defaults)
        args.update({k: v for k, v in ((sp.extra_args if sp else None) or {}).items()
                     if k.startswith("vase_")})
        # An open never waits for room: it would stall every request of the engine's step.
        extra = {"admission_wait_ms": 0}
        if args["vase_min_budget"]:
            extra["min_budget"] = args["vase_min_budget"]
        if args["vase_weight"]:
            extra["weight"] = args["vase_weight"]
        return SeqSpec(policy=args["vase_policy"], budget=args["vase_budget"],
                       window=args["vase_window"], mode=args["vase_mode"], seed=args["vase_seed"],
                       extra=extra)

    def close(self, req_id: str) -> None:
        req = self.cache.open_reqs.get(req_id) if self.cache is not None else None
        if req is None:
            return
        seq = req.seq
        try:
            what = (f"{seq.position} tokens, {seq.len} held, {seq.rounds} evictions")
        except vase.VaseError as e:
            what = f"state unknown ({e})"
        try:
            self.cache.close_request(req_id)
        except vase.VaseError as e:
            log.warning("vase.vllm: request %s: closing sequence %d: %s", req_id, seq.id, e)
            return
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
        """Opens the sequences of the batch's new requests and makes the step's gather. A
        request vase cannot serve (no room, a bad setting, vased gone) fails alone."""
        batch = runner.input_batch
        req_ids = list(batch.req_ids[: batch.num_reqs])
        counts = [int(scheduler_output.num_scheduled_tokens[r]) for r in req_ids]
        computed = batch.num_computed_tokens_cpu[: batch.num_reqs].tolist()
        if self.cache is None:
            try:
                self._connect()
            except vase.VaseError as e:
                for r in req_ids:
                    self.fail(r, f"vased is not reachable: {e}")
        ok = [self.cache is not None and self._admit(runner, r, done)
              for r, done in zip(req_ids, computed)]
        served = [r for r, good in zip(req_ids, ok) if good]
        if self.batch is not None and self._begin_native(req_ids, counts, ok, served):
            return
        if self.cache is not None:
            self.cache.begin(served)
        cu = torch.tensor([0] + counts, dtype=torch.long).cumsum(0)
        rows = [i for i, good in enumerate(ok) if good]
        c = torch.tensor([counts[i] for i in rows], dtype=torch.long).view(-1, 1)
        n = int(c.max()) if rows else 0
        j = torch.arange(n, dtype=torch.long).view(1, n)
        real = j < c
        index = (cu[rows].view(-1, 1) + j).masked_fill(~real, 0)
        uniform = bool(real.all())
        st = Step(served, [counts[i] for i in rows], int(cu[-1]), index,
                  None if uniform else real, partial=len(served) < len(req_ids))
        st.contiguous = uniform and not st.partial and bool(rows)
        if not uniform:
            st.rows, st.cols = real.nonzero(as_tuple=True)
        self.step = st

    def _begin_native(self, req_ids: List[str], counts: List[int], ok: List[bool],
                      served: List[str]) -> bool:
        """Begins the step through vase.Batch; False when a request of it needs the Python path
        (a policy that reads the attention its slots received)."""
        reqs = self.cache.open_reqs
        if any(reqs[r].stats for r in served):
            return False
        st = Step(served, [c for c, good in zip(counts, ok) if good], sum(counts), None, None,
                  partial=len(served) < len(req_ids))
        st.native = [r if good else None for r, good in zip(req_ids, ok)]
        self.step = st
        if served:
            try:
                self.batch.begin([reqs[r].seq if r is not None else None for r in st.native],
                                 counts)
            except (vase.VaseError, ValueError, TypeError) as e:
                self._fail_step(f"beginning the step: {e}", e)
        return True

    def _admit(self, runner, req_id: str, done: int) -> bool:
        """Whether vase serves the request this step: its sequence is open (opened now for a
        new request) and holds what vLLM computed."""
        if req_id in self.failed:
            return False
        req = self.cache.open_reqs.get(req_id)
        if req is not None:
            if req.seq.position == done:
                return True
            self.fail(req_id, f"vLLM has computed {done} tokens, its vase sequence "
                              f"{req.seq.position}")
            return False
        if done:
            self.fail(req_id, f"it starts at token {done}, not 0: the KV of its first tokens "
                              "was never written to vase")
            return False
        state = runner.requests[req_id]
        try:
            spec = self.spec_of(state)
            s = self.cache.open_request(req_id, spec, int(state.num_prompt_tokens))
        except (vase.VaseError, ValueError) as e:
            if isinstance(e, vase.VaseError) and e.errno in _GONE:
                self._disconnect(f"vased went away: {e}")
            self.fail(req_id, f"no vase sequence: {e}")
            return False
        log.debug("vase.vllm: request %s -> sequence %d (%s, budget %d)", req_id, s.id,
                  spec.policy, spec.budget)
        return True

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
        if st.native is not None and not st.broken and st.req_ids:
            # One native call: the failed requests' rows come back as zeros.
            try:
                self.batch.layer(layer, _dlpack(query), _dlpack(key), _dlpack(value),
                                 _dlpack(output), scale, self.threads)
            except (RuntimeError, ValueError, TypeError) as e:
                self._fail_step(f"attention of layer {layer}: {e}", e)
                output[:t] = 0
            return output
        if st.partial or st.broken or not st.req_ids:
            output[:t] = 0  # failed requests' tokens: what they compute is never delivered
        if st.broken or not st.req_ids:
            return output
        if st.contiguous:
            b = len(st.req_ids)
            q, k, v, o = (x[:t].view(b, t // b, *x.shape[1:])
                          for x in (query, key, value, output))
        else:
            idx = st.index.to(query.device)
            q, k, v, o = query[idx], key[idx], value[idx], None  # [b, n, heads, d]
        real = st.real
        try:
            self.cache.append(layer, k, v, q, real)
            out = self.cache.attend(layer, q, real, scale, o)
        except (vase.VaseError, RuntimeError) as e:
            self._fail_step(f"attention of layer {layer}: {e}", e)
            output[:t] = 0
            return output
        if o is not None:
            if out is not o:
                o.copy_(out)
            return output
        flat = st.index.view(-1) if real is None else st.index[st.rows, st.cols]
        got = out.reshape(-1, *out.shape[2:]) if real is None else out[
            st.rows.to(out.device), st.cols.to(out.device)]
        output[flat.to(output.device)] = got.to(output.dtype)
        return output

    def _fail_step(self, why: str, e: BaseException) -> None:
        """vase failed in the middle of a step: every request of it fails."""
        st = self.step
        st.broken = True
        if self.batch is not None:
            self.batch.cancel()
        if isinstance(e, vase.VaseError) and e.errno in _GONE:
            self._disconnect(f"vased went away: {e}")
        for r in st.req_ids:
            self.fail(r, why)

    def finish(self) -> None:
        """Ends the step: the served requests count their tokens and apply ready plans."""
        st = self.step
        if st is None:
            return
        try:
            if st.broken or not st.req_ids or self.cache is None:
                return
            if len(st.layers_done) != self.layers:
                self._fail_step(f"the step attended {len(st.layers_done)} of {self.layers} "
                                "layers", RuntimeError())
                return
            if st.native is not None:
                self._finish_native(st)
                return
            try:
                self.cache.finish()
            except vase.VaseError as e:
                self._fail_step(f"ending the step: {e}", e)
        finally:
            self.abort_step()

    def _finish_native(self, st: Step) -> None:
        """Counts the step's tokens and applies ready plans, every sequence of the step in one
        native call; a request whose calls failed fails alone (all of them when vased went
        away)."""
        failed = self.batch.finish()
        gone = None
        for i, err, msg in failed:
            if err in _GONE:
                gone = gone or f"vased went away: {msg or os.strerror(err)}"
            else:
                self.fail(st.native[i], f"ending the step: {msg or os.strerror(err)}")
        if gone is not None:
            self._disconnect(gone)

    def abort_step(self) -> None:
        """Forgets the step in progress (ended, or its forward pass raised)."""
        self.step = None
        if self.batch is not None:
            self.batch.cancel()
        if self.cache is not None:
            self.cache.seqs = []

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        try:
            if self.cache is not None:
                self.cache.close()
        finally:
            if self.client is not None:
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
