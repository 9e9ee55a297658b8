"""The CPU the rest of the machine is using, so that the engine's decode steps take the cores
it leaves free.

A decode step on one thread fewer than the cores leaves a core to the HTTP frontend, which
streams every token the step makes: right for a small model at many streams, where the
frontend is as busy as the engine. A large model at a few streams makes a token per sequence
every hundred milliseconds, the frontend is idle, and that core is wasted. What is measured is
everything but this process: the machine's busy time (``/proc/stat``: user, nice, system,
interrupts, and time the hypervisor stole) less this process's own (``/proc/self/stat``), in
cores, over a window. It counts the frontend, its other workers and anything else sharing the
machine (a load generator on the same host) alike. Where ``/proc`` says nothing (not Linux),
nothing is known, and the caller keeps a core free.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import attrs

_TICK = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)

#: A model whose step streams this many bytes of weights may spread its decode steps over
#: every core (``thread_plan``): a smaller one's matrix products are too short to gain from
#: a second thread what each parallel region costs (the tiny checkpoint reads ~4 MB a step,
#: Qwen3-0.6B 1.2-2.4 GB).
SPREAD_MIN_WEIGHT_BYTES = 64 << 20


def checkpoint_bytes(model_dir: str) -> int:
    """The size of a checkpoint's safetensors files: its weights, known before torch loads."""
    try:
        names = os.listdir(model_dir)
    except OSError:
        return 0
    return sum(os.path.getsize(os.path.join(model_dir, n)) for n in names
               if n.endswith(".safetensors"))


def machine_busy_seconds() -> float | None:
    """CPU seconds the machine's cores have been busy since boot (all cores summed)."""
    try:
        with open("/proc/stat", "rb") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != b"cpu" or len(fields) < 9:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return (user + nice + system + irq + softirq + steal) * _TICK


def own_busy_seconds() -> float | None:
    """CPU seconds this process (all its threads) has used."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: the fields follow the last ')'.
    fields = stat[stat.rfind(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) * _TICK  # utime, stime


@attrs.define
class OtherLoad:
    """Cores' worth of CPU used by everything but this process, averaged over the last
    ``window`` seconds; read at most once a window (two small ``/proc`` reads).

    It is read as steps run, so a reading after the engine waited for work would span the
    wait: what ran then (a client starting up, another server's run) says little of what
    runs now, and on its strength a large model's first decode steps after a pause kept a
    core free for a window. So the engine says when it waits (``pause``), and the next
    reading starts a new window, keeping the last figure."""

    window: float = 0.25
    machine: Callable[[], float | None] = machine_busy_seconds
    own: Callable[[], float | None] = own_busy_seconds
    clock: Callable[[], float] = time.monotonic
    cores: float | None = attrs.field(default=None, init=False)  # None: not known (yet)
    #: the last reading: when, and the rest of the machine's busy seconds then
    _since: tuple[float, float] | None = attrs.field(default=None, init=False)

    def pause(self) -> None:
        """The engine is about to wait for work: the next reading starts a window."""
        self._since = None

    def update(self) -> float | None:
        """The load of the last full window (None until one has passed, or without /proc)."""
        now = self.clock()
        if self._since is not None and now - self._since[0] < self.window:
            return self.cores
        machine, own = self.machine(), self.own()
        if machine is None or own is None:
            self._since, self.cores = None, None
            return None
        if self._since is not None:
            then, others = self._since
            self.cores = max(0.0, (machine - own - others) / (now - then))
        self._since = (now, machine - own)
        return self.cores
