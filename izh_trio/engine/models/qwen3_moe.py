"""Qwen3-MoE for causal LM: Qwen3's attention, and in the sparse layers a mixture of experts in
place of the MLP.

A token's router logits (a linear layer, ``gate``) go through a softmax in fp32; its top-k
experts run it, their outputs weighted by those probabilities (renormalised to sum to 1 with
``norm_topk_prob``). The experts are computed grouped: the step's (token, expert) pairs are
sorted by expert, each expert runs once on all of its tokens, and the weighted outputs are
added back per token in expert order, as transformers adds them. Layers in ``mlp_only_layers``
(or off the ``decoder_sparse_step``) keep a dense MLP. Each expert's gate and up projections
are stacked into one ``[experts, 2 I, H]`` parameter, the down projections into ``[experts, H,
I]``, filled from the checkpoint's per-expert weights (``stacked_slot``).
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from izh_trio.engine.attention import AttentionMetadata
from izh_trio.engine.loader import ModelConfig, MoeConfig
from izh_trio.engine.models.base import CausalLM
from izh_trio.engine.models.layers import CpuRMSNorm, RMSNorm, RotaryEmbedding, Rotation
from izh_trio.engine.models.qwen3 import MLP, Attention, CpuAttention, KVCache

_EXPERT = re.compile(r"^(layers\.\d+\.mlp)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


class SparseMoe(nn.Module):
    def __init__(self, cfg: ModelConfig, moe: MoeConfig) -> None:
        super().__init__()
        self.moe = moe
        h, i = cfg.hidden_size, moe.intermediate_size
        self.gate = nn.Linear(h, moe.num_experts, bias=False)
        self.w13 = nn.Parameter(torch.empty(moe.num_experts, 2 * i, h))  # gate, then up
        self.w2 = nn.Parameter(torch.empty(moe.num_experts, h, i))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.moe.top_k
        probs = F.softmax(self.gate(x), dim=-1, dtype=torch.float32)
        weights, experts = probs.topk(k, dim=-1)  # [T, k]
        if self.moe.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights.to(x.dtype)
        order = experts.flatten().argsort(stable=True)  # pairs grouped by expert, in order
        tokens = order // k
        counts = torch.bincount(experts.flatten(), minlength=self.moe.num_experts).tolist()
        out = torch.empty(len(order), x.shape[1], dtype=x.dtype, device=x.device)
        start = 0
        for expert, n in enumerate(counts):
            if n:
                gate, up = F.linear(x[tokens[start:start + n]], self.w13[expert]).chunk(2, -1)
                out[start:start + n] = F.linear(F.silu(gate) * up, self.w2[expert])
                start += n
        out *= weights.flatten()[order].unsqueeze(1)
        return torch.zeros_like(x).index_add_(0, tokens, out)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, moe: MoeConfig, index: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp: nn.Module = SparseMoe(cfg, moe) if moe.sparse(index) else MLP(cfg)

    def forward(self, h: torch.Tensor, rotation: Rotation, meta: AttentionMetadata,
                kv_cache: KVCache) -> torch.Tensor:
        attn = self.self_attn(self.input_layernorm(h), rotation, meta, kv_cache)
        h, normed = self.post_attention_layernorm.add(attn, h)
        return h + self.mlp(normed)


class Qwen3MoeForCausalLM(CausalLM):
    packed_modules = {
        "qkv_proj": ("q_proj", "k_proj", "v_proj"),
        "gate_up_proj": ("gate_proj", "up_proj"),  # the dense layers' MLPs
    }
    cpu_twins = {RMSNorm: CpuRMSNorm, Attention: CpuAttention}

    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__(cfg, max_positions)
        assert cfg.moe is not None, "Qwen3-MoE's config reader sets its mixture"
        self.rope = RotaryEmbedding(cfg.head_dim, cfg.rope or cfg.rope_theta, max_positions)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, cfg.moe, i)
                                    for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    @staticmethod
    def decoder_linears(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
        """Attention's linears: the ones an adapter may target here (the experts and the
        dense layers' MLPs are not adapted)."""
        q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
        h = cfg.hidden_size
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h)}

    def stacked_slot(self, name: str) -> tuple[str, tuple[int | slice, ...], int] | None:
        match = _EXPERT.match(name)
        if match is None:
            return None
        layer, expert, proj = match[1], int(match[2]), match[3]
        moe = self.config.moe
        assert moe is not None
        i, pieces = moe.intermediate_size, moe.num_experts
        if proj == "down_proj":
            return f"{layer}.w2", (expert,), pieces
        half = slice(0, i) if proj == "gate_proj" else slice(i, 2 * i)
        return f"{layer}.w13", (expert, half), 2 * pieces

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
