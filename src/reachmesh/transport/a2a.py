"""A ReachRequest as an A2A ``SendMessage`` (JSON-RPC binding, A2A 1.0), and the answer back.

Pure translation, no I/O: :class:`~reachmesh.transport.http.HttpTransport` sends the bytes over
its own pooled, guarded connection, so an imported A2A agent gets the same limits, TLS and
outbound checks as any other. The mapping (also in docs/protocol.md §17):

- the payload becomes one DataPart; a payload of only ``{"text": "..."}`` becomes a TextPart;
- ``metadata.skill`` names the task (the skill id); ``conversationId`` becomes ``contextId``;
- a completed task's artifacts (or a direct Message's parts) become the ``result``: the data of
  a single DataPart, else ``{"text": ...}`` (and ``"data": [...]`` when both kinds came back);
- the other task states become the attempt errors that the Router maps to ReachResponse
  statuses: ``failed`` and ``canceled`` → ``AGENT_ERROR``; ``rejected`` → a decline (the next
  candidate is tried, and the agent's breaker never sees it); ``input-required``,
  ``auth-required`` and a task still running → ``AGENT_ERROR`` naming the state. A JSON-RPC
  internal error or an HTTP 5xx is a bad answer (failover and breaker), as for a Reach agent.

This module imports nothing from a2a-sdk: forwarding to an imported agent needs no extra.
"""

from __future__ import annotations

import uuid
from typing import Any

from reachmesh import jsoncodec
from reachmesh.exceptions import AgentDeclined, AgentRejected, BadAgentResponse
from reachmesh.sse import SseEvent
from reachmesh.transport.pieces import Chunk, Final, Piece

A2A_VERSION = "1.0"
# The headers of a Router attempt that an A2A agent may also use (tracing, the deadline).
_FORWARDED = ("X-Reach-Trace-Id", "traceparent", "X-Reach-Deadline-Ms", "X-Reach-Hops")
_JSONRPC_CODES = {
    -32700: "A2A_PARSE_ERROR",
    -32600: "A2A_INVALID_REQUEST",
    -32601: "A2A_METHOD_NOT_FOUND",
    -32602: "A2A_INVALID_PARAMS",
    -32001: "A2A_TASK_NOT_FOUND",
    -32004: "A2A_UNSUPPORTED_OPERATION",
    -32005: "A2A_CONTENT_TYPE_NOT_SUPPORTED",
    -32009: "A2A_VERSION_NOT_SUPPORTED",
}
_INTERNAL_ERROR = -32603
# What an agent that does not stream answers SendStreamingMessage with (its card says so).
UNSUPPORTED = "A2A_UNSUPPORTED_OPERATION"
# Task states that end an attempt without a result: (error code, may another agent try).
_UNFINISHED = {
    "TASK_STATE_FAILED": ("A2A_TASK_FAILED", False),
    "TASK_STATE_CANCELED": ("A2A_TASK_CANCELED", False),
    "TASK_STATE_REJECTED": ("A2A_TASK_REJECTED", True),
    "TASK_STATE_INPUT_REQUIRED": ("A2A_INPUT_REQUIRED", False),
    "TASK_STATE_AUTH_REQUIRED": ("A2A_AUTH_REQUIRED", False),
}
# The states a stream ends in (A2A: terminal, or interrupted waiting for the caller).
_TERMINAL = frozenset({"TASK_STATE_COMPLETED", *_UNFINISHED})


def send_message(body: bytes, *, streaming: bool = False) -> bytes:
    """The JSON-RPC ``SendMessage`` request for a ReachRequest body (as the Router forwards it);
    ``SendStreamingMessage`` for a caller that asked for a stream."""
    envelope = jsoncodec.loads(body)
    payload = envelope.get("payload")
    payload = payload if isinstance(payload, dict) else {}
    task = envelope.get("targetTask")
    text = payload.get("text")
    part: dict[str, Any] = (
        {"text": text} if len(payload) == 1 and isinstance(text, str) else {"data": payload}
    )
    metadata: dict[str, Any] = {"skill": task}
    for key in ("traceId", "sourceAgent", "requestedTask"):
        if envelope.get(key):
            metadata[key] = envelope[key]
    message: dict[str, Any] = {
        "messageId": uuid.uuid4().hex,
        "role": "ROLE_USER",
        "parts": [part],
        "metadata": metadata,
    }
    if envelope.get("conversationId"):
        message["contextId"] = envelope["conversationId"]
    request = {
        "jsonrpc": "2.0",
        "id": envelope.get("traceId") or message["messageId"],
        "method": "SendStreamingMessage" if streaming else "SendMessage",
        # Blocking: the answer is the finished task, within the attempt's own limits.
        "params": {"message": message, "configuration": {"returnImmediately": False}, "metadata": metadata},
    }
    return jsoncodec.dumps(request)


def headers(reach_headers: dict[str, str]) -> dict[str, str]:
    """The HTTP headers of the A2A call: JSON, the A2A version, and the Router's trace headers."""
    sent = {"Content-Type": "application/json", "A2A-Version": A2A_VERSION}
    for name in _FORWARDED:
        if name in reach_headers:
            sent[name] = reach_headers[name]
    return sent


def classify(status: int, raw: bytes) -> Any:
    """The ``result`` of an A2A agent's answer, or the AttemptError it amounts to."""
    try:
        answer = jsoncodec.loads(raw) if raw else None
    except jsoncodec.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict) or ("result" not in answer and "error" not in answer):
        if status >= 500 or 200 <= status < 300:
            raise BadAgentResponse(f"A2A agent answered HTTP {status} without a JSON-RPC response")
        raise AgentRejected(
            {"code": "A2A_HTTP_ERROR", "message": f"A2A agent answered HTTP {status}"}, retryable=False
        )
    if "error" in answer:
        raise _rpc_error(answer["error"])
    result = answer["result"]
    if not isinstance(result, dict):
        raise BadAgentResponse("A2A agent answered a result that is not an object")
    if isinstance(result.get("message"), dict):
        return result_of(result["message"].get("parts"))
    task = result.get("task")
    if not isinstance(task, dict):
        raise BadAgentResponse("A2A agent answered neither a task nor a message")
    return _task_result(task)


def _rpc_error(error: Any) -> Exception:
    if not isinstance(error, dict):
        return BadAgentResponse("A2A agent answered a malformed JSON-RPC error")
    code = error.get("code")
    message = str(error.get("message") or "A2A error")[:500]
    if code == _INTERNAL_ERROR:
        return BadAgentResponse(f"A2A agent reported an internal error: {message}")
    name = _JSONRPC_CODES.get(code, "A2A_ERROR") if isinstance(code, int) else "A2A_ERROR"
    return AgentRejected({"code": name, "message": message, "details": [{"a2aCode": code}]}, retryable=False)


def _task_result(task: dict[str, Any]) -> Any:
    found = task.get("status")
    status: dict[str, Any] = found if isinstance(found, dict) else {}
    state = str(status.get("state") or "TASK_STATE_UNSPECIFIED")
    if state == "TASK_STATE_COMPLETED":
        parts: list[Any] = []
        for artifact in task.get("artifacts") or []:
            if isinstance(artifact, dict):
                parts.extend(artifact.get("parts") or [])
        if not parts and isinstance(status.get("message"), dict):
            parts = list(status["message"].get("parts") or [])
        return result_of(parts)
    code, retryable = _UNFINISHED.get(state, ("A2A_TASK_NOT_FINISHED", False))
    error = _status_error(status.get("message"), code, state)
    error.setdefault("details", [{"a2aState": state, "taskId": task.get("id")}])
    if state == "TASK_STATE_REJECTED":
        raise AgentDeclined(error)
    raise AgentRejected(error, retryable=retryable)


def _status_error(message: Any, code: str, state: str) -> dict[str, Any]:
    """The error a status message carries: a DataPart ``{"error": {...}}`` if any, else its text."""
    parts = message.get("parts") if isinstance(message, dict) else None
    texts: list[str] = []
    for part in parts or []:
        if not isinstance(part, dict):
            continue
        data = part.get("data")
        if isinstance(data, dict) and isinstance(data.get("error"), dict):
            inner = data["error"]
            return {
                "code": str(inner.get("code") or code),
                "message": str(inner.get("message") or state),
                **({"details": inner["details"]} if isinstance(inner.get("details"), list) else {}),
            }
        if isinstance(part.get("text"), str):
            texts.append(part["text"])
    return {"code": code, "message": ("\n".join(texts) or f"the A2A task ended in {state}")[:500]}


def result_of(parts: Any) -> Any:
    """A Reach ``result`` from A2A parts: one DataPart's data, else the text (and any data)."""
    data: list[Any] = []
    texts: list[str] = []
    for part in parts if isinstance(parts, list) else []:
        if not isinstance(part, dict):
            continue
        if "data" in part:
            data.append(whole_numbers(part["data"]))
        elif isinstance(part.get("text"), str):
            texts.append(part["text"])
    if len(data) == 1 and not texts:
        return data[0]
    result: dict[str, Any] = {"text": "\n".join(texts)}
    if data:
        result["data"] = data
    return result


def whole_numbers(value: Any) -> Any:
    """``value`` with integral floats made ints again.

    A2A carries JSON values as protobuf ``Value``, whose only number is a double: ``3`` arrives
    as ``3.0``. Turned back, a payload survives the round trip and an ``integer`` schema holds.
    """
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: whole_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [whole_numbers(v) for v in value]
    return value


class StreamReading:
    """An A2A ``SendStreamingMessage`` answer as the pieces of a Reach stream (protocol §14).

    Each server-sent event's data is one JSON-RPC response whose ``result`` is a StreamResponse:
    an ``artifactUpdate`` is one chunk (its parts as :func:`chunk_value` makes them); a task or
    status update in a terminal state ends the stream (``completed`` is the ``done``, the other
    states the errors :func:`classify` maps them to); a ``message`` is the whole answer. A task
    still working says nothing to the caller.
    """

    def __init__(self) -> None:
        self.chunks = 0

    def piece(self, event: SseEvent) -> Piece | None:
        try:
            answer = jsoncodec.loads(event.data.encode())
        except jsoncodec.JSONDecodeError as exc:
            raise BadAgentResponse(f"an A2A stream event is not JSON ({exc.msg})") from exc
        if isinstance(answer, dict) and "error" in answer:
            raise _rpc_error(answer["error"])
        result = answer.get("result") if isinstance(answer, dict) else None
        if not isinstance(result, dict):
            raise BadAgentResponse("an A2A stream event carries no StreamResponse")
        update = result.get("artifactUpdate")
        if isinstance(update, dict):
            artifact = update.get("artifact")
            parts = artifact.get("parts") if isinstance(artifact, dict) else None
            self.chunks += 1
            return Chunk(jsoncodec.dumps(chunk_value(parts)))
        if isinstance(result.get("message"), dict):
            return Final(result_of(result["message"].get("parts")), True)
        found = result.get("task") or result.get("statusUpdate")
        if not isinstance(found, dict):
            return None  # a kind this version does not know: ignored, as SSE ignores unknown events
        return self._ending(found)

    def _ending(self, task: dict[str, Any]) -> Piece | None:
        status = task.get("status")
        state = status.get("state") if isinstance(status, dict) else None
        if state not in _TERMINAL:
            return None
        if state != "TASK_STATE_COMPLETED" or not self.chunks:
            # The whole task (its artifacts, or its status message) when nothing streamed;
            # the other terminal states raise the errors a blocking call gets.
            return Final(_task_result(task), True)
        return Final(None, False)


def chunk_value(parts: Any) -> Any:
    """One artifact update's parts as a chunk: a lone text part its text, a lone data part its
    data, more parts as :func:`result_of` joins them."""
    if isinstance(parts, list) and len(parts) == 1 and isinstance(parts[0], dict):
        part = parts[0]
        if "data" in part:
            return whole_numbers(part["data"])
        if isinstance(part.get("text"), str):
            return part["text"]
    return result_of(parts)
