"""The A2A translation of transport/a2a.py: ReachRequest to SendMessage, task states back."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from reachmesh.exceptions import AgentRejected, BadAgentResponse
from reachmesh.transport import a2a


def answer(result: Any) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": "t", "result": result})


def task(state: str, **extra: Any) -> dict[str, Any]:
    return {"task": {"id": "task-1", "contextId": "c", "status": {"state": state, **extra}}}


def test_a_request_becomes_a_send_message_with_a_data_part() -> None:
    """The payload is one DataPart, the task the skill, the conversation the contextId."""
    body = orjson.dumps(
        {
            "traceId": "tr-1",
            "conversationId": "conv-9",
            "targetTask": "price",
            "payload": {"sku": "A", "n": 2},
        }
    )
    sent = orjson.loads(a2a.send_message(body))
    assert sent["method"] == "SendMessage" and sent["id"] == "tr-1"
    message = sent["params"]["message"]
    assert message["parts"] == [{"data": {"sku": "A", "n": 2}}]
    assert message["contextId"] == "conv-9" and message["role"] == "ROLE_USER"
    assert message["metadata"]["skill"] == "price"


def test_a_text_only_payload_becomes_a_text_part() -> None:
    """{"text": ...} alone is what an A2A agent reads best: a TextPart."""
    sent = orjson.loads(a2a.send_message(orjson.dumps({"targetTask": "chat", "payload": {"text": "hi"}})))
    assert sent["params"]["message"]["parts"] == [{"text": "hi"}]


def test_a_completed_task_gives_its_artifact_data_with_whole_numbers() -> None:
    """One DataPart artifact is the result; protobuf's 2.0 is 2 again."""
    done = task("TASK_STATE_COMPLETED")
    done["task"]["artifacts"] = [{"artifactId": "a", "parts": [{"data": {"n": 2.0, "x": 0.5}}]}]
    assert a2a.classify(200, answer(done)) == {"n": 2, "x": 0.5}


def test_a_direct_message_answer_gives_its_text() -> None:
    """An agent that answers a Message instead of a Task: its text parts are the result."""
    reply = {"message": {"messageId": "m", "role": "ROLE_AGENT", "parts": [{"text": "a"}, {"text": "b"}]}}
    assert a2a.classify(200, answer(reply)) == {"text": "a\nb"}


@pytest.mark.parametrize(
    ("state", "code", "retryable"),
    [
        ("TASK_STATE_FAILED", "A2A_TASK_FAILED", False),
        ("TASK_STATE_REJECTED", "A2A_TASK_REJECTED", True),
        ("TASK_STATE_CANCELED", "A2A_TASK_CANCELED", False),
        ("TASK_STATE_INPUT_REQUIRED", "A2A_INPUT_REQUIRED", False),
        ("TASK_STATE_WORKING", "A2A_TASK_NOT_FINISHED", False),
    ],
)
def test_unfinished_task_states_are_agent_errors(state: str, code: str, retryable: bool) -> None:
    """Each state that carries no result is an AGENT_ERROR naming it; rejected may fail over."""
    with pytest.raises(AgentRejected) as caught:
        a2a.classify(200, answer(task(state)))
    assert caught.value.error["code"] == code and caught.value.retryable is retryable


def test_a_failed_status_carrying_a_reach_error_keeps_its_code() -> None:
    """A DataPart {"error": {...}} in the failed status (what the Router's export sends) is kept."""
    message = {
        "messageId": "m",
        "role": "ROLE_AGENT",
        "parts": [{"data": {"error": {"code": "NOT_FOUND", "message": "gone"}}}],
    }
    with pytest.raises(AgentRejected) as caught:
        a2a.classify(200, answer(task("TASK_STATE_FAILED", message=message)))
    assert caught.value.error["code"] == "NOT_FOUND" and caught.value.error["message"] == "gone"


def test_json_rpc_errors_and_broken_answers() -> None:
    """An internal error or a non-JSON 5xx fails over; other JSON-RPC errors are agent errors."""
    internal = orjson.dumps({"jsonrpc": "2.0", "id": 1, "error": {"code": -32603, "message": "boom"}})
    with pytest.raises(BadAgentResponse):
        a2a.classify(200, internal)
    with pytest.raises(BadAgentResponse):
        a2a.classify(502, b"<html>")
    params = orjson.dumps({"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "bad"}})
    with pytest.raises(AgentRejected) as caught:
        a2a.classify(200, params)
    assert caught.value.error["code"] == "A2A_INVALID_PARAMS"
