"""Linear layers on CPU with their weights packed once into oneDNN's blocked layout.

``F.linear`` on CPU re-reads a plain row-major weight at every call; oneDNN's matmul on a
weight reordered once at load time runs the same fp32 arithmetic faster from a few rows up
(a decode step has one row per sequence). A single row is the exception (MKL's GEMV streams a
plain weight better), and that is a single stream's latency: so a model whose linear weights
are small (``PLAIN_COPY_LIMIT``) keeps the plain copy too, for one-row calls; a larger one is
packed only, rather than doubling its weights' memory. Measure with
``python -m tools.micro.bench_cpu_linear``; figures in ``tools/bench/results/cpu-kernels.md``.
Weights never change after loading (LoRA adds its own low-rank term beside the base layer),
so packing once is safe.

Packing is checked before it is trusted: a layer is only swapped when the packed product of a
probe input matches ``F.linear``'s; any build without oneDNN, or any dtype it cannot serve,
keeps plain ``nn.Linear``. ``IZH_ONEDNN_LINEAR=0`` keeps it too (for A/B measurements).
bf16 weights go to our own kernel where the CPU has AVX512-BF16 (``cpu_linear_bf16``), which
reads them faster at a decode step's few rows.
"""

from __future__ import annotations

import logging
import os

import torch
import torch.nn.functional as F
from torch import nn

from izh_trio.engine import cpu_linear_bf16
from izh_trio.engine.loader import cpu_has_native_bf16

log = logging.getLogger(__name__)


def _packable_dtypes() -> tuple[torch.dtype, ...]:
    """fp32 always; bf16 only where oneDNN has native bf16 kernels (else it emulates them)."""
    return (torch.float32, torch.bfloat16) if cpu_has_native_bf16() else (torch.float32,)


#: Up to this many bytes of plain linear weights, a plain copy is kept for one-row calls.
PLAIN_COPY_LIMIT = 256 << 20


class PackedLinear(nn.Module):
    """``y = x @ W.T + b`` with ``W`` in oneDNN's layout, and in plain layout too when
    ``plain`` is given (then used for one-row inputs)."""

    def __init__(self, packed: torch.Tensor, bias: torch.Tensor | None,
                 in_features: int, out_features: int, plain: torch.Tensor | None = None
                 ) -> None:
        super().__init__()
        self.packed = packed
        self.plain = plain
        self.bias = bias
        self.in_features, self.out_features = in_features, out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.plain is not None and x.numel() == self.in_features:
            return F.linear(x, self.plain, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, oneDNN"


def _pack(linear: nn.Linear, keep_plain: bool) -> PackedLinear | None:
    weight = linear.weight.detach()
    bias = linear.bias.detach() if linear.bias is not None else None
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight)
        layer = PackedLinear(packed, bias, linear.in_features, linear.out_features)
        probe = torch.randn(3, linear.in_features, generator=torch.Generator().manual_seed(0))
        probe = probe.to(weight.dtype)
        got, want = layer(probe).float(), F.linear(probe, weight, bias).float()
    except (RuntimeError, AttributeError) as exc:  # no oneDNN, or not for this dtype
        log.info("oneDNN linear unavailable (%s); using torch's", exc)
        return None
    tol = 1e-4 if weight.dtype == torch.float32 else 2e-2
    if not torch.allclose(got, want, rtol=tol, atol=tol * want.abs().max().item()):
        log.warning("oneDNN linear disagrees with torch's on a probe; using torch's")
        return None
    if keep_plain:
        layer.plain = weight
    return layer


def pack_linears(model: nn.Module) -> int:
    """Swap every ``nn.Linear`` of a CPU model for a packed one; returns how many were swapped."""
    if os.environ.get("IZH_ONEDNN_LINEAR", "1") == "0" or not torch.backends.mkldnn.is_available():
        return 0
    dtypes = _packable_dtypes()
    targets = [(name, module) for name, module in model.named_modules()
               if type(module) is nn.Linear and module.weight.device.type == "cpu"
               and module.weight.dtype in dtypes]
    keep_plain = sum(m.weight.nbytes for _, m in targets) <= PLAIN_COPY_LIMIT
    own_bf16 = cpu_linear_bf16.available()
    swapped = 0
    with torch.no_grad():
        for name, linear in targets:
            layer: nn.Module | None = None
            if own_bf16 and linear.weight.dtype == torch.bfloat16:
                layer = cpu_linear_bf16.from_linear(linear)
                if layer is None:
                    log.warning("the bf16 linear kernel disagrees with torch's on a probe; "
                                "using oneDNN's")
                    own_bf16 = False
            if layer is None:
                layer = _pack(linear, keep_plain)
            if layer is None:
                return swapped  # the same build fails the same way for the rest
            parent_name, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, attr, layer)
            swapped += 1
    return swapped
