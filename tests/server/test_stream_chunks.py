"""A chunked event stream through the Router (the shared read buffer of transport/streamconn.py,
the whole-event reading of sse.py): whatever way an agent cuts its chunks, events and reads, the
caller gets the same chunks, and a broken chunk, event or value still ends the stream with
STREAM_BROKEN, after the chunks read before it."""

from __future__ import annotations

import asyncio

from tests.server.test_streaming import (
    CHUNKED_SSE_HEAD,
    DONE_EVENT,
    agents,
    chunks_of,
    done_of,
    envelope,
    router_with,
    streamed,
)
from tests.streaming_agents import Conn

__all__ = ["agents", "router_with"]  # the fixtures, used by name


def framed(*events: bytes) -> bytes:
    """One HTTP chunk holding ``events``."""
    data = b"".join(events)
    return b"%x\r\n%s\r\n" % (len(data), data)


def event(value: bytes) -> bytes:
    return b"event: chunk\ndata: " + value + b"\n\n"


async def pause() -> None:
    """Give the loop a turn, so a write tends to reach the Router as a read of its own (the test
    holds whatever way the bytes are cut)."""
    await asyncio.sleep(0)


async def test_every_way_of_cutting_chunks_and_events_gives_the_same_chunks(router_with, agents) -> None:
    router = await router_with()

    async def script(conn: Conn) -> None:
        await conn.write(b"HTTP/1.1 100 Continue\r\n\r\n" + CHUNKED_SSE_HEAD[:-2])  # an interim head first
        await pause()
        await conn.write(CHUNKED_SSE_HEAD[-2:] + framed(event(b'"one"')))  # the head's end, a whole event
        await conn.write(framed(event(b"2"), event(b"[3]")))  # two events in one chunk
        whole = event(b'{"four": 4}')
        await conn.write(framed(whole[:7]) + framed(whole[7:]))  # one event over two chunks
        big = framed(event(b'"' + b"5" * 100_000 + b'"'))
        await conn.write(big[:1000])  # one chunk over several reads
        await pause()
        await conn.write(big[1000:])
        six = event(b'"six"')
        await conn.write(b"%x;ext=1\r\n%s\r\n" % (len(six), six))  # an extension
        await conn.write(framed(b": a comment\n\n", event(b"7")))
        await conn.write(framed(DONE_EVENT) + b"0\r\nX-Trailer: 1\r\n\r\n")
        await conn.closed_by_router()

    await agents("talker", script, router)
    async with streamed(router, envelope()) as stream:
        events = await stream.rest()
    assert done_of(events)["status"] == "SUCCESS"
    assert chunks_of(events) == ["one", 2, [3], {"four": 4}, "5" * 100_000, "six", 7]


async def broken_after_first(router_with, agents, then: bytes, *, close: bool = False) -> str:
    """Stream a chunk "first", then the agent sends ``then`` (and closes its end when ``close``,
    else waits for the Router to close it): the caller gets "first", then STREAM_BROKEN, whose
    message is returned."""
    router = await router_with()

    async def script(conn: Conn) -> None:
        await conn.write(CHUNKED_SSE_HEAD + framed(event(b'"first"')))
        await conn.write(then)
        if close:
            conn.writer.close()
        else:
            await conn.closed_by_router()

    await agents("talker", script, router)
    async with streamed(router, envelope()) as stream:
        events = await stream.rest()
    done = done_of(events)
    assert chunks_of(events) == ["first"]
    assert done["error"]["code"] == "STREAM_BROKEN"
    return str(done["error"]["message"])


async def test_a_value_that_is_not_json_in_a_whole_event_still_breaks_the_stream(router_with, agents) -> None:
    garbage = framed(event(b'"' + b"x" * 5000 + b'" trailing garbage'))
    assert "not JSON" in await broken_after_first(router_with, agents, garbage)


async def test_broken_chunk_framing_after_the_first_chunk_breaks_the_stream(router_with, agents) -> None:
    not_a_size = b"zz\r\n" + event(b'"second"') + b"\r\n"
    assert "chunk size" in await broken_after_first(router_with, agents, not_a_size)


async def test_a_stream_cut_inside_a_chunk_breaks_the_stream(router_with, agents) -> None:
    await broken_after_first(router_with, agents, framed(event(b'"second"'))[:-9], close=True)
