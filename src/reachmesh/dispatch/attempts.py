"""The attempt loop of one request, as an object: admit, try, account.

- :meth:`AttemptRun.run` admits each candidate (``_refusal``, ``_admit``): the per-request cap,
  its payload (for failover targets), the conversation context, its circuit breaker, and the
  retry budget for a failover; then tries it, retrying once on the same agent after a network
  error (``_failed`` says whether);
- :meth:`AttemptRun._attempt` makes one attempt and books its outcome (:func:`_succeeded`,
  ``_account_failure``): stats, the record, the breaker.

A decline (the agent answered ``DECLINED``) is not a failure: the next candidate is tried with no
retry-budget token and no retry of the request's count spent, the breaker and the success rate
never see it, and candidates of runner-up tasks by meaning are tried only after one. At most
:data:`MAX_DECLINES` declines per request, so a thousand agents saying "not mine" end it early.

The run returns the winning agent's result or raises the error that ends the request.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from dataclasses import dataclass, field
from time import perf_counter as _perf_counter
from typing import Any
from urllib.parse import quote

from reachmesh import jsoncodec
from reachmesh.clock import Clock
from reachmesh.config import RouterConfig
from reachmesh.decision import AttemptRecord, DecisionRecord
from reachmesh.dispatch.agentsecret import HEADER as AGENT_SECRET_HEADER
from reachmesh.dispatch.agentsecret import AgentSecrets
from reachmesh.exceptions import (
    AgentBusy,
    AgentDeclined,
    AgentRejected,
    AgentsBusy,
    AttemptError,
    AttemptTimeout,
    ConnectFailed,
    ContextUnavailable,
    DeadlineExceeded,
    NoAvailableHandler,
    Overloaded,
    PoolTimeout,
    TooLateToSend,
)
from reachmesh.protocol import UNKNOWN_TASK, CandidateReason, ReachRequest
from reachmesh.resilience.affinity import AffinityTable
from reachmesh.resilience.breaker import BreakerBoard, BreakerState, Permit
from reachmesh.resilience.capacity import CapacityBoard, Displaced, QueueFull
from reachmesh.resilience.retry import RetryBudget
from reachmesh.resilience.timeouts import Deadline, Timeout
from reachmesh.routing.base import Choice
from reachmesh.routing.stats import StatsBook
from reachmesh.tracecontext import new_span_id, w3c_trace_id
from reachmesh.transport.base import POOL_WAIT_S, AttemptLimits, Transport

# A private generator for backoff jitter: it needs no cryptographic strength and must not
# share (or disturb) the process-wide `random` state that user code may seed.
_jitter = random.Random()

# No attempt starts with less time than this left: the event loop may fire a timer up to its
# clock resolution early, and an attempt that cannot finish only delays the TIMEOUT answer.
MIN_ATTEMPT_MS = 2.0

# While an attempt waits for an agent that answers within this long (its latency's moving
# average), the loop is kept polling for the answer for at most this long instead of sleeping:
# at c1 the Router's core otherwise idles while the agent works, and waking it when the answer
# lands cost 50-90 us of p50 on the bench machine (docs/benchmarks.md, "Round 54").
POLL_AGENT_S = 0.00025
_POLL_AGENT_MS = POLL_AGENT_S * 1000


class _KeepPolling:
    """A loop callback that schedules itself again until ``done`` or its time is up: while one is
    due the loop polls its sockets with a zero timeout instead of blocking, so an answer is read
    the moment it lands. Bounded in time: an answer that is late costs at most POLL_AGENT_S of a
    core; under load the loop never sleeps anyway, and the callback runs once a turn."""

    __slots__ = ("_loop", "_until", "done")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._until = _perf_counter() + POLL_AGENT_S
        self.done = False

    def __call__(self) -> None:
        if not self.done and _perf_counter() < self._until:
            self._loop.call_soon(self)


# A timeout after a wait in the Router is the agent's once the wait left it this many times its
# recent answer time (never less than FAIR_WINDOW_MIN_MS: a fast agent's few ms are the loop's
# jitter): room for its usual spread, so a busy agent's queue tail is not charged, while an agent
# that stopped answering still is (wait_cut_short).
FAIR_WINDOW_FACTOR = 2.0
FAIR_WINDOW_MIN_MS = 50.0

# A call that waited for a slot at a full agent is not sent with less of its deadline left than
# NOT_SENT_FACTOR times the agent's usual answer time (StatsBook.usual_answer_ms): it gives up
# waiting then, or gives back a slot it was handed later. From LATE_FACTOR times on, a slot that
# comes free goes first to a waiter with more left, if one waits. Measured with bench/overload.py
# (capacity 2, 4 calls a second, timeoutMs 2500): the line's front is always its oldest call, so
# not sending alone (no passing over) still gave every slot to a call with 0.5-1x left: 0.35
# answers a second (0.27 before). Passing over from 1.0x: 1.93 for 1 s answers, but 1.56 for answers
# spread 0.2-1.8 s (calls sent with just their mean left); 1.5x: 1.93 and 2.12; 2.0x: 1.82 and 2.26.
# The bound of not sending (0.3x, 0.5x, 0.75x) moved none of these: passing over does the work, and
# half keeps an agent whose answer times vary the calls its quicker answers fit.
NOT_SENT_FACTOR = 0.5
LATE_FACTOR = 1.5
# Nor is a call not sent that the agent's quick answers would fit: the threshold is at most the
# latency a tenth of its recent attempts took (an agent answering 90% in 0.1 s, 10% in 10 s
# "usually" takes about a second, yet answers most calls with 0.4 s left).
QUICK_SHARE = 0.1

# Declines one request may collect before it ends NO_AVAILABLE_HANDLER: each is a whole hop.
MAX_DECLINES = 8

# AttemptRun._refusal's answer when only the candidate can say: whether it holds a conversation.
_ASK_AGENT = "ask the agent"

# Why a request's task was cancelled, as the cancellation's message carries it (the dispatcher
# sends them): the caller closed its connection, or the Router's drain deadline came. Each is also
# the outcome of the attempt it cut and, for a stream, how the stream ended.
CALLER_GONE = "caller_gone"
SHUTDOWN = "shutdown"
_CUTS = (CALLER_GONE, SHUTDOWN)


def cut_reason(exc: asyncio.CancelledError) -> str | None:
    """:data:`CALLER_GONE` or :data:`SHUTDOWN` when the dispatcher cancelled the request, else None."""
    why = exc.args[0] if exc.args else None
    return why if why in _CUTS else None


@dataclass(slots=True)
class Forwarding:
    """What every attempt of the Router shares: the parts, the policy and the clock."""

    transport: Transport
    breakers: BreakerBoard
    affinity: AffinityTable
    budget: RetryBudget
    stats: StatsBook
    config: RouterConfig
    clock: Clock
    capacity: CapacityBoard
    agent_secrets: AgentSecrets = field(default_factory=AgentSecrets)
    # The dispatcher's (Timeout, max retries) of each task and the caller's own asks, for this
    # policy: a reload makes a new Forwarding, and with it an empty table.
    limits: dict[tuple[Any, ...], tuple[Timeout, int]] = field(
        init=False, default_factory=dict, repr=False, compare=False
    )


# A NamedTuple made by tuple.__new__: its own __new__ is a Python frame, on every attempt.
_new_tuple = tuple.__new__


class AttemptRun:
    """The attempts of one request over its ranked choices."""

    streams = False  # a streamed request's run (dispatch/streaming.py)

    # What every run starts with, read from the class until an instance sets its own (one store
    # fewer per field on every request). may_hold: the agent that may hold a request of a
    # capability that is not idempotent (sent, outcome unknown): no other candidate is tried
    # after it; _waited_ms: the attempt under way's waits (for a slot, a connection); unsettled:
    # (agent, ms to its first piece) of a streamed answer until it ends, when its verdict is
    # booked and its slot given back (StreamingRun.settle); _cut_short: whether the deadline cut
    # the attempt under way below the policy's connect + read time.
    budget_spent = False
    last_failure: tuple[str, str] | None = None  # (agent, reason) of the last failed agent
    may_hold: str | None = None
    declined_by: str | None = None  # the agent that declined the last attempt, if one did
    busy_retry_after_s: int | None = None  # the soonest Retry-After of a busy (429) agent
    read_timed_out: str | None = None  # an agent whose attempt its read timeout ended, not the deadline
    # Why the last call not sent after a wait for a slot was not (TooLateToSend), and how many
    # attempts the request had made by then: one made after it ended the request, not the wait.
    not_sent: tuple[str, int] | None = None
    _attempt_ms = 0.0  # the time the attempt under way may take
    _waited_ms = (0.0, 0.0)
    _probing: str | None = None  # the agent whose half-open probe this request holds
    unsettled: tuple[str, float] | None = None
    _cut_short = False

    def __init__(
        self,
        parts: Forwarding,
        request: ReachRequest,
        data: dict[str, Any],
        record: DecisionRecord,
        task: str,
        timeout: Timeout,
        max_retries: int,
    ) -> None:
        self.parts = parts
        self.request = request
        self.data = data
        self.record = record
        self.task = task
        self.timeout = timeout
        self.deadline = Deadline(parts.clock, timeout.overall_ms)
        self.attempts_left = 1 + max_retries
        # The agent a contextBound conversation is bound to: once it is out of the picture, only
        # agents that confirm they hold the conversation qualify.
        if request.preferences.context_bound and request.conversation_id:
            self.bound_agent = record.affinity
        else:
            self.bound_agent = None
        trace_id = record.trace_id
        self._w3c_trace = w3c_trace_id(trace_id)
        # The same on every attempt of this request, and only of this one (a caller may reuse a
        # trace id): an SDK answers a repeat of it from its cache instead of running it again.
        if record.idempotency_key is None:
            self._idempotency_key = f"{trace_id}.{new_span_id()}"
        else:
            # An async request: the same key on every run of it, by whichever Router (one that
            # adopted it after its Router died), so an agent's cache answers the second run.
            digest = hashlib.sha256(record.idempotency_key.encode()).hexdigest()[:16]
            self._idempotency_key = f"{trace_id}.{digest}"

    async def run(self, choices: list[Choice]) -> Any:
        """The result of the first agent that succeeds; else the error that ends the request.

        One coroutine for the candidates and each one's same-agent retries (:meth:`_attempt`
        is the only other, one per attempt): each level would cost every call a frame, its
        making, and a step each time the call waits for its agent."""
        for index, choice in enumerate(choices):
            if choice.on_decline and self.declined_by is None:
                continue  # a runner-up task by meaning is an answer to "not mine" only
            reason = self._refusal(index, choice)
            if reason is _ASK_AGENT:  # only a conversation bound elsewhere asks the agent first
                allowed = await self._admit_bound(index, choice)
            else:
                allowed = self._admit(choice, reason)
            if not allowed:
                continue
            # Try the agent, with same-agent retries: its result, or on to the next candidate.
            if choice.capability.task != self.task:
                self._take_task(choice)
            self.data["targetAgent"] = choice.entry.id
            body = jsoncodec.dumps(self.data)
            same_agent_left = self.parts.config.retries.same_agent
            while True:
                outcome = await self._attempt(choice, body)
                if not isinstance(outcome, AttemptError):  # the agent's result: a value, never an error
                    return outcome
                if not self._failed(choice, outcome, same_agent_left):
                    break
                same_agent_left -= 1
                parts = self.parts
                await backoff(parts.clock, parts.config.retries.backoff_ms, self.deadline.remaining_ms())
        raise exhausted(self)

    # -- admission ---------------------------------------------------------------------------

    async def _admit_bound(self, index: int, choice: Choice) -> bool:
        """:meth:`admit` for a candidate that must confirm it holds the bound conversation."""
        holds = await self._holds(choice)
        return self._admit(choice, None if holds else CandidateReason.NO_CONTEXT)

    def _admit(self, choice: Choice, reason: str | None) -> bool:
        record, agent_id = self.record, choice.entry.id
        if reason is not None:
            record.reject(agent_id, reason, choice.score, self.task)
            return False
        if self.parts.capacity.queue_full(agent_id, choice.entry.profile.max_concurrency, record.client):
            record.reject(agent_id, CandidateReason.AT_CAPACITY, choice.score, self.task)
            return False
        permit, change = self.parts.breakers.acquire(agent_id, self.task)
        self._probing = agent_id if permit is Permit.PROBE else None
        if permit is Permit.DENY:
            record.reject(agent_id, CandidateReason.CIRCUIT_OPEN, choice.score, self.task)
            return False
        if change is BreakerState.HALF_OPEN:
            record.note("circuit half_open", f"agent {agent_id} (probe request)")
        if self.declined_by is not None:
            # The first decline is free; each after it is a hop like a failover, and costs the same.
            if len(record.declines) > 1 and not self.parts.budget.try_spend():
                record.note("retry budget", f"exhausted; no failover from {self.declined_by} (declined)")
                self.budget_spent = True
                record.reject(agent_id, CandidateReason.BUDGET_EXHAUSTED, choice.score, self.task)
                return False
            record.note("failover", f"{self.declined_by} -> {agent_id} (declined)")
        elif self.last_failure is not None:
            failed, why = self.last_failure
            if not self.parts.budget.try_spend():
                record.note("retry budget", f"exhausted; no failover from {failed} ({why})")
                self.budget_spent = True
                record.reject(agent_id, CandidateReason.BUDGET_EXHAUSTED, choice.score, self.task)
                return False
            record.failovers.append(why)
            record.note("failover", f"{failed} -> {agent_id} ({why})")
        return True

    def _refusal(self, index: int, choice: Choice) -> str | None:
        if self.may_hold is not None:
            return CandidateReason.NOT_IDEMPOTENT
        if len(self.record.declines) >= MAX_DECLINES:
            return CandidateReason.BUDGET_EXHAUSTED
        if self.attempts_left <= 0 or self.budget_spent:
            return CandidateReason.BUDGET_EXHAUSTED
        if index > 0 and choice.validator is not None and not choice.validator.is_valid(self.request.payload):
            return CandidateReason.INVALID_PAYLOAD
        if self.bound_agent is not None and choice.entry.id != self.bound_agent:
            return _ASK_AGENT
        return None

    async def _holds(self, choice: Choice) -> bool:
        """Ask an agent whether it holds the conversation; only ``200 {"holds": true}`` confirms."""
        assert self.request.conversation_id is not None
        limit_ms = min(self.parts.config.timeouts.connect_ms + 500, max(self.deadline.remaining_ms(), 0))
        if limit_ms <= 0:
            return False
        url = conversation_url(choice.entry.endpoint, self.request.conversation_id)
        return await self.parts.transport.holds(url, limit_ms / 1000)

    # -- trying ------------------------------------------------------------------------------

    def _failed(self, choice: Choice, exc: AttemptError, same_agent_left: int) -> bool:
        """Book an attempt that failed: True to retry the same agent (after the backoff), False
        to fail over; raises the error that ends the request, if it does."""
        if isinstance(exc, AgentDeclined):
            self._declined(choice, exc)
            return False
        if isinstance(exc, PoolTimeout):
            # Full, and nothing was sent: the next candidate is tried without a token.
            message = exc.message if isinstance(exc, TooLateToSend) else None
            self.record.reject(choice.entry.id, exc.reason, choice.score, self.task, message=message)
            self._release_probe(choice.entry.id)
            self._check_deadline()
            return False
        if isinstance(exc, AgentRejected) and not exc.retryable:
            self.record.handler = choice.entry.id
            raise exc
        self._check_deadline()
        if _may_retry_same(self, exc, same_agent_left, choice):
            return True
        message = _read_timeout(self, exc, choice.entry.id)
        self.record.reject(choice.entry.id, exc.reason, choice.score, self.task, message=message)
        self.last_failure = (choice.entry.id, exc.reason)
        self.declined_by = None
        if _sent_unknown(exc) and not choice.capability.idempotent:
            # The agent may have read (and run) it: another agent would run it a second time.
            self.record.note("no failover", f"{choice.entry.id} may have the request ({exc.reason})")
            self.may_hold = choice.entry.id
        return False

    def _release_probe(self, agent_id: str) -> None:
        if self._probing == agent_id:
            self.parts.breakers.release_probe(agent_id, self.task)

    def _declined(self, choice: Choice, exc: AgentDeclined) -> None:
        """Book a decline, with the agent's reason: the hop is given back to the request's count
        (admit() charges the budget from the second decline on). The time it took is not given
        back: the caller's timeoutMs bounds the whole request. Instead, a later agent that times
        out in what the decline left of the deadline is not charged for it (see _account_failure())."""
        agent_id = choice.entry.id
        message = str(exc.error.get("message") or "")
        self.record.reject(agent_id, CandidateReason.DECLINED, choice.score, self.task, message=message)
        self.record.declines.append((agent_id, self.task))
        self.attempts_left += 1
        self.declined_by = agent_id
        self.last_failure = None

    def _take_task(self, choice: Choice) -> None:
        """A candidate of a runner-up task by meaning gets that task, and the caller's words."""
        task = choice.capability.task
        if task == self.task:
            return
        self.record.note("declined", f"trying {task} by meaning after {self.task} declined")
        self.task = task
        self.record.matched_task = task
        self.data["targetTask"] = task
        self.data["requestedTask"] = self.request.target_task

    async def _attempt(self, choice: Choice, body: bytes) -> Any:
        """One attempt, accounted: the agent's result, or the AttemptError it failed with (a
        value returned, not raised, and never a result: no wrapper made per attempt).

        A slot at the agent is taken first (waiting while it is full, within the deadline) and
        given back when the attempt ends; the wait is the Router's own, charged to nobody. The
        forward itself is in this coroutine too, not in one of its own: the time the deadline
        check reads is the attempt's time (read again only after a wait for the slot).
        """
        remaining = self.deadline.remaining_ms()
        if remaining <= MIN_ATTEMPT_MS:  # _check_deadline(), without the call
            raise DeadlineExceeded(ran_out(self))
        parts, agent_id = self.parts, choice.entry.id
        self._waited_ms = (0.0, 0.0)
        # A free slot is taken without a coroutine of its own: the common case, every attempt.
        if not parts.capacity.take_now(agent_id, choice.entry.profile.max_concurrency):
            waited = await _take_slot(self, choice)
            if isinstance(waited, PoolTimeout):
                return waited
            remaining = waited
        try:
            headers, limits, span_id = self._request(agent_id, remaining)
            clock = parts.clock
            started = clock.monotonic()
            parts.stats.started(agent_id)
            pool_waited = POOL_WAIT_S.get()
            try:
                if self.streams:
                    result = await self._send(choice, body, headers, limits)
                else:  # the transport's own coroutine, awaited here: no call to make it
                    entry = choice.entry
                    poll, send = _poll_for(parts.stats, agent_id), parts.transport.send
                    try:
                        result = await send(entry.endpoint, body, headers, limits, entry.protocol)
                    finally:
                        if poll is not None:
                            poll.done = True
            except AttemptError as exc:
                self._pool_waited(pool_waited)
                self._account_failure(choice, started, span_id, exc)
                return exc
            except asyncio.CancelledError as exc:
                # A caller that went away, or the Router shutting down: the attempt ends unjudged,
                # but the agent's in-flight count and a probe it held must come back.
                parts.stats.finished(agent_id, ok=None, latency_ms=0.0)
                self._release_probe(agent_id)
                record_cut(self.record, choice, (started, clock.monotonic()), span_id, cut_reason(exc))
                raise
            return _succeeded(self, choice, started, span_id, pool_waited, result)
        finally:
            if self.unsettled is None:  # else a stream holds the slot to its end (settle())
                parts.capacity.give(agent_id)

    def _request(self, agent_id: str, remaining: float) -> tuple[dict[str, str], AttemptLimits, str]:
        """The headers, limits and span id of an attempt with ``remaining`` ms of the deadline
        left (more than MIN_ATTEMPT_MS); the attempt is counted."""
        self.attempts_left -= 1
        # Timeout.attempt_limits, written out: the deadline cuts the policy's limits only when
        # it comes before the attempt's whole time.
        timeout = self.timeout
        connect_s, read_s, total_s = timeout.seconds
        left_s = remaining / 1000.0
        if left_s < total_s:
            connect_s = left_s if left_s < connect_s else connect_s
            read_s = left_s if left_s < read_s else read_s
            total_s = left_s
        attempt_ms = self._attempt_ms = total_s * 1000.0
        self._cut_short = attempt_ms < timeout.connect_ms + timeout.read_ms - 1.0
        span_id = new_span_id()
        record = self.record
        headers = {
            "Content-Type": "application/json",
            "X-Reach-Trace-Id": record.trace_id,
            "traceparent": f"00-{self._w3c_trace}-{span_id}-01",
            "X-Reach-Deadline-Ms": str(int(remaining)),
            "Idempotency-Key": self._idempotency_key,
        }
        secrets = self.parts.agent_secrets  # for_agent() only when a glob may name another secret
        secret = secrets.for_agent(agent_id) if secrets.by_glob else secrets.default
        if secret is not None:
            headers[AGENT_SECRET_HEADER] = secret
        if record.idempotency_key is not None:
            headers["X-Reach-Idempotency-Key"] = record.idempotency_key
        # A NamedTuple made by tuple.__new__: no __new__ frame.
        return headers, _new_tuple(AttemptLimits, (connect_s, read_s, total_s)), span_id

    def _pool_waited(self, before_s: float) -> None:
        """Book the time the attempt just made waited for a connection of the Router's pool."""
        waited_s = POOL_WAIT_S.get() - before_s
        self._waited_ms = (self._waited_ms[0], max(waited_s * 1000, 0.0))
        if waited_s > 0:
            self.record.pool_wait_ms += waited_s * 1000

    async def _send(self, choice: Choice, body: bytes, headers: dict[str, str], limits: AttemptLimits) -> Any:
        """The transport call of a streamed request's attempt (StreamingRun's); a plain one's is
        ``transport.send``, awaited in :meth:`_attempt` itself."""
        raise NotImplementedError

    # -- accounting --------------------------------------------------------------------------

    def _account_failure(self, choice: Choice, started: float, span_id: str, exc: AttemptError) -> None:
        """Book an attempt that failed: stats, the attempt record, the trace line and the breaker
        (:func:`_succeeded` books a success)."""
        agent_id, record = choice.entry.id, self.record
        took = round((self.parts.clock.monotonic() - started) * 1000, 2)
        if isinstance(exc, AgentBusy) and exc.retry_after_s is not None:
            known = self.busy_retry_after_s
            self.busy_retry_after_s = exc.retry_after_s if known is None else min(known, exc.retry_after_s)
        refused = isinstance(exc, ConnectFailed) and exc.refused
        outcome = exc.reason
        verdict = attempt_verdict(exc)
        if isinstance(exc, AgentDeclined):
            verdict = _decline_verdict(self, agent_id, took)
        elif isinstance(exc, AttemptTimeout) and self._cut_short and record.declines:
            # The deadline left it less than its attempt time because another agent declined
            # late: the time the decline used is never charged to the agent after it.
            verdict = None
            record.note("timeout not charged", f"{agent_id} had {self._attempt_ms:.0f} ms after a decline")
        elif isinstance(exc, AttemptTimeout) and _timeout_cut_by_wait(self, agent_id, took):
            verdict = None  # busy is not broken: the Router's wait cut the agent's time
        offset = round((started - record.started) * 1000, 2)
        record.attempts.append(AttemptRecord(agent_id, outcome, took, span_id, offset, choice.score))
        # A failure says what failed (an errno, a status), so the trace alone can explain it.
        detail = f", outcome={exc.reason} ({exc.message[:160]})"
        record.note("forward", f"{agent_id}, duration={took:.0f}ms{detail}")
        self.parts.stats.finished(agent_id, ok=verdict, latency_ms=took)
        if verdict is None and isinstance(exc, PoolTimeout | AttemptTimeout):
            # Never reached, or a timeout charged to nobody: no word on the agent either way, so
            # a half-open probe neither closes the breaker (as an answer would) nor stays out.
            self._release_probe(agent_id)
            return
        self._judge(agent_id, verdict, refused)

    def _judge(self, agent_id: str, verdict: bool | None, refused: bool = False) -> None:
        """Tell the agent's breaker what the attempt said of it."""
        record = self.record
        change = self.parts.breakers.record(agent_id, self.task, ok=verdict, refused=refused)
        if change is BreakerState.OPEN:
            record.circuit_trips.append(agent_id)
            why = "connection refused" if refused else "consecutive failures or a failed probe"
            record.note("circuit open", f"agent {agent_id} ({why})")
        elif change is BreakerState.CLOSED:
            record.note("circuit closed", f"agent {agent_id}")

    # -- endings -----------------------------------------------------------------------------

    def _check_deadline(self) -> None:
        if self.deadline.remaining_ms() <= MIN_ATTEMPT_MS:
            raise DeadlineExceeded(ran_out(self))


async def _take_slot(run: AttemptRun, choice: Choice) -> float | PoolTimeout:
    """Wait for a slot at the agent: then the milliseconds left of the deadline (it must
    leave time for the attempt, or the slot goes back and the request ends), or PoolTimeout
    when its queue is full, or TooLateToSend when the wait left too little for the agent's
    usual answer time (NOT_SENT_FACTOR). The line is taken in turns between clients (the
    record's ``client``), FCFS within each; a late waiter (LATE_FACTOR) is passed over."""
    parts, agent_id = run.parts, choice.entry.id
    capacity = parts.capacity
    began = parts.clock.monotonic()
    end = began + run.deadline.remaining_ms() / 1000.0
    due = give_up = end - MIN_ATTEMPT_MS / 1000.0
    usual_ms, late_at = parts.stats.usual_answer_ms(agent_id), None
    if usual_ms is not None:
        # Below MIN_ATTEMPT_MS the deadline's own bound says it: a fast agent's call waits to it.
        give_up = end - max(_too_little_ms(parts.stats, agent_id, usual_ms), MIN_ATTEMPT_MS) / 1000.0
        late_at = end - LATE_FACTOR * usual_ms / 1000.0
    try:
        waited = await capacity.take(
            agent_id, choice.entry.profile.max_concurrency, give_up, run.record.client, late_at
        )
    except QueueFull as exc:
        return queue_refusal(run, choice, exc)
    except TimeoutError as exc:
        if usual_ms is not None and give_up < due:  # the agent's time ran short, not the deadline
            return _too_late(run, agent_id, parts.clock.monotonic() - began, usual_ms)
        run._release_probe(agent_id)
        run.record.queue_wait_ms += (parts.clock.monotonic() - began) * 1000
        waited_ms = run.deadline.remaining_ms()
        run.record.note("slot wait", f"{agent_id}, gave up at the deadline ({waited_ms:.0f} ms left)")
        raise DeadlineExceeded(overall_budget(run, f"ran out waiting for a slot at {agent_id}")) from exc
    remaining = run.deadline.remaining_ms()
    if remaining <= MIN_ATTEMPT_MS:
        capacity.give(agent_id)
        raise DeadlineExceeded(ran_out(run))
    # Read again: answers that came in during the wait may have made it known, or longer.
    usual_ms = parts.stats.usual_answer_ms(agent_id)
    if usual_ms is not None and remaining < _too_little_ms(parts.stats, agent_id, usual_ms):
        capacity.give(agent_id)  # to the next waiter, at once
        return _too_late(run, agent_id, waited, usual_ms)
    if waited > 0:
        run.record.queue_wait_ms += waited * 1000
        run.record.note("slot wait", f"{agent_id}, waited={waited * 1000:.0f}ms")
    run._waited_ms = (waited * 1000, 0.0)
    return remaining


def _too_little_ms(stats: StatsBook, agent_id: str, usual_ms: float) -> float:
    """The time left below which a call that waited for a slot at ``agent_id`` is not sent:
    NOT_SENT_FACTOR times its usual answer time, or its quick answers' time if less."""
    quick_ms = stats.quick_latency_ms(agent_id, QUICK_SHARE)
    too_little_ms = NOT_SENT_FACTOR * usual_ms
    return too_little_ms if quick_ms is None or quick_ms > too_little_ms else quick_ms


def _too_late(run: AttemptRun, agent_id: str, waited_s: float, usual_ms: float) -> TooLateToSend:
    """A call that waited ``waited_s`` for a slot at ``agent_id`` and now has too little of its
    deadline left for the agent's usual answer time: not sent, charged to nobody (the caller
    books it as a PoolTimeout: the next candidate; see :func:`_not_sent_ending` for the end)."""
    waited_ms = waited_s * 1000
    record = run.record
    record.queue_wait_ms += waited_ms
    left_ms = max(run.deadline.remaining_ms(), 0.0)
    reason = (
        f"{agent_id!r} usually answers in {usual_ms:.0f} ms; {left_ms:.0f} ms were left after "
        f"waiting {waited_ms:.0f} ms for a slot"
    )
    record.note("not sent", reason)
    record.not_sent += (agent_id,)
    run.not_sent = (reason, len(record.attempts))
    return TooLateToSend(f"not sent: {reason}")


def overall_budget(run: AttemptRun, ending: str) -> str:
    """A TIMEOUT message: the request's overall budget, where it came from when the caller gave
    none (a caller who never chose 5000 ms, a stream cut at 5 s say, must learn what sets it),
    and ``ending``, what became of it."""
    if run.request.preferences.timeout_ms is None:
        return (
            f"the overall budget of {run.timeout.overall_ms} ms (the Router's default: the request "
            f"gave no preferences.timeoutMs) {ending}"
        )
    return f"the overall budget of {run.timeout.overall_ms} ms {ending}"


def ran_out(run: AttemptRun) -> str:
    """The TIMEOUT message of a request whose deadline passed, with the time it spent waiting
    for slots at full agents: a caller who gave 2500 ms and waited 2000 of them in the Router's
    queue should not read it as a slow agent."""
    message = overall_budget(run, "ran out")
    waited_ms = run.record.queue_wait_ms
    if waited_ms >= 1:
        message += f", {waited_ms:.0f} ms of it waiting for a slot at a full agent"
    return message


def _read_timeout(run: AttemptRun, exc: AttemptError, agent_id: str) -> str | None:
    """For a timeout that the attempt's own bound caused while the request had time left (the
    deadline is checked before this), its message, noted for the error: a slow agent's caller
    can ask for a longer read timeout (readTimeoutMs)."""
    if type(exc) is not AttemptTimeout:
        return None
    run.read_timed_out = agent_id
    return exc.message


def _decline_verdict(run: AttemptRun, agent_id: str, took_ms: float) -> bool | None:
    """A decline is neither a success nor a failure, unless it came late (after most of the
    attempt's time) or after too many in a row: then it is a failure, for the breaker and
    merit, so that declining is never a free way to hold up or crowd out other agents."""
    policy = run.parts.config.declines
    in_a_row = run.parts.stats.declined(agent_id)
    if took_ms >= policy.late_fraction * run._attempt_ms:
        run.record.note("late decline", f"{agent_id} declined after {took_ms:.0f} ms: a failure")
        return False
    if in_a_row > policy.free_in_a_row:
        run.record.note("repeated decline", f"{agent_id}, {in_a_row} in a row: a failure")
        return False
    return None


def _timeout_cut_by_wait(run: AttemptRun, agent_id: str, took_ms: float) -> bool:
    """:func:`wait_cut_short` for the attempt that just timed out, and its trace note when so."""
    slot_ms, pool_ms = run._waited_ms
    usual_ms = run.parts.stats.usual_answer_ms(agent_id)
    if not wait_cut_short(took_ms, slot_ms, pool_ms, run.timeout.read_ms, usual_ms):
        return False
    usually = "" if usual_ms is None else f", usually answers in {usual_ms:.0f} ms"
    run.record.note(
        "timeout not charged",
        f"{agent_id} timed out after waiting in the Router ({slot_ms + pool_ms:.0f} ms waited, "
        f"{took_ms - pool_ms:.0f} ms left{usually})",
    )
    return True


def _may_retry_same(run: AttemptRun, exc: AttemptError, same_agent_left: int, choice: Choice) -> bool:
    """A network error may be retried on the same agent, within the cap and the budget; one
    after the request was sent only for an idempotent capability."""
    if exc.reason != CandidateReason.CONNECT_ERROR or same_agent_left <= 0 or run.attempts_left <= 0:
        return False
    if _sent_unknown(exc) and not choice.capability.idempotent:
        return False
    agent_id = run.record.attempts[-1].agent_id
    if not run.parts.budget.try_spend():
        run.record.note("retry budget", f"exhausted; no retry of {agent_id} ({exc.reason})")
        run.budget_spent = True
        return False
    run.record.retries.append(exc.reason)
    run.record.note("retry", f"{agent_id}, attempt={len(run.record.attempts) + 1}, reason={exc.reason}")
    return True


def _succeeded(
    run: AttemptRun, choice: Choice, started: float, span_id: str, pool_waited: float, result: Any
) -> Any:
    """Book an attempt that succeeded, the common case (none of a failure's tests): its waits for
    a connection of the Router's pool (read by no one else), stats, the attempt record, the trace
    line and the breaker; and the conversation's agent. A stream's verdict waits for its end.
    Returns ``result``, the agent's."""
    record, parts, agent_id = run.record, run.parts, choice.entry.id
    waited_s = POOL_WAIT_S.get() - pool_waited
    if waited_s > 0:
        record.pool_wait_ms += waited_s * 1000
    took = round((parts.clock.monotonic() - started) * 1000, 2)
    offset = round((started - record.started) * 1000, 2)
    record.attempts.append(AttemptRecord(agent_id, "SUCCESS", took, span_id, offset, choice.score))
    record.note("forward", f"{agent_id}, duration={took:.0f}ms")
    if run.streams:
        run.unsettled = (agent_id, took)  # judged when the stream ends
    else:
        parts.stats.succeeded(agent_id, took)
        # _judge(), written out for a success: only a half-open probe's closes a breaker.
        if parts.breakers.record(agent_id, run.task, ok=True) is BreakerState.CLOSED:
            record.note("circuit closed", f"agent {agent_id}")
    record.handler = agent_id
    if run.request.conversation_id:
        parts.affinity.bind(run.request.conversation_id, agent_id, record.caller)
    return result


def _poll_for(stats: StatsBook, agent_id: str) -> _KeepPolling | None:
    """Keep the loop polling while the attempt about to start waits for an agent that answers
    within POLL_AGENT_S (its latency's moving average); None for any other. Scheduled before the
    transport writes the request, it first runs after the write, while the agent works."""
    latency_ms = stats.merit(agent_id)[1]
    if latency_ms is None or latency_ms > _POLL_AGENT_MS:
        return None
    loop = asyncio.get_running_loop()
    poll = _KeepPolling(loop)
    loop.call_soon(poll)
    return poll


def exhausted(run: AttemptRun) -> ContextUnavailable | DeadlineExceeded | NoAvailableHandler | Overloaded:
    """The error for a run in which no candidate succeeded."""
    record = run.record
    if run.bound_agent is not None and any(
        c.get("reason") == CandidateReason.NO_CONTEXT for c in record.rejected
    ):
        return ContextUnavailable(
            f"conversation {run.request.conversation_id!r} is bound to {run.bound_agent!r}, which "
            "cannot take it, and no other agent confirms it holds the conversation",
            list(record.rejected),
        )
    if record.declines and all(c.get("reason") == CandidateReason.DECLINED for c in record.rejected):
        return NoAvailableHandler(
            f"every candidate for {run.request.target_task!r} declined it", list(record.rejected)
        )
    message = f"every candidate for {run.task!r} failed or was skipped"
    if run.not_sent is not None:
        ending = _not_sent_ending(run, run.not_sent)
        if isinstance(ending, DeadlineExceeded):
            return ending
        message += ending
    if record.rejected and all(c.get("reason") == CandidateReason.AT_CAPACITY for c in record.rejected):
        return Overloaded(
            f"every candidate for {run.task!r} is full, and so is its queue",
            retry_after_s=_overloaded_retry_after(run),
        )
    if run.read_timed_out is not None:
        # The likeliest surprise of a slow agent: the deadline was long, each attempt was not.
        timeout = run.timeout
        if run.record.stream is None:
            within = f"the read timeout of {timeout.read_ms:.0f} ms"
        else:  # a stream's head has the connect and read timeouts together, as its candidate says
            within = f"{timeout.connect_ms + timeout.read_ms:.0f} ms (its connect and read timeouts)"
        message += (
            f"; {run.read_timed_out!r} did not answer within {within} (preferences.readTimeoutMs,"
            " timeouts.read_ms or tasks.<task>.read_ms allows longer)"
        )
    if run.busy_retry_after_s is not None:
        message += f"; a busy agent asked to retry after {run.busy_retry_after_s} s"
        return AgentsBusy(message, list(record.rejected), retry_after_s=run.busy_retry_after_s)
    return NoAvailableHandler(message, list(record.rejected))


def _not_sent_ending(run: AttemptRun, not_sent: tuple[str, int]) -> DeadlineExceeded | str:
    """How a run with a call not sent (too late, after a wait for a slot) ends: TIMEOUT with why,
    when no attempt came after it (time is what ended the request); else what the failover's
    failure says (the caller of :func:`exhausted` goes on), with the not-sent reason beside it:
    an agent that answered 500 after the failover is the end, not the first agent's queue."""
    reason, attempts_before = not_sent
    failed = run.last_failure
    if len(run.record.attempts) == attempts_before:
        message = overall_budget(run, f"would run out before an answer: {reason}, so the call was not sent")
        if failed is not None:  # a failure before the wait: the caller learns of it too
            message += f" (after {failed[0]!r} failed: {failed[1]})"
        return DeadlineExceeded(message)
    if failed is None:  # a decline after it: in the candidates with its reason
        return f"; the call was not sent: {reason}"
    return f"; {failed[0]!r} failed ({failed[1]}) after the call was not sent: {reason}"


def record_cut(
    record: DecisionRecord, choice: Choice, span: tuple[float, float], span_id: str, why: str | None
) -> None:
    """Record an attempt the dispatcher cut (``why``: the caller left, or the Router is shutting
    down; ``span``: its monotonic start and end), so the trace and the attempts counted say what
    stopped it."""
    if why is None:
        return
    started, ended = span
    took = round((ended - started) * 1000, 2)
    offset = round((started - record.started) * 1000, 2)
    record.attempts.append(AttemptRecord(choice.entry.id, why, took, span_id, offset, choice.score))
    record.note("forward", f"{choice.entry.id}, duration={took:.0f}ms, outcome={why} (not judged)")


def _overloaded_retry_after(run: AttemptRun) -> int:
    """When a caller turned away from full agents should come back: the soonest estimate of the
    agents it found full, for the caller's place in their turns
    (resilience.capacity.retry_after_estimate), not a fixed figure."""
    parts, client = run.parts, run.record.client
    policy_s = parts.config.limits.retry_after_seconds
    estimates = [
        parts.capacity.retry_after_s(agent_id, parts.stats.merit(agent_id)[1], policy_s, client)
        for agent_id in {c["agentId"] for c in run.record.rejected}
    ]
    return min(estimates, default=policy_s)


def queue_refusal(run: AttemptRun, choice: Choice, exc: QueueFull) -> PoolTimeout:
    """A full agent's queue that had no place for the call: PoolTimeout (the next candidate is
    tried), or, for a call whose place another client's call took (its client held the most of
    the line), OVERLOADED at once, the agent listed ``at_capacity`` with why. Either way nothing
    was sent, and nothing is charged to the agent."""
    agent_id = choice.entry.id
    if not isinstance(exc, Displaced):
        return PoolTimeout(f"{agent_id} is full and so is its queue")
    run._release_probe(agent_id)
    record = run.record
    waited_ms = exc.waited_s * 1000
    record.queue_wait_ms += waited_ms
    record.note("slot wait", f"{agent_id}, displaced after {waited_ms:.0f}ms by another client's call")
    reason = (
        f"this call waited {waited_ms:.0f} ms for a slot at {agent_id}, whose queue is full, and was "
        "displaced by another client's call: its client had the most calls waiting there; nothing "
        "was sent to the agent"
    )
    record.reject(agent_id, CandidateReason.AT_CAPACITY, choice.score, run.task, message=reason)
    parts = run.parts
    service_ms, policy_s = parts.stats.merit(agent_id)[1], parts.config.limits.retry_after_seconds
    retry_after_s = parts.capacity.retry_after_s(agent_id, service_ms, policy_s, record.client)
    raise Overloaded(reason, retry_after_s=retry_after_s, shedding=False) from exc


def attempt_verdict(exc: AttemptError | None) -> bool | None:
    """What an attempt says of the agent, for its breaker and success rate: True (it answered),
    False (it failed), or None (neither).

    A final AGENT_ERROR or a 4xx is an answer: the agent refused on purpose. A retryable
    AGENT_ERROR is the agent saying it failed where another might not: a failure, like a 5xx. A
    decline, a 429 or an SDK agent's "no handler for this task" (a registration older than its
    code) are neither: the agent is up and did not serve.
    """
    if exc is None:
        return True
    if isinstance(exc, AgentBusy | AgentDeclined | PoolTimeout):
        return None
    if isinstance(exc, AgentRejected):
        return None if exc.error.get("code") == UNKNOWN_TASK else not exc.retryable
    return False


def wait_cut_short(
    took_ms: float, slot_ms: float, pool_ms: float, read_ms: float, usual_ms: float | None = None
) -> bool:
    """Whether the Router's own wait (``slot_ms`` before the attempt, ``pool_ms`` within its
    ``took_ms``) is what cut the agent's time, so that its timeout is charged to nobody.

    The agent had ``took_ms - pool_ms``. That is a fair window, and the timeout the agent's, once
    it reaches the read timeout, or :data:`FAIR_WINDOW_FACTOR` times ``usual_ms`` (its recent
    answer time, at least :data:`FAIR_WINDOW_MIN_MS`): an agent that usually answers in 1 s and
    got 2 s had its chance, whatever the caller's deadline. A shorter window is the wait's doing
    when, without the wait, the agent would have had what it usually needs (``usual_ms``, and the
    read timeout before it has answered once); a deadline short of that anyway is the caller's,
    and charged as it is without a wait."""
    waited_ms = slot_ms + pool_ms
    if waited_ms <= 0:
        return False
    fair_ms = need_ms = read_ms
    if usual_ms is not None:
        fair_ms = min(read_ms, max(usual_ms * FAIR_WINDOW_FACTOR, FAIR_WINDOW_MIN_MS))
        need_ms = min(read_ms, usual_ms)
    agent_ms = took_ms - pool_ms
    return agent_ms < fair_ms - 1.0 and agent_ms + waited_ms >= need_ms - 1.0


async def backoff(clock: Clock, base_ms: float, remaining_ms: float) -> None:
    """The pause before a same-agent retry: ``base_ms`` jittered by half, within the deadline,
    on the Router's clock, as the deadline it is cut to is."""
    if base_ms > 0:
        wait_ms = min(base_ms * _jitter.uniform(0.5, 1.5), max(remaining_ms, 0.0))
        await clock.sleep(wait_ms / 1000.0)


def _sent_unknown(exc: AttemptError) -> bool:
    """Whether the request may have reached the agent though no answer came back."""
    return isinstance(exc, ConnectFailed) and exc.sent


def conversation_url(endpoint: str, conversation_id: str) -> str:
    """Where an agent says whether it holds a conversation; the id is one escaped path segment."""
    return f"{endpoint.rstrip('/')}/conversations/{quote(conversation_id, safe='')}"
