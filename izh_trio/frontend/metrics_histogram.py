"""The request path's histograms, kept as plain counts and made Prometheus buckets at scrape.

prometheus_client's ``Histogram.observe`` checks its labels, takes a lock for the sum and
another for the bucket, and walks the bounds in Python: about seven calls an observation.
The frontend observes the inter-token latency once per delivery and a dozen histograms once
per request, all on the event loop's one thread, where ``/metrics`` is rendered too, so no
lock is needed: an observation is a ``bisect`` and two additions. The exposition is
prometheus_client's own (same ``le`` spelling, ``_bucket``/``_count``/``_sum``, a zero
series per bound label value), as ``tests/frontend/test_metrics_counts.py`` checks.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString


class HistogramChild:
    """One label value's counts: ``counts[i]`` observations fell at or below ``bounds[i]``
    and above the bound before (``bounds`` ends with +Inf)."""

    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        # bisect_left: the first bound >= amount, prometheus_client's "amount <= bound"
        self.counts[bisect_left(self._bounds, amount)] += 1
        self.sum += amount


class LabelledHistogram(Collector):
    """A histogram family with one label (vLLM's ``model_name``), registered in ``registry``;
    the subset of prometheus_client's ``Histogram`` the metrics use: ``labels``, ``remove``."""

    def __init__(self, name: str, documentation: str, label: str, buckets: Sequence[float],
                 registry: CollectorRegistry) -> None:
        self._name, self._documentation, self._label = name, documentation, label
        bounds = [float(b) for b in buckets]
        if bounds[-1] != math.inf:
            bounds.append(math.inf)
        self._bounds = tuple(bounds)
        self._les = [floatToGoString(b) for b in bounds]
        self._children: dict[str, HistogramChild] = {}
        registry.register(self)

    def labels(self, value: str) -> HistogramChild:
        """The child of ``value``, made at zero the first time (looked up once, then kept)."""
        child = self._children.get(value)
        if child is None:
            child = self._children[value] = HistogramChild(self._bounds)
        return child

    def remove(self, value: str) -> None:
        self._children.pop(value, None)

    def describe(self) -> Iterator[HistogramMetricFamily]:
        # the registry's duplicate-name check, without collecting
        yield HistogramMetricFamily(self._name, self._documentation, labels=[self._label])

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self._name, self._documentation, labels=[self._label])
        for value, child in list(self._children.items()):
            cumulative, buckets = 0, []
            for le, count in zip(self._les, child.counts, strict=True):
                cumulative += count
                buckets.append((le, float(cumulative)))
            family.add_metric([value], buckets, child.sum)
        yield family
