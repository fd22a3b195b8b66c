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
from tests.helpers import caller_leaves_plain_call, raw_post, scaled, until
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


async def _plain_call(
    router: RouterServer, body: dict[str, Any]
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A plain (not streamed) call on a raw socket, head and body in one write (the lane's way)."""
    port = int(router.url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw_post("/reach", orjson.dumps(body)))
    await writer.drain()
    return reader, writer


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
    body = orjson.dumps(envelope(timeoutMs=int(scaled(30_000)), retryCount=2))
    record = await caller_leaves_plain_call(router, raw_post("/reach", body))
    assert record.error is not None and ("caller gone", record.error["message"]) in record.events
    parts = router.app.parts
    for agent_id in ("first", "second"):
        assert parts.stats.snapshot(agent_id) == {
            "requests": 0,  # not judged: no success, no failure
            "successRate": 1.0,
            "p50LatencyMs": None,
            "inflight": 0,
        }
    assert parts.metrics.attempts.values.get(("caller_gone",)) == 1


async def test_a_caller_that_leaves_stops_only_its_own_call(router: RouterServer) -> None:
    """Two callers at one agent, on two connections; one leaves. The other's call goes on and
    gets its answer: a closed connection stops the call it served, and no other."""
    go = asyncio.Event()

    async def answers_later(conn: Conn) -> None:
        await go.wait()
        await conn.json({"status": "SUCCESS", "result": "late"})

    agent = await StreamAgent("shared", answers_later).start()
    records = _records(router)
    try:
        await agent.register(router.url)
        # The staying call is held at the agent while the other is made, left and recorded: its
        # read timeout (3 s by default, not scaled) must not end it first on a busy machine.
        held_ms = int(scaled(30_000))
        body = envelope(timeoutMs=held_ms, readTimeoutMs=held_ms)
        staying = asyncio.ensure_future(_answer_of(*await _plain_call(router, body)))
        _, leaving = await _plain_call(router, body)
        await until(lambda: len(agent.conns) == 2, "both calls at the agent")
        leaving.close()
        await until(lambda: records, "the leaver's record")
        assert records[0].error_code == "CALLER_GONE"
        go.set()
        answer = await asyncio.wait_for(staying, scaled(10))
    finally:
        await agent.stop()
    assert (answer["status"], answer["result"]) == ("SUCCESS", "late")


async def _answer_of(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> dict[str, Any]:
    """The JSON body of the answer on the connection a call was sent on."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = next(int(line[15:]) for line in lines if line.lower().startswith(b"content-length:"))
    body = await reader.readexactly(length)
    writer.close()
    return dict(orjson.loads(body))


async def test_a_streaming_caller_that_leaves_is_booked_to_the_caller() -> None:
    """A streaming caller that leaves while its agent thinks: the record said AGENT_ERROR
    STREAM_BROKEN (an agent's failure, on the dashboards) and kept no trace of the attempt it
    cut. It is the caller's now (CALLER_GONE), with the attempt's outcome ``caller_gone``."""

    async def thinks(conn: Conn) -> None:
        await conn.closed_by_router()

    async with RouterServer(RouterConfig.model_validate(POLICY)) as router:
        agent = await StreamAgent("thinker", thinks).start()
        records = _records(router)
        try:
            await agent.register(router.url)
            port = int(router.url.rsplit(":", 1)[1])
            raw = orjson.dumps(envelope(timeoutMs=int(scaled(30_000))))
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                b"POST /reach HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Accept: text/event-stream\r\nContent-Length: %d\r\n\r\n%s" % (len(raw), raw)
            )
            await until(lambda: len(agent.conns) == 1, "the call at the agent")
            writer.close()
            await until(lambda: records, "the request's record")
        finally:
            await agent.stop()
    record = records[0]
    assert (record.status, record.error_code) == ("INVALID_REQUEST", "CALLER_GONE")
    assert record.stream is not None and record.stream.ended == "caller_gone"
    assert [a.outcome for a in record.attempts] == ["caller_gone"]


# -- a stream that ends at a deadline ----------------------------------------------------------


@pytest.mark.parametrize(
    "done",
    [
        # The SDK's own done when the handler runs past the deadline the Router sent it.
        {"status": "AGENT_ERROR", "error": {"code": "DEADLINE_EXCEEDED", "message": "ran past the deadline"}},
        # A ReachResponse's TIMEOUT, from an agent that is itself a Router (or relays one).
        {"status": "TIMEOUT", "error": {"code": "TIMEOUT", "message": "the overall budget ran out"}},
    ],
    ids=["deadline_exceeded", "timeout_status"],
)
async def test_a_stream_whose_agent_reports_the_deadline_ends_timeout(done: dict[str, Any]) -> None:
    """An agent whose done says the deadline passed: the caller's done said AGENT_ERROR
    STREAM_BROKEN ("went idle", or an unknown status), and the agent was charged a failure. A
    deadline reached is TIMEOUT, and judges nobody."""

    async def late(conn: Conn) -> None:
        await conn.sse_head()
        await conn.chunk("half")
        await conn.done(done)

    async with RouterServer(RouterConfig.model_validate(POLICY)) as router:
        agent = await StreamAgent("late", late).start()
        records = _records(router)
        try:
            await agent.register(router.url)
            async with streamed(router, envelope()) as stream:
                ending = done_of(await stream.rest())
            await until(lambda: records, "the request's record")
        finally:
            await agent.stop()
        assert (ending["status"], ending["error"]["code"]) == ("TIMEOUT", "TIMEOUT"), ending
        assert records[0].stream is not None and records[0].stream.ended == "timeout"
        assert router.app.parts.stats.snapshot("late")["requests"] == 0  # not judged


class SlowClock:
    """A monotonic clock that runs at half the loop's speed: the request's deadline, read from
    it, is never quite the loop-time deadline the transport's reads are bounded by."""

    def __init__(self) -> None:
        self._origin = time.monotonic()

    def monotonic(self) -> float:
        return self._origin + (time.monotonic() - self._origin) / 2

    def time(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds * 2)


async def test_a_stream_cut_by_the_routers_deadline_ends_timeout() -> None:
    """The agent streams a chunk, then goes quiet past the deadline (its idle bound is longer):
    the transport's read timed out at the deadline, but the request's clock still had a moment
    left, and the end was STREAM_BROKEN "went idle". The read that timed out at the deadline is
    the deadline."""

    async def quiet(conn: Conn) -> None:
        await conn.sse_head()
        await conn.chunk("half")
        await conn.closed_by_router()

    policy = {**POLICY, "streaming": {"idle_timeout_ms": 600_000}}
    async with RouterServer(RouterConfig.model_validate(policy), clock=SlowClock()) as router:
        agent = await StreamAgent("quiet", quiet).start()
        try:
            await agent.register(router.url)
            async with streamed(router, envelope(timeoutMs=int(scaled(400)))) as stream:
                ending = done_of(await stream.rest())
        finally:
            await agent.stop()
    assert (ending["status"], ending["error"]["code"]) == ("TIMEOUT", "TIMEOUT"), ending


# -- shutdown ------------------------------------------------------------------------------------


async def test_a_stream_cut_by_shutdown_says_so() -> None:
    """A stream still running at the drain deadline: its done is TIMEOUT with code
    ROUTER_SHUTDOWN, and the trace and metrics label it ``shutdown``, not ``caller_gone`` (the
    caller never left). The attempt it cut is not judged."""

    async def endless(conn: Conn) -> None:
        await conn.sse_head()
        await conn.chunk("first")
        await conn.closed_by_router()

    policy = {**POLICY, "server": {"drain_timeout_seconds": 2}}
    router = RouterServer(RouterConfig.model_validate(policy))
    await router.__aenter__()
    agent = await StreamAgent("endless", endless).start()
    records = _records(router)
    try:
        await agent.register(router.url)
        async with streamed(router, envelope(timeoutMs=int(scaled(60_000)))) as stream:
            assert (await stream.next()).event == "chunk"
            # What RouterProcess.handle_exit does on SIGTERM (see tests/bounds/test_one_record.py).
            router.app.begin_drain(time.monotonic())
            router._server.should_exit = True
            ending = done_of(await stream.rest())
    finally:
        await router.__aexit__(None, None, None)
        await agent.stop()
    assert (ending["status"], ending["error"]["code"]) == ("TIMEOUT", "ROUTER_SHUTDOWN"), ending
    assert "shut down" in ending["error"]["message"]
    record = records[0]
    assert record.stream is not None and record.stream.ended == "shutdown"
    assert [a.outcome for a in record.attempts] == ["shutdown"]
    assert router.app.parts.metrics.streams.values.get(("shutdown",)) == 1
    assert router.app.parts.stats.snapshot("endless")["requests"] == 0


# -- repeated header fields ------------------------------------------------------------------------


async def test_two_accept_fields_are_read_as_one(router: RouterServer) -> None:
    """``Accept: text/event-stream`` then ``Accept: application/json``: only the last field was
    read, and the caller that asked for a stream got a plain answer. Repeated fields are one
    list (RFC 9110 §5.3), on the lane and through uvicorn's cycle alike."""

    async def streams(conn: Conn) -> None:
        await conn.sse_head()
        await conn.chunk("piece")
        await conn.done()

    agent = await StreamAgent("streamer", streams).start()
    try:
        await agent.register(router.url)
        port = int(router.url.rsplit(":", 1)[1])
        raw = orjson.dumps(envelope())
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /reach HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Accept: text/event-stream\r\nAccept: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(raw), raw)
        )
        async with asyncio.timeout(scaled(10)):
            answer = await reader.read(-1)
        writer.close()
    finally:
        await agent.stop()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"content-type: text/event-stream" in head.lower(), head
    assert b"event: chunk" in body and b"event: done" in body, body


async def test_an_sdk_handler_is_cancelled_when_its_plain_caller_leaves() -> None:
    """A plain call to an SDK agent whose handler waits (a model thinking): its caller leaves.
    The Router went on waiting, and the handler ran on after the Router closed (aiohttp does not
    cancel a handler whose client left). Now the Router closes the agent's connection at once
    and the SDK, seeing it, cancels the handler."""
    from reachmesh import AgentConfig, ReachAgent
    from reachmesh.ports import free_port

    cancelled = asyncio.Event()
    started = asyncio.Event()
    async with RouterServer(RouterConfig.model_validate(POLICY)) as router:
        port = free_port()
        config = AgentConfig.from_mapping(
            {
                "agent": {
                    "id": "thinker",
                    "network": {"endpoint": f"http://127.0.0.1:{port}/reach"},
                    "capabilities": [{"task": "talk"}],
                },
                "router": {"url": router.url},
            },
            env={},
        )
        agent = ReachAgent(config)

        @agent.capability("talk")
        async def talk(payload: dict[str, Any]) -> dict[str, Any]:
            started.set()
            try:
                await asyncio.Event().wait()
            finally:
                cancelled.set()
            return {}

        await agent.start()
        try:
            _, writer = await _plain_call(router, envelope(timeoutMs=int(scaled(30_000))))
            async with asyncio.timeout(scaled(5)):
                await started.wait()
            writer.close()
            async with asyncio.timeout(scaled(1.5)):
                await cancelled.wait()  # the Router's close, seen within the SDK's watch period
        finally:
            await agent.stop()
