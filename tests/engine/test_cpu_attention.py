"""The compiled CPU decode kernel against torch's SDPA on the same paged cache."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from izh_trio.engine import cpu_attention

pytestmark = pytest.mark.skipif(not cpu_attention.available(),
                                reason="no C compiler: the engine uses the torch path")


def _reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               tables: torch.Tensor, lens: torch.Tensor, scale: float) -> torch.Tensor:
    w, bs = tables.shape[1], k_cache.shape[1]
    k = k_cache[tables].flatten(1, 2).transpose(1, 2)
    v = v_cache[tables].flatten(1, 2).transpose(1, 2)
    mask = (torch.arange(w * bs)[None, :] < lens[:, None])[:, None, None, :]
    return F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=mask, scale=scale,
                                          enable_gqa=True).squeeze(2)


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize(("h_q", "h_kv"), [(2, 2), (4, 2), (8, 2), (6, 3)])
@pytest.mark.parametrize("head_dim", [16, 64])
def test_matches_sdpa(block_size: int, h_q: int, h_kv: int, head_dim: int) -> None:
    g = torch.Generator().manual_seed(block_size * 100 + h_q * 10 + head_dim)
    num_blocks, b = 128, 7
    k_cache = torch.randn(num_blocks, block_size, h_kv, head_dim, generator=g)
    v_cache = torch.randn(num_blocks, block_size, h_kv, head_dim, generator=g)
    lens = torch.tensor([1, 2, block_size, block_size + 1, 3 * block_size - 1, 37, 5])
    width = int((lens.max() + block_size - 1) // block_size)
    tables = torch.randint(0, num_blocks, (b, width), generator=g)  # shared blocks are fine
    q = torch.randn(b, h_q, head_dim, generator=g) * 4  # peaky scores test the rescaling
    scale = head_dim**-0.5
    got = cpu_attention.paged_decode(q, k_cache, v_cache, tables, lens, scale)
    torch.testing.assert_close(got, _reference(q, k_cache, v_cache, tables, lens, scale),
                               atol=1e-5, rtol=1e-5)


def test_engine_step_is_the_same_with_and_without_the_kernel(monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """The torch fallback (no compiler, or IZH_CPU_ATTENTION=0) decodes the same."""
    from izh_trio.engine.attention import ChunkSpec, StepAttention, build_metadata, paged_attention

    g = torch.Generator().manual_seed(3)
    k_cache = torch.randn(32, 4, 2, 16, generator=g)
    v_cache = torch.randn(32, 4, 2, 16, generator=g)
    decodes = [ChunkSpec(query_start=i, query_len=1, context_len=n,
                         block_table=list(range(8 * i, 8 * i + (n + 3) // 4)))
               for i, n in enumerate([3, 9, 30])]
    step = StepAttention(slots=[0, 1, 2], prefills=[], decodes=decodes, block_size=4)
    q = torch.randn(3, 4, 16, generator=g)
    kv = torch.zeros(3, 2, 16)
    fast = build_metadata(step, torch.device("cpu"), 2)
    assert fast.decode_in_place
    in_place = paged_attention(q, kv, kv, k_cache, v_cache, fast, 0.25)
    monkeypatch.setattr(cpu_attention, "_lib", False)
    slow = build_metadata(step, torch.device("cpu"), 2)
    assert not slow.decode_in_place
    torch.testing.assert_close(in_place, paged_attention(q, kv, kv, k_cache, v_cache, slow, 0.25),
                               atol=1e-5, rtol=1e-5)
