"""The triton attention backend: the kernels of ``kernels/`` behind the torch backend's calls.

Per step, ``build_metadata`` turns the step into what the kernels read: int32 cumulative query
lengths, context lengths and block tables for the prefill chunks and for the decodes, plus the
longest chunk (the prefill grid) and the decode split count. Every layer reuses them.

Prefill chunks read everything, their own fresh K/V included, from the paged cache (``store_kv``
runs first), so a prefix-cache hit or an earlier chunk costs no copy. Decodes run the
split-K decode kernel. Padding rows (CUDA graphs) have a negative slot and context length 0.
"""

from __future__ import annotations

import sys
from pathlib import Path

import attrs
import torch

from izh_trio.engine.attention import AttentionBackend, StepAttention

try:
    import kernels
except ImportError:  # izh_trio imported from outside the checkout: kernels/ sits beside it
    _root = Path(__file__).resolve().parents[2]
    if not (_root / "kernels" / "__init__.py").is_file():
        raise
    sys.path.append(str(_root))
    import kernels
if not hasattr(kernels, "decode_attention"):
    raise ImportError(f"{kernels.__file__} is another package named 'kernels'; put this "
                      "project's checkout first on PYTHONPATH")


@attrs.frozen
class TritonAttentionMetadata:
    slot_mapping: torch.Tensor  # [T] int64; negative = padding, not stored
    num_prefill_tokens: int
    # Prefill chunks (None when the step has none).
    cu_seqlens_q: torch.Tensor | None = None  # [S+1] int32
    prefill_context_lens: torch.Tensor | None = None  # [S] int32
    prefill_block_tables: torch.Tensor | None = None  # [S, max_blocks] int32
    max_query_len: int = 0
    # Decodes (None when the step has none).
    decode_context_lens: torch.Tensor | None = None  # [B] int32
    decode_block_tables: torch.Tensor | None = None  # [B, max_blocks] int32
    num_splits: int = 1


def _tables(rows: list[list[int]], device: torch.device) -> torch.Tensor:
    width = max(1, max(len(r) for r in rows))
    return torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.int32,
                        device=device)


def decode_splits(batch: int, num_kv_heads: int, max_context: int,
                  device: torch.device) -> int:
    return kernels.default_num_splits(batch, num_kv_heads, max_context, device)


def build_metadata(step: StepAttention, device: torch.device, num_kv_heads: int = 1
                   ) -> TritonAttentionMetadata:
    fields: dict = {}
    if step.prefills:
        cu = [0]
        for c in step.prefills:
            cu.append(cu[-1] + c.query_len)
        fields |= dict(
            cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device=device),
            prefill_context_lens=torch.tensor([c.context_len for c in step.prefills],
                                              dtype=torch.int32, device=device),
            prefill_block_tables=_tables([c.block_table for c in step.prefills], device),
            max_query_len=max(c.query_len for c in step.prefills),
        )
    if step.decodes:
        tables = _tables([c.block_table for c in step.decodes], device)
        fields |= dict(
            decode_context_lens=torch.tensor([c.context_len for c in step.decodes],
                                             dtype=torch.int32, device=device),
            decode_block_tables=tables,
            num_splits=decode_splits(len(step.decodes), num_kv_heads,
                                     max(c.context_len for c in step.decodes), device),
        )
    return TritonAttentionMetadata(
        slot_mapping=torch.tensor(step.slots, dtype=torch.long, device=device),
        num_prefill_tokens=step.num_prefill_tokens, **fields,
    )


def store_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    kernels.store_kv(k, v, k_cache, v_cache, slot_mapping)


def paged_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    k_cache: torch.Tensor, v_cache: torch.Tensor, meta: TritonAttentionMetadata, scale: float,
) -> torch.Tensor:
    """q: [T, H_q, D]; k, v: [T, H_kv, D] (already stored, so unused). Returns [T, H_q, D]."""
    out = torch.empty_like(q)
    p = meta.num_prefill_tokens
    if meta.cu_seqlens_q is not None:
        kernels.prefill_attention(
            q[:p], k_cache, v_cache, meta.cu_seqlens_q, meta.prefill_context_lens,
            meta.prefill_block_tables, scale, max_query_len=meta.max_query_len, out=out[:p])
    if meta.decode_block_tables is not None:
        kernels.decode_attention(
            q[p:], k_cache, v_cache, meta.decode_block_tables, meta.decode_context_lens, scale,
            num_splits=meta.num_splits, out=out[p:])
    return out


TRITON_BACKEND = AttentionBackend("triton", build_metadata, store_kv, paged_attention)
