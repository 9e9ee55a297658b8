"""Torch threads per engine step on CPU.

A step with enough new prompt work (a burst of arrivals for a small model, a prompt or two
for a large one) takes every core and prefills sooner (``tools/bench/results/cpu-kernels.md``).
A decode step of a large model takes every core while the rest of the machine is nearly idle
(``cpu_load.OtherLoad``: a few streams, whose frontend has a token per sequence to send now
and then), and leaves one core free while it is not (many streams, whose frontend streams as
fast as the engine makes tokens); a small model's decode steps always leave it one. Whether
every core is faster at all is measured, not assumed (``StepTimes``): what a second thread
adds against what its parallel regions cost depends on the machine, the dtype and the batch,
so on an idle machine a decode step takes whichever count its batch size has run fastest at.
``num_threads`` set by hand fixes every step's count.
"""

from __future__ import annotations

import logging
import os
import statistics
from collections import deque

import attrs
import torch

from izh_trio.engine.cpu_load import SPREAD_MIN_WEIGHT_BYTES, OtherLoad
from izh_trio.engine.scheduler import ScheduledSeq
from izh_trio.wire import EngineConfig

log = logging.getLogger(__name__)

#: Decode steps spread over every core while the rest of the machine uses less than this many
#: cores, and leave one free again once it uses more than ``GATHER_ABOVE`` (in between, they
#: stay as they are, so that a load near the line does not flip them every window). Spread
#: on two cores, a frontend that wants more than ~0.67 of one still measures above the upper
#: line (three runnable threads share two cores fairly), so a busy frontend is always seen.
SPREAD_BELOW = 0.25
GATHER_ABOVE = 0.5


#: A step takes every core from this much prompt work, in prompt tokens times weight bytes:
#: 256 tokens of a 16 MB model (the tiny benchmark model's 256-token line, where a step's
#: fixed costs still matter), 4 tokens of a 1 GB one, whose prompt tokens cost a few tens of
#: milliseconds each: on one thread, a 0.6B model's mixed step of 7 prompts took 1.2 s
#: against 0.7 s on two.
PREFILL_SPREAD_WORK = 256 * (16 << 20)
#: The most prompt tokens a step may have and still run as a decode step.
PREFILL_TOKENS_MAX = 256


def prefill_tokens(weight_bytes: int) -> int:
    """From how many prompt tokens a step of a model of ``weight_bytes`` takes every core."""
    return max(1, min(PREFILL_TOKENS_MAX, -(-PREFILL_SPREAD_WORK // max(1, weight_bytes))))


def _bucket(batch: list[ScheduledSeq]) -> int:
    """Batch sizes whose steps cost about the same: 1, 2-3, 4-7, 8-15, ..."""
    return len(batch).bit_length()


@attrs.define
class StepTimes:
    """Decode steps' durations per batch bucket and thread count, and which count to run a
    bucket's next step on: each is tried until it has ``SAMPLES`` figures, then the faster
    runs, and the other is measured afresh once its figures are ``explore_every`` steps of
    the bucket old while the two are within ``CLOSE`` of each other, ``far_every`` once the
    other is well behind (the machine and the contexts change): they are dropped and it runs
    until it has ``SAMPLES`` new ones (the first step after a change of count is not counted,
    so one step would teach nothing). Topping its window up by a step a visit instead kept a
    count whose figures came from a slow stretch (four slow steps in a row) behind for four
    visits, a minute of a 0.6B model decoding on one thread of two. A count that a bucket
    has only ever run right after a change of count (a batch size seen once at the end of
    each wave of requests, between steps of another bucket on the other count) learns from
    those steps, but for its first: they are how it runs, and without them its tries would
    never end.

    A count's figure is the median of its last ``WINDOW`` steps, not a moving average: one
    slow step (a page fault, the frontend taking the core, a neighbour on the host) must not
    hand the bucket to the slower count, which would then run until its next exploration."""

    explore_every: int = 64
    far_every: int = 256
    recent: dict[tuple[int, int], deque[float]] = attrs.field(factory=dict)
    steps: dict[int, int] = attrs.field(factory=dict)
    #: (bucket, count) pairs with a step counted that followed one of the same count
    settled: set[tuple[int, int]] = attrs.field(factory=set)
    #: pairs whose first step after a change of count was left out
    skipped: set[tuple[int, int]] = attrs.field(factory=set)
    #: the bucket's step at which each (bucket, count) pair's last figure was taken
    measured: dict[tuple[int, int], int] = attrs.field(factory=dict)

    SAMPLES = 3
    WINDOW = 7
    CLOSE = 1.2

    def seconds(self, bucket: int, count: int) -> float:
        """The figure ``choose`` ranks ``count`` by (needs a sample)."""
        return statistics.median(self.recent[bucket, count])

    def choose(self, bucket: int, counts: tuple[int, ...]) -> int:
        n = self.steps[bucket] = self.steps.get(bucket, 0) + 1
        for count in counts:
            if len(self.recent.get((bucket, count), ())) < self.SAMPLES:
                return count
        figure = {c: self.seconds(bucket, c) for c in counts}
        best, other = sorted(counts, key=figure.__getitem__)[:2]
        every = self.explore_every if figure[other] < self.CLOSE * figure[best] else \
            self.far_every
        if n - self.measured.get((bucket, other), 0) >= every:  # its figures are that old
            del self.recent[bucket, other]  # the loop above runs it until it has SAMPLES
            return other
        return best

    def observe(self, bucket: int, count: int, seconds: float, switched: bool = False) -> None:
        """A decode step's duration; ``switched``: the first on ``count`` after a step on
        another (threads waking, caches cold)."""
        key = (bucket, count)
        if switched and (key in self.settled or key not in self.skipped):
            self.skipped.add(key)
            return
        if not switched:
            self.settled.add(key)
        self.recent.setdefault(key, deque(maxlen=self.WINDOW)).append(seconds)
        self.measured[key] = self.steps.get(bucket, 0)


@attrs.define
class ThreadPlan:
    decode: int  #: a decode step's threads while the machine is busy
    prefill: int  #: every core: prompt bursts, and decode steps on an idle machine
    prefill_tokens: int = PREFILL_TOKENS_MAX  #: from these many prompt tokens, ``prefill``
    load: OtherLoad | None = None  #: None: decode steps always take ``decode``
    spread: bool = attrs.field(default=False, init=False)  #: every core allowed now
    times: StepTimes = attrs.field(factory=StepTimes)

    @classmethod
    def for_config(cls, config: EngineConfig, weight_bytes: int) -> ThreadPlan:
        if config.num_threads:
            return cls(config.num_threads, config.num_threads)
        if not config.device.startswith("cpu"):
            return cls(torch.get_num_threads(), torch.get_num_threads())
        cores = os.cpu_count() or 2
        spreads = cores > 1 and weight_bytes >= SPREAD_MIN_WEIGHT_BYTES
        return cls(max(1, cores - 1), cores, prefill_tokens(weight_bytes),
                   load=OtherLoad() if spreads else None)

    def for_batch(self, batch: list[ScheduledSeq]) -> int:
        prompt = sum(item.num_new_tokens for item in batch if item.num_new_tokens > 1)
        if prompt >= self.prefill_tokens:
            return self.prefill
        if not self._spread_decode():
            return self.decode
        return self.times.choose(_bucket(batch), (self.decode, self.prefill))

    def observe(self, batch: list[ScheduledSeq], threads: int, seconds: float,
                switched: bool) -> None:
        """A step's duration: decode-only steps on an idle machine teach ``choose``
        (``StepTimes.observe`` says which of those after a change of count, ``switched``)."""
        if self.spread and all(item.num_new_tokens == 1 for item in batch):
            self.times.observe(_bucket(batch), threads, seconds, switched)

    def idle(self) -> None:
        """The engine is about to wait for work (``OtherLoad.pause``)."""
        if self.load is not None:
            self.load.pause()

    def _spread_decode(self) -> bool:
        if self.load is None:
            return False
        others = self.load.update()
        was = self.spread
        if others is None or others > GATHER_ABOVE:
            self.spread = False
        elif others < SPREAD_BELOW:
            self.spread = True
        if self.spread != was:
            log.debug("decode steps %s (the rest of the machine: %.2f cores)",
                      "may take every core" if self.spread else "leave a core free",
                      others or 0.0)
        return self.spread
