"""bf16 linear layers on CPUs with AVX512-BF16, on a compiled kernel that reads each weight
once per step at close to the machine's memory rate.

A decode step's linears are a read of the model's weights with a few rows to multiply. oneDNN's
bf16 matmul reads its packed weights well under the memory rate at those few rows (a quarter
to a half slower than the read bound of Qwen3-0.6B's shape on this machine's two cores); this
kernel (``csrc/cpu_linear_bf16.c``) keeps each weight in a layout of its own, packed once at
load, that every thread streams sequentially while up to eight rows are multiplied against it.
At many rows (a prefill) it stays within a fifth of oneDNN's, so one copy of the weights serves
both. Measure with ``python -m tools.micro.bench_cpu_linear --dtype bfloat16``; figures in
``tools/bench/results/cpu-kernels.md``.

The kernel runs on torch's own OpenMP runtime (compiled with ``-fopenmp``, it binds to the
``libgomp.so.1`` torch has loaded), so it uses the threads torch does, no more. It is trusted
only where that holds (its thread count follows ``torch.set_num_threads``) and where a probe
product agrees with ``F.linear``'s; otherwise oneDNN's packed linear serves, as it does with
``IZH_CPU_LINEAR_BF16=0``.
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F
from torch import nn

from izh_trio.engine import cbuild

_P, _I = ctypes.c_void_p, ctypes.c_int64
_KERNEL = cbuild.Kernel(
    "cpu_linear_bf16", label="CPU bf16 linear kernel", switch="IZH_CPU_LINEAR_BF16",
    signatures={"linear_bf16": (None, [_P, _P, _P, _P, _I, _I, _I, _P, _I]),
                "skinny_supported": (ctypes.c_int, []), "max_threads": (ctypes.c_int, [])},
    extra_flags=("-fopenmp",))

#: Outputs per block of the packed layout (``NB`` in the C source).
BLOCK = 32

_shares_torch_threads: bool | None = None


def available() -> bool:
    """Whether the kernel is built for this CPU (AVX512-BF16) and runs on torch's threads."""
    global _shares_torch_threads
    if not _KERNEL.available() or not _KERNEL.lib.skinny_supported():
        return False
    if _shares_torch_threads is None:
        before = torch.get_num_threads()
        try:
            seen = []
            for n in {1, before}:
                torch.set_num_threads(n)
                seen.append(_KERNEL.lib.max_threads() == n)
        finally:
            torch.set_num_threads(before)
        _shares_torch_threads = all(seen)
    return _shares_torch_threads


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [N, K] in the kernel's layout: [N / BLOCK][K / 2][BLOCK][2], zero-padded
    to whole blocks and an even K."""
    n, k = weight.shape
    padded = weight.new_zeros(-(-n // BLOCK) * BLOCK, -(-k // 2) * 2)
    padded[:n, :k] = weight
    return padded.view(-1, BLOCK, padded.shape[1] // 2, 2).permute(0, 2, 1, 3).contiguous()


class Bf16Linear(nn.Module):
    """``y = x @ W.T + b`` in bf16 with ``W`` packed for the kernel (``pack``)."""

    def __init__(self, packed: torch.Tensor, bias: torch.Tensor | None, in_features: int,
                 out_features: int) -> None:
        super().__init__()
        assert packed.dtype == torch.bfloat16 and (bias is None or bias.dtype == packed.dtype)
        self.packed, self.bias = packed, bias
        self.in_features, self.out_features = in_features, out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.dtype == torch.bfloat16 and x.shape[-1] == self.in_features
        rows = x.reshape(-1, self.in_features).contiguous()
        out = torch.empty(rows.shape[0], self.out_features, dtype=x.dtype)
        if rows.shape[0]:
            slots = torch.get_num_threads()
            part = torch.empty(slots * rows.shape[0] * BLOCK, dtype=torch.float32)
            _KERNEL.lib.linear_bf16(
                rows.data_ptr(), self.packed.data_ptr(),
                self.bias.data_ptr() if self.bias is not None else None, out.data_ptr(),
                rows.shape[0], self.out_features, self.in_features, part.data_ptr(), slots)
        return out.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bf16 kernel"


def from_linear(linear: nn.Linear) -> Bf16Linear | None:
    """``linear`` (bf16, on CPU) on the kernel, or None where the kernel disagrees with
    ``F.linear`` on a probe (then the caller keeps its own path)."""
    weight = linear.weight.detach()
    bias = linear.bias.detach() if linear.bias is not None else None
    layer = Bf16Linear(pack(weight), bias, linear.in_features, linear.out_features)
    probe = torch.randn(3, linear.in_features, generator=torch.Generator().manual_seed(0))
    probe = probe.to(torch.bfloat16)
    got, want = layer(probe).float(), F.linear(probe, weight, bias).float()
    if not torch.allclose(got, want, rtol=2e-2, atol=2e-2 * want.abs().max().item()):
        return None
    return layer
