"""Resilience through a real Router and real agents on loopback."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from reachmesh import AgentConfig, ReachAgent, ReachContext
from reachmesh.clock import ManualClock
from reachmesh.config import RouterConfig
from reachmesh.testing import FakeAgent, RouterServer, free_port
from tests.helpers import log_lines, scaled, until

MakeAgent = Callable[..., Awaitable[FakeAgent]]


@pytest.fixture
async def cluster(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[RouterServer, httpx.AsyncClient, MakeAgent]]:
    """A Router with the test's policy (``@pytest.mark.policy({...})``), a client, and an agent maker."""
    marker = request.node.get_closest_marker("policy")
    policy: dict[str, Any] = {"health": {"enabled": False}}
    if marker is not None:
        policy.update(marker.args[0])
    # A test that moves the Router's time by hand asks for its clock with ``@pytest.mark.clock``.
    clock_marker = request.node.get_closest_marker("clock")
    extra: dict[str, Any] = {"clock": clock_marker.args[0]} if clock_marker is not None else {}
    started: list[FakeAgent] = []
    async with RouterServer(RouterConfig.from_mapping(policy), **extra) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=scaled(30)) as http:

            async def make(agent_id: str, **kwargs: Any) -> FakeAgent:
                agent = await FakeAgent(agent_id, **kwargs).start()
                started.append(agent)
                await agent.register(server.url)
                return agent

            yield server, http, make
        for agent in started:
            await agent.stop()


BREAKER_CLOCK = ManualClock()


def trace_lines(caplog: pytest.LogCaptureFixture, trace_id: str) -> list[str]:
    return [line for line in log_lines(caplog) if line.startswith(f"[{trace_id}]")]


@pytest.mark.policy({"breaker": {"failure_threshold": 3, "open_seconds": 5, "open_on_refused": False}})
@pytest.mark.clock(BREAKER_CLOCK)
async def test_breaker_opens_skips_and_recovers(cluster, caplog: pytest.LogCaptureFixture) -> None:
    """Three failures open a's breaker (logged, in /admin/agents); requests skip a; a probe closes it.
    The Router's clock moves only by hand, so a slow machine cannot end the open period early."""
    _server, http, make = cluster
    caplog.set_level(logging.INFO, logger="reachmesh.trace")
    a = await make("a", mode="http500", weight=100)
    await make("b", weight=1)
    for i in range(3):
        body = (await http.post("/reach", json={"traceId": f"br-{i}", "targetTask": "echo"})).json()
        assert body["handlerAgentId"] == "b"
    assert "[br-2] circuit open: agent a (consecutive failures or a failed probe)" in trace_lines(
        caplog, "br-2"
    )
    row = (await http.get("/admin/agents/a")).json()
    assert row["circuit"] == "open"
    skipped = (await http.post("/reach", json={"targetTask": "echo"})).json()
    assert [x["agentId"] for x in skipped["attempts"]] == ["b"]
    calls_while_open = len(a.received)
    a.mode = "ok"
    BREAKER_CLOCK.advance(6)  # past the open period, well short of any lease deadline
    probe = (await http.post("/reach", json={"traceId": "br-probe", "targetTask": "echo"})).json()
    assert probe["handlerAgentId"] == "a"
    assert len(a.received) == calls_while_open + 1
    assert "[br-probe] circuit half_open: agent a (probe request)" in trace_lines(caplog, "br-probe")
    assert "[br-probe] circuit closed: agent a" in trace_lines(caplog, "br-probe")
    assert (await http.get("/admin/agents/a")).json()["circuit"] == "closed"


@pytest.mark.policy({"breaker": {"failure_threshold": 3, "open_seconds": 60}})
async def test_a_retryable_agent_error_counts_as_a_failure_and_a_final_one_does_not(cluster) -> None:
    """An agent answering AGENT_ERROR with retryable: true failed where another might not: its
    success rate falls and its breaker opens, as for a 5xx. One answering a final AGENT_ERROR
    refused on purpose: that answer goes to the caller, and the agent stays healthy."""
    _server, http, make = cluster
    await make("flaky", mode="retryable_error", weight=100)
    await make("steady", weight=1)
    for _ in range(3):
        body = (await http.post("/reach", json={"targetTask": "echo"})).json()
        assert body["status"] == "SUCCESS" and body["handlerAgentId"] == "steady"
    flaky = (await http.get("/admin/agents/flaky")).json()
    assert flaky["circuit"] == "open" and flaky["stats"]["successRate"] == 0.0, flaky
    skipped = (await http.post("/reach", json={"targetTask": "echo"})).json()
    assert [a["agentId"] for a in skipped["attempts"]] == ["steady"]

    await make("strict", mode="error", tasks=("check",))
    for _ in range(4):
        body = (await http.post("/reach", json={"targetTask": "check"})).json()
        assert body["status"] == "AGENT_ERROR" and body["error"]["code"] == "FAKE_FAILURE"
    strict = (await http.get("/admin/agents/strict")).json()
    assert strict["circuit"] == "closed" and strict["stats"]["successRate"] == 1.0, strict

    # An SDK agent's UNKNOWN_TASK (retryable: its registration is older than its code) fails
    # over, but counts neither way: the agent's other tasks stay open.
    await make("stale", mode="unknown_task", weight=100, tasks=("echo", "other"))
    for _ in range(4):
        body = (
            await http.post("/reach", json={"targetTask": "echo", "filterAgentIds": ["stale", "steady"]})
        ).json()
        assert body["status"] == "SUCCESS" and body["handlerAgentId"] == "steady"
    stale = (await http.get("/admin/agents/stale")).json()
    assert stale["circuit"] == "closed" and stale["stats"]["requests"] == 0, stale


async def test_every_candidate_open_is_no_handler_with_circuit_reasons(cluster) -> None:
    """When every breaker is open the answer is NO_AVAILABLE_HANDLER with circuit_open reasons."""
    _server, http, make = cluster
    a = await make("a", weight=1)
    await a.stop()  # refused: with open_on_refused its breaker opens at once
    body = (await http.post("/reach", json={"targetTask": "echo"})).json()
    assert body["status"] == "NO_AVAILABLE_HANDLER"
    again = (await http.post("/reach", json={"targetTask": "echo"})).json()
    assert again["error"]["candidates"] == [{"agentId": "a", "reason": "circuit_open", "task": "echo"}]
    assert again["attempts"] == []


@pytest.mark.policy({"retry_budget": {"ratio": 0, "min_per_second": 0}})
async def test_spent_retry_budget_fails_fast(cluster, caplog: pytest.LogCaptureFixture) -> None:
    """With the budget spent, no retry or failover happens, and the trace says so."""
    _server, http, make = cluster
    caplog.set_level(logging.INFO, logger="reachmesh.trace")
    await make("a", mode="http500", weight=10)
    b = await make("b")
    body = (await http.post("/reach", json={"traceId": "bud-1", "targetTask": "echo"})).json()
    assert body["status"] == "NO_AVAILABLE_HANDLER"
    assert len(body["attempts"]) == 1
    assert {c["agentId"]: c["reason"] for c in body["error"]["candidates"]} == {
        "a": "agent_error",
        "b": "budget_exhausted",
    }
    assert b.received == []
    assert any("retry budget: exhausted" in line for line in trace_lines(caplog, "bud-1"))


async def test_conversation_affinity(cluster) -> None:
    """Requests in one conversation stick to the agent that first handled it."""
    _server, http, make = cluster
    await make("a")
    await make("b")
    first = (await http.post("/reach", json={"targetTask": "echo", "conversationId": "c-1"})).json()
    owner = first["handlerAgentId"]
    for _ in range(6):
        body = (await http.post("/reach", json={"targetTask": "echo", "conversationId": "c-1"})).json()
        assert body["handlerAgentId"] == owner
    others = {
        (await http.post("/reach", json={"targetTask": "echo"})).json()["handlerAgentId"] for _ in range(4)
    }
    assert others == {"a", "b"}


async def test_context_bound_fails_over_only_to_a_holder(cluster) -> None:
    """contextBound: with its agent gone, only an agent confirming it holds the conversation gets it."""
    _server, http, make = cluster
    a = await make("a", weight=10)
    b = await make("b")
    c = await make("c")
    req = {"targetTask": "echo", "conversationId": "conv-9", "preferences": {"contextBound": True}}
    assert (await http.post("/reach", json=req)).json()["handlerAgentId"] == "a"
    await a.stop()
    c.conversations.add("conv-9")
    body = (await http.post("/reach", json=req)).json()
    assert body["status"] == "SUCCESS"
    assert body["handlerAgentId"] == "c"
    assert b.received == []


async def test_context_bound_without_a_holder_is_context_unavailable(cluster) -> None:
    """contextBound with no agent confirming the conversation answers 409 CONTEXT_UNAVAILABLE."""
    _server, http, make = cluster
    a = await make("a", weight=10)
    b = await make("b")
    req = {"targetTask": "echo", "conversationId": "conv-7", "preferences": {"contextBound": True}}
    assert (await http.post("/reach", json=req)).json()["handlerAgentId"] == "a"
    await a.stop()
    resp = await http.post("/reach", json=req)
    body = resp.json()
    assert resp.status_code == 409
    assert body["status"] == "CONTEXT_UNAVAILABLE"
    assert {"agentId": "b", "reason": "no_context", "task": "echo"} in body["error"]["candidates"]
    assert b.received == []
    # Without contextBound the same conversation simply fails over.
    loose = (await http.post("/reach", json={"targetTask": "echo", "conversationId": "conv-7"})).json()
    assert loose["handlerAgentId"] == "b"


@pytest.mark.policy(
    {"limits": {"max_inflight": 3, "retry_after_seconds": 2}, "timeouts": {"read_ms": 60_000}}
)
async def test_excess_is_shed_at_once(cluster) -> None:
    """Beyond the in-flight limit, requests are answered 429 OVERLOADED with Retry-After, at once."""
    _server, http, make = cluster
    slow = await make("slow")
    slow.hold = asyncio.Event()
    answered: list[httpx.Response] = []

    async def post() -> httpx.Response:
        resp: httpx.Response = await http.post("/reach", json={"targetTask": "echo"})
        answered.append(resp)
        return resp

    loop = asyncio.get_running_loop()
    began = loop.time()
    sent = [asyncio.create_task(post()) for _ in range(10)]
    try:
        # At once: seven answers come back while the agent still holds the three it admitted,
        # and without waiting for anything first.
        await until(lambda: len(answered) == 7 and len(slow.received) == 3, "7 answers, 3 held")
        assert loop.time() - began < scaled(1.0)
        assert [r.status_code for r in answered] == [429] * 7
        assert answered[0].headers["retry-after"] == "2"
        assert answered[0].json()["status"] == "OVERLOADED"
    finally:
        slow.hold.set()
        responses = await asyncio.gather(*sent)
    assert sorted(r.status_code for r in responses) == [200] * 3 + [429] * 7


@pytest.mark.policy({"timeouts": {"read_ms": 60_000}})
async def test_async_mode_and_reply_to(cluster) -> None:
    """mode async answers 202 at once; GET /reach/{traceId} gives 202 then the result; replyTo gets it."""
    _server, http, make = cluster
    slow = await make("slow")
    slow.hold = asyncio.Event()
    got: list[dict[str, Any]] = []

    async def receive(request: web.Request) -> web.Response:
        got.append(await request.json())
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/callback", receive)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        resp = await http.post(
            "/reach",
            json={
                "traceId": "async-1",
                "targetTask": "echo",
                "payload": {"n": 1},
                "preferences": {"mode": "async", "replyTo": f"http://127.0.0.1:{port}/callback"},
            },
        )
        assert resp.status_code == 202
        assert resp.json()["status"] == "ACCEPTED"
        # At once: answered while the agent still holds the request.
        await until(lambda: slow.received, "the request at the agent")
        pending = await http.get("/reach/async-1")
        assert pending.status_code == 202
        slow.hold.set()

        async def finished() -> httpx.Response | None:
            resp = await http.get("/reach/async-1")
            return resp if resp.status_code != 202 else None

        done = await until(finished, "GET /reach/async-1 to stop answering 202")
        assert done.status_code == 200
        assert done.json()["result"]["echo"] == {"n": 1}
        await until(lambda: got, "the result at replyTo")
        assert got[0]["traceId"] == "async-1" and got[0]["status"] == "SUCCESS"
        assert (await http.get("/reach/nope")).status_code == 404
    finally:
        await runner.cleanup()


@pytest.mark.policy({"async_mode": {"reply_attempts": 3, "reply_backoff_ms": 10}})
async def test_failing_reply_to_is_retried_then_logged(cluster, caplog: pytest.LogCaptureFixture) -> None:
    """A refusing replyTo is tried reply_attempts times, then logged; the result stays fetchable."""
    _server, http, make = cluster
    await make("a")
    caplog.set_level(logging.INFO, logger="reachmesh.async")
    dead = f"http://127.0.0.1:{free_port()}/cb"
    await http.post(
        "/reach",
        json={"traceId": "async-2", "targetTask": "echo", "preferences": {"mode": "async", "replyTo": dead}},
    )
    await until(
        lambda: any(
            f"[async-2] reply to {dead} failed after 3 attempts" in r.getMessage() for r in caplog.records
        ),
        "the log line of the given-up reply",
    )
    assert (await http.get("/reach/async-2")).json()["status"] == "SUCCESS"


async def test_policy_reload(tmp_path: Path) -> None:
    """A new policy file applies on reload; a bad one is rejected and the old policy kept."""
    path = tmp_path / "router.yaml"
    path.write_text("retries: {max_per_request: 0}\nhealth: {enabled: false}\n")
    async with (
        RouterServer(RouterConfig.load(path), config_path=path) as server,
        httpx.AsyncClient(base_url=server.url) as http,
    ):
        agents = [await FakeAgent(f"x{i}", mode="http500").start() for i in range(3)]
        for agent in agents:
            await agent.register(server.url)
        assert len((await http.post("/reach", json={"targetTask": "echo"})).json()["attempts"]) == 1
        path.write_text("retries: {max_per_request: 2}\nhealth: {enabled: false}\n")
        assert (await http.post("/admin/reload")).status_code == 200
        assert len((await http.post("/reach", json={"targetTask": "echo"})).json()["attempts"]) == 3
        path.write_text("retries: {max_per_request: many}\n")
        resp = await http.post("/admin/reload")
        assert resp.status_code == 422
        assert "retries.max_per_request" in resp.json()["error"]["message"]
        assert server.app.config.retries.max_per_request == 2
        for agent in agents:
            await agent.stop()


async def test_deadline_shrinks_across_hops(cluster) -> None:
    """An agent calling another through the Router passes on only the time it has left."""
    server, http, make = cluster
    leaf = await make("leaf")
    port = free_port()
    config = AgentConfig.from_mapping(
        {
            "agent": {
                "id": "middle",
                "network": {"endpoint": f"http://127.0.0.1:{port}/reach"},
                "capabilities": [{"task": "outer"}],
            },
            "router": {"url": server.url},
        },
        env={},
    )
    middle = ReachAgent(config)
    seen: dict[str, Any] = {}

    @middle.capability("outer")
    async def outer(payload: dict, ctx: ReachContext) -> dict:
        await asyncio.sleep(0.2)
        seen["before_call"] = ctx.remaining_ms
        inner = await ctx.call("echo", {"from": "middle"})
        return {"inner": inner.status}

    await middle.start()
    try:
        # Two hops and a 0.2 s pause must fit: a second on a quiet machine, more on a busy one.
        budget = int(scaled(1000))
        body = (
            await http.post("/reach", json={"targetTask": "outer", "preferences": {"timeoutMs": budget}})
        ).json()
        assert body["status"] == "SUCCESS" and body["result"] == {"inner": "SUCCESS"}
        assert seen["before_call"] < budget - 200
        # The leaf saw the same trace and at most what the middle agent had left.
        assert leaf.received[-1]["traceId"] == body["traceId"]
        assert int(leaf.headers[-1]["X-Reach-Deadline-Ms"]) <= seen["before_call"]
        assert leaf.received[-1]["preferences"]["timeoutMs"] <= budget - 200
    finally:
        await middle.stop()
