"""Paged attention for decode: one query token per sequence, over that sequence's KV pages.

GQA-aware: a program owns one (sequence, KV head, split) and computes every query head of that
KV head's group at once (the group is padded to 16 rows for ``tl.dot``), so each K/V tile is
loaded once per group rather than once per query head. Keys are walked in tiles of ``BLOCK_N``
token positions; each position is found through the block table, so any page size works.

Split-K: a long context is cut into ``num_splits`` ranges of whole tiles, each range a program
that writes its running max, sum and unnormalised output (fp32) to a scratch buffer; a second
kernel merges the ranges. With one split the first kernel normalises and writes ``out`` itself.
A sequence's ranges come from its own length, computed in the kernel, so the launch depends on
no host-side length: the same launch serves every step of a CUDA graph.

Softmax runs in base 2: scores are scaled by ``scale * log2(e)`` and exponentiated with exp2.
A sequence with context length 0 (a padding row) gets an all-zero output.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from izh_trio.kernels._common import check, check_index, check_query, dot_precision, next_pow2
from izh_trio.kernels._tile import attend_tile

LOG2E = math.log2(math.e)


@triton.jit
def _decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr,
    out_ptr, part_m_ptr, part_l_ptr, part_acc_ptr,
    scale_log2,
    stride_qb, stride_qh, stride_ob, stride_oh,
    stride_cache_block, stride_cache_tok, stride_cache_h, stride_table,
    NUM_SPLITS: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, PAGE: tl.constexpr,
    PRECISION: tl.constexpr,
):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(context_lens_ptr + b).to(tl.int32)
    # This split's tokens: [start, end), whole tiles, from this sequence's own length.
    per_split = tl.cdiv(tl.cdiv(ctx, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * per_split
    end = tl.minimum(start + per_split, ctx)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    heads = kv_head * GROUP + g
    g_ok = g < GROUP
    d_ok = d < D
    b64 = b.to(tl.int64)
    q = tl.load(q_ptr + b64 * stride_qb + heads[:, None] * stride_qh + d[None, :],
                mask=g_ok[:, None] & d_ok[None, :], other=0.0)
    table = block_tables_ptr + b64 * stride_table

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for tile in range(start, end, BLOCK_N):
        pos = tile + n
        valid = pos < end
        m_i, l_i, acc = attend_tile(
            q, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, table, pos, valid, valid[None, :],
            kv_head, d, d_ok, scale_log2, stride_cache_block, stride_cache_tok, stride_cache_h,
            PAGE, PRECISION)

    out_mask = g_ok[:, None] & d_ok[None, :]
    if NUM_SPLITS == 1:
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + b64 * stride_ob + heads[:, None] * stride_oh + d[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        # Scratch [B, H_q, NUM_SPLITS] for m and l, [B, H_q, NUM_SPLITS, BLOCK_D] for acc.
        part = (b64 * tl.num_programs(1) * GROUP + heads) * NUM_SPLITS + split
        tl.store(part_m_ptr + part, m_i, mask=g_ok)
        tl.store(part_l_ptr + part, l_i, mask=g_ok)
        tl.store(part_acc_ptr + part[:, None] * BLOCK_D + d[None, :], acc, mask=out_mask)


@triton.jit
def _reduce_kernel(
    out_ptr, part_m_ptr, part_l_ptr, part_acc_ptr, stride_ob, stride_oh,
    NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    s_ok = s < NUM_SPLITS
    base = (b.to(tl.int64) * tl.num_programs(1) + h) * NUM_SPLITS
    m = tl.load(part_m_ptr + base + s, mask=s_ok, other=float("-inf"))
    sums = tl.load(part_l_ptr + base + s, mask=s_ok, other=0.0)
    m_max = tl.maximum(tl.max(m, 0), -1e30)  # finite, so an empty sequence gets weights 0
    w = tl.exp2(m - m_max)
    total = tl.maximum(tl.sum(sums * w, 0), 1e-30)  # >= 1 unless the sequence is empty
    acc = tl.load(part_acc_ptr + (base + s)[:, None] * BLOCK_D + d[None, :],
                  mask=s_ok[:, None], other=0.0)
    o = tl.sum(acc * w[:, None], 0) / total
    tl.store(out_ptr + b.to(tl.int64) * stride_ob + h * stride_oh + d,
             o.to(out_ptr.dtype.element_ty), mask=d < D)


def default_num_splits(batch: int, num_kv_heads: int, max_context: int,
                       device: torch.device) -> int:
    """Enough programs to fill the GPU (two per SM), no split under 256 tokens, at most 16.

    A power of two: each count is a separate compiled kernel, and the five there are get
    compiled while the CUDA graphs are captured, not in the middle of serving.
    """
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    want = -(-2 * sms // max(1, batch * num_kv_heads))
    splits = max(1, min(16, want, max_context // 256))
    return 1 << (splits.bit_length() - 1)


def decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
    *, num_splits: int | None = None, block_n: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """q: [B, H_q, D]; caches [blocks, block_size, H_kv, D]; block_tables [B, max_blocks];
    context_lens [B] (tokens to attend, the new one included). Returns out [B, H_q, D]."""
    page, h_kv, d = check_query(q, k_cache, v_cache, "B")
    batch, h_q = q.shape[0], q.shape[1]
    check_index(block_tables, "block_tables", 2, q.device)
    check_index(context_lens, "context_lens", 1, q.device)
    check(block_tables.shape[0] == batch and context_lens.shape[0] == batch,
          "block_tables and context_lens need one row per sequence")
    if out is None:
        out = torch.empty_like(q)
    check(out.shape == q.shape and out.dtype == q.dtype and out.stride(-1) == 1,
          "out must be like q")
    if batch == 0:
        return out
    if num_splits is None:
        num_splits = default_num_splits(batch, h_kv, block_tables.shape[1] * page, q.device)
    check(num_splits >= 1, "num_splits must be >= 1")
    if block_n is None:
        block_n = 64 if d <= 128 and q.element_size() == 2 else 32
    group = h_q // h_kv
    block_d = next_pow2(d)
    if num_splits > 1:
        part_m = torch.empty(batch, h_q, num_splits, dtype=torch.float32, device=q.device)
        part_l = torch.empty_like(part_m)
        part_acc = torch.empty(batch, h_q, num_splits, block_d, dtype=torch.float32,
                               device=q.device)
    else:
        part_m = part_l = part_acc = out  # unused
    _decode_kernel[(batch, h_kv, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens, out, part_m, part_l, part_acc,
        scale * LOG2E,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        NUM_SPLITS=num_splits, GROUP=group, BLOCK_G=max(16, next_pow2(group)),
        D=d, BLOCK_D=block_d, BLOCK_N=block_n, PAGE=page, PRECISION=dot_precision(q.dtype),
        num_warps=4, num_stages=2,
    )
    if num_splits > 1:
        _reduce_kernel[(batch, h_q)](
            out, part_m, part_l, part_acc, out.stride(0), out.stride(1),
            NUM_SPLITS=num_splits, BLOCK_S=next_pow2(num_splits), D=d, BLOCK_D=block_d,
            num_warps=4,
        )
    return out


def decode_attention_ref(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
) -> torch.Tensor:
    """Torch reference, in fp32, one sequence at a time; cast back to q's dtype."""
    page, h_kv = k_cache.shape[1], k_cache.shape[2]
    group = q.shape[1] // h_kv
    out = torch.zeros_like(q)
    for b in range(q.shape[0]):
        ctx = int(context_lens[b])
        if ctx == 0:
            continue
        blocks = block_tables[b, : -(-ctx // page)].long()
        k = k_cache[blocks].flatten(0, 1)[:ctx].float().repeat_interleave(group, dim=1)
        v = v_cache[blocks].flatten(0, 1)[:ctx].float().repeat_interleave(group, dim=1)
        probs = (torch.einsum("hd,nhd->hn", q[b].float(), k) * scale).softmax(dim=-1)
        out[b] = torch.einsum("hn,nhd->hd", probs, v).to(q.dtype)
    return out
