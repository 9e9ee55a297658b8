"""The model families the engine serves, by the ``model_type`` of a checkpoint's config.json.

Adding a family: its model file beside this one (a ``models.base.CausalLM``: its modules,
``forward``, ``packed_modules``, ``decoder_linears``, optionally ``cpu_twins``) and its entry
in ``FAMILIES``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import attrs

from izh_trio.engine.loader import CheckpointError, Qwen3Config, config_json
from izh_trio.engine.models.base import CausalLM
from izh_trio.engine.models.qwen3 import Qwen3ForCausalLM


@attrs.frozen
class ModelFamily:
    #: Reads config.json, refusing (``CheckpointError``) what the family cannot serve.
    read_config: Callable[[Path], Qwen3Config]
    model: type[CausalLM]


FAMILIES: dict[str, ModelFamily] = {
    "qwen3": ModelFamily(Qwen3Config.from_dir, Qwen3ForCausalLM),
}


def resolve(model_dir: Path) -> tuple[Qwen3Config, type[CausalLM]]:
    """The checkpoint's config, read by its family, and the family's model class. A
    config.json without a ``model_type`` is taken for Qwen3's, as it always was."""
    model_type = config_json(model_dir).get("model_type", "qwen3")
    family = FAMILIES.get(model_type)
    if family is None:
        raise CheckpointError(f"model_type {model_type!r} is not one this engine serves "
                              f"({', '.join(FAMILIES)})")
    return family.read_config(model_dir), family.model
