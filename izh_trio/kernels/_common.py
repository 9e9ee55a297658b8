"""Shared checks and small helpers for the kernels' host-side wrappers."""

from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)


def check(condition: bool, message: str) -> None:
    """Layout checks that stay on under ``python -O`` (a wrong stride corrupts memory)."""
    if not condition:
        raise ValueError(message)


def check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """K and V caches: ``[num_blocks, block_size, H_kv, D]``, contiguous, same dtype and device."""
    check(k_cache.dim() == 4, f"k_cache must be [blocks, block_size, H_kv, D], got "
                              f"{tuple(k_cache.shape)}")
    check(k_cache.shape == v_cache.shape, "k_cache and v_cache differ in shape")
    check(k_cache.dtype == v_cache.dtype and k_cache.dtype in FLOAT_DTYPES,
          f"caches must share a float dtype, got {k_cache.dtype} and {v_cache.dtype}")
    check(k_cache.is_contiguous() and v_cache.is_contiguous(), "caches must be contiguous")
    check(k_cache.device == v_cache.device, "caches are on different devices")
    check(k_cache.stride() == v_cache.stride(), "caches differ in strides")


def check_query(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, rows: str
                ) -> tuple[int, int, int]:
    """Caches as ``check_cache``; ``q`` ``[rows, H_q, D]`` on their device, in their dtype,
    contiguous in D, with H_q a multiple of H_kv. Returns (block_size, H_kv, D)."""
    check_cache(k_cache, v_cache)
    _, page, h_kv, d = k_cache.shape
    check(q.dim() == 3 and q.shape[2] == d, f"q must be [{rows}, H_q, {d}], got {tuple(q.shape)}")
    check(q.dtype == k_cache.dtype, f"q is {q.dtype}, the caches {k_cache.dtype}")
    check(q.stride(-1) == 1, "q must be contiguous in head_dim")
    check(q.device == k_cache.device, "q is not on the caches' device")
    check(q.shape[1] % h_kv == 0, f"H_q ({q.shape[1]}) must be a multiple of H_kv ({h_kv})")
    return page, h_kv, d


def check_index(t: torch.Tensor, name: str, dims: int, device: torch.device) -> None:
    check(t.dtype in INDEX_DTYPES, f"{name} must be int32 or int64, got {t.dtype}")
    check(t.dim() == dims, f"{name} must have {dims} dims, got {tuple(t.shape)}")
    check(t.device == device, f"{name} is on {t.device}, the caches on {device}")
    check(t.stride(-1) == 1, f"{name} must be contiguous in its last dim")


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 stays fp32 through ``tl.dot`` (no TF32), so it matches the torch references."""
    return "ieee" if dtype == torch.float32 else "tf32"


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())
