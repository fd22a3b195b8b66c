"""The agent runtime: register, keep the lease, serve the callback, leave cleanly.

```python
agent = ReachAgent("reach_config.yaml")

@agent.capability("query_product_price")
async def price(payload: dict, ctx: ReachContext) -> dict:
    return {"price": 199.9, "currency": payload["currency"], "updated_at": "..."}

agent.run()   # or: reach agent --config reach_config.yaml --app module:agent
```

Handlers may be ``async def`` or plain ``def`` (run in a worker thread, so a CPU-bound handler
does not stall the callback server), and take ``(payload)`` or ``(payload, ctx)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hmac
import inspect
import logging
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from reachmesh import jsoncodec
from reachmesh.clock import SYSTEM_CLOCK
from reachmesh.deadline import Deadline
from reachmesh.exceptions import ConfigError, ReachError
from reachmesh.protocol import AGENT_SECRET_HEADER as SECRET_HEADER
from reachmesh.protocol import MAX_CONCURRENCY, UNKNOWN_TASK, ReachResponse
from reachmesh.sdk.capacity import Gate, fingerprint
from reachmesh.sdk.client import ReachClient
from reachmesh.sdk.config import MAX_REPEAT_CACHE_BYTES, AgentConfig, find_config, valid_cache_bytes
from reachmesh.sdk.healthport import HealthServer
from reachmesh.sdk.lease import LeaseKeeper
from reachmesh.sdk.routers import split_router_urls
from reachmesh.sdk.serverlog import agent_runner
from reachmesh.sdk.streaming import ReachStream, gather_values, send_stream, unless_caller_left, wants_stream
from reachmesh.sdk.tls import server_context
from reachmesh.tracecontext import make_traceparent, new_trace_id, parse_traceparent

if TYPE_CHECKING:
    from reachmesh.sdk.otel import AgentSpans

log = logging.getLogger("reachmesh.sdk")

T = TypeVar("T")
Handler = Callable[..., Any]

# Stopping within 2 s of a signal: handlers in flight get HANDLER_DRAIN_TIMEOUT_S, the Router gets
# DEREGISTER_BUDGET_S to take the lease back (each one only when it is the slow part).
HANDLER_DRAIN_TIMEOUT_S = 0.5
# A connection that has not sent a whole request within this is closed. aiohttp's default is
# an hour: anyone who reaches the port, with or without the shared secret, held a connection
# (and a file descriptor) that long with a few header bytes or none. Well over the 4 s the
# Router keeps an idle connection to an agent, and aiohttp clients' 15 s (probes, holds).
IDLE_CONNECTION_S = 30.0
# A callback's body must arrive within this once its headers have: the Router sends it at once,
# and a sender trickling it held the handler without end.
BODY_TIMEOUT_S = 30.0
DEREGISTER_BUDGET_S = 0.8
ConversationHook = Callable[[str], Any]


class AgentError(Exception):
    """Raise from a handler to answer ``AGENT_ERROR``; ``retryable=True`` allows failover."""

    def __init__(
        self, message: str, *, code: str = "AGENT_ERROR", retryable: bool = False, details: Any = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.retryable = retryable
        self.details = details

    def to_error(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": str(self), "retryable": self.retryable}
        if self.details is not None:
            error["details"] = self.details
        return error


class Decline(Exception):
    """Raise from a handler to answer ``DECLINED``: this request is not for this agent.

    Not an error: the Router tries the next candidate, and the decline never counts against the
    agent's breaker or success rate. The reason goes into the agent's log and to the caller, as
    the ``message`` of the candidate whose reason is ``declined`` (its first 256 characters):
    write it for the caller to read, with nothing in it that must stay inside.
    """

    def __init__(self, reason: str = "the request is not for this agent") -> None:
        super().__init__(reason)
        self.reason = reason


Accepts = Callable[[str], bool]


@dataclass(slots=True)
class ReachContext:
    """What a handler knows about the request it serves, and how it calls other agents."""

    trace_id: str
    task: str
    source_agent: str | None
    conversation_id: str | None
    deadline: Deadline | None
    agent: ReachAgent
    parent_span_id: str | None = None  # the Router's span for this attempt, from `traceparent`

    @property
    def remaining_ms(self) -> float | None:
        return None if self.deadline is None else self.deadline.remaining_ms()

    async def call(self, task: str, payload: dict[str, Any] | None = None, **options: Any) -> ReachResponse:
        """Call another agent through the Router, in this request's trace and budget."""
        headers = self._within(options)
        return await self.agent.client.call(task, payload, headers=headers, **options)

    def stream(self, task: str, payload: dict[str, Any] | None = None, **options: Any) -> ReachStream:
        """Call another agent with a streamed answer (``async with ctx.stream(...) as s:``), in
        this request's trace and budget, as :meth:`call`."""
        headers = self._within(options)
        return self.agent.client.stream(task, payload, headers=headers, **options)

    def _within(self, options: dict[str, Any]) -> dict[str, str]:
        """Fit ``options`` to this request (its remaining budget, trace and conversation) and
        return the headers of a call made from it."""
        remaining = self.remaining_ms
        if remaining is not None:
            wanted = options.get("timeout_ms")
            options["timeout_ms"] = max(1, int(min(remaining, wanted) if wanted else remaining))
        options.setdefault("trace_id", self.trace_id)
        options.setdefault("conversation_id", self.conversation_id)
        # Our caller's span is the parent of the calls we make: the Router links the hops into a tree.
        return {
            "X-Reach-Trace-Id": self.trace_id,
            "traceparent": make_traceparent(self.trace_id, self.parent_span_id),
        }


def _refuse_plain_generator(task: str, handler: Handler) -> None:
    """A ``def`` with ``yield``, run as a plain handler, returned a generator, answered "not
    JSON-serialisable" on every call: refused when it is bound instead."""
    if inspect.isgeneratorfunction(handler):
        raise ConfigError(
            f"the handler for {task!r} is a plain generator (def with yield): write it "
            "'async def' to stream (each yield is a chunk), or return the whole result"
        )


def _wants_context(handler: Handler) -> bool:
    try:
        params = inspect.signature(handler).parameters.values()
    except (TypeError, ValueError):
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params)


def _concurrency(value: int | None) -> int | None:
    """``max_concurrency`` as given, if it is a count: a bool is an int to Python, and 2.5
    compares fine, but neither is one."""
    if value is not None and (type(value) is not int or not 1 <= value <= MAX_CONCURRENCY):
        raise ValueError(f"max_concurrency must be an integer between 1 and {MAX_CONCURRENCY}")
    return value


def _cache_bytes(value: int | None) -> int | None:
    """``repeat_cache_bytes`` as given, if it is a size (server.repeat_cache_bytes's range)."""
    if value is not None and not valid_cache_bytes(value):
        raise ValueError(
            f"repeat_cache_bytes must be a whole number of bytes from 0 to {MAX_REPEAT_CACHE_BYTES}"
        )
    return value


class ReachAgent:
    """One agent process: its handlers, its lease, its callback and health servers."""

    def __init__(
        self,
        config: AgentConfig | str | os.PathLike[str] | None = None,
        *,
        otel: bool | None = None,
        shared_secret: str | None = None,
        max_concurrency: int | None = None,
        router_url: str | Sequence[str] | None = None,
        repeat_cache_bytes: int | None = None,
    ) -> None:
        """``shared_secret``: answer only calls that carry it in ``X-Reach-Agent-Secret`` (the
        Router's ``outbound.agent_secret_env``); by default, the configuration's (see
        :mod:`reachmesh.sdk.config`), else every call is answered. ``max_concurrency``: the most
        requests handled at once (the profile's key, which it overrides); the next one is
        answered 429 busy, and the Router is told in the profile. ``router_url``: the Router, or
        several Routers of one service (a list, or comma-separated), instead of the
        configuration's (``REACH_ROUTER_URL``, ``router.url``); the agent registers through one
        and renews through whichever answers. ``repeat_cache_bytes``: the answers kept for repeats,
        in bytes (``server.repeat_cache_bytes``: 16 MiB, 0 keeps none), the oldest forgotten first."""
        self._shared_secret = shared_secret
        self._router_urls = None if router_url is None else split_router_urls(router_url, what="router_url")
        self._max_concurrency = _concurrency(max_concurrency)
        self._repeat_cache_bytes = _cache_bytes(repeat_cache_bytes)
        self._gate: Gate | None = None
        self._config: AgentConfig | None = None
        self._config_source = config
        self._handlers: dict[str, tuple[Handler, bool, bool]] = {}
        self._accepts: dict[str, Accepts] = {}
        self._conversation_hook: ConversationHook | None = None
        self._runner: web.AppRunner | None = None
        self._health: HealthServer | None = None
        self._lease: LeaseKeeper | None = None
        # OpenTelemetry spans per handled request: on with otel=True or REACH_OTEL=1 (needs the extra).
        self._otel = otel if otel is not None else os.environ.get("REACH_OTEL", "") in ("1", "true", "yes")
        self._spans: AgentSpans | None = None
        self._client: ReachClient | None = None
        self.port: int | None = None
        # The agent's own metrics, served at /metrics on its health port.
        self.metrics = CollectorRegistry(auto_describe=True)
        self._handled = Counter(
            "reach_agent_handled_requests",
            "Requests handled, by task and outcome",
            ["task", "outcome"],
            registry=self.metrics,
        )
        self._handler_latency = Histogram(
            "reach_agent_handler_latency_seconds", "Handler latency by task", ["task"], registry=self.metrics
        )

    # -- configuration -----------------------------------------------------------------------

    @property
    def config(self) -> AgentConfig:
        if self._config is None:
            source = self._config_source
            config = source if isinstance(source, AgentConfig) else AgentConfig.load(find_config(source))
            if self._max_concurrency is not None:
                profile = config.profile.model_copy(update={"max_concurrency": self._max_concurrency})
                config = dataclasses.replace(config, profile=profile)
            if self._router_urls is not None:
                config = dataclasses.replace(config, router_url=",".join(self._router_urls))
            self._config = config
        return self._config

    @property
    def gate(self) -> Gate:
        """Handlers in flight, the busy answer past max_concurrency, and answers to repeats."""
        if self._gate is None:
            limit, own = self.config.profile.max_concurrency, self._repeat_cache_bytes
            self._gate = Gate(limit, max_bytes=self.config.repeat_cache_bytes if own is None else own)
        return self._gate

    @property
    def lease_id(self) -> str | None:
        """The lease this agent holds now (it changes when the agent registers again)."""
        return None if self._lease is None else self._lease.lease_id

    def use_config(self, config: AgentConfig | str | os.PathLike[str]) -> None:
        """Set the configuration before start (what ``reach agent --config`` does)."""
        self._config_source = config
        self._config = None

    @property
    def id(self) -> str:
        return self.config.profile.id

    @property
    def client(self) -> ReachClient:
        """A client for calling other agents through the Router, as this agent."""
        if self._client is None:
            self._client = ReachClient(self.config.router_url, source_agent=self.id)
        return self._client

    def capability(self, task: str, *, accepts: Accepts | None = None) -> Callable[[Handler], Handler]:
        """Bind the decorated function to the capability ``task``.

        ``accepts(text)``, when given, sees the caller's words (``requestedTask`` when the Router
        chose the task by meaning, else the payload's ``text``, else the task) before the
        handler; False answers ``DECLINED`` without running the handler.
        """

        def bind(handler: Handler) -> Handler:
            if task in self._handlers:
                raise ConfigError(f"capability {task!r} already has a handler")
            _refuse_plain_generator(task, handler)
            is_async = inspect.iscoroutinefunction(handler)
            self._handlers[task] = (handler, is_async, _wants_context(handler))
            if accepts is not None:
                self._accepts[task] = accepts
            return handler

        return bind

    def conversation_holder(self, hook: ConversationHook) -> ConversationHook:
        """Decorate ``hook(conversation_id) -> bool``: does this agent hold that conversation?"""
        self._conversation_hook = hook
        return hook

    def _check_handlers(self) -> None:
        declared = set(self.config.profile.tasks)
        bound = set(self._handlers)
        if bound - declared:
            raise ConfigError(
                f"handlers for undeclared capabilities: {', '.join(sorted(bound - declared))}; "
                "declare them under agent.capabilities in reach_config.yaml"
            )
        if declared - bound:
            raise ConfigError(
                f"declared capabilities without a handler: {', '.join(sorted(declared - bound))}; "
                "bind one with @agent.capability(task)"
            )

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Serve the callback and health endpoints, then register with the Router."""
        config = self.config
        self._check_handlers()
        if self._otel:
            from reachmesh.sdk.otel import AgentSpans

            self._spans = AgentSpans(config.profile.id)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        path = config.callback_path.rstrip("/") or "/"
        app.router.add_post(path, self._on_reach)
        app.router.add_get(path.rstrip("/") + "/conversations/{conversation_id}", self._on_conversation)
        health = config.profile.health_check
        if config.health_port is None:
            app.router.add_get(health.path, self._on_health)
            app.router.add_get("/metrics", self._on_metrics)
        # A stopping agent gives handlers in flight a moment, not aiohttp's default minute: it must
        # be gone within 2 s of SIGTERM or Ctrl-C.
        self._runner = agent_runner(app, HANDLER_DRAIN_TIMEOUT_S, IDLE_CONNECTION_S)
        await self._runner.setup()
        tls = None
        if config.tls_cert_file is not None and config.tls_key_file is not None:
            tls = server_context(config.tls_cert_file, config.tls_key_file, source="server.tls_cert_file")
        site = web.TCPSite(self._runner, config.host, config.port, ssl_context=tls)
        await site.start()
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else config.port
        if config.health_port is not None:
            self._health = HealthServer(
                self.id,
                config.host,
                config.health_port,
                health.path,
                metrics=lambda: generate_latest(self.metrics),
            )
            self._health.start()
        profile = config.profile
        trap = callback_trap(profile.network.endpoint, config.router_url)
        if trap is not None:
            log.warning("[reach-client] WARNING: %s", trap)
        self._lease = LeaseKeeper(
            config.router_url,
            profile.model_dump(mode="json"),
            callback=profile.network.endpoint,
            tasks=profile.tasks,
            registration_timeout=config.registration_timeout_seconds,
        )
        # On a daemon thread of its own, not the default executor: while the Router is down this
        # retries until stop(), and a registration stuck on a hung Router must not hold up exit
        # (asyncio.run waits for the default executor's threads).
        await _on_daemon_thread(self._lease.open, "reach-register")

    async def stop(self) -> None:
        """Deregister (if the Router answers in time), then stop serving; bounded, about 1.5 s.

        Safe in every state: while registration is still retrying, it ends the retries.
        """
        if self._lease is not None:
            lease, self._lease = self._lease, None
            # Joining the lease thread must not block the loop: the thread may be waiting on a
            # Router that is served by this very loop (in tests, or an embedded Router).
            await _on_daemon_thread(lease.stop, "reach-lease-stop")
            loop = asyncio.get_running_loop()
            budget_ends = loop.time() + DEREGISTER_BUDGET_S
            # A registration sent before the stop may be answered yet: its own thread gives that
            # lease back, so wait for it (within the budget) rather than exit and leave it listed.
            waiting = functools.partial(lease.wait_opened, DEREGISTER_BUDGET_S)
            await _on_daemon_thread(waiting, "reach-open-wait")
            try:
                # The keeper's own timeout bounds each phase of the request; this bounds the whole.
                await asyncio.wait_for(
                    _on_daemon_thread(lease.deregister, "reach-deregister"),
                    max(budget_ends - loop.time(), 0.1),
                )
            except TimeoutError:
                log.warning("[reach-client] the Router did not answer the deregistration in time")
            lease.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._health is not None:
            self._health.stop()
            self._health = None
        if self._client is not None:
            await self._client.aclose()

    async def serve_forever(self) -> None:
        """Start, run until SIGTERM or SIGINT, then deregister and stop.

        A signal ends the agent in any state, registration included: start() may be retrying
        against a Router that is down, and would never return by itself.
        """
        loop = asyncio.get_running_loop()
        stopping = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
        try:
            await self._start_unless(stopping)
            await stopping.wait()
        finally:
            # The handlers stay until the agent has stopped: a second Ctrl-C while deregistering
            # is then absorbed instead of raising KeyboardInterrupt through the loop.
            try:
                await self.stop()
            finally:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)

    async def _start_unless(self, stopping: asyncio.Event) -> None:
        """:meth:`start`, abandoned when ``stopping`` is set first (its errors still raise)."""
        starting = asyncio.create_task(self.start())
        signalled = asyncio.create_task(stopping.wait())
        await asyncio.wait({starting, signalled}, return_when=asyncio.FIRST_COMPLETED)
        signalled.cancel()
        if not starting.done():
            if self._lease is not None:
                self._lease.stop(wait=0)  # ends the registration retries on their own thread
            starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting

    def run(self) -> None:
        """Blocking entry point: :meth:`serve_forever` in a fresh event loop.

        The process's GIL switch interval drops from 5 ms to 1 ms, so that the health and lease
        threads get their turn promptly even while a handler holds the CPU.
        """
        sys.setswitchinterval(min(sys.getswitchinterval(), 0.001))
        asyncio.run(self.serve_forever())

    # -- serving -----------------------------------------------------------------------------

    async def _on_health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "agent": self.id})

    async def _on_metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics), content_type="text/plain")

    async def _on_conversation(self, request: web.Request) -> web.Response:
        conversation_id = request.match_info["conversation_id"]
        holds = False
        if self._conversation_hook is not None:
            try:
                answer = self._conversation_hook(conversation_id)
                if inspect.isawaitable(answer):
                    answer = await answer
                holds = answer is True
            except Exception:
                log.exception("conversation hook failed for %s", conversation_id)
        return web.json_response({"holds": holds})

    def _caller_refused(self, request: web.Request) -> web.Response | None:
        """A 401 for a call without the shared secret, when the agent has one; else None."""
        secret = self._shared_secret or self.config.shared_secret
        if secret is None:
            return None
        given = request.headers.get(SECRET_HEADER, "")
        if hmac.compare_digest(given.encode(), secret.encode()):
            return None
        return _answer_error(
            "UNAUTHORIZED",
            f"this agent answers only calls that carry its shared secret in {SECRET_HEADER}",
            retryable=False,
            status=401,
        )

    async def _on_reach(self, request: web.Request) -> web.StreamResponse:
        refused = self._caller_refused(request)
        if refused is not None:
            return refused
        data = await _read_request(request)
        if isinstance(data, web.Response):
            return data
        task = data["targetTask"]
        trace_id = str(data.get("traceId") or request.headers.get("X-Reach-Trace-Id") or new_trace_id())
        bound = self._handlers.get(task)
        if bound is None:
            # A stale registration, say: let the Router try another agent.
            return _answer_error(UNKNOWN_TASK, f"agent {self.id} has no handler for {task!r}", retryable=True)
        deadline = _deadline_from(request.headers.get("X-Reach-Deadline-Ms"))
        parent = parse_traceparent(request.headers.get("traceparent"))
        ctx = ReachContext(
            trace_id=trace_id,
            task=task,
            source_agent=data.get("sourceAgent"),
            conversation_id=data.get("conversationId"),
            deadline=deadline,
            agent=self,
            parent_span_id=parent[1] if parent else None,
        )
        raw_payload = data.get("payload")
        payload: dict[str, Any] = raw_payload if isinstance(raw_payload, dict) else {}
        declined = self._declines(task, data, payload)
        if declined is not None:
            log.info("[%s] decline: %s (%s)", trace_id, task, declined)
            self._handled.labels(task, "declined").inc()
            return _answer_declined(declined)
        key = request.headers.get("Idempotency-Key")
        run = lambda: self._handle(request, bound, payload, ctx)  # noqa: E731
        wait_s = None if deadline is None else deadline.remaining_ms() / 1000
        return await self.gate.serve(key, run, fingerprint(task, raw_payload) if key else b"", wait_s)

    async def _handle(
        self,
        request: web.Request,
        bound: tuple[Handler, bool, bool],
        payload: dict[str, Any],
        ctx: ReachContext,
    ) -> web.StreamResponse:
        log.info("[%s] handle: %s from %s", ctx.trace_id, ctx.task, ctx.source_agent or "-")
        span = (
            self._spans.start(ctx.task, ctx.trace_id, ctx.parent_span_id) if self._spans is not None else None
        )
        started = asyncio.get_running_loop().time()
        answer: tuple[web.StreamResponse, str]
        if inspect.isasyncgenfunction(bound[0]):
            answer = await self._run_streaming(request, bound, payload, ctx)
        else:
            answer = await unless_caller_left(request, _run_handler(bound, payload, ctx))
        self._handler_latency.labels(ctx.task).observe(asyncio.get_running_loop().time() - started)
        self._handled.labels(ctx.task, answer[1]).inc()
        if span is not None and self._spans is not None:
            self._spans.end(span, answer[1])
        return answer[0]

    def _declines(self, task: str, data: dict[str, Any], payload: dict[str, Any]) -> str | None:
        """The reason ``task``'s ``accepts`` hook turns this request down, if it does."""
        accepts = self._accepts.get(task)
        if accepts is None:
            return None
        words = data.get("requestedTask")
        text = words if isinstance(words, str) else payload.get("text")
        if not isinstance(text, str):
            text = task
        try:
            if accepts(text):
                return None
        except Decline as exc:
            return exc.reason
        return f"{task} does not take this request"

    async def _run_streaming(
        self,
        request: web.Request,
        bound: tuple[Handler, bool, bool],
        payload: dict[str, Any],
        ctx: ReachContext,
    ) -> tuple[web.StreamResponse, str]:
        """Run an async-generator handler: a stream when the Router asked for one, else the list
        of its values as one answer (protocol §14)."""
        handler, _, wants_ctx = bound
        values = handler(*((payload, ctx) if wants_ctx else (payload,)))
        if wants_stream(request):
            return await send_stream(request, values, ctx.deadline, _stream_refusal)
        gather = (lambda _payload: gather_values(values, None), True, False)
        return await _run_handler(gather, {}, ctx)


def _on_daemon_thread(fn: Callable[[], T], name: str) -> asyncio.Future[T]:
    """Run ``fn`` on a new daemon thread; the future gets its result.

    Unlike ``asyncio.to_thread``, an abandoned call (a Router that never answers) neither holds up
    the process's exit nor prints a traceback when it finishes after the loop has closed.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(outcome: Callable[[], None]) -> None:
        if not future.done():
            outcome()

    def run() -> None:
        try:
            result = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task, not lost
            deliver = functools.partial(settle, functools.partial(future.set_exception, exc))
        else:
            deliver = functools.partial(settle, functools.partial(future.set_result, result))
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting any more
            loop.call_soon_threadsafe(deliver)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


async def _run_handler(
    bound: tuple[Handler, bool, bool], payload: dict[str, Any], ctx: ReachContext
) -> tuple[web.Response, str]:
    """Run one handler under the deadline; returns the HTTP answer and its outcome label."""
    trace_id, task = ctx.trace_id, ctx.task
    deadline = ctx.deadline
    handler, is_async, wants_ctx = bound
    args = (payload, ctx) if wants_ctx else (payload,)
    work: Awaitable[Any] = handler(*args) if is_async else asyncio.to_thread(handler, *args)
    try:
        if deadline is None:
            result = await work
        else:
            async with asyncio.timeout(max(deadline.remaining_ms(), 0) / 1000):
                result = await work
    except TimeoutError:
        log.warning("[%s] handler for %s ran past the deadline", trace_id, task)
        message = "the handler ran past the request's deadline"
        return _answer_error("DEADLINE_EXCEEDED", message, retryable=False), "deadline_exceeded"
    except (Decline, AgentError) as exc:
        return _answer_refusal(trace_id, task, exc)
    except ReachError as exc:
        return _answer_error(exc.code, exc.message, retryable=False), "agent_error"
    except Exception as exc:
        log.exception("[%s] handler for %s failed", trace_id, task)
        message = f"{type(exc).__name__}: {exc}"[:500]
        return _answer_error("HANDLER_FAILED", message, retryable=False), "handler_failed"
    try:
        body = jsoncodec.dumps({"status": "SUCCESS", "result": result})
    except TypeError as exc:
        log.error("[%s] handler for %s returned something that is not JSON: %s", trace_id, task, exc)
        message = "the handler's result is not JSON-serialisable"
        return _answer_error("HANDLER_FAILED", message, retryable=False), "handler_failed"
    return web.Response(body=body, content_type="application/json"), "success"


async def _read_request(request: web.Request) -> dict[str, Any] | web.Response:
    """The ReachRequest of a call, or the answer refusing it (a body too slow, not JSON, not one)."""
    try:
        # A timeout scope, not wait_for: no task and no extra loop turn for the usual body,
        # which came with its headers.
        async with asyncio.timeout(BODY_TIMEOUT_S):
            raw = await request.read()
    except TimeoutError:
        message = f"the request's body did not arrive within {BODY_TIMEOUT_S:g} s"
        return _answer_error("BODY_TIMEOUT", message, retryable=False, status=408)
    try:
        data = jsoncodec.loads(raw)
    except jsoncodec.JSONDecodeError:
        return _answer_error("INVALID_REQUEST", "body is not JSON", retryable=False, status=400)
    if not isinstance(data, dict) or not isinstance(data.get("targetTask"), str):
        return _answer_error("INVALID_REQUEST", "body is not a ReachRequest", retryable=False, status=400)
    return data


def _answer_error(code: str, message: str, *, retryable: bool, status: int = 200) -> web.Response:
    body = {"status": "AGENT_ERROR", "error": {"code": code, "message": message, "retryable": retryable}}
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def _answer_refusal(trace_id: str, task: str, exc: Decline | AgentError) -> tuple[web.Response, str]:
    """A handler's own refusal: DECLINED (not mine) or AGENT_ERROR (mine, and it failed)."""
    if isinstance(exc, Decline):
        log.info("[%s] decline: %s (%s)", trace_id, task, exc.reason)
        return _answer_declined(exc.reason), "declined"
    body = orjson.dumps({"status": "AGENT_ERROR", "error": exc.to_error()})
    return web.Response(body=body, content_type="application/json"), "agent_error"


def _stream_refusal(exc: BaseException) -> dict[str, Any] | None:
    """A streaming handler's own refusal as its ``done`` answer; None for any other error."""
    if isinstance(exc, Decline):
        return {"status": "DECLINED", "error": {"code": "DECLINED", "message": exc.reason}}
    if isinstance(exc, AgentError):
        return {"status": "AGENT_ERROR", "error": exc.to_error()}
    return None


def _answer_declined(reason: str) -> web.Response:
    # 422 as well as the status: a Router that predates declines reads a 4xx as the agent's
    # refusal (no failover), never as a failure that would count against the breaker.
    body = {"status": "DECLINED", "error": {"code": "DECLINED", "message": reason[:500]}}
    return web.Response(body=orjson.dumps(body), status=422, content_type="application/json")


def _deadline_from(header: str | None) -> Deadline | None:
    if not header:
        return None
    try:
        millis = float(header)
    except ValueError:
        return None
    return Deadline(SYSTEM_CLOCK, max(millis, 0.0))


def _loopback_host(url: str) -> bool:
    import ipaddress
    from urllib.parse import urlsplit

    host = (urlsplit(url).hostname or "").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def callback_trap(callback: str, router_url: str) -> str | None:
    """Why the Router will not reach ``callback``, when it is on loopback and the Router is not.

    Inside a container, or with the Router on another host, ``localhost`` is the Router's own
    machine: the agent registers fine and every call to it then fails to connect.
    """
    # With several Routers, any one off this machine would call its own machine.
    remote = [url for url in router_url.split(",") if not _loopback_host(url)]
    if not _loopback_host(callback) or not remote:
        return None
    router_url = remote[0]
    return (
        f"the callback URL {callback} is on loopback, but the Router at {router_url} is not: the "
        "Router will call its own machine, not this agent. Set REACH_CALLBACK_URL (or "
        "agent.network.endpoint) to an address the Router can reach, e.g. the service name in "
        "docker compose"
    )
