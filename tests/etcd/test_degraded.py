"""etcd out of reach: Routers go on routing from their snapshot, writes fail fast, then resync."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from reachmesh.testing import FakeAgent, RouterServer
from tests.etcd.conftest import etcd_policy
from tests.etcd.test_shared_registry import eventually, listed

pytestmark = pytest.mark.etcd

FREEZE_S = 10.0


async def state(http: httpx.AsyncClient, router: RouterServer) -> str:
    return str((await http.get(f"{router.url}/readyz")).json()["status"])


async def test_a_frozen_etcd_leaves_routing_untouched_and_writes_fail_fast(etcd, client):
    """SIGSTOP etcd for 10 s: zero failed requests, a quick 503 for writes, a resync after."""
    policy = etcd_policy(etcd, registry={"etcd": {"ping_interval_seconds": 0.5}})
    async with RouterServer(policy) as a, RouterServer(policy) as b:
        agent = await FakeAgent("steady", result={"ok": True}).start()
        try:
            lease = await agent.register(a.url)
            await eventually(lambda: listed(client, b, "steady"))
            etcd.members[0].freeze()
            frozen_at = time.monotonic()
            try:

                async def degraded() -> bool:
                    return await state(client, a) == "degraded" and await state(client, b) == "degraded"

                took = await eventually(degraded)
                print(f"degraded after {took:.2f} s")
                metrics = (await client.get(f"{a.url}/metrics")).text
                assert "reach_registry_degraded 1.0" in metrics
                started = time.monotonic()
                resp = await client.post(
                    f"{b.url}/agents",
                    json={
                        "id": "newcomer",
                        "network": {"endpoint": "http://127.0.0.1:9/reach"},
                        "capabilities": [{"task": "echo"}],
                    },
                )
                refused_in = time.monotonic() - started
                print(f"registration refused in {refused_in:.2f} s")
                assert resp.status_code == 503
                assert resp.json()["error"]["code"] == "REGISTRY_UNAVAILABLE"
                resp = await client.put(f"{a.url}/agents/steady/lease", json={"leaseId": lease})
                assert resp.status_code == 503
                statuses: list[str] = []
                # Until the freeze has lasted FREEZE_S, and at least 20 requests whatever the
                # detection and the refusals above took on a slow machine.
                while time.monotonic() - frozen_at < FREEZE_S or len(statuses) < 20:
                    for router in (a, b):
                        reply = await client.post(
                            f"{router.url}/reach", json={"targetTask": "echo", "payload": {}}
                        )
                        statuses.append(reply.json()["status"])
                    await asyncio.sleep(0.05)
                print(f"{len(statuses)} requests while etcd was frozen")
                assert set(statuses) == {"SUCCESS"}
            finally:
                etcd.members[0].thaw()

            async def ready_again() -> bool:
                return await state(client, a) == "ready" and await state(client, b) == "ready"

            took = await eventually(ready_again)
            print(f"ready again {took:.2f} s after etcd came back")
            newcomer = await FakeAgent("newcomer").start()
            try:
                await newcomer.register(b.url)
                await eventually(lambda: listed(client, a, "newcomer"))
            finally:
                await newcomer.stop()
        finally:
            await agent.stop()


async def test_a_router_started_while_etcd_is_down_is_not_ready_until_it_loads(etcd, client):
    """With no snapshot yet, /readyz is 503 (out of rotation), and 200 once etcd answers."""
    etcd.members[0].freeze()
    try:
        policy = etcd_policy(
            etcd, registry={"etcd": {"request_timeout_seconds": 0.5, "attempt_timeout_seconds": 0.2}}
        )
        async with RouterServer(policy) as router:
            resp = await client.get(f"{router.url}/readyz")
            assert resp.status_code == 503
            assert "etcd" in resp.json()["reason"]
            etcd.members[0].thaw()

            async def ready() -> bool:
                resp: httpx.Response = await client.get(f"{router.url}/readyz")
                return resp.status_code == 200

            await eventually(ready)
    finally:
        etcd.members[0].thaw()


async def test_a_frozen_etcd_refuses_async_requests_saying_why_within_one_attempt(etcd, client):
    """Degraded, a Router refuses an async request it cannot record as registrations are refused:
    within one attempt (`attempt_timeout_seconds`), not the whole `request_timeout_seconds` (the
    suite's 20 s: the walk of round 49 saw 4 s, the default, while `/readyz` said degraded), and
    saying that etcd did not record it, not "the Router is shedding load". A result another
    Router would have to read from etcd is refused the same way."""
    policy = etcd_policy(
        etcd, registry={"etcd": {"ping_interval_seconds": 0.5, "attempt_timeout_seconds": 1.5}}
    )
    async with RouterServer(policy) as router:
        etcd.members[0].freeze()
        try:
            await eventually(lambda: _is_degraded(client, router))
            # Why, per member: silent here (frozen), as opposed to refusing connections.
            reason = (await client.get(f"{router.url}/readyz")).json()["reason"]
            assert f"{etcd.endpoints.split(',')[0]} (no answer within 1.5 s)" in reason, reason
            body = {"targetTask": "echo", "preferences": {"mode": "async"}}
            refused = await client.post(f"{router.url}/reach", json=body, timeout=60)
            assert refused.status_code == 429, refused.text
            assert refused.headers["Retry-After"] == "1"
            error = refused.json()["error"]
            assert error["code"] == "OVERLOADED"
            assert error["message"].startswith("not accepted: an async request is recorded in etcd")
            assert "shedding load" not in error["message"]
            assert "within 1.5 s" in error["message"], error["message"]
            assert "mode sync" in error["message"]
            unread = await client.get(f"{router.url}/reach/never-seen-here", timeout=60)
            assert unread.status_code == 503
            assert "within 1.5 s" in unread.json()["error"]["message"], unread.text
        finally:
            etcd.members[0].thaw()


async def _is_degraded(http: httpx.AsyncClient, router: RouterServer) -> bool:
    return await state(http, router) == "degraded"
