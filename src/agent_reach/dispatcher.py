"""The dispatcher: one ReachRequest in, exactly one ReachResponse out.

It decodes the envelope, asks the routing pipeline for ranked candidates, checks the payload
against the chosen capability's ``input_schema``, then runs the attempts under the deadline:

- a network error may be retried once on the same agent (jittered backoff);
- a retryable failure fails over to the next candidate;
- each extra attempt needs the per-request cap *and* the Router-wide retry budget;
- each attempt asks the agent's circuit breaker first and reports its outcome after;
- a ``contextBound`` request whose bound agent is gone goes only to agents that confirm they hold
  the conversation, else ``CONTEXT_UNAVAILABLE``.

Every step is written to the request's :class:`DecisionRecord`; observers read it once the
response is built. ``mode: async`` answers ``ACCEPTED`` at once and runs the same path in a task.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
from collections.abc import Iterable
from typing import Any

import aiohttp
import orjson
from pydantic import ValidationError

from agent_reach.clock import SYSTEM_CLOCK, Clock
from agent_reach.config import RouterConfig
from agent_reach.exceptions import (
    AgentRejected,
    AttemptError,
    ConnectFailed,
    EmbeddingError,
    NoAvailableHandler,
    RequestError,
)
from agent_reach.observability.record import AttemptRecord, DecisionRecord, Observer
from agent_reach.observability.tracecontext import new_span_id, new_trace_id, w3c_trace_id
from agent_reach.protocol import (
    HTTP_STATUS,
    PROTOCOL_VERSION,
    TRACE_ID_PATTERN,
    CandidateReason,
    ReachRequest,
    Status,
    error_details,
)
from agent_reach.registry.base import AgentEntry
from agent_reach.resilience.breaker import BreakerBoard, BreakerState, Permit
from agent_reach.resilience.retry import RetryBudget
from agent_reach.resilience.timeouts import Deadline, Timeout
from agent_reach.results import ResultStore
from agent_reach.routing.base import Choice
from agent_reach.routing.pipeline import Pipeline
from agent_reach.stats import StatsBook
from agent_reach.transport import Transport

log = logging.getLogger("agent_reach.dispatcher")
async_log = logging.getLogger("agent_reach.async")

_TRACE_ID = re.compile(TRACE_ID_PATTERN)
# Failures that say the agent itself is in trouble: they count for breakers and success rate.
_AGENT_TROUBLE = frozenset({CandidateReason.CONNECT_ERROR, CandidateReason.TIMEOUT})

Reply = tuple[int, bytes]

# A private generator for backoff jitter: it needs no cryptographic strength and must not
# share (or disturb) the process-wide `random` state that user code may seed.
_jitter = random.Random()

# No attempt starts with less time than this left: the event loop may fire a timer up to its
# clock resolution early, and an attempt that cannot finish only delays the TIMEOUT answer.
MIN_ATTEMPT_MS = 2.0


class Dispatcher:
    """Runs the request pipeline. Holds no per-request state between calls."""

    def __init__(
        self,
        pipeline: Pipeline,
        transport: Transport,
        config: RouterConfig,
        *,
        stats: StatsBook | None = None,
        budget: RetryBudget | None = None,
        results: ResultStore | None = None,
        observers: Iterable[Observer] = (),
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.pipeline = pipeline
        self.transport = transport
        self.config = config
        self.stats = StatsBook() if stats is None else stats
        self.budget = RetryBudget(config.retry_budget, clock=clock) if budget is None else budget
        self.results = ResultStore(config.async_mode, clock=clock) if results is None else results
        self.observers = list(observers)
        self.clock = clock
        self._background: set[asyncio.Task[Any]] = set()

    @property
    def breakers(self) -> BreakerBoard:
        return self.pipeline.breakers

    # -- entry points ------------------------------------------------------------------------

    async def handle(
        self, body: bytes, *, trace_header: str | None = None, parent: tuple[str, str] | None = None
    ) -> Reply:
        """Decode ``body`` as a ReachRequest and serve it; never raises for bad input.

        ``parent`` is the (trace id, span id) of the caller's W3C ``traceparent``, if any.
        """
        started = self.clock.monotonic()
        parent_trace = parent[0] if parent else None
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            return self.refuse(
                RequestError(f"body is not valid JSON: {exc.msg}"),
                started=started,
                trace_id=_safe_trace_id(trace_header) or parent_trace,
            )
        if not isinstance(data, dict):
            return self.refuse(
                RequestError("body must be a JSON object (a ReachRequest)"),
                started=started,
                trace_id=_safe_trace_id(trace_header) or parent_trace,
            )
        try:
            request = ReachRequest.model_validate(data)
        except ValidationError as exc:
            details = error_details(exc)
            fields = ", ".join(d["field"] for d in details)
            return self.refuse(
                RequestError(f"invalid ReachRequest: {fields}", details=details),
                started=started,
                trace_id=_safe_trace_id(data.get("traceId")) or _safe_trace_id(trace_header) or parent_trace,
                task=data.get("targetTask"),
            )
        trace_id = request.trace_id or _safe_trace_id(trace_header) or parent_trace or new_trace_id()
        data["traceId"] = trace_id
        record = DecisionRecord(
            trace_id=trace_id,
            task=request.target_task,
            source=request.source_agent or "-",
            started=started,
            started_wall=self.clock.time(),
            conversation_id=request.conversation_id,
            parent_span_id=parent[1] if parent else None,
            mode=request.preferences.mode,
        )
        if self.config.logging.log_payloads:
            record.payload = request.payload
        if request.preferences.mode == "async":
            return self._accept(request, data, record)
        return await self.dispatch(request, data, record)

    def refuse(
        self,
        error: RequestError,
        *,
        started: float | None = None,
        trace_id: str | None = None,
        task: Any = None,
    ) -> Reply:
        """Answer INVALID_REQUEST (or 413/415) for an envelope that never reached routing."""
        record = self._bare_record(trace_id, task, started)
        record.note("invalid request", error.message)
        return self._finish(
            record, Status.INVALID_REQUEST, error=error.to_error(), http_status=error.http_status
        )

    def shed(self, reason: str, *, trace_id: str | None = None) -> Reply:
        """Answer OVERLOADED at once: the Router is shedding load."""
        record = self._bare_record(trace_id, None, None)
        record.note("overloaded", reason)
        error = {
            "code": "OVERLOADED",
            "message": f"the Router is shedding load: {reason}",
            "retryAfterSeconds": self.config.limits.retry_after_seconds,
        }
        return self._finish(record, Status.OVERLOADED, error=error)

    def _bare_record(self, trace_id: str | None, task: Any, started: float | None) -> DecisionRecord:
        return DecisionRecord(
            trace_id=trace_id or new_trace_id(),
            task=task if isinstance(task, str) and _printable(task) else "-",
            source="-",
            started=self.clock.monotonic() if started is None else started,
            started_wall=self.clock.time(),
        )

    # -- async mode --------------------------------------------------------------------------

    def _accept(self, request: ReachRequest, data: dict[str, Any], record: DecisionRecord) -> Reply:
        trace_id = record.trace_id
        if self.results.known(trace_id):
            error = RequestError(f"traceId {trace_id!r} is already in use by an async request")
            error.code = "TRACE_ID_IN_USE"
            return self.refuse(error, trace_id=trace_id, task=request.target_task)
        if self.results.pending >= self.config.limits.max_inflight:
            return self.shed(f"{self.results.pending} async requests pending", trace_id=trace_id)
        self.results.start(trace_id)
        task = asyncio.create_task(self._run_async(request, data, record))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        body = orjson.dumps(
            {
                "version": PROTOCOL_VERSION,
                "traceId": trace_id,
                "status": Status.ACCEPTED.value,
                "handlerAgentId": None,
                "durationMs": 0,
                "result": None,
                "error": None,
                "attempts": [],
            }
        )
        return HTTP_STATUS[Status.ACCEPTED], body

    async def _run_async(self, request: ReachRequest, data: dict[str, Any], record: DecisionRecord) -> None:
        try:
            reply = await self.dispatch(request, data, record)
        except Exception:
            log.exception("[%s] async request failed inside the Router", record.trace_id)
            reply = 500, internal_error_body(record.trace_id)
        self.results.finish(record.trace_id, reply)
        reply_to = request.preferences.reply_to
        if reply_to:
            await self._deliver(record.trace_id, reply_to, reply[1])

    async def _deliver(self, trace_id: str, url: str, body: bytes) -> None:
        """POST the ReachResponse to ``replyTo``, retrying a bounded number of times."""
        policy = self.config.async_mode
        last = ""
        for attempt in range(1, policy.reply_attempts + 1):
            try:
                async with self.transport.session.post(
                    url,
                    data=body,
                    headers={"Content-Type": "application/json", "X-Reach-Trace-Id": trace_id},
                    timeout=aiohttp.ClientTimeout(total=policy.reply_timeout_ms / 1000),
                    allow_redirects=False,
                ) as resp:
                    if resp.status < 300:
                        async_log.info("[%s] reply delivered to %s", trace_id, url)
                        return
                    last = f"HTTP {resp.status}"
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
                last = type(exc).__name__
            if attempt < policy.reply_attempts:
                await asyncio.sleep(policy.reply_backoff_ms * attempt / 1000)
        async_log.error(
            "[%s] reply to %s failed after %d attempts (%s); the result stays at GET /reach/%s",
            trace_id,
            url,
            policy.reply_attempts,
            last,
            trace_id,
        )

    async def close(self) -> None:
        """Cancel background work (async requests still running)."""
        for task in list(self._background):
            task.cancel()
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    # -- routing and attempts ----------------------------------------------------------------

    async def dispatch(self, request: ReachRequest, data: dict[str, Any], record: DecisionRecord) -> Reply:
        """Route and forward a validated request. ``data`` is its decoded body, forwarded as is."""
        self.budget.on_request()
        vectors = self.pipeline.vectors
        if (
            vectors is not None
            and self.pipeline.wants_semantic(request)
            and vectors.cached(request.target_task) is None
        ):
            # The one place a model may be called: a semantic request whose text is not cached yet.
            try:
                await vectors.query_vector(request.target_task)
            except EmbeddingError as exc:
                message = f"semantic routing is unavailable: {exc.message}; exact task names still work"
                record.note("no handler", message)
                unavailable = {"code": "EMBEDDING_UNAVAILABLE", "message": message, "candidates": []}
                return self._finish(record, Status.NO_AVAILABLE_HANDLER, error=unavailable)
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

    def _timeout(self, request: ReachRequest, task: str) -> Timeout:
        policy = self.config.timeouts
        override = self.config.tasks.get(task)
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

    def _max_retries(self, request: ReachRequest, task: str) -> int:
        override = self.config.tasks.get(task)
        cap = self.config.retries.max_per_request
        if override is not None and override.max_retries is not None:
            cap = override.max_retries
        asked = request.preferences.retry_count
        return cap if asked is None else min(asked, cap)

    async def _attempts(
        self, request: ReachRequest, data: dict[str, Any], choices: list[Choice], record: DecisionRecord
    ) -> Reply:
        retry_policy = self.config.retries
        payload = request.payload
        task = request.target_task
        if record.matched_task is not None and record.matched_task != task:
            # Routed by the mapping table or by meaning: the agent gets the task it declared, and
            # the caller's own words beside it.
            data["targetTask"] = record.matched_task
            data["requestedTask"] = task
            task = record.matched_task
        # Per-task policy follows the declared task, however the caller phrased it.
        attempts_left = 1 + self._max_retries(request, task)
        timeout = self._timeout(request, task)
        deadline = Deadline(self.clock, timeout.overall_ms)
        clock = self.clock
        breakers = self.breakers
        w3c_trace = w3c_trace_id(record.trace_id)
        # contextBound: once the bound agent is out of the picture, only confirmed holders qualify.
        bound = record.affinity if request.preferences.context_bound and request.conversation_id else None
        previous: tuple[str, str] | None = None  # (agent, reason) of the last failed agent
        budget_spent = False

        for index, choice in enumerate(choices):
            entry = choice.entry
            agent_id = entry.id
            if attempts_left <= 0 or budget_spent:
                record.reject(agent_id, CandidateReason.BUDGET_EXHAUSTED, choice.score)
                continue
            if index > 0 and choice.validator is not None and choice.validator.errors(payload):
                record.reject(agent_id, CandidateReason.INVALID_PAYLOAD, choice.score)
                continue
            if bound is not None and agent_id != bound:
                assert request.conversation_id is not None
                if not await self._holds(entry, request.conversation_id, deadline):
                    record.reject(agent_id, CandidateReason.NO_CONTEXT, choice.score)
                    continue
            permit, change = breakers.acquire(agent_id, task)
            if permit is Permit.DENY:
                record.reject(agent_id, CandidateReason.CIRCUIT_OPEN, choice.score)
                continue
            if change is BreakerState.HALF_OPEN:
                record.note("circuit half_open", f"agent {agent_id} (probe request)")
            if previous is not None:
                if not self.budget.try_spend():
                    record.note("retry budget", f"exhausted; no failover from {previous[0]} ({previous[1]})")
                    budget_spent = True
                    record.reject(agent_id, CandidateReason.BUDGET_EXHAUSTED, choice.score)
                    continue
                record.failovers.append(previous[1])
                record.note("failover", f"{previous[0]} -> {agent_id} ({previous[1]})")
            data["targetAgent"] = agent_id
            body = orjson.dumps(data)
            same_agent_left = retry_policy.same_agent
            while True:
                remaining = deadline.remaining_ms()
                if remaining <= MIN_ATTEMPT_MS:
                    return self._timed_out(record, timeout)
                attempts_left -= 1
                connect_s, read_s, total_s = timeout.attempt_limits(remaining)
                span_id = new_span_id()
                headers = {
                    "Content-Type": "application/json",
                    "X-Reach-Trace-Id": record.trace_id,
                    "traceparent": f"00-{w3c_trace}-{span_id}-01",
                    "X-Reach-Deadline-Ms": str(int(remaining)),
                }
                t0 = clock.monotonic()
                self.stats.started(agent_id)
                try:
                    result = await self.transport.send(
                        entry.endpoint, body, headers, connect_s=connect_s, read_s=read_s, total_s=total_s
                    )
                except AttemptError as exc:
                    took = round((clock.monotonic() - t0) * 1000, 2)
                    # An agent that refuses on purpose is healthy; it only failed this request.
                    healthy = isinstance(exc, AgentRejected)
                    refused = isinstance(exc, ConnectFailed) and exc.refused
                    self.stats.finished(agent_id, ok=healthy, latency_ms=took)
                    record.attempts.append(
                        AttemptRecord(
                            agent_id,
                            exc.reason,
                            took,
                            span_id,
                            round((t0 - record.started) * 1000, 2),
                            choice.score,
                        )
                    )
                    record.note("forward", f"{agent_id}, duration={took:.0f}ms, outcome={exc.reason}")
                    self._breaker_outcome(record, agent_id, task, ok=healthy, refused=refused)
                    if isinstance(exc, AgentRejected) and not exc.retryable:
                        record.handler = agent_id
                        return self._finish(record, Status.AGENT_ERROR, error=exc.to_error())
                    if deadline.remaining_ms() <= MIN_ATTEMPT_MS:
                        return self._timed_out(record, timeout)
                    if (
                        exc.reason == CandidateReason.CONNECT_ERROR
                        and same_agent_left > 0
                        and attempts_left > 0
                    ):
                        if self.budget.try_spend():
                            same_agent_left -= 1
                            record.retries.append(exc.reason)
                            record.note(
                                "retry",
                                f"{agent_id}, attempt={len(record.attempts) + 1}, reason={exc.reason}",
                            )
                            await self._backoff(deadline)
                            continue
                        record.note("retry budget", f"exhausted; no retry of {agent_id} ({exc.reason})")
                        budget_spent = True
                    record.reject(agent_id, exc.reason, choice.score)
                    previous = (agent_id, exc.reason)
                    break
                took = round((clock.monotonic() - t0) * 1000, 2)
                self.stats.finished(agent_id, ok=True, latency_ms=took)
                record.attempts.append(
                    AttemptRecord(
                        agent_id,
                        "SUCCESS",
                        took,
                        span_id,
                        round((t0 - record.started) * 1000, 2),
                        choice.score,
                    )
                )
                record.note("forward", f"{agent_id}, duration={took:.0f}ms")
                self._breaker_outcome(record, agent_id, task, ok=True)
                record.handler = agent_id
                if request.conversation_id:
                    self.pipeline.affinity.bind(request.conversation_id, agent_id)
                return self._finish(record, Status.SUCCESS, result=result)

        if bound is not None and any(c.get("reason") == CandidateReason.NO_CONTEXT for c in record.rejected):
            message = (
                f"conversation {request.conversation_id!r} is bound to {bound!r}, which cannot take "
                "it, and no other agent confirms it holds the conversation"
            )
            record.note("context unavailable", message)
            error = {"code": "CONTEXT_UNAVAILABLE", "message": message, "candidates": list(record.rejected)}
            return self._finish(record, Status.CONTEXT_UNAVAILABLE, error=error)
        message = f"every candidate for {task!r} failed or was skipped"
        record.note("no handler", message)
        error = NoAvailableHandler(message, list(record.rejected)).to_error()
        return self._finish(record, Status.NO_AVAILABLE_HANDLER, error=error)

    def _breaker_outcome(
        self, record: DecisionRecord, agent_id: str, task: str, *, ok: bool, refused: bool = False
    ) -> None:
        change = self.breakers.record(agent_id, task, ok=ok, refused=refused)
        if change is BreakerState.OPEN:
            record.circuit_trips.append(agent_id)
            why = "connection refused" if refused else "consecutive failures or a failed probe"
            record.note("circuit open", f"agent {agent_id} ({why})")
        elif change is BreakerState.CLOSED:
            record.note("circuit closed", f"agent {agent_id}")

    async def _holds(self, entry: AgentEntry, conversation_id: str, deadline: Deadline) -> bool:
        """Ask an agent whether it holds the conversation; only ``200 {"holds": true}`` confirms."""
        base = entry.endpoint.rstrip("/")
        limit = min(self.config.timeouts.connect_ms + 500, max(deadline.remaining_ms(), 0)) / 1000
        if limit <= 0:
            return False
        try:
            async with self.transport.session.get(
                f"{base}/conversations/{conversation_id}",
                timeout=aiohttp.ClientTimeout(total=limit),
                allow_redirects=False,
            ) as resp:
                if resp.status != 200:
                    return False
                answer = orjson.loads(await resp.read())
        except (aiohttp.ClientError, TimeoutError, OSError, orjson.JSONDecodeError):
            return False
        return isinstance(answer, dict) and answer.get("holds") is True

    async def _backoff(self, deadline: Deadline) -> None:
        base = self.config.retries.backoff_ms
        if base <= 0:
            return
        wait_ms = min(base * _jitter.uniform(0.5, 1.5), max(deadline.remaining_ms(), 0.0))
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


def internal_error_body(trace_id: str) -> bytes:
    """The ReachResponse body for a failure inside the Router itself (HTTP 500)."""
    return orjson.dumps(
        {
            "version": PROTOCOL_VERSION,
            "traceId": trace_id,
            "status": Status.INTERNAL_ERROR.value,
            "handlerAgentId": None,
            "durationMs": 0,
            "result": None,
            "attempts": [],
            "error": {"code": "INTERNAL_ERROR", "message": "the Router failed; see its log"},
        }
    )


def _safe_trace_id(value: Any) -> str | None:
    return value if isinstance(value, str) and _TRACE_ID.match(value) else None


def _printable(text: str) -> bool:
    return len(text) <= 256 and text.isprintable()
