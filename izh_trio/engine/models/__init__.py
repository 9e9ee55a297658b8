"""The model families the engine serves, by the ``architectures`` of a checkpoint's config.json.

Adding a family: its model file beside this one (a ``models.base.CausalLM``: its modules,
``forward``, ``packed_modules``, ``decoder_linears``, optionally ``cpu_twins``) and its entry
in ``FAMILIES``: how its config is read (the switches its architecture sets) and its class.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import attrs

from izh_trio.engine.loader import CheckpointError, ModelConfig, config_json
from izh_trio.engine.models.base import CausalLM
from izh_trio.engine.models.llama import (
    LlamaForCausalLM,
    MistralForCausalLM,
    Qwen2ForCausalLM,
)
from izh_trio.engine.models.qwen3 import Qwen3ForCausalLM
from izh_trio.engine.models.qwen3_moe import Qwen3MoeForCausalLM


@attrs.frozen
class ModelFamily:
    model_type: str  #: what config.json's ``model_type`` says of it
    #: Reads config.json, refusing (``CheckpointError``) what the family cannot serve.
    read_config: Callable[[Path], ModelConfig]
    model: type[CausalLM]


FAMILIES: dict[str, ModelFamily] = {
    "Qwen3ForCausalLM": ModelFamily("qwen3", ModelConfig.from_dir, Qwen3ForCausalLM),
    "LlamaForCausalLM": ModelFamily("llama", ModelConfig.from_dir, LlamaForCausalLM),
    "Qwen2ForCausalLM": ModelFamily("qwen2", partial(ModelConfig.from_dir, qkv_bias=True),
                                    Qwen2ForCausalLM),
    "MistralForCausalLM": ModelFamily("mistral", partial(ModelConfig.from_dir, windowed=True),
                                      MistralForCausalLM),
    "Qwen3MoeForCausalLM": ModelFamily("qwen3_moe", partial(ModelConfig.from_dir, experts=True),
                                       Qwen3MoeForCausalLM),
}
#: A config.json without ``architectures`` names its family by ``model_type`` alone.
BY_MODEL_TYPE = {family.model_type: name for name, family in FAMILIES.items()}


def resolve(model_dir: Path) -> tuple[ModelConfig, type[CausalLM]]:
    """The checkpoint's config, read by its family, and the family's model class. A
    config.json with neither ``architectures`` nor ``model_type`` is taken for Qwen3's, as it
    always was."""
    raw = config_json(model_dir)
    names = raw.get("architectures") or [BY_MODEL_TYPE.get(raw.get("model_type", "qwen3"),
                                                           str(raw.get("model_type")))]
    family = FAMILIES.get(names[0]) if isinstance(names, list) and names else None
    if family is None:
        raise CheckpointError(f"architecture {names[0]!r} is not one this engine serves "
                              f"(it serves {', '.join(FAMILIES)})")
    if raw.get("model_type", family.model_type) != family.model_type:
        raise CheckpointError(f"config.json says {names[0]} but model_type "
                              f"{raw['model_type']!r}, not {family.model_type!r}")
    return family.read_config(model_dir), family.model
