"""Metric series follow the registry: register, call, deregister (or be swept) leaves none behind."""

from __future__ import annotations

import asyncio

import httpx

from reachmesh.clock import ManualClock
from reachmesh.config import RegistryPolicy, RouterConfig
from reachmesh.registry.memory import MemoryRegistry
from reachmesh.testing import FakeAgent, RouterServer
from tests.helpers import scaled, until

ROUNDS = 40


def profile(agent_id: str, task: str, endpoint: str) -> dict[str, object]:
    return {"id": agent_id, "network": {"endpoint": endpoint}, "capabilities": [{"task": task}]}


async def test_churned_agents_leave_no_series_in_metrics() -> None:
    """40 agents, each with a task of its own, register, are called (some fail) and leave: half
    deregistered, half offline and then swept. /metrics then names none of them nor their tasks,
    and the agent that stayed keeps its series and counts."""
    clock = ManualClock()
    registry = MemoryRegistry(RegistryPolicy(lease_ttl_seconds=10, offline_grace_seconds=5), clock=clock)
    config = RouterConfig.model_validate(
        {"embedding": {"backend": "none"}, "health": {"enabled": False}, "limits": {"loop_lag_ms": 10_000}}
    )
    async with (
        RouterServer(config, registry=registry, clock=clock) as router,
        httpx.AsyncClient(base_url=router.url, timeout=15) as http,
    ):
        good = await FakeAgent("stay").start()
        bad = await FakeAgent("bad", mode="http500").start()
        try:
            await good.register(router.url, vectors=False)
            assert (await http.post("/reach", json={"targetTask": "echo"})).json()["status"] == "SUCCESS"
            leases: dict[str, str] = {}
            for i in range(ROUNDS):
                agent_id, task = f"churn-{i}", f"churntask-{i}"
                endpoint = (bad if i % 4 == 0 else good).endpoint
                resp = await http.post("/agents", json=profile(agent_id, task, endpoint))
                assert resp.status_code == 201, resp.text
                leases[agent_id] = resp.json()["leaseId"]
                await http.post("/reach", json={"targetTask": task, "payload": {"i": i}})
            # churn-1 registers again in place without its task: that task's series go at once.
            moved = profile("churn-1", "churnother-1", good.endpoint)
            assert (await http.post("/agents", json={**moved, "leaseId": leases["churn-1"]})).status_code in (
                200,
                201,
            )
            before = (await http.get("/metrics")).text
            assert 'task="churntask-1"' not in before
            assert "churn-7" in before and "churntask-8" in before
            for i in range(0, ROUNDS, 2):
                resp = await http.delete(
                    f"/agents/churn-{i}", headers={"X-Reach-Lease": leases[f"churn-{i}"]}
                )
                assert resp.status_code == 204
            # The rest lapse: the lease runs out (offline), then the grace period (swept).
            await good.register(router.url, vectors=False)  # "stay" renews: it is not churn
            clock.advance(11)
            registry.sweep()
            clock.advance(6)
            await good.register(router.url, vectors=False)
            registry.sweep()
            agents = (await http.get("/admin/agents")).json()
            assert [row["id"] for row in agents] == ["stay"]
            after = (await http.get("/metrics")).text
        finally:
            await good.stop()
            await bad.stop()
    left = [line for line in after.splitlines() if "churn" in line]
    assert left == [], left[:5]
    assert 'reach_requests_total{agent="stay",status="SUCCESS",task="echo"} 1.0' in after
    assert 'reach_end_to_end_latency_seconds_count{task="echo"} 1.0' in after


async def test_a_call_that_ends_after_its_agent_left_brings_no_series_back() -> None:
    """A call held at the agent while the agent deregisters: when it ends, it is counted under
    agent _none and task _unknown, not under the id and task that are gone."""
    config = RouterConfig.model_validate(
        {"embedding": {"backend": "none"}, "health": {"enabled": False}, "limits": {"loop_lag_ms": 10_000}}
    )
    # The call is held at the agent across a DELETE: its read timeout (3 s by default, not
    # scaled) must not end it first on a busy machine.
    held_ms = int(scaled(20_000))
    envelope = {"targetTask": "leavingtask", "preferences": {"timeoutMs": held_ms, "readTimeoutMs": held_ms}}
    async with (
        RouterServer(config) as router,
        httpx.AsyncClient(base_url=router.url, timeout=scaled(30)) as http,
    ):
        agent = await FakeAgent("leaving", tasks=("leavingtask",), hold=asyncio.Event()).start()
        try:
            await agent.register(router.url, vectors=False)
            call = asyncio.create_task(http.post("/reach", json=envelope))
            await until(lambda: agent.received, "the call at the agent", within=20)
            resp = await http.delete("/agents/leaving", headers={"X-Reach-Lease": agent.lease_id or ""})
            assert resp.status_code == 204
            assert agent.hold is not None
            agent.hold.set()
            assert (await call).json()["status"] == "SUCCESS"
            after = (await http.get("/metrics")).text
        finally:
            await agent.stop()
    assert [line for line in after.splitlines() if "leaving" in line] == []
    assert 'reach_requests_total{agent="_none",status="SUCCESS",task="_unknown"} 1.0' in after
