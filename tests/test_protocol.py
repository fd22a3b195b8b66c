"""The wire models of PROTOCOL.md."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from reachmesh.protocol import (
    HTTP_STATUS,
    AgentProfile,
    ReachRequest,
    ReachResponse,
    Status,
    error_details,
    json_schemas,
)

PROFILE = {
    "id": "price-query-agent",
    "display_name": "价格查询Agent",
    "network": {"protocol": "http", "endpoint": "http://price-agent:8080/reach"},
    "capabilities": [
        {
            "task": "query_product_price",
            "description": "查询指定商品的当前售价",
            "input_schema": {"product_id": "string", "currency": "string"},
            "output_schema": {"price": "number", "currency": "string", "updated_at": "string"},
            "routing_weight": 10,
        }
    ],
    "health_check": {"path": "/healthz", "port": 8082, "interval_seconds": 15, "timeout_ms": 5000},
}


def test_reference_profile_validates() -> None:
    """The profile of PROTOCOL.md §1 validates with every key kept."""
    profile = AgentProfile.model_validate(PROFILE)
    assert profile.capabilities[0].routing_weight == 10
    assert profile.health_check.port == 8082
    assert profile.tasks == ["query_product_price"]


def test_profile_defaults() -> None:
    """routing_weight defaults to 1 and health_check to /healthz every 15 s."""
    profile = AgentProfile.model_validate(
        {"id": "a", "network": {"endpoint": "http://127.0.0.1:1/r"}, "capabilities": [{"task": "t"}]}
    )
    assert profile.capabilities[0].routing_weight == 1
    assert profile.health_check.path == "/healthz"
    assert profile.health_check.interval_seconds == 15


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"id": "Bad Id"}, "id"),
        ({"network": {"endpoint": "ftp://x/reach"}}, "network.endpoint"),
        ({"network": {"endpoint": "http://user:pw@x/reach"}}, "network.endpoint"),
        ({"capabilities": []}, "capabilities"),
        ({"capabilities": [{"task": "has space"}]}, "capabilities.0.task"),
        ({"capabilities": [{"task": "t", "routing_weight": 0}]}, "capabilities.0.routing_weight"),
        ({"capabilities": [{"task": "t", "input_schema": {"x": "str"}}]}, "capabilities.0.input_schema"),
        (
            {"capabilities": [{"task": "t", "input_schema": {"$ref": "http://evil/x"}}]},
            "capabilities.0.input_schema",
        ),
        ({"health_check": {"port": 70000}}, "health_check.port"),
        # A count and a promise: a type that only converts to one (true, "20", 20.0, "yes") is a
        # mistake, and `idempotent` lets the Router send a request twice.
        ({"max_concurrency": True}, "max_concurrency"),
        ({"max_concurrency": "20"}, "max_concurrency"),
        ({"max_concurrency": 20.0}, "max_concurrency"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"capabilities": [{"task": "t", "idempotent": "yes"}]}, "capabilities.0.idempotent"),
        ({"capabilities": [{"task": "t", "idempotent": 1}]}, "capabilities.0.idempotent"),
    ],
)
def test_invalid_profiles_name_the_field(change: dict, field: str) -> None:
    """Each invalid profile is refused with the dotted path of the field at fault."""
    with pytest.raises(ValidationError) as info:
        AgentProfile.model_validate({**PROFILE, **change})
    assert field in [d["field"] for d in error_details(info.value)]


def test_duplicate_tasks_are_refused() -> None:
    """A profile that declares one task twice is invalid."""
    with pytest.raises(ValidationError, match="declared twice"):
        AgentProfile.model_validate({**PROFILE, "capabilities": [{"task": "t"}, {"task": "t"}]})


def test_reference_request_parses_camel_case() -> None:
    """The ReachRequest of PROTOCOL.md §3 parses; unknown keys are ignored."""
    request = ReachRequest.model_validate(
        {
            "version": "1.0",
            "traceId": "8f1a3c2d9e4b",
            "conversationId": "conv-20240617-001",
            "sourceAgent": "user-proxy",
            "targetTask": "query_product_price",
            "targetAgent": "",
            "payload": {"product_id": "SKU-88231"},
            "somethingNew": 1,
            "preferences": {
                "timeoutMs": 4000,
                "retryCount": 2,
                "filterAgentIds": ["price-query-agent"],
                "strategy": "exact_match",
                "mode": "sync",
                "replyTo": None,
                "contextBound": False,
            },
        }
    )
    assert request.trace_id == "8f1a3c2d9e4b"
    assert request.preferences.timeout_ms == 4000
    assert request.preferences.filter_agent_ids == ["price-query-agent"]
    assert request.target_agent == ""


def test_overall_timeout_is_a_synonym() -> None:
    """overallTimeoutMs is accepted as timeoutMs."""
    request = ReachRequest.model_validate({"targetTask": "t", "preferences": {"overallTimeoutMs": 900}})
    assert request.preferences.timeout_ms == 900


@pytest.mark.parametrize("value", [0, -5, "4000", 1.5, True])
def test_bad_timeouts_are_invalid(value: object) -> None:
    """Zero, negative and non-integer timeouts are INVALID_REQUEST, never coerced."""
    prefs = {"timeoutMs": value}
    with pytest.raises(ValidationError):
        ReachRequest.model_validate({"targetTask": "t", "preferences": prefs})


@pytest.mark.parametrize("trace_id", ["has space", "line\nbreak", "x" * 129, ""])
def test_trace_ids_that_could_forge_log_lines_are_refused(trace_id: str) -> None:
    """A traceId with spaces, control characters or excessive length is refused."""
    with pytest.raises(ValidationError):
        ReachRequest.model_validate({"targetTask": "t", "traceId": trace_id})


def test_task_text_with_control_characters_is_refused() -> None:
    """A targetTask carrying a newline cannot forge a trace log line."""
    with pytest.raises(ValidationError):
        ReachRequest.model_validate({"targetTask": "t\n[x] select evil"})


def test_every_status_has_its_http_code() -> None:
    """The status table of §3 maps each status to its HTTP code."""
    assert HTTP_STATUS[Status.SUCCESS] == 200
    assert HTTP_STATUS[Status.NO_AVAILABLE_HANDLER] == 503
    assert HTTP_STATUS[Status.CONTEXT_UNAVAILABLE] == 409
    assert HTTP_STATUS[Status.TIMEOUT] == 504
    assert HTTP_STATUS[Status.AGENT_ERROR] == 502
    assert HTTP_STATUS[Status.OVERLOADED] == 429
    assert set(HTTP_STATUS) == set(Status)


def test_response_round_trips_with_wire_keys() -> None:
    """A ReachResponse serialises with the camelCase keys of §3."""
    response = ReachResponse.model_validate(
        {
            "traceId": "t1",
            "status": "SUCCESS",
            "handlerAgentId": "a",
            "durationMs": 3,
            "result": {"price": 1},
            "attempts": [{"agentId": "a", "outcome": "SUCCESS", "durationMs": 2}],
        }
    )
    wire = response.model_dump(by_alias=True)
    assert wire["handlerAgentId"] == "a"
    assert wire["attempts"][0]["agentId"] == "a"
    assert response.ok


def test_json_schemas_are_exported_with_wire_names() -> None:
    """JSON Schema is exported for each wire model, with camelCase envelope keys."""
    schemas = json_schemas()
    assert {"AgentProfile", "ReachRequest", "ReachResponse", "AgentStatus"} <= set(schemas)
    assert "targetTask" in schemas["ReachRequest"]["properties"]
    assert "targetTask" in schemas["ReachRequest"]["required"]
    assert "routing_weight" in schemas["AgentProfile"]["$defs"]["Capability"]["properties"]
