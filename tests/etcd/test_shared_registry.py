"""Two Routers over one real etcd: what one learns, the other knows."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest

from reachmesh.config import RouterConfig
from reachmesh.testing import FakeAgent, RouterServer
from tests.etcd.conftest import etcd_policy
from tests.helpers import scaled

pytestmark = pytest.mark.etcd


async def listed(http: httpx.AsyncClient, router: RouterServer, agent_id: str) -> dict[str, Any] | None:
    resp = await http.get(f"{router.url}/admin/agents/{agent_id}")
    return resp.json() if resp.status_code == 200 else None


async def eventually(check: Any, limit_s: float = 10.0) -> float:
    """Await ``check()`` until it is true, within ``limit_s`` times the suite's time scale;
    returns how long it took (printed, never asserted)."""
    limit_s = scaled(limit_s)
    start = time.monotonic()
    while not await check():
        if time.monotonic() - start > limit_s:
            raise AssertionError(f"not true after {limit_s} s")
        await asyncio.sleep(0.01)
    return time.monotonic() - start


async def test_an_agent_registered_through_one_router_is_routed_through_the_other(etcd, client):
    """A registration at A is listed and routed to at B, with no agent traffic to B's registry."""
    async with RouterServer(etcd_policy(etcd)) as a, RouterServer(etcd_policy(etcd)) as b:
        agent = await FakeAgent("echo-1", result={"ok": 1}).start()
        try:
            await agent.register(a.url)
            took = await eventually(lambda: listed(client, b, "echo-1"))
            print(f"seen at B after {took * 1000:.1f} ms")
            resp = await client.post(f"{b.url}/reach", json={"targetTask": "echo", "payload": {"n": 1}})
            assert resp.json()["status"] == "SUCCESS"
            assert resp.json()["result"] == {"ok": 1}
            assert resp.json()["handlerAgentId"] == "echo-1"
        finally:
            await agent.stop()


async def test_a_conflicting_id_at_the_other_router_is_409_and_its_lease_renews_there(etcd, client):
    """B refuses an id A holds, renews A's lease, and lets the holder deregister through it."""
    async with RouterServer(etcd_policy(etcd)) as a, RouterServer(etcd_policy(etcd)) as b:
        agent = await FakeAgent("echo-1").start()
        try:
            lease = await agent.register(a.url)
            other = {**agent.profile(), "network": {"endpoint": "http://127.0.0.1:9/reach"}}
            resp = await client.post(f"{b.url}/agents", json=other)
            assert resp.status_code == 409
            assert resp.json()["error"]["code"] == "AGENT_ID_CONFLICT"
            resp = await client.put(f"{b.url}/agents/echo-1/lease", json={"leaseId": lease})
            assert resp.status_code == 200
            resp = await client.put(f"{b.url}/agents/echo-1/lease", json={"leaseId": "0x" + "0" * 32})
            assert resp.status_code == 403
            resp = await client.delete(f"{b.url}/agents/echo-1", headers={"X-Reach-Lease": lease})
            assert resp.status_code == 204

            async def gone_at_a() -> bool:
                return await listed(client, a, "echo-1") is None

            took = await eventually(gone_at_a)
            print(f"deregistration through B seen at A after {took * 1000:.1f} ms")
        finally:
            await agent.stop()


async def test_two_routers_racing_for_one_id_accept_it_once(etcd, client):
    """Registrations of one id from two endpoints through two Routers at once: exactly one wins."""
    async with RouterServer(etcd_policy(etcd)) as a, RouterServer(etcd_policy(etcd)) as b:
        bodies = [
            {
                "id": "contested",
                "network": {"endpoint": f"http://127.0.0.1:{port}/reach"},
                "capabilities": [{"task": "echo"}],
            }
            for port in (9001, 9002)
        ]
        for _ in range(5):
            answers = await asyncio.gather(
                client.post(f"{a.url}/agents", json=bodies[0]), client.post(f"{b.url}/agents", json=bodies[1])
            )
            codes = sorted(r.status_code for r in answers)
            assert codes == [201, 409], codes
            winner = next(r for r in answers if r.status_code == 201).json()
            resp = await client.delete(
                f"{a.url}/agents/contested", headers={"X-Reach-Lease": winner["leaseId"]}
            )
            assert resp.status_code == 204


async def test_the_same_registrant_retrying_through_the_other_router_gets_a_lease(etcd, client):
    """A lost answer retried at another Router (same instanceId and endpoint) is 200, not 409."""
    async with RouterServer(etcd_policy(etcd)) as a, RouterServer(etcd_policy(etcd)) as b:
        body = {
            "id": "retrier",
            "network": {"endpoint": "http://127.0.0.1:9003/reach"},
            "capabilities": [{"task": "echo"}],
            "instanceId": "instance-token-of-this-process-0123456789",
        }
        first = await client.post(f"{a.url}/agents", json=body)
        assert first.status_code == 201
        again = await client.post(f"{b.url}/agents", json=body)
        assert again.status_code == 200
        lease = again.json()["leaseId"]
        resp = await client.put(f"{a.url}/agents/retrier/lease", json={"leaseId": lease})
        assert resp.status_code == 200


async def test_an_expired_lease_is_seen_offline_by_both_routers(etcd, client):
    """A lease nobody renews is deleted by etcd itself, and both Routers mark the agent offline."""
    policy = etcd_policy(etcd, registry={"lease_ttl_seconds": 2})
    async with RouterServer(policy) as a, RouterServer(policy) as b:
        agent = await FakeAgent("short-lived").start()
        try:
            await agent.register(a.url)
            await eventually(lambda: listed(client, b, "short-lived"))

            async def offline_at(router: RouterServer) -> bool:
                status = await listed(client, router, "short-lived")
                return status is not None and status["status"] == "offline"

            await eventually(lambda: offline_at(a))
            await eventually(lambda: offline_at(b))
            resp = await client.post(f"{b.url}/reach", json={"targetTask": "echo", "payload": {}})
            assert resp.json()["status"] == "NO_AVAILABLE_HANDLER"
        finally:
            await agent.stop()


async def test_a_circuit_opened_by_one_router_keeps_the_other_away(etcd, client):
    """A failing agent behind two Routers costs one breaker threshold of attempts, not two."""
    policy = etcd_policy(
        etcd,
        breaker={"failure_threshold": 3, "open_seconds": 30},
        retries={"max_per_request": 0},
        health={"enabled": False},
    )
    async with RouterServer(policy) as a, RouterServer(policy) as b:
        agent = await FakeAgent("flaky", mode="http500").start()
        try:
            await agent.register(a.url)
            await eventually(lambda: listed(client, b, "flaky"))
            for _ in range(3):
                resp = await client.post(f"{a.url}/reach", json={"targetTask": "echo", "payload": {}})
                assert resp.json()["status"] != "SUCCESS"
            assert len(agent.received) == 3

            async def open_at_b() -> bool:
                status = await listed(client, b, "flaky")
                return status is not None and status["circuit"] == "open"

            took = await eventually(open_at_b)
            print(f"B opened its circuit {took * 1000:.1f} ms after A's")
            for _ in range(5):
                resp = await client.post(f"{b.url}/reach", json={"targetTask": "echo", "payload": {}})
                assert resp.json()["status"] == "NO_AVAILABLE_HANDLER"
            assert len(agent.received) == 3  # B paid nothing of its own
        finally:
            await agent.stop()


async def test_a_router_started_later_loads_the_registry_and_routes_at_once(etcd, client):
    """A Router joining (or restarting) is ready with every agent from etcd, none re-registering."""
    async with RouterServer(etcd_policy(etcd)) as a:
        agents = [await FakeAgent(f"agent-{i}").start() for i in range(20)]
        try:
            for agent in agents:
                await agent.register(a.url)
            async with RouterServer(etcd_policy(etcd)) as late:
                resp = await client.get(f"{late.url}/readyz")
                assert resp.status_code == 200
                listing = (await client.get(f"{late.url}/admin/agents")).json()
                assert sorted(s["id"] for s in listing) == sorted(a.agent_id for a in agents)
                resp = await client.post(f"{late.url}/reach", json={"targetTask": "echo", "payload": {}})
                assert resp.json()["status"] == "SUCCESS"
        finally:
            for agent in agents:
                await agent.stop()


async def test_a_compacted_revision_makes_the_router_read_everything_again(etcd, client):
    """A watch that must resume from a compacted revision resyncs in full and misses nothing."""
    async with RouterServer(etcd_policy(etcd)) as a, RouterServer(etcd_policy(etcd)) as b:
        registry = b.app.parts.registry
        before = registry.resyncs  # type: ignore[attr-defined]
        agent = await FakeAgent("echo-1").start()
        try:
            await agent.register(a.url)
            # B has applied everything up to here: the reset below is what puts it behind.
            await eventually(lambda: listed(client, b, "echo-1"))
            head = (
                await client.post(etcd.members[0].client_url + "/v3/kv/range", json={"key": "AA=="})
            ).json()
            revision = int(head["header"]["revision"])
            await client.post(
                etcd.members[0].client_url + "/v3/kv/compaction", json={"revision": str(revision)}
            )
            # B pretends it fell behind: its next watch asks for revisions etcd no longer has.
            registry.revision = 0  # type: ignore[attr-defined]
            registry._restart.set()  # type: ignore[attr-defined]

            async def resynced() -> bool:
                return registry.resyncs > before  # type: ignore[attr-defined,no-any-return]

            await eventually(resynced)
            assert await listed(client, b, "echo-1") is not None
            other = await FakeAgent("echo-2").start()
            try:
                await other.register(a.url)
                await eventually(lambda: listed(client, b, "echo-2"))  # and the watch goes on
            finally:
                await other.stop()
        finally:
            await agent.stop()


async def test_a_managed_registration_is_shared_and_never_expires(etcd, client):
    """An admin's lease-less registration (an imported A2A agent) lives in etcd until deregistered."""
    policy = etcd_policy(etcd, registry={"lease_ttl_seconds": 2})
    async with RouterServer(policy) as a, RouterServer(policy) as b:
        body = {
            "id": "imported",
            "network": {"endpoint": "http://127.0.0.1:9/reach"},
            "capabilities": [{"task": "echo"}],
            "managed": True,
        }
        resp = await client.post(f"{a.url}/agents", json=body)
        assert resp.status_code == 201, resp.text
        lease = resp.json()["leaseId"]
        await eventually(lambda: listed(client, b, "imported"))
        key = "/agent-reach/v1/agents/imported"
        raw = (await client.post(etcd.members[0].client_url + "/v3/kv/range", json={"key": _b64(key)})).json()
        assert raw["kvs"][0].get("lease", "0") == "0"  # no etcd lease: nothing expires it
        assert (
            await client.put(f"{b.url}/agents/imported/lease", json={"leaseId": lease})
        ).status_code == 200
        resp = await client.delete(f"{b.url}/agents/imported", headers={"X-Reach-Lease": lease})
        assert resp.status_code == 204

        async def gone_everywhere() -> bool:
            return await listed(client, a, "imported") is None and await listed(client, b, "imported") is None

        await eventually(gone_everywhere)
        raw = (await client.post(etcd.members[0].client_url + "/v3/kv/range", json={"key": _b64(key)})).json()
        assert not raw.get("kvs")


def _b64(text: str) -> str:
    import base64

    return base64.b64encode(text.encode()).decode()


async def test_an_agent_token_quota_holds_under_concurrent_registrations(etcd, client, monkeypatch):
    """Ten registrations of one token at once through one Router: its quota of 2 holds, and an
    agent whose lease expired no longer counts against it."""
    monkeypatch.setenv("REACH_AGENT_TOKEN", "quota-agent-token-1234")
    monkeypatch.setenv("REACH_ADMIN_TOKEN", "quota-admin-token-5678")
    headers = {"Authorization": "Bearer quota-agent-token-1234"}
    admin = {"Authorization": "Bearer quota-admin-token-5678"}
    policy = etcd_policy(etcd, registry={"max_agents_per_token": 2, "lease_ttl_seconds": 2})
    async with RouterServer(policy) as a:
        bodies = [
            {
                "id": f"q-{i}",
                "network": {"endpoint": "http://127.0.0.1:9/reach"},
                "capabilities": [{"task": "t"}],
            }
            for i in range(10)
        ]
        answers = await asyncio.gather(
            *(client.post(f"{a.url}/agents", json=b, headers=headers) for b in bodies)
        )
        codes = sorted(r.status_code for r in answers)
        assert codes.count(201) == 2, codes
        assert set(codes) == {201, 503}

        async def both_offline() -> bool:
            rows = (await client.get(f"{a.url}/admin/agents", headers=admin)).json()
            return bool(rows) and all(row["status"] == "offline" for row in rows)

        await eventually(both_offline)
        resp = await client.post(f"{a.url}/agents", json={**bodies[0], "id": "q-new"}, headers=headers)
        assert resp.status_code == 201, resp.text


async def test_a_record_under_another_ids_key_is_ignored(etcd, client):
    """A value written into etcd by something else, naming another id, never enters the snapshot."""
    async with RouterServer(etcd_policy(etcd)) as a:
        agent = await FakeAgent("beta").start()
        try:
            await agent.register(a.url)
            stolen: dict[str, Any] = {**agent.profile(), "network": {"endpoint": "http://127.0.0.1:9/reach"}}
            forged: dict[str, Any] = {
                "state": "live",
                "profile": stolen,
                "ttl": 60,
                "leaseDigest": "x",
            }
            put = {"key": _b64("/agent-reach/v1/agents/evil"), "value": _b64(json.dumps(forged))}
            await client.post(etcd.members[0].client_url + "/v3/kv/put", json=put)
            nan = {**forged, "profile": {**stolen, "id": "nan-ttl"}, "ttl": "nan"}
            put = {"key": _b64("/agent-reach/v1/agents/nan-ttl"), "value": _b64(json.dumps(nan))}
            await client.post(etcd.members[0].client_url + "/v3/kv/put", json=put)
            marker = await FakeAgent("marker").start()
            try:
                await marker.register(a.url)  # written after both: once it is seen, they were too
                await eventually(lambda: listed(client, a, "marker"))
            finally:
                await marker.stop()
            beta = await listed(client, a, "beta")
            assert beta is not None and beta["endpoint"] == agent.endpoint
            assert await listed(client, a, "evil") is None
            assert await listed(client, a, "nan-ttl") is None
        finally:
            await agent.stop()


async def test_a_same_registrant_retry_through_the_same_router_keeps_its_lease(etcd, client):
    """A lost answer retried through the Router that granted the lease gets that very lease back."""
    async with RouterServer(etcd_policy(etcd)) as a:
        body = {
            "id": "retrier",
            "network": {"endpoint": "http://127.0.0.1:9003/reach"},
            "capabilities": [{"task": "echo"}],
            "instanceId": "instance-token-of-this-process-0123456789",
        }
        first = (await client.post(f"{a.url}/agents", json=body)).json()
        again = await client.post(f"{a.url}/agents", json=body)
        assert again.status_code == 200
        assert again.json()["leaseId"] == first["leaseId"]
        assert again.json()["ttlSeconds"] == first["ttlSeconds"] == 60


async def test_deregistering_an_offline_entry_answers_as_the_memory_registry_does(etcd, client):
    """An entry whose lease ran out: a wrong leaseId is 403, its own removes it (204), then 404;
    the same answers from an in-memory Router and from one on etcd."""
    answers = {}
    for backend, policy in (
        (
            "memory",
            RouterConfig.model_validate(
                {"registry": {"lease_ttl_seconds": 1}, "embedding": {"backend": "none"}}
            ),
        ),
        ("etcd", etcd_policy(etcd, registry={"lease_ttl_seconds": 1})),
    ):
        async with RouterServer(policy) as router:
            body = {
                "id": "lapsed",
                "network": {"endpoint": "http://127.0.0.1:9/reach"},
                "capabilities": [{"task": "echo"}],
            }
            lease = (await client.post(f"{router.url}/agents", json=body)).json()["leaseId"]

            async def offline() -> bool:
                row = await listed(client, router, "lapsed")
                return row is not None and row["status"] == "offline"

            await eventually(offline)
            codes = []
            for attempt in ("not-the-lease-" + "0" * 20, lease, lease):
                resp = await client.request(
                    "DELETE", f"{router.url}/agents/lapsed", json={"leaseId": attempt}
                )
                codes.append(resp.status_code)
            answers[backend] = (codes, await listed(client, router, "lapsed"))
    assert answers["memory"] == answers["etcd"] == ([403, 204, 404], None)
