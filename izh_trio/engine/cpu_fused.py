"""A decoder layer's elementwise ops in fp32, bf16 or fp16 on CPU, fused into four compiled C loops.

Between its GEMMs, a Qwen3 layer runs some sixty small torch ops: RMSNorm is six (square,
mean, add, rsqrt, multiply, multiply), RoPE six more for q and again for k, two
``index_copy_`` for the KV store, and the residual adds. At a small decode batch each is
mostly dispatch, and at a large one each streams its operands through memory again. Here
each group below is one C call, one pass over its rows (measure with
``python -m tools.micro.bench_cpu_fused``; figures in ``tools/bench/results/cpu-kernels.md``):

* ``qk_norm_rope_store``: q and k heads normed (per head, over ``head_dim``; Qwen3's, not
  Llama's) and rotated, k and v written into their paged-cache slots;
* ``add_rms_norm``: the residual add and the norm after it;
* ``rms_norm``: a norm alone (a layer's input norm, the final norm);
* ``silu_mul``: the MLP's SiLU of the gate times the up projection.

The arithmetic is torch's, rounding for rounding (``-ffp-contract=off``: no FMA where torch
rounds a product; the mean is the sum over ``n``, then ``1 / sqrt(mean + eps)``, ``x * r``,
then ``weight * that``), so only the order of the sum of squares differs: fp32 logits agree
with Hugging Face's as before. In bf16 the arithmetic is fp32 too, and every value torch's
bf16 ops would round (the normed row before the weight's product, each RoPE product and sum,
the residual add) is rounded to bf16 at the same point; fp16 likewise (its entries need a
compiler with ``_Float16``: GCC 12+ or clang). Plain loops that the compiler
vectorises. A call over enough values (``PARALLEL_MIN_VALUES``: a prefill's rows, or eight
decode rows of a 1,024-wide model) splits its rows between torch's threads: the library is
built with ``-fopenmp`` and binds to the OpenMP runtime torch loaded, as ``cpu_attention``
does; each row is computed as on one thread, so the results do not depend on the count. A
lone row (a single stream's step) stays on the calling thread. The C source is
``csrc/cpu_fused.c``, built once per machine (``cbuild``).
These functions only run kernels: the torch ops they replace live in one place, the model
(``models/``), whose CPU twins call them instead, swapped in once at load (a dtype the
library serves: ``serves``, not ``IZH_CPU_FUSED=0``: ``CausalLM.use_cpu_twins``).
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch

from izh_trio.engine import cbuild

_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
_SIGNATURES = {"qk_norm_rope_store": (_I, [_P, _P, _P, _F, _P, _P, _P, _P, _P, _P, _P]
                                      + [_I] * 5),
               "add_rms_norm": (None, [_P, _P, _P, _F, _P, _P, _I, _I]),
               "rms_norm": (None, [_P, _P, _F, _P, _I, _I]),
               "silu_mul": (None, [_P, _P, _I, _I])}
#: ``csrc/cpu_fused.c``, built on the first ``available()``; every product rounded as torch
#: rounds it (no FMA contraction). Each kernel has an fp32, a ``_bf16`` and (where the
#: compiler has ``_Float16``) an ``_f16`` entry.
_SUFFIX = {torch.float32: "", torch.bfloat16: "_bf16", torch.float16: "_f16"}
_KERNEL = cbuild.Kernel(
    "cpu_fused", label="CPU fused kernels", switch="IZH_CPU_FUSED",
    signatures={f"{name}{suffix}": sig for name, sig in _SIGNATURES.items()
                for suffix in _SUFFIX.values()},
    extra_flags=("-ffp-contract=off", "-fopenmp"))

#: Values a call reads from which its rows are split between torch's threads
#: (``PARALLEL_MIN`` in the C source); below, one thread. A decode step of eight rows of
#: Qwen3-0.6B's shape is past it (tools/bench/results/cpu-kernels.md).
PARALLEL_MIN_VALUES = 1 << 13


def available() -> bool:
    """Whether the kernels are built (compiling them on the first ask); False with
    ``IZH_CPU_FUSED=0`` or no compiler."""
    return _KERNEL.available()


def serves(dtype: torch.dtype) -> bool:
    """Whether the kernels are built and have entries for ``dtype``."""
    return dtype in _SUFFIX and available() and _KERNEL.has(f"rms_norm{_SUFFIX[dtype]}")


def _kernel(name: str, x: torch.Tensor, *others: torch.Tensor) -> Any:
    """The kernel ``name`` for ``x``'s dtype, which the call's other tensors share, on CPU
    with the library built."""
    assert x.is_cpu and serves(x.dtype), "not a tensor for the kernels"
    assert all(t.dtype == x.dtype and t.is_contiguous() for t in (x, *others))
    return getattr(_KERNEL.lib, f"{name}{_SUFFIX[x.dtype]}")


def entry(name: str, dtype: torch.dtype) -> int:
    """The address of kernel ``name`` for ``dtype``, for C code that calls it itself
    (``models/cpu_decode.py``); only after ``available()`` said True."""
    assert serves(dtype)
    return _KERNEL.address(f"{name}{_SUFFIX[dtype]}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim of ``x`` [..., N], as ``models.layers.RMSNorm``."""
    kernel = _kernel("rms_norm", x, weight)
    out = torch.empty_like(x)
    n = x.shape[-1]
    kernel(x.data_ptr(), weight.data_ptr(), eps, out.data_ptr(), x.numel() // n, n)
    return out


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = residual + x`` and ``rms_norm(h)``, both [..., N]: a layer's residual add and the
    norm after it, in one pass."""
    kernel = _kernel("add_rms_norm", x, residual, weight)
    assert x.shape == residual.shape
    h, out = torch.empty_like(x), torch.empty_like(x)
    n = x.shape[-1]
    kernel(x.data_ptr(), residual.data_ptr(), weight.data_ptr(), eps, h.data_ptr(),
           out.data_ptr(), x.numel() // n, n)
    return h, out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` where ``gate_up`` [..., 2 I] is an MLP's gate and up products side
    by side, as ``models.layers.MLP`` takes them (SiLU's e^x within an ulp or two of
    torch's)."""
    kernel = _kernel("silu_mul", gate_up)
    i = gate_up.shape[-1] // 2
    out = gate_up.new_empty(*gate_up.shape[:-1], i)
    kernel(gate_up.data_ptr(), out.data_ptr(), gate_up.numel() // (2 * i), i)
    return out


def qk_norm_rope_store(
    qkv: torch.Tensor, num_heads: int, num_kv_heads: int, q_norm: torch.Tensor | None,
    k_norm: torch.Tensor | None, eps: float, cos: torch.Tensor, sin: torch.Tensor,
    k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From ``qkv`` [T, (H_q + 2 H_kv) D]: q and k normed per head (unless ``q_norm`` and
    ``k_norm`` are None, as for Llama's heads) and rotated (cos, sin:
    [T, 1, D], each token's position, in qkv's dtype), k and v stored in the paged caches
    ([blocks, block_size, H_kv, D]) at ``slot_mapping`` [T] int64. Returns q [T, H_q, D] and
    k, v [T, H_kv, D] (v a view of ``qkv``), for attention over the fresh tokens. Every slot
    must be a slot of the cache: the torch backend's ``index_copy_`` demands it too (only
    CUDA graphs pad with -1, and they run the triton backend)."""
    t, d = qkv.shape[0], cos.shape[-1]
    norms = () if q_norm is None or k_norm is None else (q_norm, k_norm)
    assert all(n.shape == (d,) for n in norms)
    kernel = _kernel("qk_norm_rope_store", qkv, *norms, cos, sin, k_cache, v_cache)
    row = (num_heads + 2 * num_kv_heads) * d
    slots = k_cache.shape[0] * k_cache.shape[1]
    assert qkv.shape == (t, row) and slot_mapping.shape == (t,)
    assert cos.shape == sin.shape == (t, 1, d)
    assert k_cache.shape == v_cache.shape and k_cache.shape[2:] == (num_kv_heads, d)
    assert slot_mapping.is_contiguous() and slot_mapping.dtype == torch.int64
    q = torch.empty(t, num_heads, d, dtype=qkv.dtype)
    k = torch.empty(t, num_kv_heads, d, dtype=qkv.dtype)
    qw, kw = (n.data_ptr() for n in norms) if norms else (None, None)
    bad = kernel(qkv.data_ptr(), qw, kw, eps, cos.data_ptr(),
                 sin.data_ptr(), slot_mapping.data_ptr(), q.data_ptr(), k.data_ptr(),
                 k_cache.data_ptr(), v_cache.data_ptr(), t, num_heads, num_kv_heads, d, slots)
    if bad:
        raise IndexError(f"{bad} of {t} KV slots outside the cache's {slots}")
    v = qkv.as_strided((t, num_kv_heads, d), (row, d, 1),
                       qkv.storage_offset() + (num_heads + num_kv_heads) * d)
    return q, k, v
