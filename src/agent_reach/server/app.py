"""The Router application: one ASGI callable, a lean hot path and a Starlette admin surface.

``POST /reach`` runs on every call, so it is served straight from raw ASGI: one header pass, one
body read, the dispatcher, one send. Everything else (registry, admin, health, metrics, traces,
OpenAPI) is a small Starlette app, where convenience costs nothing that matters. Both pass the
same :mod:`guard` first, and ``/reach`` passes the load shedder.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any

import orjson

from agent_reach.clock import SYSTEM_CLOCK, Clock
from agent_reach.config import RouterConfig
from agent_reach.dispatcher import Dispatcher, internal_error_body
from agent_reach.embedding import build_embedder
from agent_reach.exceptions import ConfigError, RequestError
from agent_reach.observability.logging import TraceLog
from agent_reach.observability.metrics import RouterMetrics
from agent_reach.observability.record import Observer
from agent_reach.observability.tracecontext import parse_traceparent
from agent_reach.observability.traces import TraceStore
from agent_reach.protocol import HTTP_STATUS, PROTOCOL_VERSION
from agent_reach.registry.base import AgentEntry, Registry, RegistryEvent
from agent_reach.registry.memory import MemoryRegistry
from agent_reach.resilience.affinity import AffinityTable
from agent_reach.resilience.breaker import BreakerBoard
from agent_reach.resilience.health import HealthChecker
from agent_reach.resilience.retry import RetryBudget
from agent_reach.resilience.shedding import LoadShedder
from agent_reach.results import ResultStore
from agent_reach.routing.pipeline import Pipeline
from agent_reach.server.guard import Denial, Guard, OpenGuard, action_for
from agent_reach.server.http import (
    ClientGone,
    Receive,
    Scope,
    Send,
    check_json_content_type,
    header_map,
    read_body,
    send_json,
)
from agent_reach.stats import StatsBook
from agent_reach.transport import Transport
from agent_reach.vectors import CapabilityVectors

log = logging.getLogger("agent_reach.router")
registry_log = logging.getLogger("agent_reach.registry")


class RouterApp:
    """The Router as an ASGI application. Build it with :func:`create_app`."""

    def __init__(
        self,
        config: RouterConfig | None = None,
        *,
        registry: Registry | None = None,
        clock: Clock = SYSTEM_CLOCK,
        guard: Guard | None = None,
        config_path: str | os.PathLike[str] | None = None,
    ) -> None:
        from agent_reach.server.admin import build_admin

        self.config = config = config or RouterConfig()
        self.config_path = Path(config_path) if config_path is not None else None
        self.clock = clock
        self.registry = MemoryRegistry(config.registry, clock=clock) if registry is None else registry
        self.transport = Transport(response_limit=config.server.response_limit_bytes)
        self.stats = StatsBook(clock=clock, tau_seconds=config.routing.merit.ewma_tau_seconds)
        self.breakers = BreakerBoard(config.breaker, clock=clock, overrides=config.tasks)
        self.affinity = AffinityTable(config.affinity, clock=clock)
        self.budget = RetryBudget(config.retry_budget, clock=clock)
        self.shedder = LoadShedder(config.limits)
        self.results = ResultStore(config.async_mode, clock=clock)
        self.vectors: CapabilityVectors | None = None
        if config.embedding.backend != "none":
            self.vectors = CapabilityVectors(
                build_embedder(config.embedding), self.registry, config.embedding
            )
        self.pipeline = Pipeline(
            self.registry,
            config.routing,
            breakers=self.breakers,
            affinity=self.affinity,
            stats=self.stats,
            vectors=self.vectors,
        )
        # Switched off, the store and metrics still exist (the endpoints answer, empty) but are
        # not fed: that is what the overhead benchmark compares against.
        self.traces = TraceStore(config.tracing.store_size)
        self.metrics = RouterMetrics(
            self.registry,
            self.breakers,
            self.stats,
            lambda: self.shedder.inflight,
            lambda: None if self.vectors is None else self.vectors.up,
        )
        self.trace_log = TraceLog(redact_fields=config.logging.redact)
        observers: list[Observer] = [self.trace_log]
        if config.metrics.enabled:
            observers.append(self.metrics)
        if config.tracing.enabled:
            observers.append(self.traces)
        if config.tracing.otel:
            from agent_reach.observability.otel import OtelExporter

            observers.append(OtelExporter())
        self.dispatcher = Dispatcher(
            self.pipeline,
            self.transport,
            config,
            stats=self.stats,
            budget=self.budget,
            results=self.results,
            observers=observers,
            clock=clock,
        )
        self.health = HealthChecker(self.registry, self.transport, config.health, clock=clock)
        self.health.subscribe(self.metrics.on_probe)
        self.guard: Guard = guard or OpenGuard()
        self.registry.subscribe(self._on_registry_event)
        self.registry.subscribe(self.metrics.on_registry)
        self.admin = build_admin(self)
        self.started = False
        self._watcher: asyncio.Task[None] | None = None
        self._config_mtime: float | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            path = scope["path"]
            denial = self.guard.check(action_for(scope["method"], path), scope)
            if denial is not None:
                await self._deny(send, denial)
            elif path == "/reach" and scope["method"] == "POST":
                await self._reach(scope, receive, send)
            else:
                await self.admin(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        # websockets are not part of the protocol: returning without accepting closes them.

    # -- the hot path ------------------------------------------------------------------------

    async def _reach(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = header_map(scope)
        trace_header = headers.get(b"x-reach-trace-id")
        trace_hint = trace_header.decode("latin-1") if trace_header else None
        raw_parent = headers.get(b"traceparent")
        parent = parse_traceparent(raw_parent.decode("latin-1")) if raw_parent else None
        shed = self.shedder.admit()
        if shed is not None:
            status, payload = self.dispatcher.shed(shed, trace_id=parent[0] if parent else None)
            retry_after = str(self.config.limits.retry_after_seconds).encode()
            await send_json(send, status, payload, [(b"retry-after", retry_after)])
            return
        try:
            try:
                check_json_content_type(headers)
                body = await read_body(receive, headers, self.config.server.body_limit_bytes)
            except RequestError as exc:
                status, payload = self.dispatcher.refuse(exc, trace_id=parent[0] if parent else None)
                await send_json(send, status, payload)
                return
            except ClientGone:
                return
            try:
                status, payload = await self.dispatcher.handle(body, trace_header=trace_hint, parent=parent)
            except Exception:
                # A bug, not bad input: still one ReachResponse, and the traceback stays here.
                log.exception("internal error while serving /reach")
                status, payload = 500, internal_error_body(trace_hint or (parent[0] if parent else "-"))
            await send_json(send, status, payload)
        finally:
            self.shedder.release()

    async def _deny(self, send: Send, denial: Denial) -> None:
        body = orjson.dumps(
            {
                "version": PROTOCOL_VERSION,
                "traceId": None,
                "status": denial.status.value,
                "handlerAgentId": None,
                "durationMs": 0,
                "result": None,
                "attempts": [],
                "error": {"code": denial.status.value, "message": denial.message},
            }
        )
        extra = [(b"retry-after", str(denial.retry_after_s).encode())] if denial.retry_after_s else None
        await send_json(send, denial.http_status or HTTP_STATUS[denial.status], body, extra)

    # -- policy reload -----------------------------------------------------------------------

    def apply(self, config: RouterConfig) -> None:
        """Switch every component to a new policy. Requests in flight keep the one they started with."""
        self.config = config
        self.dispatcher.config = config
        self.pipeline.apply(config.routing)
        self.stats.tau = config.routing.merit.ewma_tau_seconds
        if self.vectors is not None:
            self.vectors.policy = config.embedding
        if isinstance(self.registry, MemoryRegistry):
            self.registry.policy = config.registry
        self.breakers.policy = config.breaker
        self.breakers.overrides = config.tasks
        self.affinity.policy = config.affinity
        if self.budget.policy.window_seconds == config.retry_budget.window_seconds:
            self.budget.policy = config.retry_budget
        else:
            self.budget = self.dispatcher.budget = RetryBudget(config.retry_budget, clock=self.clock)
        self.shedder.policy = config.limits
        self.results.policy = config.async_mode
        self.health.policy = config.health
        self.trace_log.redact_fields = list(config.logging.redact)
        logging.getLogger("agent_reach").setLevel(config.logging.level)
        for name, level in config.logging.levels.items():
            logging.getLogger(name).setLevel(level)

    def reload(self) -> bool:
        """Re-read the policy file; a bad file is logged and the old policy kept."""
        if self.config_path is None:
            log.warning("reload requested, but the Router was started without a policy file")
            return False
        try:
            config = RouterConfig.load(self.config_path)
        except ConfigError as exc:
            log.error("policy reload rejected, keeping the old policy: %s", exc.message)
            return False
        self.apply(config)
        log.info("policy reloaded from %s", self.config_path)
        return True

    async def _watch_config(self) -> None:
        assert self.config_path is not None
        while True:
            await asyncio.sleep(1.0)
            try:
                mtime = self.config_path.stat().st_mtime
            except OSError:
                continue
            if self._config_mtime is not None and mtime != self._config_mtime:
                self.reload()
            self._config_mtime = mtime

    # -- lifecycle ---------------------------------------------------------------------------

    async def startup(self) -> None:
        """Open the client pool and start background work (leases, health, lag, policy watch)."""
        await self.transport.open()
        await self.registry.start()
        await self.health.start()
        await self.shedder.start()
        if self.vectors is not None:
            await self.vectors.start()
        if self.config_path is not None:
            with contextlib.suppress(OSError):
                self._config_mtime = self.config_path.stat().st_mtime
            self._watcher = asyncio.create_task(self._watch_config(), name="reach-config-watch")
            if threading.current_thread() is threading.main_thread():
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.reload)
        # Everything built so far lives as long as the process: keep it out of every GC pass.
        gc.freeze()
        self.started = True

    async def shutdown(self) -> None:
        """Stop background work and close connections."""
        self.started = False
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        await self.dispatcher.close()
        await self.health.close()
        await self.shedder.close()
        if self.vectors is not None:
            await self.vectors.close()
        await self.registry.close()
        await self.transport.close()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:
                    log.exception("router start-up failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _on_registry_event(self, event: RegistryEvent, entry: AgentEntry) -> None:
        if event in (RegistryEvent.DEREGISTERED, RegistryEvent.REMOVED):
            self.stats.forget(entry.id)
            self.pipeline.forget(entry.id)
            self.breakers.forget(entry.id)
            self.affinity.forget_agent(entry.id)
        if event in (RegistryEvent.REGISTERED, RegistryEvent.REPLACED):
            registry_log.info(
                "[registry] %s %s: %s (lease %s, ttl=%gs)",
                event.value,
                entry.id,
                ", ".join(entry.capabilities),
                entry.lease_id,
                entry.ttl_seconds,
            )
        else:
            registry_log.info("[registry] %s %s", event.value, entry.id)

    # -- views -------------------------------------------------------------------------------

    def agent_status(self, entry: AgentEntry) -> dict[str, Any]:
        """The ``AgentStatus`` object of PROTOCOL.md §2 for one entry."""
        return {
            "id": entry.id,
            "display_name": entry.profile.display_name,
            "status": entry.status.value,
            "capabilities": list(entry.capabilities),
            "endpoint": entry.endpoint,
            "lastHeartbeat": entry.last_heartbeat_iso,
            "circuit": self.breakers.state(entry.id).value,
            "stats": self.stats.snapshot(entry.id),
        }


def create_app(config: RouterConfig | None = None, **kwargs: Any) -> RouterApp:
    """Build the Router application (``uvicorn --factory agent_reach.server:create_app``)."""
    if config is None:
        path = kwargs.pop("config_path", None) or os.environ.get("REACH_CONFIG") or None
        return RouterApp(RouterConfig.load(path), config_path=path, **kwargs)
    return RouterApp(config, **kwargs)
