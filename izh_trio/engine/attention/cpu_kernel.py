"""Paged attention in fp32, bf16 or fp16 on CPU through the compiled kernel
(``cpu_attention.py``), which reads K/V in place from the cache instead of gathering a copy of
it in every layer.

The kernel takes the decodes and the short prefill chunks in one call a layer: a chunk's query
rows are decode rows that each see the cache up to their own position (the chunk's K/V are
stored before attention runs), so fresh prompts, prefix-cache hits and chunked prefill need
no copies. Longer chunks go to SDPA, one call each, as in the torch backend.
"""

from __future__ import annotations

import attrs
import torch

from izh_trio.engine import cpu_attention
from izh_trio.engine.attention.base import StepAttention, long_tensor, padded_tables
from izh_trio.engine.attention.torch_sdpa import PrefillChunk, SdpaMetadata, TorchBackend

#: A prefill chunk goes to the kernel when its query rows times its context tokens stay under
#: this. The kernel reads K/V once per query row, SDPA once per tile of rows, but SDPA has
#: a fixed cost per call, one per chunk and layer, and with two threads each call is a parallel
#: region whose barrier stalls while another process holds the second core. This is the
#: crossover that ``python -m tools.micro.bench_cpu_attention --prefill N`` finds (figures in
#: ``tools/bench/results/cpu-kernels.md``).
IN_PLACE_PREFILL_WORK = 16384


def available() -> bool:
    """Whether the kernel can run here (compiled once, on the first ask)."""
    return cpu_attention.available()


@attrs.frozen
class CpuKernelMetadata(SdpaMetadata):
    """SDPA's metadata for the chunks too long for the kernel (never decodes), and the
    kernel's rows: the short prefill chunks' rows, then the decodes, each with its own table
    row and context."""

    tables: torch.Tensor | None = None  # [R, max_blocks] int64, padded with block 0
    context_lens: torch.Tensor | None = None  # [R] int64: each row's own context
    start: int = 0  # the rows are ``start:`` of the step ...
    rows: torch.Tensor | None = None  # ... unless these [R] int64 rows are given

    def paged_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float
                        ) -> torch.Tensor:
        if not self.prefills and self.start == 0 and self.rows is None \
                and self.tables is not None and self.context_lens is not None:
            # every row is the kernel's (a decode step): its output is the whole answer
            return cpu_attention.paged_decode(q, k_cache, v_cache, self.tables,
                                              self.context_lens, scale)
        out = super().paged_attention(q, k, v, k_cache, v_cache, scale)
        if self.tables is not None and self.context_lens is not None:
            rows = slice(self.start, None) if self.rows is None else self.rows
            out[rows] = cpu_attention.paged_decode(q[rows], k_cache, v_cache, self.tables,
                                                   self.context_lens, scale)
        return out


class CpuKernelBackend(TorchBackend):
    """The torch backend with the kernel taking the decodes and the short prefill chunks."""

    name = "cpu"

    def build_metadata(self, step: StepAttention, device: torch.device, num_kv_heads: int
                       ) -> CpuKernelMetadata:
        """One table row per kernel row: a prefill chunk's rows share its table and see the
        cache up to their own position; a decode is one row."""
        kernel_chunks = [c for c in step.prefills
                         if c.query_len * c.context_len <= IN_PLACE_PREFILL_WORK]
        sdpa_chunks = [c for c in step.prefills
                       if c.query_len * c.context_len > IN_PLACE_PREFILL_WORK]
        width = max((len(c.block_table) for c in (*kernel_chunks, *step.decodes)), default=1)
        flat: list[int] = []
        ctx: list[int] = []
        rows: list[int] = []
        for c in kernel_chunks:
            n = c.query_len
            flat += (c.block_table + [0] * (width - len(c.block_table))) * n
            ctx += range(c.context_len - n + 1, c.context_len + 1)
            rows += range(c.query_start, c.query_start + n)
        flat += padded_tables(step.decodes, width)
        ctx += [c.context_len for c in step.decodes]
        start = len(step.slots) - len(ctx)  # contiguous when the rows are the step's last
        contiguous = not rows or rows == list(range(start, start + len(rows)))
        if not contiguous:
            rows += (c.query_start for c in step.decodes)
        return CpuKernelMetadata(
            slot_mapping=long_tensor(step.slots, device),
            prefills=tuple(PrefillChunk.of(*c, device=device) for c in sdpa_chunks),
            num_prefill_tokens=step.num_prefill_tokens,
            decode_block_tables=None,
            decode_bias=None,
            tables=long_tensor(flat, device).view(len(ctx), width) if ctx else None,
            context_lens=long_tensor(ctx, device) if ctx else None,
            start=start,
            rows=None if contiguous else long_tensor(rows, device),
        )


CPU_KERNEL_BACKEND = CpuKernelBackend()
