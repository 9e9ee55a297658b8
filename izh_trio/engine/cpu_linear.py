"""Linear layers on CPU with their weights packed once into a layout made for them.

``F.linear`` on CPU re-reads a plain row-major weight at every call; oneDNN's matmul on a
weight reordered once at load time runs the same arithmetic faster from a few rows up, and our
own blocked kernel (``cpu_linear_blocked``: fp32 on AVX-512, bf16 on AVX512-BF16, fp16 with
F16C) reads a weight faster still at a decode step's few rows, while at a prefill's many it is
a little behind oneDNN. fp16 stays on it alone: oneDNN would emulate fp16's arithmetic. So a
model whose linear weights are small (``TWO_COPY_LIMIT``) keeps both
copies: the blocked one for up to ``cpu_linear_blocked.ROWS_PER_PASS`` rows, oneDNN's above; a
larger one keeps the blocked copy only rather than doubling its weights' memory. Where the
kernel cannot serve (no AVX-512, no compiler, ``IZH_CPU_LINEAR_BLOCKED=0``), oneDNN's serves
with, in a small model, the plain weight for one-row calls (MKL's GEMV streams it better).
Measure with ``python -m tools.micro.bench_cpu_linear``; figures in
``tools/bench/results/cpu-kernels.md``. Weights never change after loading (LoRA adds its own
low-rank term beside the base layer), so packing once is safe.

Every packing is checked before it is trusted: a layer is only swapped when the packed
product of a probe input matches ``F.linear``'s; any build without oneDNN, or any dtype it
cannot serve, keeps plain ``nn.Linear``. ``IZH_ONEDNN_LINEAR=0`` keeps it too (for A/B
measurements).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from izh_trio.engine import cpu_linear_blocked
from izh_trio.engine.loader import cpu_has_native_bf16

log = logging.getLogger(__name__)


def _packable_dtypes() -> tuple[torch.dtype, ...]:
    """What oneDNN packs: fp32 always; bf16 only where oneDNN has native bf16 kernels (else
    it emulates them). fp16 never: on a CPU without fp16 arithmetic it would emulate that too,
    so fp16 linears go to the blocked kernel alone."""
    return (torch.float32, torch.bfloat16) if cpu_has_native_bf16() else (torch.float32,)


#: Up to this many bytes of linear weights, a second copy serves a decode step's few rows.
TWO_COPY_LIMIT = 256 << 20


class PackedLinear(nn.Module):
    """``y = x @ W.T + b`` with ``W`` in oneDNN's layout; inputs of up to ``few_rows`` rows
    go to ``few`` when given (the same weights in a layout faster at those rows)."""

    def __init__(self, packed: torch.Tensor, bias: torch.Tensor | None,
                 in_features: int, out_features: int) -> None:
        super().__init__()
        self.packed = packed
        self.bias = bias
        self.in_features, self.out_features = in_features, out_features
        # a function, not a submodule: the same weights, not a layer of the model's own
        self.few: Callable[[torch.Tensor], torch.Tensor] | None = None
        self.few_rows = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.few is not None and x.numel() <= self.few_rows * self.in_features:
            return self.few(x)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, oneDNN"


def _pack(linear: nn.Linear) -> PackedLinear | None:
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
    return layer


def _layer_for(linear: nn.Linear, blocked: nn.Module | None, two_copies: bool,
               onednn: bool = True) -> nn.Module | None:
    """What replaces ``linear``: its blocked copy alone in a large model (or in a dtype
    oneDNN does not pack: ``onednn`` False); else oneDNN's packed copy, with the blocked one
    (or, without it, the plain weight for one row) for a decode step's few rows; None where
    neither can serve."""
    if blocked is not None and not (two_copies and onednn):
        return blocked
    packed = _pack(linear) if onednn else None
    if packed is None:
        return blocked
    if blocked is not None:
        packed.few, packed.few_rows = blocked.forward, cpu_linear_blocked.ROWS_PER_PASS
    elif two_copies:  # the original layer is the plain weight's F.linear (MKL's GEMV)
        packed.few, packed.few_rows = linear.forward, 1
    return packed


def pack_linears(model: nn.Module) -> int:
    """Swap every ``nn.Linear`` of a CPU model for a packed one; returns how many were swapped."""
    if os.environ.get("IZH_ONEDNN_LINEAR", "1") == "0" or not torch.backends.mkldnn.is_available():
        return 0
    dtypes = _packable_dtypes()
    own = {dtype for dtype in (*dtypes, torch.float16) if cpu_linear_blocked.available(dtype)}
    targets = [(name, module) for name, module in model.named_modules()
               if type(module) is nn.Linear and module.weight.device.type == "cpu"
               and (module.weight.dtype in dtypes or module.weight.dtype in own)]
    two_copies = sum(m.weight.nbytes for _, m in targets) <= TWO_COPY_LIMIT
    swapped = 0
    with torch.no_grad():
        for name, linear in targets:
            blocked = None
            if linear.weight.dtype in own:
                blocked = cpu_linear_blocked.from_linear(linear)
                if blocked is None:
                    log.warning("the blocked linear kernel disagrees with torch's on a probe "
                                "in %s; using oneDNN's", linear.weight.dtype)
                    own.discard(linear.weight.dtype)
            layer = _layer_for(linear, blocked, two_copies, linear.weight.dtype in dtypes)
            if layer is None:
                return swapped  # the same build fails the same way for the rest
            parent_name, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, attr, layer)
            swapped += 1
    return swapped
