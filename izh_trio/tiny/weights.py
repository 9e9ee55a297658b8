"""Random fp32 Qwen3 weights under Hugging Face's exact tensor names, made with numpy only."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from izh_trio.tiny.spec import TinySpec


def weight_shapes(spec: TinySpec) -> dict[str, tuple[int, ...]]:
    """Every tensor name and shape, in the fixed order random draws are taken."""
    h, inter, d = spec.hidden_size, spec.intermediate_size, spec.head_dim
    q_out, kv_out = spec.num_attention_heads * d, spec.num_key_value_heads * d
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (spec.vocab_size, h)}
    for i in range(spec.num_hidden_layers):
        p = f"model.layers.{i}"
        shapes |= {
            f"{p}.input_layernorm.weight": (h,),
            f"{p}.self_attn.q_proj.weight": (q_out, h),
            f"{p}.self_attn.k_proj.weight": (kv_out, h),
            f"{p}.self_attn.v_proj.weight": (kv_out, h),
            f"{p}.self_attn.o_proj.weight": (h, q_out),
            f"{p}.self_attn.q_norm.weight": (d,),
            f"{p}.self_attn.k_norm.weight": (d,),
            f"{p}.post_attention_layernorm.weight": (h,),
            f"{p}.mlp.gate_proj.weight": (inter, h),
            f"{p}.mlp.up_proj.weight": (inter, h),
            f"{p}.mlp.down_proj.weight": (h, inter),
        }
    shapes["model.norm.weight"] = (h,)
    if not spec.tie_word_embeddings:
        shapes["lm_head.weight"] = (spec.vocab_size, h)
    return shapes


def random_weights(spec: TinySpec) -> dict[str, np.ndarray]:
    """RMSNorm scales are ones (as at init); everything else is N(0, init_std) from ``seed``."""
    rng = np.random.default_rng(spec.seed)
    std = np.float32(spec.init_std)
    tensors: dict[str, np.ndarray] = {}
    for name, shape in weight_shapes(spec).items():
        if name.endswith("norm.weight"):
            tensors[name] = np.ones(shape, dtype=np.float32)
        else:
            tensors[name] = rng.standard_normal(shape, dtype=np.float32) * std
    return tensors


def write_weights(spec: TinySpec, path: Path) -> None:
    """Save as ``model.safetensors`` with the metadata torch-side loaders expect."""
    save_file(random_weights(spec), str(path), metadata={"format": "pt"})
