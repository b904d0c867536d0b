# SPDX-License-Identifier: MIT
"""vLLM's CPU attention backend (CPU_ATTN) with vase's attention during model steps."""

from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend, CPUAttentionBackendImpl

from .backend import make_backend

VaseCPUAttentionBackend = make_backend(CPUAttentionBackend, CPUAttentionBackendImpl, "VaseCPU")
VaseCPUAttentionBackend.__module__ = __name__
