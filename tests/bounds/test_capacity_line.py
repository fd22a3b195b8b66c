"""Requests that give up waiting for a slot at a full agent leave nothing in its line.

Found by an attacker's probe: a request whose deadline passed in the queue was cancelled but its
waiter stayed in the agent's line until a slot came back, so while one long call (a stream, up to
the deadline) held an agent of ``max_concurrency: 1``, every caller's short request that gave up
added one for good. Real Router and agent on loopback.
"""

from __future__ import annotations

import asyncio

from tests.helpers import one_slot_held


async def test_waiters_that_gave_up_leave_the_agents_line() -> None:
    async with one_slot_held("line-agent") as (http, board, release, held):
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
