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

from izh_trio.engine.loader import ModelConfig, MoeConfig
from izh_trio.engine.models.base import DecoderStack
from izh_trio.engine.models.layers import MLP, CpuMLP, CpuRMSNorm, DecoderLayer, RMSNorm
from izh_trio.engine.models.qwen3 import Attention, CpuAttention

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


class Qwen3MoeForCausalLM(DecoderStack):
    cpu_twins = {RMSNorm: CpuRMSNorm, Attention: CpuAttention, MLP: CpuMLP}

    def layer(self, cfg: ModelConfig, index: int) -> nn.Module:
        moe = cfg.moe
        assert moe is not None, "Qwen3-MoE's config reader sets its mixture"
        return DecoderLayer(cfg, Attention(cfg),
                            SparseMoe(cfg, moe) if moe.sparse(index) else MLP(cfg))

    @staticmethod
    def decoder_linears(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
        """Attention's linears: the ones an adapter may target here (the experts and the
        dense layers' MLPs are not adapted)."""
        linears = DecoderStack.decoder_linears(cfg)
        return {name: linears[name] for name in ("q_proj", "k_proj", "v_proj", "o_proj")}

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
