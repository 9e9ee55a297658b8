"""Read a Hugging Face checkpoint directory: config, generation defaults and safetensors
weights."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import torch
from safetensors import safe_open

from izh_trio.engine import cpu_attention, cpu_fused, cpu_linear_blocked

_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
}


class CheckpointError(ValueError):
    """The directory is not a checkpoint we can serve; the message says why."""


#: rope_type -> the keys of its parameters config.json must give (beside ``rope_type`` and
#: theta); optional ones (yarn's ``beta_fast``...) are read where present.
ROPE_TYPES: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings"),
    "yarn": ("factor",),
}


@attrs.frozen
class RopeScaling:
    """A checkpoint's rotary embedding: its theta, and a scaling of its frequencies."""

    theta: float
    kind: str = "default"
    #: The scaling's numeric parameters, as config.json names them (``factor``...).
    params: tuple[tuple[str, float], ...] = ()

    def get(self, key: str, default: float | None = None) -> float:
        value = dict(self.params).get(key, default)
        if value is None:
            raise KeyError(key)
        return value

    @classmethod
    def from_config(cls, raw: dict[str, Any]) -> RopeScaling:
        # Both spellings: transformers < 4.56 wrote rope_theta and rope_scaling, newer writes
        # rope_parameters holding both.
        rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        kind = rope.get("rope_type", rope.get("type")) or "default"
        if kind not in ROPE_TYPES:
            raise CheckpointError(f"rope_type {kind!r} is not supported "
                                  f"({', '.join(ROPE_TYPES)})")
        missing = [k for k in ROPE_TYPES[kind] if not isinstance(rope.get(k), int | float)]
        if missing:
            raise CheckpointError(f"rope_type {kind!r} needs {', '.join(missing)}")
        theta = rope.get("rope_theta", raw.get("rope_theta", 10000.0))
        params = {k: float(v) for k, v in rope.items() if k not in ("rope_theta", "rope_type")
                  and isinstance(v, int | float) and not isinstance(v, bool)}
        if kind != "default":  # yarn, llama3: the context they were trained on, by default
            params.setdefault("original_max_position_embeddings",
                              float(raw.get("max_position_embeddings", 32768)))
            if isinstance(rope.get("truncate"), bool):
                params["truncate"] = float(rope["truncate"])
        return cls(float(theta), kind, tuple(sorted(params.items())))


@attrs.frozen
class MoeConfig:
    """A mixture of experts (Qwen3-MoE): which layers have one, and how it routes."""

    num_experts: int
    top_k: int  #: experts a token goes to
    intermediate_size: int  #: each expert's
    norm_topk_prob: bool  #: the top-k weights renormalised to sum to 1
    decoder_sparse_step: int = 1  #: every this-many-th layer has a mixture ...
    mlp_only_layers: tuple[int, ...] = ()  #: ... but these, which keep a dense MLP

    def sparse(self, layer: int) -> bool:
        return layer not in self.mlp_only_layers and (layer + 1) % self.decoder_sparse_step == 0

    @classmethod
    def from_config(cls, raw: dict[str, Any]) -> MoeConfig:
        try:
            return cls(int(raw.get("num_experts") or raw["num_local_experts"]),
                       int(raw["num_experts_per_tok"]),
                       int(raw["moe_intermediate_size"]), bool(raw.get("norm_topk_prob", False)),
                       int(raw.get("decoder_sparse_step", 1) or 1),
                       tuple(int(i) for i in raw.get("mlp_only_layers") or ()))
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"a mixture of experts needs num_experts, "
                                  f"num_experts_per_tok and moe_intermediate_size ({exc})") \
                from None


@attrs.frozen
class ModelConfig:
    """What the engine reads of a checkpoint's config.json, whatever its family; a family's
    reader (``models.FAMILIES``) sets the switches its architecture has."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  #: biases on q, k, v and o (Llama's ``attention_bias``)
    dtype: torch.dtype
    eos_token_ids: tuple[int, ...]
    architecture: str
    qkv_bias: bool = False  #: biases on q, k and v only (Qwen2)
    mlp_bias: bool = False
    rope: RopeScaling | None = None  #: None: plain RoPE at ``rope_theta``
    #: Every layer's attention sees the last this many tokens only (Mistral); None: all.
    sliding_window: int | None = None
    moe: MoeConfig | None = None  #: the layers' mixtures of experts (Qwen3-MoE)

    @classmethod
    def from_dir(cls, model_dir: Path, *, windowed: bool = False, experts: bool = False,
                 **switches: Any) -> ModelConfig:
        """The config; ``windowed``: the family reads ``sliding_window`` (Mistral's), others
        refuse a window they would not apply (Qwen2's ``use_sliding_window``); ``experts``:
        it reads its mixture of experts."""
        raw = config_json(model_dir)
        if experts:
            switches["moe"] = MoeConfig.from_config(raw)
        window = raw.get("sliding_window") if windowed else None
        if window is not None and (not isinstance(window, int) or window < 1):
            raise CheckpointError(f"sliding_window {window!r} is not a positive integer")
        if raw.get("use_sliding_window"):
            raise CheckpointError("use_sliding_window (windows on some layers only) is not "
                                  "supported")
        arch = (raw.get("architectures") or ["Qwen3ForCausalLM"])[0]
        heads = raw["num_attention_heads"]
        rope = RopeScaling.from_config(raw)
        dtype_name = raw.get("dtype") or raw.get("torch_dtype") or "float32"
        if dtype_name not in _DTYPES:
            raise CheckpointError(f"unsupported dtype {dtype_name!r}")
        return cls(
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=rope.theta,
            max_position_embeddings=raw.get("max_position_embeddings", 32768),
            tie_word_embeddings=raw.get("tie_word_embeddings", False),
            attention_bias=raw.get("attention_bias", False),
            dtype=_DTYPES[dtype_name],
            eos_token_ids=_eos_ids(model_dir, raw),
            architecture=arch,
            mlp_bias=raw.get("mlp_bias", False),
            rope=rope,
            sliding_window=window,
            **switches,
        )


def config_json(model_dir: Path) -> dict[str, Any]:
    """The checkpoint's config.json, as parsed."""
    path = model_dir / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{model_dir} has no config.json")
    config: dict[str, Any] = json.loads(path.read_text())
    return config


def _eos_ids(model_dir: Path, config: dict[str, Any]) -> tuple[int, ...]:
    """generation_config.json's eos list wins: Qwen3 chat ends on <|im_end|>, not config's eos."""
    ids: list[int] = []
    gen = model_dir / "generation_config.json"
    for source in (json.loads(gen.read_text()) if gen.is_file() else {}, config):
        eos = source.get("eos_token_id")
        for tok in eos if isinstance(eos, list) else [eos]:
            if isinstance(tok, int) and tok not in ids:
                ids.append(tok)
    return tuple(ids)


def resolve_dtype(name: str, checkpoint: torch.dtype, device: torch.device,
                  native_bf16: bool | None = None, fp16_kernels: bool | None = None,
                  bf16_hardware: bool | None = None) -> torch.dtype:
    """The dtype to run in: ``name``, or for ``auto`` the checkpoint's, except on a CPU:

    * a bf16 checkpoint runs in bf16 where oneDNN has bf16 kernels (``native_bf16``, asked of
      it when not given: AVX512-BF16 or AMX, or AVX-512 with BW, VL and DQ, where it and our
      kernels widen bf16 to fp32 as they read it), else in fp32, which such a CPU would only
      have emulated more slowly;
    * an fp16 one runs in bf16 where bf16 is multiplied in hardware (``bf16_hardware``:
      AVX512-BF16's ``vdpbf16ps``, asked of our linear kernel when not given), as vLLM's CPU
      backend casts fp16 to bf16 (faster at a batch; fp16's range fits bf16's); else in fp16
      where our kernels widen it as they stream (``fp16_kernels``: AVX-512 with F16C; half
      fp32's bytes, the checkpoint's exact weights); else as a bf16 one would.

    An fp32 checkpoint stays fp32: it asked for it."""
    if name != "auto":
        return _DTYPES[name]
    if device.type != "cpu" or checkpoint == torch.float32:
        return checkpoint
    if checkpoint == torch.float16:
        if bf16_hardware is None:
            bf16_hardware = cpu_linear_blocked.bf16_in_hardware()
        if bf16_hardware:
            return torch.bfloat16
        if fp16_kernels is None:
            fp16_kernels = cpu_kernels_serve(torch.float16)
        if fp16_kernels:
            return torch.float16
    if native_bf16 is None:
        native_bf16 = cpu_has_native_bf16()
    return torch.bfloat16 if native_bf16 else torch.float32


def cpu_kernels_serve(dtype: torch.dtype) -> bool:
    """Whether every kernel of a ``dtype`` CPU model is ours (the blocked linear, the fused
    kernels and the attention), not torch's path (for fp16, an emulated one)."""
    return (cpu_linear_blocked.available(dtype) and cpu_fused.serves(dtype)
            and cpu_attention.serves(dtype))


def cpu_has_native_bf16() -> bool:
    """Whether oneDNN has bf16 kernels on this CPU: in hardware (AVX512-BF16, AMX) or on
    AVX-512 with BW, VL and DQ, widening to fp32 (elsewhere bf16 runs on slow generic code)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (RuntimeError, AttributeError):
        return False


def iter_safetensors(model_dir: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) from model.safetensors or every shard of its index."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [model_dir / s for s in shards]
    elif (model_dir / "model.safetensors").is_file():
        files = [model_dir / "model.safetensors"]
    else:
        raise CheckpointError(f"{model_dir} has neither model.safetensors nor its index")
    for file in files:
        with safe_open(file, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                yield name, f.get_tensor(name)
