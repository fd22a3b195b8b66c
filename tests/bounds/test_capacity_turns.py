"""Found by an attacker's probe (round 48): the queue at a full agent was one line for every
client, first come first served, so one client could stand all of it: another client's call,
sent after its 20 waiting calls, was served 21st (with calls of a few seconds it timed out in the
queue). The line now takes turns between clients (PROTOCOL §15 as docs/protocol.md states it:
first come first served within each client), so it is served right after the call in flight
when it came, or the one after.
"""

from __future__ import annotations

import asyncio

import httpx

from reachmesh.config import RouterConfig
from reachmesh.testing import FakeAgent, RouterServer
from tests.helpers import scaled, until


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
