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
from typing import Any, NamedTuple

import orjson

from reachmesh.clock import iso_utc
from reachmesh.decision import DecisionRecord
from reachmesh.exceptions import MAX_CANDIDATES_SHOWN
from reachmesh.jsoncodec import fitted


class _Hop(NamedTuple):
    """One hop, frozen into tuples of plain values: cheap to build, invisible to the GC."""

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
    candidates: tuple[str, ...]
    # (agentId, reason, score, the agent's own words: a decline's message, else None)
    rejected: tuple[tuple[str, str, float | None, str | None], ...]
    selected: str | None
    score: float | None
    affinity: str | None
    extra: dict[str, Any] | None  # the rare, nested parts: semantic match, score factors
    attempts: tuple[tuple[str, str, float, str, float, float | None], ...]
    events: tuple[tuple[str, str], ...]
    retries: tuple[str, ...]
    failovers: tuple[str, ...]
    circuit_trips: tuple[str, ...]
    error_code: str | None
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


def _freeze(r: DecisionRecord) -> tuple[Any, ...]:
    """The hop as a plain tuple in `_Hop`'s field order, kept as JSON; `_Hop` wraps it (with
    lists where tuples were) only when the store is queried."""
    return (
        r.trace_id,
        r.started,
        r.started_wall,
        r.task,
        r.source,
        r.matched_task,
        r.status,  # a StrEnum, written as its value
        r.http_status,
        r.handler,
        r.duration_ms,
        r.mode,
        r.conversation_id,
        r.parent_span_id,
        r.rule,
        r.strategy,
        tuple(r.candidates[:_SHOWN]),
        tuple([(c["agentId"], c["reason"], c.get("score"), c.get("message")) for c in r.rejected[:_SHOWN]])
        if r.rejected
        else (),
        r.selected,
        r.score,
        r.affinity,
        {"semantic": r.semantic, "scores": r.explain[:_SHOWN]} if r.semantic or r.explain else None,
        tuple([(a.agent_id, a.outcome, a.duration_ms, a.span_id, a.offset_ms, a.score) for a in r.attempts]),
        tuple(r.events) if r.events else (),
        tuple(r.retries) if r.retries else (),
        tuple(r.failovers) if r.failovers else (),
        tuple(r.circuit_trips) if r.circuit_trips else (),
        r.error_code,
        max(len(r.candidates) - _SHOWN, 0),
        max(len(r.rejected) - _SHOWN, 0),
        r.stream.to_dict() if r.stream is not None else None,
        round(r.queue_wait_ms, 2),
        round(r.pool_wait_ms, 2),
    )


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
        # Each hop is kept as one JSON bytes object, beside its traceId: two objects per
        # hop instead of a dozen tuples. Measured under load, ten thousand hops held as tuples
        # cost the whole Router about 20 us per request (GC off or on: it is the memory they
        # scatter, not the collector), and a store of 100 did not.
        self._ids: deque[str] = deque()
        self._hops: deque[bytes] = deque()
        # traceId -> its one hop, or a list of its hops once a trace has several (most have one:
        # no list is made per request).
        self._by_trace: dict[str, Any] = {}

    def resize(self, size: int, max_bytes: int, max_hop_bytes: int) -> None:
        """New bounds (a reload); a smaller store sheds its oldest hops with the next one kept."""
        self.size, self.max_bytes, self.max_hop_bytes = size, max_bytes, max_hop_bytes

    @property
    def bytes_held(self) -> int:
        """Bytes of the hops held now (the ``reach_trace_store_bytes`` gauge)."""
        return self._bytes

    def _evict_oldest(self) -> None:
        old_id = self._ids.popleft()
        old = self._hops.popleft()
        self._bytes -= len(old)
        index = self._by_trace
        held = index.get(old_id)
        if held is old:
            del index[old_id]
        elif type(held) is list:
            held.remove(old)
            if len(held) == 1:
                index[old_id] = held[0]

    def __call__(self, record: DecisionRecord) -> None:
        size = self.size
        if size <= 0:
            return
        ids = self._ids
        hops = self._hops
        index = self._by_trace
        # Anything orjson cannot write (never expected) is kept as its text rather than losing the hop.
        frozen = _freeze(record)
        # Fitted: orjson's own buffer is at least 4 KiB, and the store counts (and keeps) bytes.
        hop = fitted(orjson.dumps(frozen, default=str, option=orjson.OPT_SERIALIZE_NUMPY))
        if len(hop) > self.max_hop_bytes:
            hop = _slim(frozen, len(hop), self.max_hop_bytes)
            self.slimmed += 1
        while ids and (len(ids) >= size or self._bytes + len(hop) > self.max_bytes):
            if len(ids) < size:
                self.evicted_for_bytes += 1
            self._evict_oldest()
        self._bytes += len(hop)
        trace_id = record.trace_id
        ids.append(trace_id)
        hops.append(hop)
        held = index.get(trace_id)
        if held is None:
            index[trace_id] = hop
        elif type(held) is list:
            held.append(hop)
        else:
            index[trace_id] = [held, hop]

    def __len__(self) -> int:
        return len(self._ids)

    def _stored(self, trace_id: str) -> list[_Hop]:
        held = self._by_trace.get(trace_id)
        if held is None:
            return []
        hops = [_thaw(h) for h in (held if type(held) is list else (held,))]
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
        owner: dict[str, int] = {}  # attempt span id -> hop index
        for i, hop in enumerate(stored):
            for span_id in hop.span_ids:
                owner[span_id] = i
        children: dict[int, list[int]] = {}
        roots: list[int] = []
        for i, hop in enumerate(stored):
            parent = owner.get(hop.parent_span_id or "")
            if parent is None or parent == i:
                roots.append(i)
            else:
                children.setdefault(parent, []).append(i)
                rendered[i]["parentHop"] = parent

        def node(i: int) -> dict[str, Any]:
            hop = rendered[i]
            return {
                "hop": i,
                "task": hop["task"],
                "handler": hop["handlerAgentId"],
                "status": hop["status"],
                "children": [node(c) for c in children.get(i, [])],
            }

        return {"traceId": trace_id, "hops": rendered, "tree": [node(r) for r in roots]}

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
