"""Expired entries count against the token that made them: the memory registry."""

from __future__ import annotations

import httpx
import pytest

from reachmesh.clock import ManualClock
from reachmesh.config import RegistryPolicy, RouterConfig
from reachmesh.exceptions import RegistryFull
from reachmesh.protocol import AgentProfile
from reachmesh.registry import MemoryRegistry
from reachmesh.testing import RouterServer
from tests.bounds.quota import body, one_token_cannot_fill_the_registry, tokens


async def test_a_token_that_lets_leases_lapse_cannot_fill_the_memory_registry() -> None:
    """Three rounds of three new ids under a quota of three, in a registry of eight: token B's
    agent is still taken (it got 503 REGISTRY_FULL when only live leases were counted)."""
    config = RouterConfig.model_validate(
        {
            "auth": tokens(),
            "embedding": {"backend": "none"},
            "health": {"enabled": False},
            "limits": {"loop_lag_ms": 10_000},
            "registry": {
                "max_agents": 8,
                "max_agents_per_token": 3,
                "lease_ttl_seconds": 0.5,
                "sweep_interval_seconds": 0.05,
            },
        }
    )
    async with RouterServer(config) as router, httpx.AsyncClient(timeout=15) as http:
        await one_token_cannot_fill_the_registry(http, router.url, rounds=3, per_token=3)


async def test_a_full_registry_gives_an_offline_entrys_place_to_a_live_agent() -> None:
    """registry.max_agents counts offline entries, but the oldest offline one makes way for a
    new agent instead of a 503; with every entry live, the next is still refused."""
    clock = ManualClock()
    registry = MemoryRegistry(RegistryPolicy(max_agents=2, lease_ttl_seconds=10), clock=clock)
    for agent_id in ("old-1", "old-2"):
        await registry.register(AgentProfile.model_validate(body(agent_id)))
    clock.advance(11)
    registry.sweep()
    assert {e.status.value for e in registry.agents()} == {"offline"}
    await registry.register(AgentProfile.model_validate(body("new-1")))
    await registry.register(AgentProfile.model_validate(body("new-2")))
    assert sorted(e.id for e in registry.agents()) == ["new-1", "new-2"]
    with pytest.raises(RegistryFull):
        await registry.register(AgentProfile.model_validate(body("new-3")))
