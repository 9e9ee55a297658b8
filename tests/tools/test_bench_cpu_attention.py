"""tools/micro/bench_cpu_attention.py: both modes run, and the paths they time agree."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from izh_trio.engine import cpu_attention

ROOT = Path(__file__).resolve().parents[2]
TOOL = [sys.executable, "-m", "tools.micro.bench_cpu_attention"]  # run from ROOT

pytestmark = pytest.mark.skipif(not cpu_attention.available(), reason="no C compiler")


@pytest.mark.parametrize("mode", [
    ["--batch", "8", "--min-ctx", "5", "--max-ctx", "70"],
    # chunks of 12 rows continuing cached prefixes (contexts of 12 to 60 tokens)
    ["--prefill", "12", "--batch", "6", "--min-ctx", "12", "--max-ctx", "60"],
])
def test_runs_and_the_timed_paths_agree(mode: list[str]) -> None:
    res = subprocess.run([*TOOL, *mode, "--iters", "5", "--rounds", "1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    timings = re.findall(r"^(.+?)\s+([\d.]+) ms/call", res.stdout, re.M)
    assert len(timings) == 2 and all(float(ms) > 0 for _, ms in timings), res.stdout
    diffs = [float(d) for d in re.findall(r"max \|.*\| = (\S+)", res.stdout)]
    assert diffs and max(diffs) < 1e-4, res.stdout
