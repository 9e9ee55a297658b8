"""The engine process keeps freed activation memory instead of page-faulting it in again."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")

_PROBE = """
import resource, sys, torch
from izh_trio.engine.process import keep_freed_memory
if sys.argv[1] == "tuned":
    assert keep_freed_memory()
def step():  # a step's activations: several blocks of a few MiB, all freed at its end
    blocks = [torch.empty(3 << 20).fill_(1.0) for _ in range(4)]
    del blocks
for _ in range(3):  # warm up: the heap grows to the step's peak once
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True,
                          timeout=120, check=True)
    return int(done.stdout.split()[-1])


def test_a_freed_block_is_reused_without_page_faults() -> None:
    assert _faults("tuned") < 500
    # The control: by default glibc trims the heap's freed top (48 MiB here) after every step
    # and faults it in again in the next, ~12k faults a step. Not in every run: in about one
    # in six the freed blocks do not end up at the heap's top (placement varies from run to
    # run) and nothing is trimmed, so the control looks for one run that shows it.
    assert any(_faults("default") > 20 * 5000 for _ in range(5))
