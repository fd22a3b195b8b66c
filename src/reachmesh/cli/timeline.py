"""Render a trace from ``GET /admin/traces/{traceId}`` as a terminal timeline (``reach trace``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.markup import escape
from rich.text import Text
from rich.tree import Tree

from reachmesh.protocol import Candidate, CandidateReason
from reachmesh.redaction import loggable

_STYLE = {"SUCCESS": "green", "TIMEOUT": "yellow", "ACCEPTED": "cyan"}


def _status(status: str | None) -> str:
    style = _STYLE.get(status or "", "red")
    return f"[{style}]{status}[/]"


def _safe(value: object) -> str:
    """Text from the trace for markup: control characters escaped, and rich's own markup too, since
    a task or source name is the caller's text (``[link=...]`` must print as it is)."""
    return escape(loggable(value, 1024))


def _hop_label(hop: dict[str, Any]) -> str:
    handler = _safe(hop.get("handlerAgentId") or "-")
    return (
        f"hop {hop['hop']}  [bold]{_safe(hop.get('source'))} -> {_safe(hop.get('task'))}[/]  "
        f"{_status(_safe(hop.get('status')))}"
        f"  handler={handler}  {hop.get('durationMs', 0):.1f}ms  at {_safe(hop.get('startedAt'))}"
    )


def _waited(hop: dict[str, Any]) -> str:
    """The hop's time in the Router's queues ("" when it waited for nothing): never the agent's."""
    parts = []
    for key, what in (("slotWaitMs", "a slot at a full agent"), ("poolWaitMs", "a pooled connection")):
        value = hop.get(key)
        if isinstance(value, (int, float)) and value > 0:
            parts.append(f"{value:.1f}ms for {what}")
    return "waited in the Router: " + ", ".join(parts) if parts else ""


def _add_decision(branch: Tree, hop: dict[str, Any]) -> dict[str, Any]:
    """The hop's choice and its waits in the Router, under its line; its decision."""
    decision: dict[str, Any] = hop.get("decision") or {}
    if decision.get("candidates"):
        branch.add(Text(f"candidates: {', '.join(decision['candidates'])}"))
    if decision.get("selected"):
        score = decision.get("score")
        extra = f" (score={score:.2f})" if isinstance(score, (int, float)) else ""
        branch.add(Text(f"select {decision['selected']} by {decision.get('rule')}{extra}"))
    if decision.get("affinity"):
        branch.add(Text(f"conversation bound to {decision['affinity']}"))
    waited = _waited(hop)
    if waited:
        branch.add(Text(waited, style="yellow"))
    return decision


def _add_hop(
    parent: Tree, hop: dict[str, Any], hops: list[dict[str, Any]], children: dict[int, list[int]]
) -> None:
    branch = parent.add(_hop_label(hop))
    decision = _add_decision(branch, hop)
    spawned: dict[str, list[int]] = {}
    for child in children.get(hop["hop"], []):
        spawned.setdefault(hops[child].get("parentSpanId") or "", []).append(child)
    # Events are in order; each "forward" event is one attempt, drawn with the hops it caused.
    attempts = iter(hop.get("attempts", []))
    for event in hop.get("events", []):
        if event.get("kind") != "forward":
            branch.add(Text(loggable(f"{event.get('kind')}: {event.get('text')}", 4096), style="dim"))
            continue
        attempt = next(attempts, None)
        if attempt is None:
            continue
        outcome = attempt.get("outcome")
        style = "green" if outcome == "SUCCESS" else "red"
        node = branch.add(
            f"+{attempt.get('offsetMs', 0):.1f}ms  attempt -> {_safe(attempt.get('agentId'))}  "
            f"[{style}]{outcome}[/]  {attempt.get('durationMs', 0):.1f}ms"
        )
        for child in spawned.get(attempt.get("spanId") or "", []):
            _add_hop(node, hops[child], hops, children)
    for rejected in decision.get("rejected") or []:
        said = rejected.get("message")
        # A decline's reason is the agent's own message: the one thing an operator wants here.
        why = f'{rejected.get("reason")}: "{said}"' if isinstance(said, str) else rejected.get("reason")
        branch.add(Text(loggable(f"not used: {rejected.get('agentId')} ({why})"), style="dim"))


def declines(candidates: Sequence[Candidate] | None, shown: int = 3) -> str:
    """The declines among an error's candidates, in the agents' own words, for the CLI's one
    summary line ("" when none declined): "; declined by a: "not on Sundays", b: ..."."""
    said = [c for c in candidates or [] if c.reason == CandidateReason.DECLINED]
    if not said:
        return ""
    parts = [f'{c.agent_id}: "{c.message}"' if c.message else c.agent_id for c in said[:shown]]
    more = f" and {len(said) - shown} more" if len(said) > shown else ""
    return "; declined by " + ", ".join(parts) + more


def render_trace(data: dict[str, Any]) -> Tree:
    """A rich Tree: hops nested under the attempt that caused them."""
    hops: list[dict[str, Any]] = data.get("hops", [])
    root = Tree(
        f"trace [bold]{_safe(data.get('traceId'))}[/]  ({len(hops)} hop{'s' if len(hops) != 1 else ''})"
    )
    children: dict[int, list[int]] = {}
    for hop in hops:
        if "parentHop" in hop:
            children.setdefault(hop["parentHop"], []).append(hop["hop"])
    for hop in hops:
        if "parentHop" not in hop:
            _add_hop(root, hop, hops, children)
    return root
