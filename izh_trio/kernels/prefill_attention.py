"""Varlen prefill attention straight from the paged cache.

The step's query tokens are flattened, ``cu_seqlens_q`` delimiting each sequence's chunk. A
chunk of ``n`` queries whose sequence has ``context_len`` tokens in the cache (the chunk's own
K/V already stored) holds positions ``context_len - n .. context_len - 1``; query ``i`` attends
to every cached position ``<= context_len - n + i``. A prefix-cache hit and the earlier chunks
of a chunked prefill are thus just cached positions: nothing is copied or recomputed.

A program owns ``BLOCK_M`` rows of one (sequence, KV head): row ``r`` is query token
``r // GROUP`` and query head ``r % GROUP`` of that KV head's group, so the group shares every
K/V tile (GQA). Keys are walked in tiles of ``BLOCK_N`` positions, each found through the block
table, up to the last position the tile's queries may see (causal skipping). Online softmax in
base 2, fp32 accumulation.
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
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr,
    cu_seqlens_ptr, context_lens_ptr, block_tables_ptr,
    scale_log2,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_cache_block, stride_cache_tok, stride_cache_h, stride_table,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    D: tl.constexpr, BLOCK_D: tl.constexpr, PAGE: tl.constexpr, PRECISION: tl.constexpr,
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = tl.program_id(2)
    q_start = tl.load(cu_seqlens_ptr + seq).to(tl.int32)
    n_q = tl.load(cu_seqlens_ptr + seq + 1).to(tl.int32) - q_start
    if tile * BLOCK_M < n_q * GROUP:
        ctx = tl.load(context_lens_ptr + seq).to(tl.int32)
        first_pos = ctx - n_q  # absolute position of the chunk's first query
        r = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        tok = r // GROUP
        head = kv_head * GROUP + r % GROUP
        row_ok = tok < n_q
        q_pos = first_pos + tok  # rows past the chunk still see position 0: no NaN
        d = tl.arange(0, BLOCK_D)
        d_ok = d < D
        rows_q = (q_start + tok).to(tl.int64)
        io_mask = row_ok[:, None] & d_ok[None, :]
        q = tl.load(q_ptr + rows_q[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                    mask=io_mask, other=0.0)
        table = block_tables_ptr + seq.to(tl.int64) * stride_table
        last_tok = tl.minimum((tile * BLOCK_M + BLOCK_M - 1) // GROUP, n_q - 1)
        kv_end = first_pos + last_tok + 1  # the furthest position any row here may see

        n = tl.arange(0, BLOCK_N)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        for kv_tile in range(0, kv_end, BLOCK_N):
            pos = kv_tile + n
            valid = pos < kv_end
            causal = valid[None, :] & (pos[None, :] <= q_pos[:, None])
            m_i, l_i, acc = attend_tile(
                q, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, table, pos, valid, causal,
                kv_head, d, d_ok, scale_log2, stride_cache_block, stride_cache_tok,
                stride_cache_h, PAGE, PRECISION)
        o = acc / l_i[:, None]
        tl.store(out_ptr + rows_q[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=io_mask)


def prefill_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor, context_lens: torch.Tensor, block_tables: torch.Tensor,
    scale: float, *, max_query_len: int, block_m: int | None = None,
    block_n: int | None = None, out: torch.Tensor | None = None,
) -> torch.Tensor:
    """q: [T, H_q, D] flattened chunks; cu_seqlens_q [S+1]; context_lens [S] (cached tokens
    after the chunk); block_tables [S, max_blocks]. Returns out [T, H_q, D].

    ``max_query_len`` (the longest chunk, a host int) sizes the grid without a device sync.
    """
    page, h_kv, d = check_query(q, k_cache, v_cache, "T")
    h_q = q.shape[1]
    check_index(cu_seqlens_q, "cu_seqlens_q", 1, q.device)
    check_index(context_lens, "context_lens", 1, q.device)
    check_index(block_tables, "block_tables", 2, q.device)
    num_seqs = context_lens.shape[0]
    check(cu_seqlens_q.shape[0] == num_seqs + 1 and block_tables.shape[0] == num_seqs,
          "cu_seqlens_q needs S+1 entries and block_tables S rows for S context_lens")
    check(max_query_len >= 0, "max_query_len must be >= 0")
    if out is None:
        out = torch.empty_like(q)
    check(out.shape == q.shape and out.dtype == q.dtype and out.stride(-1) == 1,
          "out must be like q")
    if num_seqs == 0 or max_query_len == 0:
        return out
    group = h_q // h_kv
    # Tiles sized for Hopper's shared memory: 64x128 in 16-bit; fp32 (tests) halves the keys.
    if block_m is None:
        block_m = 64 if d <= 128 else 32
    if block_n is None:
        block_n = 64 if d <= 128 and q.element_size() == 2 else 32
    grid = (triton.cdiv(max_query_len * group, block_m), h_kv, num_seqs)
    _prefill_kernel[grid](
        q, k_cache, v_cache, out, cu_seqlens_q, context_lens, block_tables,
        scale * LOG2E,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        GROUP=group, BLOCK_M=block_m, BLOCK_N=block_n, D=d, BLOCK_D=next_pow2(d), PAGE=page,
        PRECISION=dot_precision(q.dtype), num_warps=4, num_stages=2,
    )
    return out


def prefill_attention_ref(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor, context_lens: torch.Tensor, block_tables: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Torch reference, in fp32, one sequence at a time; cast back to q's dtype."""
    page, h_kv = k_cache.shape[1], k_cache.shape[2]
    group = q.shape[1] // h_kv
    out = torch.zeros_like(q)
    cu = cu_seqlens_q.tolist()
    for s, ctx in enumerate(context_lens.tolist()):
        lo, hi = cu[s], cu[s + 1]
        n = hi - lo
        if n == 0:
            continue
        blocks = block_tables[s, : -(-ctx // page)].long()
        k = k_cache[blocks].flatten(0, 1)[:ctx].float().repeat_interleave(group, dim=1)
        v = v_cache[blocks].flatten(0, 1)[:ctx].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("thd,nhd->htn", q[lo:hi].float(), k) * scale
        visible = torch.arange(ctx)[None, :] <= torch.arange(ctx - n, ctx)[:, None]
        scores = scores.masked_fill(~visible.to(scores.device), float("-inf"))
        out[lo:hi] = torch.einsum("htn,nhd->thd", scores.softmax(dim=-1), v).to(q.dtype)
    return out
