# SPDX-License-Identifier: MIT
"""The functions of vLLM 0.18.1 that vase.vllm replaces, each named, each wrapping vLLM's own:

- ``AttentionBackendEnum.CPU_ATTN`` and ``FLASH_ATTN`` are registered (vLLM's
  ``register_backend``) to vase's subclasses (``vase.vllm.cpu``, ``vase.vllm.cuda``);
- ``GPUModelRunner.execute_model`` (the CPU runner's too): closes the sequences of finished and
  preempted requests, then runs vLLM's step;
- ``GPUModelRunner._model_forward``: opens the sequences of new requests and sets up the step
  before the forward pass, ends it after (tokens counted, plans applied);
- ``GPUModelRunner._allocate_kv_cache_tensors``: vLLM's KV tensors with ``torch.empty``
  instead of ``torch.zeros`` (the requests' KV is in vased's arena; vLLM's stays unwritten);
- ``Platform.check_and_update_config`` of the current platform: prefix caching off;
- ``SamplingParams._verify_args``: the request's vase_* extra_args checked;
- ``Scheduler.schedule``: a new request waits in vLLM's queue until its vase sequence is open
  (opened in a thread: vased may park it until there is room, or shrink elastic sequences);
- ``Scheduler.update_from_output``: the requests vase could not serve (no room in time, vased
  gone) finish with an error, the others go on.
"""

from __future__ import annotations

import functools
import logging

from . import check_args, runtime

log = logging.getLogger("vllm.vase")

_applied = False


def _wrap(owner, name: str, make):
    """Replaces owner.name by make(original), once (vLLM may load plugins twice)."""
    original = getattr(owner, name)
    if getattr(original, "__vase_original__", None) is not None:
        return
    wrapper = make(original)
    functools.update_wrapper(wrapper, original)
    wrapper.__vase_original__ = original
    setattr(owner, name, wrapper)


def _execute_model(original):
    def execute_model(self, scheduler_output, *args, **kwargs):
        rt = runtime.get(self.vllm_config)
        for req_id in scheduler_output.finished_req_ids:
            rt.close(req_id)
        for req_id in getattr(scheduler_output, "preempted_req_ids", None) or ():
            # vLLM frees a preempted request's blocks and recomputes it when it resumes.
            rt.close(req_id)
        rt.scheduler_output = scheduler_output
        try:
            return original(self, scheduler_output, *args, **kwargs)
        finally:
            rt.scheduler_output = None
            if rt.step is not None:  # the forward pass raised
                rt.abort_step()

    return execute_model


def _model_forward(original):
    def _model_forward(self, *args, **kwargs):
        rt = runtime.get()
        if rt is None or rt.scheduler_output is None:
            return original(self, *args, **kwargs)
        rt.begin(self, rt.scheduler_output)
        out = original(self, *args, **kwargs)
        rt.finish()
        return out

    return _model_forward


def _allocate_kv_cache_tensors(original):
    def _allocate_kv_cache_tensors(self, kv_cache_config):
        import torch

        zeros = torch.zeros
        torch.zeros = torch.empty  # vLLM's tensors stay unwritten, so their pages stay virtual
        try:
            return original(self, kv_cache_config)
        finally:
            torch.zeros = zeros

    return _allocate_kv_cache_tensors


def _update_from_output(original):
    def update_from_output(self, scheduler_output, model_runner_output):
        # The requests vase could not serve this step finish with an error (the OpenAI server
        # answers them with an error); their tokens of the step are dropped, the others go on.
        rt = runtime.get()
        failed = rt.take_failed() if rt is not None else {}
        gone = []
        for req_id in failed:
            req = self.requests.get(req_id)
            if req is not None and not req.is_finished():
                gone.append(req)
        if gone:
            from vllm.v1.request import RequestStatus

            self.finish_requests([r.request_id for r in gone], RequestStatus.FINISHED_ERROR)
        outputs = original(self, scheduler_output, model_runner_output)
        if gone:
            from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs

            for req in gone:
                eco = outputs.get(req.client_index)
                if eco is None:
                    eco = outputs[req.client_index] = EngineCoreOutputs()
                eco.outputs.append(EngineCoreOutput(
                    request_id=req.request_id, new_token_ids=[],
                    finish_reason=req.get_finished_reason(), events=req.take_events(),
                    stop_reason=FAILED,
                    trace_headers=req.trace_headers,
                    num_cached_tokens=max(0, req.num_cached_tokens)))  # -1: never scheduled
        return outputs

    return update_from_output


# The stop reason of a request vase.vllm failed; the engine's log says why (the client is not
# told the daemon's details).
FAILED = "vase.vllm: the request could not be served (the server's log says why)"


def _process_outputs(original):
    def process_outputs(self, engine_core_outputs, *args, **kwargs):
        # The front end's side of a request vase failed. vLLM's chat stream skips an output with
        # neither text nor tokens before the request's first token, error or not, so a streamed
        # request that failed before its first token would end without an error: its stream
        # gets the failure as an exception instead, which the server sends as an error event.
        from vllm.v1.engine import FinishReason

        streams = []
        for o in engine_core_outputs:
            if o.finish_reason == FinishReason.ERROR and o.stop_reason == FAILED:
                st = self.request_states.get(o.request_id)
                if st is not None and st.queue is not None and st.queue.aggregate:
                    streams.append(st.queue)
        out = original(self, engine_core_outputs, *args, **kwargs)
        for queue in streams:
            queue.put(RuntimeError(FAILED))
        return out

    return process_outputs


def _schedule(original):
    def schedule(self, *args, **kwargs):
        # vase's admission first: a request enters vLLM's batch once its sequence is open;
        # until then it waits in vLLM's queue, held back from this schedule.
        rt = runtime.get(self.vllm_config)
        hold = rt.admit(self)
        if hold:
            self.waiting.remove_requests(hold)
        try:
            return original(self, *args, **kwargs)
        finally:
            for req in reversed(hold):
                if not req.is_finished():
                    self.waiting.prepend_request(req)

    return schedule


def _check_and_update_config(original):
    def check_and_update_config(vllm_config):
        original(vllm_config)
        if vllm_config.parallel_config.world_size > 1:
            # A request vase cannot serve is failed by the scheduler from what the worker
            # found, in the same process: one worker.
            raise NotImplementedError(
                "vase.vllm serves one worker (tensor and pipeline parallel size 1), not "
                f"{vllm_config.parallel_config.world_size}; unset VASE_VLLM to run without vase")
        cache = vllm_config.cache_config
        if cache.enable_prefix_caching:
            log.info("vase.vllm: prefix caching off (a hit would skip tokens vase never got)")
            cache.enable_prefix_caching = False

    return check_and_update_config


def _verify_args(original):
    def _verify_args(self):
        original(self)
        check_args(self.extra_args)

    return _verify_args


def apply() -> None:
    global _applied
    if _applied:
        return
    from vllm.platforms import current_platform
    from vllm.sampling_params import SamplingParams
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.output_processor import OutputProcessor
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    register_backend(AttentionBackendEnum.CPU_ATTN, "vase.vllm.cpu.VaseCPUAttentionBackend")
    register_backend(AttentionBackendEnum.FLASH_ATTN,
                     "vase.vllm.cuda.VaseFlashAttentionBackend")
    _wrap(GPUModelRunner, "execute_model", _execute_model)
    _wrap(GPUModelRunner, "_model_forward", _model_forward)
    _wrap(GPUModelRunner, "_allocate_kv_cache_tensors", _allocate_kv_cache_tensors)
    platform = type(current_platform)
    original = platform.check_and_update_config
    if getattr(original, "__vase_original__", None) is None:
        wrapper = _check_and_update_config(original)
        wrapper.__vase_original__ = original
        platform.check_and_update_config = classmethod(lambda cls, c: wrapper(c))
        platform.check_and_update_config.__func__.__vase_original__ = original
    _wrap(SamplingParams, "_verify_args", _verify_args)
    _wrap(Scheduler, "update_from_output", _update_from_output)
    _wrap(Scheduler, "schedule", _schedule)
    _wrap(OutputProcessor, "process_outputs", _process_outputs)
    _applied = True
    log.info("vase.vllm: on (vLLM %s, platform %s)", _version(), platform.__name__)


def _version() -> str:
    from . import vllm_version

    return str(vllm_version())
