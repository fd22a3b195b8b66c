"""The in-memory registry: leases on a manual clock, the task index, conflicts."""

from __future__ import annotations

import pytest

from reachmesh.clock import ManualClock
from reachmesh.config import RegistryPolicy
from reachmesh.exceptions import AgentIdConflict, AgentNotFound, LeaseMismatch, LeaseNotFound
from reachmesh.protocol import AgentProfile, AgentStatusValue
from reachmesh.registry import MemoryRegistry, RegistryEvent


def status_of(registry: MemoryRegistry, agent_id: str) -> AgentStatusValue:
    """The status of a registered agent (it must be registered)."""
    entry = registry.get(agent_id)
    assert entry is not None
    return entry.status


def profile(agent_id: str, *tasks: str) -> AgentProfile:
    return AgentProfile.model_validate(
        {
            "id": agent_id,
            "network": {"endpoint": f"http://127.0.0.1:9/{agent_id}"},
            "capabilities": [{"task": t} for t in tasks or ("echo",)],
        }
    )


def at(agent: AgentProfile, endpoint: str) -> AgentProfile:
    """``agent`` listening at another endpoint."""
    return agent.model_copy(update={"network": agent.network.model_copy(update={"endpoint": endpoint})})


async def test_register_starts_available_with_a_lease(registry: MemoryRegistry) -> None:
    """A new registration is available, holds a hex lease and the configured TTL."""
    entry, created = await registry.register(profile("a"))
    assert created
    assert entry.status is AgentStatusValue.AVAILABLE
    assert entry.lease_id.startswith("0x")
    assert entry.ttl_seconds == 2
    assert registry.get("a") is entry


async def test_task_index_answers_without_scanning(registry: MemoryRegistry) -> None:
    """by_task returns exactly the agents declaring the task, and forgets removed ones."""
    await registry.register(profile("a", "t1", "t2"))
    entry_b, _ = await registry.register(profile("b", "t2"))
    assert {e.id for e in registry.by_task("t2")} == {"a", "b"}
    assert {e.id for e in registry.by_task("t1")} == {"a"}
    assert list(registry.by_task("unknown")) == []
    await registry.deregister("b", entry_b.lease_id)
    assert {e.id for e in registry.by_task("t2")} == {"a"}


async def test_missed_renewal_then_expiry(registry: MemoryRegistry, clock: ManualClock) -> None:
    """No renewal: suspect after half the TTL, offline at the TTL, dropped after the grace."""
    events: list[tuple[RegistryEvent, str]] = []
    registry.subscribe(lambda ev, e: events.append((ev, e.id)))
    await registry.register(profile("a"))
    clock.advance(0.9)
    registry.sweep()
    assert status_of(registry, "a") is AgentStatusValue.AVAILABLE
    clock.advance(0.2)
    registry.sweep()
    assert status_of(registry, "a") is AgentStatusValue.SUSPECT
    clock.advance(1.0)
    registry.sweep()
    assert status_of(registry, "a") is AgentStatusValue.OFFLINE
    clock.advance(5.0)
    registry.sweep()
    assert registry.get("a") is None
    assert [ev for ev, _ in events] == [
        RegistryEvent.REGISTERED,
        RegistryEvent.SUSPECT,
        RegistryEvent.OFFLINE,
        RegistryEvent.REMOVED,
    ]


async def test_renewal_keeps_the_lease_alive(registry: MemoryRegistry, clock: ManualClock) -> None:
    """Renewals within the TTL keep the agent available indefinitely; a suspect one recovers."""
    entry, _ = await registry.register(profile("a"))
    for _ in range(10):
        clock.advance(1.5)
        registry.sweep()
        await registry.renew("a", entry.lease_id)
        assert status_of(registry, "a") is AgentStatusValue.AVAILABLE


async def test_expired_lease_answers_lease_not_found(registry: MemoryRegistry, clock: ManualClock) -> None:
    """Renewing an expired lease raises LeaseNotFound; the agent may then register anew."""
    entry, _ = await registry.register(profile("a"))
    clock.advance(2.5)
    registry.sweep()
    with pytest.raises(LeaseNotFound):
        await registry.renew("a", entry.lease_id)
    fresh, created = await registry.register(profile("a"))
    assert created and fresh.lease_id != entry.lease_id
    assert fresh.status is AgentStatusValue.AVAILABLE


async def test_conflicting_registration(registry: MemoryRegistry) -> None:
    """A live id cannot be taken without its lease; with the lease the profile is replaced."""
    entry, _ = await registry.register(profile("a", "old"))
    with pytest.raises(AgentIdConflict):
        await registry.register(at(profile("a", "new"), "http://127.0.0.1:10/a"))
    with pytest.raises(AgentIdConflict):
        await registry.register(at(profile("a", "new"), "http://127.0.0.1:10/a"), lease_id="0xwrong")
    replaced, created = await registry.register(profile("a", "new"), lease_id=entry.lease_id)
    assert not created
    assert replaced.lease_id == entry.lease_id
    assert list(registry.by_task("old")) == []
    assert [e.id for e in registry.by_task("new")] == ["a"]


async def test_lease_holder_rules(registry: MemoryRegistry) -> None:
    """Renewing or deregistering with another lease is refused; unknown agents are not found."""
    entry, _ = await registry.register(profile("a"))
    with pytest.raises(LeaseMismatch):
        await registry.renew("a", "0xnotmine")
    with pytest.raises(LeaseMismatch):
        await registry.deregister("a", "0xnotmine")
    with pytest.raises(AgentNotFound):
        await registry.deregister("ghost", "0x1")
    with pytest.raises(LeaseNotFound):
        await registry.renew("ghost", "0x1")
    await registry.deregister("a", entry.lease_id)
    assert registry.get("a") is None


async def test_sweep_runs_in_the_background(clock: ManualClock) -> None:
    """start() runs the sweep on its interval; close() stops it."""
    registry = MemoryRegistry(RegistryPolicy(lease_ttl_seconds=1, sweep_interval_seconds=0.01), clock=clock)
    await registry.register(profile("a"))
    await registry.start()
    try:
        clock.advance(1.5)
        import asyncio

        for _ in range(100):
            if status_of(registry, "a") is AgentStatusValue.OFFLINE:
                break
            await asyncio.sleep(0.01)
        assert status_of(registry, "a") is AgentStatusValue.OFFLINE
    finally:
        await registry.close()


async def test_the_same_registrant_gets_its_lease_back(registry: MemoryRegistry, clock: ManualClock) -> None:
    """A retry with the same instance token and endpoint is answered with the live lease, extended."""
    first, created = await registry.register(profile("a"), instance_id="token-1")
    assert created
    clock.advance(1.5)
    again, created = await registry.register(profile("a"), instance_id="token-1")
    assert (again.lease_id, created) == (first.lease_id, False)
    # The retry counts as a heartbeat: the lease runs a full TTL from it.
    assert again.expires_at == clock.monotonic() + 2


async def test_a_different_registrant_still_conflicts(registry: MemoryRegistry) -> None:
    """Another token, no token, or the same token, from another endpoint cannot take a live id."""
    await registry.register(profile("a"), instance_id="token-1")
    elsewhere = at(profile("a"), "http://127.0.0.1:10/a")
    for token in ("token-2", None, "token-1"):
        with pytest.raises(AgentIdConflict):
            await registry.register(elsewhere, instance_id=token)


async def test_the_instance_token_stays_out_of_repr(registry: MemoryRegistry) -> None:
    """An entry's repr (what a log line would print) does not carry the instance token."""
    entry, _ = await registry.register(profile("a"), instance_id="secret-token-value")
    assert entry.instance_id == "secret-token-value"
    assert "secret-token-value" not in repr(entry)


async def test_a_restart_at_the_same_endpoint_takes_the_id_over_at_once(registry: MemoryRegistry) -> None:
    """A new instance (another token) at the holder's endpoint: a new lease, the old one ends."""
    events: list[tuple[RegistryEvent, str]] = []
    registry.subscribe(lambda ev, e: events.append((ev, e.lease_id)))
    old, _ = await registry.register(profile("a", "old"), instance_id="killed-process")
    new, created = await registry.register(profile("a", "new"), instance_id="restarted-process")
    assert created and new.lease_id != old.lease_id
    assert registry.get("a") is new and new.status is AgentStatusValue.AVAILABLE
    assert [e.id for e in registry.by_task("new")] == ["a"] and list(registry.by_task("old")) == []
    assert events[-1] == (RegistryEvent.REPLACED, new.lease_id)
    with pytest.raises(LeaseMismatch):
        await registry.renew("a", old.lease_id)
    await registry.renew("a", new.lease_id)


async def test_a_holder_the_health_probes_mark_down_is_taken_over(registry: MemoryRegistry) -> None:
    """Another endpoint takes over a holder whose health checks fail (suspect or unhealthy)."""
    for down in (AgentStatusValue.SUSPECT, AgentStatusValue.UNHEALTHY):
        old, _ = await registry.register(profile("a"))
        registry.set_health("a", down)
        new, created = await registry.register(at(profile("a"), "http://127.0.0.1:10/a"))
        assert created and new.lease_id != old.lease_id and new.endpoint == "http://127.0.0.1:10/a"
        assert new.status is AgentStatusValue.AVAILABLE
        with pytest.raises(LeaseMismatch):
            await registry.renew("a", old.lease_id)
        await registry.deregister("a", new.lease_id)


async def test_two_live_instances_at_different_endpoints_still_conflict(registry: MemoryRegistry) -> None:
    """A holder that renews and passes its health checks keeps its id against another endpoint."""
    held, _ = await registry.register(profile("a"), instance_id="first")
    registry.set_health("a", AgentStatusValue.AVAILABLE)
    with pytest.raises(AgentIdConflict):
        await registry.register(at(profile("a"), "http://127.0.0.1:10/a"), instance_id="second")
    assert registry.get("a") is held
    await registry.renew("a", held.lease_id)
