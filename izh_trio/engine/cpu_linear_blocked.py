"""fp32, bf16 and fp16 linear layers on CPU on a compiled kernel of our own, which reads each weight
once per step at close to the machine's memory rate.

A decode step's linears are a read of the model's weights with a few rows to multiply. oneDNN's
matmul reads its packed weights well under the memory rate at those few rows (in fp32 ~60 % of
the rate this kernel reaches on Qwen3-0.6B's shape on this machine's two cores, in bf16 a
quarter to a half slower than the read bound); this kernel (``csrc/cpu_linear_blocked.c``)
keeps each weight in a layout of its own, packed once at load, that every thread streams
sequentially while up to eight rows are multiplied against it. At many rows (a prefill) it
stays within a fifth or so of oneDNN's, so one copy of the weights serves both. fp32 needs
AVX-512; bf16 and fp16 AVX-512 with BW and VL (fp16 F16C too). bf16 is multiplied in AMX's
tiles where the CPU has them (``bf16_in_tiles``: at eight rows ``vdpbf16ps`` does no more
products a cycle than fp32's FMAs, and the arithmetic bounds the step), else by
``vdpbf16ps`` where it has AVX512-BF16; elsewhere, as fp16 on CPUs without fp16
arithmetic (every AMD one, Intel's before Sapphire Rapids), the weights are widened as they
stream and multiplied in fp32: half of fp32's bytes with fp32's arithmetic, where torch's
fp16 products on such a CPU run several times slower than fp32's. Measure with
``python -m tools.micro.bench_cpu_linear``; figures in ``tools/bench/results/cpu-kernels.md``.

The kernel runs on torch's own OpenMP runtime (compiled with ``-fopenmp``, it binds to the
``libgomp.so.1`` torch has loaded), so it uses the threads torch does, no more. It is trusted
only where that holds (its thread count follows ``torch.set_num_threads``) and where a probe
product agrees with ``F.linear``'s; otherwise oneDNN's packed linear serves, as it does with
``IZH_CPU_LINEAR_BLOCKED=0``.
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F
from torch import nn

from izh_trio.engine import cbuild

_P, _I = ctypes.c_void_p, ctypes.c_int64
_LINEAR = (ctypes.c_int, [_P, _P, _P, _P, _I, _I, _I, _P, _I])
_KERNEL = cbuild.Kernel(
    "cpu_linear_blocked", label="CPU blocked linear kernel", switch="IZH_CPU_LINEAR_BLOCKED",
    signatures={"linear_f32": _LINEAR, "linear_bf16": _LINEAR, "linear_f16": _LINEAR,
                "supported": (ctypes.c_int, []), "max_threads": (ctypes.c_int, []),
                "tiles": (ctypes.c_int, [])},
    extra_flags=("-fopenmp",))

#: Outputs per block of the packed layout (``NB`` in the C source).
BLOCK = 32
#: Rows multiplied in one pass over a weight (``TM``): up to these, the kernel reads the weight
#: once; past them, it is a little behind oneDNN's.
ROWS_PER_PASS = 8
#: What ``supported()`` sets for each dtype the kernel was built to serve on this CPU.
_DTYPE_BITS = {torch.float32: 1, torch.bfloat16: 2, torch.float16: 4}
#: ``supported()``'s bit for bf16 multiplied in hardware (``vdpbf16ps``), not widened.
BF16_PRODUCTS = 8
_ENTRY = {torch.float32: "linear_f32", torch.bfloat16: "linear_bf16",
          torch.float16: "linear_f16"}

_shares_torch_threads: bool | None = None


def available(dtype: torch.dtype) -> bool:
    """Whether the kernel serves ``dtype`` on this CPU (fp32: AVX-512; bf16: with BW and
    VL; fp16: F16C too) and runs on torch's threads."""
    global _shares_torch_threads
    bit = _DTYPE_BITS.get(dtype, 0)
    if not bit or not _KERNEL.available() or not _KERNEL.lib.supported() & bit:
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


def bf16_in_hardware() -> bool:
    """Whether the kernel multiplies bf16 with AVX512-BF16's ``vdpbf16ps`` (twice fp32's
    products an instruction) rather than widening it to fp32."""
    return _KERNEL.available() and bool(_KERNEL.lib.supported() & BF16_PRODUCTS)


def bf16_in_tiles() -> bool:
    """Whether the kernel multiplies bf16 in AMX's tiles (Sapphire Rapids and later, where
    Linux lets this process use them; ``IZH_CPU_AMX=0`` declines them): at a decode step's
    few rows ``vdpbf16ps`` costs as much arithmetic as fp32's FMAs, which the tiles do not."""
    return _KERNEL.available() and bool(_KERNEL.lib.tiles())


def entry(dtype: torch.dtype) -> int:
    """The kernel's address for ``dtype``, for C code that calls it itself
    (``models/cpu_decode.py``); only after ``available(dtype)`` said True."""
    return _KERNEL.address(_ENTRY[dtype])


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [N, K] in the kernel's layout, zero-padded to whole blocks:
    [N / BLOCK][K][BLOCK] in fp32 and fp16, [N / BLOCK][K / 2][BLOCK][2] in bf16 (K padded
    even)."""
    n, k = weight.shape
    group = 2 if weight.dtype == torch.bfloat16 else 1
    padded = weight.new_zeros(-(-n // BLOCK) * BLOCK, -(-k // group) * group)
    padded[:n, :k] = weight
    return padded.view(-1, BLOCK, padded.shape[1] // group, group).permute(0, 2, 1, 3).contiguous()


class BlockedLinear(nn.Module):
    """``y = x @ W.T + b`` in fp32, bf16 or fp16 with ``W`` packed for the kernel (``pack``)."""

    def __init__(self, packed: torch.Tensor, bias: torch.Tensor | None, in_features: int,
                 out_features: int) -> None:
        super().__init__()
        assert packed.dtype in _DTYPE_BITS and (bias is None or bias.dtype == packed.dtype)
        self.packed, self.bias = packed, bias
        self.in_features, self.out_features = in_features, out_features
        lib = _KERNEL.lib
        self._run = getattr(lib, _ENTRY[packed.dtype])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.dtype == self.packed.dtype and x.shape[-1] == self.in_features
        rows = x if x.dim() == 2 and x.is_contiguous() else \
            x.reshape(-1, self.in_features).contiguous()
        m = rows.shape[0]
        out = torch.empty(m, self.out_features, dtype=x.dtype)
        if m:
            slots = torch.get_num_threads()
            # fp32 partial sums, for rows past one pass only (a decode step has none)
            part = torch.empty(slots * m * BLOCK, dtype=torch.float32) \
                if m > ROWS_PER_PASS else None
            if self._run(rows.data_ptr(), self.packed.data_ptr(),
                         self.bias.data_ptr() if self.bias is not None else None,
                         out.data_ptr(), m, self.out_features, self.in_features,
                         part.data_ptr() if part is not None else None, slots):
                raise MemoryError("no memory for the blocked linear's packed rows")
        return out if x.dim() == 2 else out.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"{self.packed.dtype} blocked kernel")


def from_linear(linear: nn.Linear) -> BlockedLinear | None:
    """``linear`` (fp32, bf16 or fp16, on CPU) on the kernel, or None where the kernel
    disagrees with ``F.linear`` on a probe (then the caller keeps its own path)."""
    weight = linear.weight.detach()
    bias = linear.bias.detach() if linear.bias is not None else None
    layer = BlockedLinear(pack(weight), bias, linear.in_features, linear.out_features)
    probe = torch.randn(3, linear.in_features, generator=torch.Generator().manual_seed(0))
    probe = probe.to(weight.dtype)
    got, want = layer(probe).float(), F.linear(probe, weight, bias).float()
    tol = 1e-4 if weight.dtype == torch.float32 else 2e-2
    if not torch.allclose(got, want, rtol=tol, atol=tol * want.abs().max().item()):
        return None
    return layer
