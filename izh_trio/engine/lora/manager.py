"""The engine's LoRA adapters: names to loaded adapters, and the slots they run in.

Every load gets a fresh id, never reused: the prefix cache keys blocks by it, so an adapter
unloaded and loaded again under the same name (perhaps with other weights) never meets the KV
blocks of its predecessor. An unloaded adapter stays in memory until the last sequence that
uses it ends.
"""

from __future__ import annotations

import logging

import torch

from izh_trio.engine.lora.adapter import LoraAdapter, LoraError, LoraTargets, load_adapter
from izh_trio.engine.lora.linear import wrap_linears
from izh_trio.engine.lora.slots import LoraSlots
from izh_trio.engine.lora.weights import LoraWeights
from izh_trio.engine.models.base import CausalLM
from izh_trio.wire import EngineConfig

log = logging.getLogger(__name__)

#: Slots when ``max_loras`` is not given: one per adapter loaded at start, at most this many.
DEFAULT_MAX_LORAS = 8
#: The slot rank when ``max_lora_rank`` is not given and no adapter at start says otherwise.
DEFAULT_MAX_RANK = 16


def lora_enabled(config: EngineConfig) -> bool:
    return bool(config.lora_modules) or config.lora_runtime_updates


class LoraManager:
    def __init__(self, config: EngineConfig, model: CausalLM, dtype: torch.dtype,
                 device: torch.device) -> None:
        """Wraps ``model``'s linears that adapters may target (``lora/linear.py``)."""
        self.targets, self.dtype = LoraTargets.of(type(model), model.config), dtype
        adapters = [load_adapter(name, path, self.targets, config.max_lora_rank, dtype)
                    for name, path in config.lora_modules]
        ranks = [a.rank for a in adapters]
        if config.lora_runtime_updates or not ranks:
            ranks.append(DEFAULT_MAX_RANK)
        self.max_rank = config.max_lora_rank or max(ranks)
        if config.lora_runtime_updates:
            num_slots = config.max_loras or DEFAULT_MAX_LORAS
        else:  # never more slots than adapters: the rest would only take memory
            num_slots = min(config.max_loras or DEFAULT_MAX_LORAS, max(1, len(adapters)))
        self.weights = LoraWeights(self.targets, num_slots, self.max_rank, dtype, device)
        wrap_linears(model, self.weights)
        self.slots = LoraSlots(num_slots, self._write)
        self._ids: dict[str, int] = {}  # loaded name -> id
        self._adapters: dict[int, LoraAdapter] = {}  # id -> adapter, unloaded ones in use too
        self._users: dict[int, int] = {}  # id -> live sequences
        self._next_id = 1
        for adapter in adapters:
            self._add(adapter)
        log.info("LoRA: %d adapters (%s), %d slots of rank %d, %.1f MiB", len(adapters),
                 ", ".join(self._ids) or "none yet", num_slots, self.max_rank,
                 self.weights.nbytes / 2**20)

    def lookup(self, name: str) -> int | None:
        return self._ids.get(name)

    def _add(self, adapter: LoraAdapter) -> int:
        lora_id, self._next_id = self._next_id, self._next_id + 1
        self._ids[adapter.name] = lora_id
        self._adapters[lora_id] = adapter
        self._users[lora_id] = 0
        return lora_id

    def _write(self, slot: int, lora_id: int) -> None:
        self.weights.write(slot, self._adapters[lora_id])

    # ------------------------------------------------------------------ runtime updates
    def load(self, name: str, path: str) -> None:
        """Load (or replace) adapter ``name``; a failure leaves everything as it was."""
        adapter = load_adapter(name, path, self.targets, self.max_rank, self.dtype)
        if name in self._ids:
            self.unload(name)
        self._add(adapter)

    def unload(self, name: str) -> None:
        lora_id = self._ids.pop(name, None)
        if lora_id is None:
            raise LoraError(f"LoRA adapter {name!r} is not loaded")
        self._maybe_drop(lora_id)

    # ------------------------------------------------------------------ live sequences
    def retain(self, lora_id: int) -> None:
        self._users[lora_id] += 1

    def release(self, lora_id: int) -> None:
        self._users[lora_id] -= 1
        self._maybe_drop(lora_id)

    def _maybe_drop(self, lora_id: int) -> None:
        adapter = self._adapters[lora_id]
        if self._users[lora_id] == 0 and self._ids.get(adapter.name) != lora_id:
            del self._adapters[lora_id], self._users[lora_id]
            self.slots.forget(lora_id)
