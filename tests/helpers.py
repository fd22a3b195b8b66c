"""Small helpers shared by tests: scaled deadlines, polls that say what they waited for, CPU hogs."""

from __future__ import annotations

import asyncio
import inspect
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar, overload

import httpx
import pytest

from reachmesh.config import RouterConfig
from reachmesh.decision import DecisionRecord
from reachmesh.observability.logging import TRACE_LOGGER, split_lines
from reachmesh.testing import FakeAgent, RouterServer
from tests.streaming_agents import Conn, StreamAgent

T = TypeVar("T")


def _time_scale() -> float:
    """REACH_TEST_TIME_SCALE if set; else 3 when the machine is already busy (a load average
    above its core count), else 1."""
    raw = os.environ.get("REACH_TEST_TIME_SCALE", "").strip()
    if raw:
        return float(raw)
    return 3.0 if os.getloadavg()[0] > (os.cpu_count() or 1) else 1.0


# One factor for every deadline of the suite: 1 on a quiet machine, 3 on CI and busy machines.
# Deadlines only bound how long a poll may wait; a passing test ends as soon as its condition
# holds, so a large factor costs nothing when all is well.
TIME_SCALE = _time_scale()


def scaled(seconds: float) -> float:
    """``seconds`` times the suite's time scale."""
    return seconds * TIME_SCALE


def describe(check: Callable[..., Any]) -> str:
    """The first source line of ``check`` (a lambda reads as what it waits for)."""
    try:
        return inspect.getsource(check).strip().splitlines()[0][:160]
    except (OSError, TypeError):
        return getattr(check, "__qualname__", repr(check))


@overload
async def until(
    check: Callable[[], Awaitable[T | None]], what: str = "", within: float = 10.0, interval: float = 0.02
) -> T: ...


@overload
async def until(
    check: Callable[[], T | None], what: str = "", within: float = 10.0, interval: float = 0.02
) -> T: ...


async def until(
    check: Callable[[], Any], what: str = "", within: float = 10.0, interval: float = 0.02
) -> Any:
    """Poll ``check`` (sync or async) until it returns something truthy, and return that.

    The deadline is ``within`` seconds, scaled; on expiry the error names ``what`` was awaited (or the
    check's source line) and the last value seen.
    """
    loop = asyncio.get_running_loop()
    end = loop.time() + scaled(within)
    last: Any = None
    while True:
        value = check()
        last = await value if inspect.isawaitable(value) else value
        if last:
            return last
        if loop.time() >= end:
            raise AssertionError(
                f"waited {scaled(within):g} s for {what or describe(check)}; last value {last!r}"
            )
        await asyncio.sleep(interval)


def log_lines(caplog: pytest.LogCaptureFixture, logger: str = TRACE_LOGGER) -> list[str]:
    """Every line logged by ``logger``; a request's trace lines arrive as one multi-line record."""
    return [text for r in caplog.records if r.name == logger for text, _ in split_lines(r)]


@contextmanager
def cpu_hogs(count: int | None = None, limit_s: float = 120.0) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``count`` processes (default: one per core) that burn CPU until the block ends.

    Each one also ends itself after ``limit_s``, so none outlives a test killed from outside.
    """
    hogs: list[subprocess.Popen[bytes]] = []
    script = f"import time\nend = time.monotonic() + {limit_s}\nwhile time.monotonic() < end: pass\n"
    try:
        for _ in range(count if count is not None else os.cpu_count() or 1):
            hogs.append(subprocess.Popen([sys.executable, "-c", script]))
        yield hogs
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()


def hogs_running(hogs: list[subprocess.Popen[bytes]]) -> bool:
    """Every hog is still burning CPU (a hog that died would make a saturation test vacuous)."""
    return all(hog.poll() is None for hog in hogs)


def price_agent() -> FakeAgent:
    """The reference price agent (not started): a description and a few examples, zh and en."""
    return FakeAgent(
        "price-agent",
        tasks=("query_product_price",),
        descriptions={"query_product_price": "查询指定商品的当前售价"},
        examples={
            "query_product_price": [
                "这个多少钱",
                "what is the price of this item",
                "苹果多少钱一斤",
                "how much does it cost",
            ]
        },
    )


async def caller_leaves_plain_call(router: RouterServer, request: bytes) -> DecisionRecord:
    """A caller that leaves a plain (not streamed) call while its agent thinks, and what the
    Router must do about it: stop the call at once (it closes the agent's connection within a
    second), try no other agent, and book it to the caller (``CALLER_GONE``, the attempt's
    outcome ``caller_gone``), leaving neither agent a slot held or a breaker failure.

    Two raw agents ``first`` and ``second`` (task ``talk``, capacity 1) think until the Router
    closes their connection; ``request`` is the whole raw HTTP request (head and body), sent on
    one connection that is closed once the call is at an agent. Returns the call's record."""
    closed = asyncio.Event()

    async def thinks(conn: Conn) -> None:
        await conn.closed_by_router()
        closed.set()

    agents = [await StreamAgent(name, thinks).start() for name in ("first", "second")]
    records: list[DecisionRecord] = []
    router.app.parts.dispatcher.observers.append(records.append)
    try:
        for agent in agents:
            await agent.register(router.url, max_concurrency=1)
        port = int(router.url.rsplit(":", 1)[1])
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        await writer.drain()
        await until(lambda: sum(len(a.conns) for a in agents) == 1, "the call at an agent")
        writer.close()
        async with asyncio.timeout(scaled(1.0)):
            await closed.wait()  # the Router closed the agent's connection within a second
        await until(lambda: records, "the request's record")
    finally:
        for agent in agents:
            await agent.stop()
    record = records[0]
    assert sum(len(a.conns) for a in agents) == 1  # no failover after the caller left
    assert (record.status, record.error_code) == ("INVALID_REQUEST", "CALLER_GONE")
    assert [a.outcome for a in record.attempts] == ["caller_gone"]
    parts = router.app.parts
    for agent in agents:
        assert parts.capacity.inflight(agent.agent_id) == 0
        breaker = parts.breakers._get(agent.agent_id, "talk")
        assert breaker is None or breaker.failures == 0
    return record


def raw_post(path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    """A whole HTTP/1.1 POST of a JSON ``body``, head and body in one piece (the Router's lane)."""
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{extra}"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def peer_from_header(app: Any) -> Any:
    """``app`` behind a stand-in for the network: each request's peer address is the one its
    ``X-Test-Peer`` header names (an IPv6 caller's, which loopback cannot give)."""

    async def served(scope: dict[str, Any], receive: Any, send: Any) -> None:
        for name, value in scope.get("headers", ()):
            if name == b"x-test-peer":
                scope = {**scope, "client": (value.decode(), 40_000)}
        await app(scope, receive, send)

    return served


@asynccontextmanager
async def one_slot_held(
    agent_id: str,
) -> AsyncIterator[tuple[httpx.AsyncClient, Any, asyncio.Event, asyncio.Task[httpx.Response]]]:
    """A Router and an agent of ``max_concurrency: 1`` (task ``slow``) whose one slot a long call
    holds until the event is set: yields the client, the Router's capacity board, the event and
    the long call. On the way out the call is let go and the agent stopped."""
    config = RouterConfig.model_validate(
        {
            "embedding": {"backend": "none"},
            "health": {"enabled": False},
            "limits": {"loop_lag_ms": 10_000},
            # The long call waits at the agent for as long as the test takes, on any machine.
            "timeouts": {"read_ms": 120_000},
        }
    )
    async with RouterServer(config) as router:
        release = asyncio.Event()
        agent = FakeAgent(agent_id, tasks=("slow",), hold=release, max_concurrency=1)
        await agent.start()
        board = router.app.parts.capacity
        async with httpx.AsyncClient(base_url=router.url, timeout=scaled(60)) as http:
            try:
                assert (await http.post("/agents", json=agent.profile())).status_code == 201
                held = asyncio.create_task(
                    http.post("/reach", json={"targetTask": "slow", "preferences": {"timeoutMs": 120_000}})
                )
                await until(lambda: board.inflight(agent_id) == 1, "the long call holds the slot")
                yield http, board, release, held
            finally:
                release.set()
                await agent.stop()
