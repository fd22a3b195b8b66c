"""Learned routes travel through etcd: what one Router learns routes on another."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from reachmesh.testing import FakeAgent, RouterServer
from tests.etcd.conftest import etcd_policy
from tests.helpers import scaled

pytestmark = pytest.mark.etcd


async def _count(
    http: httpx.AsyncClient, url: str, count: int, phrases: set[str] | None = None
) -> dict[str, Any]:
    """GET /admin/learned on ``url`` once it lists ``count`` routes, or exactly ``phrases``
    (the watch brings them)."""
    deadline = time.monotonic() + scaled(60)
    while time.monotonic() < deadline:  # bounded: a route that never arrives fails the test
        listing: dict[str, Any] = (await http.get(f"{url}/admin/learned")).json()
        if listing["count"] == count and (
            phrases is None or {r["phrase"] for r in listing["learned"]} == phrases
        ):
            return listing
        await asyncio.sleep(0.02)
    raise AssertionError(f"never reached {count} learned routes {sorted(phrases or ())}")


async def test_a_route_learned_on_one_router_routes_on_the_other(etcd, client) -> None:
    """Confirmed on A, it routes on B; forgotten on B, A stops routing it; the bound holds
    across both; a Router started later reads them all."""
    policy = etcd_policy(
        etcd, routing={"learning": {"enabled": True, "max_phrases": 2}}, health={"enabled": False}
    )
    agent = await FakeAgent("parcel", tasks=("track_parcel",)).start()
    try:
        async with RouterServer(policy) as a, RouterServer(policy) as b:
            await agent.register(a.url)
            made = await client.post(
                f"{a.url}/admin/learned", json={"phrase": "Where is my parcel", "task": "track_parcel"}
            )
            assert made.status_code == 201, made.text
            await _count(client, b.url, 1)
            routed = (await client.post(f"{b.url}/reach", json={"targetTask": "where is my parcel"})).json()
            assert routed["status"] == "SUCCESS", routed
            assert (
                await client.delete(f"{b.url}/admin/learned", params={"phrase": "WHERE is my parcel"})
            ).status_code == 204
            await _count(client, a.url, 0)
            refused = (await client.post(f"{a.url}/reach", json={"targetTask": "where is my parcel"})).json()
            assert refused["status"] == "NO_AVAILABLE_HANDLER"
            for i, router in enumerate((a, b, a)):
                made = await client.post(
                    f"{router.url}/admin/learned", json={"phrase": f"phrase {i}", "task": "track_parcel"}
                )
                assert made.status_code == 201
                # The bound holds on the other Router too: the oldest phrase leaves it.
                latest = {f"phrase {j}" for j in range(max(0, i - 1), i + 1)}
                await _count(client, a.url if router is b else b.url, min(i + 1, 2), latest)
            listing = await _count(client, a.url, 2)
            assert sorted(r["phrase"] for r in listing["learned"]) == ["phrase 1", "phrase 2"]
            async with RouterServer(policy) as c:
                joined = await _count(client, c.url, 2)
                assert sorted(r["phrase"] for r in joined["learned"]) == ["phrase 1", "phrase 2"]
    finally:
        await agent.stop()


async def test_learned_routes_are_bounded_by_bytes_in_etcd_and_counted_on_metrics(etcd, client) -> None:
    """registry.etcd.max_learned_bytes: past it the oldest routes go, whatever the count bound;
    the keys and bytes held are on /metrics."""
    policy = etcd_policy(
        etcd,
        routing={"learning": {"enabled": True, "max_phrases": 1000}},
        registry={"etcd": {"max_learned_bytes": 4096}},
        health={"enabled": False},
    )
    agent = await FakeAgent("parcel", tasks=("track_parcel",)).start()
    try:
        async with RouterServer(policy) as a:
            await agent.register(a.url)
            phrases = [f"phrase {i} " + "x" * 900 for i in range(8)]
            for phrase in phrases:
                made = await client.post(
                    f"{a.url}/admin/learned", json={"phrase": phrase, "task": "track_parcel"}
                )
                assert made.status_code == 201, made.text
            listing = (await client.get(f"{a.url}/admin/learned")).json()
            kept = {r["phrase"] for r in listing["learned"]}
            # About 1 KiB each: four fit in 4 KiB, and the newest are the ones kept.
            assert 1 <= len(kept) <= 4
            assert phrases[-1] in kept and phrases[0] not in kept
            metrics = (await client.get(f"{a.url}/metrics")).text
            values = {
                line.split()[0]: float(line.split()[1])
                for line in metrics.splitlines()
                if line.startswith("reach_etcd_")
            }
            assert values["reach_etcd_learned_routes"] == len(kept)
            assert 0 < values["reach_etcd_learned_route_bytes"] <= 4096
    finally:
        await agent.stop()
