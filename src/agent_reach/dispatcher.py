"""The dispatcher: one ReachRequest in, exactly one ReachResponse out.

It decodes the envelope, asks the routing pipeline for ranked candidates, checks the payload
against the chosen capability's ``input_schema``, then runs the attempts under the deadline:
a network error may be retried on the same agent, a retryable failure fails over to the next
candidate, and the number of retries is capped by policy. Every step is written to the request's
:class:`DecisionRecord`, which the observers read once the response is built.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
from collections.abc import Iterable
from typing import Any

import orjson
from pydantic import ValidationError

from agent_reach.clock import SYSTEM_CLOCK, Clock
from agent_reach.config import RouterConfig
from agent_reach.exceptions import AgentRejected, AttemptError, NoAvailableHandler, RequestError
from agent_reach.observability.record import AttemptRecord, DecisionRecord, Observer
from agent_reach.observability.tracecontext import make_traceparent, new_trace_id
from agent_reach.protocol import (
    HTTP_STATUS,
    PROTOCOL_VERSION,
    TRACE_ID_PATTERN,
    CandidateReason,
    ReachRequest,
    Status,
    error_details,
)
from agent_reach.resilience.timeouts import Deadline, Timeout
from agent_reach.routing.base import Choice
from agent_reach.routing.pipeline import Pipeline
from agent_reach.stats import StatsBook
from agent_reach.transport import Transport

log = logging.getLogger("agent_reach.dispatcher")

_TRACE_ID = re.compile(TRACE_ID_PATTERN)

Reply = tuple[int, bytes]


class Dispatcher:
    """Runs the request pipeline. Holds no per-request state between calls."""

    def __init__(
        self,
        pipeline: Pipeline,
        transport: Transport,
        config: RouterConfig,
        *,
        stats: StatsBook | None = None,
        observers: Iterable[Observer] = (),
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.pipeline = pipeline
        self.transport = transport
        self.config = config
        self.stats = stats or StatsBook()
        self.observers = list(observers)
        self.clock = clock

    # -- entry points ------------------------------------------------------------------------

    async def handle(
        self, body: bytes, *, trace_header: str | None = None, traceparent_id: str | None = None
    ) -> Reply:
        """Decode ``body`` as a ReachRequest and serve it; never raises for bad input."""
        started = self.clock.monotonic()
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            return self.refuse(
                RequestError(f"body is not valid JSON: {exc.msg}"),
                started=started,
                trace_id=_safe_trace_id(trace_header) or traceparent_id,
            )
        if not isinstance(data, dict):
            return self.refuse(
                RequestError("body must be a JSON object (a ReachRequest)"),
                started=started,
                trace_id=_safe_trace_id(trace_header) or traceparent_id,
            )
        try:
            request = ReachRequest.model_validate(data)
        except ValidationError as exc:
            details = error_details(exc)
            fields = ", ".join(d["field"] for d in details)
            return self.refuse(
                RequestError(f"invalid ReachRequest: {fields}", details=details),
                started=started,
                trace_id=_safe_trace_id(data.get("traceId"))
                or _safe_trace_id(trace_header)
                or traceparent_id,
                task=data.get("targetTask"),
            )
        trace_id = request.trace_id or _safe_trace_id(trace_header) or traceparent_id or new_trace_id()
        data["traceId"] = trace_id
        return await self.dispatch(request, data, trace_id, started)

    def refuse(
        self,
        error: RequestError,
        *,
        started: float | None = None,
        trace_id: str | None = None,
        task: Any = None,
    ) -> Reply:
        """Answer INVALID_REQUEST (or 413/415) for an envelope that never reached routing."""
        started = self.clock.monotonic() if started is None else started
        record = DecisionRecord(
            trace_id=trace_id or new_trace_id(),
            task=task if isinstance(task, str) and _printable(task) else "-",
            source="-",
            started=started,
        )
        record.note("invalid request", error.message)
        return self._finish(
            record, Status.INVALID_REQUEST, error=error.to_error(), http_status=error.http_status
        )

    async def dispatch(
        self, request: ReachRequest, data: dict[str, Any], trace_id: str, started: float
    ) -> Reply:
        """Route and forward a validated request. ``data`` is its decoded body, forwarded as is."""
        record = DecisionRecord(
            trace_id=trace_id,
            task=request.target_task,
            source=request.source_agent or "-",
            started=started,
            conversation_id=request.conversation_id,
        )
        try:
            choices = self.pipeline.decide(request, record)
        except NoAvailableHandler as exc:
            record.note("no handler", exc.message)
            return self._finish(record, Status.NO_AVAILABLE_HANDLER, error=exc.to_error())

        first = choices[0]
        if first.validator is not None:
            faults = first.validator.errors(request.payload)
            if faults:
                error = RequestError(
                    f"payload does not match the input_schema of {request.target_task!r} "
                    f"({', '.join(f['field'] for f in faults)})",
                    details=faults,
                )
                record.note("invalid request", error.message)
                return self._finish(record, Status.INVALID_REQUEST, error=error.to_error())
        record.selected = first.entry.id
        record.score = first.score
        return await self._attempts(request, data, choices, record)

    # -- attempts ----------------------------------------------------------------------------

    def _timeout(self, request: ReachRequest) -> Timeout:
        policy = self.config.timeouts
        override = policy.per_task.get(request.target_task)
        prefs = request.preferences
        connect = prefs.connect_timeout_ms or (override and override.connect_ms) or policy.connect_ms
        read = prefs.read_timeout_ms or (override and override.read_ms) or policy.read_ms
        overall = (
            prefs.timeout_ms
            or (override and override.overall_ms)
            or policy.overall_ms
            or connect + read + self.config.retries.allowance_ms
        )
        return Timeout(connect_ms=connect, read_ms=read, overall_ms=overall)

    async def _attempts(
        self, request: ReachRequest, data: dict[str, Any], choices: list[Choice], record: DecisionRecord
    ) -> Reply:
        retry_policy = self.config.retries
        asked = request.preferences.retry_count
        retries = retry_policy.max_per_request if asked is None else min(asked, retry_policy.max_per_request)
        attempts_left = 1 + retries
        timeout = self._timeout(request)
        deadline = Deadline(self.clock, timeout.overall_ms)
        payload = request.payload
        clock = self.clock
        previous: tuple[str, str] | None = None  # (agent, reason) of the last failed agent

        for index, choice in enumerate(choices):
            entry = choice.entry
            agent_id = entry.id
            if attempts_left <= 0:
                record.reject(agent_id, CandidateReason.BUDGET_EXHAUSTED, choice.score)
                continue
            if index > 0 and choice.validator is not None and choice.validator.errors(payload):
                record.reject(agent_id, CandidateReason.INVALID_PAYLOAD, choice.score)
                continue
            if previous is not None:
                record.note("failover", f"{previous[0]} -> {agent_id} ({previous[1]})")
            data["targetAgent"] = agent_id
            body = orjson.dumps(data)
            same_agent_left = retry_policy.same_agent
            while True:
                remaining = deadline.remaining_ms()
                if remaining <= 0:
                    return self._timed_out(record, timeout)
                attempts_left -= 1
                connect_s, read_s = timeout.attempt_limits(remaining)
                headers = {
                    "Content-Type": "application/json",
                    "X-Reach-Trace-Id": record.trace_id,
                    "traceparent": make_traceparent(record.trace_id),
                    "X-Reach-Deadline-Ms": str(int(remaining)),
                }
                t0 = clock.monotonic()
                self.stats.started(agent_id)
                try:
                    result = await self.transport.send(
                        entry.endpoint, body, headers, connect_s=connect_s, read_s=read_s
                    )
                except AttemptError as exc:
                    took = round((clock.monotonic() - t0) * 1000, 2)
                    # An agent that refuses on purpose is healthy; it only failed this request.
                    self.stats.finished(agent_id, ok=isinstance(exc, AgentRejected), latency_ms=took)
                    record.attempts.append(AttemptRecord(agent_id, exc.reason, took))
                    record.note("forward", f"{agent_id}, duration={took:.0f}ms, outcome={exc.reason}")
                    if isinstance(exc, AgentRejected) and not exc.retryable:
                        record.handler = agent_id
                        return self._finish(record, Status.AGENT_ERROR, error=exc.to_error())
                    if deadline.expired:
                        return self._timed_out(record, timeout)
                    if (
                        exc.reason == CandidateReason.CONNECT_ERROR
                        and same_agent_left > 0
                        and attempts_left > 0
                    ):
                        same_agent_left -= 1
                        record.note(
                            "retry", f"{agent_id}, attempt={len(record.attempts) + 1}, reason={exc.reason}"
                        )
                        await self._backoff(deadline)
                        continue
                    record.reject(agent_id, exc.reason, choice.score)
                    previous = (agent_id, exc.reason)
                    break
                took = round((clock.monotonic() - t0) * 1000, 2)
                self.stats.finished(agent_id, ok=True, latency_ms=took)
                record.attempts.append(AttemptRecord(agent_id, "SUCCESS", took))
                record.note("forward", f"{agent_id}, duration={took:.0f}ms")
                record.handler = agent_id
                return self._finish(record, Status.SUCCESS, result=result)

        message = f"every candidate for {request.target_task!r} failed or was skipped"
        record.note("no handler", message)
        error = NoAvailableHandler(message, list(record.rejected)).to_error()
        return self._finish(record, Status.NO_AVAILABLE_HANDLER, error=error)

    async def _backoff(self, deadline: Deadline) -> None:
        base = self.config.retries.backoff_ms
        if base <= 0:
            return
        wait_ms = min(base * random.uniform(0.5, 1.5), max(deadline.remaining_ms(), 0.0))
        await asyncio.sleep(wait_ms / 1000.0)

    def _timed_out(self, record: DecisionRecord, timeout: Timeout) -> Reply:
        message = f"the overall budget of {timeout.overall_ms} ms ran out"
        record.note("timeout", message)
        return self._finish(record, Status.TIMEOUT, error={"code": "TIMEOUT", "message": message})

    # -- outcome -----------------------------------------------------------------------------

    def _finish(
        self,
        record: DecisionRecord,
        status: Status,
        *,
        result: Any = None,
        error: dict[str, Any] | None = None,
        http_status: int | None = None,
    ) -> Reply:
        record.duration_ms = round((self.clock.monotonic() - record.started) * 1000, 2)
        record.status = status
        record.http_status = http_status or HTTP_STATUS[status]
        record.error_code = error.get("code") if error else None
        body = orjson.dumps(
            {
                "version": PROTOCOL_VERSION,
                "traceId": record.trace_id,
                "status": status.value,
                "handlerAgentId": record.handler,
                "durationMs": record.duration_ms,
                "result": result,
                "error": error,
                "attempts": [a.to_wire() for a in record.attempts],
            }
        )
        for observer in self.observers:
            try:
                observer(record)
            except Exception:  # an observer's bug must never cost the caller the answer
                log.exception("observer %r failed", observer)
        return record.http_status, body


def _safe_trace_id(value: Any) -> str | None:
    return value if isinstance(value, str) and _TRACE_ID.match(value) else None


def _printable(text: str) -> bool:
    return len(text) <= 256 and text.isprintable()
