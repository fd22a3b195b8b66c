"""Found by an attacker's probe, not fixed this round: the queue at a full agent is one line for
every client, first come first served (PROTOCOL §15), so one client can stand all of it.

One client's 20 calls wait at an agent of ``max_concurrency: 1``; another client's call, sent
after them, is served 21st: with calls of a few seconds it times out in the queue, and the first
client (256 calls in flight allowed) keeps the agent from everyone for as long as it likes.
Taking turns between clients needs the client at ``CapacityBoard.take`` (resilience/capacity.py),
which only the attempt loop (dispatch/attempts.py, not this probe's to change) knows. Strict:
when the line takes turns, this passes and must lose its mark.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from reachmesh.config import RouterConfig
from reachmesh.testing import FakeAgent, RouterServer
from tests.helpers import scaled, until


@pytest.mark.xfail(strict=True, reason="the capacity queue has no turns per client (probe 48)")
async def test_another_clients_call_is_not_served_behind_one_clients_whole_queue() -> None:
    config = RouterConfig.model_validate(
        {"embedding": {"backend": "none"}, "health": {"enabled": False}, "limits": {"loop_lag_ms": 10_000}}
    )
    async with RouterServer(config) as router:
        release = asyncio.Event()
        agent = FakeAgent("fair-line", tasks=("slow",), hold=release, max_concurrency=1)
        await agent.start()
        hog = httpx.AsyncClient(
            base_url=router.url,
            timeout=scaled(60),
            transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"),
        )
        fair = httpx.AsyncClient(
            base_url=router.url,
            timeout=scaled(60),
            transport=httpx.AsyncHTTPTransport(local_address="127.0.0.3"),
        )
        board = router.app.parts.capacity
        try:
            assert (await hog.post("/agents", json=agent.profile())).status_code == 201
            body = {"targetTask": "slow", "preferences": {"timeoutMs": 60_000}}
            hogs = [
                asyncio.create_task(hog.post("/reach", json={**body, "payload": {"who": "hog"}}))
                for _ in range(21)
            ]
            await until(lambda: board.queued("fair-line") == 20, "the hog's 20 calls waiting")
            mine = asyncio.create_task(fair.post("/reach", json={**body, "payload": {"who": "fair"}}))
            await until(lambda: board.queued("fair-line") == 21, "the fair call waiting")
            release.set()
            await asyncio.gather(mine, *hogs)
            order = [r["payload"]["who"] for r in agent.received]
            # Served right after the call in flight when it came, or the one after: not 21st.
            assert order.index("fair") <= 2, order.index("fair")
        finally:
            release.set()
            await hog.aclose()
            await fair.aclose()
            await agent.stop()
