"""Kernel tests run on the GPU when there is one, else in Triton's interpreter on the CPU.

``TRITON_INTERPRET`` is read when a kernel is decorated, so it is set here, before any test
module imports ``izh_trio.kernels`` (and with it triton).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
