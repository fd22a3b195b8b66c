"""Test helpers for Agent-Reach users and for this project's own suite.

- :class:`RouterServer`: a real Router on a loopback port, inside the current event loop.
- :class:`FakeAgent`: a real HTTP agent on loopback whose behaviour a test sets on command:
  answer, delay, error (retryable or not), HTTP 500, reset the connection, or refuse (stopped).
- :class:`FakeTransport`: the Router's HTTP edge in process, agents scripted with faults on
  command (no sockets); with a ManualClock, latency moves the clock instead of sleeping.
- :class:`~reachmesh.clock.ManualClock` is re-exported for timed decisions without sleeping.
"""

from __future__ import annotations

import asyncio
import errno
import ssl
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import aiohttp
import uvicorn
from aiohttp import web

from reachmesh import jsoncodec
from reachmesh.clock import ManualClock
from reachmesh.config import RouterConfig
from reachmesh.ports import free_port
from reachmesh.protocol import UNKNOWN_TASK
from reachmesh.server.app import RouterApp
from reachmesh.server.asgi import Receive, Scope, Send
from reachmesh.server.serve import RouterProcess, uvicorn_config
from reachmesh.transport.fake import Answer, FakeEndpoint, FakeTransport

__all__ = [
    "Answer",
    "AsgiServer",
    "BackgroundLoop",
    "FakeAgent",
    "FakeEndpoint",
    "FakeTransport",
    "ManualClock",
    "RouterServer",
    "free_port",
    "wait_vectors",
]

ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
Mode = Literal["ok", "error", "retryable_error", "unknown_task", "http500", "reset", "garbage", "decline"]


async def _serve_until_started(server: uvicorn.Server, what: str) -> asyncio.Task[None]:
    """Start ``server`` in the running loop; return once it listens (raise if it cannot)."""
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError(f"{what} did not start")
        await asyncio.sleep(0.01)
    return task


async def _stop(server: uvicorn.Server, task: asyncio.Task[None] | None) -> None:
    server.should_exit = True
    if task is not None:
        await task


class AsgiServer:
    """Serve any ASGI app on ``127.0.0.1`` in the running loop (``async with``): a framework's
    own server (an a2a-sdk agent, say) beside a Router in a test."""

    def __init__(self, app: ASGIApp, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="auto")
        config.setup_event_loop = lambda: None  # type: ignore[method-assign]
        self._server = uvicorn.Server(config)
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> AsgiServer:
        self._task = await _serve_until_started(self._server, "the server")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await _stop(self._server, self._task)


def with_defaults(config: RouterConfig, defaults: dict[str, dict[str, Any]]) -> RouterConfig:
    """``config`` with each key of ``defaults`` (section -> key -> value) the config left unset.

    A key counts as set when the policy it was validated from named it, so a test that asks for
    ``embedding.backend: local`` keeps it, and one that says nothing gets the default.
    """
    updates: dict[str, Any] = {}
    for section, values in defaults.items():
        current = getattr(config, section)
        unset = {key: value for key, value in values.items() if key not in current.model_fields_set}
        if unset:
            updates[section] = type(current).model_validate(
                {**current.model_dump(exclude_unset=True), **unset}
            )
    return config.model_copy(update=updates) if updates else config


class RouterServer:
    """Serve a :class:`RouterApp` on ``127.0.0.1`` in the running loop (``async with``).

    :attr:`defaults` are policy keys applied under every config that does not set them: a suite
    sets them once, e.g. no lag shedding and no embedder unless a test asks for one.
    """

    defaults: ClassVar[dict[str, dict[str, Any]]] = {}

    def __init__(
        self,
        config: RouterConfig | None = None,
        *,
        middleware: Callable[[ASGIApp], ASGIApp] | None = None,
        port: int | None = None,
        **app_kwargs: Any,
    ) -> None:
        """``middleware(app)`` wraps what is served, e.g. to hold some replies back in a test;
        ``port`` is where to listen (a wrapper that must know its own URL picks it first)."""
        self.app = RouterApp(with_defaults(config or RouterConfig(), self.defaults), **app_kwargs)
        self.port = port or free_port()
        scheme = "https" if self.app.config.server.tls_cert_file else "http"
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self._server = RouterProcess(uvicorn_config(self.app, "127.0.0.1", self.port), self.app)
        if middleware is not None:
            # uvicorn loads `config.app` when it starts serving, so the wrapper is what it serves.
            self._server.config.app = middleware(self.app)
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> RouterServer:
        self._server.config.setup_event_loop = lambda: None  # type: ignore[method-assign]
        self._task = await _serve_until_started(self._server, "the Router")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await _stop(self._server, self._task)


@dataclass
class FakeAgent:
    """A real agent on loopback for tests; set ``mode`` and ``delay_s`` at any time."""

    agent_id: str
    tasks: tuple[str, ...] = ("echo",)
    mode: Mode = "ok"
    delay_s: float = 0.0
    # Requests wait for this event (after ``delay_s``) when it is set here: a test holds answers
    # back until it has seen what it needs, however slow the machine. It must belong to the
    # agent's loop; stop() sets it for good, so held requests end with the agent.
    hold: asyncio.Event | None = None
    weight: float = 1.0
    input_schema: dict[str, Any] | None = None
    descriptions: dict[str, str] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)
    limits: dict[str, list[str]] = field(default_factory=dict)
    result: Any = None
    # Exact answer bytes, sent instead of an envelope built from ``result``; ``chunked`` streams
    # them in small pieces with no Content-Length, as a generating LLM agent would.
    raw_answer: bytes | None = None
    chunked: bool = False
    healthy: bool = True
    health_interval_s: float = 15.0
    health_timeout_ms: int = 5000
    conversations: set[str] = field(default_factory=set)
    received: list[dict[str, Any]] = field(default_factory=list)
    raw_received: list[bytes] = field(default_factory=list)
    health_probes: int = 0
    headers: list[dict[str, str]] = field(default_factory=list)
    port: int = field(default_factory=free_port)
    lease_id: str | None = None
    # PROTOCOL §15: the most requests it wants in flight; and whether its capabilities are
    # idempotent (the Router may then send a request again whose outcome it does not know).
    max_concurrency: int | None = None
    idempotent: bool = False
    # Serve HTTPS with this context (its certificate must cover 127.0.0.1); None serves HTTP.
    ssl_context: ssl.SSLContext | None = None
    _runner: web.AppRunner | None = None
    _started: bool = False

    @property
    def endpoint(self) -> str:
        scheme = "https" if self.ssl_context is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}/reach"

    def profile(self) -> dict[str, Any]:
        """The registration body for this agent."""
        caps = []
        for task in self.tasks:
            cap: dict[str, Any] = {"task": task, "routing_weight": self.weight}
            if self.input_schema is not None:
                cap["input_schema"] = self.input_schema
            if task in self.descriptions:
                cap["description"] = self.descriptions[task]
            if task in self.examples:
                cap["examples"] = self.examples[task]
            if task in self.limits:
                cap["limits"] = self.limits[task]
            if self.idempotent:
                cap["idempotent"] = True
            caps.append(cap)
        profile: dict[str, Any] = {
            "id": self.agent_id,
            "network": {"endpoint": self.endpoint},
            "capabilities": caps,
            "health_check": {
                "interval_seconds": self.health_interval_s,
                "timeout_ms": self.health_timeout_ms,
            },
        }
        if self.max_concurrency is not None:
            profile["max_concurrency"] = self.max_concurrency
        return profile

    async def start(self) -> FakeAgent:
        app = web.Application()
        app.router.add_post("/reach", self._handle)
        app.router.add_get("/healthz", self._health)
        app.router.add_get("/reach/conversations/{conversation_id}", self._holds)
        # A test agent stops at once: handlers still sleeping (a "stuck" agent) are cut off.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        first_start = not self._started
        for attempt in range(3):
            try:
                await web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=self.ssl_context).start()
                break
            except OSError as exc:
                # The port was chosen free when the agent was made, and a Router or another
                # test's server may have bound it since (a slow fixture in between). Before a
                # first start nothing has been told the port, so another free one is as good;
                # a restart keeps its port, as a real agent coming back would.
                if exc.errno != errno.EADDRINUSE or not first_start or attempt == 2:
                    await self._runner.cleanup()
                    self._runner = None
                    raise
                self.port = free_port()
        self._started = True
        return self

    async def stop(self) -> None:
        """Stop listening: from now on connections are refused."""
        if self.hold is not None:  # held requests end now, not at the runner's shutdown timeout
            self.hold.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def register(
        self,
        router_url: str,
        *,
        vectors: bool = True,
        router_tls: ssl.SSLContext | None = None,
        token: str | None = None,
        admin_token: str | None = None,
    ) -> str:
        """Register with the Router; returns the lease id.

        With ``vectors`` (the default) it returns once the Router can route to this agent by
        meaning too, so a test never races the embedding queue. ``router_tls`` trusts an HTTPS
        Router's test CA. With auth on, ``token`` registers (an agent token) and
        ``admin_token`` reads the agent's vector state.
        """
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with aiohttp.ClientSession() as http:
            async with http.post(
                f"{router_url}/agents", json=self.profile(), ssl=router_tls or True, headers=headers
            ) as resp:
                answer = await resp.json()
                if resp.status not in (200, 201):
                    raise RuntimeError(f"registration failed: {resp.status} {answer}")
            self.lease_id = str(answer["leaseId"])
        if vectors:
            await wait_vectors(router_url, self.agent_id, router_tls=router_tls, token=admin_token)
        return self.lease_id

    async def _health(self, request: web.Request) -> web.Response:
        self.health_probes += 1
        return web.json_response(
            {"status": "ok" if self.healthy else "failing"}, status=200 if self.healthy else 503
        )

    async def _holds(self, request: web.Request) -> web.Response:
        return web.json_response({"holds": request.match_info["conversation_id"] in self.conversations})

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        envelope = jsoncodec.loads(raw)
        self.raw_received.append(raw)
        self.received.append(envelope)
        self.headers.append(dict(request.headers))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.hold is not None:
            await self.hold.wait()
        mode = self.mode
        if mode == "reset":
            assert request.transport is not None
            request.transport.abort()
            return web.Response(status=200)
        if mode != "ok":
            return self._misbehave(mode)
        if self.raw_answer is not None:
            return await self._send_raw(request, self.raw_answer)
        result = (
            self.result
            if self.result is not None
            else {"agent": self.agent_id, "echo": envelope.get("payload")}
        )
        return web.Response(
            body=jsoncodec.dumps({"status": "SUCCESS", "result": result}), content_type="application/json"
        )

    def _misbehave(self, mode: Mode) -> web.Response:
        if mode == "http500":
            return web.Response(status=500, text="boom")
        if mode == "garbage":
            return web.Response(status=200, text="<html>not json</html>")
        if mode == "decline":
            declined = {"code": "DECLINED", "message": f"{self.agent_id} declines on purpose"}
            return web.json_response({"status": "DECLINED", "error": declined}, status=422)
        if mode == "unknown_task":  # as an SDK agent whose registration is older than its code
            error = {
                "code": UNKNOWN_TASK,
                "message": f"agent {self.agent_id} has no handler",
                "retryable": True,
            }
            return web.json_response({"status": "AGENT_ERROR", "error": error})
        error = {
            "code": "FAKE_FAILURE",
            "message": f"{self.agent_id} failed on purpose",
            "retryable": mode == "retryable_error",
        }
        return web.json_response({"status": "AGENT_ERROR", "error": error})

    async def _send_raw(self, request: web.Request, raw: bytes) -> web.StreamResponse:
        if not self.chunked:
            return web.Response(body=raw, content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for start in range(0, len(raw), 16 * 1024):
            await resp.write(raw[start : start + 16 * 1024])
        await resp.write_eof()
        return resp


async def wait_vectors(
    router_url: str,
    agent_id: str,
    timeout_s: float = 60.0,
    *,
    router_tls: ssl.SSLContext | None = None,
    token: str | None = None,
) -> None:
    """Wait until the Router says an agent's capability vectors are no longer pending, and its
    few-shot head has been retrained on them, so a route by meaning is decided as it will be
    (``token``: an admin token, with auth on)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    url = f"{router_url}/admin/agents/{agent_id}"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as http:
        while loop.time() < end:
            async with http.get(url, ssl=router_tls or True, headers=headers) as resp:
                status = await resp.json()
            if status.get("vectors") != "pending" and status.get("head") != "training":
                return
            await asyncio.sleep(0.02)
    raise TimeoutError(f"{url}: capability vectors still pending after {timeout_s:g} s")


# How long BackgroundLoop.close waits for the tasks it cancelled: one that swallows its
# cancellation must not hang the test's teardown.
_CANCEL_WAIT_S = 5.0


async def _cancel_pending() -> None:
    """Cancel every task of the running loop but the caller's, and wait for them to end."""
    current = asyncio.current_task()
    pending = [task for task in asyncio.all_tasks() if task is not current and not task.done()]
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending, timeout=_CANCEL_WAIT_S)


class BackgroundLoop:
    """An event loop on its own thread, for driving async servers from synchronous tests.

    ``with BackgroundLoop() as bg: router = bg.run(RouterServer().__aenter__())``; everything
    started on it is torn down by :meth:`close` in reverse order of :meth:`on_close`.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="reach-bg-loop", daemon=True)
        self._closers: list[Callable[[], Awaitable[object]]] = []
        self._thread.start()

    def run(self, coro: Awaitable[Any], timeout: float = 30) -> Any:
        """Run ``coro`` on the background loop and return its result."""

        async def wrap() -> Any:
            return await coro

        return asyncio.run_coroutine_threadsafe(wrap(), self.loop).result(timeout)

    def on_close(self, closer: Callable[[], Awaitable[object]]) -> None:
        self._closers.append(closer)

    def __enter__(self) -> BackgroundLoop:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for closer in reversed(self._closers):
            self.run(closer())
        # What the closers left running (a slow agent's handler that aiohttp's shutdown timeout
        # gave up on) is cancelled and awaited here: a loop closed with it pending destroys the
        # task later, printing "Task was destroyed but it is pending" into the test's output.
        self.run(_cancel_pending(), timeout=_CANCEL_WAIT_S + 5)
        self.run(self.loop.shutdown_asyncgens())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()
