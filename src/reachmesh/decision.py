"""The decision record: one per request, written by the pipeline, read by every observer.

The pipeline stages never log or count on their own. They write here, and observers (the trace
log, metrics, the trace store) read the finished record, so adding an observer never touches the
pipeline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from reachmesh.protocol import Status
from reachmesh.redaction import loggable

# An agent's reason for declining, as listed among the candidates: enough for a sentence.
DECLINE_MESSAGE_CHARS = 256


@dataclass(slots=True)
class AttemptRecord:
    """One upstream attempt."""

    agent_id: str
    outcome: str  # SUCCESS, or the reason it failed (connect_error, timeout, agent_error)
    duration_ms: float
    span_id: str = ""  # the W3C span id sent to the agent in `traceparent`
    offset_ms: float = 0.0  # when the attempt started, from the start of the request
    score: float | None = None

    def to_wire(self) -> dict[str, Any]:
        return {"agentId": self.agent_id, "outcome": self.outcome, "durationMs": self.duration_ms}


# The chunk times a trace keeps for its waterfall: enough to see a stream's rhythm.
MAX_CHUNK_MARKS = 200


@dataclass(slots=True)
class StreamRecord:
    """What a streamed answer did: when its first chunk left, how much followed, how it ended."""

    first_chunk_ms: float | None = None  # from the start of the request
    chunks: int = 0
    bytes: int = 0  # the chunks' JSON bytes relayed to the caller
    # done (the agent's done), plain (a JSON answer relayed as one chunk), broken, timeout,
    # agent_error, caller_gone; None while it runs.
    ended: str | None = None
    marks_ms: list[float] = field(default_factory=list)  # the first chunks' times, for the waterfall
    # The last chunk's time, kept past MAX_CHUNK_MARKS: the waterfall shows where a long stream
    # ended without holding a time per chunk.
    last_chunk_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "firstChunkMs": self.first_chunk_ms,
            "lastChunkMs": self.last_chunk_ms,
            "chunks": self.chunks,
            "bytes": self.bytes,
            "ended": self.ended,
            "marksMs": list(self.marks_ms),
        }


@dataclass(init=False)
class DecisionRecord:
    """Everything decided about one request, in order.

    Built on every call, so its ``__init__`` is written by hand: it sets the fields a request
    starts with and a new list or dict for each that grows, and leaves every other field to its
    default on the class (about fifty fields set one by one were the costliest constructor on
    the hot path). Without slots for the same reason: a slot has no class default."""

    trace_id: str
    task: str
    source: str
    started: float  # monotonic
    conversation_id: str | None = None
    # Who sent it: the principal's key ("-" while auth is off). Route learning matches a retry
    # to a refusal only from the same caller.
    caller: str = "-"
    # Whom the per-client limits count it against: the caller's key, or its address with auth off
    # ("-": not known). A full agent's queue takes turns between clients by it.
    client: str = "-"
    # An agent token's task globs (empty for any other role): it never confirms a route to them.
    caller_serves: tuple[str, ...] = ()
    # The tasks the caller's token may reach by meaning or by a learned route (auth.tokens).
    reach_tasks: tuple[str, ...] = ("*",)
    # The request chose its own candidates (filterAgentIds, targetAgent): its declines teach nothing.
    narrowed: bool = False
    started_wall: float = 0.0  # epoch seconds, for display
    parent_span_id: str | None = None  # from the caller's traceparent: links hops into a tree
    matched_task: str | None = None  # the declared task that supplied candidates (safe as a label)
    mode: str = "sync"
    # Sent to the agent as X-Reach-Idempotency-Key on every attempt: the same on every run of
    # an async request, so a run again after its Router died is known for what it is.
    idempotency_key: str | None = None
    affinity: str | None = None  # the agent the conversation was bound to, when one was
    rule: str | None = None  # what picked the pool: target_agent or the strategy
    # How the task that ran was chosen, as the answer's `route.by` says it: exact, task_map,
    # learned or meaning (None: routing never got as far as a task).
    route_by: str | None = None
    strategy: str | None = None
    candidates: list[str] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    selected: str | None = None
    score: float | None = None
    attempts: list[AttemptRecord] = field(default_factory=list)
    # Ordered (kind, text) notes beyond the four fixed lines: retry, failover, no handler...
    events: list[tuple[str, str]] = field(default_factory=list)
    retries: list[str] = field(default_factory=list)  # reasons of same-agent retries
    failovers: list[str] = field(default_factory=list)  # reasons of failovers
    circuit_trips: list[str] = field(default_factory=list)  # agents whose breaker opened
    explain: list[dict[str, Any]] = field(default_factory=list)  # per-candidate score factors
    semantic: dict[str, Any] | None = None  # the semantic match: score, runner-up, threshold, best
    semantic_refused: bool = False
    # Agents of a task by meaning kept off this text by their own declines or limits, by task
    # (the task itself stays while another live agent of it has neither).
    agents_set_aside: dict[str, dict[str, tuple[str, str | None]]] = field(default_factory=dict)
    # (agent, task) of each decline: the learner turns the ones on a route by meaning into
    # learned negatives.
    declines: list[tuple[str, str]] = field(default_factory=list)
    payload: Any = None  # only kept when payload logging is switched on
    status: Status | None = None
    http_status: int = 0
    error_code: str | None = None
    error: dict[str, Any] | None = None  # the response's error object, as the caller gets it
    result: Any = None  # the handler's result, on SUCCESS
    handler: str | None = None
    duration_ms: float = 0.0
    queue_wait_ms: float = 0.0  # time spent waiting for a slot at a full agent (capacity)
    pool_wait_ms: float = 0.0  # time spent waiting for a connection of the Router's own pool
    # Agents a call waited for and was then not sent to: too little of its deadline was left
    # for the agent's usual answer time (a tuple on the class: nothing made per request).
    not_sent: tuple[str, ...] = ()
    stream: StreamRecord | None = None  # set when the caller asked for a stream

    def __init__(  # noqa: PLR0913 - the fields a request starts with, one keyword each
        self,
        trace_id: str,
        task: str,
        source: str,
        started: float,
        *,
        conversation_id: str | None = None,
        caller: str = "-",
        client: str = "-",
        caller_serves: tuple[str, ...] = (),
        reach_tasks: tuple[str, ...] = ("*",),
        started_wall: float = 0.0,
        parent_span_id: str | None = None,
        mode: str = "sync",
        **others: Any,
    ) -> None:
        self.trace_id = trace_id
        self.task = task
        self.source = source
        self.started = started
        self.conversation_id = conversation_id
        self.caller = caller
        self.client = client
        self.caller_serves = caller_serves
        self.reach_tasks = reach_tasks
        self.started_wall = started_wall
        self.parent_span_id = parent_span_id
        self.mode = mode
        self.candidates: list[str] = []
        self.rejected: list[dict[str, Any]] = []
        self.attempts: list[AttemptRecord] = []
        self.events: list[tuple[str, str]] = []
        self.retries: list[str] = []
        self.failovers: list[str] = []
        self.circuit_trips: list[str] = []
        self.explain: list[dict[str, Any]] = []
        self.agents_set_aside: dict[str, dict[str, tuple[str, str | None]]] = {}
        self.declines: list[tuple[str, str]] = []
        if others:
            self._set(others)

    def _set(self, others: dict[str, Any]) -> None:
        """The other fields given at construction, by name, as the generated ``__init__`` took them."""
        for name, value in others.items():
            if name not in _FIELDS:
                raise TypeError(f"DecisionRecord has no field {name!r}")
            setattr(self, name, value)

    def note(self, kind: str, text: str) -> None:
        """Add an ordered event line, e.g. ``note("retry", "price-agent, attempt=2")``.

        The text often quotes a caller or an agent (a refused payload key, an agent's error), and
        it reaches the log, the trace store and ``reach trace``: its control characters are
        escaped here, once, for all of them."""
        # loggable()'s own first test, here: almost every note is printable and short.
        if not (text.isprintable() and len(text) <= 2048):
            text = loggable(text, 2048)
        self.events.append((kind, text))

    def reject(
        self,
        agent_id: str,
        reason: str,
        score: float | None = None,
        task: str | None = None,
        limit: str | None = None,
        message: str | None = None,
    ) -> None:
        """Record a candidate that will not handle the request, why, and for which task (and
        the declared limit the text hit, for ``declared_limit``; the agent's own words, for a
        ``declined``, cut to DECLINE_MESSAGE_CHARS: up to 20 candidates are listed per answer)."""
        item: dict[str, Any] = {"agentId": agent_id, "reason": reason}
        if task is not None:
            item["task"] = task
        if score is not None:
            item["score"] = score
        if limit is not None:
            item["limit"] = limit
        if message:
            item["message"] = message[:DECLINE_MESSAGE_CHARS]
        self.rejected.append(item)


Observer = Callable[[DecisionRecord], None]


class ObserveAfterTurn:
    """Records observed together at the end of the event loop's turn, each observer over all of
    them in turn (the trace line of each, then the metrics of each, then the store...).

    For records whose answer is already written (the /reach lane's): measured with the Routers
    under wrk sharing one core (``bench/observers.py --wrk``), the store and the metrics cost
    the Router 32-37 us of CPU per request observed at each answer, and 6-24 us observed this
    way, each observer's code and data likely still in the CPU's caches from the record before;
    one record through every observer, then the next, saved nothing. Nothing waits
    longer than the turn, nothing is reordered, and an observer's bug costs neither the other
    observers nor the other records theirs. Outside a running loop a record is observed at once.
    (A loop closed with a turn still due, never the case under asyncio.run or uvicorn, drops
    those records, as it drops any callback it was given.)"""

    __slots__ = ("_loop", "_observers", "_on_error", "_pending", "_plan", "_planned")

    def __init__(self, observers: list[Observer], on_error: Callable[[Observer], None]) -> None:
        self._observers = observers  # the owner's list, read at each turn
        self._on_error = on_error  # called inside the ``except`` block: it may log the exception
        self._pending: list[DecisionRecord] = []
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop a run is due on
        # The observers the plan was made for (a copy, compared at each run: the owner may add
        # one), and each with its ``observe_all`` or None, looked up once.
        self._planned: list[Observer] = []
        self._plan: list[tuple[Observer, Callable[..., None] | None]] = []

    def __call__(self, record: DecisionRecord) -> None:
        pending = self._pending
        pending.append(record)
        if len(pending) > 1 and self._loop is not None and not self._loop.is_closed():
            return  # a run is already due at the end of this turn
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            self.run()
            return
        self._loop.call_soon(self.run)

    def on_loop(self, record: DecisionRecord, loop: asyncio.AbstractEventLoop) -> None:
        """:meth:`__call__` from code running on ``loop`` that holds it (the /reach lane): the
        same, without asking asyncio for the running loop, which costs a getpid() system call
        on every ask (CPython 3.11 checks for a fork)."""
        pending = self._pending
        pending.append(record)
        due = self._loop
        if len(pending) > 1 and due is not None and not due.is_closed():
            return  # a run is already due at the end of this turn
        self._loop = loop
        loop.call_soon(self.run)

    def run(self) -> None:
        """Observe every pending record now (the end of the turn, or a caller that must see them).

        An observer with an ``observe_all(records, failed)`` method (the store, the metrics, the
        trace lines) is handed the turn's records in one call: it reads its own state once for
        them all, and reports a record that fails to ``failed`` itself, inside its ``except``
        block, keeping the others'. Any other observer is called once per record."""
        self._loop = None
        pending, self._pending = self._pending, []
        on_error = self._on_error
        if len(pending) == 1:  # the turn's only record, as under light load: one call each
            record = pending[0]
            for observer in self._observers:
                try:
                    observer(record)
                except Exception:  # noqa: BLE001 - an observer's bug must never cost the others theirs
                    on_error(observer)
            return
        plan = self._plan
        if self._planned != self._observers:  # the first run, or an observer added since
            plan = self._replan()
        for observer, batch in plan:
            if batch is not None:
                try:
                    batch(pending, on_error)
                except Exception:  # noqa: BLE001 - its bug must never cost the other observers theirs
                    on_error(observer)
                continue
            for record in pending:
                try:
                    observer(record)
                except Exception:  # noqa: BLE001 - an observer's bug must never cost the others theirs
                    on_error(observer)

    def _replan(self) -> list[tuple[Observer, Callable[..., None] | None]]:
        """Each observer with its ``observe_all`` (or None), for the owner's list as it is now."""
        self._planned = list(self._observers)
        self._plan = [(observer, getattr(observer, "observe_all", None)) for observer in self._planned]
        return self._plan


_FIELDS = frozenset(DecisionRecord.__dataclass_fields__)
