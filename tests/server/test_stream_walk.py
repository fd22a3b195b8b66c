"""What a stranger found trying streaming (#35) and capacity (#34) together, each through a real
Router and raw agents on loopback: a streamed call's refusals, its hold on the agent's capacity,
and a plain answer to a streamed call."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from reachmesh.config import RouterConfig
from reachmesh.resilience.breaker import BreakerState
from reachmesh.server.stream import wants_stream
from reachmesh.testing import FakeAgent, RouterServer
from tests.helpers import scaled, until
from tests.server.test_streaming import STREAM_HEADERS, chunks_of, done_of, envelope, streamed
from tests.streaming_agents import Conn, StreamAgent


@pytest.fixture
async def router() -> AsyncIterator[RouterServer]:
    policy = {"health": {"enabled": False}, "limits": {"max_queued_per_agent": 1}}
    async with RouterServer(RouterConfig.model_validate(policy)) as server:
        yield server


async def test_a_streamed_call_refused_overloaded_carries_retry_after(router: RouterServer) -> None:
    """A full agent whose queue is full too: a caller that asked for a stream gets the plain 429
    OVERLOADED a plain caller gets, with its Retry-After header (it had none: only the plain path
    added it)."""
    agent = await FakeAgent("one", max_concurrency=1, hold=asyncio.Event()).start()
    try:
        await agent.register(router.url, vectors=False)
        # The first call is held at the agent while the others are made: the read timeout (3 s by
        # default, not scaled) must not end it first on a busy machine, or its slot comes free.
        deadline_ms = int(scaled(20_000))
        body = {
            "targetTask": "echo",
            "payload": {},
            "preferences": {"timeoutMs": deadline_ms, "readTimeoutMs": deadline_ms},
        }
        async with httpx.AsyncClient(base_url=router.url, timeout=scaled(30)) as http:
            first = asyncio.ensure_future(http.post("/reach", json=body))
            await until(lambda: len(agent.received) == 1, "the first call at the agent")
            waiting = asyncio.ensure_future(http.post("/reach", json=body))
            capacity = router.app.parts.dispatcher.forwarding.capacity
            await until(lambda: capacity.queued("one") == 1, "one call waiting")
            refused = await http.post("/reach", json=body, headers=STREAM_HEADERS)
            assert refused.status_code == 429
            assert refused.json()["status"] == "OVERLOADED"
            assert refused.headers["Retry-After"] == "1"
            assert agent.hold is not None
            agent.hold.set()
            assert (await first).json()["status"] == "SUCCESS"
            assert (await waiting).json()["status"] == "SUCCESS"
    finally:
        await agent.stop()


async def test_a_stream_holds_its_agents_slot_until_it_ends(router: RouterServer) -> None:
    """max_concurrency 1 and a stream that has sent its first chunk: a second call waits in the
    Router until the stream ends; it is not sent to the agent while the stream runs."""
    finish = asyncio.Event()

    async def script(conn: Conn) -> None:
        await conn.sse_head()
        await conn.chunk("first")
        await finish.wait()
        await conn.done({"status": "SUCCESS"})

    agent = await StreamAgent("one-at-a-time", script).start()
    try:
        await agent.register(router.url, max_concurrency=1)
        async with streamed(router, envelope(timeoutMs=int(scaled(20_000)))) as stream:
            assert (await stream.next()).data == '"first"'
            async with httpx.AsyncClient(base_url=router.url, timeout=scaled(30)) as http:
                second = asyncio.ensure_future(
                    http.post("/reach", json=envelope(timeoutMs=int(scaled(20_000))))
                )
                try:
                    capacity = router.app.parts.dispatcher.forwarding.capacity
                    await until(
                        lambda: capacity.queued("one-at-a-time") == 1 or len(agent.conns) == 2,
                        "the second call waiting, or sent",
                    )
                    assert len(agent.conns) == 1, "a second call reached a capacity-1 agent mid-stream"
                    finish.set()
                    assert done_of(await stream.rest())["status"] == "SUCCESS"
                    assert (await second).json()["status"] == "SUCCESS"
                finally:
                    finish.set()
                    await asyncio.gather(second, return_exceptions=True)
    finally:
        finish.set()
        await agent.stop()


async def test_a_plain_answer_over_512_kib_to_a_streamed_call_is_its_one_chunk(router: RouterServer) -> None:
    """An agent answers a streamed call with plain JSON of 900 kB (within the 8 MiB answer limit,
    over one 512 KiB read): the caller gets its result as one chunk, then done, before its
    deadline (it got 504 TIMEOUT at the deadline, the agent charged a timeout)."""
    result = "p" * 900_000  # past one 512 KiB read, within the test reader's 1 MiB line

    async def script(conn: Conn) -> None:
        await conn.json({"status": "SUCCESS", "result": result})

    agent = await StreamAgent("plain-big", script).start()
    try:
        await agent.register(router.url)
        async with streamed(router, envelope(timeoutMs=int(scaled(2_000)))) as stream:
            if not stream.response.headers["content-type"].startswith("text/event-stream"):
                answer = (await stream.response.aread())[:300]
                pytest.fail(f"no stream but HTTP {stream.response.status_code}: {answer!r}")
            events = await stream.rest()
        assert done_of(events)["status"] == "SUCCESS"
        assert chunks_of(events) == [result]
    finally:
        await agent.stop()


def test_an_accept_that_refuses_event_streams_is_not_a_stream() -> None:
    assert wants_stream(b"text/event-stream")
    assert wants_stream(b"application/json, text/event-stream;q=0.5")
    assert not wants_stream(b"text/event-stream;q=0")
    assert not wants_stream(b"text/event-stream; q=0.0, application/json")
    assert wants_stream(b"Text/Event-Stream; Q=0.2")
    assert wants_stream(b"text/event-stream;q=junk")
    assert not wants_stream(b"*/*")
    assert not wants_stream(None)


def test_the_sdk_reads_accept_as_the_router_does() -> None:
    """An agent asked with q=0 answers plain JSON; asked with a weight, it streams."""
    from aiohttp.test_utils import make_mocked_request

    from reachmesh.sdk.streaming import wants_stream as agent_wants

    assert not agent_wants(make_mocked_request("POST", "/reach", headers={"Accept": "text/event-stream;q=0"}))
    assert agent_wants(make_mocked_request("POST", "/reach", headers={"Accept": "text/event-stream;q=0.9"}))


async def test_an_agent_that_breaks_every_stream_opens_its_breaker() -> None:
    """An agent that sends one chunk and then resets, every time: with a breaker threshold of 3,
    the fourth streamed call finds its circuit open. With threshold 1 (the existing test) the one
    failure opens it, which hid this; by hand, 8 such streams left it closed at success rate 1.0."""
    policy = {"health": {"enabled": False}, "breaker": {"failure_threshold": 3}}

    async def breaks(conn: Conn) -> None:
        await conn.sse_head()
        await conn.chunk("half")
        conn.reset()

    async with RouterServer(RouterConfig.model_validate(policy)) as router:
        agent = await StreamAgent("breaker", breaks).start()
        try:
            await agent.register(router.url)
            for _ in range(3):
                async with streamed(router, envelope()) as stream:
                    assert done_of(await stream.rest())["error"]["code"] == "STREAM_BROKEN"
            assert router.app.parts.breakers.state("breaker") is BreakerState.OPEN
        finally:
            await agent.stop()


async def test_a_stream_whose_caller_goes_away_gives_its_slot_back(router: RouterServer) -> None:
    """The slot a stream holds to its end is given back however it ends: a caller that goes away
    mid-stream leaves the capacity-1 agent free for the next call, and its success rate and
    breaker untouched (the agent did nothing wrong)."""
    finish = asyncio.Event()

    async def script(conn: Conn) -> None:
        await conn.sse_head()
        await conn.chunk("first")
        await finish.wait()
        await conn.done({"status": "SUCCESS"})

    agent = await StreamAgent("left-behind", script).start()
    try:
        await agent.register(router.url, max_concurrency=1)
        capacity = router.app.parts.dispatcher.forwarding.capacity
        async with streamed(router, envelope(timeoutMs=int(scaled(20_000)))) as stream:
            assert (await stream.next()).data == '"first"'
            assert capacity.inflight("left-behind") == 1
        await until(lambda: capacity.inflight("left-behind") == 0, "the slot given back")
        finish.set()
        async with streamed(router, envelope(timeoutMs=int(scaled(20_000)))) as again:
            assert done_of(await again.rest())["status"] == "SUCCESS"
        assert router.app.parts.breakers.state("left-behind") is BreakerState.CLOSED
    finally:
        finish.set()
        await agent.stop()
