"""The Router application: one ASGI callable, a lean hot path and a Starlette admin surface.

``POST /reach`` runs on every call, so it is served straight from raw ASGI: one header pass, one
body read, the dispatcher, one send. Everything else (registry, admin, health, OpenAPI) is a
small Starlette app, where convenience costs nothing that matters. Both pass the same
:mod:`guard` first.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from agent_reach.clock import SYSTEM_CLOCK, Clock
from agent_reach.config import RouterConfig
from agent_reach.dispatcher import Dispatcher
from agent_reach.exceptions import RequestError
from agent_reach.observability.logging import TraceLog
from agent_reach.observability.tracecontext import parse_traceparent
from agent_reach.protocol import HTTP_STATUS, PROTOCOL_VERSION
from agent_reach.registry.base import AgentEntry, Registry, RegistryEvent
from agent_reach.registry.memory import MemoryRegistry
from agent_reach.routing.pipeline import Pipeline
from agent_reach.server.guard import Guard, OpenGuard, action_for
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
    ) -> None:
        from agent_reach.server.admin import build_admin

        self.config = config or RouterConfig()
        self.clock = clock
        self.registry = registry or MemoryRegistry(self.config.registry, clock=clock)
        self.transport = Transport()
        self.stats = StatsBook()
        self.pipeline = Pipeline(self.registry, self.config.routing)
        self.dispatcher = Dispatcher(
            self.pipeline,
            self.transport,
            self.config,
            stats=self.stats,
            observers=[TraceLog()],
            clock=clock,
        )
        self.guard: Guard = guard or OpenGuard()
        self.registry.subscribe(self._on_registry_event)
        self.admin = build_admin(self)
        self.started = False

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
        parent_id = parse_traceparent(headers.get(b"traceparent", b"").decode("latin-1"))
        try:
            check_json_content_type(headers)
            body = await read_body(receive, headers, self.config.server.body_limit_bytes)
        except RequestError as exc:
            status, payload = self.dispatcher.refuse(exc, trace_id=parent_id)
            await send_json(send, status, payload)
            return
        except ClientGone:
            return
        try:
            status, payload = await self.dispatcher.handle(
                body, trace_header=trace_hint, traceparent_id=parent_id
            )
        except Exception:
            # A bug, not bad input: still one ReachResponse, and the traceback stays here.
            log.exception("internal error while serving /reach")
            payload = orjson.dumps(
                {
                    "version": PROTOCOL_VERSION,
                    "traceId": trace_hint or parent_id or "-",
                    "status": "INTERNAL_ERROR",
                    "handlerAgentId": None,
                    "durationMs": 0,
                    "result": None,
                    "attempts": [],
                    "error": {"code": "INTERNAL_ERROR", "message": "the Router failed; see its log"},
                }
            )
            status = 500
        await send_json(send, status, payload)

    async def _deny(self, send: Send, denial: Any) -> None:
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

    # -- lifecycle ---------------------------------------------------------------------------

    async def startup(self) -> None:
        """Open the client pool and start the registry's background work."""
        await self.transport.open()
        await self.registry.start()
        self.started = True

    async def shutdown(self) -> None:
        """Stop background work and close connections."""
        self.started = False
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
            "circuit": "closed",
            "stats": self.stats.snapshot(entry.id),
        }


def create_app(config: RouterConfig | None = None, **kwargs: Any) -> RouterApp:
    """Build the Router application (``uvicorn --factory agent_reach.server:create_app``)."""
    return RouterApp(config or RouterConfig.load(), **kwargs)
