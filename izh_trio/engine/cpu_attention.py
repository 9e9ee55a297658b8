"""Paged decode attention on CPU, reading K/V in place from the paged cache (fp32, bf16 or fp16).

The torch path gathers every decoding sequence's K/V out of the cache in every layer, then
runs SDPA on the copy: at 256 sequences that copy is most of a step (memory-bound). This C
loop walks each sequence's block table instead and reads every K/V row once, for all the
query heads that share it (GQA), with an online softmax a block at a time. Reading the rows
is then the only work that has to be there, so the arithmetic must keep up with memory: a
horizontal sum per score and libm's ``expf`` per score made it compute-bound at a quarter
of the read rate. With AVX-512, 16 scores come out of one transpose-and-add tree and one
polynomial exp, and the next block is prefetched while this one is worked (blocks lie
anywhere in the cache, so the hardware prefetchers cannot guess them); elsewhere the same
steps are plain loops for the compiler. The sequences are split between torch's threads
(the library is built with ``-fopenmp`` and binds to the OpenMP runtime torch loaded, so it
uses the threads the engine's thread plan gives torch, no more); a batch with little context
stays on one. The C source is ``csrc/cpu_attention.c``, compiled once
per machine with the system C compiler (``cbuild``: cached, under a lock); with no compiler, or
for other dtypes, the engine keeps torch's path. A bf16 cache is widened to fp32 as it is
loaded (a shift: bf16 is the upper half of an fp32), an fp16 one by F16C's conversion, and
everything after it is fp32: half the bytes to read, the same arithmetic. One exception: where
the CPU has AVX512-BF16 and q's values are bf16 (a bf16 model's are), q . k runs on bf16 pairs
(``vdpbf16ps``; the products are exact, the sums fp32), which skips widening K.
"""

from __future__ import annotations

import ctypes

import torch

from izh_trio.engine import cbuild

#: ``csrc/cpu_attention.c``, built on the first ``available()``.
_KERNEL = cbuild.Kernel(
    "cpu_attention", label="CPU attention kernel", switch="IZH_CPU_ATTENTION",
    signatures=dict.fromkeys(("paged_decode", "paged_decode_bf16", "paged_decode_f16"),
                             (None, [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 6
                              + [ctypes.c_float])),
    extra_flags=("-fopenmp",))

#: The cache dtypes the kernel is written for (``serves`` says which this build reads); fp16's
#: entry needs a compiler with ``_Float16``.
_ENTRY = {torch.float32: "paged_decode", torch.bfloat16: "paged_decode_bf16",
          torch.float16: "paged_decode_f16"}


def available() -> bool:
    """Whether the kernel is built (compiling it on the first ask); False with
    ``IZH_CPU_ATTENTION=0`` or no compiler."""
    return _KERNEL.available()


def serves(dtype: torch.dtype) -> bool:
    """Whether the kernel is built and reads a ``dtype`` cache."""
    return dtype in _ENTRY and available() and _KERNEL.has(_ENTRY[dtype])


def entry(dtype: torch.dtype) -> int:
    """The kernel's address for a ``dtype`` cache (q and output fp32), for C code that calls
    it itself (``models/cpu_decode.py``); only after ``available()`` said True."""
    assert serves(dtype)
    return _KERNEL.address(_ENTRY[dtype])


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 tables: torch.Tensor, context_lens: torch.Tensor, scale: float
                 ) -> torch.Tensor:
    """q: [B, H_q, D]; caches [NB, BS, H_kv, D] fp32, bf16 or fp16; tables [B, W] and lens [B]
    int64. The result is in q's dtype (the kernel's q and output are fp32)."""
    assert k_cache.dtype == v_cache.dtype and serves(k_cache.dtype)
    assert tables.dtype == context_lens.dtype == torch.int64 and q.shape[1] % k_cache.shape[2] == 0
    assert k_cache.is_contiguous() and v_cache.is_contiguous()
    dtype = q.dtype
    q = q.contiguous().float()
    tables, context_lens = tables.contiguous(), context_lens.contiguous()
    out = torch.empty_like(q)
    b, h_q, d = q.shape
    _, bs, h_kv, _ = k_cache.shape
    kernel = getattr(_KERNEL.lib, _ENTRY[k_cache.dtype])
    kernel(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(),
           context_lens.data_ptr(), out.data_ptr(), b, h_q, h_kv, d, bs, tables.shape[1], scale)
    return out.to(dtype)
