"""LoRA weights in stacked slot tensors, and their application inside a mixed batch.

Per layer and per fused projection (``qkv_proj``, ``o_proj``, ``gate_up_proj``, ``down_proj``)
one ``A`` tensor ``[slots, parts * r_max, in]`` (the parts' A matrices stacked, each padded to
``r_max`` rows) and one ``B`` tensor ``[slots, out, r_max]`` (each part's B in its own rows of
the fused output, padded to ``r_max`` columns, the scaling folded in). Loading an adapter is a
write into one slot; nothing is merged into the base weights.

A step groups its tokens by slot once (:class:`LoraStep`); each projection then adds, per
group, ``x_g A^T`` (one matmul for all parts) times each part's ``B^T`` into the base output:
in place for a group that is the whole batch, by ``index_add_`` otherwise.
"""

from __future__ import annotations

import attrs
import torch

from izh_trio.engine.loader import Qwen3Config
from izh_trio.engine.lora.adapter import SUBMODULES, LoraAdapter, module_shapes

#: Fused projection -> its parts, in the order their outputs are concatenated.
FUSED_PARTS: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"), "o_proj": ("o_proj",),
    "gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",),
}


@attrs.frozen
class LoraGroup:
    slot: int
    rows: torch.Tensor | None  # [n] int64 rows of the step; None: every row


class LoraWeights:
    def __init__(self, cfg: Qwen3Config, num_slots: int, max_rank: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.num_slots, self.max_rank = num_slots, max_rank
        shapes = module_shapes(cfg)
        #: fused -> [(first output column, last + 1)] of each part
        self.columns: dict[str, list[tuple[int, int]]] = {}
        self.a: dict[tuple[int, str], torch.Tensor] = {}
        self.b: dict[tuple[int, str], torch.Tensor] = {}
        for fused, parts in FUSED_PARTS.items():
            fan_in = shapes[parts[0]][0]
            cols, at = [], 0
            for part in parts:
                cols.append((at, at + shapes[part][1]))
                at += shapes[part][1]
            self.columns[fused] = cols
            for layer in range(cfg.num_hidden_layers):
                self.a[layer, fused] = torch.zeros(num_slots, len(parts) * max_rank, fan_in,
                                                   dtype=dtype, device=device)
                self.b[layer, fused] = torch.zeros(num_slots, at, max_rank, dtype=dtype,
                                                   device=device)
        self.targets: list[frozenset[str]] = [frozenset()] * num_slots
        self.ranks = [0] * num_slots

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in (*self.a.values(), *self.b.values()))

    def write(self, slot: int, adapter: LoraAdapter) -> None:
        """Put ``adapter`` into ``slot``, zeroing whatever the previous occupant left."""
        r_max = self.max_rank
        for t in (*self.a.values(), *self.b.values()):
            t[slot].zero_()
        for (layer, sub), (a, b) in adapter.weights.items():
            fused, part = SUBMODULES[sub]
            lo, hi = self.columns[fused][part]
            r = a.shape[0]
            self.a[layer, fused][slot, part * r_max : part * r_max + r].copy_(a)
            self.b[layer, fused][slot, lo:hi, :r].copy_(b)
        self.targets[slot] = adapter.fused_targets
        self.ranks[slot] = adapter.rank

    def add(self, groups: tuple[LoraGroup, ...], layer: int, fused: str, x: torch.Tensor,
            out: torch.Tensor) -> None:
        """``out += x A^T B^T`` for each group's rows, with that group's slot."""
        a_all, b_all, r_max = self.a[layer, fused], self.b[layer, fused], self.max_rank
        cols = self.columns[fused]
        for g in groups:
            if fused not in self.targets[g.slot]:
                continue
            r = self.ranks[g.slot]
            xs = x if g.rows is None else x.index_select(0, g.rows)
            a, b = a_all[g.slot], b_all[g.slot]
            if len(cols) == 1:
                delta = (xs @ a[:r].t()) @ b[:, :r].t()
            else:
                shrink = xs @ a.t()
                delta = torch.cat([shrink[:, j * r_max : j * r_max + r] @ b[lo:hi, :r].t()
                                   for j, (lo, hi) in enumerate(cols)], dim=1)
            if g.rows is None:
                out.add_(delta)
            else:
                out.index_add_(0, g.rows, delta)


@attrs.frozen
class LoraStep:
    """One step's tokens grouped by adapter slot, built once and read by every layer."""

    weights: LoraWeights
    groups: tuple[LoraGroup, ...]

    @classmethod
    def build(cls, weights: LoraWeights, spans: list[tuple[int, int, int]], num_rows: int,
              device: torch.device) -> LoraStep | None:
        """``spans``: (slot, first row, rows) per sequence with an adapter; None if none."""
        rows: dict[int, list[int]] = {}
        for slot, first, n in spans:
            rows.setdefault(slot, []).extend(range(first, first + n))
        if not rows:
            return None
        groups = tuple(
            LoraGroup(slot, None if len(idx) == num_rows else
                      torch.tensor(idx, dtype=torch.long, device=device))
            for slot, idx in rows.items())
        return cls(weights, groups)

    def add(self, layer: int, fused: str, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        self.weights.add(self.groups, layer, fused, x, out)
        return out
