from __future__ import annotations

import pytest
import torch

from izh_trio.kernels import store_kv, store_kv_ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("block_size", [4, 16])
def test_store_matches_reference(device: torch.device, dtype: torch.dtype,
                                 block_size: int) -> None:
    g = torch.Generator().manual_seed(block_size)
    h_kv, d, t = 2, 32, 11
    cache = torch.randn(8, block_size, h_kv, d, generator=g).to(dtype=dtype, device=device)
    # k and v as the model makes them: strided column slices of one fused projection.
    fused = torch.randn(t, 3 * h_kv * d, generator=g).to(dtype=dtype, device=device)
    k = fused[:, h_kv * d : 2 * h_kv * d].view(t, h_kv, d)
    v = fused[:, 2 * h_kv * d :].view(t, h_kv, d)
    assert not k.is_contiguous()
    slots = torch.randperm(8 * block_size, generator=g)[:t]
    slots[[2, 7]] = -1  # padding rows are skipped
    slots = slots.to(device)
    got_k, got_v = cache.clone(), cache.clone()
    store_kv(k, v, got_k, got_v, slots)
    want_k, want_v = cache.clone(), cache.clone()
    store_kv_ref(k, v, want_k, want_v, slots)
    assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)
    assert not torch.equal(got_k, cache)


def test_store_checks_layouts(device: torch.device) -> None:
    cache = torch.zeros(4, 4, 2, 16, device=device)
    k = torch.zeros(3, 2, 16, device=device)
    slots = torch.arange(3, device=device)
    with pytest.raises(ValueError, match="dtype"):
        store_kv(k.half(), k.half(), cache, cache.clone(), slots)
    with pytest.raises(ValueError, match="contiguous"):
        store_kv(k, k, cache.transpose(0, 1), cache.transpose(0, 1), slots)
    with pytest.raises(ValueError, match="int32 or int64"):
        store_kv(k, k, cache, cache.clone(), slots.float())
    with pytest.raises(ValueError, match="one slot per token"):
        store_kv(k, k, cache, cache.clone(), slots[:2])
