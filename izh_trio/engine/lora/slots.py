"""Which adapters sit in the model's LoRA slots: pins by running sequences, LRU eviction.

Plain Python, no torch, so the scheduler's use of it is tested without a model. A running
sequence pins its adapter (one count per sequence); only unpinned adapters are evicted, the
least recently released first. Putting an adapter into a slot calls ``load(slot, lora_id)``,
which writes the weights: a slot write, nothing else moves.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable


class LoraSlots:
    def __init__(self, num_slots: int, load: Callable[[int, int], None]) -> None:
        if num_slots < 1:
            raise ValueError("need at least one LoRA slot")
        self.num_slots = num_slots
        self._load = load
        self._slot_of: dict[int, int] = {}  # resident lora id -> slot
        self._free = list(range(num_slots - 1, -1, -1))  # pop() hands out slot 0 first
        self._pins: dict[int, int] = {}  # resident lora id -> running sequences using it
        self._idle: OrderedDict[int, None] = OrderedDict()  # resident, unpinned; front = LRU
        self._forgotten: set[int] = set()  # unloaded while pinned: freed at the last release
        self.num_loads = 0

    def slot_of(self, lora_id: int) -> int | None:
        return self._slot_of.get(lora_id)

    def can_acquire(self, lora_id: int) -> bool:
        """Resident already, or a slot is free, or an idle adapter can be evicted."""
        return lora_id in self._slot_of or bool(self._free) or bool(self._idle)

    def acquire(self, lora_id: int) -> int:
        """Pin the adapter for one more sequence, loading it (evicting the LRU) if needed."""
        slot = self._slot_of.get(lora_id)
        if slot is None:
            if self._free:
                slot = self._free.pop()
            elif self._idle:
                victim, _ = self._idle.popitem(last=False)
                slot = self._slot_of.pop(victim)
                del self._pins[victim]
            else:
                raise RuntimeError(f"no LoRA slot for adapter {lora_id}: all are pinned")
            self._load(slot, lora_id)
            self.num_loads += 1
            self._slot_of[lora_id] = slot
            self._pins[lora_id] = 0
        self._idle.pop(lora_id, None)
        self._pins[lora_id] += 1
        return slot

    def release(self, lora_id: int) -> None:
        pins = self._pins.get(lora_id, 0) - 1
        assert pins >= 0, f"adapter {lora_id} released more often than acquired"
        self._pins[lora_id] = pins
        if pins == 0:
            self._idle[lora_id] = None  # most recently used: evicted last
            if lora_id in self._forgotten:
                self._forgotten.discard(lora_id)
                self.forget(lora_id)

    def forget(self, lora_id: int) -> None:
        """An unloaded adapter: free its slot now if nothing runs on it (else at release)."""
        if lora_id in self._idle:
            del self._idle[lora_id], self._pins[lora_id]
            self._free.append(self._slot_of.pop(lora_id))
        elif lora_id in self._slot_of:
            self._forgotten.add(lora_id)

    @property
    def pinned(self) -> dict[int, int]:
        return {i: n for i, n in self._pins.items() if n}
