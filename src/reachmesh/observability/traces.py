"""The trace store: a bounded ring of recent hops, queried by traceId.

One traceId may reach the Router several times (an agent's handler calls another agent through
the Router). Each visit is a *hop*; a hop whose caller's ``traceparent`` names the span of an
attempt of another hop is that attempt's child, so the hops of a trace form one tree.

Each hop is kept as one JSON bytes object and turned back into a `_Hop` only when queried: ten
thousand live decision records, with their lists and dicts, doubled what the garbage collector
scans on every full pass, and even as tuples of plain values they cost every request of a loaded
Router about 20 us through the memory they scatter (measured; not the collector).

The store is bounded in bytes as well as in hops: a hop quotes what callers and agents sent (a
task's free text, an agent's error code, notes), and a count alone once let one agent token grow
the Router by 10 MiB a call. Each hop is cut to ``max_hop_bytes`` (its notes and score details
go first) and the oldest hops leave once ``max_bytes`` would be passed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from typing import Any, NamedTuple

import orjson

from reachmesh.clock import iso_utc
from reachmesh.decision import DecisionRecord
from reachmesh.exceptions import MAX_CANDIDATES_SHOWN
from reachmesh.jsoncodec import fitted


class _Hop(NamedTuple):
    """One hop, frozen into tuples of plain values: cheap to build, invisible to the GC.

    The fields a decision record holds as they are stored come first, in the order
    :data:`_PLAIN` reads them in one call; the ones made from the record follow."""

    trace_id: str
    started: float
    started_wall: float
    task: str
    source: str
    matched_task: str | None
    status: str | None
    http_status: int
    handler: str | None
    duration_ms: float
    mode: str
    conversation_id: str | None
    parent_span_id: str | None
    rule: str | None
    strategy: str | None
    selected: str | None
    score: float | None
    affinity: str | None
    events: tuple[tuple[str, str], ...]
    retries: tuple[str, ...]
    failovers: tuple[str, ...]
    circuit_trips: tuple[str, ...]
    error_code: str | None
    candidates: tuple[str, ...]
    # (agentId, reason, score, the agent's own words: a decline's message, else None)
    rejected: tuple[tuple[str, str, float | None, str | None], ...]
    extra: dict[str, Any] | None  # the rare, nested parts: semantic match, score factors
    attempts: tuple[tuple[str, str, float, str, float, float | None], ...]
    # How many candidates and rejections are not listed (a task may have a thousand agents).
    candidates_omitted: int = 0
    rejected_omitted: int = 0
    # A streamed answer's first-chunk time, chunks, bytes, ending and chunk times (protocol §14).
    stream: dict[str, Any] | None = None
    # Milliseconds the hop waited in the Router: for a slot at a full agent (its max_concurrency),
    # and for a connection of the Router's own pool. Neither is the agent's time.
    slot_wait_ms: float = 0.0
    pool_wait_ms: float = 0.0

    @property
    def span_ids(self) -> tuple[str, ...]:
        return tuple(a[3] for a in self.attempts)

    def summary(self) -> dict[str, Any]:
        return {
            "traceId": self.trace_id,
            "startedAt": iso_utc(self.started_wall),
            "source": self.source,
            "task": self.task,
            "status": self.status,
            "handlerAgentId": self.handler,
            "durationMs": self.duration_ms,
            "attempts": len(self.attempts),
        }

    def to_dict(self) -> dict[str, Any]:
        """Everything recorded about the hop, in wire case."""
        extra = self.extra or {"semantic": None, "scores": []}
        rejected = []
        for agent_id, reason, score, message in self.rejected:
            item: dict[str, Any] = {"agentId": agent_id, "reason": reason}
            if score is not None:
                item["score"] = score
            if message is not None:
                item["message"] = message
            rejected.append(item)
        return {
            **self.summary(),
            "mode": self.mode,
            "httpStatus": self.http_status,
            "conversationId": self.conversation_id,
            "parentSpanId": self.parent_span_id,
            "decision": {
                "rule": self.rule,
                "strategy": self.strategy,
                "matchedTask": self.matched_task,
                "candidates": list(self.candidates),
                "candidatesOmitted": self.candidates_omitted,
                "rejected": rejected,
                "rejectedOmitted": self.rejected_omitted,
                "selected": self.selected,
                "score": self.score,
                "affinity": self.affinity,
                "semantic": extra["semantic"],
                "scores": extra["scores"],
            },
            "attempts": [
                {"agentId": a, "outcome": o, "durationMs": d, "spanId": sp, "offsetMs": off, "score": sc}
                for a, o, d, sp, off, sc in self.attempts
            ],
            "events": [{"kind": kind, "text": text} for kind, text in self.events],
            "retries": list(self.retries),
            "failovers": list(self.failovers),
            "circuitTrips": list(self.circuit_trips),
            "errorCode": self.error_code,
            "stream": self.stream,
            "slotWaitMs": self.slot_wait_ms,
            "poolWaitMs": self.pool_wait_ms,
        }


def _thaw(blob: bytes) -> _Hop:
    return _Hop._make(orjson.loads(blob))


# Each hop lists at most this many candidates, rejections and score breakdowns by name: with a
# thousand agents on a task, each stored hop of a failed call held 146 KB.
_SHOWN = MAX_CANDIDATES_SHOWN


# orjson's options for a hop: a numpy float (a score from the embedder) is written as a number.
_OPTIONS = orjson.OPT_SERIALIZE_NUMPY
_dumps = orjson.dumps
# orjson's own buffer is at least 4 KiB, and the store counts (and keeps) bytes: a hop is kept as
# a fitted copy. Written with a newline, the slice that drops it is that copy, for less than a
# memoryview and its tobytes() (about 0.1 us a hop).
_FITTED = _OPTIONS | orjson.OPT_APPEND_NEWLINE


def _freeze(r: DecisionRecord) -> tuple[Any, ...]:
    """The hop as a plain tuple in `_Hop`'s field order, kept as JSON; `_Hop` wraps it (with
    lists where tuples were) only when the store is queried.

    One tuple display of plain attribute reads: an ``attrgetter`` of the 23 stored fields took
    twice as long (it reads each name through the generic lookup; the interpreter's reads are
    specialised). The record's own lists (notes, candidates) are held until the hop is written."""
    candidates = r.candidates
    shown = len(candidates)
    rejected = r.rejected
    queue_wait = r.queue_wait_ms
    pool_wait = r.pool_wait_ms
    attempts = r.attempts
    tried: Sequence[tuple[Any, ...]]  # the same JSON either way
    if len(attempts) == 1:  # most requests: without a comprehension's frame, nor a list
        a = attempts[0]
        tried = ((a.agent_id, a.outcome, a.duration_ms, a.span_id, a.offset_ms, a.score),)
    else:
        tried = [(a.agent_id, a.outcome, a.duration_ms, a.span_id, a.offset_ms, a.score) for a in attempts]
    # Two displays joined: CPython builds one of over 30 items as a list (appends, resizes), then a tuple.
    stored = (
        r.trace_id,
        r.started,
        r.started_wall,
        r.task,
        r.source,
        r.matched_task,
        r.status,  # a StrEnum: written as its value
        r.http_status,
        r.handler,
        r.duration_ms,
        r.mode,
        r.conversation_id,
        r.parent_span_id,
        r.rule,
        r.strategy,
        r.selected,
        r.score,
        r.affinity,
        r.events,
        r.retries,
        r.failovers,
        r.circuit_trips,
        r.error_code,
    )
    made = (
        candidates if shown <= _SHOWN else candidates[:_SHOWN],
        [(c["agentId"], c["reason"], c.get("score"), c.get("message")) for c in rejected[:_SHOWN]]
        if rejected
        else (),
        {"semantic": r.semantic, "scores": r.explain[:_SHOWN]} if r.semantic or r.explain else None,
        tried,
        0 if shown <= _SHOWN else shown - _SHOWN,
        len(rejected) - _SHOWN if rejected and len(rejected) > _SHOWN else 0,
        None if r.stream is None else r.stream.to_dict(),
        # round() to digits goes through decimal text (about 0.4 us a call); most waits are 0.
        round(queue_wait, 2) if queue_wait else queue_wait,
        round(pool_wait, 2) if pool_wait else pool_wait,
    )
    return stored + made


# What a hop over ``max_hop_bytes`` keeps of each text field, once its notes and details are gone.
_SLIM_CHARS = 256
# The fields of a frozen hop that hold free text (task, source, matched task, error code...).
_TEXT_FIELDS = tuple(
    _Hop._fields.index(name)
    for name in (
        "task",
        "source",
        "matched_task",
        "status",
        "handler",
        "mode",
        "conversation_id",
        "parent_span_id",
        "rule",
        "strategy",
        "selected",
        "affinity",
        "error_code",
    )
)


def _slim(frozen: tuple[Any, ...], size: int, limit: int) -> bytes:
    """A hop of ``size`` bytes, over ``limit``, without its notes and score details, its text
    fields cut: what the trace view needs to show that a request happened and how it ended."""
    fields = list(frozen)
    names = _Hop._fields
    for i in _TEXT_FIELDS:
        if isinstance(fields[i], str) and len(fields[i]) > _SLIM_CHARS:
            fields[i] = fields[i][:_SLIM_CHARS] + "…"
    fields[names.index("extra")] = None
    fields[names.index("events")] = (
        ("trace", f"notes and score details left out: the hop was {size} bytes, over {limit}"),
    )
    fields[names.index("candidates")] = fields[names.index("candidates")][:3]
    fields[names.index("rejected")] = tuple(
        (str(a)[:_SLIM_CHARS], str(r)[:64], sc, None if m is None else str(m)[:_SLIM_CHARS])
        for a, r, sc, m in fields[names.index("rejected")][:3]
    )
    return fitted(orjson.dumps(tuple(fields), default=str, option=orjson.OPT_SERIALIZE_NUMPY))


# Levels of nesting a trace's tree shows. A caller who learns an attempt's span (an agent is sent
# it in ``traceparent``) can name it as the parent of its next call, whatever X-Reach-Hops says,
# and so chain thousands of hops under one traceId: nested that deep, the answer passed orjson's
# recursion limit and ``GET /admin/traces/{traceId}`` failed with a bare 500. Calls through
# Routers nest at most MAX_HOPS (8) deep, so real traces are far inside this.
MAX_TREE_DEPTH = 32


def _forest(stored: Sequence[_Hop]) -> tuple[list[int], dict[int, list[int]]]:
    """The roots and each hop's children: a hop is the child of the hop whose attempt its
    ``traceparent`` names; one that would sit deeper than ``MAX_TREE_DEPTH`` (or in a loop of
    parents) is a root, its ``parentSpanId`` still saying whose it is."""
    owner: dict[str, int] = {}  # attempt span id -> hop index
    for i, hop in enumerate(stored):
        for span_id in hop.span_ids:
            owner[span_id] = i
    parent_of: dict[int, int] = {}
    below: dict[int, list[int]] = {}
    for i, hop in enumerate(stored):
        parent = owner.get(hop.parent_span_id or "")
        if parent is not None and parent != i:
            parent_of[i] = parent
            below.setdefault(parent, []).append(i)
    roots = [i for i in range(len(stored)) if i not in parent_of]
    children: dict[int, list[int]] = {}
    placed: set[int] = set()
    queue = [(r, 0) for r in roots]
    while queue or len(placed) < len(stored):
        if not queue:  # only hops in a loop of parents are left: the first of them is a root
            loose = next(i for i in range(len(stored)) if i not in placed)
            roots.append(loose)
            queue.append((loose, 0))
        i, depth = queue.pop()
        placed.add(i)
        for kid in below.get(i, []):
            if kid in placed:  # a loop of parents, entered at another of its hops
                continue
            if depth + 1 >= MAX_TREE_DEPTH:
                roots.append(kid)
                queue.append((kid, 0))
            else:
                children.setdefault(i, []).append(kid)
                queue.append((kid, depth + 1))
    roots.sort()
    return roots, children


class TraceStore:
    """Keeps the last ``size`` hops, in at most ``max_bytes``; memory is fixed whatever the traffic."""

    def __init__(
        self, size: int = 10_000, *, max_bytes: int = 64 * 1024 * 1024, max_hop_bytes: int = 64 * 1024
    ) -> None:
        self.size = size
        self.max_bytes = max_bytes
        self.max_hop_bytes = max_hop_bytes
        self._bytes = 0
        # Hops cut to max_hop_bytes, and hops dropped early to keep within max_bytes.
        self.slimmed = 0
        self.evicted_for_bytes = 0
        # Each hop is kept as one JSON bytes object and nothing else. Measured under load, ten
        # thousand hops held as tuples cost the whole Router about 20 us per request (GC off or
        # on: it is the memory they scatter, not the collector), and a store of 100 did not.
        # The traceId is not kept beside its hop either: a deque slot and an index entry per hop
        # were upkeep on every request (evicting one hop ran 40 bytecodes), for lookups only an
        # admin makes; a lookup reads through the held hops instead (about 1 ms for 10,000).
        self._hops: deque[bytes] = deque()

    def resize(self, size: int, max_bytes: int, max_hop_bytes: int) -> None:
        """New bounds (a reload); a smaller store sheds its oldest hops with the next one kept."""
        self.size, self.max_bytes, self.max_hop_bytes = size, max_bytes, max_hop_bytes

    @property
    def bytes_held(self) -> int:
        """Bytes of the hops held now (the ``reach_trace_store_bytes`` gauge)."""
        return self._bytes

    def __call__(self, record: DecisionRecord) -> None:
        """Keep ``record``'s hop: :meth:`_built` for one record, written out (a turn's only record,
        as under light load, builds no list), then :meth:`_keep`."""
        if self.size <= 0:
            return  # a store that keeps nothing: no hop to build
        frozen = _freeze(record)
        hop = _dumps(frozen, str, _FITTED)[:-1]
        if len(hop) > self.max_hop_bytes:
            hop = _slim(frozen, len(hop), self.max_hop_bytes)
            self.slimmed += 1
        self._keep(hop)

    def observe_all(self, records: Iterable[DecisionRecord], failed: Callable[[Any], None]) -> None:
        """Keep each record's hop, in order, exactly as one call per record would.

        The end of the loop's turn hands over every record of the turn at once (about 16 under
        load at c32, see :class:`~reachmesh.decision.ObserveAfterTurn`). A record whose hop cannot
        be built is reported to ``failed``, from inside its ``except`` block, and the others are
        still kept."""
        if self.size <= 0:
            return  # a store that keeps nothing: no hop to build
        built = self._built(records, failed)
        if len(built) <= 1:  # the turn's only hop (or none): no bookkeeping to share
            if built:
                self._keep(built[0])
            return
        hops = self._hops
        incoming = sum(map(len, built))
        leaving = len(hops) + len(built) - self.size
        if self._bytes + incoming <= self.max_bytes and leaving <= len(hops):
            # Within the byte bound even if no hop left: one hop at a time would have dropped
            # just the oldest ``leaving`` for the count, and none for the bytes.
            if leaving > 0:
                self._bytes -= sum(map(len, islice(hops, leaving)))
                for _ in range(leaving):
                    hops.popleft()
            hops.extend(built)
            self._bytes += incoming
            return
        for hop in built:  # near a bound: hop by hop
            self._keep(hop)

    def _built(self, records: Iterable[DecisionRecord], failed: Callable[[Any], None]) -> list[bytes]:
        """Each record's hop as its JSON, cut to ``max_hop_bytes`` (:func:`_slim`) where over."""
        limit = self.max_hop_bytes
        built = []
        for record in records:
            try:
                frozen = _freeze(record)
                # Fitted (_FITTED). Anything orjson cannot write (never expected) is kept as its
                # text rather than losing the hop.
                hop = _dumps(frozen, str, _FITTED)[:-1]
                if len(hop) > limit:
                    hop = _slim(frozen, len(hop), limit)
                    self.slimmed += 1
                built.append(hop)
            except Exception:  # noqa: BLE001 - one record's bug must not cost the others their hops
                failed(self)
        return built

    def _keep(self, hop: bytes) -> None:
        """Keep ``hop``: the oldest hops leave as the bounds of count and bytes require."""
        hops = self._hops
        size = len(hop)
        held = self._bytes
        if len(hops) >= self.size:
            # A full store, the steady state: the oldest hop leaves for this one.
            held -= len(hops.popleft())
        if held + size > self.max_bytes or len(hops) >= self.size:
            self._bytes = held
            self._make_room(size)
            held = self._bytes
        self._bytes = held + size
        hops.append(hop)

    def _make_room(self, incoming: int) -> None:
        """Drop the oldest hops until one more of ``incoming`` bytes fits both bounds."""
        hops = self._hops
        while hops and (len(hops) >= self.size or self._bytes + incoming > self.max_bytes):
            if len(hops) < self.size:
                self.evicted_for_bytes += 1
            self._bytes -= len(hops.popleft())

    def __len__(self) -> int:
        return len(self._hops)

    def _stored(self, trace_id: str) -> list[_Hop]:
        # Every hop's JSON starts with its traceId as orjson writes it: ``["<traceId>",``.
        prefix = orjson.dumps([trace_id])[:-1] + b","
        hops = [_thaw(h) for h in self._hops if h.startswith(prefix)]
        return sorted(hops, key=lambda h: h.started)

    def hops(self, trace_id: str) -> list[dict[str, Any]]:
        """The hops of one trace, oldest first, as dicts."""
        return [h.to_dict() for h in self._stored(trace_id)]

    def trace(self, trace_id: str) -> dict[str, Any] | None:
        """``{"traceId", "hops": [...], "tree": [...]}``, or None for an unknown traceId."""
        stored = self._stored(trace_id)
        if not stored:
            return None
        rendered = []
        for i, hop in enumerate(stored):
            body = hop.to_dict()
            body["hop"] = i
            rendered.append(body)
        roots, children = _forest(stored)
        for parent, kids in children.items():
            for i in kids:
                rendered[i]["parentHop"] = parent
        nodes = [
            {"hop": i, "task": h["task"], "handler": h["handlerAgentId"], "status": h["status"]}
            for i, h in enumerate(rendered)
        ]
        for i, node in enumerate(nodes):
            node["children"] = [nodes[kid] for kid in children.get(i, [])]
        return {"traceId": trace_id, "hops": rendered, "tree": [nodes[r] for r in roots]}

    def recent(
        self, *, task: str | None = None, status: str | None = None, limit: int = 50
    ) -> list[dict[str, Any]]:
        """Summaries of the newest hops, filtered by task and status."""
        found: list[dict[str, Any]] = []
        for raw in reversed(self._hops):
            hop = _thaw(raw)
            if task is not None and hop.task != task and hop.matched_task != task:
                continue
            if status is not None and hop.status != status:
                continue
            found.append(hop.summary())
            if len(found) >= limit:
                break
        return found
