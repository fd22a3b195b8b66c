"""The trace store: a bounded ring of recent decision records, queried by traceId.

One traceId may reach the Router several times (an agent's handler calls another agent through
the Router). Each visit is a *hop*; a hop whose caller's ``traceparent`` names the span of an
attempt of another hop is that attempt's child, so the hops of a trace form one tree.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from agent_reach.clock import iso_utc
from agent_reach.observability.record import DecisionRecord


class TraceStore:
    """Keeps the last ``size`` records (hops); memory is fixed whatever the traffic."""

    def __init__(self, size: int = 10_000) -> None:
        self.size = size
        self._ring: deque[DecisionRecord] = deque()
        self._by_trace: dict[str, list[DecisionRecord]] = {}

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
        self._ring.append(record)
        self._by_trace.setdefault(record.trace_id, []).append(record)

    def __len__(self) -> int:
        return len(self._ring)

    def hops(self, trace_id: str) -> list[DecisionRecord]:
        return list(self._by_trace.get(trace_id, ()))

    def trace(self, trace_id: str) -> dict[str, Any] | None:
        """``{"traceId", "hops": [...], "tree": [...]}``, or None for an unknown traceId."""
        hops = sorted(self._by_trace.get(trace_id, ()), key=lambda r: r.started)
        if not hops:
            return None
        rendered = [hop_dict(i, hop) for i, hop in enumerate(hops)]
        owner: dict[str, int] = {}  # attempt span id -> hop index
        for i, hop in enumerate(hops):
            for attempt in hop.attempts:
                owner[attempt.span_id] = i
        children: dict[int, list[int]] = {}
        roots: list[int] = []
        for i, hop in enumerate(hops):
            parent = owner.get(hop.parent_span_id or "")
            if parent is None or parent == i:
                roots.append(i)
            else:
                children.setdefault(parent, []).append(i)
                rendered[i]["parentHop"] = parent

        def node(i: int) -> dict[str, Any]:
            hop = hops[i]
            return {
                "hop": i,
                "task": hop.task,
                "handler": hop.handler,
                "status": hop.status.value if hop.status else None,
                "children": [node(c) for c in children.get(i, [])],
            }

        return {"traceId": trace_id, "hops": rendered, "tree": [node(r) for r in roots]}

    def recent(
        self, *, task: str | None = None, status: str | None = None, limit: int = 50
    ) -> list[dict[str, Any]]:
        """Summaries of the newest hops, filtered by task and status."""
        found: list[dict[str, Any]] = []
        for record in reversed(self._ring):
            if task is not None and record.task != task and record.matched_task != task:
                continue
            if status is not None and (record.status is None or record.status.value != status):
                continue
            found.append(summary(record))
            if len(found) >= limit:
                break
        return found


def summary(record: DecisionRecord) -> dict[str, Any]:
    return {
        "traceId": record.trace_id,
        "startedAt": iso_utc(record.started_wall),
        "source": record.source,
        "task": record.task,
        "status": record.status.value if record.status else None,
        "handlerAgentId": record.handler,
        "durationMs": record.duration_ms,
        "attempts": len(record.attempts),
    }


def hop_dict(index: int, record: DecisionRecord) -> dict[str, Any]:
    """Everything recorded about one hop, in wire case."""
    return {
        "hop": index,
        **summary(record),
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
