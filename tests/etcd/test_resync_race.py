"""A full read of etcd racing this Router's own writes: what the read cannot know stays as written."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from reachmesh.cli.etcd import EtcdCluster
from reachmesh.clock import ManualClock
from reachmesh.config import RegistryPolicy
from reachmesh.protocol import AgentProfile, AgentStatusValue
from reachmesh.registry.etcd.registry import EtcdRegistry
from reachmesh.registry.etcd.stored import GONE
from reachmesh.registry.etcdclient import KeyValue
from tests.helpers import scaled, until

pytestmark = pytest.mark.etcd


def profile(agent_id: str, port: int = 9) -> AgentProfile:
    return AgentProfile.model_validate(
        {
            "id": agent_id,
            "network": {"endpoint": f"http://127.0.0.1:{port}/reach"},
            "capabilities": [{"task": "echo"}],
        }
    )


@pytest.fixture
async def registry(etcd: EtcdCluster) -> AsyncIterator[EtcdRegistry]:
    policy = RegistryPolicy.model_validate(
        {"etcd": {"endpoints": etcd.endpoints.split(","), "request_timeout_seconds": 20}}
    )
    shared = EtcdRegistry(policy, endpoints=etcd.endpoints.split(","), clock=ManualClock())
    await shared.start()
    try:
        yield shared
    finally:
        await shared.close()


class HeldRead:
    """Wraps the client's full read: it is answered by etcd, then held until the test lets go."""

    def __init__(self, registry: EtcdRegistry) -> None:
        self.answered = asyncio.Event()
        self.release = asyncio.Event()
        self.revision = 0
        self._real = registry.client.get_prefix

    async def __call__(self, prefix: str, **kwargs: Any) -> tuple[int, list[KeyValue]]:
        revision, kvs = await self._real(prefix, **kwargs)
        self.revision = revision
        self.answered.set()
        await self.release.wait()
        return revision, kvs


async def test_an_agent_registered_here_while_a_full_read_is_in_flight_stays_listed(registry):
    """The read is answered at revision N; the agent registers through this Router at N+1
    before the read is applied: it is newer than the read, not gone from etcd."""
    held = HeldRead(registry)
    registry.client.get_prefix = held
    before = registry.resyncs
    registry.watcher.loaded = False  # as after a compaction: the watch loop reads everything again
    registry._restart.set()
    await asyncio.wait_for(held.answered.wait(), scaled(10))
    entry, _ = await registry.register(profile("late-1"))
    assert entry.revision > held.revision
    held.release.set()
    await until(lambda: registry.resyncs > before, "the held full read to be applied")
    listed = registry.snapshot.get("late-1")
    assert listed is not None and listed.status is AgentStatusValue.AVAILABLE
    # The sweep keeps it: nothing offline to drop.
    clock = registry._shared.clock
    assert isinstance(clock, ManualClock)
    clock.advance(registry.policy.offline_grace_seconds + 1)
    registry.sweep()
    assert registry.snapshot.get("late-1") is not None


async def test_a_successful_renewal_restores_an_entry_this_router_had_marked_offline(registry):
    """etcd kept the lease alive: whatever the snapshot had concluded, the agent is live."""
    entry, _ = await registry.register(profile("echo-1"))
    local = registry.snapshot.get("echo-1")
    assert local is not None
    registry.snapshot.go_offline(local, registry._shared.clock.monotonic())
    assert local.status is AgentStatusValue.OFFLINE
    renewed = await registry.renew("echo-1", entry.lease_id)
    assert renewed.status is AgentStatusValue.AVAILABLE and renewed.offline_since is None
    assert [e.id for e in registry.by_task("echo") if e.routable] == ["echo-1"]


async def test_a_deregistration_whose_tombstone_lost_the_race_ends_no_lease_and_deletes_no_key(registry):
    """The key is rewritten (a re-registration with the lease) between the deregistration's read
    and its tombstone: the tombstone's compare fails, and the newer write's key stays."""
    entry, _ = await registry.register(profile("imported"), managed=True)
    real_txn = registry.client.txn
    raced = False

    async def txn_after_a_rewrite(compares: Any, success: Any, *rest: Any, **kwargs: Any) -> Any:
        nonlocal raced
        if not raced and _is_tombstone(success):
            raced = True
            await registry.register(profile("imported", port=10), lease_id=entry.lease_id, managed=True)
        return await real_txn(compares, success, *rest, **kwargs)

    registry.client.txn = txn_after_a_rewrite
    await registry.deregister("imported", entry.lease_id)
    assert raced
    _, kv = await registry.client.get(registry.keys.agent("imported"))
    assert kv is not None, "the tombstone's compare failed, yet the key was deleted"
    assert b"127.0.0.1:10" in kv.value


def _is_tombstone(ops: list[dict[str, Any]]) -> bool:
    """Whether ``ops`` writes a deregistration's tombstone (the record saying GONE)."""
    for op in ops:
        value = op.get("request_put", {}).get("value")
        if value and orjson.loads(base64.b64decode(value)).get("state") == GONE:
            return True
    return False
