"""Registering an id that is taken, on a shared registry: a dead holder is replaced at once,
a live one at another endpoint keeps its id (docs/protocol.md, "Registering an id that is taken")."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from reachmesh.testing import FakeAgent, RouterServer
from tests.etcd.conftest import etcd_policy
from tests.etcd.test_shared_registry import eventually, listed

pytestmark = pytest.mark.etcd


async def renewal(client: httpx.AsyncClient, router: RouterServer, agent_id: str, lease: str) -> int:
    resp = await client.put(f"{router.url}/agents/{agent_id}/lease", json={"leaseId": lease})
    return resp.status_code


async def test_a_restart_at_the_same_endpoint_takes_over_through_either_router(etcd, client):
    """A new instance at the holder's endpoint gets a new lease at once; the old lease ends on both."""
    async with RouterServer(etcd_policy(etcd)) as a, RouterServer(etcd_policy(etcd)) as b:
        agent = await FakeAgent("restarter", result={"ok": 2}).start()
        try:
            killed = {**agent.profile(), "instanceId": "instance-token-of-the-killed-process"}
            old = await client.post(f"{a.url}/agents", json=killed)
            assert old.status_code == 201
            await eventually(lambda: listed(client, b, "restarter"))
            held = a.app.parts.registry.get("restarter")
            assert held is not None and held.backend_lease
            restarted = {**agent.profile(), "instanceId": "instance-token-of-the-restarted-one"}
            new = await client.post(f"{b.url}/agents", json=restarted)
            assert new.status_code == 201, new.text
            assert new.json()["leaseId"] != old.json()["leaseId"]
            for router in (a, b):
                assert await renewal(client, router, "restarter", old.json()["leaseId"]) == 403
                assert await renewal(client, router, "restarter", new.json()["leaseId"]) == 200
            etcd_client = b.app.parts.registry.client  # type: ignore[attr-defined]

            async def old_etcd_lease_revoked() -> bool:
                return bool(await etcd_client.keepalive(held.backend_lease) <= 0)

            await eventually(old_etcd_lease_revoked)
            resp = await client.post(f"{a.url}/reach", json={"targetTask": "echo", "payload": {}})
            assert (resp.json()["status"], resp.json()["handlerAgentId"]) == ("SUCCESS", "restarter")
        finally:
            await agent.stop()


async def test_a_router_whose_watch_lags_refuses_the_old_lease_at_once(etcd, client, monkeypatch):
    """Router a has not seen the takeover yet (its watch events are held back): the old holder's
    renewal there is already 403, the new one's 200, and the old etcd lease is gone."""
    async with RouterServer(etcd_policy(etcd)) as a, RouterServer(etcd_policy(etcd)) as b:
        agent = await FakeAgent("lagged", result={"ok": 3}).start()
        try:
            killed = {**agent.profile(), "instanceId": "instance-token-of-the-killed-process"}
            old = await client.post(f"{a.url}/agents", json=killed)
            assert old.status_code == 201
            held = a.app.parts.registry.get("lagged")
            assert held is not None and held.backend_lease
            hold_back_watch(a, monkeypatch)
            restarted = {**agent.profile(), "instanceId": "instance-token-of-the-restarted-one"}
            new = await client.post(f"{b.url}/agents", json=restarted)
            assert new.status_code == 201, new.text
            stale = a.app.parts.registry.get("lagged")
            assert stale is not None and stale.backend_lease == held.backend_lease  # a lags, as meant
            assert await renewal(client, a, "lagged", old.json()["leaseId"]) == 403
            assert await renewal(client, a, "lagged", new.json()["leaseId"]) == 200
            gone = await client.request(
                "DELETE", f"{a.url}/agents/lagged", json={"leaseId": old.json()["leaseId"]}
            )
            assert gone.status_code == 403, gone.text
            assert await renewal(client, b, "lagged", new.json()["leaseId"]) == 200
            etcd_client = b.app.parts.registry.client  # type: ignore[attr-defined]
            assert await etcd_client.keepalive(held.backend_lease) <= 0
        finally:
            await agent.stop()


async def test_a_holder_the_health_probes_mark_down_is_taken_over_from_another_endpoint(etcd, client):
    """The holder's health checks fail: another endpoint takes the id, and calls go there."""
    policy = etcd_policy(etcd, health={"interval_seconds": 0.1, "timeout_ms": 500})
    async with RouterServer(policy) as a, RouterServer(policy) as b:
        dead = await FakeAgent("taken", result={"from": "dead"}).start()
        alive = await FakeAgent("taken", result={"from": "alive"}).start()
        try:
            old = await client.post(f"{a.url}/agents", json=dead.profile())
            assert old.status_code == 201
            dead.healthy = False

            async def down_at_b() -> bool:
                row = await listed(client, b, "taken")
                return row is not None and row["status"] in ("suspect", "unhealthy")

            await eventually(down_at_b)
            new = await client.post(f"{b.url}/agents", json=alive.profile())
            assert new.status_code == 201, new.text
            assert await renewal(client, a, "taken", old.json()["leaseId"]) == 403

            async def moved_at_a() -> bool:
                row = await listed(client, a, "taken")
                return row is not None and row["endpoint"] == alive.endpoint

            await eventually(moved_at_a)
            resp = await client.post(f"{a.url}/reach", json={"targetTask": "echo", "payload": {}})
            assert resp.json()["result"] == {"from": "alive"}
        finally:
            await dead.stop()
            await alive.stop()


async def test_two_live_instances_at_different_endpoints_still_get_409(etcd, client):
    """A holder that answers its health checks keeps its id against another endpoint, at both Routers."""
    # A generous probe timeout: one probe slowed by a busy machine would mark the holder down.
    policy = etcd_policy(etcd, health={"interval_seconds": 0.1, "timeout_ms": 5000})
    async with RouterServer(policy) as a, RouterServer(policy) as b:
        first = await FakeAgent("contested-live").start()
        second = await FakeAgent("contested-live").start()
        try:
            lease = await first.register(a.url)

            async def probed_by_both() -> bool:
                return first.health_probes >= 4

            await eventually(probed_by_both)
            for router in (a, b):
                resp = await client.post(f"{router.url}/agents", json=second.profile())
                assert resp.status_code == 409
                assert resp.json()["error"]["code"] == "AGENT_ID_CONFLICT"
            assert await renewal(client, b, "contested-live", lease) == 200
        finally:
            await first.stop()
            await second.stop()


async def test_a_router_restarted_on_etcd_reads_agents_back_without_saying_it_registered_them(
    etcd, client, caplog
):
    """The agents a new Router finds in etcd are one summary line, not `registered X` each; a
    registration made after its start is still logged as one."""
    import logging

    async with RouterServer(etcd_policy(etcd)) as first:
        agent = await FakeAgent("already-there").start()
        try:
            await agent.register(first.url)
        finally:
            await agent.stop()
    # Only what the restarted Router says counts: the first one's own "registered" line is
    # captured too when an earlier test in this worker left the logger at INFO.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="reachmesh"):
        async with RouterServer(etcd_policy(etcd)) as restarted:
            assert await listed(client, restarted, "already-there") is not None
            newcomer = await FakeAgent("registered-now").start()
            try:
                await newcomer.register(restarted.url)
            finally:
                await newcomer.stop()
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[registry]")]
    assert any(line.startswith("[registry] read back from etcd: 1 agents") for line in said), said
    assert not any("already-there" in line for line in said), said
    assert any(line.startswith("[registry] registered registered-now:") for line in said), said


async def test_a_peer_report_about_the_holder_taken_over_leaves_the_new_one_routable(etcd, client):
    """A failure report about the old holder that arrives after the takeover opens no circuit on
    the new one; a report about a current holder still does (the control, applied after it)."""
    policy = etcd_policy(etcd, health={"enabled": False})
    async with RouterServer(policy) as a:
        agent = await FakeAgent("moved", result={"ok": 4}).start()
        control = await FakeAgent("control", result={"ok": 5}).start()
        try:
            killed = {**agent.profile(), "instanceId": "instance-token-of-the-killed-process"}
            assert (await client.post(f"{a.url}/agents", json=killed)).status_code == 201
            registry = a.app.parts.registry
            old_lease = registry.get("moved").backend_lease  # type: ignore[union-attr]
            restarted = {**agent.profile(), "instanceId": "instance-token-of-the-restarted-one"}
            assert (await client.post(f"{a.url}/agents", json=restarted)).status_code == 201
            assert (await client.post(f"{a.url}/agents", json=control.profile())).status_code == 201
            etcd_client, keys = registry.client, registry.keys  # type: ignore[attr-defined]
            for agent_id, lease in (("moved", old_lease), ("control", registry.get("control").backend_lease)):  # type: ignore[union-attr]
                report = {"router": "peer", "reason": "unhealthy", "at": time.time(), "lease": lease}
                await etcd_client.put(keys.failure(agent_id, "peer"), json.dumps(report).encode())

            async def control_open() -> bool:
                row = await listed(client, a, "control")
                return row is not None and row["circuit"] == "open"

            await eventually(control_open)  # watch events arrive in order: the stale one came first
            row = await listed(client, a, "moved")
            assert row is not None and row["circuit"] == "closed"
            resp = await client.post(
                f"{a.url}/reach", json={"targetAgentId": "moved", "targetTask": "echo", "payload": {}}
            )
            assert resp.json()["status"] == "SUCCESS", resp.text
        finally:
            await agent.stop()
            await control.stop()


def hold_back_watch(router: RouterServer, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make ``router``'s watch read events without applying them; returns the keys it read."""
    watcher = router.app.parts.registry.watcher  # type: ignore[attr-defined]
    read: list[str] = []
    monkeypatch.setattr(watcher, "apply", lambda events: read.extend(event.kv.key for event in events))
    return read


async def test_a_lagging_router_refuses_a_lease_id_superseded_on_the_same_etcd_lease(
    etcd, client, monkeypatch
):
    """A same-registrant retry through b issues a new leaseId on the same etcd lease: a, which has
    not seen it, refuses the old leaseId's deregistration instead of deleting the live entry."""
    async with RouterServer(etcd_policy(etcd)) as a, RouterServer(etcd_policy(etcd)) as b:
        body = {
            "id": "retried",
            "network": {"endpoint": "http://127.0.0.1:9/reach"},
            "capabilities": [{"task": "echo"}],
            "instanceId": "instance-token-of-this-process-0123456789",
        }
        first = await client.post(f"{a.url}/agents", json=body)
        assert first.status_code == 201
        hold_back_watch(a, monkeypatch)
        again = await client.post(f"{b.url}/agents", json=body)
        assert again.status_code == 200
        assert again.json()["leaseId"] != first.json()["leaseId"]
        gone = await client.request(
            "DELETE", f"{a.url}/agents/retried", json={"leaseId": first.json()["leaseId"]}
        )
        assert gone.status_code == 403, gone.text
        assert await renewal(client, a, "retried", again.json()["leaseId"]) == 200
        assert await listed(client, b, "retried") is not None


async def test_a_managed_registration_taking_over_a_dead_holder_gets_no_expiring_lease(etcd, client):
    """An admin's managed registration at a holder's endpoint takes the id over and, like any
    managed entry, sits on no etcd lease (it would otherwise vanish when that lease ran out)."""
    async with RouterServer(etcd_policy(etcd)) as a:
        body = {
            "id": "adopted",
            "network": {"endpoint": "http://127.0.0.1:9/reach"},
            "capabilities": [{"task": "echo"}],
        }
        assert (await client.post(f"{a.url}/agents", json=body)).status_code == 201
        taken = await client.post(f"{a.url}/agents", json={**body, "managed": True})
        assert taken.status_code == 201, taken.text
        etcd_client, keys = a.app.parts.registry.client, a.app.parts.registry.keys  # type: ignore[attr-defined]
        _, kv = await etcd_client.get(keys.agent("adopted"))
        assert kv is not None and kv.lease == 0


async def test_a_watch_resuming_after_its_own_writes_misses_no_other_routers_write(etcd, client, monkeypatch):
    """a's watch has read b's registration but not applied it when a writes a later revision and
    its watch restarts: it resumes from what it applied, not from its own write, and gets b's."""
    async with RouterServer(etcd_policy(etcd)) as a, RouterServer(etcd_policy(etcd)) as b:
        watcher = a.app.parts.registry.watcher  # type: ignore[attr-defined]
        apply = watcher.apply
        read = hold_back_watch(a, monkeypatch)
        theirs = {
            "id": "theirs",
            "network": {"endpoint": "http://127.0.0.1:9/reach"},
            "capabilities": [{"task": "echo"}],
        }
        assert (await client.post(f"{b.url}/agents", json=theirs)).status_code == 201
        key = a.app.parts.registry.keys.agent("theirs")  # type: ignore[attr-defined]

        async def read_by_a() -> bool:
            return key in read

        await eventually(read_by_a)
        ours = {**theirs, "id": "ours", "network": {"endpoint": "http://127.0.0.1:10/reach"}}
        assert (await client.post(f"{a.url}/agents", json=ours)).status_code == 201
        monkeypatch.setattr(watcher, "apply", apply)
        a.app.parts.registry._restart.set()  # type: ignore[attr-defined]
        await eventually(lambda: listed(client, a, "theirs"))
