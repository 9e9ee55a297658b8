"""What every attention backend shares: the step as the model runner describes it, and the two
protocols a backend implements.

The K/V cache of a layer is ``[num_blocks, block_size, num_kv_heads, head_dim]``; a sequence's
tokens live in the blocks its block table names, in order. One step's tokens arrive flattened:
prefill chunks first (any length, possibly continuing a cached prefix), then one token per
decoding sequence. The runner describes that once, backend-neutrally (``StepAttention``); the
backend turns it into its own metadata once per step, and every layer calls that metadata.
"""

from __future__ import annotations

from array import array
from typing import NamedTuple, Protocol

import attrs
import torch


class ChunkSpec(NamedTuple):
    """One sequence's share of a step, as plain ints (no tensors yet). A named tuple: one is
    built per sequence per step, and it builds in half an attrs class's time."""

    query_start: int  # offset in the flattened step
    query_len: int
    context_len: int  # tokens in the cache after this step, the new ones included
    block_table: list[int]  # the blocks covering ``context_len`` tokens


@attrs.frozen
class StepAttention:
    """What every backend needs to know about a step: prefill chunks first, then decodes."""

    slots: list[int]  # flat cache slot of each new token
    prefills: list[ChunkSpec]
    decodes: list[ChunkSpec]  # query_len 1 each
    block_size: int
    #: A sliding window: a query at position p sees the keys at (p - window, p]; None: all.
    window: int | None = None

    @property
    def num_prefill_tokens(self) -> int:
        return sum(c.query_len for c in self.prefills)


class AttentionMetadata(Protocol):
    """One step's attention as a backend runs it: built once per step, called by every layer
    with that layer's caches. It carries its own calls, so that each backend's layers read
    its own metadata type and nothing in between needs to know which one it is."""

    @property
    def slot_mapping(self) -> torch.Tensor:
        """[T] int64: block_id * block_size + offset of each new token."""
        ...

    def store_kv(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor) -> None:
        """Write the step's new K/V ([T, H_kv, D]) into their cache slots."""
        ...

    def paged_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float
                        ) -> torch.Tensor:
        """q: [T, H_q, D]; k, v: [T, H_kv, D] (already stored). Returns [T, H_q, D]."""
        ...


class AttentionBackend(Protocol):
    """One attention implementation, chosen once per engine (``attention.get_backend``)."""

    @property
    def name(self) -> str: ...

    @property
    def plain_kv_store(self) -> bool:
        """Whether ``store_kv`` is a plain index write per slot (no padding slots), so that
        the compiled CPU layers may store K/V in its place, fused with the norms and RoPE
        before it."""
        ...

    def build_metadata(self, step: StepAttention, device: torch.device, num_kv_heads: int
                       ) -> AttentionMetadata: ...


def long_tensor(values: list[int], device: torch.device) -> torch.Tensor:
    """An int64 tensor of ``values``, through ``array``: ``torch.tensor`` inspects each int of
    a list, and this runs several times every step."""
    if not values:
        return torch.empty(0, dtype=torch.long, device=device)
    return torch.frombuffer(array("q", values), dtype=torch.long).to(device)


def padded_tables(chunks: list[ChunkSpec], width: int) -> list[int]:
    """The chunks' block tables flattened row by row, each padded with block 0 to ``width``
    (a plain loop: it runs for every decode of every step)."""
    flat: list[int] = []
    for c in chunks:
        flat += c.block_table
        flat += [0] * (width - len(c.block_table))
    return flat
