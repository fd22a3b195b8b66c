"""Prometheus metrics (PROTOCOL.md §9), read from finished decision records.

Label cardinality is bounded by construction: ``task`` is a task some agent declared (anything
else, such as a caller's free text or a typo, is ``_unknown``), ``agent`` is a registered agent
id (``_none`` when no agent was involved), ``status`` and the reasons are closed enums. An
agent's series, and those of the tasks only it declared, are dropped when it leaves the registry
(deregistered or swept); a request that ends after that counts under ``_none`` and
``_unknown``. So the series grow with the registry, never with the traffic.

The registry alone is not bound enough: one agent token may hold 1000 agents of 64 tasks each,
and a scrape is rendered on the event loop, about 13 µs a line: 64,000 tasks called once made a
69 MB scrape that held the Router 15 s. So the ``task`` label takes at most
``metrics.max_tasks`` values besides ``_unknown`` and ``_other``, and ``reach_requests_total``
at most ``metrics.max_request_series`` label sets (and one ``_other`` one a status): past either, a
request whose labels have no series yet counts under ``task="_other"`` (and, past the second,
``agent="_other"``), until series are dropped and make room.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from reachmesh.config import MetricsPolicy
from reachmesh.decision import DecisionRecord
from reachmesh.observability.series import CounterSeries, HistogramSeries
from reachmesh.protocol import AgentStatusValue
from reachmesh.registry.base import AgentEntry, Registry, RegistryEvent

UNKNOWN_TASK = "_unknown"
NO_AGENT = "_none"
OTHER = "_other"
# Task labels of the metrics' own, never dropped with a registry's task: no agent declares them
# (one that names a task so shares its series), and their counts must not be reset.
_OWN_TASK_LABELS = (UNKNOWN_TASK, OTHER)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
# Scores by meaning are background-relative, about 0.05 to 0.2 (the bundled model's threshold is
# 0.083): fine steps there. Exact routes score 1.0, in a bucket of their own.
_SCORE_BUCKETS = (0.025, 0.05, 0.075, 0.1, 0.125, 0.15, 0.175, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 0.99, 1.0)
# Cells kept at most (RouterMetrics._cell): one per task, agent and status that ended requests,
# emptied at every registry change; the bound is a backstop.
_MAX_CELLS = 4096


@dataclass(frozen=True, slots=True)
class LiveReadings:
    """What the gauges read at scrape time, as plain readings handed in by the composition root.

    Observers sit below routing and resilience: they read decision records, registry events
    and these readings, never the breakers or the stats book themselves.
    """

    circuit: Callable[[str], int]  # an agent's breaker: 0 closed, 1 half-open, 2 open
    agent_inflight: Callable[[str], int]
    inflight: Callable[[], int]
    embedding_up: Callable[[], bool | None] = lambda: None
    # Requests waiting in the Router for a slot at a full agent (PROTOCOL §15).
    agent_queued: Callable[[str], int] = lambda _agent_id: 0


class _LiveState(Collector):
    """Gauges read at scrape time: registry size by status, breaker state and in-flight per agent."""

    def __init__(self, registry: Registry, live: LiveReadings) -> None:
        self._registry = registry
        self._live = live

    def collect(self) -> Iterable[Any]:
        agents = self._registry.agents()
        by_status = GaugeMetricFamily(
            "reach_registry_agents", "Registered agents by status", labels=["status"]
        )
        counts = dict.fromkeys(AgentStatusValue, 0)
        for entry in agents:
            counts[entry.status] += 1
        for status, count in counts.items():
            by_status.add_metric([status.value], count)
        yield by_status
        circuit = GaugeMetricFamily(
            "reach_agent_circuit_state",
            "Breaker state per agent: 0 closed, 1 half-open, 2 open",
            labels=["agent"],
        )
        agent_inflight = GaugeMetricFamily(
            "reach_agent_inflight_requests", "Requests in flight per agent", labels=["agent"]
        )
        agent_queued = GaugeMetricFamily(
            "reach_agent_queued_requests",
            "Requests waiting in the Router for a slot at a full agent (its max_concurrency)",
            labels=["agent"],
        )
        for entry in agents:
            circuit.add_metric([entry.id], self._live.circuit(entry.id))
            agent_inflight.add_metric([entry.id], self._live.agent_inflight(entry.id))
            agent_queued.add_metric([entry.id], self._live.agent_queued(entry.id))
        yield circuit
        yield agent_inflight
        yield agent_queued
        yield GaugeMetricFamily(
            "reach_inflight_requests", "Requests in flight in the Router", value=self._live.inflight()
        )
        yield GaugeMetricFamily(
            "reach_registry_degraded",
            "1 while the registry's store (etcd) is out of reach or refuses the Router: "
            "routing from the snapshot",
            value=0 if self._registry.degraded() is None else 1,
        )
        up = self._live.embedding_up()
        if up is not None:
            yield GaugeMetricFamily(
                "reach_embedding_up",
                "1 while the embedder answers; 0 while semantic routes are refused",
                value=1 if up else 0,
            )


class _Gauge(Collector):
    def __init__(
        self, name: str, documentation: str, read: Callable[[], float], *, counter: bool = False
    ) -> None:
        self._name, self._documentation, self._read = name, documentation, read
        self._family = CounterMetricFamily if counter else GaugeMetricFamily

    def collect(self) -> Iterable[Any]:
        yield self._family(self._name, self._documentation, value=self._read())


def _stream_series() -> tuple[HistogramSeries, CounterSeries, CounterSeries]:
    """The families of streamed answers (protocol §14): time to first chunk, bytes, endings."""
    return (
        HistogramSeries(
            "reach_stream_first_chunk_seconds",
            "Time from a streamed request's arrival to its first chunk going out",
            ("task",),
            _LATENCY_BUCKETS,
        ),
        CounterSeries("reach_stream_bytes", "Bytes of chunks relayed to streaming callers", ("task",)),
        CounterSeries(
            "reach_streams",
            # Every ending the record can carry (dispatch/streaming.py, the dispatcher's cuts).
            "Streamed requests by how they ended (done, plain, broken, timeout, agent_error, caller_gone,"
            " shutdown, before_first_chunk)",
            ("ended",),
        ),
    )


def _later_series() -> tuple[HistogramSeries, CounterSeries, CounterSeries, CounterSeries]:
    """The families added after the first ones: those of streamed answers, and the calls not sent
    after a wait for a slot, by agent (protocol §20)."""
    return (
        *_stream_series(),
        CounterSeries(
            "reach_not_sent",
            "Calls that waited for a slot at a full agent and were not sent to it: too little of "
            "their deadline was left for its usual answer time",
            ("agent",),
        ),
    )


class RouterMetrics:
    """The Router's metric families, one CollectorRegistry per Router (so tests stay apart)."""

    def __init__(self, registry: Registry, live: LiveReadings) -> None:
        self._registry = registry
        self.prom = CollectorRegistry(auto_describe=True)
        self._gauges: dict[str, _Gauge] = {}
        # In the order prometheus-client's own families were registered, so a scrape reads the
        # same as before the counting moved to plain numbers (see observability/series.py).
        self.requests = CounterSeries(
            "reach_requests", "Requests by task, handling agent and final status", ("task", "agent", "status")
        )
        self.match_score = HistogramSeries(
            "reach_route_match_score", "Score of the selected route", ("strategy",), _SCORE_BUCKETS
        )
        self.circuit_trips = CounterSeries(
            "reach_agent_circuit_trips", "Times an agent's breaker opened", ("agent",)
        )
        self.latency = HistogramSeries(
            "reach_end_to_end_latency_seconds",
            "Router latency of a request, end to end",
            ("task",),
            _LATENCY_BUCKETS,
        )
        self.retries = CounterSeries("reach_retries", "Same-agent retries by reason", ("reason",))
        self.failovers = CounterSeries("reach_failovers", "Failovers to another agent by reason", ("reason",))
        self.lease_expiries = CounterSeries(
            "reach_lease_expiries", "Leases that ran out (agent went offline)"
        )
        self.health_failures = CounterSeries(
            "reach_health_check_failures", "Failed health probes by agent", ("agent",)
        )
        self.attempts = CounterSeries("reach_upstream_attempts", "Upstream attempts by outcome", ("outcome",))
        self.queue_wait = HistogramSeries(
            "reach_queue_wait_seconds",
            "Time a request waited in the Router for a slot at a full agent (requests that waited)",
            ("agent",),
            _LATENCY_BUCKETS,
        )
        self.semantic_refusals = CounterSeries(
            "reach_semantic_refusals", "Requests refused because no capability scored above the threshold"
        )
        self.first_chunk, self.stream_bytes, self.streams, self.not_sent = _later_series()
        for family in (
            self.requests,
            self.match_score,
            self.circuit_trips,
            self.latency,
            self.retries,
            self.failovers,
            self.lease_expiries,
            self.health_failures,
            self.attempts,
            self.semantic_refusals,
            self.queue_wait,
            self.first_chunk,
            self.stream_bytes,
            self.streams,
            self.not_sent,
        ):
            self.prom.register(family)
        self.prom.register(_LiveState(registry, live))
        self._start_cells()

    def _start_cells(self) -> None:
        self.policy = MetricsPolicy()  # the bounds of the series (see _bounded); apply() sets them
        # (matched task, agent, status) -> its _cell; emptied whenever the registry changes, and
        # whenever series are dropped, so a cell never holds labels or a row that are out of date.
        self._cells: dict[tuple[Any, ...], tuple[tuple[str, str, str], list[float], str, str]] = {}
        # The dicts the families count in (never rebound), read without the family each time.
        self._requests = self.requests.values
        self._outcomes = self.attempts.values
        # HistogramSeries.observe, written out in _count for the one histogram every request feeds.
        self._latency_bounds = self.latency.bounds
        self._registry.subscribe(self._changed)

    def __call__(self, record: DecisionRecord) -> None:
        """Count one finished request; an error is raised to the caller, after the request and
        its latency were counted.

        Runs for every request, on the event loop. Records that name the same task, agent and
        status share a :meth:`_cell`, made once: the requests series' key, the latency series'
        row and the labels, so the common request costs three dict lookups and four adds."""
        self._count(record)

    def observe_all(self, records: Sequence[DecisionRecord], failed: Callable[[Any], None]) -> None:
        """Count each record, in order, as one call per record would; a record that fails is
        reported to ``failed`` (inside its ``except`` block) and the others still count.

        The end of the loop's turn hands over every record of the turn at once (about 16 under
        load at c32)."""
        count = self._count
        for record in records:
            try:
                count(record)
            except Exception:  # noqa: BLE001 - one record's bug must not cost the others their counts
                failed(self)

    def _count(self, record: DecisionRecord) -> None:
        """One record: its requests series, its latency, its attempts, and the rarer parts."""
        attempts = record.attempts
        agent = record.handler or (attempts[-1].agent_id if attempts else NO_AGENT)
        cell = self._cells.get((record.matched_task, agent, record.status))
        if cell is None:
            cell = self._cell(record, agent)
        key, row, task, agent = cell
        try:
            self._requests[key] += 1.0
        except KeyError:  # the first request of its series
            self.requests.inc(key)
        seconds = record.duration_ms / 1000
        if seconds == seconds:  # not NaN: NaN is in no bucket, only in the sum (prometheus-client's way)
            row[bisect_left(self._latency_bounds, seconds)] += 1.0
        row[-1] += seconds
        outcomes = self._outcomes
        for attempt in attempts:
            try:
                outcomes[(attempt.outcome,)] += 1.0
            except KeyError:
                self.attempts.inc((attempt.outcome,))
        if (
            record.score is not None
            or record.retries
            or record.failovers
            or record.circuit_trips
            or record.semantic_refused
            or record.queue_wait_ms
            or record.stream is not None
        ):
            self._more(record, task, agent)

    def _cell(self, record: DecisionRecord, agent: str) -> tuple[tuple[str, str, str], list[float], str, str]:
        """``(requests key, latency row, task, agent)`` for the labels of ``record`` (handled by
        ``agent``) as the registry stands now, kept until the registry changes.

        A request that ends after its agent (or its task's last agent) left the registry would
        bring back series :meth:`forget` dropped, for good: it counts as no agent, no known task.
        (NO_AGENT and UNKNOWN_TASK come out as themselves either way.)"""
        cells = self._cells
        if len(cells) >= _MAX_CELLS:  # only names the registry knew; a bound all the same
            cells.clear()
        snapshot = self._registry.snapshot  # its dicts, read without a call through the registry
        named = agent if agent in snapshot.entries else NO_AGENT
        task = record.matched_task or UNKNOWN_TASK
        if not snapshot.index.get(task):  # no registry.by_task(task)
            task = UNKNOWN_TASK
        status = record.status
        # The member's value without the enum's property (a Python-level call).
        task, key = self._bounded(task, named, "UNKNOWN" if status is None else status._value_)
        cell = cells[(record.matched_task, agent, status)] = (key, self.latency.row((task,)), task, named)
        return cell

    def _bounded(self, task: str, agent: str, status: str) -> tuple[str, tuple[str, str, str]]:
        """The task label and the requests key of a request, within ``metrics.max_tasks`` and
        ``metrics.max_request_series`` (see the module's docstring). Per cell, not per request."""
        policy, tasks = self.policy, self.latency.series
        if task != UNKNOWN_TASK and (task,) not in tasks:
            special = sum((own,) in tasks for own in _OWN_TASK_LABELS)
            if len(tasks) - special >= policy.max_tasks:
                task = OTHER
        key = (task, agent, status)
        requests = self._requests
        if key not in requests and len(requests) >= policy.max_request_series:
            key = (OTHER, OTHER, status)  # at most one more series a status
        return task, key

    def apply(self, policy: MetricsPolicy) -> None:
        """Take reloaded bounds: series already kept stay, new ones are judged by them."""
        self.policy = policy
        self._cells.clear()

    def _changed(self, _event: RegistryEvent, _entry: AgentEntry) -> None:
        """The registry changed: the cells' labels are worked out again as they are next used."""
        self._cells.clear()

    def _more(self, record: DecisionRecord, task: str, agent: str) -> None:
        """A score, retries, failovers, breaker trips, a refusal by meaning, a wait, a stream."""
        if record.score is not None and record.strategy:
            self._score(record)
        if record.retries or record.failovers or record.circuit_trips:
            self._trouble(record)
        if record.semantic_refused or record.queue_wait_ms or record.stream is not None:
            self._rarer(record, task, agent)

    def _score(self, record: DecisionRecord) -> None:
        assert record.score is not None and record.strategy
        strategy = "semantic_route" if record.semantic is not None else record.strategy
        self.match_score.observe((strategy,), record.score)

    def _rarer(self, record: DecisionRecord, task: str, agent: str) -> None:
        """A refusal by meaning, a wait for a slot, a stream: what most requests do not have."""
        if record.semantic_refused:
            self.semantic_refusals.inc()
        if record.queue_wait_ms:
            self.queue_wait.observe((agent,), record.queue_wait_ms / 1000)
            for agent_id in record.not_sent:  # a call not sent always waited first
                if self._registry.get(agent_id) is not None:
                    self.not_sent.inc((agent_id,))
        if record.stream is not None:
            self._stream(record, task)

    def _trouble(self, record: DecisionRecord) -> None:
        """The retries, failovers and breaker trips of a request that had any."""
        for reason in record.retries:
            self.retries.inc((reason,))
        for reason in record.failovers:
            self.failovers.inc((reason,))
        for agent_id in record.circuit_trips:
            if self._registry.get(agent_id) is not None:
                self.circuit_trips.inc((agent_id,))

    def _stream(self, record: DecisionRecord, task: str) -> None:
        stream = record.stream
        assert stream is not None
        self.streams.inc((stream.ended or "before_first_chunk",))
        if stream.first_chunk_ms is not None:
            self.first_chunk.observe((task,), stream.first_chunk_ms / 1000)
        if stream.bytes:
            self.stream_bytes.inc((task,), stream.bytes)

    def on_registry(self, event: RegistryEvent, entry: AgentEntry) -> None:
        if event is RegistryEvent.OFFLINE:
            self.lease_expiries.inc()
        elif event in (RegistryEvent.DEREGISTERED, RegistryEvent.REMOVED):
            self.forget(entry)
        elif event is RegistryEvent.REPLACED:
            # A registration in place may drop tasks; which ones, the new entry cannot say.
            declared = self._registry.by_task
            gone = [
                labels[0]
                for labels in self.latency.series
                if labels[0] not in _OWN_TASK_LABELS and not declared(labels[0])
            ]
            self._drop_tasks(gone)

    def _drop_tasks(self, gone: list[str]) -> None:
        self._cells.clear()
        for family in (self.requests, self.latency, self.first_chunk, self.stream_bytes):
            family.drop("task", gone)

    def forget(self, entry: AgentEntry) -> None:
        """Drop the series of an agent that left the registry, and of the tasks only it declared:
        so the series follow the registry, and register/deregister churn leaves none behind."""
        agent = (entry.id,)
        gone = [
            task
            for task in entry.capabilities
            if task not in _OWN_TASK_LABELS and not self._registry.by_task(task)
        ]
        self._cells.clear()
        by_agent = (self.requests, self.circuit_trips, self.health_failures, self.queue_wait, self.not_sent)
        for family in by_agent:
            family.drop("agent", agent)
        self._drop_tasks(gone)

    def on_probe(self, agent_id: str, ok: bool) -> None:
        if not ok and self._registry.get(agent_id) is not None:
            self.health_failures.inc((agent_id,))

    def gauge(
        self, name: str, documentation: str, read: Callable[[], float], *, counter: bool = False
    ) -> None:
        """A gauge (or, with ``counter``, a running total) read at scrape time from another part:
        the async result store's bytes, the retries the budget refused.

        Naming one again points it at the new reading (a bridge built twice for one Router)."""
        old = self._gauges.pop(name, None)
        if old is not None:
            self.prom.unregister(old)
        self._gauges[name] = gauge = _Gauge(name, documentation, read, counter=counter)
        self.prom.register(gauge)

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric."""
        return generate_latest(self.prom)


__all__ = ["CONTENT_TYPE", "RouterMetrics"]
