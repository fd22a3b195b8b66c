"""Learned negatives live in etcd: they survive a Router restart, reach every Router, and go away
when an operator removes them."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from reachmesh.testing import RouterServer, wait_vectors
from tests.etcd.conftest import etcd_policy
from tests.routing.test_limits import TRACK, pricer, tracker

pytestmark = pytest.mark.etcd


async def _negatives(http: httpx.AsyncClient, url: str, count: int) -> list[dict[str, Any]]:
    """The learned negatives on ``url`` once there are ``count`` (the watch brings them)."""
    for _ in range(3000):  # bounded: a negative that never arrives fails the test
        negatives: list[dict[str, Any]] = (await http.get(f"{url}/admin/learned")).json()["negatives"]
        if len(negatives) == count:
            return negatives
        await asyncio.sleep(0.02)
    raise AssertionError(f"never reached {count} learned negatives")


async def test_a_learned_negative_survives_a_router_restart_and_is_removable(etcd, client) -> None:
    policy = etcd_policy(
        etcd,
        health={"enabled": False},
        routing={"semantic_tasks": ["*"]},
        embedding={"backend": "local", "threshold": 0.03, "margin": 0.005},
        limits={"loop_lag_ms": 10_000},
    )
    order, price = tracker(mode="decline"), pricer()
    await order.start()
    await price.start()
    try:
        async with RouterServer(policy) as first:
            await order.register(first.url)
            await price.register(first.url)
            body = (await client.post(f"{first.url}/reach", json={"targetTask": "cancel my order"})).json()
            assert [a["agentId"] for a in body["attempts"]] == ["order-agent", "price-agent"], body
            await _negatives(client, first.url, 1)
        async with RouterServer(policy) as again, RouterServer(policy) as other:
            (negative,) = await _negatives(client, again.url, 1)
            assert negative["phrase"] == "cancel my order" and negative["task"] == TRACK
            await _negatives(client, other.url, 1)
            for agent in (order, price):  # their leases are still live: wait for their vectors
                await wait_vectors(again.url, agent.agent_id)
            body = (await client.post(f"{again.url}/reach", json={"targetTask": "cancel my order"})).json()
            assert [a["agentId"] for a in body["attempts"]] == ["price-agent"], body
            assert len(order.received) == 1
            gone = await client.delete(
                f"{again.url}/admin/learned/negatives", params={"phrase": "cancel my order", "task": TRACK}
            )
            assert gone.status_code == 204
            await _negatives(client, other.url, 0)
        async with RouterServer(policy) as third:
            assert await _negatives(client, third.url, 0) == []
    finally:
        await order.stop()
        await price.stop()
