"""How a call ends when its caller leaves, when a deadline ends its stream, and when the Router
shuts down (the loose ends of #34/#35). Real Router, raw agents and raw callers on loopback;
each test here failed on the code before its fix."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from reachmesh.config import RouterConfig
from reachmesh.decision import DecisionRecord
from reachmesh.server.asgi import Receive, Scope, Send
from reachmesh.testing import RouterServer
from tests.helpers import scaled, until
from tests.server.test_streaming import done_of, envelope, streamed
from tests.streaming_agents import Conn, StreamAgent

POLICY = {"health": {"enabled": False}}


class PassThrough:
    """An ASGI wrapper in front of the Router: no lane, every call through uvicorn's cycle."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


def _records(router: RouterServer) -> list[DecisionRecord]:
    records: list[DecisionRecord] = []
    router.app.parts.dispatcher.observers.append(records.append)
    return records


async def _plain_call(router: RouterServer, body: dict[str, Any]) -> asyncio.StreamWriter:
    """A plain (not streamed) call on a raw socket, head and body in one write (the lane's way)."""
    port = int(router.url.rsplit(":", 1)[1])
    raw = orjson.dumps(body)
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /reach HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(raw), raw)
    )
    await writer.drain()
    return writer


@pytest.fixture(params=["lane", "asgi"])
async def router(request: pytest.FixtureRequest) -> AsyncIterator[RouterServer]:
    middleware = PassThrough if request.param == "asgi" else None
    async with RouterServer(RouterConfig.model_validate(POLICY), middleware=middleware) as server:
        yield server


async def test_a_plain_caller_that_leaves_stops_its_call(router: RouterServer) -> None:
    """A caller that closes its connection while the agent thinks: the Router closed the agent's
    connection only when the agent's read timeout came, then failed over to the next agent (a
    second run of the request, for nobody), and booked the timeout to the first agent. Now the
    call stops at once (the agent sees its connection close within a second), no other agent is
    tried, and the outcome is the caller's: neither agent judged, no slot or count left held."""
    closed = asyncio.Event()

    async def thinks(conn: Conn) -> None:
        await conn.closed_by_router()
        closed.set()

    agents = [await StreamAgent(name, thinks).start() for name in ("first", "second")]
    records = _records(router)
    try:
        for agent in agents:
            await agent.register(router.url, max_concurrency=1)
        writer = await _plain_call(router, envelope(timeoutMs=int(scaled(30_000)), retryCount=2))
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
    assert ("caller gone", record.error["message"]) in record.events
    parts = router.app.parts
    for agent in agents:
        assert parts.stats.snapshot(agent.agent_id) == {
            "requests": 0,  # not judged: no success, no failure
            "successRate": 1.0,
            "p50LatencyMs": None,
            "inflight": 0,
        }
        assert parts.capacity.inflight(agent.agent_id) == 0
        breaker = parts.breakers._get(agent.agent_id, "talk")
        assert breaker is None or breaker.failures == 0
    assert parts.metrics.attempts.values.get(("caller_gone",)) == 1
