"""A streamed call is bounded like a plain one (protocol §14): it takes a room under the Router's
connection caps (``outbound.max_connections*``) for as long as it runs, and its answer head has
the plain answer's bounds (``server.response_max_*``). Real Router, raw agents on loopback."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from reachmesh.testing import FakeAgent
from tests.helpers import scaled, until
from tests.server.test_streaming import (
    STREAM_HEADERS,
    agents,
    chunks_of,
    done_of,
    envelope,
    router_with,
    streamed,
)
from tests.streaming_agents import Conn

__all__ = ["agents", "router_with"]  # the fixtures, used by name


def head_with(headers: list[bytes]) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n" + b"".join(headers) + b"\r\n"


@pytest.mark.parametrize(
    "extra",
    [
        [b"X-Filler-%d: v\r\n" % n for n in range(500)],  # over response_max_headers (100)
        [b"X-Filler-%d: %s\r\n" % (n, b"v" * 1000) for n in range(60)],  # 60 KB: over the 32 KiB head
        [b"X-Long: " + b"v" * 20_000 + b"\r\n"],  # one line over response_max_line_bytes
    ],
    ids=["count", "bytes", "line"],
)
async def test_a_huge_answer_head_to_a_stream_request_is_a_structured_error(
    router_with, agents, extra: list[bytes]
) -> None:
    router = await router_with()

    async def script(conn: Conn) -> None:
        await conn.write(head_with(extra))
        await conn.chunk("never relayed")
        await conn.done()

    await agents("hostile", script, router)
    async with httpx.AsyncClient(timeout=scaled(10)) as http:
        resp = await http.post(f"{router.url}/reach", json=envelope(), headers=STREAM_HEADERS)
        assert resp.status_code == 503  # no chunk went out: one plain ReachResponse
        body = resp.json()
        assert body["status"] == "NO_AVAILABLE_HANDLER"
        (candidate,) = body["error"]["candidates"]
        assert candidate["reason"] == "agent_error"
        trace = (await http.get(f"{router.url}/admin/traces/{body['traceId']}")).json()
    (hop,) = trace["hops"]
    assert hop["stream"]["chunks"] == 0 and [a["outcome"] for a in hop["attempts"]] == ["agent_error"]


async def test_streams_take_their_room_under_the_per_agent_connection_cap(router_with, agents) -> None:
    """Two held streams fill a cap of two connections to the agent: a plain call to it waits for
    a room and runs out of time (on the old code it went straight through on its own pool);
    once the streams end, the room is back."""
    router = await router_with({"outbound": {"max_connections_per_agent": 2}})
    release = asyncio.Event()
    held: list[Conn] = []

    async def script(conn: Conn) -> None:
        if conn.header("Accept") != "text/event-stream":
            await conn.json({"status": "SUCCESS", "result": {"plain": True}})
            return
        held.append(conn)
        await conn.sse_head()
        await conn.chunk(len(held))
        await release.wait()
        await conn.done()

    agent = await agents("talker", script, router)

    async def one_stream() -> list[Any]:
        async with streamed(router, envelope()) as stream:
            return [await stream.next(), *await stream.rest()]

    streams = [asyncio.create_task(one_stream()) for _ in range(2)]
    await until(lambda: len(held) == 2, "two streams held")
    async with httpx.AsyncClient(timeout=scaled(10)) as http:
        budget = {"timeoutMs": int(scaled(0.5) * 1000)}
        squeezed = (await http.post(f"{router.url}/reach", json=envelope(**budget))).json()
        assert squeezed["status"] != "SUCCESS", squeezed
        assert len(agent.conns) == 2  # the plain call never got a connection to the agent
        release.set()
        for task in streams:
            assert done_of(await task)["status"] == "SUCCESS"
        again = (await http.post(f"{router.url}/reach", json=envelope())).json()
        assert again["status"] == "SUCCESS" and again["result"] == {"plain": True}


async def test_a_third_stream_waits_for_a_room_then_runs(router_with, agents) -> None:
    router = await router_with({"outbound": {"max_connections_per_agent": 2}})
    release = asyncio.Event()
    seen = 0
    most = 0
    open_now = 0

    async def script(conn: Conn) -> None:
        nonlocal seen, most, open_now
        seen += 1
        open_now += 1
        most = max(most, open_now)
        await conn.sse_head()
        await conn.chunk("x")
        if seen <= 2:
            await release.wait()
        open_now -= 1
        await conn.done()

    await agents("talker", script, router)

    async def one_stream() -> list[Any]:
        async with streamed(router, envelope()) as stream:
            return [await stream.next(), *await stream.rest()]

    streams = [asyncio.create_task(one_stream()) for _ in range(3)]
    await until(lambda: seen >= 2, "two streams open")
    release.set()
    results = await asyncio.gather(*streams)
    assert [chunks_of(events) for events in results] == [["x"]] * 3
    assert seen == 3 and most <= 2


@pytest.mark.parametrize("size", [300 * 1024, 900 * 1024])
async def test_a_large_plain_answer_to_a_stream_request_is_read_whole(router_with, size: int) -> None:
    """A plain JSON answer past the stream's read bounds (256 KiB unread pauses a stream's reads,
    512 KiB is the most it holds), within the answer limit, is read to its end: a stream pauses
    for a caller that is behind, never for its own plain answer (which stalled until the
    deadline)."""
    router = await router_with()
    text = "y" * size
    agent = await FakeAgent("plain", tasks=("talk",), result={"text": text}).start()
    try:
        await agent.register(router.url, vectors=False)
        async with streamed(router, envelope(timeoutMs=int(scaled(5) * 1000))) as stream:
            events = await stream.rest()
    finally:
        await agent.stop()
    assert chunks_of(events) == [{"text": text}]
    assert done_of(events)["status"] == "SUCCESS"
