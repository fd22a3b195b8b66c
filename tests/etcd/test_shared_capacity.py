"""An agent's max_concurrency behind two Routers over one etcd.

Each Router counts only what it has in flight itself, so two Routers can send an agent up to
twice its capacity; the SDK answers the surplus `429 AGENT_BUSY` (retryable, `Retry-After`). A
busy answer means the request was not run: the Router waits the Retry-After and tries again
within the caller's deadline, instead of failing the call. Real Routers, a real etcd, a real SDK
agent on loopback.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from reachmesh import AgentConfig, ReachAgent, ReachClient, ReachContext
from reachmesh.cli.etcd import EtcdCluster
from reachmesh.testing import RouterServer, free_port
from tests.etcd.conftest import etcd_policy
from tests.helpers import scaled, until

pytestmark = pytest.mark.etcd

CAPACITY = 2


class Counted:
    """An SDK agent of capacity CAPACITY whose handler holds each call ``hold_s`` and counts."""

    def __init__(self, router_urls: list[str], hold_s: float) -> None:
        self.now = 0
        self.peak = 0
        self.runs: dict[str, int] = {}
        self.hold_s = hold_s
        config = AgentConfig.from_mapping(
            {
                "agent": {
                    "id": "counted",
                    "max_concurrency": CAPACITY,
                    "network": {"endpoint": f"http://127.0.0.1:{free_port()}/reach"},
                    "capabilities": [{"task": "work"}, {"task": "ticks"}],
                },
                "router": {"url": ",".join(router_urls)},
            },
            env={},
        )
        self.agent = ReachAgent(config)
        self.agent.capability("work")(self.work)
        self.agent.capability("ticks")(self.ticks)

    async def ticks(self, payload: dict[str, Any], ctx: ReachContext) -> AsyncIterator[dict[str, Any]]:
        self.now += 1
        self.peak = max(self.peak, self.now)
        self.runs[ctx.trace_id] = self.runs.get(ctx.trace_id, 0) + 1
        try:
            for i in range(2):
                await asyncio.sleep(self.hold_s / 2)
                yield {"n": payload["n"], "i": i}
        finally:
            self.now -= 1

    async def work(self, payload: dict[str, Any], ctx: ReachContext) -> dict[str, Any]:
        self.now += 1
        self.peak = max(self.peak, self.now)
        self.runs[ctx.trace_id] = self.runs.get(ctx.trace_id, 0) + 1
        try:
            await asyncio.sleep(self.hold_s)
            return {"n": payload["n"]}
        finally:
            self.now -= 1


async def test_a_burst_through_two_routers_is_served_whole_within_the_agents_capacity(
    etcd: EtcdCluster, client: httpx.AsyncClient
) -> None:
    """Twelve calls at once, half through each Router, at an agent of capacity 2: every call
    succeeds, each ran once, and the agent never ran more than 2 at once. Before the fix, the
    calls each Router sent beyond what the other left room for were answered busy by the SDK
    and failed `503 NO_AVAILABLE_HANDLER`, and so did every call queued behind them."""
    policy = etcd_policy(etcd)
    async with RouterServer(policy) as a, RouterServer(policy) as b:
        counted = Counted([a.url, b.url], hold_s=scaled(0.3))
        await counted.agent.start()
        try:

            async def listed_at_b() -> bool:
                return (await client.get(f"{b.url}/admin/agents/counted")).status_code == 200

            await until(listed_at_b, "the agent listed at B")
            budget_ms = int(scaled(30) * 1000)

            async def call(n: int) -> httpx.Response:
                url = (a.url, b.url)[n % 2]
                body = {"targetTask": "work", "payload": {"n": n}, "preferences": {"timeoutMs": budget_ms}}
                return await client.post(f"{url}/reach", json=body, timeout=scaled(40))

            answers = await asyncio.gather(*(call(n) for n in range(12)))
            failed = [r.json() for r in answers if r.json()["status"] != "SUCCESS"]
            assert not failed, failed[:2]
            assert sorted(r.json()["result"]["n"] for r in answers) == list(range(12))
            assert counted.peak <= CAPACITY
            assert sorted(counted.runs.values()) == [1] * 12
            summaries = (await client.get(f"{a.url}/admin/traces")).json()
            summaries += (await client.get(f"{b.url}/admin/traces")).json()
            # A call that met a busy agent has its busy attempt and the one that served it.
            assert any(s["attempts"] > 1 for s in summaries), (
                "no call met a busy agent: not the case under test"
            )
        finally:
            await counted.agent.stop()


async def test_a_busy_agent_past_the_deadline_still_ends_no_available_handler(
    etcd: EtcdCluster, client: httpx.AsyncClient
) -> None:
    """The wait for a busy agent keeps to the caller's deadline: a call whose deadline leaves no
    room for the Retry-After ends as before, `503 NO_AVAILABLE_HANDLER` with
    `retryAfterSeconds`, at once, not at its deadline."""
    policy = etcd_policy(etcd, timeouts={"read_ms": 60_000})
    async with RouterServer(policy) as a, RouterServer(policy) as b:
        counted = Counted([a.url], hold_s=scaled(2))
        await counted.agent.start()
        try:

            async def listed_at_b() -> bool:
                return (await client.get(f"{b.url}/admin/agents/counted")).status_code == 200

            await until(listed_at_b, "the agent listed at B")
            body = {
                "targetTask": "work",
                "payload": {"n": 0},
                "preferences": {"timeoutMs": int(scaled(20) * 1000)},
            }
            held = [
                asyncio.create_task(client.post(f"{a.url}/reach", json=body, timeout=scaled(30)))
                for _ in range(2)
            ]
            await until(lambda: counted.now == CAPACITY, "the agent full through A")
            short = {"targetTask": "work", "payload": {"n": 1}, "preferences": {"timeoutMs": 800}}
            resp = await client.post(f"{b.url}/reach", json=short)
            assert resp.status_code == 503
            answer = resp.json()
            assert answer["status"] == "NO_AVAILABLE_HANDLER"
            assert answer["error"]["retryAfterSeconds"] == 1
            assert answer["durationMs"] < 700
            for task in held:
                assert (await task).json()["status"] == "SUCCESS"
        finally:
            await counted.agent.stop()


async def test_streams_through_two_routers_wait_for_a_busy_agent_too(
    etcd: EtcdCluster, client: httpx.AsyncClient
) -> None:
    """The same with streamed calls (the SDK's ReachClient.stream()): a busy answer comes before
    the first chunk, so the Router waits and sends the stream again; every stream ends SUCCESS
    with both its chunks, each ran once."""
    policy = etcd_policy(etcd)
    async with RouterServer(policy) as a, RouterServer(policy) as b:
        counted = Counted([a.url, b.url], hold_s=scaled(0.3))
        await counted.agent.start()
        callers = [ReachClient(a.url), ReachClient(b.url)]
        try:

            async def listed_at_b() -> bool:
                return (await client.get(f"{b.url}/admin/agents/counted")).status_code == 200

            await until(listed_at_b, "the agent listed at B")

            async def stream(n: int) -> tuple[str, list[Any]]:
                chunks: list[Any] = []
                async with callers[n % 2].stream("ticks", {"n": n}, timeout_ms=int(scaled(30) * 1000)) as s:
                    async for chunk in s:
                        chunks.append(chunk)
                return s.response.status, chunks

            ended = await asyncio.gather(*(stream(n) for n in range(8)))
            assert [status for status, _ in ended] == ["SUCCESS"] * 8, ended
            assert all(chunks == [{"n": n, "i": 0}, {"n": n, "i": 1}] for n, (_, chunks) in enumerate(ended))
            assert counted.peak <= CAPACITY
            assert sorted(counted.runs.values()) == [1] * 8
        finally:
            for caller in callers:
                await caller.aclose()
            await counted.agent.stop()
