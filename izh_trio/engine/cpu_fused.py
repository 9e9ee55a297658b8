"""A decoder layer's elementwise ops in fp32 on CPU, fused into three compiled C loops.

Between its GEMMs, a Qwen3 layer runs some sixty small torch ops: RMSNorm is six (square,
mean, add, rsqrt, multiply, multiply), RoPE six more for q and again for k, two
``index_copy_`` for the KV store, and the residual adds. At a small decode batch each is
mostly dispatch, and at a large one each streams its operands through memory again. Here
each group below is one C call, one pass over its rows (measure with
``python -m tools.micro.bench_cpu_fused``; figures in ``tools/bench/results/cpu-kernels.md``):

* ``qk_norm_rope_store``: q and k heads normed (per head, over ``head_dim``) and rotated,
  k and v written into their paged-cache slots;
* ``add_rms_norm``: the residual add and the norm after it;
* ``rms_norm``: a norm alone (a layer's input norm, the final norm).

The arithmetic is torch's, rounding for rounding (``-ffp-contract=off``: no FMA where torch
rounds a product; the mean is the sum over ``n``, then ``1 / sqrt(mean + eps)``, ``x * r``,
then ``weight * that``), so only the order of the sum of squares differs: fp32 logits agree
with Hugging Face's as before. Plain loops that the compiler vectorises; one thread, as the
engine runs torch. The C source is ``csrc/cpu_fused.c``, built once per machine (``cbuild``).
These functions only run kernels: the torch ops they replace live in one place, the model
(``models/``), whose CPU twins call them instead, swapped in once at load (fp32 on CPU, the
library built, not ``IZH_CPU_FUSED=0``: ``CausalLM.use_cpu_twins``).
"""

from __future__ import annotations

import ctypes

import torch

from izh_trio.engine import cbuild

_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
#: ``csrc/cpu_fused.c``, built on the first ``available()``; every product rounded as torch
#: rounds it (no FMA contraction).
_KERNEL = cbuild.Kernel(
    "cpu_fused", label="CPU fused kernels", switch="IZH_CPU_FUSED",
    signatures={"qk_norm_rope_store": (_I, [_P, _P, _P, _F, _P, _P, _P, _P, _P, _P, _P]
                                       + [_I] * 5),
                "add_rms_norm": (None, [_P, _P, _P, _F, _P, _P, _I, _I]),
                "rms_norm": (None, [_P, _P, _F, _P, _I, _I])},
    extra_flags=("-ffp-contract=off",))


def available() -> bool:
    """Whether the kernels are built (compiling them on the first ask); False with
    ``IZH_CPU_FUSED=0`` or no compiler."""
    return _KERNEL.available()


def _check(x: torch.Tensor) -> None:
    """The kernels take ``x``: fp32 on CPU, with the library built (the call's other tensors
    are checked by each wrapper)."""
    assert x.dtype == torch.float32 and x.is_cpu and available(), "not a tensor for the kernels"


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim of ``x`` [..., N], as ``models.layers.RMSNorm``."""
    _check(x)
    assert x.is_contiguous() and weight.is_contiguous() and weight.dtype == torch.float32
    out = torch.empty_like(x)
    n = x.shape[-1]
    _KERNEL.lib.rms_norm(x.data_ptr(), weight.data_ptr(), eps, out.data_ptr(), x.numel() // n, n)
    return out


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = residual + x`` and ``rms_norm(h)``, both [..., N]: a layer's residual add and the
    norm after it, in one pass."""
    _check(x)
    assert x.is_contiguous() and residual.is_contiguous() and weight.is_contiguous()
    assert x.shape == residual.shape and residual.dtype == weight.dtype == torch.float32
    h, out = torch.empty_like(x), torch.empty_like(x)
    n = x.shape[-1]
    _KERNEL.lib.add_rms_norm(x.data_ptr(), residual.data_ptr(), weight.data_ptr(), eps,
                             h.data_ptr(), out.data_ptr(), x.numel() // n, n)
    return h, out


def qk_norm_rope_store(
    qkv: torch.Tensor, num_heads: int, num_kv_heads: int, q_norm: torch.Tensor,
    k_norm: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor,
    k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From ``qkv`` [T, (H_q + 2 H_kv) D]: q and k normed per head and rotated (cos, sin:
    [T, 1, D], each token's position), k and v stored in the paged caches ([blocks,
    block_size, H_kv, D]) at ``slot_mapping`` [T] int64. Returns q [T, H_q, D] and k, v
    [T, H_kv, D] (v a view of ``qkv``), for attention over the fresh tokens. Every slot must
    be a slot of the cache: the torch backend's ``index_copy_`` demands it too (only CUDA
    graphs pad with -1, and they run the triton backend)."""
    t, d = qkv.shape[0], q_norm.shape[0]
    _check(qkv)
    row = (num_heads + 2 * num_kv_heads) * d
    slots = k_cache.shape[0] * k_cache.shape[1]
    assert qkv.is_contiguous() and qkv.shape == (t, row) and slot_mapping.shape == (t,)
    assert cos.is_contiguous() and sin.is_contiguous() and cos.shape == sin.shape == (t, 1, d)
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and slot_mapping.is_contiguous()
    assert k_cache.shape == v_cache.shape and k_cache.shape[2:] == (num_kv_heads, d)
    assert q_norm.is_contiguous() and k_norm.is_contiguous() and slot_mapping.dtype == torch.int64
    assert q_norm.dtype == k_norm.dtype == cos.dtype == sin.dtype == k_cache.dtype \
        == v_cache.dtype == torch.float32
    q = torch.empty(t, num_heads, d, dtype=torch.float32)
    k = torch.empty(t, num_kv_heads, d, dtype=torch.float32)
    bad = _KERNEL.lib.qk_norm_rope_store(
        qkv.data_ptr(), q_norm.data_ptr(), k_norm.data_ptr(), eps, cos.data_ptr(),
        sin.data_ptr(), slot_mapping.data_ptr(), q.data_ptr(), k.data_ptr(),
        k_cache.data_ptr(), v_cache.data_ptr(), t, num_heads, num_kv_heads, d, slots)
    if bad:
        raise IndexError(f"{bad} of {t} KV slots outside the cache's {slots}")
    v = qkv.as_strided((t, num_kv_heads, d), (row, d, 1),
                       qkv.storage_offset() + (num_heads + num_kv_heads) * d)
    return q, k, v

