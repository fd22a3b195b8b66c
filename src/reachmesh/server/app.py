"""The Router application: one ASGI callable, a lean hot path and the admin surface.

``POST /reach`` runs on every call, so it is served straight from raw ASGI: one header pass, one
body read, the dispatcher, one send; and, when its body came with its head, without ASGI at all:
the Router's HTTP/1.1 protocol (:mod:`.h1`) hands it to :meth:`RouterApp.serve_whole` and writes
the answer, then the request's observers run. Everything else (registry, admin, health, metrics, traces,
OpenAPI) is :class:`~reachmesh.server.admin.AdminApi`, where convenience costs nothing that
matters. Both pass the same :mod:`guard` first, and ``/reach`` and its polls (``GET /reach/{traceId}``)
pass the load shedder.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import re
import time
from collections.abc import Awaitable, Iterable
from functools import lru_cache, partial
from itertools import chain
from typing import Any

from reachmesh.clock import SYSTEM_CLOCK, Clock
from reachmesh.config import RouterConfig
from reachmesh.decision import DecisionRecord
from reachmesh.dispatch import encoder
from reachmesh.dispatch.results import Reply
from reachmesh.exceptions import ConfigError, InternalError, Overloaded, RequestError
from reachmesh.lifecycle import Background
from reachmesh.registry.base import Registry
from reachmesh.server.admin import AdminApi
from reachmesh.server.asgi import (
    WHOLE_ANSWER,
    Answer,
    ClientGone,
    LaneAnswer,
    Receive,
    Scope,
    Send,
    body_timeout,
    check_json_content_type,
    check_whole_body,
    check_whole_request,
    count_hops,
    error_body,
    header_map,
    read_body,
    send_json,
)
from reachmesh.server.auth import (
    ANONYMOUS,
    PRINCIPAL,
    Action,
    Denial,
    Guard,
    Principal,
    action_for,
    principal_of,
)
from reachmesh.server.components import RouterParts
from reachmesh.server.cors import (
    answer_headers,
    is_preflight,
    methods_of,
    preflight_headers,
    with_answer_headers,
)
from reachmesh.server.h1 import CALL_TASK, joined_fields
from reachmesh.server.origin import BrowserGate, CrossOrigin
from reachmesh.server.reload import PolicyFile
from reachmesh.server.stream import EventSink, serve_stream, wants_stream
from reachmesh.server.ui import AdminUi
from reachmesh.tracecontext import parse_traceparent
from reachmesh.transport.base import Transport

log = logging.getLogger("reachmesh.router")


class RouterApp:
    """The Router as an ASGI application. Build it with :func:`create_app`."""

    def __init__(
        self,
        config: RouterConfig | None = None,
        *,
        registry: Registry | None = None,
        transport: Transport | None = None,
        clock: Clock = SYSTEM_CLOCK,
        guard: Guard | None = None,
        config_path: str | os.PathLike[str] | None = None,
    ) -> None:
        self.parts = RouterParts.build(
            config or RouterConfig(),
            registry=registry,
            transport=transport,
            clock=clock,
            guard=guard,
            config_path=config_path,
        )
        self.browser_gate = BrowserGate()
        self._drain_started: float | None = None
        # The two HTTP surfaces beside /reach: they read the parts, and build none of their own.
        self.admin = AdminApi(self.parts)
        self.ui = AdminUi(self.parts)
        self._background = Background("reach-router")

    @property
    def policy_file(self) -> PolicyFile:
        return self.parts.policy_file

    @property
    def guard(self) -> Guard:
        return self.parts.guard

    @property
    def started(self) -> bool:
        return self.parts.started

    @property
    def config(self) -> RouterConfig:
        return self.parts.config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            path = scope["path"]
            # admit(), written out: an admitted page on another origin gets CORS (_refused_or_cross).
            verdict = self.browser_gate.check(scope, self.parts.config.server)
            if verdict is None:
                verdict = self.guard.check(action_for(scope["method"], path), scope)
            if verdict is not None and (send := await _refused_or_cross(self, verdict, scope, send)) is None:
                return  # answered: refused, or a preflight
            if path == "/reach" and scope["method"] == "POST":
                # Served here, not in a coroutine of its own: a call waiting for its body holds
                # each frame on the way (a burst holds one call per connection). The server's
                # protocol stops this task's call if the caller's connection closes (callers_gone).
                scope[CALL_TASK] = asyncio.current_task()
                headers = joined_fields(scope["headers"], header_map(scope))
                answer = await self._serve_reach(scope, headers, None, receive, send)
                if answer is not None:
                    await send_json(send, *answer, scope)
            elif scope["method"] == "GET" and path.startswith("/reach/"):
                await self._serve_poll(scope, receive, send)
            elif AdminUi.serves(path):
                await self.ui(scope, receive, send)
            else:
                await self.admin(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        # websockets are not part of the protocol: returning without accepting closes them.

    # -- the hot path ------------------------------------------------------------------------

    def takes_whole(self, headers: dict[bytes, bytes]) -> bool:
        """Whether :meth:`serve_whole` may answer this POST /reach (not a stream)."""
        accept = headers.get(b"accept")
        return accept is None or not wants_stream(accept)  # no Accept asks for no stream

    def callers_gone(self, tasks: Iterable[asyncio.Task[Any]]) -> None:
        """A connection closed with these tasks still serving it (the server's protocol, :mod:`.h1`,
        says so): a call still running in one of them stops, booked to its caller. A streamed
        call is watched by its own sink (:mod:`.stream`)."""
        self.parts.dispatcher.callers_gone(tasks)

    async def serve_whole(self, scope: Scope, headers: dict[bytes, bytes], body: bytes) -> LaneAnswer:
        """POST /reach whose whole body the server already holds: what ``__call__`` and
        :meth:`_serve_reach` do, without ASGI's ``receive`` and ``send`` (the server's lane for it,
        :mod:`.h1`, writes the answer). (status, body, extra headers), and what to call once
        the answer is written: the request's observers (trace line, metrics, store), so that
        their work is not in the caller's wait.

        Written out on its own, not through :meth:`_serve_reach` and ``Dispatcher.handle``: the
        request's one coroutine in this layer (each level more costs every call a frame, its
        making, and a step each time it waits for its agent)."""
        parts = self.parts  # admit(), written out below: it runs on every call
        verdict = self.browser_gate.check(scope, parts.config.server, headers)
        if verdict is not None:  # an Origin not the Router's own: refused, or served with CORS
            return await _serve_whole_cross(self, scope, headers, body, verdict)
        denial = parts.guard.check(Action.REACH, scope)
        if denial is not None:
            return self._denied(denial, reach=True, post_reach=True), None
        has_trace = b"x-reach-trace-id" in headers or b"traceparent" in headers  # else no call
        trace_hint, parent = _trace_of(headers) if has_trace else _NO_TRACE
        principal = scope.get(PRINCIPAL)  # principal_of(scope), without its call once set:
        principal = principal if principal.__class__ is Principal else principal_of(scope)
        caller, client, auth_on = principal.key, scope.get("client"), parts.auth_on  # _client_key:
        peer = caller if auth_on and caller != ANONYMOUS.key else (client[0] if client else "-")
        peer = _ipv6_client(peer) if ":" in peer and peer is not caller else peer  # by its /64
        shed = parts.shedder.admit(peer)
        if shed is not None:
            return self._shed(shed, parent), None
        dispatcher = parts.dispatcher
        held: list[DecisionRecord] = []
        try:
            try:
                # The head (a JSON body, a hop count under the bound) and the body's size.
                check_whole_request(headers, body, parts.config.server.body_limit_bytes)
            except RequestError as exc:
                status, payload = dispatcher.refuse(exc, trace_id=parent[0] if parent else None)
                return (status, payload, None), None
            try:
                # Dispatcher.handle, written out: what its start() returns awaited here.
                started = dispatcher.start(
                    body,
                    trace_header=trace_hint,
                    parent=parent,
                    owner=caller if auth_on else None,
                    caller=caller,
                    client=peer,
                    grants=principal.grants,
                    hold=held,
                )
                status, payload = started if isinstance(started, tuple) else await started
            except Exception:
                log.exception("internal error while serving /reach")  # traceback here
                status, payload = self._internal_error(trace_hint, parent)
        finally:
            parts.shedder.release(peer)
        extra = None
        if status != 200:
            extra = _retry_after_of(status, payload, parts.config.limits.retry_after_seconds)
        if not held:
            return (status, payload, extra), None
        return (status, payload, extra), partial(parts.observe_later.on_loop, held[0])

    async def _serve_reach(
        self,
        scope: Scope,
        headers: dict[bytes, bytes],
        body: bytes | None,
        receive: Receive,
        send: Send,
        hold: list[DecisionRecord] | None = None,
    ) -> Answer | None:
        """POST /reach's answer (``body`` None: read with ``receive``); None: a stream, or no caller."""
        parts, (trace_hint, parent) = self.parts, _trace_of(headers)
        principal, auth_on = principal_of(scope), parts.auth_on
        caller, client = principal.key, scope.get("client")  # _client_key, written out:
        peer = caller if auth_on and caller != ANONYMOUS.key else (client[0] if client else "-")
        peer = _ipv6_client(peer) if ":" in peer and peer is not caller else peer  # by its /64
        shed = parts.shedder.admit(peer)
        if shed is not None:
            return self._shed(shed, parent)
        try:
            try:
                check_json_content_type(headers)  # the head: a JSON body, a hop count under the bound
                count_hops(headers)
                if body is None:  # read here, not in a coroutine of its own (see __call__)
                    server = parts.config.server
                    timeout_s = body_timeout(scope, server.body_timeout_seconds)
                    body = await read_body(receive, headers, server.body_limit_bytes, timeout_s)
                else:
                    check_whole_body(headers, body, parts.config.server.body_limit_bytes)
            except RequestError as exc:
                status, payload = parts.dispatcher.refuse(exc, trace_id=parent[0] if parent else None)
                return status, payload, None
            except ClientGone:
                return None
            owner = caller if auth_on else None
            grants = principal.grants
            if send is not None and wants_stream(headers.get(b"accept")):
                who = {"trace_header": trace_hint, "parent": parent, "owner": owner, "caller": caller}
                await self._stream(send, receive, body, {**who, "client": peer, "grants": grants}, scope)
                return None
            try:
                status, payload = await parts.dispatcher.handle(
                    body,
                    trace_header=trace_hint,
                    parent=parent,
                    owner=owner,
                    caller=caller,
                    client=peer,
                    grants=grants,
                    hold=hold,
                )
            except Exception:
                log.exception("internal error while serving /reach")  # traceback here
                status, payload = self._internal_error(trace_hint, parent)
            if status == 200:
                return status, payload, None
            return status, payload, _retry_after_of(status, payload, parts.config.limits.retry_after_seconds)
        finally:
            parts.shedder.release(peer)

    def _internal_error(self, trace_hint: str | None, parent: tuple[str, str] | None) -> Reply:
        """The answer to a bug, not bad input (its traceback logged already): still one
        ReachResponse, counted and traced."""
        trace_id = trace_hint or (parent[0] if parent else None)
        return self.parts.dispatcher.refuse(InternalError(), trace_id=trace_id)

    def _shed(self, reason: str, parent: tuple[str, str] | None) -> Answer:
        """OVERLOADED at once, with the policy's Retry-After: the Router is shedding load."""
        parts = self.parts
        status, payload = parts.dispatcher.shed(reason, trace_id=parent[0] if parent else None)
        return status, payload, [(b"retry-after", str(parts.config.limits.retry_after_seconds).encode())]

    async def _stream(
        self,
        send: Send,
        receive: Receive,
        body: bytes,
        who: dict[str, Any],
        scope: Scope,
    ) -> None:
        """A caller that asked for ``text/event-stream`` (protocol §14)."""
        dispatcher = self.parts.dispatcher

        def run(sink: EventSink) -> Awaitable[Reply]:
            return dispatcher.handle(body, sink=sink, **who)

        def internal_error() -> Reply:
            log.exception("internal error while streaming /reach")
            parent = who["parent"]
            return dispatcher.refuse(
                InternalError(), trace_id=who["trace_header"] or (parent[0] if parent else None)
            )

        overloaded_s = self.parts.config.limits.retry_after_seconds
        await serve_stream(_with_retry_after(send, overloaded_s), receive, run, internal_error, scope)

    async def _serve_poll(self, scope: Scope, receive: Receive, send: Send) -> None:
        """GET /reach/{traceId}: admitted by the load shedder as POST /reach is, counted against
        the same client (:meth:`client_key`). Each poll costs a look in the result store, and with
        etcd one read of an id no Router holds, on the client pool that lease renewals share: one
        client's poll flood is refused (429 OVERLOADED, Retry-After) while others are served."""
        parts, peer = self.parts, self.client_key(scope)
        shed = parts.shedder.admit(peer)
        if shed is not None:
            polled = scope["path"][len("/reach/") :]
            trace_id = polled if polled and "/" not in polled else None
            error = Overloaded(shed, retry_after_s=parts.config.limits.retry_after_seconds)
            status, body = encoder.standalone(parts.clock, trace_id, error=error)
            await send_json(send, status, body, [(b"retry-after", str(error.retry_after_s).encode())], scope)
            return
        try:
            await self.admin(scope, receive, send)
        finally:
            parts.shedder.release(peer)

    def admit(self, action: Action, scope: Scope, fields: dict[bytes, bytes] | None = None) -> Denial | None:
        """The gates before any body is read: a page on another site (:mod:`.origin`), then
        credentials. Every way in (the Router's paths, the A2A face) passes both. ``fields``:
        the request's headers as a dict, when the caller holds them so. (An admitted page on
        another origin is admitted here; the Router's own paths add CORS headers for it.)"""
        verdict = self.browser_gate.check(scope, self.parts.config.server, fields)
        if verdict is not None and not isinstance(verdict, CrossOrigin):
            return verdict
        return self.guard.check(action, scope)

    def client_key(self, scope: Scope) -> str:
        """Whom the load shedder counts a request against (``limits.max_inflight_per_client``).

        Slots are counted per credential when auth is on: one token behind five source addresses
        took all 1,024 when they were counted per address. With auth off, the address is all
        there is to tell callers apart. Every way in (``/reach``, the A2A face) counts the same.
        """
        return self._client_key(scope, principal_of(scope).key, self.auth_on)

    @staticmethod
    def _client_key(scope: Scope, caller: str, auth_on: bool) -> str:
        if auth_on and caller != ANONYMOUS.key:
            return caller
        client = scope.get("client")
        if not client:
            return "-"
        host: str = client[0]
        return host if ":" not in host else _ipv6_client(host)

    def _denied(self, denial: Denial, *, reach: bool, post_reach: bool) -> Answer:
        """A refusal in the shape of the endpoint: a ReachResponse on /reach, else an error object."""
        if post_reach:
            # A refused call is a request too: the same finish path counts and traces it.
            _, body = self.parts.dispatcher.refuse(denial.error())
        elif reach:
            _, body = encoder.standalone(self.parts.clock, None, error=denial.error())
        else:
            body = error_body(denial.status.value, denial.message)
        extra = list(denial.headers)
        if denial.retry_after_s:
            extra.append((b"retry-after", str(denial.retry_after_s).encode()))
        return denial.http_status, body, extra or None

    # -- policy reload -----------------------------------------------------------------------

    @property
    def auth_on(self) -> bool:
        return self.parts.auth_on

    def apply(self, config: RouterConfig) -> None:
        """Switch every part, and the guard if it came from the policy, to a new policy."""
        self.parts.apply(config)

    def reload(self) -> bool:
        """Re-read the policy file; a bad file is logged and the old policy kept."""
        return self.policy_file.reload()

    # -- lifecycle ---------------------------------------------------------------------------

    async def startup(self) -> None:
        """Start every part, then watch the policy file (if there is one)."""
        await self.parts.start()
        if self.policy_file.path is not None:
            self.policy_file.remember()
        # Without a file too: a SIGHUP is then answered with a line saying there is nothing to reload.
        self._background.every(lambda: 1.0, self.policy_file.check, "policy-watch")
        self.ui.traffic.sample()
        self._background.every(lambda: self.ui.traffic.step_seconds, self.ui.traffic.tick, "traffic")

    def begin_drain(self, at_monotonic: float) -> None:
        """A shutdown signal arrived at ``at_monotonic``: the drain deadline counts from there.

        The server cancels whatever still runs at that deadline, and a cancelled request would
        be a bare 500 with a traceback; so the requests still running a little before it are
        ended here, each with its TIMEOUT ReachResponse. Called from the signal handler.
        """
        if self._drain_started is not None:
            return
        self._drain_started = at_monotonic
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop serving requests: nothing is running
        budget = self.parts.config.server.drain_timeout_seconds
        # Time to write the answers before the server's own cut-off.
        margin = min(1.0, budget / 10)
        dispatcher = self.parts.dispatcher

        vectors = self.parts.vectors

        def arm() -> None:
            left = budget - margin - (time.monotonic() - at_monotonic)
            loop.call_later(max(left, 0.0), dispatcher.abandon)
            if vectors is not None:
                vectors.stop_loading()

        loop.call_soon_threadsafe(arm)

    async def shutdown(self) -> None:
        """Let accepted async requests finish until the drain deadline, end the calls still
        running (ROUTER_SHUTDOWN), then stop everything."""
        self.parts.stopping()
        budget = self.parts.config.server.drain_timeout_seconds
        if self._drain_started is not None:
            budget -= time.monotonic() - self._drain_started
        dispatcher = self.parts.dispatcher
        await dispatcher.drain(budget)
        # A server that ends the lifespan with calls still running (uvicorn without the signal
        # that starts the drain, another ASGI server): each ends now with its ROUTER_SHUTDOWN
        # answer, given a turn of the loop to write it, rather than being cut off with nothing.
        if dispatcher.running:
            dispatcher.abandon()
            await asyncio.sleep(0)
        await self._background.close()
        await self.parts.close()
        log.info("[router] stopped")

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except ConfigError as exc:
                    # The operator's to fix, and the message says how: one line, no traceback.
                    log.error("router start-up failed: %s", exc.message)
                    # No message for uvicorn: it would print the same line again.
                    await send({"type": "lifespan.startup.failed", "message": ""})
                    return
                except Exception as exc:
                    log.exception("router start-up failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return


async def _serve_whole_cross(
    app: RouterApp, scope: Scope, headers: dict[bytes, bytes], body: bytes, verdict: Denial | CrossOrigin
) -> LaneAnswer:
    """:meth:`serve_whole` for a request whose Origin is another site's: refused as ever
    when the policy does not admit it, else served as any call (the guard, then
    :meth:`_serve_reach`), its answer carrying the CORS headers (:mod:`.cors`)."""
    if not isinstance(verdict, CrossOrigin):
        return app._denied(verdict, reach=True, post_reach=True), None
    denial = app.guard.check(Action.REACH, scope)
    held: list[DecisionRecord] = []
    if denial is not None:
        status, payload, extra = app._denied(denial, reach=True, post_reach=True)
    else:
        answer = await app._serve_reach(scope, headers, body, None, None, held)
        assert answer is not None  # a whole body and no send: never a stream, nor a caller gone
        status, payload, extra = answer
    extra = [*(extra or ()), *answer_headers(verdict.origin)]
    after = partial(app.parts.observe_later.on_loop, held[0]) if held else None
    return (status, payload, extra), after


async def _refused_or_cross(
    app: RouterApp, verdict: Denial | CrossOrigin, scope: Scope, send: Send
) -> Send | None:
    """A refusal answered (None); or a request from a page on another origin that the
    policy admits (uvicorn's way): a preflight answered here (204, before the guard: a
    browser sends no credentials on it); the guard's refusal answered with the CORS headers;
    else the ``send`` the request is served with, which adds them. None: answered."""
    if not isinstance(verdict, CrossOrigin):
        await send_json(send, *_refusal(app, verdict, scope))
        return None
    path, method = scope["path"], scope["method"]
    if is_preflight(scope):
        methods = methods_of(chain(app.admin.app.routes, app.ui.app.routes), path)
        if methods:
            headers = preflight_headers(verdict.origin, methods)
            await send({"type": "http.response.start", "status": 204, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
            return None
    denial = app.guard.check(action_for(method, path), scope)
    if denial is not None:
        status, body, extra = _refusal(app, denial, scope)
        await send_json(send, status, body, [*(extra or ()), *answer_headers(verdict.origin)])
        return None
    # Every answer through ``send`` now, which adds the headers: neither a whole answer nor a
    # stream written straight to the connection (the server's own, :mod:`.h1`) would.
    scope.pop(WHOLE_ANSWER, None)
    return with_answer_headers(send, verdict.origin)


def _refusal(app: RouterApp, denial: Denial, scope: Scope) -> Answer:
    """The refusal in the shape of the endpoint ``scope`` names (:meth:`RouterApp._denied`)."""
    path = scope["path"]
    reach = path == "/reach" or path.startswith("/reach/")
    return app._denied(denial, reach=reach, post_reach=path == "/reach" and scope["method"] == "POST")


# What _trace_of says of a request with neither header.
_NO_TRACE: tuple[str | None, tuple[str, str] | None] = (None, None)


def _trace_of(headers: dict[bytes, bytes]) -> tuple[str | None, tuple[str, str] | None]:
    """The caller's X-Reach-Trace-Id (unchecked: the dispatcher checks it) and its W3C
    traceparent's (trace id, span id), if any."""
    trace_header = headers.get(b"x-reach-trace-id")
    raw_parent = headers.get(b"traceparent")
    return (
        trace_header.decode("latin-1") if trace_header else None,
        parse_traceparent(raw_parent.decode("latin-1")) if raw_parent else None,
    )


def create_app(config: RouterConfig | None = None, **kwargs: Any) -> RouterApp:
    """Build the Router application (``uvicorn --factory reachmesh.server:create_app``)."""
    if config is None:
        path = kwargs.pop("config_path", None) or os.environ.get("REACH_CONFIG") or None
        return RouterApp(RouterConfig.load(path), config_path=path, **kwargs)
    return RouterApp(config, **kwargs)


__all__ = ["ConfigError", "RouterApp", "create_app"]


# The soonest Retry-After of busy agents, as the answer's own error carries it (the encoder
# writes the key once, with no space).
_RETRY_AFTER_SECONDS = re.compile(rb'"retryAfterSeconds":(\d{1,9})[,}]')


# The longest text of an IPv6 address (45 characters) with a scope id (an interface's name, 15
# at most on Linux, or a number). Longer names go uncached: X-Forwarded-For from a trusted proxy
# names the peer in up to a request head's 64 KiB, and 4096 of them cached held 256 MiB.
_LONGEST_ADDRESS = 64


def _ipv6_client(host: str) -> str:
    """The client an IPv6 peer is counted as with auth off: its /64. One host holds a whole /64
    (SLAAC, privacy addresses), so counted per address a caller could name itself a new client
    on each call. An IPv4 peer on a dual-stack socket (``::ffff:a.b.c.d``) is its IPv4 address.
    A name longer than any address is not one: it is the client as it is, and never cached."""
    return host if len(host) > _LONGEST_ADDRESS else _ipv6_network(host)


@lru_cache(maxsize=4096)
def _ipv6_network(host: str) -> str:
    """:func:`_ipv6_client` for a name short enough to be an address (cached: a peer calls often)."""
    try:
        address = ipaddress.IPv6Address(host)
    except ValueError:
        return host  # not an address (a unix socket's name): as it is
    if address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    if address.is_loopback:
        return host
    return str(ipaddress.IPv6Network((address, 64), strict=False))


def _retry_after_of(status: int, payload: bytes, overloaded_s: int) -> list[tuple[bytes, bytes]] | None:
    """The ``Retry-After`` header of a refusal: a 429 the figure its error carries (every
    candidate full, and its queue too: PROTOCOL §15, an estimate), else the policy's; a 503 whose
    error says when to come back (every agent that answered was busy, or the embedding service
    said so) that time, since HTTP clients read the header, not the body."""
    if status == 429:
        # The answer's own figure: an estimate from the full agents' queues, or the policy's.
        found = _RETRY_AFTER_SECONDS.search(payload)
        return [(b"retry-after", found.group(1) if found else str(overloaded_s).encode())]
    if status != 503 or b"retryAfterSeconds" not in payload:
        return None
    found = _RETRY_AFTER_SECONDS.search(payload)
    return [(b"retry-after", found.group(1))] if found else None


def _with_retry_after(send: Send, overloaded_s: int) -> Send:
    """``send``, adding ``Retry-After`` to a refusal's head as a plain call's answer has it
    (:func:`_retry_after_of`): a streamed call refused before any chunk (429: every candidate
    full, and its queue too; 503: every agent that answered busy) is answered the plain refusal a
    plain call gets. A 503's head waits for its body, which says how long."""
    held: dict[str, Any] | None = None

    async def sending(message: dict[str, Any]) -> None:
        nonlocal held
        if message["type"] == "http.response.start" and message.get("status") in (429, 503):
            held = message
            return
        if held is not None:
            start, held = held, None
            extra = _retry_after_of(start["status"], message.get("body", b""), overloaded_s)
            if extra:
                start = {**start, "headers": [*start.get("headers", ()), *extra]}
            await send(start)
        await send(message)

    return sending
