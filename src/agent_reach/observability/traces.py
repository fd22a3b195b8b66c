"""The trace store: a bounded ring of recent hops, queried by traceId.

One traceId may reach the Router several times (an agent's handler calls another agent through
the Router). Each visit is a *hop*; a hop whose caller's ``traceparent`` names the span of an
attempt of another hop is that attempt's child, so the hops of a trace form one tree.

Hops are kept compact: a tuple of strings and the hop already encoded as JSON bytes. Ten
thousand live decision records (with their lists and dicts) doubled what the garbage collector
scans on every full pass; bytes and string tuples are not tracked at all.
"""

from __future__ import annotations

from collections import deque
from typing import Any, NamedTuple

import orjson

from agent_reach.clock import iso_utc
from agent_reach.observability.record import DecisionRecord


class _Hop(NamedTuple):
    trace_id: str
    started: float
    task: str
    matched_task: str | None
    status: str | None
    parent_span_id: str | None
    span_ids: tuple[str, ...]
    blob: bytes


class TraceStore:
    """Keeps the last ``size`` hops; memory is fixed whatever the traffic."""

    def __init__(self, size: int = 10_000) -> None:
        self.size = size
        self._ring: deque[_Hop] = deque()
        self._by_trace: dict[str, list[_Hop]] = {}

    def __call__(self, record: DecisionRecord) -> None:
        if self.size <= 0:
            return
        while len(self._ring) >= self.size:
            old = self._ring.popleft()
            hops = self._by_trace.get(old.trace_id)
            if hops is not None:
                hops.remove(old)
                if not hops:
                    del self._by_trace[old.trace_id]
        hop = _Hop(
            record.trace_id,
            record.started,
            record.task,
            record.matched_task,
            record.status.value if record.status else None,
            record.parent_span_id,
            tuple(a.span_id for a in record.attempts),
            orjson.dumps(hop_dict(record)),
        )
        self._ring.append(hop)
        self._by_trace.setdefault(record.trace_id, []).append(hop)

    def __len__(self) -> int:
        return len(self._ring)

    def hops(self, trace_id: str) -> list[dict[str, Any]]:
        """The hops of one trace, oldest first, as dicts."""
        return [
            orjson.loads(h.blob) for h in sorted(self._by_trace.get(trace_id, ()), key=lambda h: h.started)
        ]

    def trace(self, trace_id: str) -> dict[str, Any] | None:
        """``{"traceId", "hops": [...], "tree": [...]}``, or None for an unknown traceId."""
        stored = sorted(self._by_trace.get(trace_id, ()), key=lambda h: h.started)
        if not stored:
            return None
        rendered = []
        for i, hop in enumerate(stored):
            body = orjson.loads(hop.blob)
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
        for hop in reversed(self._ring):
            if task is not None and hop.task != task and hop.matched_task != task:
                continue
            if status is not None and hop.status != status:
                continue
            body = orjson.loads(hop.blob)
            summary = {key: body[key] for key in _SUMMARY}
            summary["attempts"] = len(body["attempts"])
            found.append(summary)
            if len(found) >= limit:
                break
        return found


_SUMMARY = ("traceId", "startedAt", "source", "task", "status", "handlerAgentId", "durationMs", "attempts")


def hop_dict(record: DecisionRecord) -> dict[str, Any]:
    """Everything recorded about one hop, in wire case."""
    return {
        "traceId": record.trace_id,
        "startedAt": iso_utc(record.started_wall),
        "source": record.source,
        "task": record.task,
        "status": record.status.value if record.status else None,
        "handlerAgentId": record.handler,
        "durationMs": record.duration_ms,
        "mode": record.mode,
        "httpStatus": record.http_status,
        "conversationId": record.conversation_id,
        "parentSpanId": record.parent_span_id,
        "decision": {
            "rule": record.rule,
            "strategy": record.strategy,
            "matchedTask": record.matched_task,
            "candidates": record.candidates,
            "rejected": record.rejected,
            "selected": record.selected,
            "score": record.score,
            "affinity": record.affinity,
            "semantic": record.semantic,
            "scores": record.explain,
        },
        "attempts": [
            {
                "agentId": a.agent_id,
                "outcome": a.outcome,
                "durationMs": a.duration_ms,
                "spanId": a.span_id,
                "offsetMs": a.offset_ms,
                "score": a.score,
            }
            for a in record.attempts
        ],
        "events": [{"kind": kind, "text": text} for kind, text in record.events],
        "retries": record.retries,
        "failovers": record.failovers,
        "circuitTrips": record.circuit_trips,
        "errorCode": record.error_code,
    }
