"""A client that fans out: every call it was given goes to the Router at once (issue #34's
orchestrator), none held back in the client's own connection pool."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from reachmesh import ReachClient
from reachmesh.config import RouterConfig
from reachmesh.testing import FakeAgent, RouterServer
from tests.helpers import scaled, until

FANOUT = 150  # past aiohttp's default of 100 connections a session, within the Router's 256 a client
# Each call's deadline, and how long the Router waits for the agent's answer to it: the agent
# holds every call until the last one arrives, however long the fan-out takes on a busy machine.
DEADLINE_MS = int(scaled(20_000))


@pytest.fixture
async def patient_router() -> AsyncIterator[RouterServer]:
    """A Router that waits for an answer as long as the calls' deadline. At the default read
    timeout (3 s, unscaled) the first calls held for the last ones timed out while a loaded
    machine brought the rest in, and ended NO_AVAILABLE_HANDLER (and past five, the breaker
    opened and the tail of the fan-out never reached the agent)."""
    policy = {"limits": {"loop_lag_ms": 10_000}, "timeouts": {"read_ms": DEADLINE_MS}}
    async with RouterServer(RouterConfig.model_validate(policy)) as server:
        yield server


async def test_a_fan_out_past_a_hundred_calls_reaches_the_router_at_once(
    patient_router: RouterServer,
) -> None:
    """150 calls at once through one ReachClient, held by the agent: all 150 reach it before any
    is answered. The client's session held all but 100 in its own pool, where their wait counted
    against their deadline and ended as RouterUnavailable ("cannot reach the Router:
    TimeoutError()") for a Router that was fine."""
    router = patient_router
    agent = await FakeAgent("fan", hold=asyncio.Event()).start()
    try:
        await agent.register(router.url, vectors=False)
        async with ReachClient(router.url) as client:
            calls = [
                asyncio.ensure_future(client.call("echo", {"i": i}, timeout_ms=DEADLINE_MS))
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
