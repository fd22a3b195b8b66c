"""An agent's event stream gathered for a caller that asked for no stream never holds the loop.

Found by an attacker's probe: a plain call to an agent answering 8 MB of empty lines (or of
empty events) as an event stream froze the whole Router, /healthz included, for up to 15 s: the
gathered body was parsed in one go, a microsecond a byte. Real Router and agent on loopback, in
this test's loop, so the loop's longest turn is seen directly (in CPU time, not on the clock).
"""

from __future__ import annotations

import asyncio
import time

import httpx

from reachmesh.config import RouterConfig
from reachmesh.testing import FakeAgent, RouterServer
from tests.helpers import scaled

# About 4 MB of events that carry nothing (no type: ignored), ending in a done: read in one go
# this held the loop 2 to 4 s on this machine; read a slice at a time, milliseconds a turn.
BOMB = b"data:\n\n" * 600_000 + b'event: chunk\ndata: 1\n\nevent: done\ndata: {"status": "SUCCESS"}\n\n'


async def test_a_gathered_stream_of_empty_events_lets_the_loop_run() -> None:
    config = RouterConfig.model_validate(
        {"embedding": {"backend": "none"}, "health": {"enabled": False}, "limits": {"loop_lag_ms": 10_000}}
    )
    async with RouterServer(config) as router:
        agent = FakeAgent("bomb-agent", tasks=("bomb",), raw_answer=BOMB)
        await agent.start()
        stalls: list[float] = []
        done = asyncio.Event()

        async def ticker() -> None:
            # The CPU this thread spent between two turns of the ticker: what one turn of the
            # loop held it for, however little of the machine the process got meanwhile.
            while not done.is_set():
                before = time.thread_time()
                await asyncio.sleep(0.005)
                stalls.append(time.thread_time() - before)

        try:
            async with httpx.AsyncClient(base_url=router.url, timeout=scaled(60)) as http:
                assert (await http.post("/agents", json=agent.profile())).status_code == 201
                ticking = asyncio.create_task(ticker())
                answer = await http.post(
                    "/reach", json={"targetTask": "bomb", "preferences": {"timeoutMs": 60_000}}
                )
                done.set()
                await ticking
            assert answer.status_code == 200, answer.text
            assert answer.json()["result"] == [1]
            assert max(stalls) < scaled(0.5), f"one turn of the loop took {max(stalls):.2f} s of CPU"
        finally:
            await agent.stop()
