"""Paged attention, one backend a file, chosen once per engine by ``get_backend``.

* ``base.py``: the step as the model runner describes it (``StepAttention``), the backend
  protocol and the per-step metadata protocol every layer calls;
* ``torch_sdpa.py``: plain torch (SDPA), anywhere, and the reference the others match;
* ``cpu_kernel.py``: fp32, bf16 and fp16 on CPU, the compiled kernel reading K/V in place;
* ``triton.py``: the Triton kernels of ``izh_trio.kernels`` (imported only when chosen).
"""

from __future__ import annotations

import torch

from izh_trio.engine import cpu_attention
from izh_trio.engine.attention import cpu_kernel
from izh_trio.engine.attention.base import (
    AttentionBackend,
    AttentionMetadata,
    ChunkSpec,
    StepAttention,
    long_tensor,
)
from izh_trio.engine.attention.torch_sdpa import TORCH_BACKEND
from izh_trio.wire.options import ATTENTION_BACKENDS

__all__ = ["BACKEND_NAMES", "TORCH_BACKEND", "AttentionBackend", "AttentionMetadata",
           "ChunkSpec", "StepAttention", "get_backend", "long_tensor"]

#: What ``attention_backend`` may say (defined beside the other settings both processes know).
BACKEND_NAMES = ATTENTION_BACKENDS


def get_backend(name: str, device: torch.device, dtype: torch.dtype,
                windowed: bool = False) -> AttentionBackend:
    """The backend for setting ``name`` on ``device`` with the model in ``dtype``; a model with
    a sliding window (``windowed``) runs on torch's, the one whose masks know windows."""
    if name not in BACKEND_NAMES:
        raise ValueError(f"unknown attention backend {name!r}; expected one of {BACKEND_NAMES}")
    if windowed:
        if name not in ("auto", "torch"):
            raise ValueError(f"attention backend {name!r} has no sliding window; this model "
                             "needs one (use auto or torch)")
        return TORCH_BACKEND
    if name == "triton" or (name == "auto" and device.type == "cuda"):
        from izh_trio.engine.attention.triton import TRITON_BACKEND  # imports triton itself

        return TRITON_BACKEND
    if device.type == "cpu" and cpu_kernel.available() and cpu_attention.serves(dtype):
        return cpu_kernel.CPU_KERNEL_BACKEND
    return TORCH_BACKEND
