"""Shared fixtures: a real Router on loopback, fake agents, and an HTTP client."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from reachmesh.config import RouterConfig
from reachmesh.testing import FakeAgent, RouterServer


@pytest.fixture
async def router() -> AsyncIterator[RouterServer]:
    """A Router with default policy on a free loopback port."""
    # A test machine may be loaded (two workers, a demo beside them): the global breaker that sheds
    # on event-loop lag is tested on its own, and must not turn an ordinary answer into a 429 here.
    config = RouterConfig.model_validate({"limits": {"loop_lag_ms": 10_000}})
    async with RouterServer(config) as server:
        yield server


@pytest.fixture
async def http(router: RouterServer) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client pointed at the Router."""
    async with httpx.AsyncClient(base_url=router.url, timeout=10) as client:
        yield client


@pytest.fixture
async def make_agent(router: RouterServer) -> AsyncIterator[Callable[..., Awaitable[FakeAgent]]]:
    """Start and register fake agents; all are stopped at the end."""
    started: list[FakeAgent] = []

    async def make(agent_id: str, *, register: bool = True, **kwargs: object) -> FakeAgent:
        agent = await FakeAgent(agent_id, **kwargs).start()  # type: ignore[arg-type]
        started.append(agent)
        if register:
            await agent.register(router.url)
        return agent

    yield make
    for agent in started:
        await agent.stop()
