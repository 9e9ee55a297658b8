"""The triton attention backend: ``izh_trio.kernels`` behind the backend protocol.

Per step, ``build_metadata`` turns the step into what the kernels read: int32 cumulative query
lengths, context lengths and block tables for the prefill chunks and for the decodes, plus the
longest chunk (the prefill grid) and the decode split count. Every layer reuses them.

Prefill chunks read everything, their own fresh K/V included, from the paged cache (``store_kv``
runs first), so a prefix-cache hit or an earlier chunk costs no copy. Decodes run the
split-K decode kernel. Padding rows (CUDA graphs) have a negative slot and context length 0.
"""

from __future__ import annotations

import attrs
import torch

from izh_trio import kernels
from izh_trio.engine.attention.base import StepAttention


@attrs.frozen
class TritonPrefills:
    cu_seqlens_q: torch.Tensor  # [S+1] int32
    context_lens: torch.Tensor  # [S] int32
    block_tables: torch.Tensor  # [S, max_blocks] int32
    max_query_len: int


@attrs.frozen
class TritonDecodes:
    context_lens: torch.Tensor  # [B] int32
    block_tables: torch.Tensor  # [B, max_blocks] int32
    num_splits: int


@attrs.frozen
class TritonMetadata:
    slot_mapping: torch.Tensor  # [T] int64; negative = padding, not stored
    num_prefill_tokens: int
    prefills: TritonPrefills | None = None  # None when the step has none
    decodes: TritonDecodes | None = None  # None when the step has none

    def store_kv(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor) -> None:
        kernels.store_kv(k, v, k_cache, v_cache, self.slot_mapping)

    def paged_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float
                        ) -> torch.Tensor:
        """k, v are already stored, so unused: everything is read from the cache."""
        out = torch.empty_like(q)
        p, pre, dec = self.num_prefill_tokens, self.prefills, self.decodes
        if pre is not None:
            kernels.prefill_attention(
                q[:p], k_cache, v_cache, pre.cu_seqlens_q, pre.context_lens, pre.block_tables,
                scale, max_query_len=pre.max_query_len, out=out[:p])
        if dec is not None:
            kernels.decode_attention(
                q[p:], k_cache, v_cache, dec.block_tables, dec.context_lens, scale,
                num_splits=dec.num_splits, out=out[p:])
        return out


def _tables(rows: list[list[int]], device: torch.device) -> torch.Tensor:
    width = max(1, max(len(r) for r in rows))
    return torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.int32,
                        device=device)


def _int32(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device)


def decode_splits(batch: int, num_kv_heads: int, max_context: int,
                  device: torch.device) -> int:
    return kernels.default_num_splits(batch, num_kv_heads, max_context, device)


class TritonBackend:
    name = "triton"
    plain_kv_store = False  # padding slots (-1) are skipped, not stored

    def build_metadata(self, step: StepAttention, device: torch.device, num_kv_heads: int
                       ) -> TritonMetadata:
        prefills = decodes = None
        if step.prefills:
            cu = [0]
            for c in step.prefills:
                cu.append(cu[-1] + c.query_len)
            prefills = TritonPrefills(
                cu_seqlens_q=_int32(cu, device),
                context_lens=_int32([c.context_len for c in step.prefills], device),
                block_tables=_tables([c.block_table for c in step.prefills], device),
                max_query_len=max(c.query_len for c in step.prefills))
        if step.decodes:
            decodes = TritonDecodes(
                context_lens=_int32([c.context_len for c in step.decodes], device),
                block_tables=_tables([c.block_table for c in step.decodes], device),
                num_splits=decode_splits(len(step.decodes), num_kv_heads,
                                         max(c.context_len for c in step.decodes), device))
        return TritonMetadata(
            slot_mapping=torch.tensor(step.slots, dtype=torch.long, device=device),
            num_prefill_tokens=step.num_prefill_tokens, prefills=prefills, decodes=decodes)


TRITON_BACKEND = TritonBackend()
