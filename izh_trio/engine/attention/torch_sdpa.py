"""Paged attention in plain torch: the portable backend, and the reference the others match.

Decodes are batched into one SDPA call with an additive mask built once per step; prefill
chunks run one SDPA call each: a fresh chunk (nothing cached before it) attends to its own
K/V, one continuing a cached prefix reads the prefix out of the paged cache. A sliding window
(Mistral's) is one more condition in each mask: a query at p sees the keys at (p - W, p].
"""

from __future__ import annotations

import attrs
import torch
import torch.nn.functional as F

from izh_trio.engine.attention.base import StepAttention, long_tensor, padded_tables


@attrs.frozen
class PrefillChunk:
    query_start: int  # offset in the flattened step
    query_len: int
    context_len: int  # tokens in the cache after this chunk, the chunk's own included
    #: [num_blocks] int64; None for a fresh chunk (nothing cached before it), which attends
    #: to its own K/V and never reads the cache
    block_table: torch.Tensor | None
    window: int | None = None

    @classmethod
    def of(cls, query_start: int, query_len: int, context_len: int, block_table: list[int],
           device: torch.device, window: int | None = None) -> PrefillChunk:
        return cls(query_start, query_len, context_len,
                   long_tensor(block_table, device) if context_len > query_len else None,
                   window)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor, scale: float, out: torch.Tensor) -> None:
        """This chunk's rows of ``out`` by one SDPA call."""
        s, n = self.query_start, self.query_len
        qc = q[s : s + n].transpose(0, 1).unsqueeze(0)  # [1, H_q, n, D]
        if self.block_table is None:  # nothing cached before it: attend to the fresh K/V
            kc, vc, mask, causal = k[s : s + n], v[s : s + n], None, True
            if self.window is not None and n > self.window:
                mask, causal = _visible(torch.arange(n, device=q.device), n, self.window), False
        else:
            ctx = self.context_len
            kc = _gather(k_cache, self.block_table)[:ctx]
            vc = _gather(v_cache, self.block_table)[:ctx]
            mask = _visible(torch.arange(ctx - n, ctx, device=q.device), ctx, self.window)
            causal = False
        o = F.scaled_dot_product_attention(
            qc, kc.transpose(0, 1).unsqueeze(0), vc.transpose(0, 1).unsqueeze(0),
            attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True,
        )
        out[s : s + n] = o.squeeze(0).transpose(0, 1)


def store_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write the step's new K/V ([T, H_kv, D]) into their cache slots."""
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slot_mapping, v)


@attrs.frozen
class SdpaMetadata:
    """Built once per step, read by every layer."""

    slot_mapping: torch.Tensor  # [T] int64: block_id * block_size + offset of each new token
    prefills: tuple[PrefillChunk, ...]
    num_prefill_tokens: int
    decode_block_tables: torch.Tensor | None  # [B, max_blocks] int64, padded with block 0
    #: [B, 1, 1, max_blocks * block_size]: 0 where a decode attends, -inf past its context.
    #: Additive and built once per step, so no layer converts a boolean mask again.
    decode_bias: torch.Tensor | None

    def store_kv(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor) -> None:
        store_kv(k, v, k_cache, v_cache, self.slot_mapping)

    def paged_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float
                        ) -> torch.Tensor:
        out = torch.empty_like(q)
        for chunk in self.prefills:
            chunk.attend(q, k, v, k_cache, v_cache, scale, out)
        if self.decode_block_tables is not None and self.decode_bias is not None:
            s = self.num_prefill_tokens
            tables = self.decode_block_tables
            b, h_kv = tables.shape[0], k_cache.shape[2]
            # GQA without copies: the query heads sharing a KV head are its "query rows".
            qd = q[s:].view(b, h_kv, q.shape[1] // h_kv, q.shape[2])  # [B, H_kv, G, D]
            kd = _gather_flat(k_cache, tables).transpose(1, 2)  # [B, H_kv, L, D]
            vd = _gather_flat(v_cache, tables).transpose(1, 2)
            o = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=self.decode_bias,
                                               scale=scale)
            out[s:] = o.reshape(b, q.shape[1], q.shape[2])
        return out


class TorchBackend:
    name = "torch"
    plain_kv_store = True

    def build_metadata(self, step: StepAttention, device: torch.device, num_kv_heads: int
                       ) -> SdpaMetadata:
        decode_tables = decode_bias = None
        if step.decodes:
            width = max(len(c.block_table) for c in step.decodes)
            flat = padded_tables(step.decodes, width)
            decode_tables = long_tensor(flat, device).view(len(step.decodes), width)
            ctx = long_tensor([c.context_len for c in step.decodes], device)
            decode_bias = _decode_bias(ctx, width * step.block_size, step.window)
        return SdpaMetadata(
            slot_mapping=long_tensor(step.slots, device),
            prefills=tuple(PrefillChunk.of(*c, device=device, window=step.window)
                           for c in step.prefills),
            num_prefill_tokens=step.num_prefill_tokens,
            decode_block_tables=decode_tables,
            decode_bias=decode_bias,
        )


TORCH_BACKEND = TorchBackend()


def _visible(rows: torch.Tensor, keys: int, window: int | None) -> torch.Tensor:
    """[len(rows), keys] bool: which keys a query at each position in ``rows`` sees."""
    key = torch.arange(keys, device=rows.device).unsqueeze(0)
    seen = key <= rows.unsqueeze(1)
    return seen if window is None else seen & (key > rows.unsqueeze(1) - window)


def _decode_bias(context_lens: torch.Tensor, width: int, window: int | None = None
                 ) -> torch.Tensor:
    hidden = ~_visible(context_lens - 1, width, window)[:, None, None, :]
    return torch.zeros(hidden.shape, device=context_lens.device).masked_fill_(hidden,
                                                                                float("-inf"))


def _gather(cache: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    """[..., num_blocks] table -> [..., num_blocks * block_size, H_kv, D] contiguous K or V."""
    blocks = cache[block_table]
    return blocks.flatten(-4, -3)


def _gather_flat(cache: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """[B, W] block tables -> [B, W * block_size, H_kv, D]; index_select beats fancy indexing."""
    b, w = tables.shape
    return torch.index_select(cache, 0, tables.flatten()).view(b, w * cache.shape[1],
                                                               *cache.shape[2:])
