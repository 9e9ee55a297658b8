from __future__ import annotations

import itertools

import pytest
import torch

from izh_trio.kernels import prefill_attention, prefill_attention_ref
from tests.kernels._paged import DTYPES, assert_close, block_tables, random_cache

HEAD_DIM, H_KV = 16, 2
# (query_len, context_len): a fresh prompt, a prefix-cache hit, a later chunk of a chunked
# prefill, a one-token chunk after a long context, a chunk ending mid-page.
CHUNKS = [(13, 13), (5, 29), (20, 52), (1, 64), (9, 10)]


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("group", [1, 2, 4])
def test_prefill_matches_reference(device: torch.device, dtype_name: str, block_size: int,
                                   group: int) -> None:
    dtype = getattr(torch, dtype_name)
    g = torch.Generator().manual_seed(block_size * 10 + group)
    num_blocks = 80
    k_cache, v_cache = random_cache(num_blocks, block_size, H_KV, HEAD_DIM, dtype, device, g)
    contexts = [c for _, c in CHUNKS]
    width = 64 // block_size + 2
    index_dtype = torch.int64 if group == 2 else torch.int32
    tables = block_tables(contexts, block_size, num_blocks, width, index_dtype, device, g)
    cu = torch.tensor([0, *itertools.accumulate(n for n, _ in CHUNKS)], dtype=index_dtype,
                      device=device)
    ctx = torch.tensor(contexts, dtype=index_dtype, device=device)
    q = torch.randn(int(cu[-1]), H_KV * group, HEAD_DIM, generator=g).to(dtype=dtype,
                                                                          device=device)
    scale = HEAD_DIM**-0.5
    got = prefill_attention(q, k_cache, v_cache, cu, ctx, tables, scale,
                            max_query_len=max(n for n, _ in CHUNKS), block_m=16, block_n=16)
    want = prefill_attention_ref(q, k_cache, v_cache, cu, ctx, tables, scale)
    assert_close(got, want, dtype)


def test_prefill_default_tiles(device: torch.device) -> None:
    """The engine's launch (default 64-row tiles), with a non-power-of-2 group of 3."""
    g = torch.Generator().manual_seed(3)
    k_cache, v_cache = random_cache(24, 4, 1, 16, torch.float32, device, g)
    tables = block_tables([30, 7], 4, 24, 8, torch.int32, device, g)
    cu = torch.tensor([0, 30, 32], dtype=torch.int32, device=device)
    ctx = torch.tensor([30, 7], dtype=torch.int32, device=device)
    q = torch.randn(32, 3, 16, generator=g).to(device)
    got = prefill_attention(q, k_cache, v_cache, cu, ctx, tables, 0.25, max_query_len=30)
    want = prefill_attention_ref(q, k_cache, v_cache, cu, ctx, tables, 0.25)
    assert_close(got, want, torch.float32)


def test_prefill_checks_layouts(device: torch.device) -> None:
    cache = torch.zeros(4, 4, 2, 16, device=device)
    tables = torch.zeros(2, 4, dtype=torch.int32, device=device)
    ctx = torch.ones(2, dtype=torch.int32, device=device)
    cu = torch.tensor([0, 1, 2], dtype=torch.int32, device=device)
    q = torch.zeros(2, 4, 16, device=device)
    with pytest.raises(ValueError, match="S\\+1"):
        prefill_attention(q, cache, cache, cu[:2], ctx, tables, 1.0, max_query_len=1)
    with pytest.raises(ValueError, match="int32 or int64"):
        prefill_attention(q, cache, cache, cu.float(), ctx, tables, 1.0, max_query_len=1)
    with pytest.raises(ValueError, match="must be \\[T, H_q, 16\\]"):
        prefill_attention(q[..., :8], cache, cache, cu, ctx, tables, 1.0, max_query_len=1)
