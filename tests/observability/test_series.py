"""The plain-number metric families print what prometheus-client's own families print."""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from reachmesh.observability.series import CounterSeries, HistogramSeries

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
OBSERVED = [0.0, 0.001, 0.0010001, 0.003, 0.7, 1.0, 29.9, 30.0, 31.0, 1e9, -1.0, float("inf"), float("nan")]


def _without_created(text: bytes) -> str:
    # _created holds wall-clock times of first use; everything else must be equal byte for byte.
    return re.sub(r"(_created(?:\{[^}]*\})?) \S+", r"\1 T", text.decode())


def test_counters_and_histograms_print_as_prometheus_client_does() -> None:
    """Same observations, same exposition: names, suffixes, labels, bucket counts, sums, order."""
    theirs = CollectorRegistry(auto_describe=True)
    ours = CollectorRegistry(auto_describe=True)
    requests = Counter("reach_requests", "Requests", ["task", "agent", "status"], registry=theirs)
    latency = Histogram("reach_latency_seconds", "Latency", ["task"], buckets=BUCKETS, registry=theirs)
    expiries = Counter("reach_lease_expiries", "Expired", registry=theirs)
    untouched = Counter("reach_retries", "Retries", ["reason"], registry=theirs)
    my_requests = CounterSeries("reach_requests", "Requests", ("task", "agent", "status"))
    my_latency = HistogramSeries("reach_latency_seconds", "Latency", ("task",), BUCKETS)
    my_expiries = CounterSeries("reach_lease_expiries", "Expired")
    my_untouched = CounterSeries("reach_retries", "Retries", ("reason",))
    for family in (my_requests, my_latency, my_expiries, my_untouched):
        ours.register(family)
    assert untouched is not None and my_untouched is not None

    for i, value in enumerate(OBSERVED):
        task = "echo" if i % 3 else 'quote"d\\task'
        requests.labels(task, "a1", "SUCCESS").inc()
        my_requests.inc((task, "a1", "SUCCESS"))
        latency.labels(task).observe(value)
        my_latency.observe((task,), value)
    expiries.inc(2)
    my_expiries.inc(amount=2)

    assert _without_created(generate_latest(ours)) == _without_created(generate_latest(theirs))
    assert my_requests.get(("echo", "a1", "SUCCESS")) == 8.0


def test_created_is_the_time_a_series_was_first_seen() -> None:
    """A series' _created is stamped once, at its first count, from the injected clock."""
    now = [100.0]
    series = CounterSeries("c", "C", ("k",), now=lambda: now[0])
    series.inc(("a",))
    now[0] = 200.0
    series.inc(("a",))
    series.inc(("b",))
    assert series.created == {("a",): 100.0, ("b",): 200.0}
    assert series.values == {("a",): 2.0, ("b",): 1.0}
