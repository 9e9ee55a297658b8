"""The online-softmax step both attention kernels take over one tile of paged keys.

A tile is ``BLOCK_N`` token positions, each found through the block table; ``allowed`` says
which (query row, position) scores count (decode: the valid positions; prefill: also causal).
Softmax runs in base 2 (``scale_log2`` includes log2(e)). Returns the updated running max,
sum and unnormalised output.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def attend_tile(
    q, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, table, pos, valid, allowed, kv_head, d, d_ok,
    scale_log2, stride_cache_block, stride_cache_tok, stride_cache_h,
    PAGE: tl.constexpr, PRECISION: tl.constexpr,
):
    page = tl.load(table + pos // PAGE, mask=valid, other=0).to(tl.int64)
    row = page * stride_cache_block + (pos % PAGE) * stride_cache_tok + kv_head * stride_cache_h
    kv_mask = valid[:, None] & d_ok[None, :]
    k = tl.load(k_cache_ptr + row[:, None] + d[None, :], mask=kv_mask, other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2  # [rows, BLOCK_N]
    s = tl.where(allowed, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: every row sees a position in its first tile
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(v_cache_ptr + row[:, None] + d[None, :], mask=kv_mask, other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc
