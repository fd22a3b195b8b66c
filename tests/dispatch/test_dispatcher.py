"""The dispatcher and its resilience, in process: a FakeTransport and a ManualClock, no sockets."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from reachmesh.config import RouterConfig
from reachmesh.protocol import AgentProfile, ReachResponse
from reachmesh.server.components import RouterParts
from reachmesh.testing import Answer, FakeTransport, ManualClock

WIRE_KEYS = {
    "version",
    "traceId",
    "status",
    "handlerAgentId",
    "durationMs",
    "result",
    "error",
    "attempts",
    "route",
}


class Rig:
    """A Router's parts over a fake transport and a manual clock."""

    def __init__(self, **policy: Any) -> None:
        self.clock = ManualClock()
        self.fake = FakeTransport(self.clock)
        # The pause before a same-agent retry sleeps on this clock, which only moves when a test
        # says so: none here unless a test asks for one (tests/dispatch/test_busy_wait.py does).
        base = {"embedding": {"backend": "none"}, "retries": {"backoff_ms": 0}}
        config = RouterConfig.model_validate({**base, **policy})
        self.parts = RouterParts.build(config, transport=self.fake, clock=self.clock)

    async def agent(self, agent_id: str, task: str = "echo", **settings: Any) -> Any:
        url = f"http://{agent_id}.test:80/reach"
        profile = AgentProfile.model_validate(
            {"id": agent_id, "network": {"endpoint": url}, "capabilities": [{"task": task}]}
        )
        await self.parts.registry.register(profile)
        return self.fake.endpoint(url, **settings)

    async def call(self, **envelope: Any) -> tuple[int, dict[str, Any]]:
        status, body = await self.parts.dispatcher.handle(orjson.dumps({"targetTask": "echo", **envelope}))
        answer = orjson.loads(body)
        assert set(answer) == WIRE_KEYS  # one shape for every answer
        ReachResponse.model_validate(answer)
        return status, answer


def outcomes(answer: dict[str, Any]) -> list[tuple[str, str]]:
    return [(a["agentId"], a["outcome"]) for a in answer["attempts"]]


async def test_success_carries_the_result_and_the_envelope_reaches_the_agent() -> None:
    """A call by task returns the agent's result; the agent gets targetAgent, traceId and headers."""
    rig = Rig()
    a = await rig.agent("a", default=Answer({"price": 1}))
    status, answer = await rig.call(traceId="t-1", payload={"x": 1})
    assert (status, answer["status"], answer["result"]) == (200, "SUCCESS", {"price": 1})
    assert a.received[0]["targetAgent"] == "a"
    assert a.headers[0]["X-Reach-Trace-Id"] == "t-1"
    assert outcomes(answer) == [("a", "SUCCESS")]


async def test_network_error_retries_same_agent_then_fails_over() -> None:
    """Two resets on one agent: one same-agent retry, then failover to the next agent."""
    rig = Rig(retry_budget={"enabled": False}, breaker={"open_on_refused": False})
    first = await rig.agent("a")
    await rig.agent("b")
    first.then("reset", "reset")  # equal weights: the rotation starts with the first agent
    status, answer = await rig.call()
    assert status == 200
    assert outcomes(answer) == [("a", "connect_error"), ("a", "connect_error"), ("b", "SUCCESS")]


async def test_refused_connection_opens_the_breaker_at_once() -> None:
    """A refused connection opens the breaker; the next request skips the agent as circuit_open."""
    rig = Rig()
    a = await rig.agent("a")
    a.then("refused", "refused")  # the first attempt and its same-agent retry
    status, answer = await rig.call()
    assert status == 503
    assert rig.parts.breakers.state("a").value == "open"
    status, answer = await rig.call()
    assert answer["error"]["candidates"] == [{"agentId": "a", "reason": "circuit_open", "task": "echo"}]
    assert answer["attempts"] == []


async def test_half_open_probe_after_the_open_period_closes_the_breaker() -> None:
    """After open_seconds one probe goes through; its success closes the breaker."""
    rig = Rig(breaker={"open_seconds": 10})
    a = await rig.agent("a")
    a.then("refused", "refused")
    await rig.call()
    rig.clock.advance(5)
    assert (await rig.call())[1]["error"]["candidates"][0]["reason"] == "circuit_open"
    rig.clock.advance(6)
    status, answer = await rig.call()
    assert (status, answer["status"]) == (200, "SUCCESS")
    assert rig.parts.breakers.state("a").value == "closed"


async def test_agent_error_is_not_retried_and_is_not_the_breakers_business() -> None:
    """A non-retryable AGENT_ERROR ends the request at once and leaves the breaker closed."""
    rig = Rig(breaker={"failure_threshold": 1})
    a = await rig.agent("a")
    await rig.agent("b")
    for endpoint in rig.fake.endpoints.values():
        endpoint.default = "error"
    status, answer = await rig.call()
    assert (status, answer["status"], answer["error"]["code"]) == (502, "AGENT_ERROR", "FAKE")
    assert len(answer["attempts"]) == 1
    assert rig.parts.breakers.state(answer["handlerAgentId"]).value == "closed"
    assert a.received or rig.fake.endpoints["http://b.test:80/reach"].received


async def test_answer_over_the_limit_is_agent_error_and_breaker_stays_closed() -> None:
    """RESPONSE_TOO_LARGE is the agent's answer, not a network failure."""
    rig = Rig(breaker={"failure_threshold": 1})
    a = await rig.agent("a")
    a.default = "too_large"
    for _ in range(3):
        status, answer = await rig.call()
        assert (status, answer["error"]["code"]) == (502, "RESPONSE_TOO_LARGE")
    assert rig.parts.breakers.state("a").value == "closed"


@pytest.mark.parametrize("fault", ["http500", "garbage", "timeout"])
async def test_agent_trouble_fails_over_and_counts_against_the_breaker(fault: str) -> None:
    """5xx, a non-JSON answer and a timeout fail over to the next agent and count as failures."""
    rig = Rig(breaker={"failure_threshold": 1})
    a = await rig.agent("a")
    await rig.agent("b")
    a.then(fault)  # equal weights: the rotation starts with the first agent
    status, answer = await rig.call(preferences={"timeoutMs": 60_000})
    assert status == 200
    assert [agent for agent, _ in outcomes(answer)] == ["a", "b"]
    assert rig.parts.breakers.state("a").value == "open"
    assert rig.parts.breakers.state("b").value == "closed"


async def test_overall_deadline_ends_in_timeout_on_the_manual_clock() -> None:
    """An agent slower than the whole budget: TIMEOUT 504, with no real waiting."""
    rig = Rig()
    await rig.agent("a", latency_s=30)
    status, answer = await rig.call(preferences={"timeoutMs": 500})
    assert (status, answer["status"], answer["error"]["code"]) == (504, "TIMEOUT", "TIMEOUT")


async def test_retry_budget_exhausted_stops_failover() -> None:
    """With the budget spent, the next candidate is skipped as budget_exhausted."""
    rig = Rig(retry_budget={"ratio": 0, "min_per_second": 0}, retries={"same_agent": 0})
    await rig.agent("a")
    await rig.agent("b")
    for endpoint in rig.fake.endpoints.values():
        endpoint.then("http500")
    status, answer = await rig.call()
    assert status == 503
    reasons = sorted(c["reason"] for c in answer["error"]["candidates"])
    assert reasons == ["agent_error", "budget_exhausted"]


async def test_context_bound_goes_only_to_a_confirmed_holder() -> None:
    """contextBound: the bound agent is gone; only an agent that holds the conversation qualifies."""
    rig = Rig()
    a = await rig.agent("a")
    b = await rig.agent("b")
    c = await rig.agent("c")
    prefs = {"contextBound": True}
    rig.parts.affinity.bind("conv/1", "a")
    a.default = "http500"
    c.conversations.add("conv%2F1")
    status, answer = await rig.call(conversationId="conv/1", preferences=prefs)
    assert (status, answer["handlerAgentId"]) == (200, "c")
    # The id is one escaped path segment, never a path of its own.
    assert b.holds_asked == ["conv%2F1"]
    c.conversations.clear()
    rig.parts.affinity.bind("conv/1", "a")
    status, answer = await rig.call(conversationId="conv/1", preferences=prefs)
    assert (status, answer["status"]) == (409, "CONTEXT_UNAVAILABLE")


async def test_async_request_is_stored_and_delivered_to_reply_to() -> None:
    """mode async: 202 at once, then the result is kept and POSTed to replyTo."""
    rig = Rig()
    await rig.agent("a", default=Answer({"done": True}))
    listener = rig.fake.endpoint("http://caller.test/replies")
    prefs = {"mode": "async", "replyTo": listener.url}
    status, answer = await rig.call(traceId="job-1", preferences=prefs)
    assert (status, answer["status"]) == (202, "ACCEPTED")
    for _ in range(20):
        if listener.delivered:
            break
        await asyncio.sleep(0)
    assert orjson.loads(listener.delivered[0])["result"] == {"done": True}
    stored = rig.parts.results.get("job-1")
    assert stored is not None and stored[0] == 200
    status, answer = await rig.call(traceId="job-1", preferences=prefs)
    assert (status, answer["error"]["code"]) == (400, "TRACE_ID_IN_USE")
    await rig.parts.dispatcher.close()


async def test_bad_envelopes_get_invalid_request_with_the_callers_trace_id() -> None:
    """Bad JSON, a non-object and a wrong field are INVALID_REQUEST; a readable traceId is kept."""
    rig = Rig()
    for body in (
        b"{",
        b"[1]",
        orjson.dumps({"traceId": "bad-1", "targetTask": "echo", "preferences": {"timeoutMs": "4000"}}),
    ):
        status, raw = await rig.parts.dispatcher.handle(body)
        answer = orjson.loads(raw)
        assert set(answer) == WIRE_KEYS
        assert (status, answer["status"]) == (400, "INVALID_REQUEST")
    status, raw = await rig.parts.dispatcher.handle(orjson.dumps({"traceId": "bad-2", "targetTask": 5}))
    assert (status, orjson.loads(raw)["traceId"]) == (400, "bad-2")


async def test_shed_answer_is_overloaded_with_retry_after() -> None:
    """The shedder's refusal is a whole ReachResponse with retryAfterSeconds."""
    rig = Rig()
    status, raw = rig.parts.dispatcher.shed("1024 requests in flight")
    answer = orjson.loads(raw)
    assert (status, answer["status"], answer["error"]["retryAfterSeconds"]) == (429, "OVERLOADED", 1)
