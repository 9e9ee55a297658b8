"""Llama for causal LM (Llama 2 and 3), reading top-down like the architecture. Qwen2 is the
same with biases on q, k and v, Mistral with a sliding window (``ModelConfig.qkv_bias``,
``sliding_window``: set by their readers; the window is the attention backend's to apply).

Embedding -> N x [RMSNorm -> attention (RoPE, GQA, paged KV) -> residual -> RMSNorm ->
SwiGLU MLP -> residual] -> RMSNorm -> LM head (tied or not). Unlike Qwen3 there is no norm on
q and k. ``attention_bias`` puts biases on q, k, v and o, ``mlp_bias`` on the MLP's linears;
RoPE's frequencies follow the checkpoint's ``rope_type`` (``layers.inv_frequencies``).
Arithmetic follows Hugging Face's implementation step for step so that fp32 logits agree to
rounding. On CPU the norms run on the compiled kernels (``cpu_twins``); RoPE and the KV store
stay torch's (the fused kernel norms q and k, which this architecture does not).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from izh_trio.engine.attention import AttentionMetadata
from izh_trio.engine.loader import ModelConfig
from izh_trio.engine.models.base import CausalLM
from izh_trio.engine.models.layers import (
    CpuRMSNorm,
    RMSNorm,
    RotaryEmbedding,
    Rotation,
    apply_rope,
)

KVCache = tuple[torch.Tensor, torch.Tensor]  # one layer's K and V: [blocks, block, H_kv, D]


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
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = apply_rope(q.view(t, self.num_heads, self.head_dim), rotation)
        k = apply_rope(k.view(t, self.num_kv_heads, self.head_dim), rotation)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        meta.store_kv(k, v, *kv_cache)
        out = meta.paged_attention(q, k, v, *kv_cache, self.scale)
        return self.o_proj(out.reshape(t, self.q_size))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size,
                                      bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, h: torch.Tensor, rotation: Rotation, meta: AttentionMetadata,
                kv_cache: KVCache) -> torch.Tensor:
        attn = self.self_attn(self.input_layernorm(h), rotation, meta, kv_cache)
        h, normed = self.post_attention_layernorm.add(attn, h)
        return h + self.mlp(normed)


class LlamaForCausalLM(CausalLM):
    packed_modules = {
        "qkv_proj": ("q_proj", "k_proj", "v_proj"),
        "gate_up_proj": ("gate_proj", "up_proj"),
    }
    cpu_twins = {RMSNorm: CpuRMSNorm}

    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__(cfg, max_positions)
        self.rope = RotaryEmbedding(cfg.head_dim, cfg.rope or cfg.rope_theta, max_positions)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    @staticmethod
    def decoder_linears(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
        q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
        h, i = cfg.hidden_size, cfg.intermediate_size
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata, kv_caches: list[KVCache]) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        rotation = self.rope.table(positions, h.dtype)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            h = layer(h, rotation, meta, kv_cache)
        return h

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm and head for the rows that sample; fp32 for the sampler."""
        return self.lm_head(self.norm(hidden)).float()


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2 and Qwen2.5: Llama's architecture with biases on q, k and v."""


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral: Llama's architecture, each query seeing the last ``sliding_window`` tokens."""
