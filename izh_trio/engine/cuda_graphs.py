"""CUDA graphs for pure-decode steps: one graph per padded batch size, replayed each step.

A decode step launches a few hundred small kernels; replaying a captured graph removes their
launch cost. Each graph is captured once, at startup, over static input buffers sized for the
largest batch: the token ids, positions, cache slots, int32 block tables and context lengths of
a step are copied into the first rows, the padding rows get slot -1 (nothing stored) and
context 0 (an all-zero attention output), and the graph of the smallest captured size that fits
is replayed. Its output rows past the real batch are ignored.

Only the triton backend is captured: its decode launch depends on no host-side length (the
split count is fixed per graph, each sequence's split ranges come from its own length on the
device). Mixed or prefill steps, and batches larger than the biggest graph, run eagerly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from izh_trio.engine.attention.triton import TritonDecodes, TritonMetadata, decode_splits

log = logging.getLogger(__name__)


def capture_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, then every multiple of 8 up to ``max_batch`` (itself included)."""
    sizes = [s for s in (1, 2, 4) if s < max_batch]
    sizes += range(8, max_batch, 8)
    return sorted({*sizes, max_batch})


class DecodeGraphs:
    def __init__(
        self, forward: Callable[[torch.Tensor, torch.Tensor, TritonMetadata],
                                torch.Tensor],
        *, max_batch: int, max_blocks_per_seq: int, max_context: int, num_kv_heads: int,
        device: torch.device, capture: bool = True,
    ) -> None:
        """``forward(input_ids, positions, meta) -> hidden [B, hidden]`` is the model's.

        ``capture=False`` keeps the static buffers and padding but runs ``forward`` eagerly
        on them at each step: the same inputs a graph sees, checkable without a GPU.
        """
        self.device = device
        self.sizes = capture_sizes(max_batch)
        self.max_batch = self.sizes[-1]
        n = self.max_batch
        self.input_ids = torch.zeros(n, dtype=torch.long, device=device)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)
        self.slots = torch.full((n,), -1, dtype=torch.long, device=device)
        self.context_lens = torch.zeros(n, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(n, max_blocks_per_seq, dtype=torch.int32, device=device)
        self._forward = forward
        self._args: dict[int, tuple[torch.Tensor, torch.Tensor, TritonMetadata]] = {}
        for size in self.sizes:
            meta = TritonMetadata(
                slot_mapping=self.slots[:size], num_prefill_tokens=0,
                decodes=TritonDecodes(
                    context_lens=self.context_lens[:size],
                    block_tables=self.block_tables[:size],
                    num_splits=decode_splits(size, num_kv_heads, max_context, device)),
            )
            self._args[size] = (self.input_ids[:size], self.positions[:size], meta)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        if capture:
            self._capture()

    def _capture(self) -> None:
        pool = None
        side = torch.cuda.Stream(self.device)
        for size in reversed(self.sizes):  # largest first: the smaller ones reuse its pool
            args = self._args[size]
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):  # warm up (compiles the kernels) off the capture
                self._forward(*args)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = self._forward(*args)
            pool = graph.pool() if pool is None else pool
            self.graphs[size] = (graph, out)
        torch.cuda.synchronize(self.device)
        log.info("captured CUDA graphs for decode batch sizes %s", self.sizes)

    def can_run(self, batch: int) -> bool:
        return 0 < batch <= self.max_batch

    def run(self, input_ids: list[int], positions: list[int], slots: list[int],
            context_lens: list[int], block_tables: list[list[int]]) -> torch.Tensor:
        """Replay the smallest graph that fits; returns hidden [B, hidden] (a view, valid
        until the next replay)."""
        b = len(input_ids)
        size = next(s for s in self.sizes if s >= b)
        width = max(len(t) for t in block_tables)
        tables = torch.tensor([t + [0] * (width - len(t)) for t in block_tables],
                              dtype=torch.int32)
        pad = size - b
        rows = torch.tensor([input_ids + [0] * pad, positions + [0] * pad,
                             slots + [-1] * pad, context_lens + [0] * pad], dtype=torch.long)
        rows = rows.to(self.device)
        self.input_ids[:size].copy_(rows[0])
        self.positions[:size].copy_(rows[1])
        self.slots[:size].copy_(rows[2])
        self.context_lens[:size].copy_(rows[3])
        self.block_tables[:b, :width].copy_(tables.to(self.device))
        if size in self.graphs:
            graph, out = self.graphs[size]
            graph.replay()
        else:
            out = self._forward(*self._args[size])
        return out[:b]
