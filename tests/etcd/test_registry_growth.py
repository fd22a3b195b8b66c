"""One agent token must not fill etcd: unchanged re-registrations write nothing, the Router
compacts etcd's history, and a full etcd (NOSPACE) takes the Router out of /readyz with the reason."""

from __future__ import annotations

import asyncio
import base64
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from reachmesh.cli.etcd import EtcdCluster
from reachmesh.registry.etcd import EtcdRegistry
from reachmesh.registry.etcdclient import EtcdClient, EtcdRejected
from reachmesh.testing import RouterServer
from tests.etcd.conftest import etcd_policy

pytestmark = pytest.mark.etcd


def profile(agent_id: str, description: str = "") -> dict[str, Any]:
    return {
        "id": agent_id,
        "network": {"endpoint": "http://127.0.0.1:9/reach"},
        "capabilities": [{"task": "t", "description": description}],
    }


def registry_of(router: RouterServer) -> EtcdRegistry:
    registry = router.app.parts.registry
    assert isinstance(registry, EtcdRegistry)
    return registry


async def mod_revision(registry: EtcdRegistry, agent_id: str) -> int:
    _, kv = await registry.client.get(registry.keys.agent(agent_id))
    assert kv is not None
    return kv.mod_revision


async def test_an_unchanged_re_registration_writes_no_new_revision(etcd: EtcdCluster, client) -> None:
    """Five re-registrations in place with the same profile leave the key's revision where it
    was (each wrote a whole new revision before) and keep the lease; a changed one writes."""
    async with RouterServer(etcd_policy(etcd, health={"enabled": False})) as router:
        resp = await client.post(f"{router.url}/agents", json=profile("same-agent"))
        assert resp.status_code == 201, resp.text
        lease = resp.json()["leaseId"]
        registry = registry_of(router)
        first = await mod_revision(registry, "same-agent")
        for _ in range(5):
            resp = await client.post(f"{router.url}/agents", json={**profile("same-agent"), "leaseId": lease})
            assert resp.status_code == 200, resp.text
            assert resp.json()["leaseId"] == lease and resp.json()["status"] == "available"
        assert await mod_revision(registry, "same-agent") == first
        changed = {**profile("same-agent", "now with a description"), "leaseId": lease}
        resp = await client.post(f"{router.url}/agents", json=changed)
        assert resp.status_code == 200, resp.text
        assert await mod_revision(registry, "same-agent") > first
        resp = await client.put(f"{router.url}/agents/same-agent/lease", json={"leaseId": lease})
        assert resp.status_code == 200, resp.text


async def test_the_router_compacts_etcds_history(etcd: EtcdCluster, client) -> None:
    """With registry.etcd.compact_interval_seconds, the revisions of a re-registered profile are
    compacted away (etcd 3.4 kept them all, and re-registrations filled its quota)."""
    compacting = {"etcd": {"compact_interval_seconds": 0.2}}
    policy = etcd_policy(etcd, health={"enabled": False}, registry=compacting)
    async with RouterServer(policy) as router:
        resp = await client.post(f"{router.url}/agents", json=profile("churn-agent"))
        assert resp.status_code == 201, resp.text
        lease = resp.json()["leaseId"]
        registry = registry_of(router)
        old = await mod_revision(registry, "churn-agent")
        for i in range(3):
            body = {**profile("churn-agent", f"version {i}"), "leaseId": lease}
            resp = await client.post(f"{router.url}/agents", json=body)
            assert resp.status_code == 200, resp.text
        key = registry.keys.agent("churn-agent")
        deadline = time.monotonic() + 30
        while True:
            try:
                await registry.client.call("/v3/kv/range", {"key": _b64(key), "revision": str(old)})
            except EtcdRejected as exc:
                assert exc.code == 11 and "compacted" in exc.message
                break
            assert time.monotonic() < deadline, "the old revision was never compacted"
            await asyncio.sleep(0.1)
        assert registry.compactor.compacted >= old


async def test_a_full_etcd_takes_the_router_out_of_readyz_with_the_reason(tmp_path: Path, client) -> None:
    """etcd with a 1 MiB quota, filled by something else: its NOSPACE alarm makes /readyz 503
    with the reason (it said `ready` while every registration got 503), a registration's 503
    says what is wrong, and once the operator compacts, defragments and disarms, it is ready."""
    with EtcdCluster(tmp_path / "etcd", 1, extra_args=["--quota-backend-bytes=1048576"]) as etcd:
        # The default compaction interval (300 s) is far beyond the test: nothing compacts here.
        policy = etcd_policy(etcd, health={"enabled": False})
        async with RouterServer(policy) as router:
            await readyz_until(client, router.url, 200)
            operator = EtcdClient(etcd.endpoints.split(","), deadline=20)
            await operator.open()
            try:
                revision = await fill(operator)
                answer = await readyz_until(client, router.url, 503)
                assert answer["status"] == "not_ready" and "NOSPACE" in answer["reason"]
                resp = await client.post(f"{router.url}/agents", json=profile("late-agent"))
                assert resp.status_code == 503, resp.text
                error = resp.json()["error"]
                assert error["code"] == "REGISTRY_UNAVAILABLE" and "NOSPACE" in error["message"]
                await operator.compact(revision)
                await operator.call("/v3/maintenance/defragment", {})
                alarms = await operator.call("/v3/maintenance/alarm", {"action": "GET"})
                for alarm in alarms.get("alarms") or []:
                    await operator.call("/v3/maintenance/alarm", {"action": "DEACTIVATE", **alarm})
                await readyz_until(client, router.url, 200)
                resp = await client.post(f"{router.url}/agents", json=profile("late-agent"))
                assert resp.status_code == 201, resp.text
            finally:
                await operator.close()


async def fill(operator: EtcdClient) -> int:
    """Write 100 KB values outside the Router's prefix until etcd refuses: the last revision."""
    revision = 0
    for _ in range(200):
        try:
            revision = await operator.put("/junk", b"x" * 100_000)
        except EtcdRejected as exc:
            assert "database space exceeded" in exc.message
            return revision
    raise AssertionError("etcd never raised NOSPACE")


async def readyz_until(http: httpx.AsyncClient, url: str, status: int) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        resp = await http.get(f"{url}/readyz")
        if resp.status_code == status:
            answer: dict[str, Any] = resp.json()
            return answer
        assert time.monotonic() < deadline, f"/readyz stayed {resp.status_code}: {resp.text}"
        await asyncio.sleep(0.1)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()
