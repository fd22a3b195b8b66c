"""The snapshot both backends keep: what it records, and who hears of it."""

from __future__ import annotations

import pytest

from reachmesh.clock import ManualClock
from reachmesh.config import RegistryPolicy
from reachmesh.exceptions import AgentIdConflict, RegistryFull
from reachmesh.protocol import AgentProfile, AgentStatusValue
from reachmesh.registry.base import Registry
from reachmesh.registry.entry import AgentEntry, Claim, LearnedRoute, RegistryEvent, compile_capabilities
from reachmesh.registry.etcd import EtcdRegistry
from reachmesh.registry.memory import MemoryRegistry
from reachmesh.registry.snapshot import Snapshot


def entry(agent_id: str, *tasks: str, endpoint: str | None = None, lease: str = "0xabc") -> AgentEntry:
    profile = AgentProfile.model_validate(
        {
            "id": agent_id,
            "network": {"endpoint": endpoint or f"http://127.0.0.1:9/{agent_id}"},
            "capabilities": [{"task": t} for t in tasks or ("echo",)],
        }
    )
    caps, validators = compile_capabilities(profile)
    return AgentEntry(
        profile=profile,
        lease_id=lease,
        ttl_seconds=2,
        last_heartbeat=0.0,
        last_heartbeat_wall=0.0,
        expires_at=2.0,
        capabilities=caps,
        validators=validators,
    )


def test_install_replace_and_remove_keep_the_task_index_and_tell_the_listeners() -> None:
    snapshot = Snapshot()
    heard: list[tuple[RegistryEvent, str]] = []
    snapshot.subscribe(lambda event, e: heard.append((event, e.id)))
    snapshot.install(entry("a", "t1", "t2"), replacing=False)
    snapshot.install(entry("b", "t2"), replacing=False)
    newer = entry("a", "t3")
    snapshot.install(newer, replacing=True)
    assert {e.id for e in snapshot.by_task("t2")} == {"b"}  # a's old tasks left the index
    assert set(snapshot.tasks()) == {"t2", "t3"}
    snapshot.remove(newer, RegistryEvent.DEREGISTERED)
    assert snapshot.get("a") is None and set(snapshot.tasks()) == {"t2"}
    assert heard == [
        (RegistryEvent.REGISTERED, "a"),
        (RegistryEvent.REGISTERED, "b"),
        (RegistryEvent.REPLACED, "a"),
        (RegistryEvent.DEREGISTERED, "a"),
    ]


def test_offline_entries_wait_out_their_grace_and_give_their_place_oldest_first() -> None:
    snapshot = Snapshot()
    for name in ("a", "b", "c"):
        snapshot.install(entry(name), replacing=False)
    snapshot.go_offline(snapshot.entries["b"], now=10.0)
    snapshot.go_offline(snapshot.entries["a"], now=11.0)
    assert snapshot.entries["b"].status is AgentStatusValue.OFFLINE
    snapshot.drop_if_gone(snapshot.entries["b"], now=14.0, grace=5.0)
    assert "b" in snapshot.entries  # 4 s of a 5 s grace
    evicted = snapshot.evict_offline(keep="c")
    assert evicted is not None and evicted.id == "b"  # offline first
    snapshot.drop_if_gone(snapshot.entries["a"], now=16.0, grace=5.0)
    assert set(snapshot.entries) == {"c"}


def test_a_claim_decides_new_in_place_takeover_or_conflict() -> None:
    snapshot = Snapshot()
    held = entry("a", lease="0x1")
    snapshot.install(held, replacing=False)
    same_endpoint = held.profile
    elsewhere = entry("a", endpoint="http://127.0.0.1:10/a").profile
    assert snapshot.claim(None, same_endpoint, None, None, max_agents=5) is Claim.NEW
    assert snapshot.claim(held, elsewhere, "0x1", None, max_agents=5) is Claim.IN_PLACE
    assert snapshot.claim(held, same_endpoint, None, None, max_agents=5) is Claim.TAKEOVER  # a restart
    with pytest.raises(AgentIdConflict):
        snapshot.claim(held, elsewhere, "0x2", None, max_agents=5)
    with pytest.raises(RegistryFull):
        snapshot.claim(None, entry("b").profile, None, None, max_agents=1)


def test_learned_routes_are_kept_newest_last_and_excess_is_the_oldest() -> None:
    snapshot = Snapshot()
    heard: list[tuple[str, LearnedRoute | None]] = []
    snapshot.subscribe_learned(lambda key, route: heard.append((key, route)))
    snapshot.keep(LearnedRoute("Where is  MY parcel", "track", "caller", 1.0))
    snapshot.keep(LearnedRoute("refund please", "refund", "caller", 2.0))
    snapshot.keep(LearnedRoute("where is my parcel", "track", "operator", 3.0))
    assert list(snapshot.learned) == ["refund please", "where is my parcel"]
    assert snapshot.excess(1) == ["refund please"]
    assert snapshot.drop_learned("refund please") and not snapshot.drop_learned("refund please")
    assert [key for key, route in heard if route is None] == ["refund please"]
    snapshot.keep_negative(LearnedRoute("Hello", "track", "decline", 1.0, agent="a"))
    assert snapshot.drop_negative(("hello", "track", "a")) and not snapshot.negatives


def test_both_backends_are_the_contract_over_a_snapshot_and_neither_extends_the_other() -> None:
    """Each backend reads on its own: etcd's is no subclass of the in-memory one."""
    memory = MemoryRegistry(RegistryPolicy(), clock=ManualClock())
    shared = EtcdRegistry(RegistryPolicy(), endpoints=["127.0.0.1:9"], clock=ManualClock())
    for backend in (memory, shared):
        assert isinstance(backend, Registry) and isinstance(backend.snapshot, Snapshot)
    assert not issubclass(EtcdRegistry, MemoryRegistry)
    shared.snapshot.install(entry("a", "t1"), replacing=False)
    assert [e.id for e in shared.by_task("t1")] == ["a"] and shared.get("a") is not None
