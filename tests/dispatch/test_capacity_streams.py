"""A streamed answer under an agent's max_concurrency (PROTOCOL §15 with §14): a stream is in
flight until it ends, not only until its first chunk. Reported by the #34 review; the fix is in
dispatch/streaming.py (another helper's), so the test is a strict xfail until it lands."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from reachmesh.config import RouterConfig
from reachmesh.testing import RouterServer
from tests.helpers import scaled, until
from tests.server.test_streaming import envelope, streamed
from tests.streaming_agents import Conn, StreamAgent


@pytest.mark.xfail(
    strict=True,
    reason="#34 review: AttemptRun._attempt gives the slot back once StreamingRun._send returns "
    "(at the first chunk); relay() runs the rest of the stream outside it",
)
async def test_a_stream_holds_its_slot_until_it_ends() -> None:
    """Capacity 1: the first call streams a chunk and goes on talking; a second call must wait in
    the Router until that stream ends. It reached the agent at once: two in flight at capacity 1."""
    finish = asyncio.Event()

    async def talk(conn: Conn) -> None:
        await conn.sse_head()
        await conn.chunk({"text": "first piece"})
        await finish.wait()
        await conn.done()

    config = RouterConfig.from_mapping({"health": {"enabled": False}})
    agent = await StreamAgent("streamer", talk).start()
    try:
        async with RouterServer(config) as router:
            profile = {
                "id": "streamer",
                "network": {"endpoint": agent.endpoint},
                "capabilities": [{"task": "talk"}],
                "max_concurrency": 1,
            }
            async with httpx.AsyncClient() as http:
                assert (await http.post(f"{router.url}/agents", json=profile)).status_code == 201
            capacity = router.app.parts.dispatcher.forwarding.capacity
            async with streamed(router, envelope()) as first:
                assert (await first.next()).event == "chunk"
                async with streamed(router, envelope()) as second:
                    await until(
                        lambda: len(agent.conns) == 2 or capacity.queued("streamer") == 1,
                        "the second call at the agent, or waiting for the slot",
                    )
                    assert len(agent.conns) == 1, "two streams in flight at max_concurrency 1"
                    finish.set()
                    await asyncio.wait_for(first.rest(), scaled(10))
                    await asyncio.wait_for(second.rest(), scaled(10))
    finally:
        finish.set()
        await agent.stop()
