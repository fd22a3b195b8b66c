"""Payloads pass unchanged, and what cannot be served safely is a 400 or 422 at the door."""

from __future__ import annotations

import json

import httpx
import pytest

from reachmesh.config import RouterConfig
from reachmesh.testing import FakeAgent, RouterServer

BIG = 123456789012345678901234567890


async def test_big_integers_reach_the_agent_and_come_back_unchanged(http, make_agent) -> None:
    """A 30-digit integer is forwarded byte for byte and echoed back exactly."""
    agent = await make_agent("a")
    payload = {"id": BIG, "neg": -(2**70), "small": 7, "text": "1234567890123456789012"}
    body = json.dumps({"targetTask": "echo", "payload": payload})
    resp = await http.post("/reach", content=body, headers={"Content-Type": "application/json"})
    assert resp.status_code == 200, resp.text
    assert b"123456789012345678901234567890" in agent.raw_received[-1]
    assert json.loads(agent.raw_received[-1])["payload"] == payload
    assert resp.json()["result"]["echo"] == payload


def nested(levels: int) -> object:
    value: object = 1
    for _ in range(levels):
        value = {"a": value}
    return value


@pytest.mark.parametrize("levels", [70, 253, 600])
async def test_deep_payload_is_a_400_with_the_callers_trace_id(http, make_agent, levels: int) -> None:
    """A payload nested past server.max_json_depth is INVALID_REQUEST, never a 500."""
    await make_agent("a")
    body = json.dumps({"traceId": f"deep-{levels}", "targetTask": "echo", "payload": nested(levels)})
    resp = await http.post("/reach", content=body, headers={"Content-Type": "application/json"})
    assert resp.status_code == 400
    answer = resp.json()
    assert answer["status"] == "INVALID_REQUEST"
    assert answer["traceId"] == f"deep-{levels}"


async def test_payload_within_the_depth_limit_passes(http, make_agent) -> None:
    """Nesting just inside the limit is served (the envelope and payload count as two levels)."""
    await make_agent("a")
    resp = await http.post("/reach", json={"targetTask": "echo", "payload": nested(60)})
    assert resp.status_code == 200


async def test_deep_input_schema_is_a_422(http) -> None:
    """An input_schema nested 500 deep is INVALID_PROFILE, not a RecursionError."""
    # Written as text: the standard library would itself recurse too deep to encode it.
    schema = '{"type":"object","properties":{"x":' * 500 + '{"type":"object"}' + "}}" * 500
    profile = (
        '{"id":"deep-schema","network":{"endpoint":"http://127.0.0.1:9/reach"},'
        f'"capabilities":[{{"task":"t","input_schema":{schema}}}]}}'
    )
    resp = await http.post("/agents", content=profile, headers={"Content-Type": "application/json"})
    assert resp.status_code == 422
    assert resp.json()["error"]["code"] == "INVALID_PROFILE"


@pytest.mark.parametrize("limit", ["²", "٣", "0", "1001", "-1", "1e3", " 5"])
async def test_query_parameters_are_ascii_digits_in_range(http, limit: str) -> None:
    """limit=² and other non-ASCII digits are a 400 that names the parameter."""
    resp = await http.get("/admin/traces", params={"limit": limit})
    assert resp.status_code == 400
    assert resp.json()["error"]["details"][0]["field"] == "limit"


async def test_timeouts_over_the_policy_cap_are_refused(http, make_agent) -> None:
    """timeoutMs over limits.max_timeout_ms is INVALID_REQUEST naming the cap; within it is served."""
    await make_agent("a")
    resp = await http.post("/reach", json={"targetTask": "echo", "preferences": {"timeoutMs": 3_600_000}})
    assert resp.status_code == 400
    assert resp.json()["error"]["details"][0]["field"] == "preferences.timeoutMs"
    assert "300000" in resp.json()["error"]["message"]
    resp = await http.post("/reach", json={"targetTask": "echo", "preferences": {"timeoutMs": 300_000}})
    assert resp.status_code == 200


async def test_registry_refuses_agents_past_its_cap() -> None:
    """registry.max_agents: the next new id is 503 REGISTRY_FULL; an existing one may re-register."""
    config = RouterConfig.from_mapping({"registry": {"max_agents": 2}, "health": {"enabled": False}})
    async with RouterServer(config) as router, httpx.AsyncClient(base_url=router.url) as http:
        a, b, c = FakeAgent("a"), FakeAgent("b"), FakeAgent("c")
        lease = await a.register(router.url)
        await b.register(router.url)
        resp = await http.post("/agents", json=c.profile())
        assert (resp.status_code, resp.json()["error"]["code"]) == (503, "REGISTRY_FULL")
        resp = await http.post("/agents", json={**a.profile(), "leaseId": lease})
        assert resp.status_code == 200


def deep_with_long_integer(levels: int) -> str:
    return '{"k":' * levels + "12345678901234567890" + "}" * levels


async def test_a_long_integer_deep_in_a_payload_is_a_400_not_a_500(http, make_agent) -> None:
    """970 levels around a 20-digit integer: the exact parser reads it without recursing, and the
    depth limit answers INVALID_REQUEST with the caller's trace id."""
    await make_agent("a")
    body = '{"traceId":"deep-long","targetTask":"echo","payload":' + deep_with_long_integer(970) + "}"
    resp = await http.post("/reach", content=body, headers={"Content-Type": "application/json"})
    assert resp.status_code == 400
    assert (resp.json()["status"], resp.json()["traceId"]) == ("INVALID_REQUEST", "deep-long")


async def test_a_long_integer_deep_in_an_answer_is_relayed_and_recorded(http, make_agent) -> None:
    """An agent's answer nested 970 deep around a 20-digit integer is passed on exactly; the
    request is counted, traced and leaves nothing in flight."""
    agent = await make_agent("a")
    agent.raw_answer = ('{"status":"SUCCESS","result":' + deep_with_long_integer(970) + "}").encode()
    resp = await http.post("/reach", json={"traceId": "deep-answer", "targetTask": "echo"})
    assert resp.status_code == 200, resp.text[:200]
    assert b'"result":' + deep_with_long_integer(970).encode() + b',"error":null,' in resp.content
    metrics = (await http.get("/metrics")).text
    assert "reach_inflight_requests 0.0" in metrics
    trace = await http.get("/admin/traces/deep-answer")
    assert trace.status_code == 200
    assert [hop["status"] for hop in trace.json()["hops"]] == ["SUCCESS"]


async def test_integers_up_to_4300_digits_pass_and_longer_are_refused(http, make_agent) -> None:
    """The documented digit limit: 4,300 digits reach the agent exactly; 4,301 are a 400."""
    agent = await make_agent("a")
    body = '{"targetTask":"echo","payload":{"n":' + "9" * 4300 + "}}"
    resp = await http.post("/reach", content=body, headers={"Content-Type": "application/json"})
    assert resp.status_code == 200
    assert b"9" * 4300 in agent.raw_received[-1] and b"9" * 4300 in resp.content
    body = '{"targetTask":"echo","payload":{"n":' + "9" * 4301 + "}}"
    resp = await http.post("/reach", content=body, headers={"Content-Type": "application/json"})
    assert resp.status_code == 400
    assert "digits; at most 4300" in resp.json()["error"]["message"]
