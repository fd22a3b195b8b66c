"""POST /reach against real agents on loopback: routing, validation, failover, timeouts."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from reachmesh.testing import RouterServer
from tests.helpers import log_lines, scaled

JSON = {"Content-Type": "application/json"}


async def reach(http: httpx.AsyncClient, body: dict, **kwargs: object) -> httpx.Response:
    return await http.post("/reach", json=body, **kwargs)  # type: ignore[arg-type]


async def test_call_by_task_returns_the_agents_result(http, make_agent) -> None:
    """A call by task reaches the agent and returns its result in a SUCCESS envelope."""
    await make_agent("a")
    resp = await reach(http, {"traceId": "t-1", "targetTask": "echo", "payload": {"x": 1}})
    body = resp.json()
    assert resp.status_code == 200
    assert body["status"] == "SUCCESS"
    assert body["traceId"] == "t-1"
    assert body["handlerAgentId"] == "a"
    assert body["result"] == {"agent": "a", "echo": {"x": 1}}
    assert [a["agentId"] for a in body["attempts"]] == ["a"]
    assert body["attempts"][0]["outcome"] == "SUCCESS"


async def test_agent_receives_envelope_and_headers(http, make_agent) -> None:
    """The agent gets the envelope with traceId and targetAgent filled, and the §6 headers."""
    agent = await make_agent("a")
    await reach(http, {"targetTask": "echo", "payload": {}, "preferences": {"timeoutMs": 2000}})
    envelope, headers = agent.received[-1], agent.headers[-1]
    assert envelope["targetAgent"] == "a"
    assert len(envelope["traceId"]) == 32
    assert headers["X-Reach-Trace-Id"] == envelope["traceId"]
    assert headers["traceparent"].split("-")[1] == envelope["traceId"]
    # What was left when the agent was called: most of it, never more. Not the 5000 ms a
    # request without a budget gets, at any time scale.
    assert 2000 - scaled(500) < int(headers["X-Reach-Deadline-Ms"]) <= 2000


async def test_trace_id_from_traceparent(http, make_agent) -> None:
    """Without a traceId, the caller's W3C traceparent trace id becomes the traceId."""
    agent = await make_agent("a")
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    resp = await reach(http, {"targetTask": "echo"}, headers={"traceparent": parent})
    assert resp.json()["traceId"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert agent.headers[-1]["traceparent"].split("-")[1] == "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.mark.parametrize("dots", [".", ".."])
async def test_a_trace_id_no_url_can_name_is_refused_in_the_body_and_ignored_in_a_header(
    http, make_agent, dots: str
) -> None:
    """'.' and '..' fit the trace id alphabet, but clients resolve them away in a path, so
    GET /reach/{traceId} and GET /admin/traces/{traceId} could never fetch them."""
    await make_agent("a")
    resp = await reach(http, {"targetTask": "echo", "traceId": dots})
    body = resp.json()
    assert resp.status_code == 400 and body["error"]["code"] == "INVALID_REQUEST"
    assert [d["field"] for d in body["error"]["details"]] == ["traceId"]
    assert "URL path" in body["error"]["details"][0]["message"]
    resp = await reach(http, {"targetTask": "echo"}, headers={"X-Reach-Trace-Id": dots})
    chosen = resp.json()["traceId"]
    assert resp.status_code == 200 and re.fullmatch(r"[0-9a-f]{32}", chosen), chosen
    assert (await http.get(f"/admin/traces/{chosen}")).status_code == 200
    for fine in ("...", "a..b", ".hidden"):
        resp = await reach(http, {"targetTask": "echo", "traceId": fine})
        assert resp.status_code == 200 and resp.json()["traceId"] == fine


async def test_call_by_target_agent(http, make_agent) -> None:
    """targetAgent sends the request to that agent only."""
    await make_agent("a")
    b = await make_agent("b")
    for _ in range(4):
        resp = await reach(http, {"targetTask": "echo", "targetAgent": "b"})
        assert resp.json()["handlerAgentId"] == "b"
    assert len(b.received) == 4


async def test_filter_allowlist(http, make_agent) -> None:
    """filterAgentIds restricts the candidates; an allowlist with no match is NO_AVAILABLE_HANDLER."""
    await make_agent("a")
    await make_agent("b")
    for _ in range(4):
        resp = await reach(http, {"targetTask": "echo", "preferences": {"filterAgentIds": ["a"]}})
        assert resp.json()["handlerAgentId"] == "a"
    resp = await reach(http, {"targetTask": "echo", "preferences": {"filterAgentIds": ["zzz"]}})
    body = resp.json()
    assert resp.status_code == 503
    assert body["status"] == "NO_AVAILABLE_HANDLER"
    assert sorted(c["agentId"] for c in body["error"]["candidates"]) == ["a", "b"]
    assert {c["reason"] for c in body["error"]["candidates"]} == {"filtered"}


async def test_weights_spread_the_load(http, make_agent) -> None:
    """With several candidates, requests are spread by routing_weight."""
    heavy = await make_agent("heavy", weight=3)
    light = await make_agent("light", weight=1)
    for _ in range(40):
        assert (await reach(http, {"targetTask": "echo"})).status_code == 200
    assert (len(heavy.received), len(light.received)) == (30, 10)


async def test_unknown_task(http, make_agent) -> None:
    """A task nobody declares is NO_AVAILABLE_HANDLER with an empty candidate list."""
    await make_agent("a")
    resp = await reach(http, {"targetTask": "no_such_task"})
    body = resp.json()
    assert resp.status_code == 503
    assert body["error"]["code"] == "NO_AVAILABLE_HANDLER"
    assert body["error"]["candidates"] == []
    assert "no_such_task" in body["error"]["message"]


async def test_payload_checked_against_input_schema(http, make_agent) -> None:
    """A payload that breaks the input_schema is INVALID_REQUEST naming the fields; nothing is forwarded."""
    agent = await make_agent("a", input_schema={"product_id": "string", "currency": "string?"})
    resp = await reach(http, {"targetTask": "echo", "payload": {"currency": 7}})
    body = resp.json()
    assert resp.status_code == 400
    assert body["status"] == "INVALID_REQUEST"
    assert {d["field"] for d in body["error"]["details"]} == {"payload.product_id", "payload.currency"}
    assert agent.received == []
    ok = await reach(http, {"targetTask": "echo", "payload": {"product_id": "SKU-1"}})
    assert ok.json()["status"] == "SUCCESS"


@pytest.mark.parametrize(
    ("content", "headers", "status", "code"),
    [
        (b"{not json", JSON, 400, "INVALID_REQUEST"),
        (b"[1, 2]", JSON, 400, "INVALID_REQUEST"),
        (b'{"payload": {}}', JSON, 400, "INVALID_REQUEST"),
        (b'{"targetTask": 5}', JSON, 400, "INVALID_REQUEST"),
        (b'{"targetTask": "t", "payload": []}', JSON, 400, "INVALID_REQUEST"),
        (b'{"targetTask": "t", "preferences": {"timeoutMs": 0}}', JSON, 400, "INVALID_REQUEST"),
        (b'{"targetTask": "t", "preferences": {"timeoutMs": "soon"}}', JSON, 400, "INVALID_REQUEST"),
        (b'{"targetTask": "t", "preferences": {"strategy": "magic"}}', JSON, 400, "INVALID_REQUEST"),
        (
            b"targetTask=t",
            {"Content-Type": "application/x-www-form-urlencoded"},
            415,
            "UNSUPPORTED_MEDIA_TYPE",
        ),
        (b"", JSON, 400, "INVALID_REQUEST"),
    ],
)
async def test_bad_envelopes_get_structured_errors(http, content, headers, status, code) -> None:
    """Each kind of bad envelope gets its status and a ReachResponse naming the fault, never a 500."""
    resp = await http.post("/reach", content=content, headers=headers)
    body = resp.json()
    assert resp.status_code == status
    assert body["status"] == "INVALID_REQUEST"
    assert body["error"]["code"] == code
    assert body["error"]["message"]
    assert body["traceId"]


async def test_missing_target_task_names_the_field(http) -> None:
    """A missing targetTask is named in error.details."""
    resp = await http.post("/reach", json={"payload": {}})
    assert [d["field"] for d in resp.json()["error"]["details"]] == ["targetTask"]


async def test_body_over_the_limit_is_413(http) -> None:
    """A body over the limit (default 1 MiB) is 413 PAYLOAD_TOO_LARGE, with or without Content-Length."""
    big = b'{"targetTask": "t", "payload": {"x": "' + b"a" * (1024 * 1024) + b'"}}'
    resp = await http.post("/reach", content=big, headers=JSON)
    assert resp.status_code == 413
    assert resp.json()["error"]["code"] == "PAYLOAD_TOO_LARGE"

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(20):
            yield b"a" * 100_000

    resp = await http.post("/reach", content=chunks(), headers=JSON)
    assert resp.status_code == 413
    assert resp.json()["status"] == "INVALID_REQUEST"


async def test_body_limit_is_configurable() -> None:
    """server.body_limit_bytes sets the limit."""
    from reachmesh.config import RouterConfig

    config = RouterConfig.from_mapping({"server": {"body_limit_bytes": 100}})
    async with RouterServer(config) as server, httpx.AsyncClient(base_url=server.url) as http:
        resp = await http.post("/reach", json={"targetTask": "t", "payload": {"x": "a" * 200}})
        assert resp.status_code == 413


async def test_agent_error_is_passed_on(http, make_agent) -> None:
    """A non-retryable AGENT_ERROR answers 502 with the agent's error and no failover."""
    await make_agent("a", mode="error")
    b = await make_agent("b")
    resp = await reach(http, {"targetTask": "echo", "targetAgent": "a"})
    body = resp.json()
    assert resp.status_code == 502
    assert body["status"] == "AGENT_ERROR"
    assert body["error"]["code"] == "FAKE_FAILURE"
    assert body["handlerAgentId"] == "a"
    assert b.received == []


async def test_failover_to_the_next_candidate(http, make_agent) -> None:
    """A retryable failure moves to the next candidate and records every attempt."""
    await make_agent("a", mode="http500", weight=10)
    await make_agent("b", weight=1)
    resp = await reach(http, {"targetTask": "echo"})
    body = resp.json()
    assert body["status"] == "SUCCESS"
    assert body["handlerAgentId"] == "b"
    assert [(a["agentId"], a["outcome"]) for a in body["attempts"]] == [
        ("a", "agent_error"),
        ("b", "SUCCESS"),
    ]


async def test_refused_connection_is_retried_then_failed_over(http, make_agent) -> None:
    """A refused agent is retried once, then the request fails over."""
    a = await make_agent("a", weight=10)
    await make_agent("b", weight=1)
    await a.stop()
    body = (await reach(http, {"targetTask": "echo"})).json()
    assert body["handlerAgentId"] == "b"
    assert [(x["agentId"], x["outcome"]) for x in body["attempts"]] == [
        ("a", "connect_error"),
        ("a", "connect_error"),
        ("b", "SUCCESS"),
    ]


async def test_every_candidate_fails(http, make_agent) -> None:
    """When every attempt fails, NO_AVAILABLE_HANDLER lists each candidate with its reason."""
    await make_agent("a", mode="http500")
    await make_agent("b", mode="garbage")
    await make_agent("c", mode="retryable_error")
    await make_agent("d", mode="retryable_error")
    body = (await reach(http, {"targetTask": "echo"})).json()
    assert body["status"] == "NO_AVAILABLE_HANDLER"
    assert len(body["attempts"]) == 3  # one try plus two retries, the policy's cap
    reasons = {c["agentId"]: c["reason"] for c in body["error"]["candidates"]}
    assert set(reasons) == {"a", "b", "c", "d"}
    assert list(reasons.values()).count("budget_exhausted") == 1


async def test_retry_count_zero_means_one_attempt(http, make_agent) -> None:
    """retryCount 0 allows a single upstream attempt."""
    await make_agent("a", mode="http500")
    await make_agent("b", mode="http500")
    body = (await reach(http, {"targetTask": "echo", "preferences": {"retryCount": 0}})).json()
    assert len(body["attempts"]) == 1


async def test_overall_budget_is_a_deadline(http, make_agent) -> None:
    """A slow agent turns into TIMEOUT (504) at the budget, not later."""
    await make_agent("slow", delay_s=scaled(1.0))
    started = time.monotonic()
    resp = await reach(http, {"targetTask": "echo", "preferences": {"timeoutMs": 300}})
    took = time.monotonic() - started
    assert resp.status_code == 504
    assert resp.json()["status"] == "TIMEOUT"
    assert resp.json()["attempts"][0]["outcome"] == "timeout"
    # Before the agent would have answered: the deadline ended it (the bench times the lateness).
    assert took < scaled(1.0)


async def test_trace_lines(http, make_agent, caplog: pytest.LogCaptureFixture) -> None:
    """Every routed request writes the four trace lines of §7, in order."""
    await make_agent("price-query-agent")
    await make_agent("promotion-agent")
    caplog.set_level(logging.INFO, logger="reachmesh.trace")
    await reach(
        http,
        {"traceId": "trace-demo-001", "sourceAgent": "user-proxy", "targetTask": "echo", "targetAgent": ""},
    )
    lines = log_lines(caplog)
    assert lines[0] == "[trace-demo-001] route: user-proxy -> echo"
    assert lines[1] == "[trace-demo-001] candidate agents: price-query-agent, promotion-agent"
    assert lines[2].startswith("[trace-demo-001] select ") and lines[2].endswith(" by exact_match")
    assert lines[3].startswith("[trace-demo-001] forward: ")
    assert lines[3].endswith("ms")


async def test_failover_is_in_the_trace(http, make_agent, caplog: pytest.LogCaptureFixture) -> None:
    """Retries and failovers add lines of the same form."""
    a = await make_agent("a", weight=10)
    await make_agent("b")
    await a.stop()
    caplog.set_level(logging.INFO, logger="reachmesh.trace")
    await reach(http, {"traceId": "tr-2", "targetTask": "echo"})
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == "reachmesh.trace")
    assert "[tr-2] retry: a, attempt=2, reason=connect_error" in text
    assert "[tr-2] failover: a -> b (connect_error)" in text
