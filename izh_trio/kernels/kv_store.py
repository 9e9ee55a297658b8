"""Write a step's new K/V into the paged cache.

``k``/``v`` are ``[T, H_kv, D]`` (rows may be strided views of a fused QKV projection, the last
dim contiguous); ``slot_mapping[t]`` is the flat slot ``block_id * block_size + offset`` of token
``t``, and a negative slot skips the token (padding rows of a CUDA-graph batch). One program
copies one token's K and V, all heads at once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from izh_trio.kernels._common import check, check_cache, check_index, next_pow2


@triton.jit
def _store_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cache_slot, stride_cache_h,
    H: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        h = tl.arange(0, BLOCK_H)[:, None]
        d = tl.arange(0, BLOCK_D)[None, :]
        mask = (h < H) & (d < D)
        dst = slot * stride_cache_slot + h * stride_cache_h + d
        k = tl.load(k_ptr + t.to(tl.int64) * stride_kt + h * stride_kh + d, mask=mask)
        tl.store(k_cache_ptr + dst, k, mask=mask)
        v = tl.load(v_ptr + t.to(tl.int64) * stride_vt + h * stride_vh + d, mask=mask)
        tl.store(v_cache_ptr + dst, v, mask=mask)


def store_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Triton: ``k_cache.view(-1, H_kv, D)[slot_mapping[t]] = k[t]`` for every non-negative slot."""
    check_cache(k_cache, v_cache)
    _, _, h, d = k_cache.shape
    check(k.dim() == 3 and k.shape == v.shape and tuple(k.shape[1:]) == (h, d),
          f"k, v must be [T, {h}, {d}], got {tuple(k.shape)} and {tuple(v.shape)}")
    check(k.dtype == v.dtype == k_cache.dtype,
          f"k/v dtype {k.dtype}/{v.dtype} differs from the cache's {k_cache.dtype}")
    check(k.stride(-1) == 1 and v.stride(-1) == 1, "k and v must be contiguous in head_dim")
    check(k.device == k_cache.device and v.device == k_cache.device,
          "k/v are not on the cache's device")
    check_index(slot_mapping, "slot_mapping", 1, k_cache.device)
    check(slot_mapping.shape[0] == k.shape[0], "slot_mapping must have one slot per token")
    t = k.shape[0]
    if t == 0:
        return
    _store_kv_kernel[(t,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(1), k_cache.stride(2),
        H=h, D=d, BLOCK_H=next_pow2(h), BLOCK_D=next_pow2(d),
    )


def store_kv_ref(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Torch reference: the same write, negative slots skipped."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k[keep])
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v[keep])
