"""The composition root: every part of a Router, built from one policy, reconfigured together.

:func:`RouterParts.build` is the one place that builds the parts and knows which implementation
backs each contract (the registry, the transport, the embedder, the credentials guard): no part
makes defaults of its own for this module to overwrite, and each is handed the others it uses.
:meth:`RouterParts.apply` hands a reloaded policy to each part through that part's own
``apply`` method, so no part's attributes are set from outside and no backend is special-cased.
The ASGI app (:mod:`.app`) and its two HTTP surfaces (:mod:`.admin`, :mod:`.ui`) only read the
parts.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reachmesh.clock import SYSTEM_CLOCK, Clock
from reachmesh.config import MetricsPolicy, RouterConfig
from reachmesh.decision import ObserveAfterTurn, Observer
from reachmesh.dispatch import durable
from reachmesh.dispatch.agentsecret import AgentSecrets
from reachmesh.dispatch.asyncmode import AsyncRequests
from reachmesh.dispatch.attempts import Forwarding
from reachmesh.dispatch.dispatcher import Dispatcher
from reachmesh.dispatch.durable import Adopter
from reachmesh.dispatch.learning import RouteLearner
from reachmesh.dispatch.results import ResultStore
from reachmesh.dispatch.suggest import Suggester
from reachmesh.observability.logging import TraceLog
from reachmesh.observability.metrics import LiveReadings, RouterMetrics
from reachmesh.observability.traces import TraceStore
from reachmesh.redaction import loggable
from reachmesh.registry.base import AgentEntry, Registry, RegistryEvent
from reachmesh.registry.etcd import EtcdRegistry
from reachmesh.registry.etcd.deferred import DeferredStore
from reachmesh.registry.factory import build_registry
from reachmesh.resilience.affinity import AffinityTable
from reachmesh.resilience.breaker import BreakerBoard, BreakerState
from reachmesh.resilience.capacity import CapacityBoard
from reachmesh.resilience.probes import HealthChecker
from reachmesh.resilience.retry import RetryBudget
from reachmesh.resilience.shedding import LoadShedder
from reachmesh.routing.pipeline import Pipeline
from reachmesh.routing.stats import StatsBook
from reachmesh.semantic.embedders.factory import build_embedder
from reachmesh.semantic.vectors import CapabilityVectors
from reachmesh.server.auth import Guard, OpenGuard, TokenGuard
from reachmesh.server.origin import OPEN_TO_EVERY_PAGE, open_to_every_page
from reachmesh.server.reload import PolicyFile
from reachmesh.transport.base import Transport
from reachmesh.transport.http import HttpTransport, head_limits
from reachmesh.transport.urlguard import UrlGuard

# reach_agent_circuit_state's values (PROTOCOL.md §9).
_CIRCUIT_VALUE = {BreakerState.CLOSED: 0, BreakerState.HALF_OPEN: 1, BreakerState.OPEN: 2}

registry_log = logging.getLogger("reachmesh.registry")
router_log = logging.getLogger("reachmesh.router")

# Certificate and key files are read when the Router starts (the listening socket and the client
# pool hold them); a reload cannot swap them, so it says so rather than seem to.
_TLS_KEYS = (
    ("server", ("tls_cert_file", "tls_key_file")),
    ("outbound", ("ca_file", "client_cert_file", "client_key_file")),
)


# The embedder is built once at start (a model loaded, a client opened, vectors indexed with it):
# a reload applies the thresholds, not another embedder.
_EMBEDDER_KEYS = (
    "backend",
    "url",
    "model_path",
    "model",
    "api_key_env",
    "api_key_header",
    "query_prefix",
    "passage_prefix",
    "send_input_type",
    "batch_size",
    "timeout_ms",
    "batch_timeout_ms",
)


def _warn_restart_only_changes(old: RouterConfig, new: RouterConfig) -> None:
    """Say which changed keys a reload cannot apply: TLS files and the embedder are set up at start."""
    for section, keys in _TLS_KEYS:
        for key in keys:
            if getattr(getattr(old, section), key) != getattr(getattr(new, section), key):
                router_log.warning(
                    "%s.%s changed: TLS files are read at start; restart to use it", section, key
                )
    if old.server.trusted_proxies != new.server.trusted_proxies:
        # uvicorn takes them at start; a reload that seemed to apply a narrower list left every
        # local process able to name itself a new client by X-Forwarded-For.
        router_log.warning(
            "server.trusted_proxies changed: the proxies whose X-Forwarded-For names the caller "
            "are taken at start; restart to use it"
        )
    old_etcd, new_etcd = old.registry.etcd, new.registry.etcd
    for key in type(old_etcd).model_fields:
        if getattr(old_etcd, key) != getattr(new_etcd, key):
            registry_log.warning(
                "registry.etcd.%s changed: the connection to etcd is set up at start; restart to use it",
                key,
            )
    for key in _EMBEDDER_KEYS:
        if getattr(old.embedding, key) != getattr(new.embedding, key):
            router_log.warning(
                "embedding.%s changed: the embedder is built at start; restart to use it "
                "(thresholds and calibrations apply now)",
                key,
            )


@dataclass(eq=False)
class RouterParts:
    """The Router's components, wired; the app and the admin surface only read them."""

    config: RouterConfig
    clock: Clock
    registry: Registry
    transport: Transport
    stats: StatsBook
    breakers: BreakerBoard
    affinity: AffinityTable
    budget: RetryBudget
    shedder: LoadShedder
    results: ResultStore
    vectors: CapabilityVectors | None
    pipeline: Pipeline
    traces: TraceStore
    metrics: RouterMetrics
    trace_log: TraceLog
    url_guard: UrlGuard
    learner: RouteLearner
    capacity: CapacityBoard
    # Who may do what (docs/security.md): from the policy's tokens unless one was handed in.
    guard: Guard
    dispatcher: Dispatcher = field(init=False)
    # The /reach lane's records, observed at the end of the loop's turn (decision.py says why).
    observe_later: ObserveAfterTurn = field(init=False)
    health: HealthChecker = field(init=False)
    policy_file: PolicyFile = field(init=False)
    # An injected guard stays; one built from the policy follows the policy on reload.
    own_guard: bool = field(default=True)
    # Set once every part has started; /readyz and the admin page read it.
    started: bool = field(default=False, init=False)
    # Which worker of `reach router --workers N` this is (shown by /healthz); None alone.
    worker: int | None = field(default=None, init=False)
    # With etcd: adopts the async requests of Routers that died (dispatch/durable.py).
    adopter: Adopter | None = field(default=None, init=False)
    # Each agent's lease as last seen: a new lease for a known id is a new instance (a restart
    # that took its id over, or a return after going offline), whose breaker and statistics
    # start afresh; the old instance's refusals say nothing about it.
    _leases: dict[str, str] = field(default_factory=dict, init=False, repr=False)

    @classmethod
    def build(
        cls,
        config: RouterConfig,
        *,
        registry: Registry | None = None,
        transport: Transport | None = None,
        clock: Clock = SYSTEM_CLOCK,
        guard: Guard | None = None,
        config_path: str | os.PathLike[str] | None = None,
    ) -> RouterParts:
        """Every part from ``config``; ``registry``, ``transport`` and ``guard`` replace the
        defaults. ``config_path`` is the policy file a reload re-reads (None: none)."""
        registry = build_registry(config.registry, clock=clock) if registry is None else registry
        stats = StatsBook(clock=clock, tau_seconds=config.routing.merit.ewma_tau_seconds)
        breakers = BreakerBoard(config.breaker, clock=clock, overrides=config.tasks)
        affinity = AffinityTable(config.affinity, clock=clock)
        shedder = LoadShedder(config.limits)
        capacity = CapacityBoard(max_queued=config.limits.max_queued_per_agent, clock=clock)
        url_guard = UrlGuard(config.outbound)
        vectors = None
        if config.embedding.backend != "none":
            vectors = CapabilityVectors(build_embedder(config.embedding), registry, config.embedding)
        pipeline = Pipeline(
            registry,
            config.routing,
            breakers=breakers,
            affinity=affinity,
            stats=stats,
            vectors=vectors,
            capacity=capacity,
            clock=clock,
        )
        parts = cls(
            config=config,
            clock=clock,
            registry=registry,
            transport=transport or _http_transport(config, url_guard),
            stats=stats,
            breakers=breakers,
            affinity=affinity,
            budget=RetryBudget(config.retry_budget, clock=clock),
            shedder=shedder,
            results=ResultStore(config.async_mode, clock=clock),
            vectors=vectors,
            pipeline=pipeline,
            traces=_trace_store(config),
            metrics=_metrics(registry, breakers, stats, shedder, vectors, capacity, config.metrics),
            trace_log=TraceLog(redact_fields=config.logging.redact),
            url_guard=url_guard,
            learner=RouteLearner(registry, config.routing.learning, clock=clock),
            capacity=capacity,
            guard=guard or _guard_for(config),
            own_guard=guard is None,
        )
        if vectors is not None:
            vectors.apply(config.embedding, learning=config.routing.learning.enabled)
        parts._store_gauges()
        parts._wire(Path(config_path) if config_path is not None else None)
        return parts

    @property
    def auth_on(self) -> bool:
        """Whether requests need credentials (tokens configured, or a guard handed in)."""
        return not isinstance(self.guard, OpenGuard)

    def _store_gauges(self) -> None:
        """The bytes each bounded store holds, read at scrape time."""
        results, traces = self.results, self.traces
        self.metrics.gauge(
            "reach_async_result_bytes",
            "Bytes of finished async results held for GET /reach/{traceId} (async_mode.max_result_bytes)",
            lambda: results.bytes_held,
        )
        self.metrics.gauge(
            "reach_trace_store_bytes",
            "Bytes of trace hops held for GET /admin/traces (tracing.store_max_bytes)",
            lambda: traces.bytes_held,
        )
        # The bound beside the figure, so an alert reads "near its bound" whatever the policy.
        self.metrics.gauge(
            "reach_async_result_bytes_limit",
            "async_mode.max_result_bytes: the bytes of async results the Router holds at most",
            lambda: self.config.async_mode.max_result_bytes,
        )
        budget = self.budget
        self.metrics.gauge(
            "reach_retry_budget_exhausted",
            "Retries and failovers refused because the Router-wide retry budget was spent",
            lambda: budget.denied,
            counter=True,
        )

    def _wire(self, config_path: Path | None) -> None:
        config, clock = self.config, self.clock
        self.policy_file = PolicyFile(config_path, self.apply, clock=clock)
        journal = None
        if isinstance(self.registry, EtcdRegistry):
            journal = self._journal(self.registry)
        async_requests = AsyncRequests(
            self.transport, self.results, config.async_mode, clock=clock, journal=journal
        )
        forwarding = Forwarding(
            transport=self.transport,
            breakers=self.breakers,
            affinity=self.affinity,
            budget=self.budget,
            stats=self.stats,
            config=config,
            clock=clock,
            agent_secrets=AgentSecrets.from_policy(config.outbound),
            capacity=self.capacity,
        )
        self.dispatcher = Dispatcher(
            self.pipeline,
            forwarding,
            async_requests=async_requests,
            suggester=Suggester(self.registry, self.vectors, clock),
            url_guard=self.url_guard,
            vectors=self.vectors,
            observers=self._observers(),
            clock=clock,
        )
        self.observe_later = ObserveAfterTurn(self.dispatcher.observers, _observer_failed)
        if journal is not None:
            start = functools.partial(durable.start_adopted, self.dispatcher)
            self.adopter = Adopter(journal, async_requests, start)
        dispatcher = self.dispatcher
        self.metrics.gauge(
            "reach_streams_in_flight",
            "Streamed answers (Accept: text/event-stream) being relayed now",
            lambda: dispatcher.streams_in_flight,
        )
        self.health = HealthChecker(self.registry, self.transport, config.health, clock=clock)
        self.health.subscribe(self.metrics.on_probe)
        self.registry.subscribe(self._on_registry_event)
        self.registry.subscribe(self.metrics.on_registry)
        # Shared failure knowledge: a breaker this Router opens is news for the others (through
        # a shared registry), and their news opens this Router's breaker until it probes itself.
        self.breakers.on_open.append(lambda agent_id: self.registry.report_failure(agent_id, "circuit_open"))
        self.registry.subscribe_failures(self._on_peer_failure)

    def _journal(self, registry: EtcdRegistry) -> DeferredStore:
        """Accepted async requests recorded in etcd, results shared, orphans adopted."""
        journal = DeferredStore(
            registry.client,
            registry.policy.etcd.prefix,
            registry.router,
            self.config.async_mode,
            clock=self.clock,
            health=registry.health,
        )
        self.metrics.gauge(
            "reach_async_etcd_pending",
            "Accepted async requests waiting in etcd, as of the last look (async_mode.etcd_max_pending)",
            lambda: journal.pending,
        )
        self.metrics.gauge(
            "reach_async_etcd_results",
            "Async results kept in etcd, as of the last look (async_mode.etcd_max_results)",
            lambda: journal.held,
        )
        self.metrics.gauge(
            "reach_async_etcd_result_bytes",
            "Bytes of async results kept in etcd, at the last look (async_mode.etcd_max_total_result_bytes)",
            lambda: journal.held_bytes,
        )
        knowledge = registry.knowledge
        for i, (name, what) in enumerate(
            (
                ("reach_etcd_learned_routes", "Learned routes in etcd (routing.learning.max_phrases)"),
                (
                    "reach_etcd_learned_route_bytes",
                    "Bytes of learned routes in etcd (registry.etcd.max_learned_bytes)",
                ),
                (
                    "reach_etcd_learned_negatives",
                    "Learned negatives in etcd (routing.learning.max_negatives)",
                ),
                (
                    "reach_etcd_learned_negative_bytes",
                    "Bytes of learned negatives in etcd (registry.etcd.max_learned_bytes)",
                ),
            )
        ):
            self.metrics.gauge(name, what, functools.partial(_nth, knowledge.held, i))
        return journal

    def _observers(self) -> list[Observer]:
        # Switched off, the store and metrics still exist (the endpoints answer, empty) but are
        # not fed: that is what the overhead benchmark compares against.
        config = self.config
        observers: list[Observer] = [self.trace_log, self.learner]
        if config.metrics.enabled:
            observers.append(self.metrics)
        if config.tracing.enabled:
            observers.append(self.traces)
        if config.tracing.otel:
            from reachmesh.observability.otel import OtelExporter  # the optional `otel` extra

            observers.append(OtelExporter())
        return observers

    def apply(self, config: RouterConfig) -> None:
        """Switch every part to a new policy. Requests in flight keep the one they started with."""
        AgentSecrets.from_policy(config.outbound)  # an unset secret variable: refused before any change
        guard = _guard_for(config) if self.own_guard else self.guard
        _warn_restart_only_changes(self.config, config)
        was_open = open_to_every_page(self.config.server, self.auth_on)
        self.config = config
        self.guard = guard
        if not was_open and open_to_every_page(config.server, self.auth_on):
            # As `reach router` says at start; once per change into it, not on every reload.
            router_log.warning("%s", OPEN_TO_EVERY_PAGE)
        self.url_guard.apply(config.outbound)
        self.budget.apply(config.retry_budget)
        self.dispatcher.apply(config, self.budget)
        self.pipeline.apply(config.routing)
        self.capacity.apply(config.limits)
        self.metrics.apply(config.metrics)
        self.stats.apply(config.routing.merit.ewma_tau_seconds)
        self.learner.apply(config.routing.learning)
        if self.vectors is not None:
            self.vectors.apply(config.embedding, learning=config.routing.learning.enabled)
        self.registry.apply(config.registry)
        self.breakers.apply(config.breaker, config.tasks)
        tracing = config.tracing
        self.traces.resize(tracing.store_size, tracing.store_max_bytes, tracing.max_hop_bytes)
        self.affinity.apply(config.affinity)
        self.shedder.apply(config.limits)
        self.results.apply(config.async_mode)
        self.dispatcher.async_requests.apply(config.async_mode)
        self.health.apply(config.health)
        self.trace_log.apply(config.logging.redact)
        # The package's own loggers only; the process's logging set-up is the entry point's.
        logging.getLogger("reachmesh").setLevel(config.logging.level)
        for name, level in config.logging.levels.items():
            logging.getLogger(name).setLevel(level)

    async def start(self) -> None:
        """Open the client pool and start background work (leases, health, lag, embeddings)."""
        await self.transport.open()
        try:
            await self.registry.start()
        except Exception:
            await self.transport.close()  # the start is over: leave no pool open behind it
            raise
        await self.health.start()
        await self.shedder.start()
        if self.adopter is not None:
            await self.adopter.start()
        if self.vectors is not None:
            await self.vectors.start()
        self.started = True

    def stopping(self) -> None:
        """Shutdown began: /readyz says so from now on, while requests drain."""
        self.started = False

    async def close(self) -> None:
        """Stop background work and close connections, the reverse of :meth:`start`."""
        await self.dispatcher.close()
        if self.adopter is not None:
            await self.adopter.close()
        await self.learner.close()
        await self.health.close()
        await self.shedder.close()
        if self.vectors is not None:
            await self.vectors.close()
        await self.registry.close()
        await self.transport.close()

    def _on_peer_failure(self, agent_id: str, reason: str, router: str) -> None:
        entry = self.registry.get(agent_id)
        if entry is not None and self.breakers.trip(agent_id, entry.capabilities):
            registry_log.info(
                "[registry] router %s reports %s failing (%s): circuit opened here until a probe",
                loggable(router),
                agent_id,
                loggable(reason),
            )

    def _forget(self, agent_id: str) -> None:
        self.stats.forget(agent_id)
        self.pipeline.forget(agent_id)
        self.breakers.forget(agent_id)
        self.affinity.forget_agent(agent_id)

    def _on_registry_event(self, event: RegistryEvent, entry: AgentEntry) -> None:
        if event in (RegistryEvent.REGISTERED, RegistryEvent.REPLACED) and self.vectors is not None:
            # Capability vectors follow off the request path (semantic/queue.py): the agent is
            # routable by exact task now and by meaning once they are in. This runs for agents
            # registered through other Routers too (a shared registry's watch).
            self.vectors.schedule(entry)
        if event in (RegistryEvent.DEREGISTERED, RegistryEvent.REMOVED):
            self._leases.pop(entry.id, None)
            self._forget(entry.id)
        elif event in (RegistryEvent.REGISTERED, RegistryEvent.REPLACED):
            seen = self._leases.get(entry.id)
            self._leases[entry.id] = entry.lease_digest
            if seen is not None and seen != entry.lease_digest:
                self.stats.forget(entry.id)
                self.breakers.forget(entry.id)
        if self.registry.replaying:
            # Read back from a shared store at start (one summary line says how many): these
            # agents registered before, through this Router or another.
            registry_log.debug("[registry] read back %s (%s)", entry.id, entry.status.value)
        elif event in (RegistryEvent.REGISTERED, RegistryEvent.REPLACED):
            registry_log.info(
                "[registry] %s %s: %s (lease %s, ttl=%gs)",
                event.value,
                entry.id,
                ", ".join(entry.capabilities),
                entry.lease_tag,  # the lease's fingerprint: the lease itself is a credential
                entry.ttl_seconds,
            )
        else:
            registry_log.info("[registry] %s %s", event.value, entry.id)

    def agent_status(self, entry: AgentEntry) -> dict[str, Any]:
        """The ``AgentStatus`` object of the registry API for one entry."""
        status: dict[str, Any] = {
            "id": entry.id,
            "display_name": entry.profile.display_name,
            "status": entry.status.value,
            "capabilities": list(entry.capabilities),
            "endpoint": entry.endpoint,
            "lastHeartbeat": entry.last_heartbeat_iso,
            "circuit": self.breakers.state(entry.id).value,
            "stats": self.stats.snapshot(entry.id),
            # PROTOCOL §15: requests in flight from this Router, its declared capacity, and the
            # requests waiting here for a slot at it.
            "inflight": self.pipeline.capacity.inflight(entry.id),
            "capacity": entry.profile.max_concurrency,
            "queued": self.pipeline.capacity.queued(entry.id),
        }
        if entry.protocol != "http" or entry.managed:
            # Additions for bridged agents: shown only where they differ from a leased Reach agent.
            status["protocol"] = entry.protocol
            status["managed"] = entry.managed
        if self.vectors is not None:
            # An addition to the protocol: whether the agent is routable by meaning yet.
            state = self.vectors.state(entry.id)
            status["vectors"] = None if state is None else state.value
            near = self.vectors.duplicates.get(entry.id)
            if near:
                # Capabilities worded like another token's (docs/security.md): shown, maybe refused.
                status["nearDuplicates"] = [d.to_json() for d in near]
            # Also an addition: whether the few-shot head has caught up with the registry.
            status["head"] = self.vectors.head_state()
        return status


def _observer_failed(observer: Observer) -> None:
    # The dispatcher's logger, as for a record observed at its answer.
    logging.getLogger("reachmesh.dispatcher").exception("observer %r failed", observer)


def _http_transport(config: RouterConfig, url_guard: UrlGuard) -> HttpTransport:
    return HttpTransport(
        response_limit=config.server.response_limit_bytes,
        head=head_limits(config.server),
        guard=url_guard,
        tls=config.outbound,
    )


def _trace_store(config: RouterConfig) -> TraceStore:
    tracing = config.tracing
    return TraceStore(
        tracing.store_size, max_bytes=tracing.store_max_bytes, max_hop_bytes=tracing.max_hop_bytes
    )


def _guard_for(config: RouterConfig) -> Guard:
    """Tokens from the policy and REACH_*_TOKEN; with none, every request is admitted."""
    return TokenGuard.from_policy(config.auth, os.environ) or OpenGuard()


def _nth(read: Callable[[], tuple[int, ...]], i: int) -> int:
    return read()[i]


def _metrics(
    registry: Registry,
    breakers: BreakerBoard,
    stats: StatsBook,
    shedder: LoadShedder,
    vectors: CapabilityVectors | None,
    capacity: CapacityBoard,
    policy: MetricsPolicy,
) -> RouterMetrics:
    """The metrics, reading the breakers and the stats book through plain readings."""
    metrics = RouterMetrics(
        registry,
        LiveReadings(
            circuit=lambda agent_id: _CIRCUIT_VALUE[breakers.state(agent_id)],
            agent_inflight=lambda agent_id: int(stats.snapshot(agent_id)["inflight"]),
            agent_queued=capacity.queued,
            inflight=lambda: shedder.inflight,
            embedding_up=lambda: None if vectors is None else vectors.up,
        ),
    )
    metrics.apply(policy)
    return metrics
