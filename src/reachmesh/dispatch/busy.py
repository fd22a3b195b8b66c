"""A request every candidate of which answered busy (429) waits and is tried again.

Each Router counts only the requests it has in flight itself (``max_concurrency``), so several
Routers over one etcd may together send an agent more than its capacity; the SDK answers the
surplus ``429 AGENT_BUSY`` with ``Retry-After`` before running anything. That answer says the
request was not run and when to come back, so the Router waits that long and sends it again,
within the caller's deadline, instead of failing the call ``NO_AVAILABLE_HANDLER`` (and with it
every request queued behind it, whose slots the failures freed at once).

While it waits, each busy agent's slot stays taken here for the Retry-After: the agent is full
with another Router's requests, so this Router sends it fewer until then, rather than turning
its whole queue into busy answers.

Both waits are on the Router's clock (``parts.clock``), as its deadlines are: a test moves time
by hand instead of waiting the Retry-After out.
"""

from __future__ import annotations

import random
from typing import Any

from reachmesh.dispatch.attempts import AttemptRun
from reachmesh.exceptions import AgentsBusy
from reachmesh.protocol import CandidateReason
from reachmesh.routing.base import Choice

# How long a busy agent's Retry-After is stretched, at random, so that the requests it refused
# together do not all come back at the same moment.
_SPREAD = (1.0, 1.25)
# The least wait, for an agent that says "retry after 0 s": never a loop of busy answers.
MIN_WAIT_S = 0.05
# Time an attempt needs after the wait to be worth making; less, and the busy answer stands.
MIN_LEFT_MS = 100.0
# Waits one request may make: the deadline bounds them too, this bounds a tiny Retry-After.
MAX_WAITS = 64

_jitter = random.Random()


async def run_past_busy(run: AttemptRun, choices: list[Choice], busy: AgentsBusy | None = None) -> Any:
    """``run.run(choices)``, run again after each time it ends with every agent busy, while the
    deadline leaves room for the wait and an attempt after it. ``busy``: the first pass already
    ran (the dispatcher's, without this coroutine: almost every call ends in it) and ended so."""
    for _ in range(MAX_WAITS):
        try:
            if busy is not None:
                raise busy
            return await run.run(choices)
        except AgentsBusy as exc:
            busy = None
            again = _busy_choices(run, choices)
            wait_s = max(exc.retry_after_s, MIN_WAIT_S) * _jitter.uniform(*_SPREAD)
            if not again or run.deadline.remaining_ms() - wait_s * 1000 < MIN_LEFT_MS:
                raise
            _hold_slots(run, again, wait_s)
            names = ", ".join(dict.fromkeys(choice.entry.id for choice in again))
            run.record.note(
                "busy wait", f"{names}, {wait_s * 1000:.0f}ms (Retry-After {exc.retry_after_s} s)"
            )
            await run.parts.clock.sleep(wait_s)
            _reset(run)
            choices = again
    return await run.run(choices)


def _busy_choices(run: AttemptRun, choices: list[Choice]) -> list[Choice]:
    """The candidates that answered busy, when sending them the request again is safe: nothing
    was sent that an agent may hold (a busy answer is the agent refusing before it ran it)."""
    if run.may_hold is not None:
        return []
    busy = {item.get("agentId") for item in run.record.rejected if item.get("reason") == CandidateReason.BUSY}
    return [choice for choice in choices if choice.entry.id in busy]


def _hold_slots(run: AttemptRun, again: list[Choice], wait_s: float) -> None:
    """Keep one slot at each busy agent taken for ``wait_s``: it is full with others' requests."""
    capacity = run.parts.capacity
    for agent_id, limit in {c.entry.id: c.entry.profile.max_concurrency for c in again}.items():
        if limit is not None:
            capacity.hold(agent_id, limit, wait_s)


def _reset(run: AttemptRun) -> None:
    """Ready ``run`` for another pass: the busy answers are given back their hops (nothing ran)
    and leave the record's candidates, so a later ending lists each agent for what it did last."""
    record = run.record
    busy = [item for item in record.rejected if item.get("reason") == CandidateReason.BUSY]
    record.rejected = [item for item in record.rejected if item.get("reason") != CandidateReason.BUSY]
    run.attempts_left += len(busy)
    run.busy_retry_after_s = None
    run.last_failure = None
