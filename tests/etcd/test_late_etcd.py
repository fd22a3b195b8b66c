"""A Router started before its etcd: it listens at once, says why it is not ready, answers
/reach with a structured refusal, and turns ready by itself once etcd comes up."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import httpx
import pytest

from reachmesh.cli.etcd import EtcdCluster
from reachmesh.testing import FakeAgent, RouterServer
from tests.etcd.conftest import etcd_policy
from tests.etcd.test_shared_registry import eventually
from tests.helpers import scaled

pytestmark = pytest.mark.etcd


async def _ready(http: httpx.AsyncClient, router: RouterServer) -> bool:
    return (await http.get(f"{router.url}/readyz")).status_code == 200


async def test_a_router_started_before_etcd_serves_at_once_and_turns_ready_when_etcd_comes(
    tmp_path: Path, client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    cluster = EtcdCluster(tmp_path / "etcd", 1)  # its ports are chosen now; nothing listens yet
    # The whole deadline at its largest: a start that waited for it would not be done within
    # the bound below (the tree before this waited for it twice, registry and async claims).
    policy = etcd_policy(
        cluster, registry={"etcd": {"request_timeout_seconds": 60, "ping_interval_seconds": 0.2}}
    )
    router = RouterServer(policy)
    try:
        await asyncio.wait_for(router.__aenter__(), scaled(15))
        assert (await client.get(f"{router.url}/healthz")).status_code == 200
        ready = await client.get(f"{router.url}/readyz")
        assert ready.status_code == 503
        assert ready.json()["status"] == "not_ready"
        assert "connection refused" in ready.json()["reason"]

        reach = await client.post(f"{router.url}/reach", json={"targetTask": "echo", "payload": {}})
        assert reach.status_code == 503
        body = reach.json()
        assert body["status"] == "NO_AVAILABLE_HANDLER"
        assert body["error"]["code"] == "REGISTRY_UNAVAILABLE"
        assert "not loaded from etcd yet" in body["error"]["message"]
        assert "connection refused" in body["error"]["message"]
        assert reach.headers["retry-after"] == str(body["error"]["retryAfterSeconds"])

        # Writes and async requests, which need etcd, are refused as the docs say, not hung.
        agent = await FakeAgent("late-1", result={"ok": True}).start()
        try:
            refused = await client.post(f"{router.url}/agents", json=agent.profile())
            assert refused.status_code == 503
            assert refused.json()["error"]["code"] == "REGISTRY_UNAVAILABLE"
            deferred = await client.post(
                f"{router.url}/reach",
                json={"targetTask": "echo", "payload": {}, "preferences": {"mode": "async"}},
            )
            assert deferred.status_code == 429
            assert deferred.json()["error"]["code"] == "OVERLOADED"

            await asyncio.to_thread(cluster.start)
            took = await eventually(lambda: _ready(client, router), 30)
            print(f"ready {took:.2f} s after etcd answered")
            await agent.register(router.url)
            answer = await client.post(f"{router.url}/reach", json={"targetTask": "echo", "payload": {}})
            assert answer.json()["status"] == "SUCCESS"
        finally:
            await agent.stop()
    finally:
        await router.__aexit__(None, None, None)
        cluster.stop()
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
