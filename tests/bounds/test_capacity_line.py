"""Requests that give up waiting for a slot at a full agent leave nothing in its line.

Found by an attacker's probe: a request whose deadline passed in the queue was cancelled but its
waiter stayed in the agent's line until a slot came back, so while one long call (a stream, up to
the deadline) held an agent of ``max_concurrency: 1``, every caller's short request that gave up
added one for good. Real Router and agent on loopback.
"""

from __future__ import annotations

import asyncio

import httpx

from reachmesh.config import RouterConfig
from reachmesh.testing import FakeAgent, RouterServer
from tests.helpers import scaled, until


async def test_waiters_that_gave_up_leave_the_agents_line() -> None:
    config = RouterConfig.model_validate(
        {
            "embedding": {"backend": "none"},
            "health": {"enabled": False},
            "limits": {"loop_lag_ms": 10_000},
            # The long call waits at the agent for as long as the waves take, on any machine.
            "timeouts": {"read_ms": 120_000},
        }
    )
    async with RouterServer(config) as router:
        release = asyncio.Event()
        agent = FakeAgent("line-agent", tasks=("slow",), hold=release, max_concurrency=1)
        await agent.start()
        board = router.app.parts.capacity
        async with httpx.AsyncClient(base_url=router.url, timeout=scaled(60)) as http:
            try:
                assert (await http.post("/agents", json=agent.profile())).status_code == 201
                held = asyncio.create_task(
                    http.post("/reach", json={"targetTask": "slow", "preferences": {"timeoutMs": 120_000}})
                )
                await until(lambda: board.inflight("line-agent") == 1, "the long call holds the slot")
                # Waves of short calls: each waits in the line and gives up at its deadline.
                for _ in range(4):
                    wave = [
                        http.post("/reach", json={"targetTask": "slow", "preferences": {"timeoutMs": 300}})
                        for _ in range(50)
                    ]
                    answers = await asyncio.gather(*wave)
                    assert {a.json()["status"] for a in answers} == {"TIMEOUT"}
                assert board.queued("line-agent") == 0
                assert board.waiting("line-agent") == 0, "the waiters that gave up are still held"
                release.set()
                assert (await held).json()["status"] == "SUCCESS"
            finally:
                release.set()
                await agent.stop()
