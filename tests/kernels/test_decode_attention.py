from __future__ import annotations

import pytest
import torch

from izh_trio.kernels import decode_attention, decode_attention_ref, default_num_splits
from tests.kernels._paged import DTYPES, assert_close, block_tables, random_cache

HEAD_DIM, H_KV = 32, 2
# Ragged: a fresh single token, a page edge, mid-page, the longest; 0 is a padding row.
CONTEXTS = [1, 16, 37, 64, 0]


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_matches_reference(device: torch.device, dtype_name: str, block_size: int,
                                  group: int, num_splits: int) -> None:
    dtype = getattr(torch, dtype_name)
    g = torch.Generator().manual_seed(block_size * 10 + group)
    num_blocks = 64
    k_cache, v_cache = random_cache(num_blocks, block_size, H_KV, HEAD_DIM, dtype, device, g)
    width = 64 // block_size + 1
    index_dtype = torch.int32 if group != 2 else torch.int64
    tables = block_tables(CONTEXTS, block_size, num_blocks, width, index_dtype, device, g)
    ctx = torch.tensor(CONTEXTS, dtype=index_dtype, device=device)
    q = torch.randn(len(CONTEXTS), H_KV * group, HEAD_DIM, generator=g).to(dtype=dtype,
                                                                             device=device)
    scale = HEAD_DIM**-0.5
    got = decode_attention(q, k_cache, v_cache, tables, ctx, scale, num_splits=num_splits,
                           block_n=16)
    want = decode_attention_ref(q, k_cache, v_cache, tables, ctx, scale)
    assert_close(got, want, dtype)
    assert not got[-1].any()  # the padding row


def test_decode_default_tiles_and_splits(device: torch.device) -> None:
    """The launch the engine uses (default tile, split heuristic), on a non-power-of-2 group."""
    g = torch.Generator().manual_seed(7)
    k_cache, v_cache = random_cache(40, 8, 1, 16, torch.float32, device, g)
    contexts = [3, 40, 64]
    tables = block_tables(contexts, 8, 40, 8, torch.int32, device, g)
    ctx = torch.tensor(contexts, dtype=torch.int32, device=device)
    q = torch.randn(3, 3, 16, generator=g).to(device)
    got = decode_attention(q, k_cache, v_cache, tables, ctx, 0.2)
    assert_close(got, decode_attention_ref(q, k_cache, v_cache, tables, ctx, 0.2), torch.float32)


def test_decode_checks_layouts(device: torch.device) -> None:
    cache = torch.zeros(4, 4, 2, 16, device=device)
    tables = torch.zeros(2, 4, dtype=torch.int32, device=device)
    ctx = torch.ones(2, dtype=torch.int32, device=device)
    q = torch.zeros(2, 4, 16, device=device)
    with pytest.raises(ValueError, match="multiple of H_kv"):
        decode_attention(q[:, :3], cache, cache, tables, ctx, 1.0)
    with pytest.raises(ValueError, match="float32"):
        decode_attention(q.half(), cache, cache, tables, ctx, 1.0)
    with pytest.raises(ValueError, match="one row per sequence"):
        decode_attention(q, cache, cache, tables[:1], ctx, 1.0)
    with pytest.raises(ValueError, match="head_dim"):
        decode_attention(q.transpose(1, 2).contiguous().transpose(1, 2), cache, cache, tables,
                         ctx, 1.0)


def test_default_num_splits_fills_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A power of two (few compiled variants), >= 256 tokens a split, only when B*H_kv is small."""
    props = type("Props", (), {"multi_processor_count": 132})()
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    cuda = torch.device("cuda")
    assert default_num_splits(1, 8, 40960, cuda) == 16
    assert default_num_splits(8, 8, 40960, cuda) == 4
    assert default_num_splits(64, 8, 40960, cuda) == 1
    assert default_num_splits(1, 8, 600, cuda) == 2
    assert default_num_splits(1, 8, 200, cuda) == 1
    assert default_num_splits(1, 8, 40960, torch.device("cpu")) == 1
