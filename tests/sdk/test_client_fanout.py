"""A client that fans out: every call it was given goes to the Router at once (issue #34's
orchestrator), none held back in the client's own connection pool."""

from __future__ import annotations

import asyncio

from reachmesh import ReachClient
from reachmesh.testing import FakeAgent, RouterServer
from tests.helpers import scaled, until

FANOUT = 150  # past aiohttp's default of 100 connections a session, within the Router's 256 a client


async def test_a_fan_out_past_a_hundred_calls_reaches_the_router_at_once(router: RouterServer) -> None:
    """150 calls at once through one ReachClient, held by the agent: all 150 reach it before any
    is answered. The client's session held all but 100 in its own pool, where their wait counted
    against their deadline and ended as RouterUnavailable ("cannot reach the Router:
    TimeoutError()") for a Router that was fine."""
    agent = await FakeAgent("fan", hold=asyncio.Event()).start()
    try:
        await agent.register(router.url, vectors=False)
        async with ReachClient(router.url) as client:
            calls = [
                asyncio.ensure_future(client.call("echo", {"i": i}, timeout_ms=int(scaled(20_000))))
                for i in range(FANOUT)
            ]
            try:
                await until(lambda: len(agent.received) == FANOUT, f"{FANOUT} calls at the agent")
            finally:
                assert agent.hold is not None
                agent.hold.set()
                answers = await asyncio.gather(*calls, return_exceptions=True)
        assert [getattr(a, "status", a) for a in answers] == ["SUCCESS"] * FANOUT
    finally:
        await agent.stop()


async def test_a_client_may_still_cap_its_connections(router: RouterServer) -> None:
    """max_connections caps the client's connections to the Router, for a caller that wants to."""
    async with ReachClient(router.url, max_connections=3) as client:
        connector = client._http().connector
        assert connector is not None and connector.limit == 3
