"""The registry API and the admin surface, as a Starlette app behind one small class.

:class:`AdminApi` reads the Router's parts (:class:`~reachmesh.server.components.RouterParts`),
its policy file and whether it has started; it never reaches back into the ASGI app.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import ipaddress
import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import orjson
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from reachmesh.clock import Clock
from reachmesh.dispatch import encoder
from reachmesh.dispatch.asyncmode import POLL_AFTER_MIN_S
from reachmesh.exceptions import (
    Forbidden,
    InvalidProfile,
    OutboundRefused,
    RegistrationThrottled,
    RegistryError,
    RegistryFull,
    RegistryUnavailable,
    RequestError,
)
from reachmesh.observability.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from reachmesh.protocol import AgentProfile, AgentStatusValue, Status, error_details
from reachmesh.registry.etcd.deferred import DeferredStore
from reachmesh.registry.etcdclient import EtcdRejected
from reachmesh.server.asgi import Receive, Scope, Send, check_json_content_type, read_body
from reachmesh.server.auth import Principal, principal_of
from reachmesh.server.catalog import catalog
from reachmesh.server.components import RouterParts
from reachmesh.server.learned import LearnedRoutes
from reachmesh.server.openapi import openapi_document
from reachmesh.server.registration import RegistrationThrottle, check_profile_size
from reachmesh.server.responses import JsonResponse, json_error
from reachmesh.transport.urlguard import Address, literal_address


def whole_number(raw: str, field: str, low: int, high: int) -> int:
    """A query parameter of ASCII digits within ``[low, high]``, else a 400 that names it.

    ``str.isdigit`` alone accepts superscripts and other scripts' digits that ``int`` refuses.
    """
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 9) or not low <= int(raw) <= high:
        raise RequestError(
            f"{field} must be a whole number from {low} to {high}",
            details=[{"field": field, "message": f"{low}..{high}"}],
        )
    return int(raw)


def trace_status(raw: str | None) -> str | None:
    """The ``status`` filter of ``GET /admin/traces``: a ReachResponse status, in any case; else a
    400 naming the field, the statuses there are, and the nearest one (a filter that matches
    nothing would otherwise answer ``[]`` and look like "no such requests")."""
    if raw is None:
        return None
    statuses = [s.value for s in Status]
    wanted = raw.strip().upper()
    if wanted in statuses:
        return wanted
    near = difflib.get_close_matches(wanted, statuses, n=1, cutoff=0.6)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    raise RequestError(
        f"status must be one of {', '.join(statuses)}, got {raw[:40]!r}{hint}",
        details=[{"field": "status", "message": "one of " + ", ".join(statuses)}],
    )


# The registrant's token is opaque; the bound keeps a stranger from storing megabytes in entries.
MAX_INSTANCE_ID_CHARS = 256


def _instance_id(data: dict[str, Any]) -> str | None:
    """The body's ``instanceId``: a string of 1 to 256 characters, or None when absent.

    The error never repeats the value: an instanceId is a credential.
    """
    value = data.get("instanceId")
    if value is None:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= MAX_INSTANCE_ID_CHARS:
        message = f"a string of 1 to {MAX_INSTANCE_ID_CHARS} characters"
        raise InvalidProfile(
            f"instanceId must be {message}", details=[{"field": "instanceId", "message": message}]
        )
    return value


def _managed(request: Request, data: dict[str, Any]) -> bool:
    """The body's ``managed`` flag: a lease-less registration, which only an admin may make.

    An agent token renews its own lease; a managed entry (an imported A2A agent, say) has none,
    so whoever registers it takes responsibility for removing it: that is an operator.
    """
    value = data.get("managed", False)
    if not isinstance(value, bool):
        raise InvalidProfile(
            "managed must be true or false", details=[{"field": "managed", "message": "expected a boolean"}]
        )
    principal = principal_of(request.scope)
    if value and principal.role != "admin":
        raise Forbidden(f"the token {principal.label} may not make a managed (lease-less) registration")
    return value


class AdminApi:
    """Every endpoint but the ``POST /reach`` hot path."""

    def __init__(self, parts: RouterParts) -> None:
        self.parts = parts
        self.policy = parts.policy_file
        self._openapi: dict[str, Any] | None = None
        # Registrations between their quota check and their write, per agent token.
        self._reserved: dict[str, list[str]] = {}
        self._throttle = RegistrationThrottle(parts.clock)
        self.learned = LearnedRoutes(parts, self._read_json)
        self.app = Starlette(
            routes=self._routes(),
            exception_handlers={
                RegistryError: self._on_reach_error,
                RequestError: self._on_reach_error,
                HTTPException: self._on_http_error,
            },
        )
        # No trailing-slash redirects: they echo the client's Host header into a Location.
        self.app.router.redirect_slashes = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)

    def _routes(self) -> list[Route]:
        return [
            Route("/agents", self.register, methods=["POST"]),
            Route("/agents/{agent_id}/lease", self.renew, methods=["PUT"]),
            Route("/agents/{agent_id}", self.deregister, methods=["DELETE"]),
            Route("/admin/agents", self.list_agents, methods=["GET"]),
            Route("/admin/agents/{agent_id}", self.get_agent, methods=["GET"]),
            Route("/admin/capabilities", self.list_capabilities, methods=["GET"]),
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/readyz", self.readyz, methods=["GET"]),
            Route("/openapi.json", self.openapi, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            # POST /reach never gets here (RouterApp serves it); listed so that another method
            # is 405 with `Allow: POST`, as on every other endpoint, not a 404 saying no /reach.
            Route("/reach", _served_by_the_app, methods=["POST"]),
            Route("/reach/{trace_id}", self.async_result, methods=["GET"]),
            Route("/admin/traces", self.list_traces, methods=["GET"]),
            Route("/admin/traces/{trace_id}", self.get_trace, methods=["GET"]),
            Route("/admin/reload", self.reload, methods=["POST"]),
            *self.learned.routes(),
        ]

    async def _read_json(self, request: Request) -> Any:
        headers = {k.lower().encode("latin-1"): v.encode("latin-1") for k, v in request.headers.items()}
        untyped = b"content-type" not in headers
        if not untyped:
            check_json_content_type(headers)
        server = self.parts.config.server
        body = await read_body(request.receive, headers, server.body_limit_bytes, server.body_timeout_seconds)
        if not body:
            return None  # a DELETE with the lease in a header has nothing to type
        if untyped:
            check_json_content_type(headers)  # refuses: a body needs its JSON type
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise RequestError(f"body is not valid JSON: {exc.msg}") from exc

    # -- the registry API --------------------------------------------------------------------

    async def register(self, request: Request) -> Response:
        data = await self._read_json(request)
        if not isinstance(data, dict):
            raise InvalidProfile(
                "the body must be a JSON object: the mapping under `agent:`",
                details=[{"field": "(body)", "message": "expected an object"}],
            )
        lease_id = data.get("leaseId")
        if lease_id is not None and not isinstance(lease_id, str):
            raise InvalidProfile(
                "leaseId must be a string", details=[{"field": "leaseId", "message": "expected a string"}]
            )
        # The registrant's own token: a retry with the same one (and endpoint) gets its lease back.
        instance_id = _instance_id(data)
        managed = _managed(request, data)
        try:
            profile = AgentProfile.model_validate(data)
        except ValidationError as exc:
            details = error_details(exc)
            raise InvalidProfile(
                "invalid agent profile: " + ", ".join(d["field"] for d in details), details=details
            ) from exc
        principal = principal_of(request.scope)
        _may_register(request, profile.id, profile.tasks)
        policy = self.parts.config.registry
        check_profile_size(profile, policy.max_profile_bytes)
        if principal.role == "agent":
            self._throttle.take(principal.key, principal.label, policy)
        # Held from the check to the write: concurrent registrations of one token count each other.
        self._check_weights(principal, profile)
        self._check_task_caps(principal, profile)
        with self._reserve(principal, profile.id):
            await self._check_endpoint(profile.network.endpoint)
            entry, created = await self.parts.registry.register(
                profile,
                lease_id=lease_id,
                instance_id=instance_id,
                holder=principal.key if principal.role == "agent" else None,
                managed=managed,
            )
        registration = {
            "agentId": entry.id,
            "leaseId": entry.lease_id,
            "ttlSeconds": _seconds(entry.ttl_seconds),
            "status": entry.status.value,
        }
        return JsonResponse(registration, status_code=201 if created else 200)

    @contextlib.contextmanager
    def _reserve(self, principal: Principal, agent_id: str) -> Iterator[None]:
        """Check the token's quota and hold a place for ``agent_id`` until the write is done."""
        self._check_quota(principal, agent_id)
        if principal.role != "agent":
            yield
            return
        held = self._reserved.setdefault(principal.key, [])
        held.append(agent_id)
        try:
            yield
        finally:
            held.remove(agent_id)
            if not held:
                del self._reserved[principal.key]

    def _check_quota(self, principal: Principal, agent_id: str) -> None:
        """An agent token holds at most registry.max_agents_per_token registry entries."""
        if principal.role != "agent":
            return
        # Counted from the registry itself, so a shared one counts what every Router registered.
        # Offline entries count too: they hold a place in the registry for the grace period, and
        # a token that let its leases lapse and registered new ids filled the registry (another
        # token's agent got REGISTRY_FULL). At the quota they are dropped at once, oldest first,
        # so a token whose agents crashed is never locked out by its own dead entries.
        registry = self.parts.registry
        mine = offline = 0
        for e in registry.agents():
            if e.holder == principal.key and e.id != agent_id:
                mine += 1
                offline += e.status is AgentStatusValue.OFFLINE
        mine += sum(1 for held in self._reserved.get(principal.key, ()) if held != agent_id)
        cap = self.parts.config.registry.max_agents_per_token
        while mine >= cap and offline > 0:
            if registry.evict_offline(principal.key, keep=agent_id) is None:
                break
            mine -= 1
            offline -= 1
        if mine >= cap:
            raise RegistryFull(
                f"the agent token {principal.label} already holds {mine} live agents "
                "(registry.max_agents_per_token)"
            )

    def _check_weights(self, principal: Principal, profile: AgentProfile) -> None:
        """Refuse (422) a routing_weight over the policy's cap, rather than clamp it, so the
        profile the registry shows is the weight routing uses."""
        cap = principal.max_weight or self.parts.config.routing.max_weight
        key = "auth.tokens[].max_weight" if principal.max_weight else "routing.max_weight"
        details = [
            {
                "field": f"capabilities.{i}.routing_weight",
                "message": f"{cap:g} at most ({key}); declared {cap_.routing_weight:g}",
            }
            for i, cap_ in enumerate(profile.capabilities)
            if cap_.routing_weight > cap
        ]
        if details:
            raise InvalidProfile(
                f"routing_weight over the cap of {cap:g} ({key}): " + ", ".join(d["field"] for d in details),
                details=details,
            )

    def _check_task_caps(self, principal: Principal, profile: AgentProfile) -> None:
        """At most registry.max_agents_per_task live agents declare a task (each request for it
        ranks them all), and at most max_agents_per_task_per_token of them under one token."""
        policy = self.parts.config.registry
        for task in profile.tasks:
            live = [
                e
                for e in self.parts.registry.by_task(task)
                if e.id != profile.id and e.status is not AgentStatusValue.OFFLINE
            ]
            if len(live) >= policy.max_agents_per_task:
                raise RegistryFull(
                    f"{len(live)} agents already declare task {task!r} (registry.max_agents_per_task)"
                )
            if principal.role != "agent":
                continue
            mine = sum(1 for e in live if e.holder == principal.key)
            if mine >= policy.max_agents_per_task_per_token:
                raise RegistryFull(
                    f"the agent token {principal.label} already holds {mine} agents declaring task "
                    f"{task!r} (registry.max_agents_per_task_per_token)"
                )

    async def _check_endpoint(self, url: str) -> None:
        """Refuse (422) an endpoint the Router must not call, and a name that resolves to one.

        A name that does not resolve yet is accepted: every connection is checked again against
        the address it resolves to then.
        """
        guard = self.parts.url_guard
        try:
            guard.check_url(url)
            host = urlsplit(url).hostname or ""
            if literal_address(host) is None:
                for address in await _resolve(host):
                    guard.check_address(address)
        except OutboundRefused as exc:
            raise InvalidProfile(
                f"network.endpoint is refused: {exc.message}",
                details=[{"field": "network.endpoint", "message": exc.message}],
            ) from exc

    async def renew(self, request: Request) -> Response:
        data = await self._read_json(request)
        lease_id = data.get("leaseId") if isinstance(data, dict) else None
        if not isinstance(lease_id, str):
            raise RequestError(
                'the body must be {"leaseId": "..."}',
                details=[{"field": "leaseId", "message": "required string"}],
            )
        _may_register(request, request.path_params["agent_id"])
        entry = await self.parts.registry.renew(request.path_params["agent_id"], lease_id)
        return JsonResponse(
            {"agentId": entry.id, "leaseId": lease_id, "ttlSeconds": _seconds(entry.ttl_seconds)}
        )

    async def deregister(self, request: Request) -> Response:
        lease_id = request.headers.get("x-reach-lease")
        if lease_id is None:
            data = await self._read_json(request)
            lease_id = data.get("leaseId") if isinstance(data, dict) else None
        if not isinstance(lease_id, str):
            raise RequestError(
                'give the lease as {"leaseId": "..."} or the X-Reach-Lease header',
                details=[{"field": "leaseId", "message": "required string"}],
            )
        _may_register(request, request.path_params["agent_id"])
        await self.parts.registry.deregister(request.path_params["agent_id"], lease_id)
        return Response(status_code=204)

    # -- views -------------------------------------------------------------------------------

    async def list_agents(self, request: Request) -> Response:
        entries = sorted(self.parts.registry.agents(), key=lambda e: e.id)
        return JsonResponse([self.parts.agent_status(e) for e in entries])

    async def get_agent(self, request: Request) -> Response:
        entry = self.parts.registry.get(request.path_params["agent_id"])
        if entry is None:
            return json_error(404, "AGENT_NOT_FOUND", f"no agent {request.path_params['agent_id']!r}")
        return JsonResponse(self.parts.agent_status(entry))

    async def list_capabilities(self, request: Request) -> Response:
        return JsonResponse(catalog(self.parts.registry))

    async def healthz(self, request: Request) -> Response:
        worker = self.parts.worker
        return JsonResponse({"status": "ok"} if worker is None else {"status": "ok", "worker": worker})

    async def readyz(self, request: Request) -> Response:
        registry = self.parts.registry
        reason = registry.ready() or (None if self.parts.started else "starting")
        if reason is not None:
            return JsonResponse({"status": "not_ready", "reason": reason}, status_code=503)
        degraded = registry.degraded()
        if degraded is not None:
            # Still in rotation: it routes from its snapshot; only registry writes fail.
            return JsonResponse({"status": "degraded", "reason": degraded})
        return JsonResponse({"status": "ready"})

    async def openapi(self, request: Request) -> Response:
        if self._openapi is None:
            self._openapi = openapi_document()
        return JsonResponse(self._openapi)

    async def metrics(self, request: Request) -> Response:
        return Response(self.parts.metrics.exposition(), media_type=METRICS_CONTENT_TYPE)

    async def async_result(self, request: Request) -> Response:
        trace_id = request.path_params["trace_id"]
        results = self.parts.results
        owner = results.owner(trace_id)
        principal = principal_of(request.scope)
        if owner is not None and principal.role != "admin" and principal.key != owner:
            # Someone else's request: as unknown as one that never existed.
            return json_error(
                404,
                "NOT_FOUND",
                f"no async request {trace_id!r} (unknown, or its result expired or was evicted)",
            )
        reply = results.get(trace_id)
        if reply is not None:
            return JsonResponse(reply[1], status_code=reply[0])
        running = self.parts.dispatcher.async_requests
        if results.is_pending(trace_id):
            return _still_running(self.parts.clock, trace_id, running.poll_after(trace_id))
        journal = running.journal
        if journal is not None:
            return await self._shared_result(journal, trace_id, principal)
        return json_error(
            404, "NOT_FOUND", f"no async request {trace_id!r} (unknown, or its result expired or was evicted)"
        )

    async def _shared_result(self, journal: DeferredStore, trace_id: str, principal: Principal) -> Response:
        """GET /reach/{traceId} for a request another Router accepted: read from etcd."""
        unknown = f"no async request {trace_id!r} (unknown, or its result expired or was evicted)"
        try:
            stored, job = await journal.lookup(trace_id)
        except (EtcdRejected, RegistryUnavailable) as exc:
            return json_error(503, "REGISTRY_UNAVAILABLE", f"cannot read async results from etcd now: {exc}")
        owner = stored.owner if stored is not None else job.owner if job is not None else None
        if owner is not None and principal.role != "admin" and principal.key != owner:
            return json_error(404, "NOT_FOUND", unknown)
        if stored is not None:
            if stored.body is None:
                return json_error(
                    404,
                    "NOT_FOUND",
                    f"the result of {trace_id!r} ({stored.size} bytes) is over "
                    "async_mode.etcd_max_result_bytes: only the Router that ran it holds it",
                )
            return JsonResponse(stored.body, status_code=stored.status)
        if job is not None:
            # Run by another Router: how long it has run is not known here.
            return _still_running(self.parts.clock, trace_id, POLL_AFTER_MIN_S)
        return json_error(404, "NOT_FOUND", unknown)

    async def get_trace(self, request: Request) -> Response:
        trace_id = request.path_params["trace_id"]
        trace = self.parts.traces.trace(trace_id)
        if trace is None:
            message = f"no trace {trace_id!r} (unknown, or evicted from the store)"
            if self.parts.worker is not None:
                # A new connection may reach another worker of the port, which may hold it.
                message += (
                    f"; this is worker {self.parts.worker} of `reach router --workers`, and each "
                    "worker keeps only the traces of the calls it served: ask again"
                )
            return json_error(404, "TRACE_NOT_FOUND", message)
        return JsonResponse(trace)

    async def list_traces(self, request: Request) -> Response:
        limit = whole_number(request.query_params.get("limit", "50"), "limit", 1, 1000)
        found = self.parts.traces.recent(
            task=request.query_params.get("task") or None,
            status=trace_status(request.query_params.get("status") or None),
            limit=limit,
        )
        return JsonResponse(found)

    async def reload(self, request: Request) -> Response:
        if self.policy.path is None:
            return json_error(409, "NO_POLICY_FILE", "the Router was started without a policy file")
        if not self.policy.reload():
            return json_error(
                422,
                "INVALID_CONFIG",
                f"the new policy file is invalid; the old one is kept: {self.policy.last_error}",
            )
        return JsonResponse({"status": "reloaded", "path": str(self.policy.path)})

    # -- errors ------------------------------------------------------------------------------

    async def _on_reach_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RegistryError | RequestError)
        if isinstance(exc, RegistrationThrottled):
            response = JsonResponse({"error": exc.to_error()}, status_code=exc.http_status)
            response.headers["Retry-After"] = str(exc.retry_after_s)
            return response
        return json_error(exc.http_status, exc.code, exc.message, exc.details)

    async def _on_http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(exc.status_code, "HTTP_ERROR")
        response = json_error(exc.status_code, code, f"{request.method} {request.url.path}: {exc.detail}")
        response.headers.update(exc.headers or {})  # a 405's Allow (RFC 9110 §15.5.6)
        return response


async def _served_by_the_app(request: Request) -> Response:
    """POST /reach, which RouterApp answers before the admin API sees a request."""
    raise HTTPException(404)


def _may_register(request: Request, agent_id: str, tasks: list[str] | None = None) -> None:
    """An agent token may only register, renew and deregister its own ids, serving its tasks."""
    principal = principal_of(request.scope)
    if not principal.may_register(agent_id):
        raise Forbidden(f"the agent token {principal.label} may not register agent id {agent_id!r}")
    for task in tasks or []:
        if not principal.may_serve(task):
            raise Forbidden(f"the agent token {principal.label} may not serve task {task!r}")


async def _resolve(host: str) -> list[Address]:
    """The addresses ``host`` resolves to now; none when it does not resolve within a second."""
    try:
        async with asyncio.timeout(1.0):
            infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, TimeoutError):
        return []
    except UnicodeError as exc:
        # An empty or over-long label ("a..b"): no resolver will ever take it.
        raise OutboundRefused(f"host {host!r} is not a valid host name") from exc
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]


__all__ = ["AdminApi", "whole_number"]


def _seconds(value: float) -> float | int:
    """``ttlSeconds`` as the policy wrote it: 60, not 60.0, whichever backend stored it."""
    return int(value) if float(value).is_integer() else value


def _still_running(clock: Clock, trace_id: str, poll_after_s: int) -> Response:
    """The 202 ACCEPTED of a poll while the request runs, saying when to look again."""
    status, body = encoder.standalone(clock, trace_id)
    return JsonResponse(body, status_code=status, headers={"Retry-After": str(poll_after_s)})
