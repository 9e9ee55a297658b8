"""Read a PEFT LoRA adapter directory into per-module (A, B) pairs, or say why we can't.

Only plain LoRA on the linear layers of the decoder is served: q/k/v/o and gate/up/down. Every
PEFT option that changes the arithmetic beyond ``W x + s * B A x`` (DoRA, biases, saved full
modules, per-module rank or alpha patterns, embedding targets, ...) is refused at load time, by
name, rather than silently served wrong.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import attrs
import torch
from safetensors import safe_open

from izh_trio.engine.loader import ModelConfig
from izh_trio.engine.models.base import CausalLM


@attrs.frozen
class LoraTargets:
    """The linears of a decoder layer an adapter may target, as the model family lays them
    out (its ``decoder_linears`` and ``packed_modules``)."""

    num_layers: int
    #: Checkpoint name -> (in, out) features
    shapes: dict[str, tuple[int, int]]
    #: Each of our linears -> the checkpoint linears in its output columns, in order
    parts: dict[str, tuple[str, ...]]
    #: Checkpoint name -> (our linear it lives in, its index among that linear's parts)
    owner: dict[str, tuple[str, int]]

    @classmethod
    def of(cls, model: type[CausalLM], cfg: ModelConfig) -> LoraTargets:
        shapes = model.decoder_linears(cfg)
        # a packed linear whose parts are not targets (Qwen3-MoE's dense MLPs) is not one
        groups = {ours: names for ours, names in model.packed_modules.items()
                  if all(name in shapes for name in names)}
        packed = {part for parts in groups.values() for part in parts}
        parts = {**groups, **{n: (n,) for n in shapes if n not in packed}}
        owner = {name: (ours, i) for ours, names in parts.items()
                 for i, name in enumerate(names)}
        return cls(cfg.num_hidden_layers, shapes, parts, owner)


#: adapter_config.json keys whose presence (any truthy value) we cannot honour.
_UNSUPPORTED = {
    "use_dora": "DoRA (use_dora)",
    "modules_to_save": "modules_to_save",
    "lora_bias": "LoRA biases (lora_bias)",
    "fan_in_fan_out": "fan_in_fan_out",
    "rank_pattern": "per-module ranks (rank_pattern)",
    "alpha_pattern": "per-module alphas (alpha_pattern)",
    "layer_replication": "layer_replication",
    "target_parameters": "target_parameters",
    "trainable_token_indices": "trainable_token_indices",
    "use_qalora": "QA-LoRA (use_qalora)",
    "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens)",
    "use_bdlora": "use_bdlora",
}
_EMBEDDINGS = {"embed_tokens", "lm_head"}
_WEIGHT = re.compile(r"^base_model\.model\.(?:model\.)?layers\.(\d+)\.(?:self_attn|mlp)\."
                     r"(\w+)\.lora_([AB])\.weight$")


class LoraError(ValueError):
    """An adapter we cannot serve; the message names the adapter and the reason."""


@attrs.frozen
class LoraAdapter:
    name: str
    path: str
    rank: int
    scaling: float
    #: (layer, sub-module name) -> (A [r, in], B [out, r] with the scaling folded in), on CPU
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = attrs.field(repr=False)


def read_config(name: str, path: Path) -> dict[str, Any]:
    """adapter_config.json, checked for what we serve; returns it with ``scaling`` added."""
    def fail(why: str) -> LoraError:
        return LoraError(f"LoRA adapter {name!r} ({path}): {why}")

    file = path / "adapter_config.json"
    if not file.is_file():
        raise fail("no adapter_config.json (a PEFT adapter directory is expected)")
    try:
        raw = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise fail(f"adapter_config.json is unreadable: {exc}") from None
    if not isinstance(raw, dict):
        raise fail("adapter_config.json is not an object")
    if raw.get("peft_type", "LORA") != "LORA":
        raise fail(f"peft_type {raw.get('peft_type')!r} is not supported (only LORA)")
    for key, label in _UNSUPPORTED.items():
        if raw.get(key):
            raise fail(f"{label} is not supported")
    if raw.get("bias", "none") != "none":
        raise fail(f"bias={raw['bias']!r} is not supported (only 'none')")
    r, alpha = raw.get("r"), raw.get("lora_alpha", raw.get("r"))
    if type(r) is not int or r < 1 or not isinstance(alpha, int | float) or alpha <= 0:
        raise fail(f"r={r!r}, lora_alpha={alpha!r}: need a positive integer rank and alpha")
    raw["scaling"] = alpha / math.sqrt(r) if raw.get("use_rslora") else alpha / r
    return raw


def load_adapter(name: str, path: str | Path, targets: LoraTargets, max_rank: int | None,
                 dtype: torch.dtype) -> LoraAdapter:
    """Read and check one adapter against the model; weights on CPU in the model's dtype."""
    path = Path(path)
    config = read_config(name, path)

    def fail(why: str) -> LoraError:
        return LoraError(f"LoRA adapter {name!r} ({path}): {why}")

    names = config.get("target_modules")
    if isinstance(names, list):
        bad = sorted(set(names) - set(targets.shapes))
        if bad:
            what = "embedding targets are" if set(bad) & _EMBEDDINGS else "targets are"
            raise fail(f"{what} not supported: {bad} (supported: {sorted(targets.shapes)})")
    rank, scaling = config["r"], config["scaling"]
    if max_rank is not None and rank > max_rank:
        raise fail(f"rank {rank} exceeds max_lora_rank {max_rank}")
    file = path / "adapter_model.safetensors"
    if not file.is_file():
        raise fail("no adapter_model.safetensors")
    try:
        with safe_open(file, framework="pt") as f:
            tensors = {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118
    except Exception as exc:  # safetensors raises its own error types
        raise fail(f"adapter_model.safetensors is unreadable: {exc}") from None
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        m = _WEIGHT.match(key)
        if m is None or m[2] not in targets.shapes:
            raise fail(f"unsupported weight {key!r} (only LoRA A/B of "
                       f"{', '.join(targets.shapes)} in the decoder layers)")
        layer, sub = int(m[1]), m[2]
        if layer >= targets.num_layers:
            raise fail(f"{key}: the model has {targets.num_layers} layers")
        halves.setdefault((layer, sub), {})[m[3]] = tensor
    if not halves:
        raise fail("adapter_model.safetensors holds no LoRA weights")
    weights = {}
    for (layer, sub), ab in sorted(halves.items()):
        if set(ab) != {"A", "B"}:
            raise fail(f"layer {layer} {sub} has lora_{''.join(ab)} without its pair")
        a, b = ab["A"], ab["B"]
        fan_in, fan_out = targets.shapes[sub]
        if tuple(a.shape) != (rank, fan_in) or tuple(b.shape) != (fan_out, rank):
            raise fail(f"layer {layer} {sub}: A {tuple(a.shape)}, B {tuple(b.shape)}; expected "
                       f"A {(rank, fan_in)}, B {(fan_out, rank)} for rank {rank}")
        weights[(layer, sub)] = (a.to(dtype).contiguous(), (b.float() * scaling).to(dtype))
    return LoraAdapter(name=name, path=str(path), rank=rank, scaling=scaling, weights=weights)
