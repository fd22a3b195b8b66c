"""Counters and histograms kept as plain numbers, turned into Prometheus samples at scrape time.

prometheus-client's ``Counter.labels(...).inc()`` takes a lock and walks its child machinery on
every call; ``Histogram.observe`` takes a lock per bucket value. The Router counts on one event
loop, so a labelled series here is one dict entry and a request costs a dict lookup and an add.
What a scrape sees is what prometheus-client's own families would print, sample for sample
(names, ``_total``/``_bucket``/``_count``/``_sum``/``_created``, label sets and order): the
exposition is still prometheus-client's.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Collection, Iterator
from typing import Any

from prometheus_client import metrics as prom_metrics
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

Labels = tuple[str, ...]


def _created_series() -> bool:
    # prometheus-client's switch (PROMETHEUS_DISABLE_CREATED_SERIES, or its disable function),
    # read at scrape time so the Router and its families agree with the SDK's agents.
    return bool(getattr(prom_metrics, "_use_created", True))


class CounterSeries(Collector):
    """A counter family: label values -> running total, plus when each series was first seen."""

    def __init__(
        self, name: str, doc: str, labelnames: Labels = (), *, now: Callable[[], float] = time.time
    ) -> None:
        self.name = name
        self.doc = doc
        self.labelnames = labelnames
        self._now = now
        self.values: dict[Labels, float] = {}
        self.created: dict[Labels, float] = {}
        if not labelnames:
            # An unlabelled counter exists from the start, at zero, as prometheus-client's does.
            self.values[()] = 0.0
            self.created[()] = now()

    def inc(self, labels: Labels = (), amount: float = 1.0) -> None:
        try:
            self.values[labels] += amount
        except KeyError:
            self.values[labels] = amount
            self.created[labels] = self._now()

    def get(self, labels: Labels = ()) -> float:
        return self.values.get(labels, 0.0)

    def drop(self, label: str, values: Collection[str]) -> None:
        """Forget every series whose ``label`` is one of ``values`` (an agent that is gone)."""
        _drop(self.values, self.created, self.labelnames.index(label), values)

    def collect(self) -> Iterator[Metric]:
        family = Metric(self.name, self.doc, "counter")
        names = self.labelnames
        created = self.created
        with_created = _created_series()
        for labels, value in list(self.values.items()):
            tags = dict(zip(names, labels, strict=True))
            family.add_sample(self.name + "_total", tags, value)
            if with_created:
                family.add_sample(self.name + "_created", tags, created[labels])
        yield family


class HistogramSeries(Collector):
    """A histogram family with fixed upper bounds; a series is per-bucket counts and a sum."""

    def __init__(
        self,
        name: str,
        doc: str,
        labelnames: Labels,
        buckets: tuple[float, ...],
        *,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.name = name
        self.doc = doc
        self.labelnames = labelnames
        self.bounds = tuple(float(b) for b in buckets)
        self._le = [floatToGoString(b) for b in self.bounds] + ["+Inf"]  # type: ignore[no-untyped-call]
        self._now = now
        # labels -> [count in bucket 0, ..., count above the last bound (+Inf), sum]
        self.series: dict[Labels, list[float]] = {}
        self.created: dict[Labels, float] = {}

    def row(self, labels: Labels) -> list[float]:
        """The series of ``labels`` (made now if new): a count per bucket, then the sum. A caller
        that keeps it may count into it as :meth:`observe` does, until the series is dropped."""
        row = self.series.get(labels)
        if row is None:
            row = self.series[labels] = [0.0] * (len(self.bounds) + 2)
            self.created[labels] = self._now()
        return row

    def observe(self, labels: Labels, value: float) -> None:
        row = self.row(labels)
        if value != value:
            # NaN is in no bucket (and not counted), only in the sum, as prometheus-client has it.
            row[-1] += value
            return
        # Buckets are "less than or equal": the first bound >= value takes it.
        row[bisect_left(self.bounds, value)] += 1.0
        row[-1] += value

    def drop(self, label: str, values: Collection[str]) -> None:
        """Forget every series whose ``label`` is one of ``values`` (a task no agent declares)."""
        _drop(self.series, self.created, self.labelnames.index(label), values)

    def collect(self) -> Iterator[Metric]:
        family = Metric(self.name, self.doc, "histogram")
        name = self.name
        with_created = _created_series()
        for labels, row in list(self.series.items()):
            tags = dict(zip(self.labelnames, labels, strict=True))
            running = 0.0
            for le, count in zip(self._le, row, strict=False):
                running += count
                family.add_sample(name + "_bucket", {**tags, "le": le}, running)
            family.add_sample(name + "_count", tags, running)
            family.add_sample(name + "_sum", tags, row[-1])
            if with_created:
                family.add_sample(name + "_created", tags, self.created[labels])
        yield family


def _drop(
    series: dict[Labels, Any], created: dict[Labels, float], index: int, values: Collection[str]
) -> None:
    if not values:
        return
    for labels in [labels for labels in series if labels[index] in values]:
        del series[labels]
        created.pop(labels, None)


__all__ = ["CounterSeries", "HistogramSeries"]
