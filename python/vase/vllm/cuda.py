# SPDX-License-Identifier: MIT
"""vLLM's FlashAttention backend (FLASH_ATTN, CUDA) with vase's attention during model steps:
vase.torch reads the arena's pages through FlashInfer or FlashAttention-2 when installed
(VASE_VLLM_ATTENTION), else gathers."""

from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend, FlashAttentionImpl

from .backend import make_backend

VaseFlashAttentionBackend = make_backend(FlashAttentionBackend, FlashAttentionImpl, "VaseFlash")
VaseFlashAttentionBackend.__module__ = __name__
