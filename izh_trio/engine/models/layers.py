"""Layers the decoder families share: RMSNorm, rotary position embedding, the SwiGLU MLP and
the pre-norm decoder layer around a family's attention.

Arithmetic follows Hugging Face's implementation step for step so that fp32 logits agree to
rounding. ``CpuRMSNorm`` is RMSNorm on the compiled CPU kernels (``cpu_fused.py``), swapped in
at load time where they run (``CausalLM.use_cpu_twins``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from izh_trio.engine import cpu_fused
from izh_trio.engine.attention import AttentionMetadata
from izh_trio.engine.loader import ModelConfig, RopeScaling

KVCache = tuple[torch.Tensor, torch.Tensor]  # one layer's K and V: [blocks, block, H_kv, D]


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
    """The same norm, and its residual add, each one compiled C call (fp32, bf16 or fp16
    on CPU)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cpu_fused.rms_norm(x, self.weight, self.eps)

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return cpu_fused.add_rms_norm(x, residual, self.weight, self.eps)


Rotation = tuple[torch.Tensor, torch.Tensor]  # cos, sin: [T, 1, D]


def inv_frequencies(head_dim: int, rope: RopeScaling) -> tuple[torch.Tensor, float]:
    """RoPE's inverse frequencies [head_dim / 2] for a checkpoint's rope type, and the factor
    cos and sin are scaled by (1 but for yarn). ``linear`` divides every frequency by the
    factor; ``llama3`` divides the low ones (wavelengths longer than the original context over
    ``low_freq_factor``), keeps the high ones and blends between; ``yarn`` interpolates the
    dimensions that turn fewer than ``beta_slow`` times over the original context, keeps those
    turning more than ``beta_fast`` times, ramps between, and scales attention by
    ``0.1 ln(factor) + 1``."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (rope.theta**exponent)
    if rope.kind == "linear":
        return inv_freq / rope.get("factor"), 1.0
    if rope.kind == "llama3":
        factor, old = rope.get("factor"), rope.get("original_max_position_embeddings")
        low, high = rope.get("low_freq_factor"), rope.get("high_freq_factor")
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        between = (wavelen >= old / high) & (wavelen <= old / low)
        return torch.where(between, blended, scaled), 1.0
    if rope.kind == "yarn":
        return _yarn(head_dim, rope)
    return inv_freq, 1.0


def _yarn(head_dim: int, rope: RopeScaling) -> tuple[torch.Tensor, float]:
    factor, old = rope.get("factor"), rope.get("original_max_position_embeddings")

    def dim_turning(turns: float) -> float:  # the dimension that turns ``turns`` times
        return head_dim * math.log(old / (turns * 2 * math.pi)) / (2 * math.log(rope.theta))

    low, high = dim_turning(rope.get("beta_fast", 32.0)), dim_turning(rope.get("beta_slow", 1.0))
    if rope.get("truncate", 1.0):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    high = high + 0.001 if low == high else high
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: the dimension keeps its frequency; 0: it is interpolated
    powers = rope.theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    inv_freq = (1.0 / (factor * powers)) * (1 - keep) + (1.0 / powers) * keep

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = dict(rope.params).get("attention_factor")
    if attention is None:
        m, m_all = dict(rope.params).get("mscale"), dict(rope.params).get("mscale_all_dim")
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    return inv_freq, attention


class RotaryEmbedding(nn.Module):
    """cos/sin for every position, computed once in fp32 (as transformers does)."""

    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, head_dim: int, rope: float | RopeScaling, max_positions: int) -> None:
        super().__init__()
        rope = rope if isinstance(rope, RopeScaling) else RopeScaling(float(rope))
        inv_freq, scale = inv_frequencies(head_dim, rope)
        freqs = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos() * scale, persistent=False)
        self.register_buffer("sin", emb.sin() * scale, persistent=False)

    def table(self, positions: torch.Tensor, dtype: torch.dtype) -> Rotation:
        """cos/sin of this step's positions, looked up once and shared by every layer."""
        return (self.cos[positions].unsqueeze(1).to(dtype),
                self.sin[positions].unsqueeze(1).to(dtype))


def apply_rope(x: torch.Tensor, rotation: Rotation) -> torch.Tensor:
    """x: [T, H, D], rotated by each token's position (the rotate-half convention)."""
    cos, sin = rotation
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``, gate and up as one linear; biases where the
    config has ``mlp_bias``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size,
                                      bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class CpuMLP(MLP):
    """The same MLP with SiLU and its product one compiled C call (fp32, bf16 or fp16 on CPU)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(cpu_fused.silu_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    """RMSNorm -> attention -> residual -> RMSNorm -> MLP (or a mixture) -> residual."""

    def __init__(self, cfg: ModelConfig, attention: nn.Module, mlp: nn.Module) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = attention
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = mlp

    def forward(self, x: torch.Tensor, rotation: Rotation, meta: AttentionMetadata,
                kv_cache: KVCache, residual: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer on hidden states ``residual + x`` (``x`` alone for the first), returned
        the same way: its MLP's output and the residual stream, whose sum the next layer's
        input norm takes in the same call as its add (one fused kernel on CPU)."""
        if residual is None:
            residual, normed = x, self.input_layernorm(x)
        else:
            residual, normed = self.input_layernorm.add(x, residual)
        attn = self.self_attn(normed, rotation, meta, kv_cache)
        residual, normed = self.post_attention_layernorm.add(attn, residual)
        return self.mlp(normed), residual
