"""Qwen3 for causal LM, reading top-down like the architecture.

Embedding -> N x [RMSNorm -> attention (q/k RMSNorm, RoPE, GQA, paged KV) -> residual ->
RMSNorm -> SwiGLU MLP -> residual] -> RMSNorm -> LM head (tied or not). Arithmetic follows
Hugging Face's implementation step for step so that fp32 logits agree to rounding.

In fp32 on CPU with the torch attention backend, the norms, RoPE and the KV store run as
compiled C loops instead (``cpu_fused.py``: the same arithmetic, a few calls a layer instead
of some sixty small torch ops); ``Qwen3ForCausalLM`` decides that once, at construction.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from izh_trio.engine import cpu_fused
from izh_trio.engine.attention import TORCH_BACKEND, AttentionBackend
from izh_trio.engine.loader import CheckpointError, Qwen3Config

if TYPE_CHECKING:
    from izh_trio.engine.lora.weights import LoraStep


class RMSNorm(nn.Module):
    fused = False  # the compiled CPU kernel does it (set by Qwen3ForCausalLM)

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return cpu_fused.rms_norm(x, self.weight, self.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual add before the norm: ``h = residual + x`` and ``norm(h)``."""
        if self.fused:
            return cpu_fused.add_rms_norm(x, residual, self.weight, self.eps)
        h = residual + x
        return h, self(h)


class RotaryEmbedding(nn.Module):
    """cos/sin for every position, computed once in fp32 (as transformers does)."""

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


Rotation = tuple[torch.Tensor, torch.Tensor]  # cos, sin: [T, 1, D]


def apply_rope(x: torch.Tensor, rotation: Rotation) -> torch.Tensor:
    """x: [T, H, D], rotated by each token's position (the rotate-half convention)."""
    cos, sin = rotation
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class Attention(nn.Module):
    fused = False  # norms, RoPE and the KV store in one compiled CPU call (see the model)

    def __init__(self, cfg: Qwen3Config, backend: AttentionBackend, layer_idx: int = 0) -> None:
        super().__init__()
        self.backend = backend
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(
            cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.attention_bias
        )
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=cfg.attention_bias)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.scale = self.head_dim**-0.5

    def forward(
        self, x: torch.Tensor, rotation: Rotation, meta: Any,  # the backend's metadata
        kv_cache: tuple[torch.Tensor, torch.Tensor], lora: LoraStep | None = None,
    ) -> torch.Tensor:
        t = x.shape[0]
        qkv = self.qkv_proj(x)
        if lora is not None:
            lora.add(self.layer_idx, "qkv_proj", x, qkv)
        q, k, v = self.norm_rope_store(qkv, rotation, kv_cache, meta.slot_mapping)
        out = self.backend.paged_attention(q, k, v, *kv_cache, meta, self.scale)
        out = out.reshape(t, self.q_size)
        if lora is None:
            return self.o_proj(out)
        return lora.add(self.layer_idx, "o_proj", out, self.o_proj(out))

    def norm_rope_store(
        self, qkv: torch.Tensor, rotation: Rotation, kv_cache: tuple[torch.Tensor, torch.Tensor],
        slot_mapping: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q and k normed per head and rotated, k and v stored in the cache: q [T, H_q, D],
        k and v [T, H_kv, D] for the attention over this step's own tokens."""
        if self.fused:  # q_norm and k_norm share the config's eps
            return cpu_fused.qk_norm_rope_store(
                qkv, self.num_heads, self.num_kv_heads, self.q_norm.weight, self.k_norm.weight,
                self.q_norm.eps, *rotation, *kv_cache, slot_mapping)
        t = qkv.shape[0]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = apply_rope(self.q_norm(q.view(t, self.num_heads, self.head_dim)), rotation)
        k = apply_rope(self.k_norm(k.view(t, self.num_kv_heads, self.head_dim)), rotation)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        self.backend.store_kv(k, v, *kv_cache, slot_mapping)
        return q, k, v


class MLP(nn.Module):
    def __init__(self, cfg: Qwen3Config, layer_idx: int = 0) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, lora: LoraStep | None = None) -> torch.Tensor:
        if lora is None:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
            return self.down_proj(F.silu(gate) * up)
        gate, up = lora.add(self.layer_idx, "gate_up_proj", x, self.gate_up_proj(x)).chunk(2, -1)
        act = F.silu(gate) * up
        return lora.add(self.layer_idx, "down_proj", act, self.down_proj(act))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: Qwen3Config, backend: AttentionBackend, layer_idx: int = 0) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, backend, layer_idx)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg, layer_idx)

    def forward(
        self, h: torch.Tensor, rotation: Rotation, meta: Any,
        kv_cache: tuple[torch.Tensor, torch.Tensor], lora: LoraStep | None = None,
    ) -> torch.Tensor:
        attn = self.self_attn(self.input_layernorm(h), rotation, meta, kv_cache, lora)
        h, normed = self.post_attention_layernorm.add(attn, h)
        return h + self.mlp(normed, lora)


class Qwen3ForCausalLM(nn.Module):
    def __init__(self, cfg: Qwen3Config, max_positions: int,
                 attention: AttentionBackend = TORCH_BACKEND) -> None:
        super().__init__()
        self.config = cfg
        self.rope = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, max_positions)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, attention, i)
                                    for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.fused = self._use_cpu_kernels(attention)

    def _use_cpu_kernels(self, attention: AttentionBackend) -> bool:
        """The one switch to the compiled kernels: fp32 on CPU (where the model is built) with
        the torch attention backend, whose KV store the kernel takes over."""
        weight = self.embed_tokens.weight
        fused = (attention is TORCH_BACKEND and weight.device.type == "cpu"
                 and weight.dtype == torch.float32 and cpu_fused.available())
        for module in self.modules():
            if isinstance(module, RMSNorm | Attention):
                module.fused = fused
        return fused

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: Any,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]], lora: LoraStep | None = None,
    ) -> torch.Tensor:
        """``lora``: this step's tokens grouped by adapter; None when no token has one."""
        h = self.embed_tokens(input_ids)
        rotation = self.rope.table(positions, h.dtype)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            h = layer(h, rotation, meta, kv_cache, lora)
        return h

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm and head for the rows that sample; fp32 for the sampler."""
        return self.lm_head(self.norm(hidden)).float()

    # ------------------------------------------------------------------ weights
    _FUSED = {
        "q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
        "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
    }

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Map Hugging Face names onto this module, fusing q/k/v and gate/up as they arrive."""
        params = dict(self.named_parameters())
        pending: dict[str, dict[int, torch.Tensor]] = {}
        loaded: set[str] = set()
        for hf_name, tensor in weights:
            name = hf_name.removeprefix("model.")
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue
            parts = name.split(".")
            if len(parts) >= 2 and parts[-2] in self._FUSED:
                fused, idx = self._FUSED[parts[-2]]
                target = ".".join([*parts[:-2], fused, parts[-1]])
                group = pending.setdefault(target, {})
                group[idx] = tensor
                if len(group) < (3 if fused == "qkv_proj" else 2):
                    continue
                tensor, name = torch.cat([group[i] for i in sorted(group)]), target
                del pending[target]
            if name not in params:
                raise CheckpointError(f"unexpected weight {hf_name!r}")
            param = params[name]
            if param.shape != tensor.shape:
                raise CheckpointError(f"{hf_name}: shape {tuple(tensor.shape)}, "
                                      f"expected {tuple(param.shape)}")
            with torch.no_grad():
                param.copy_(tensor)
            loaded.add(name)
        missing = set(params) - loaded - ({"lm_head.weight"} if self.config.tie_word_embeddings
                                          else set())
        if missing or pending:
            raise CheckpointError(f"checkpoint lacks weights: {sorted(missing | set(pending))}")
