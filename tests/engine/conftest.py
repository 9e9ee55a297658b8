"""Without CUDA, the triton attention backend's kernels run in Triton's interpreter.

``TRITON_INTERPRET`` is read when a kernel is decorated: set it before anything imports them.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
