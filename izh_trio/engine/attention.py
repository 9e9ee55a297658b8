"""Paged attention in plain torch: the CPU backend, and the reference the Triton kernels match.

The K/V cache of a layer is ``[num_blocks, block_size, num_kv_heads, head_dim]``; a sequence's
tokens live in the blocks its block table names, in order. One step's tokens arrive flattened:
prefill chunks first (any length, possibly continuing a cached prefix), then one token per
decoding sequence. Decodes are batched into one masked SDPA call; prefill chunks, few per step,
run one SDPA call each.
"""

from __future__ import annotations

import attrs
import torch
import torch.nn.functional as F


@attrs.frozen
class PrefillChunk:
    query_start: int  # offset in the flattened step
    query_len: int
    context_len: int  # tokens in the cache after this chunk, the chunk's own included
    block_table: torch.Tensor  # [num_blocks] int64


@attrs.frozen
class AttentionMetadata:
    """Built once per step, read by every layer."""

    slot_mapping: torch.Tensor  # [T] int64: block_id * block_size + offset of each new token
    prefills: tuple[PrefillChunk, ...]
    num_prefill_tokens: int
    decode_block_tables: torch.Tensor | None  # [B, max_blocks] int64, padded with block 0
    decode_mask: torch.Tensor | None  # [B, 1, 1, max_blocks * block_size] bool, True = attend


def store_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write the step's new K/V ([T, H_kv, D]) into their cache slots."""
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slot_mapping, v)


def _gather(cache: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    """[..., num_blocks] table -> [..., num_blocks * block_size, H_kv, D] contiguous K or V."""
    blocks = cache[block_table]
    return blocks.flatten(-4, -3)


def paged_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
) -> torch.Tensor:
    """q: [T, H_q, D]; k, v: [T, H_kv, D] (already stored). Returns [T, H_q, D]."""
    out = torch.empty_like(q)
    for chunk in meta.prefills:
        s, n = chunk.query_start, chunk.query_len
        qc = q[s : s + n].transpose(0, 1).unsqueeze(0)  # [1, H_q, n, D]
        if chunk.context_len == n:  # nothing cached before it: attend to the fresh K/V
            kc, vc, mask, causal = k[s : s + n], v[s : s + n], None, True
        else:
            ctx = chunk.context_len
            kc = _gather(k_cache, chunk.block_table)[:ctx]
            vc = _gather(v_cache, chunk.block_table)[:ctx]
            rows = torch.arange(ctx - n, ctx).unsqueeze(1)
            mask, causal = torch.arange(ctx).unsqueeze(0) <= rows, False
        o = F.scaled_dot_product_attention(
            qc, kc.transpose(0, 1).unsqueeze(0), vc.transpose(0, 1).unsqueeze(0),
            attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True,
        )
        out[s : s + n] = o.squeeze(0).transpose(0, 1)
    if meta.decode_block_tables is not None:
        s = meta.num_prefill_tokens
        qd = q[s:].unsqueeze(2)  # [B, H_q, 1, D]
        kd = _gather(k_cache, meta.decode_block_tables).transpose(1, 2)  # [B, H_kv, L, D]
        vd = _gather(v_cache, meta.decode_block_tables).transpose(1, 2)
        o = F.scaled_dot_product_attention(
            qd, kd, vd, attn_mask=meta.decode_mask, scale=scale, enable_gqa=True
        )
        out[s:] = o.squeeze(2)
    return out
