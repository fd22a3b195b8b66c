"""The dispatcher: one ReachRequest in, exactly one ReachResponse out.

Data flows one way: the body is decoded into a :class:`ReachRequest`, the routing
:class:`~reachmesh.routing.pipeline.Pipeline` ranks the candidates, the payload is checked
against the chosen capability's ``input_schema``, an :class:`~.attempts.AttemptRun` forwards it
under the deadline, and :mod:`.answer` encodes the ending. Observers read the finished
:class:`DecisionRecord`. ``mode: async`` answers ``ACCEPTED`` at once and runs the same path in
the background (:mod:`.asyncmode`).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Coroutine, Iterable
from dataclasses import replace
from typing import Any, NamedTuple

from pydantic import ValidationError

from reachmesh import jsoncodec
from reachmesh.clock import SYSTEM_CLOCK, Clock
from reachmesh.config import RouterConfig
from reachmesh.decision import DecisionRecord, Observer, StreamRecord
from reachmesh.dispatch import durable, encoder
from reachmesh.dispatch.agentsecret import AgentSecrets
from reachmesh.dispatch.asyncmode import AsyncRequests
from reachmesh.dispatch.attempts import CALLER_GONE, SHUTDOWN, AttemptRun, Forwarding
from reachmesh.dispatch.busy import run_past_busy
from reachmesh.dispatch.results import Reply
from reachmesh.dispatch.streaming import StreamingRun, StreamSink, relay
from reachmesh.dispatch.suggest import Suggester
from reachmesh.exceptions import (
    AgentsBusy,
    CallerGone,
    ContextUnavailable,
    DeadlineExceeded,
    EmbeddingDown,
    EmbeddingError,
    OutboundRefused,
    Overloaded,
    ReachError,
    RequestError,
    RouterShutdown,
    RoutingError,
    TraceIdInUse,
    UnknownTask,
)
from reachmesh.protocol import ReachRequest, error_details, is_trace_id
from reachmesh.resilience.retry import RetryBudget
from reachmesh.resilience.timeouts import Timeout
from reachmesh.routing.base import Choice
from reachmesh.routing.pipeline import Pipeline
from reachmesh.schema import PayloadValidator
from reachmesh.semantic.vectors import CapabilityVectors
from reachmesh.tracecontext import new_trace_id
from reachmesh.transport.urlguard import UrlGuard

log = logging.getLogger("reachmesh.dispatcher")

# "at http://10.0.0.5:8080/v1/embeddings" in an embedder's error: dropped before a caller sees it.
_SERVICE_ADDRESS = re.compile(r" at [A-Za-z][A-Za-z0-9+.-]*://\S+")

# The trace-log event each kind of ending writes, most specific first.
_ENDINGS: tuple[tuple[type[ReachError], str], ...] = (
    (CallerGone, "caller gone"),
    (RouterShutdown, "shutdown"),
    (ContextUnavailable, "context unavailable"),
    (DeadlineExceeded, "timeout"),
    (RoutingError, "no handler"),
    (RequestError, "invalid request"),
    (Overloaded, "overloaded"),
)

# Async mode answers later, elsewhere; a stream is an answer now, on this connection.
_ASYNC_STREAM = RequestError(
    "preferences.mode 'async' cannot be streamed: ask without Accept: text/event-stream, or with mode 'sync'",
    details=[{"field": "preferences.mode", "message": "async mode cannot be streamed"}],
)


class Grants(NamedTuple):
    """What a caller's token allows beyond calling: ``serves``, an agent token's task globs (it
    never confirms a learned route to them); ``reach_tasks``, the tasks it may reach by meaning
    (docs/security.md)."""

    serves: tuple[str, ...] = ()
    reach_tasks: tuple[str, ...] = ("*",)


# A caller whose token names no limits (and every caller while auth is off).
EVERY_TASK = Grants()


class Dispatcher:
    """Runs the request pipeline. Holds no per-request state between calls."""

    def __init__(
        self,
        pipeline: Pipeline,
        forwarding: Forwarding,
        *,
        async_requests: AsyncRequests,
        suggester: Suggester,
        url_guard: UrlGuard,
        vectors: CapabilityVectors | None = None,
        observers: Iterable[Observer] = (),
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        # Every part is handed in, built once by the composition root (server/components.py):
        # the dispatcher makes no defaults of its own for anyone to overwrite.
        self.pipeline = pipeline
        self.forwarding = forwarding
        self.async_requests = async_requests
        self.results = async_requests.results  # the async results this Router holds
        self.suggester = suggester
        self.url_guard = url_guard  # where replyTo URLs are checked: the Router's own guard
        self.vectors = vectors
        self.observers = list(observers)
        self.clock = clock
        # Synchronous requests in flight (their tasks): ended by abandon() at the drain deadline,
        # or by callers_gone() when a caller's connection closes. _cut says which cancelled one.
        self._running: set[asyncio.Task[Any]] = set()
        self._cut: dict[asyncio.Task[Any], str] = {}
        self._abandoning = False
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop requests last ran on
        self.streams_in_flight = 0  # streamed requests running now (a gauge reads it)

    @property
    def config(self) -> RouterConfig:
        return self.forwarding.config

    def apply(self, config: RouterConfig, budget: RetryBudget) -> None:
        """Take a reloaded policy; requests in flight keep the one they started with."""
        # A new Forwarding, not the old one changed: each request in flight holds the one it
        # started with, and AttemptRun reads its policy (retries, backoff, timeouts) from it.
        secrets = AgentSecrets.from_policy(config.outbound)
        self.forwarding = replace(self.forwarding, config=config, budget=budget, agent_secrets=secrets)

    # -- entry points ------------------------------------------------------------------------

    async def handle(  # noqa: PLR0913 - who asks, one keyword each, and where the record goes
        self,
        body: bytes,
        *,
        trace_header: str | None = None,
        parent: tuple[str, str] | None = None,
        owner: str | None = None,
        caller: str = "-",
        client: str | None = None,
        sink: StreamSink | None = None,
        grants: Grants = EVERY_TASK,
        hold: list[DecisionRecord] | None = None,
    ) -> Reply:
        """Decode ``body`` as a ReachRequest and serve it; never raises for bad input.
        ``parent`` is the (trace id, span id) of the caller's W3C ``traceparent``, if any;
        ``owner`` is who may fetch an async result later (None: anyone, when auth is off);
        ``caller`` is the principal's key, for the decision record; ``client`` is who the
        per-client limits count (the caller's key, or its address with auth off; default
        ``caller``); ``grants``, what the caller's token may do beyond calling (:class:`Grants`).
        With a ``sink`` the caller asked for a stream (§14): chunks go to it as they come, and
        the Reply returned is the ending (the body of the ``done`` event once ``sink.opened``).
        With a ``hold`` list, a routed request's record goes there, not to the observers: the
        caller writes the answer first, then hands it to :meth:`observe`.

        :meth:`start` and, unless it refused, an await of what it returned: a caller on the hot
        path does the two itself, without this coroutine."""
        started = self.start(
            body,
            trace_header=trace_header,
            parent=parent,
            owner=owner,
            caller=caller,
            client=client,
            sink=sink,
            grants=grants,
            hold=hold,
        )
        return started if isinstance(started, tuple) else await started

    def start(  # noqa: PLR0913 - handle()'s keywords
        self,
        body: bytes,
        *,
        trace_header: str | None = None,
        parent: tuple[str, str] | None = None,
        owner: str | None = None,
        caller: str = "-",
        client: str | None = None,
        sink: StreamSink | None = None,
        grants: Grants = EVERY_TASK,
        hold: list[DecisionRecord] | None = None,
    ) -> Reply | Awaitable[Reply]:
        """:meth:`handle` up to its first wait, in no coroutine: the request decoded, checked and
        recorded, then the coroutine that serves it (``mode: async``: accepts it, or refuses);
        or, refused at once, its Reply (finished and observed)."""
        started = self.clock.monotonic()
        hint = (trace_header is not None and _safe_trace_id(trace_header)) or (parent[0] if parent else None)
        config = self.forwarding.config
        try:
            request, data = _decode(body, config.server.max_json_depth, config.limits.max_error_details)
            prefs = request.preferences
            # Almost every request asks for no timeout of its own: nothing to check, and no call.
            if (
                prefs.timeout_ms is not None
                or prefs.connect_timeout_ms is not None
                or prefs.read_timeout_ms is not None
            ):
                _check_timeouts(request, config.limits.max_timeout_ms)
        except RequestError as exc:
            return self.refuse(exc, started=started, trace_id=exc.trace_id or hint, task=exc.task)
        data["traceId"] = trace_id = request.trace_id or hint or new_trace_id()
        record = DecisionRecord(
            trace_id=trace_id,
            task=request.target_task,
            source=request.source_agent or "-",
            started=started,
            started_wall=self.clock.time(),
            conversation_id=request.conversation_id,
            caller=caller,
            client=client or caller,
            caller_serves=grants.serves,
            reach_tasks=grants.reach_tasks,
            parent_span_id=parent[1] if parent else None,
            mode=prefs.mode,
        )
        if config.logging.log_payloads:
            record.payload = request.payload
        if sink is not None:
            if record.mode == "async":
                return self.refuse(_ASYNC_STREAM, trace_id=trace_id, task=request.target_task)
            record.stream = StreamRecord()
            return self._stream(request, data, record, sink)
        if record.mode == "async":
            return _accept(self, request, data, record, owner, record.client)
        return self._serve(request, data, record, None, hold)

    async def _serve(
        self,
        request: ReachRequest,
        data: dict[str, Any],
        record: DecisionRecord,
        sink: StreamSink | None = None,
        hold: list[DecisionRecord] | None = None,
        tracked: bool = True,
    ) -> Reply:
        """Route and forward a validated request (``data``, its decoded body, forwarded as is)
        and finish it: the dispatcher's one coroutine on every call, as each level more costs
        every call a frame, its making, and a step each time it waits for its agent.

        A ``tracked`` request (one a caller waits for) is ended by the Router when its caller
        leaves (:meth:`callers_gone`) or the drain deadline comes first (:meth:`abandon`): it
        then ends through the same finish path (counted, traced, and logged as abandoned), not
        cut off by the server with a bare 500. Only a set entry per request: an
        ``asyncio.timeout`` scope around every request cost about 20 us of CPU each (measured),
        for an event that happens once, at shutdown.
        """
        task = None
        if tracked:  # _current_task(), without the call once the loop is known
            loop = self._loop
            task = (loop is not None and asyncio.current_task(loop)) or self._current_task()
            if self._abandoning or task is None:
                return self._abandoned(record)
            self._running.add(task)
        try:
            try:
                # Without a model there is nothing to wait for; with one, only a request routed
                # by meaning waits (asked here, so an exact task makes no coroutine to await).
                vectors = self.vectors
                if vectors is not None and self.pipeline.wants_semantic(
                    request, record.caller, record.reach_tasks
                ):
                    await _ensure_query_vector(vectors, request.target_task)
                try:
                    run, choices = _plan(self.forwarding, self.pipeline, request, data, record, sink)
                except UnknownTask as exc:
                    exc.suggest(*await self.suggester.nearest(exc.task))
                    raise
                try:
                    result = await run.run(choices)
                except AgentsBusy as busy:  # every agent busy: wait and go again (dispatch/busy.py)
                    result = await run_past_busy(run, choices, busy)
                if sink is not None:
                    result = await _relayed(result, sink, record, run)
            except ReachError as exc:
                return self._finish(record, error=exc, hold=hold)
            return self._finish(record, result=result, hold=hold)
        except asyncio.CancelledError as exc:
            return self._cancelled(exc, task, record, sink, hold)
        finally:
            self._running.discard(task)  # None (not tracked): never in it
            if self._cut:  # a cut that came as the request ended: nothing is left to cut
                self._cut.pop(task, None)  # type: ignore[arg-type]

    async def _stream(
        self, request: ReachRequest, data: dict[str, Any], record: DecisionRecord, sink: StreamSink
    ) -> Reply:
        """:meth:`_serve` for a caller that asked for a stream, counted while it runs."""
        self.streams_in_flight += 1
        try:
            return await self._serve(request, data, record, sink)
        finally:
            self.streams_in_flight -= 1

    def _cancelled(
        self,
        exc: asyncio.CancelledError,
        task: asyncio.Task[Any] | None,
        record: DecisionRecord,
        sink: StreamSink | None,
        hold: list[DecisionRecord] | None,
    ) -> Reply:
        """The answer of a request whose task was cancelled (``exc``): only the cancellations
        sent here (abandon(), callers_gone()) are answered; any other goes on, raised again (a
        streaming caller's watch: its caller is gone too), as does any of a request not
        ``tracked`` (``task`` None)."""
        why = None if task is None else self._cut.pop(task, None)
        if why is None or task is None:
            if sink is not None and record.status is None:
                self._caller_gone(record, hold)
            raise exc
        task.uncancel()
        if why == CALLER_GONE:
            return self._caller_gone(record, hold)
        return self._abandoned(record)

    def _current_task(self) -> asyncio.Task[Any] | None:
        """The running task. ``asyncio.current_task()`` looks the running loop up with a
        getpid() system call (a check for a fork) on every request; with the loop named it does
        not. The loop is remembered from the last request: a loop that is not running has no
        current task, so a stale one (a test's loop, closed) falls back to the full lookup."""
        loop = self._loop
        task = asyncio.current_task(loop) if loop is not None else None
        if task is None:
            task = asyncio.current_task()
            if task is not None:
                self._loop = task.get_loop()
        return task

    def _abandoned(self, record: DecisionRecord) -> Reply:
        log.error("[%s] request abandoned at shutdown: answered TIMEOUT (ROUTER_SHUTDOWN)", record.trace_id)
        if record.stream is not None and record.stream.ended in (None, CALLER_GONE):
            record.stream.ended = SHUTDOWN
        return self._finish(record, error=RouterShutdown("the Router shut down before this request finished"))

    def abandon(self) -> None:
        """The drain deadline: end every synchronous request still running with TIMEOUT (code
        ROUTER_SHUTDOWN), and any that starts from now on at once."""
        self._abandoning = True
        for task in self._running:
            if task not in self._cut:  # a caller gone already: its end is on its way
                self._cut[task] = SHUTDOWN
                task.cancel(SHUTDOWN)

    @property
    def running(self) -> int:
        """Synchronous requests (streams too) running now."""
        return len(self._running)

    def callers_gone(self, tasks: Iterable[asyncio.Task[Any]]) -> None:
        """The connection these tasks served closed: each that is running a request here stops
        it (the connection to its agent closes with it), booked to the caller. A connection's
        end, not a request's: nothing on the hot path."""
        for task in tasks:
            if task in self._running and task not in self._cut:
                self._cut[task] = CALLER_GONE
                task.cancel(CALLER_GONE)

    def refuse(
        self,
        error: ReachError,
        *,
        started: float | None = None,
        trace_id: str | None = None,
        task: Any = None,
    ) -> Reply:
        """Answer a request refused before routing: INVALID_REQUEST (or 413/415), OVERLOADED."""
        label = task if isinstance(task, str) and _printable(task) else "-"
        record = encoder.bare_record(self.clock, trace_id, label, started)
        return self._finish(record, error=error)

    def shed(self, reason: str, *, trace_id: str | None = None) -> Reply:
        """Answer OVERLOADED at once: the Router is shedding load."""
        return self.refuse(
            Overloaded(reason, retry_after_s=self.config.limits.retry_after_seconds), trace_id=trace_id
        )

    # -- async mode --------------------------------------------------------------------------

    async def drain(self, timeout_s: float) -> None:
        """Let accepted async requests finish within ``timeout_s``; abandon the rest, loudly."""
        await self.async_requests.drain(timeout_s)

    async def close(self) -> None:
        """Abandon async requests still running (each is logged and answered TIMEOUT)."""
        await self.async_requests.close()

    # -- routing and attempts ----------------------------------------------------------------

    def dispatch(
        self, request: ReachRequest, data: dict[str, Any], record: DecisionRecord
    ) -> Coroutine[Any, Any, Reply]:
        """Route, forward and finish a validated ``mode: async`` request (run in the background:
        neither abandoned at the drain deadline nor cut when a caller leaves)."""
        return self._serve(request, data, record, tracked=False)

    def _caller_gone(self, record: DecisionRecord, hold: list[DecisionRecord] | None = None) -> Reply:
        """The caller closed its connection: the request ends here, traced and counted as the
        caller's (nobody reads the answer). No attempt after it: a failover now would run the
        request again for nobody."""
        if record.stream is not None and record.stream.ended is None:
            record.stream.ended = CALLER_GONE
        where = f" during {record.attempts[-1].agent_id}'s attempt" if record.attempts else ""
        message = f"the caller closed its connection after {self._ms_since(record):.0f} ms{where}"
        return self._finish(record, error=CallerGone(message), hold=hold)

    def _ms_since(self, record: DecisionRecord) -> float:
        return (self.clock.monotonic() - record.started) * 1000

    # -- the one way out ---------------------------------------------------------------------

    def _finish(
        self,
        record: DecisionRecord,
        *,
        result: Any = None,
        error: ReachError | None = None,
        hold: list[DecisionRecord] | None = None,
    ) -> Reply:
        if error is not None:
            for kind, event in _ENDINGS:
                if isinstance(error, kind):
                    record.note(event, error.reason if isinstance(error, Overloaded) else error.message)
                    break
        encoder.conclude(record, self.clock, result=result, error=error)
        if hold is None:
            self.observe(record)
        else:
            hold.append(record)  # observed once the answer is written (handle's ``hold``)
        return encoder.encode(record)

    def observe(self, record: DecisionRecord) -> None:
        """Hand a concluded record to every observer (the trace log, metrics, the store...)."""
        for observer in self.observers:
            try:
                observer(record)
            except Exception:  # an observer's bug must never cost the caller the answer
                log.exception("observer %r failed", observer)


async def _accept(
    dispatcher: Dispatcher,
    request: ReachRequest,
    data: dict[str, Any],
    record: DecisionRecord,
    owner: str | None,
    client: str,
) -> Reply:
    """``mode: async``: answer ACCEPTED at once and run the request in the background (its
    refusals: a traceId in use, a refused replyTo, too many pending, not recorded in etcd)."""
    trace_id = record.trace_id
    if dispatcher.results.known(trace_id):
        if dispatcher.results.owner(trace_id) == owner:
            error = TraceIdInUse(f"traceId {trace_id!r} is already in use by an async request")
            return dispatcher.refuse(error, trace_id=trace_id, task=request.target_task)
        # Another caller's request: refusing would tell this one that it exists. This one
        # gets a traceId of its own instead (its answer says which).
        trace_id = record.trace_id = data["traceId"] = new_trace_id()
    reply_to = request.preferences.reply_to
    if reply_to is not None:
        try:
            dispatcher.url_guard.check_url(reply_to)
        except OutboundRefused as exc:
            refused = RequestError(
                f"preferences.replyTo is refused: {exc.message}",
                details=[{"field": "preferences.replyTo", "message": exc.message}],
            )
            return dispatcher.refuse(refused, trace_id=trace_id, task=request.target_task)
    limits = dispatcher.config.limits
    if dispatcher.results.pending >= limits.max_inflight:
        return dispatcher.shed(f"{dispatcher.results.pending} async requests pending", trace_id=trace_id)
    mine = dispatcher.async_requests.running_for(client)
    if mine >= limits.max_inflight_per_client:
        return dispatcher.shed(
            f"this client has {mine} async requests pending (limit {limits.max_inflight_per_client}, "
            "limits.max_inflight_per_client)",
            trace_id=trace_id,
        )
    unrecorded = await durable.admit(
        dispatcher.async_requests.journal, dispatcher.config, data, record, owner, reply_to, client
    )
    if unrecorded is not None:
        return dispatcher.refuse(unrecorded, trace_id=record.trace_id, task=request.target_task)
    run = durable.runner(dispatcher, request, data, record)
    dispatcher.async_requests.start(
        record.trace_id, run, request.preferences.reply_to, owner, client, request.target_task
    )
    return encoder.standalone(dispatcher.clock, record.trace_id)


def _plan(
    parts: Forwarding,
    pipeline: Pipeline,
    request: ReachRequest,
    data: dict[str, Any],
    record: DecisionRecord,
    sink: StreamSink | None,
) -> tuple[AttemptRun, list[Choice]]:
    """The request's ranked choices and the run that tries them: nothing awaited (an exact
    task's is the common case), so a plain function. ``parts`` is the policy this request keeps
    to its end, whatever a reload does meanwhile (apply() replaces the Forwarding, never changes
    it)."""
    parts.budget.on_request()
    choices = pipeline.decide(request, record)
    first = choices[0]
    if first.validator is not None and not first.validator.is_valid(request.payload):
        raise _schema_mismatch(first.validator, request, record, parts.config.limits.max_error_details)
    record.selected = first.entry.id
    # Four places, as the semantic block and the rejections carry them: a similarity's
    # seventeen digits say nothing more to anyone reading a trace.
    record.score = None if first.score is None else round(first.score, 4)
    task = request.target_task
    if record.matched_task is not None and record.matched_task != task:
        # Routed by the mapping table or by meaning: the agent gets the task it declared, and
        # the caller's own words beside it.
        data["targetTask"] = record.matched_task
        data["requestedTask"] = task
        task = record.matched_task
    # Per-task policy follows the declared task, however the caller phrased it; _limits() only
    # the first time a policy sees a task and asks.
    prefs = request.preferences
    known = parts.limits.get(
        (task, prefs.connect_timeout_ms, prefs.read_timeout_ms, prefs.timeout_ms, prefs.retry_count)
    )
    timeout, retries = _limits(parts, request, task) if known is None else known
    kind = AttemptRun if sink is None else StreamingRun
    return kind(parts, request, data, record, task, timeout, retries), choices


async def _relayed(result: Any, sink: StreamSink, record: DecisionRecord, run: AttemptRun) -> Any:
    """A streamed request's result: its agent's chunks sent to ``sink`` (:func:`relay`); raises
    the error that ended the stream, if one did."""
    assert isinstance(run, StreamingRun)
    result, error = await relay(result, sink, record, run)
    if error is not None:
        raise error
    return result


async def _ensure_query_vector(vectors: CapabilityVectors, text: str) -> None:
    """The one place a model may be called: a semantic request whose text is not cached yet."""
    if vectors.cached(text) is not None:
        return
    try:
        await vectors.query_vector(text)
    except EmbeddingError as exc:
        # The caller learns what failed, not where the embedding service lives (the log has it).
        reason = _SERVICE_ADDRESS.sub("", exc.message)
        raise EmbeddingDown(
            f"semantic routing is unavailable: {reason}; exact task names still work",
            [],
            retry_after_s=getattr(exc, "retry_after_s", None),
        ) from exc


def _limits(parts: Forwarding, request: ReachRequest, task: str) -> tuple[Timeout, int]:
    """The request's Timeout and retry cap: :func:`_timeout` and :func:`_max_retries`, which read
    only the task, the caller's own asks and the policy, worked out once per policy for each."""
    prefs = request.preferences
    key = (task, prefs.connect_timeout_ms, prefs.read_timeout_ms, prefs.timeout_ms, prefs.retry_count)
    known = parts.limits.get(key)
    if known is None:
        if len(parts.limits) >= _MAX_TIMEOUTS:
            parts.limits.clear()
        config = parts.config
        known = parts.limits[key] = (_timeout(request, task, config), _max_retries(request, task, config))
    return known


# The requests' Timeouts (frozen, so shared): a frozen dataclass's constructor sets each field
# through object.__setattr__, more work than the rest of _timeout. Callers choose their own
# timeouts, so the cache is bounded, and emptied when full.
_TIMEOUTS: dict[tuple[int, int, int], Timeout] = {}
_MAX_TIMEOUTS = 256


def _timeout(request: ReachRequest, task: str, config: RouterConfig) -> Timeout:
    policy = config.timeouts
    override = config.tasks.get(task)
    prefs = request.preferences
    connect = prefs.connect_timeout_ms or (override and override.connect_ms) or policy.connect_ms
    read = prefs.read_timeout_ms or (override and override.read_ms) or policy.read_ms
    overall = (
        prefs.timeout_ms
        or (override and override.overall_ms)
        or policy.overall_ms
        or connect + read + config.retries.allowance_ms
    )
    key = (connect, read, overall)
    timeout = _TIMEOUTS.get(key)
    if timeout is None:
        if len(_TIMEOUTS) >= _MAX_TIMEOUTS:
            _TIMEOUTS.clear()
        timeout = _TIMEOUTS[key] = Timeout(connect_ms=connect, read_ms=read, overall_ms=overall)
    return timeout


def _max_retries(request: ReachRequest, task: str, config: RouterConfig) -> int:
    override = config.tasks.get(task)
    cap = config.retries.max_per_request
    if override is not None and override.max_retries is not None:
        cap = override.max_retries
    asked = request.preferences.retry_count
    return cap if asked is None else min(asked, cap)


def _schema_mismatch(
    validator: PayloadValidator, request: ReachRequest, record: DecisionRecord, limit: int
) -> RequestError:
    """The 400 for a payload its task's ``input_schema`` refuses: at most ``limit`` faults listed."""
    faults = validator.faults(request.payload, limit)
    # The schema is the declared task's: name that task, and the caller's words only beside it
    # when the Router found the task from them (by mapping or by meaning).
    declared = record.matched_task or request.target_task
    words = request.target_task if len(request.target_task) <= 80 else request.target_task[:77] + "..."
    routed = "" if declared == request.target_task else f", routed from {words!r}"
    fields = ", ".join(f["field"] for f in faults.details)
    if faults.omitted is None:
        more = "; the first fault alone: the payload is too large to list them all"
    else:
        more = f" and {faults.omitted} more" if faults.omitted else ""
    return RequestError(
        f"payload does not match the input_schema of task {declared!r}{routed} ({fields}{more})",
        details=faults.details,
        details_omitted=faults.omitted,
    )


def _decode(body: bytes, max_depth: int, max_details: int) -> tuple[ReachRequest, dict[str, Any]]:
    """The request and its decoded body; RequestError (with what is known of it) if it is bad."""
    try:
        data = jsoncodec.loads(body)
    except jsoncodec.JSONDecodeError as exc:
        raise RequestError(f"body is not valid JSON: {exc.msg}") from exc
    if not isinstance(data, dict):
        raise RequestError("body must be a JSON object (a ReachRequest)")
    if jsoncodec.may_nest_deeper(body, max_depth) and jsoncodec.depth(data, max_depth) > max_depth:
        raise RequestError(
            f"the body nests deeper than {max_depth} levels (server.max_json_depth)",
            details=[{"field": "(body)", "message": f"at most {max_depth} levels of nesting"}],
            trace_id=_safe_trace_id(data.get("traceId")),
        )
    try:
        return ReachRequest.model_validate(data), data
    except ValidationError as exc:
        details = error_details(exc, limit=max_details)
        omitted = exc.error_count() - len(details)
        fields = ", ".join(d["field"] for d in details) + (f" and {omitted} more" if omitted else "")
        raise RequestError(
            f"invalid ReachRequest: {fields}",
            details=details,
            details_omitted=omitted,
            trace_id=_safe_trace_id(data.get("traceId")),
            task=data.get("targetTask"),
        ) from exc


def _safe_trace_id(value: Any) -> str | None:
    return value if is_trace_id(value) else None


def _printable(text: str) -> bool:
    return len(text) <= 256 and text.isprintable()


def _check_timeouts(request: ReachRequest, cap: int) -> None:
    """A caller's timeouts stay within the policy's cap (limits.max_timeout_ms)."""
    prefs = request.preferences
    # Almost every request asks for no timeout of its own: three tests, no dict or list built.
    if prefs.timeout_ms is None and prefs.connect_timeout_ms is None and prefs.read_timeout_ms is None:
        return
    asked = {
        "preferences.timeoutMs": prefs.timeout_ms,
        "preferences.connectTimeoutMs": prefs.connect_timeout_ms,
        "preferences.readTimeoutMs": prefs.read_timeout_ms,
    }
    over = [(field, value) for field, value in asked.items() if value is not None and value > cap]
    if over:
        raise RequestError(
            f"{over[0][0]} of {over[0][1]} ms is over the Router's cap of {cap} ms",
            details=[{"field": field, "message": f"at most {cap} ms"} for field, _ in over],
            trace_id=request.trace_id,
            task=request.target_task,
        )
