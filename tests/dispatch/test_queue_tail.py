"""A busy agent's queue tail is not charged to it; a hung agent's queue still opens its breaker.

Through a real Router and a FakeAgent on loopback. The stranger's walk: capacity 2, answers in
1 s, callers with ``timeoutMs: 2500`` (short of the 3 s read timeout). Calls that waited 1.5 s
for a slot timed out in the second left and were charged, as if the caller's deadline alone had
cut them: the breaker of an agent that was only busy opened, then NO_AVAILABLE_HANDLER. Here at
0.3 s x the suite's time scale, a burst at once instead of a steady stream, so that which calls
wait, and how long, does not hang on the machine's pace.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from reachmesh.config import RouterConfig
from reachmesh.testing import FakeAgent, RouterServer
from tests.helpers import scaled, until

# The agent's answer time, and the callers' deadline: 2.5 of it, as 2.5 s to 1 s in the walk.
ANSWER_S = scaled(0.3)
DEADLINE_MS = int(ANSWER_S * 2500)
# The read timeout stays well above the callers' deadline whatever the time scale.
READ_MS = int(scaled(3000))


@pytest.fixture
async def router() -> AsyncIterator[tuple[RouterServer, httpx.AsyncClient]]:
    policy = {
        "health": {"enabled": False},
        "breaker": {"failure_threshold": 2, "open_seconds": 600},
        "timeouts": {"read_ms": READ_MS},
    }
    server = RouterServer(RouterConfig.from_mapping(policy))
    async with server, httpx.AsyncClient(base_url=server.url, timeout=scaled(30)) as http:
        yield server, http


async def started(server: RouterServer, agent: FakeAgent) -> FakeAgent:
    await agent.start()
    await agent.register(server.url, vectors=False)
    return agent


async def call(http: httpx.AsyncClient, **prefs: Any) -> dict[str, Any]:
    answer = await http.post("/reach", json={"targetTask": "echo", "payload": {}, "preferences": prefs})
    body: dict[str, Any] = answer.json()
    return body


async def burst(http: httpx.AsyncClient, n: int) -> list[dict[str, Any]]:
    return list(await asyncio.gather(*(call(http, timeoutMs=DEADLINE_MS) for _ in range(n))))


async def test_a_busy_agents_queue_tail_does_not_open_its_breaker(router) -> None:
    """Eight calls at once at capacity 2: two answer at 1x, two at 2x (after waiting 1x), two get
    a slot at 2x with 0.5x of their 2.5x deadline left and time out, two time out waiting. The
    agent never had less than 2.5x but for the Router's queue, and it answers in 1x: nothing is
    charged, its breaker (threshold 2) stays closed and the next call is served. (Before, the
    two timeouts at the agent opened it: NO_AVAILABLE_HANDLER for the next call.)"""
    server, http = router
    agent = await started(server, FakeAgent("busy", max_concurrency=2, delay_s=ANSWER_S))
    try:
        answers = await burst(http, 8)
        statuses = sorted(a["status"] for a in answers)
        assert set(statuses) <= {"SUCCESS", "TIMEOUT"}, answers
        assert "TIMEOUT" in statuses and "SUCCESS" in statuses, statuses
        row = (await http.get("/admin/agents/busy")).json()
        after = await call(http, timeoutMs=DEADLINE_MS)
        assert (row["circuit"], after["status"]) == ("closed", "SUCCESS"), (row, after)
        assert row["stats"]["successRate"] == 1.0, row
        for answer in answers:
            await _uncharged_if_timed_out_at_the_agent(http, answer)
    finally:
        await agent.stop()


async def _uncharged_if_timed_out_at_the_agent(http: httpx.AsyncClient, answer: dict[str, Any]) -> None:
    """An answer's timeout at the agent came after a wait for its slot, and its trace says it was
    not charged and why (a call that waited out its deadline in the queue has no attempt)."""
    timed_out = [a for a in answer.get("attempts", []) if a["outcome"] == "timeout"]
    if not timed_out:
        return
    (hop,) = (await http.get(f"/admin/traces/{answer['traceId']}")).json()["hops"]
    assert hop["slotWaitMs"] > 0, hop
    notes = [e["text"] for e in hop["events"] if e["kind"] == "timeout not charged"]
    assert len(notes) == 1 and "busy timed out after waiting in the Router (" in notes[0], hop["events"]
    assert "usually answers in" in notes[0], notes


async def test_a_hung_agent_with_calls_queued_behind_it_still_has_its_breaker_opened(router) -> None:
    """An agent that never answers, capacity 1, callers whose deadline is short of the read
    timeout, four at once, twice: each time the first takes the slot and times out at its full
    deadline (no wait: charged), the others wait behind it. The breaker (threshold 2) opens, and
    the next caller is answered NO_AVAILABLE_HANDLER at once instead of waiting out its deadline."""
    server, http = router
    agent = await started(server, FakeAgent("hung", max_concurrency=1, hold=asyncio.Event()))
    try:
        for _ in range(2):
            answers = await burst(http, 4)
            assert {a["status"] for a in answers} == {"TIMEOUT"}, answers
        row = (await http.get("/admin/agents/hung")).json()
        assert row["circuit"] == "open", row
        shut_out = await call(http, timeoutMs=DEADLINE_MS)
        assert shut_out["status"] == "NO_AVAILABLE_HANDLER", shut_out
        assert [c["reason"] for c in shut_out["error"]["candidates"]] == ["circuit_open"], shut_out
    finally:
        await agent.stop()


async def test_an_agent_that_answered_fast_then_hung_is_charged_for_a_queued_calls_fair_window(
    router,
) -> None:
    """An agent that answered in a few ms, then stopped answering: a call queued behind a stuck
    one gets the slot with a window many times its usual answer time (though short of the read
    timeout) and times out. That window was fair: charged, and with the stuck call's own timeout
    the breaker (threshold 2) opens. What it usually takes never excuses an agent that got it."""
    server, http = router
    agent = await started(server, FakeAgent("stuck", max_concurrency=1))
    assert (await call(http))["status"] == "SUCCESS"
    agent.hold = asyncio.Event()
    deadline_ms = int(scaled(1200))
    first = asyncio.ensure_future(call(http, timeoutMs=deadline_ms))
    try:
        await until(lambda: len(agent.received) == 2, "the first call stuck at the agent")
        loop = asyncio.get_running_loop()
        since = loop.time()
        await until(lambda: loop.time() - since >= scaled(0.4), "a window of its own for the next call")
        queued = await call(http, timeoutMs=deadline_ms)
        assert (await first)["status"] == "TIMEOUT"
        assert queued["status"] == "TIMEOUT", queued
        row = (await http.get("/admin/agents/stuck")).json()
        assert row["circuit"] == "open", (row, queued)
    finally:
        await agent.stop()
        await asyncio.gather(first, return_exceptions=True)
