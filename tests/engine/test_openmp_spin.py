"""The engine's idle OpenMP worker sleeps soon after a parallel region instead of spinning."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from izh_trio.engine.process import OPENMP_SPIN_COUNT, stop_idle_openmp_spinning

_PROBE = """
import os, sys, time
if sys.argv[1] == "engine":
    from izh_trio.engine.process import stop_idle_openmp_spinning
    assert stop_idle_openmp_spinning()
import torch
torch.set_num_threads(2)
a = torch.randn(512, 512)
tick = os.sysconf("SC_CLK_TCK")

def workers_cpu():  # every thread but the main one: torch's OpenMP pool
    total = 0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) != os.getpid():
            fields = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / tick

for _ in range(3):
    a @ a
before = workers_cpu()
for _ in range(20):
    a @ a              # a two-thread step
    time.sleep(0.02)   # then the engine is busy in Python, or waits for the frontend
print(workers_cpu() - before)
"""


def _workers_cpu(mode: str) -> float:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    done = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True,
                          timeout=120, check=True, env=env)
    return float(done.stdout.split()[-1])


@pytest.mark.timing
@pytest.mark.skipif(not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs /proc and two cores to run on: with one (taskset -c 0, "
                           "say), libgomp throttles its own spinning and there is none to stop")
def test_the_idle_worker_stops_spinning() -> None:
    default, engine = _workers_cpu("default"), _workers_cpu("engine")
    # The matmuls' own share is ~30 ms; libgomp's default adds ~10 ms of spin per gap.
    assert engine < default / 2, (default, engine)


def test_a_users_own_openmp_setting_wins() -> None:
    env: dict[str, str] = {}
    assert stop_idle_openmp_spinning(env)
    assert env == {"GOMP_SPINCOUNT": OPENMP_SPIN_COUNT}
    for mine in ({"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "infinite"}):
        env = dict(mine)
        assert not stop_idle_openmp_spinning(env)
        assert env == mine
