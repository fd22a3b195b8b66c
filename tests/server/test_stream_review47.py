"""A second reading of the streaming path (#35): each test here failed on the code it was found
in. Real Router, raw agents and raw callers on loopback."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from unittest.mock import ANY

import orjson
import pytest

from reachmesh.config import RouterConfig
from reachmesh.testing import RouterServer
from tests.helpers import scaled, until
from tests.server.test_streaming import chunks_of, done_of, envelope, streamed
from tests.streaming_agents import SSE_HEAD, Conn, StreamAgent


@pytest.fixture
async def router() -> AsyncIterator[RouterServer]:
    async with RouterServer(RouterConfig.model_validate({"health": {"enabled": False}})) as server:
        yield server


async def _raw_call(router: RouterServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A streamed call on a raw socket: it can leave before the Router sends any head."""
    port = int(router.url.rsplit(":", 1)[1])
    body = orjson.dumps(envelope(timeoutMs=int(scaled(30_000))))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /reach HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Accept: text/event-stream\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    return reader, writer


async def test_a_caller_gone_before_the_first_chunk_leaves_no_call_in_flight(router: RouterServer) -> None:
    """A caller that leaves while its agent is still thinking (no chunk yet): the attempt is
    cancelled mid-read, and the agent's in-flight count (reach_agent_inflight_requests, the
    admin page) must come back down; it stayed up by one for good, one more per such caller."""
    closed = asyncio.Event()

    async def thinks(conn: Conn) -> None:
        await conn.closed_by_router()  # no head, no chunk: the agent is still thinking
        closed.set()

    agent = await StreamAgent("thinker", thinks).start()
    try:
        await agent.register(router.url)
        stats = router.app.parts.dispatcher.forwarding.stats
        _, writer = await _raw_call(router)
        await until(lambda: len(agent.conns) == 1, "the call at the agent")
        assert stats.snapshot("thinker")["inflight"] == 1
        writer.close()
        async with asyncio.timeout(scaled(1.0)):
            await closed.wait()  # the Router closed the agent's connection within a second
        await until(lambda: router.app.parts.dispatcher.streams_in_flight == 0, "the request's end")
        assert stats.snapshot("thinker")["inflight"] == 0
    finally:
        await agent.stop()


async def test_a_stream_failed_after_its_first_chunk_is_not_a_success(router: RouterServer) -> None:
    """The done event's ``attempts`` (and reach_upstream_attempts_total) said SUCCESS for an
    attempt whose stream then broke, or whose done carried the agent's error: the caller read
    status AGENT_ERROR beside an attempt list with no failure in it."""
    script_of = {
        "resets": lambda conn: _then(conn, conn.reset),
        "refuses": lambda conn: _then(conn, lambda: conn.done(_AGENT_ERROR)),
    }
    expected = {"resets": ("STREAM_BROKEN", "connect_error"), "refuses": ("NOPE", "agent_error")}
    for name, script in script_of.items():
        agent = await StreamAgent(name, script, task=name).start()
        try:
            await agent.register(router.url)
            async with streamed(router, {**envelope(), "targetTask": name}) as stream:
                done = done_of(await stream.rest())
            code, outcome = expected[name]
            assert done["status"] == "AGENT_ERROR" and done["error"]["code"] == code
            assert done["attempts"] == [{"agentId": name, "outcome": outcome, "durationMs": ANY}]
            counted = router.app.parts.metrics.attempts.values
            assert counted.get(("SUCCESS",)) is None, counted
        finally:
            await agent.stop()


_AGENT_ERROR = {"status": "AGENT_ERROR", "error": {"code": "NOPE", "message": "no", "retryable": False}}


async def _then(conn: Conn, end: Callable[[], object]) -> None:
    """A head, one chunk, then ``end`` (a reset, or a done with an error)."""
    await conn.sse_head()
    await conn.chunk("half")
    ended = end()
    if asyncio.iscoroutine(ended):
        await ended
        await conn.closed_by_router()


async def test_events_before_a_malformed_line_in_the_same_read_are_relayed() -> None:
    """An agent that writes its chunk, its done, then a line over the bound, in one write: the
    parser's fault dropped the events read with it, so the caller got a failure (here the only
    agent's first piece: an error, no chunk) where, with the fault in a later read, it got the
    chunk and the done. The answer no longer depends on where the reads fall."""
    policy = {"health": {"enabled": False}, "streaming": {"max_line_bytes": 1024}}

    async def sloppy(conn: Conn) -> None:
        await conn.write(
            SSE_HEAD + b'event: chunk\ndata: "whole"\n\nevent: done\ndata: {"status": "SUCCESS"}\n\n'
            b"data: " + b"x" * 4096 + b"\n\n"
        )
        await conn.closed_by_router()

    async with RouterServer(RouterConfig.model_validate(policy)) as router:
        agent = await StreamAgent("sloppy", sloppy).start()
        try:
            await agent.register(router.url)
            async with streamed(router, envelope()) as stream:
                events = await stream.rest()
            assert done_of(events)["status"] == "SUCCESS"
            assert chunks_of(events) == ["whole"]
        finally:
            await agent.stop()


async def test_a_caller_that_stops_reading_holds_its_agent_no_longer_than_the_deadline(
    router: RouterServer,
) -> None:
    """A caller that keeps its connection open but stops reading: the relay's write to it
    waited without bound, past the request's deadline, and since a stream holds its agent's
    capacity slot to its end, an agent of capacity 1 was lost to every other caller for as long
    as that connection stayed open. At the deadline the stream now ends (TIMEOUT, nothing
    charged to the agent), the agent's connection is closed and its slot given back."""
    closed = asyncio.Event()

    async def talks(conn: Conn) -> None:
        await conn.sse_head()
        for _ in range(1024):  # 16 MiB: far more than the sockets and the Router hold
            await conn.chunk("x" * 16384)
        await conn.done()

    async def ends(conn: Conn) -> None:
        await conn.closed_by_router()
        closed.set()

    agent = await StreamAgent("busy", lambda conn: _both(conn, talks, ends)).start()
    try:
        await agent.register(router.url, max_concurrency=1)
        capacity = router.app.parts.dispatcher.forwarding.capacity
        deadline_ms = int(scaled(1.0) * 1000)
        port = int(router.url.rsplit(":", 1)[1])
        body = orjson.dumps(envelope(timeoutMs=deadline_ms))
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        # The caller never reads: its reader stops taking bytes past 2 KiB, its socket fills up.
        _, writer = await asyncio.open_connection(sock=sock, limit=1024)
        writer.write(
            b"POST /reach HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Accept: text/event-stream\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        try:
            await until(lambda: capacity.inflight("busy") == 1, "the stream under way")
            async with asyncio.timeout(scaled(1.0) + scaled(3.0)):
                await closed.wait()  # the Router closed the agent's connection
            await until(lambda: capacity.inflight("busy") == 0, "the slot given back")
            stats = router.app.parts.dispatcher.forwarding.stats
            assert stats.snapshot("busy")["successRate"] == 1.0  # the caller's doing, not the agent's
            streams = router.app.parts.metrics.streams
            await until(lambda: streams.values.get(("timeout",)) == 1, "the stream counted, once")
        finally:
            writer.close()
    finally:
        await agent.stop()


Script = Callable[[Conn], Awaitable[None]]


async def _both(conn: Conn, talk: Script, end: Script) -> None:
    """``talk`` while ``end`` watches for the Router closing the connection."""
    watch = asyncio.ensure_future(end(conn))
    try:
        await talk(conn)
        await watch
    except (ConnectionError, OSError):
        await watch
