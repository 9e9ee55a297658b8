"""Row-wise argmax of fp32 logits on CPU, as ``torch.argmax(dim=-1)`` answers it.

Every greedy token is an argmax over the vocabulary, for every sequence of every step. torch's
CPU argmax reduces one element at a time, a visible share of a decode step; this loop keeps 16
running maxima and their indices in two vectors, one pass over each row, then folds the lanes
(figures in ``tools/bench/results/cpu-kernels.md``). It answers exactly what torch does: the first
index of the largest value; a NaN counts as larger than anything (the first NaN wins); a row of
equal values (all ``-inf`` under a grammar's mask, say) gives 0. The C source is
``csrc/cpu_argmax.c``, built once per machine (``cbuild``); without a compiler,
``IZH_CPU_ARGMAX=0``, or for other tensors, ``argmax_rows`` is torch's argmax.
"""

from __future__ import annotations

import ctypes

import torch

from izh_trio.engine import cbuild

#: ``csrc/cpu_argmax.c``, built on the first ``available()``.
_KERNEL = cbuild.Kernel(
    "cpu_argmax", label="CPU argmax kernel", switch="IZH_CPU_ARGMAX",
    signatures={"argmax_rows": (None, [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                       ctypes.c_void_p])})


def available() -> bool:
    """Whether the kernel is built (compiling it on the first ask)."""
    return _KERNEL.available()


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(dim=-1)`` for [S, V] logits; int64 [S] on the logits' device."""
    if not (logits.dtype == torch.float32 and logits.is_cpu and logits.dim() == 2
            and 0 < logits.shape[1] < 2**31 and available()):
        return logits.argmax(dim=-1)
    x = logits.contiguous()
    out = torch.empty(x.shape[0], dtype=torch.int64)
    _KERNEL.lib.argmax_rows(x.data_ptr(), x.shape[0], x.shape[1], out.data_ptr())
    return out
