"""LoRA weights in stacked slot tensors, and their application inside a mixed batch.

Per layer and per targeted linear of ours (``qkv_proj``, ``o_proj``, ``gate_up_proj``,
``down_proj`` for Qwen3: ``LoraTargets.parts``) one ``A`` tensor ``[slots, parts * r_max, in]``
(the parts' A matrices stacked, each padded to ``r_max`` rows) and one ``B`` tensor
``[slots, out, r_max]`` (each part's B in its own rows of the packed output, padded to
``r_max`` columns, the scaling folded in). Loading an adapter is a write into one slot;
nothing is merged into the base weights.

A step groups its tokens by slot once (``begin_step``); each wrapped linear
(``lora/linear.py``) then adds, per group, ``x_g A^T`` (one matmul for all parts) times each
part's ``B^T`` into its base output: in place for a group that is the whole batch, by
``index_add_`` otherwise.
"""

from __future__ import annotations

import attrs
import torch

from izh_trio.engine.lora.adapter import LoraAdapter, LoraTargets


@attrs.frozen
class LoraGroup:
    slot: int
    rows: torch.Tensor | None  # [n] int64 rows of the step; None: every row


class LoraWeights:
    def __init__(self, targets: LoraTargets, num_slots: int, max_rank: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.targets, self.num_slots, self.max_rank = targets, num_slots, max_rank
        shapes = targets.shapes
        #: our linear -> [(first output column, last + 1)] of each part
        self.columns: dict[str, list[tuple[int, int]]] = {}
        self.a: dict[tuple[int, str], torch.Tensor] = {}
        self.b: dict[tuple[int, str], torch.Tensor] = {}
        for linear, parts in targets.parts.items():
            fan_in = shapes[parts[0]][0]
            cols, at = [], 0
            for part in parts:
                cols.append((at, at + shapes[part][1]))
                at += shapes[part][1]
            self.columns[linear] = cols
            for layer in range(targets.num_layers):
                self.a[layer, linear] = torch.zeros(num_slots, len(parts) * max_rank, fan_in,
                                                    dtype=dtype, device=device)
                self.b[layer, linear] = torch.zeros(num_slots, at, max_rank, dtype=dtype,
                                                    device=device)
        self.slot_targets: list[frozenset[str]] = [frozenset()] * num_slots
        self.ranks = [0] * num_slots
        #: This step's tokens by adapter slot; empty when no token runs with one.
        self.groups: tuple[LoraGroup, ...] = ()

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in (*self.a.values(), *self.b.values()))

    def write(self, slot: int, adapter: LoraAdapter) -> None:
        """Put ``adapter`` into ``slot``, zeroing whatever the previous occupant left."""
        r_max = self.max_rank
        for t in (*self.a.values(), *self.b.values()):
            t[slot].zero_()
        for (layer, sub), (a, b) in adapter.weights.items():
            linear, part = self.targets.owner[sub]
            lo, hi = self.columns[linear][part]
            r = a.shape[0]
            self.a[layer, linear][slot, part * r_max : part * r_max + r].copy_(a)
            self.b[layer, linear][slot, lo:hi, :r].copy_(b)
        self.slot_targets[slot] = frozenset(self.targets.owner[sub][0]
                                            for _, sub in adapter.weights)
        self.ranks[slot] = adapter.rank

    def begin_step(self, spans: list[tuple[int, int, int]], num_rows: int,
                   device: torch.device) -> bool:
        """Group the step's rows by slot, for every wrapped linear of this step's forward.
        ``spans``: (slot, first row, rows) per sequence with an adapter. Returns whether any
        token runs with one."""
        rows: dict[int, list[int]] = {}
        for slot, first, n in spans:
            rows.setdefault(slot, []).extend(range(first, first + n))
        self.groups = tuple(
            LoraGroup(slot, None if len(idx) == num_rows else
                      torch.tensor(idx, dtype=torch.long, device=device))
            for slot, idx in rows.items())
        return bool(self.groups)

    def add(self, layer: int, linear: str, x: torch.Tensor, out: torch.Tensor) -> None:
        """``out += x A^T B^T`` for each group's rows, with that group's slot."""
        a_all, b_all, r_max = self.a[layer, linear], self.b[layer, linear], self.max_rank
        cols = self.columns[linear]
        for g in self.groups:
            if linear not in self.slot_targets[g.slot]:
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
