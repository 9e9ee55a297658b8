"""Llama for causal LM (Llama 2 and 3), reading top-down like the architecture. Qwen2 is the
same with biases on q, k and v, Mistral with a sliding window (``ModelConfig.qkv_bias``,
``sliding_window``: set by their readers; the window is the attention backend's to apply).

Embedding -> N x [RMSNorm -> attention (RoPE, GQA, paged KV) -> residual -> RMSNorm ->
SwiGLU MLP -> residual] -> RMSNorm -> LM head (tied or not): ``DecoderStack`` around
``DecoderLayer``s (``layers.py``) with the attention below. ``attention_bias`` puts biases on
q, k, v and o, ``mlp_bias`` on the MLP's linears; RoPE's frequencies follow the checkpoint's
``rope_type`` (``layers.inv_frequencies``).
Arithmetic follows Hugging Face's implementation step for step so that fp32 logits agree to
rounding. On CPU the norms, and RoPE with the KV store, run on the compiled kernels
(``cpu_twins``).
"""

from __future__ import annotations

import torch
from torch import nn

from izh_trio.engine import cpu_fused
from izh_trio.engine.attention import AttentionMetadata
from izh_trio.engine.loader import ModelConfig
from izh_trio.engine.models.base import DecoderStack
from izh_trio.engine.models.layers import (
    MLP,
    CpuMLP,
    CpuRMSNorm,
    DecoderLayer,
    KVCache,
    RMSNorm,
    Rotation,
    apply_rope,
)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size,
                                  bias=cfg.attention_bias or cfg.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=cfg.attention_bias)
        self.scale = self.head_dim**-0.5

    def forward(self, x: torch.Tensor, rotation: Rotation, meta: AttentionMetadata,
                kv_cache: KVCache) -> torch.Tensor:
        q, k, v = self.rope_store(self.qkv_proj(x), rotation, kv_cache, meta)
        out = meta.paged_attention(q, k, v, *kv_cache, self.scale)
        return self.o_proj(out.reshape(x.shape[0], self.q_size))

    def rope_store(self, qkv: torch.Tensor, rotation: Rotation, kv_cache: KVCache,
                   meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q and k rotated, k and v stored in the cache: q [T, H_q, D], k and v [T, H_kv, D]
        for the attention over this step's own tokens."""
        t = qkv.shape[0]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.heads(q.view(t, self.num_heads, self.head_dim),
                          k.view(t, self.num_kv_heads, self.head_dim))
        q, k = apply_rope(q, rotation), apply_rope(k, rotation)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        meta.store_kv(k, v, *kv_cache)
        return q, k, v

    def heads(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q and k heads before RoPE: as they are here (Qwen3 norms them)."""
        return q, k


class CpuAttention(Attention):
    """Its RoPE and KV store in one compiled C call (fp32, bf16 or fp16 on CPU)."""

    def rope_store(self, qkv: torch.Tensor, rotation: Rotation, kv_cache: KVCache,
                   meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return cpu_fused.qk_norm_rope_store(qkv, self.num_heads, self.num_kv_heads, None, None,
                                            0.0, *rotation, *kv_cache, meta.slot_mapping)


class LlamaForCausalLM(DecoderStack):
    cpu_twins = {RMSNorm: CpuRMSNorm, Attention: CpuAttention, MLP: CpuMLP}

    def layer(self, cfg: ModelConfig, index: int) -> nn.Module:
        return DecoderLayer(cfg, Attention(cfg), MLP(cfg))


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2 and Qwen2.5: Llama's architecture with biases on q, k and v."""


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral: Llama's architecture, each query seeing the last ``sliding_window`` tokens."""
