"""The one way out: every ReachResponse the Router sends is encoded here, from its record.

A request ends in exactly one of two ways, a result or a :class:`~reachmesh.exceptions.ReachError`
(whose ``status`` and ``to_error()`` are the response's). :func:`conclude` writes that ending into
the decision record and :func:`encode` turns the record into the response body; nothing else in
the Router builds a ReachResponse.
"""

from __future__ import annotations

from typing import Any

from reachmesh import jsoncodec
from reachmesh.clock import Clock
from reachmesh.decision import DecisionRecord
from reachmesh.dispatch.results import Reply
from reachmesh.exceptions import ReachError
from reachmesh.protocol import HTTP_STATUS, PROTOCOL_VERSION, Status
from reachmesh.tracecontext import new_trace_id

_SUCCESS_HTTP = HTTP_STATUS[Status.SUCCESS]


def conclude(
    record: DecisionRecord, clock: Clock, *, result: Any = None, error: ReachError | None = None
) -> None:
    """Write the request's ending (a result, or the error that ended it) into ``record``."""
    record.duration_ms = round((clock.monotonic() - record.started) * 1000, 2)
    if error is None:
        record.status, record.http_status, record.result = Status.SUCCESS, _SUCCESS_HTTP, result
        return
    record.status = error.status
    record.http_status = error.http_status
    record.error = error.to_error()
    record.error_code = record.error.get("code")


def accept(record: DecisionRecord) -> None:
    """Mark ``record`` as an async request accepted for later."""
    record.status, record.http_status = Status.ACCEPTED, HTTP_STATUS[Status.ACCEPTED]


def encode(record: DecisionRecord) -> Reply:
    """The HTTP status and ReachResponse body of a concluded record."""
    status = record.status or Status.INTERNAL_ERROR
    # AttemptRecord.to_wire() of each, without a call per attempt or a comprehension's frame.
    attempts = []
    for a in record.attempts:
        attempts.append({"agentId": a.agent_id, "outcome": a.outcome, "durationMs": a.duration_ms})
    task, by = record.matched_task, record.route_by
    if task is None or by is None:
        routed = None
    elif by == "meaning":
        routed = route(record)
    else:
        routed = {"task": task, "by": by}  # route(), without the call: no score to look up
    body = jsoncodec.dumps(
        {
            "version": PROTOCOL_VERSION,
            "traceId": record.trace_id,
            "status": status,  # a StrEnum: orjson writes its value, without the enum's Python getter
            "handlerAgentId": record.handler,
            "durationMs": record.duration_ms,
            "result": record.result,
            "error": record.error,
            "attempts": attempts,
            "route": routed,
        }
    )
    return record.http_status or HTTP_STATUS[status], body


def route(record: DecisionRecord) -> dict[str, Any] | None:
    """The answer's ``route``: the declared task that ran (or was to run) and how it was chosen;
    a route by meaning carries that task's score (a runner-up's, after a decline)."""
    if record.matched_task is None or record.route_by is None:
        return None
    out: dict[str, Any] = {"task": record.matched_task, "by": record.route_by}
    if record.route_by == "meaning" and record.semantic is not None:
        for item in record.semantic.get("best", ()):
            if item["task"] == record.matched_task:
                out["score"] = item["score"]
                break
    return out


def bare_record(
    clock: Clock, trace_id: str | None, task: str = "-", started: float | None = None
) -> DecisionRecord:
    """A record for a request that never reached routing (refused at the door)."""
    return DecisionRecord(
        trace_id=trace_id or new_trace_id(),
        task=task,
        source="-",
        started=clock.monotonic() if started is None else started,
        started_wall=clock.time(),
    )


def standalone(clock: Clock, trace_id: str | None, *, error: ReachError | None = None) -> Reply:
    """A whole ReachResponse outside the pipeline: an internal error, a guard's refusal, or
    (with no error) an async request still pending."""
    record = bare_record(clock, trace_id)
    if error is None:
        accept(record)
    else:
        conclude(record, clock, error=error)
        record.duration_ms = 0  # no request ran: the answer reports none
    return encode(record)
