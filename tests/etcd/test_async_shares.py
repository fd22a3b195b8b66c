"""Each client's share of the async results kept in etcd, as in memory.

Before, the results in etcd were bounded only in all (`async_mode.etcd_max_results`,
`etcd_max_total_result_bytes`), the oldest going first whoever's: one caller token flooding a
Router with async requests pushed every other caller's results out of etcd, and the other
Routers answered their `GET /reach/{traceId}` `404`. The in-memory store kept
`async_mode.max_results_per_client` / `max_result_bytes_per_client` (tests/bounds/
test_caller_shares.py); the etcd store now keeps the same shares.
"""

from __future__ import annotations

import hashlib
from typing import Any

import httpx
import pytest

from reachmesh.cli.etcd import EtcdCluster
from reachmesh.registry.etcd.deferred import DeferredStore
from reachmesh.testing import FakeAgent, RouterServer
from tests.etcd.conftest import etcd_policy
from tests.helpers import scaled, until

pytestmark = pytest.mark.etcd

HOG = "etcd-share-hog-token-0123456789"
FAIR = "etcd-share-fair-token-0123456789"
AGENT = "etcd-share-agent-token-0123456789"
ASYNC = {"targetTask": "echo", "preferences": {"mode": "async"}}


def spec(token: str, role: str) -> dict[str, str]:
    return {"role": role, "sha256": hashlib.sha256(token.encode()).hexdigest()}


def caller(token: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=scaled(30), headers={"Authorization": f"Bearer {token}"})


async def finished(http: httpx.AsyncClient, url: str) -> bool:
    answer = await http.get(url)
    return answer.status_code == 200 and answer.json().get("status") == "SUCCESS"


async def within_bounds(journal: DeferredStore, async_mode: dict[str, Any]) -> bool:
    """Whether the results in etcd are within the bounds in all (a trim has run)."""
    _, sizes = await journal.client.get_prefix(journal.sizes)
    held = sum(int(kv.value) for kv in sizes)
    most: int = async_mode.get("etcd_max_results", 10_000)
    most_bytes: int = async_mode.get("etcd_max_total_result_bytes", 1 << 26)
    return len(sizes) <= most and held <= most_bytes


async def flood(
    etcd: EtcdCluster, async_mode: dict[str, Any], result: dict[str, Any], count: int
) -> tuple[bool, int]:
    """The fair caller's async request through Router A, then ``count`` of the hog's through A;
    once every result is in etcd and trimmed: whether B (which ran none of them, so reads etcd)
    still answers the fair caller's result, and how many of the hog's results B answers."""
    policy = etcd_policy(
        etcd,
        auth={"tokens": [spec(HOG, "caller"), spec(FAIR, "caller"), spec(AGENT, "agent")]},
        health={"enabled": False},
        async_mode={"adopt_interval_seconds": 0.2, **async_mode},
    )
    agent = await FakeAgent("share-echo", tasks=("echo",), result=result).start()
    fair, hog = caller(FAIR), caller(HOG)
    try:
        async with RouterServer(policy) as a, RouterServer(policy) as b:
            await agent.register(a.url, vectors=False, token=AGENT)
            accepted = await fair.post(f"{a.url}/reach", json=ASYNC)
            assert accepted.status_code == 202, accepted.text
            mine = f"{b.url}/reach/{accepted.json()['traceId']}"
            await until(lambda: finished(fair, mine), "the fair caller's result readable at B")
            hog_ids = []
            for _ in range(count):
                sent = await hog.post(f"{a.url}/reach", json=ASYNC)
                assert sent.status_code == 202, sent.text
                hog_ids.append(sent.json()["traceId"])
            journal = a.app.parts.dispatcher.async_requests.journal
            assert journal is not None

            async def settled() -> bool:
                # Every result written (a job is dropped only after), then a trim has run.
                if await journal.client.keys(journal.jobs):
                    return False
                return await within_bounds(journal, async_mode)

            await until(settled, "every hog result written to etcd and trimmed", within=60)
            # A trim after the last write (the adopters' last one may have run before it).
            await journal.trim_results()
            kept = await finished(fair, mine)
            hogs = [t for t in hog_ids if await finished(hog, f"{b.url}/reach/{t}")]
            return kept, len(hogs)
    finally:
        await fair.aclose()
        await hog.aclose()
        await agent.stop()


async def test_one_callers_flood_keeps_another_callers_result_in_etcd(etcd: EtcdCluster) -> None:
    """40 results in etcd in all, 10 a client: after the hog's 60 requests through A, B still
    answers the fair caller's result (before: 404, pushed out of etcd by the hog's), and only
    10 of the hog's."""
    kept, hogs = await flood(etcd, {"etcd_max_results": 40, "max_results_per_client": 10}, {"ok": True}, 60)
    assert kept, "the fair caller's result was pushed out of etcd by the hog's"
    assert hogs == 10, hogs


async def test_a_clients_bytes_in_etcd_are_its_share(etcd: EtcdCluster) -> None:
    """64 KiB of results in etcd in all, 16 KiB a client: the hog's answers of about 3 KiB keep
    only its newest few, and the fair caller's result stays."""
    kept, hogs = await flood(
        etcd,
        {"etcd_max_total_result_bytes": 64 * 1024, "max_result_bytes_per_client": 16 * 1024},
        {"blob": "x" * 3000},
        40,
    )
    assert kept, "the fair caller's result was pushed out of etcd by the hog's"
    assert 1 <= hogs <= 5, hogs


HOGS = [f"etcd-share-hog{i}-token-0123456789" for i in range(3)]


async def test_callers_that_fill_their_shares_keep_another_callers_result_in_etcd(etcd: EtcdCluster) -> None:
    """12 results in etcd in all, 5 a client: three callers each filling their share (15) went
    past the bound in all, and the oldest went first whoever's: the fair caller's one result,
    read through B, was gone (404). Now the callers holding the most give up their oldest."""
    policy = etcd_policy(
        etcd,
        auth={"tokens": [spec(t, "caller") for t in (*HOGS, FAIR)] + [spec(AGENT, "agent")]},
        health={"enabled": False},
        async_mode={"adopt_interval_seconds": 0.2, "etcd_max_results": 12, "max_results_per_client": 5},
    )
    agent = await FakeAgent("share-echo", tasks=("echo",), result={"ok": True}).start()
    fair, hogs = caller(FAIR), [caller(t) for t in HOGS]
    try:
        async with RouterServer(policy) as a, RouterServer(policy) as b:
            await agent.register(a.url, vectors=False, token=AGENT)
            accepted = await fair.post(f"{a.url}/reach", json=ASYNC)
            assert accepted.status_code == 202, accepted.text
            mine = f"{b.url}/reach/{accepted.json()['traceId']}"
            await until(lambda: finished(fair, mine), "the fair caller's result readable at B")
            for hog in hogs:
                for _ in range(5):
                    sent = await hog.post(f"{a.url}/reach", json=ASYNC)
                    assert sent.status_code == 202, sent.text
            journal = a.app.parts.dispatcher.async_requests.journal
            assert journal is not None

            async def settled() -> bool:
                if await journal.client.keys(journal.jobs):
                    return False
                return len(await journal.client.keys(journal.sizes)) <= 12

            await until(settled, "every result written to etcd and trimmed", within=60)
            await journal.trim_results()  # after the last write
            # Not only A's memory: the result is still in etcd (B ran none of them).
            assert await journal.result(accepted.json()["traceId"]) is not None
            assert await finished(fair, mine), "the fair caller's result was pushed out of etcd"
    finally:
        await fair.aclose()
        for hog in hogs:
            await hog.aclose()
        await agent.stop()
