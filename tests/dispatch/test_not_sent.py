"""A call that waited for a slot at a full agent is not sent once too little of its deadline is
left for the agent's usual answer time: it never reaches the agent, fails over to the next
candidate or ends TIMEOUT before its deadline saying why, and charges the agent nothing. A call
with time enough is still sent, and an agent whose answer time is not known yet is waited for as
before.

Through a real Router and a FakeAgent on loopback, capacity 1; the slot is held by a call the
agent keeps until the test lets it go, so who waits, and for how long, is the test's doing.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from reachmesh.config import RouterConfig
from reachmesh.testing import FakeAgent, RouterServer
from tests.helpers import scaled, until

USUAL_S = scaled(0.6)  # the agent's answer time, once it has answered
LONG_MS = int(scaled(30_000))
CONVERSATION = "c-1"


@pytest.fixture
async def router() -> AsyncIterator[tuple[RouterServer, httpx.AsyncClient]]:
    policy = {
        "health": {"enabled": False},
        "breaker": {"failure_threshold": 1, "open_seconds": 600},
        "timeouts": {"read_ms": LONG_MS},
        "limits": {"loop_lag_ms": 10_000},
    }
    server = RouterServer(RouterConfig.from_mapping(policy))
    async with server, httpx.AsyncClient(base_url=server.url, timeout=scaled(60)) as http:
        yield server, http


async def call(http: httpx.AsyncClient, timeout_ms: int, **more: Any) -> httpx.Response:
    body = {"targetTask": "echo", "payload": {}, "preferences": {"timeoutMs": timeout_ms}, **more}
    return await http.post("/reach", json=body)


async def slot_held(server: RouterServer, http: httpx.AsyncClient, agent: FakeAgent) -> asyncio.Task[Any]:
    """The agent's one slot, held by a call it keeps until ``agent.hold`` is set."""
    agent.hold = asyncio.Event()
    before = len(agent.received)
    held = asyncio.ensure_future(call(http, LONG_MS))
    await until(lambda: len(agent.received) == before + 1, "the long call at the agent")
    await until(lambda: server.app.parts.capacity.inflight("busy") == 1, "its slot taken")
    return held


async def test_a_queued_call_short_of_the_agents_usual_time_is_not_sent_and_says_why(router) -> None:
    server, http = router
    agent = FakeAgent("busy", max_concurrency=1, delay_s=USUAL_S)
    await agent.start()
    await agent.register(server.url, vectors=False)
    held = None
    try:
        assert (await call(http, LONG_MS)).json()["status"] == "SUCCESS"  # its usual time: known
        held = await slot_held(server, http, agent)
        deadline_ms = int(USUAL_S * 2000)  # it waits, and gives up with half its usual time left
        answer = await call(http, deadline_ms)
        body = answer.json()
        assert (answer.status_code, body["status"]) == (504, "TIMEOUT"), body
        message = body["error"]["message"]
        assert "'busy' usually answers in" in message and "so the call was not sent" in message, message
        assert len(agent.received) == 2, "the agent never got it"
        (hop,) = (await http.get(f"/admin/traces/{body['traceId']}")).json()["hops"]
        assert hop["attempts"] == [] and 0 < hop["slotWaitMs"] < deadline_ms - USUAL_S * 250, hop
        notes = [e["text"] for e in hop["events"] if e["kind"] == "not sent"]
        assert len(notes) == 1 and re.search(r"\d+ ms were left after waiting \d+ ms for a slot", notes[0])
        (rejected,) = hop["decision"]["rejected"]
        assert (rejected["agentId"], rejected["reason"]) == ("busy", "at_capacity"), rejected
        assert rejected["message"].startswith("not sent: 'busy' usually answers in"), rejected
        metrics = (await http.get("/metrics")).text
        assert 'reach_not_sent_total{agent="busy"} 1.0' in metrics
        # A call with time enough waits and is sent when the slot comes back.
        patient = asyncio.ensure_future(call(http, LONG_MS))
        await until(lambda: server.app.parts.capacity.queued("busy") == 1, "the patient call waiting")
        release = agent.hold
        assert release is not None
        release.set()
        assert (await patient).json()["status"] == "SUCCESS"
        assert len(agent.received) == 3
        row = (await http.get("/admin/agents/busy")).json()
        assert (row["circuit"], row["stats"]["successRate"]) == ("closed", 1.0), row
    finally:
        if agent.hold is not None:
            agent.hold.set()
        if held is not None:
            await held
        await agent.stop()


async def test_an_agent_whose_answer_time_is_unknown_is_waited_for_to_the_deadline(router) -> None:
    server, http = router
    agent = FakeAgent("busy", max_concurrency=1)
    await agent.start()
    await agent.register(server.url, vectors=False)
    held = await slot_held(server, http, agent)
    try:
        answer = await call(http, int(scaled(400)))
        body = answer.json()
        assert (answer.status_code, body["status"]) == (504, "TIMEOUT"), body
        assert "ran out waiting for a slot at busy" in body["error"]["message"], body
        (hop,) = (await http.get(f"/admin/traces/{body['traceId']}")).json()["hops"]
        assert not [e for e in hop["events"] if e["kind"] == "not sent"], hop["events"]
    finally:
        assert agent.hold is not None
        agent.hold.set()
        await held
        await agent.stop()


async def busy_then_backup(
    server: RouterServer, http: httpx.AsyncClient, backup: FakeAgent
) -> tuple[FakeAgent, asyncio.Task[Any]]:
    """A full agent 'busy' whose usual time is known, its slot held, and ``backup`` registered
    for the same task. The conversation CONVERSATION is bound to busy, so a call in it tries busy
    first though busy is full (a full agent otherwise goes last): it is queued there, not sent,
    and fails over to the backup."""
    agent = FakeAgent("busy", max_concurrency=1, delay_s=USUAL_S)
    await agent.start()
    await agent.register(server.url, vectors=False)
    first = await call(http, LONG_MS, conversationId=CONVERSATION)  # its usual time: known
    assert first.json()["status"] == "SUCCESS"
    held = await slot_held(server, http, agent)
    await backup.start()
    await backup.register(server.url, vectors=False)
    return agent, held


async def test_a_call_not_sent_to_a_full_agent_fails_over_and_the_next_agent_answers(router) -> None:
    """The not-sent call is not the end of the request: the next candidate is tried in what is
    left of the deadline, and its answer is the caller's."""
    server, http = router
    backup = FakeAgent("backup")
    agent, held = await busy_then_backup(server, http, backup)
    try:
        answer = await call(http, int(USUAL_S * 2000), conversationId=CONVERSATION)
        body = answer.json()
        got = (answer.status_code, body["status"], body["handlerAgentId"])
        assert got == (200, "SUCCESS", "backup"), body
        assert len(agent.received) == 2 and len(backup.received) == 1
        (hop,) = (await http.get(f"/admin/traces/{body['traceId']}")).json()["hops"]
        assert [e["kind"] for e in hop["events"] if e["kind"] == "not sent"] == ["not sent"], hop["events"]
        assert [(a["agentId"], a["outcome"]) for a in hop["attempts"]] == [("backup", "SUCCESS")], hop
    finally:
        await agent.stop()
        await held
        await backup.stop()


@pytest.mark.parametrize("fault", ["http500", "refused"])
async def test_a_not_sent_call_whose_failover_fails_ends_as_the_failover_did(router, fault: str) -> None:
    """Busy did not get the call (too late), and the backup then failed for a reason of its own:
    the request did not run out of time, so it ends NO_AVAILABLE_HANDLER with both candidates and
    a message naming both, not TIMEOUT with the not-sent message alone (as it did before)."""
    server, http = router
    backup = FakeAgent("backup", mode="http500" if fault == "http500" else "ok")
    agent, held = await busy_then_backup(server, http, backup)
    if fault == "refused":
        await backup.stop()  # registered, and no longer listening
    try:
        answer = await call(http, int(USUAL_S * 2000), conversationId=CONVERSATION)
        body = answer.json()
        assert (answer.status_code, body["status"]) == (503, "NO_AVAILABLE_HANDLER"), body["error"]
        reasons = [(c["agentId"], c["reason"]) for c in body["error"]["candidates"]]
        expected = "agent_error" if fault == "http500" else "connect_error"
        assert reasons == [("busy", "at_capacity"), ("backup", expected)], body
        message = body["error"]["message"]
        assert "'backup' failed (" + expected + ")" in message, message
        assert "'busy' usually answers in" in message and "not sent" in message, message
        assert len(agent.received) == 2, "busy never got it"
    finally:
        await agent.stop()
        await held
        await backup.stop()
