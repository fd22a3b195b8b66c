"""Declines: an agent says a request is not for it, and the Router moves on without blaming it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from reachmesh import AgentConfig, Decline, ReachAgent
from reachmesh.config import RouterConfig
from reachmesh.decision import DECLINE_MESSAGE_CHARS
from reachmesh.protocol import ReachResponse
from reachmesh.testing import FakeAgent, RouterServer, free_port


@pytest.fixture
async def router() -> AsyncIterator[tuple[RouterServer, httpx.AsyncClient]]:
    # No lag shedding: the machine is shared, and these tests are about declines, not load.
    config = RouterConfig.from_mapping({"health": {"enabled": False}, "limits": {"loop_lag_ms": 10_000}})
    async with RouterServer(config) as server, httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        yield server, http


async def reach(http: httpx.AsyncClient, task: str, **prefs: Any) -> tuple[int, dict[str, Any]]:
    resp = await http.post("/reach", json={"targetTask": task, "payload": {}, "preferences": prefs})
    return resp.status_code, resp.json()


def sdk_agent(agent_id: str, router_url: str, task: str) -> ReachAgent:
    config = AgentConfig.from_mapping(
        {
            "agent": {
                "id": agent_id,
                "network": {"endpoint": f"http://127.0.0.1:{free_port()}/reach"},
                "capabilities": [{"task": task}],
            },
            "router": {"url": router_url},
        },
        env={},
    )
    return ReachAgent(config)


async def test_a_decline_raised_in_an_sdk_agent_moves_on_and_leaves_the_breaker_closed(router) -> None:
    """Twelve requests: whenever the SDK agent is tried first it declines, the fake agent
    answers, and after more declines than the breaker's threshold (5) its circuit is closed."""
    server, http = router
    taker = await FakeAgent("taker", tasks=("echo",)).start()
    await taker.register(server.url)
    picky = sdk_agent("picky", server.url, "echo")
    declined: list[str] = []

    @picky.capability("echo")
    async def echo(payload: dict) -> dict:
        declined.append("echo")
        raise Decline("picky only echoes on Sundays")

    await picky.start()
    try:
        for _ in range(12):
            # retryCount 0: a decline spends no retry, so the second agent is still tried.
            status, body = await reach(http, "echo", retryCount=0)
            assert status == 200 and body["status"] == "SUCCESS", body
            assert body["handlerAgentId"] == "taker"
        assert len(declined) >= 5  # rotation put the SDK agent first about half the time
        agent = (await http.get("/admin/agents/picky")).json()
        assert agent["circuit"] == "closed"
        # Neither a success nor a failure of the agent: its success rate is untouched.
        assert agent["stats"]["successRate"] == 1.0 and agent["stats"]["requests"] == 0
        assert server.app.parts.budget.snapshot()["retries"] == 0
    finally:
        await picky.stop()
        await taker.stop()


async def test_every_candidate_declining_is_no_available_handler_with_reason_declined(router) -> None:
    server, http = router
    agents = [await FakeAgent(f"no-{i}", tasks=("echo",), mode="decline").start() for i in range(3)]
    for agent in agents:
        await agent.register(server.url)
    try:
        status, body = await reach(http, "echo")
        assert status == 503 and body["status"] == "NO_AVAILABLE_HANDLER"
        reasons = {c["agentId"]: c["reason"] for c in body["error"]["candidates"]}
        assert reasons == {"no-0": "declined", "no-1": "declined", "no-2": "declined"}
        # Each agent's own reason reaches the caller, beside the reason code.
        said = {c["agentId"]: c["message"] for c in body["error"]["candidates"]}
        assert said == {f"no-{i}": f"no-{i} declines on purpose" for i in range(3)}
        # The SDK's model of the answer keeps it too (the MCP bridge re-dumps that model).
        parsed = ReachResponse.model_validate(body)
        assert parsed.error is not None and parsed.error.candidates is not None
        assert {c.agent_id: c.message for c in parsed.error.candidates} == said
        assert (
            parsed.model_dump(by_alias=True, exclude_none=True)["error"]["candidates"]
            == body["error"]["candidates"]
        )
        assert "declined" in body["error"]["message"]
        assert [a["outcome"] for a in body["attempts"]] == ["declined"] * 3
    finally:
        for agent in agents:
            await agent.stop()


async def test_an_accepts_hook_declines_without_running_the_handler(router) -> None:
    server, http = router
    picky = sdk_agent("hooked", server.url, "echo")
    ran: list[str] = []

    @picky.capability("echo", accepts=lambda text: "refund" not in text)
    async def echo(payload: dict) -> dict:
        ran.append(payload["text"])
        return {"ok": True}

    await picky.start()
    try:
        resp = await http.post("/reach", json={"targetTask": "echo", "payload": {"text": "a refund please"}})
        body = resp.json()
        assert body["status"] == "NO_AVAILABLE_HANDLER"
        assert body["error"]["candidates"] == [
            {
                "agentId": "hooked",
                "reason": "declined",
                "task": "echo",
                "message": "echo does not take this request",
            }
        ]
        resp = await http.post("/reach", json={"targetTask": "echo", "payload": {"text": "hello"}})
        assert resp.json()["status"] == "SUCCESS"
        assert ran == ["hello"]
    finally:
        await picky.stop()


async def test_a_decline_is_never_retried_on_the_same_agent(router) -> None:
    server, http = router
    lone = await FakeAgent("lone", tasks=("echo",), mode="decline").start()
    await lone.register(server.url)
    try:
        status, body = await reach(http, "echo", retryCount=2)
        assert status == 503 and body["error"]["candidates"][0]["reason"] == "declined"
        assert len(lone.received) == 1
    finally:
        await lone.stop()


async def test_declines_per_request_are_bounded(router) -> None:
    """Ten agents that all say no: eight are asked, the other two are listed untried."""
    server, http = router
    agents = [await FakeAgent(f"no-{i}", tasks=("echo",), mode="decline").start() for i in range(10)]
    for agent in agents:
        await agent.register(server.url)
    try:
        status, body = await reach(http, "echo", timeoutMs=10_000)
        assert status == 503
        reasons = sorted(c["reason"] for c in body["error"]["candidates"])
        assert reasons == ["budget_exhausted"] * 2 + ["declined"] * 8
        assert sum(len(a.received) for a in agents) == 8
    finally:
        for agent in agents:
            await agent.stop()


async def test_a_long_decline_reason_is_cut_in_the_candidates(router) -> None:
    """An agent's reason is listed at most DECLINE_MESSAGE_CHARS long: 20 candidates per answer."""
    server, http = router
    wordy = sdk_agent("wordy", server.url, "echo")

    @wordy.capability("echo")
    async def echo(payload: dict) -> dict:
        raise Decline("no " * 1000)

    await wordy.start()
    try:
        status, body = await reach(http, "echo")
        (candidate,) = body["error"]["candidates"]
        assert status == 503 and candidate["reason"] == "declined"
        assert candidate["message"] == ("no " * 1000)[:DECLINE_MESSAGE_CHARS]
    finally:
        await wordy.stop()
