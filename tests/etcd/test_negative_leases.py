"""Each learned negative in etcd has a lease of its own (its TTL). A negative deleted past a
bound, written again or removed by an admin must take its lease with it: before, the lease lived
on in etcd to the end of its TTL (an hour by default), so one caller token whose requests drew
declines grew etcd's leases by one a decline, whatever `negatives_per_token` kept of the keys
(600 declines, 100 keys kept: 600 leases for an hour)."""

from __future__ import annotations

import functools
import time
from typing import Any

import httpx
import pytest

from reachmesh.cli.etcd import EtcdCluster
from reachmesh.registry.base import LearnedRoute
from reachmesh.testing import RouterServer
from tests.etcd.conftest import etcd_policy
from tests.helpers import until

pytestmark = pytest.mark.etcd

QUOTA = 20


async def etcd_leases(cluster: EtcdCluster) -> int:
    endpoint = cluster.endpoints.split(",")[0]
    if not endpoint.startswith("http"):
        endpoint = f"http://{endpoint}"
    async with httpx.AsyncClient(timeout=15) as http:
        answer = await http.post(f"{endpoint}/v3/lease/leases", json={})
    return len(answer.json().get("leases") or [])


def negative(phrase: str, by: str = "fp:0a0a0a0a") -> LearnedRoute:
    now = time.time()
    return LearnedRoute(
        phrase, "track", "decline", now, agent="order-agent", lease="l1", by=by, expires=now + 3600
    )


async def test_one_tokens_negatives_hold_no_more_leases_than_keys(
    etcd: EtcdCluster, client: httpx.AsyncClient
) -> None:
    """Two Routers on one etcd, one caller token: 120 distinct negatives (alternating Routers)
    and 60 writes of five phrases again. Its keys stay at its quota, and so do the leases etcd
    holds for them; an admin's removal of one takes its lease too."""
    policy = etcd_policy(etcd, health={"enabled": False})
    async with RouterServer(policy) as a, RouterServer(policy) as b:
        registries: list[Any] = [a.app.parts.registry, b.app.parts.registry]
        baseline = await etcd_leases(etcd)
        for n in range(120):
            await registries[n % 2].remember_negative(negative(f"phrase {n}"), limit=10_000, quota=QUOTA)
            # Each Router sees the other's write before writing again (the watch brings it).
            other, key = registries[(n + 1) % 2], negative(f"phrase {n}").negative_key
            await until(functools.partial(_knows, other, key), f"negative {n} shared")
        for n in range(60):
            await registries[0].remember_negative(negative(f"again {n % 5}"), limit=10_000, quota=QUOTA)
        held = (await client.get(f"{b.url}/admin/learned")).json()["negatives"]
        assert len(held) == QUOTA
        assert await etcd_leases(etcd) - baseline == QUOTA
        gone = await client.delete(
            f"{a.url}/admin/learned/negatives", params={"phrase": "again 0", "task": "track"}
        )
        assert gone.status_code == 204
        assert await etcd_leases(etcd) - baseline == QUOTA - 1


async def _knows(registry: Any, key: tuple[str, str, str]) -> bool | None:
    return True if key in registry.negatives() else None
