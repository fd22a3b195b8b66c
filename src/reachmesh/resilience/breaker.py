"""Circuit breakers, one per agent (or per agent and task), on an injectable clock.

closed ──(N consecutive failures)──▶ open ──(open_seconds later, one probe)──▶ half_open
  ▲                                   ▲                                          │
  └────────────(probe succeeds)───────┼──────────────(probe fails)───────────────┘

Only failures that say the agent is in trouble count: network errors, timeouts, 5xx and
answers that are not valid replies. An ``AGENT_ERROR`` or a 4xx is the agent working.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from enum import StrEnum

from reachmesh.clock import SYSTEM_CLOCK, Clock
from reachmesh.config import BreakerPolicy, TaskOverride


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Permit(StrEnum):
    """What :meth:`BreakerBoard.acquire` allows."""

    GO = "go"  # closed: send as usual
    PROBE = "probe"  # half-open: this request is the one probe
    DENY = "deny"  # open, or a probe is already out


_RANK = {BreakerState.CLOSED: 0, BreakerState.HALF_OPEN: 1, BreakerState.OPEN: 2}


class Breaker:
    """The state of one breaker."""

    __slots__ = ("failures", "opened_at", "probe_started", "state")

    def __init__(self) -> None:
        self.state = BreakerState.CLOSED
        self.failures = 0
        self.opened_at = 0.0
        self.probe_started: float | None = None


class BreakerBoard:
    """Every breaker of the Router. Memory is O(agents x tasks served), not O(requests)."""

    def __init__(
        self,
        policy: BreakerPolicy | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
        overrides: dict[str, TaskOverride] | None = None,
    ) -> None:
        self.policy = policy or BreakerPolicy()
        self.overrides = overrides or {}
        self._clock = clock
        self._breakers: dict[str, dict[str, Breaker]] = {}  # agent -> scope key -> breaker
        # Told when a breaker opens on this Router's own evidence (not on another Router's word).
        self.on_open: list[Callable[[str], None]] = []

    def apply(self, policy: BreakerPolicy, overrides: dict[str, TaskOverride]) -> None:
        """Take a reloaded policy and per-task overrides; open breakers keep their state."""
        self.policy = policy
        self.overrides = overrides

    def _key(self, task: str) -> str:
        override = self.overrides.get(task)
        scope = (override.breaker_scope if override else None) or self.policy.scope
        return task if scope == "agent_task" else ""

    def _threshold(self, task: str) -> int:
        override = self.overrides.get(task)
        return (override.breaker_failure_threshold if override else None) or self.policy.failure_threshold

    def _get(self, agent_id: str, task: str) -> Breaker | None:
        scopes = self._breakers.get(agent_id)
        return None if scopes is None else scopes.get(self._key(task))

    def blocked(self, agent_id: str, task: str) -> bool:
        """True when the breaker is open and no probe is due: the agent is out of routing."""
        if not self.policy.enabled:
            return False
        scopes = self._breakers.get(agent_id)  # _get(), without a call for an agent with none
        breaker = None if scopes is None else scopes.get(self._key(task))
        if breaker is None or breaker.state is BreakerState.CLOSED:
            return False
        return self._permit_now(breaker) is Permit.DENY

    def _permit_now(self, breaker: Breaker) -> Permit:
        """The permit a request would get from ``breaker`` now, without taking it."""
        now = self._clock.monotonic()
        if breaker.state is BreakerState.CLOSED:
            return Permit.GO
        if breaker.state is BreakerState.OPEN:
            return Permit.PROBE if now - breaker.opened_at >= self.policy.open_seconds else Permit.DENY
        # Half-open with a probe out: a probe that never reported (say, cancelled) is replaced
        # after another open period, so a lost probe cannot wedge the breaker.
        if breaker.probe_started is None or now - breaker.probe_started >= self.policy.open_seconds:
            return Permit.PROBE
        return Permit.DENY

    def acquire(self, agent_id: str, task: str) -> tuple[Permit, BreakerState | None]:
        """Ask to send one request; returns the permit and the new state if it changed."""
        if not self.policy.enabled:
            return Permit.GO, None
        scopes = self._breakers.get(agent_id)  # _get(), without a call for an agent with none
        breaker = None if scopes is None else scopes.get(self._key(task))
        if breaker is None or breaker.state is BreakerState.CLOSED:
            return Permit.GO, None
        permit = self._permit_now(breaker)
        if permit is Permit.PROBE:
            changed = breaker.state is not BreakerState.HALF_OPEN
            breaker.state = BreakerState.HALF_OPEN
            breaker.probe_started = self._clock.monotonic()
            return permit, BreakerState.HALF_OPEN if changed else None
        return permit, None

    def record(
        self, agent_id: str, task: str, *, ok: bool | None, refused: bool = False
    ) -> BreakerState | None:
        """Record an attempt's outcome; returns the new state when the breaker changed.

        ``ok`` None is an answer that is neither a success nor a failure (a decline, a 429): it
        does not clear a run of failures, but a half-open probe that gets it found the agent up.
        ``refused`` (nothing listens on the agent's port) opens the breaker at once when the
        policy says ``open_on_refused``.
        """
        if not self.policy.enabled:
            return None
        # The breaker's key only for an agent that has breakers, or one to make (a failure).
        scopes = self._breakers.get(agent_id)
        breaker = None if scopes is None else scopes.get(self._key(task))
        if ok is None and (breaker is None or breaker.state is not BreakerState.HALF_OPEN):
            return None
        if ok is not False:  # a success, or a neutral answer to a half-open probe
            if breaker is None:
                return None
            was = breaker.state
            breaker.state = BreakerState.CLOSED
            breaker.failures = 0
            breaker.probe_started = None
            return BreakerState.CLOSED if was is not BreakerState.CLOSED else None
        if breaker is None:
            breaker = self._breakers.setdefault(agent_id, {}).setdefault(self._key(task), Breaker())
        breaker.failures += 1
        now = self._clock.monotonic()
        trip = breaker.failures >= self._threshold(task) or (refused and self.policy.open_on_refused)
        if breaker.state is BreakerState.HALF_OPEN or (breaker.state is BreakerState.CLOSED and trip):
            breaker.state = BreakerState.OPEN
            breaker.opened_at = now
            breaker.probe_started = None
            for listener in self.on_open:
                listener(agent_id)
            return BreakerState.OPEN
        return None

    def release_probe(self, agent_id: str, task: str) -> None:
        """The half-open probe was never sent (it waited in the Router, for a slot or a pooled
        connection, and gave up): the next request may probe at once, not an open period later."""
        breaker = self._get(agent_id, task)
        if breaker is not None and breaker.state is BreakerState.HALF_OPEN:
            breaker.probe_started = None

    def trip(self, agent_id: str, tasks: Iterable[str]) -> bool:
        """Open the agent's closed breakers on another Router's report that it fails.

        Only closed ones: an open or probing breaker already keeps traffic away. After the open
        period this Router probes on its own, so the final word stays its own. True if any opened.
        """
        if not self.policy.enabled:
            return False
        opened = False
        now = self._clock.monotonic()
        scopes = self._breakers.setdefault(agent_id, {})
        for key in {self._key(task) for task in tasks} or {""}:
            breaker = scopes.setdefault(key, Breaker())
            if breaker.state is BreakerState.CLOSED:
                breaker.state = BreakerState.OPEN
                breaker.opened_at = now
                breaker.probe_started = None
                opened = True
        return opened

    def state(self, agent_id: str) -> BreakerState:
        """The agent's worst breaker state, as shown in ``/admin/agents``."""
        scopes = self._breakers.get(agent_id)
        if not scopes:
            return BreakerState.CLOSED
        return max((b.state for b in scopes.values()), key=_RANK.__getitem__)

    def forget(self, agent_id: str) -> None:
        self._breakers.pop(agent_id, None)

    def __len__(self) -> int:
        return sum(len(s) for s in self._breakers.values())
