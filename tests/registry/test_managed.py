"""Managed (lease-less) registrations: no expiry by time, health checks only, removal by lease."""

from __future__ import annotations

import pytest

from reachmesh.clock import ManualClock
from reachmesh.exceptions import AgentIdConflict
from reachmesh.protocol import AgentProfile, AgentStatusValue
from reachmesh.registry import MemoryRegistry


def a2a_profile(agent_id: str = "imported") -> AgentProfile:
    return AgentProfile.model_validate(
        {
            "id": agent_id,
            "network": {"protocol": "a2a", "endpoint": "http://127.0.0.1:9/a2a"},
            "capabilities": [{"task": "summarise"}],
            "health_check": {"path": "/.well-known/agent-card.json"},
        }
    )


async def test_a_managed_entry_never_expires_by_time(registry: MemoryRegistry, clock: ManualClock) -> None:
    """Hours without a renewal leave a managed entry available; it has a lease id but no TTL."""
    entry, created = await registry.register(a2a_profile(), managed=True)
    assert created and entry.managed and entry.ttl_seconds == 0 and entry.protocol == "a2a"
    for _ in range(10):
        clock.advance(3600)
        registry.sweep()
    assert entry.status is AgentStatusValue.AVAILABLE
    await registry.renew(entry.id, entry.lease_id)  # allowed, and still no expiry
    clock.advance(3600)
    registry.sweep()
    assert registry.get(entry.id) is entry and entry.status is AgentStatusValue.AVAILABLE


async def test_health_alone_decides_a_managed_entry(registry: MemoryRegistry) -> None:
    """Unhealthy takes a managed entry out of routing, a passing probe brings it back."""
    entry, _ = await registry.register(a2a_profile(), managed=True)
    registry.set_health(entry.id, AgentStatusValue.UNHEALTHY)
    assert not entry.routable
    registry.set_health(entry.id, AgentStatusValue.AVAILABLE)
    assert entry.routable


async def test_a_managed_entry_is_held_like_a_lease(registry: MemoryRegistry) -> None:
    """Another registration of the id needs its lease id; deregistration with it removes it."""
    entry, _ = await registry.register(a2a_profile(), managed=True)
    with pytest.raises(AgentIdConflict):
        await registry.register(a2a_profile())
    replaced, created = await registry.register(a2a_profile(), lease_id=entry.lease_id, managed=True)
    assert not created and replaced.lease_id == entry.lease_id
    await registry.deregister(entry.id, entry.lease_id)
    assert registry.get(entry.id) is None
