"""Layers Qwen3-style decoders share: RMSNorm, rotary position embedding.

Arithmetic follows Hugging Face's implementation step for step so that fp32 logits agree to
rounding. ``CpuRMSNorm`` is RMSNorm on the compiled CPU kernels (``cpu_fused.py``), swapped in
at load time where they run (``CausalLM.use_cpu_twins``).
"""

from __future__ import annotations

import torch
from torch import nn

from izh_trio.engine import cpu_fused


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual add before the norm: ``h = residual + x`` and ``norm(h)``."""
        h = residual + x
        return h, self(h)


class CpuRMSNorm(RMSNorm):
    """The same norm, and its residual add, each one compiled C call (fp32 or bf16 on
    CPU)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cpu_fused.rms_norm(x, self.weight, self.eps)

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return cpu_fused.add_rms_norm(x, residual, self.weight, self.eps)


Rotation = tuple[torch.Tensor, torch.Tensor]  # cos, sin: [T, 1, D]


class RotaryEmbedding(nn.Module):
    """cos/sin for every position, computed once in fp32 (as transformers does)."""

    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, head_dim: int, theta: float, max_positions: int) -> None:
        super().__init__()
        exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        inv_freq = 1.0 / (theta**exponent)
        freqs = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def table(self, positions: torch.Tensor, dtype: torch.dtype) -> Rotation:
        """cos/sin of this step's positions, looked up once and shared by every layer."""
        return (self.cos[positions].unsqueeze(1).to(dtype),
                self.sin[positions].unsqueeze(1).to(dtype))


def apply_rope(x: torch.Tensor, rotation: Rotation) -> torch.Tensor:
    """x: [T, H, D], rotated by each token's position (the rotate-half convention)."""
    cos, sin = rotation
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin
