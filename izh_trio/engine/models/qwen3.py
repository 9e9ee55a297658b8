"""Qwen3 for causal LM, reading top-down like the architecture.

Embedding -> N x [RMSNorm -> attention (q/k RMSNorm, RoPE, GQA, paged KV) -> residual ->
RMSNorm -> SwiGLU MLP -> residual] -> RMSNorm -> LM head (tied or not): ``DecoderStack``
around ``DecoderLayer``s whose attention is Llama's with each q and k head normed. Arithmetic
follows Hugging Face's implementation step for step so that fp32 logits agree to rounding.

Only the architecture is here. Where the engine runs a module otherwise, it swaps it at load
time: fp32, bf16 or fp16 on CPU, the norms, RoPE and KV store for twins on compiled C loops
(``cpu_twins``); linears on CPU for ones on packed oneDNN weights (``cpu_linear.py``); with
LoRA adapters, the decoder's linears for ones that add the adapters' terms
(``lora/linear.py``).
"""

from __future__ import annotations

import torch
from torch import nn

from izh_trio.engine import cpu_fused
from izh_trio.engine.attention import AttentionMetadata
from izh_trio.engine.loader import ModelConfig
from izh_trio.engine.models import llama
from izh_trio.engine.models.base import DecoderStack
from izh_trio.engine.models.layers import (
    MLP,
    CpuMLP,
    CpuRMSNorm,
    DecoderLayer,
    KVCache,
    RMSNorm,
    Rotation,
)


class Attention(llama.Attention):
    """Llama's attention with each q and k head RMS-normed before RoPE."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def heads(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.q_norm(q), self.k_norm(k)


class CpuAttention(Attention):
    """Its norms, RoPE and KV store in one compiled C call (fp32, bf16 or fp16 on CPU)."""

    def rope_store(self, qkv: torch.Tensor, rotation: Rotation, kv_cache: KVCache,
                   meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return cpu_fused.qk_norm_rope_store(  # q_norm and k_norm share the config's eps
            qkv, self.num_heads, self.num_kv_heads, self.q_norm.weight, self.k_norm.weight,
            self.q_norm.eps, *rotation, *kv_cache, meta.slot_mapping)


class Qwen3ForCausalLM(DecoderStack):
    cpu_twins = {RMSNorm: CpuRMSNorm, Attention: CpuAttention, MLP: CpuMLP}

    def layer(self, cfg: ModelConfig, index: int) -> nn.Module:
        return DecoderLayer(cfg, Attention(cfg), MLP(cfg))
