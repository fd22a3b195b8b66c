"""Per-agent request statistics, as shown in ``AgentStatus.stats``.

Memory is O(agents): a fixed window of recent latencies per agent, dropped when the agent
leaves the registry.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from reachmesh.clock import SYSTEM_CLOCK, Clock

LATENCY_WINDOW = 256


class _AgentStats:
    __slots__ = (
        "declines_in_a_row",
        "ewma_answer_ms",
        "ewma_latency_ms",
        "ewma_success",
        "failures",
        "inflight",
        "last_sample",
        "latencies",
        "requests",
    )

    def __init__(self) -> None:
        self.requests = 0
        self.failures = 0
        self.inflight = 0
        self.declines_in_a_row = 0  # since its last success: repeated declines cost (DeclinePolicy)
        self.latencies: deque[float] = deque(maxlen=LATENCY_WINDOW)
        # Time-decayed EWMAs: how much a sample moves them depends on the time since the last
        # one, so they react within seconds whether an agent sees 1 or 1,000 requests/s.
        self.ewma_latency_ms: float | None = None
        self.ewma_success = 1.0
        self.last_sample = 0.0
        # The same average of its answers alone: how long it usually needs when it does answer,
        # unmoved by its timeouts (a hung agent's must not make every window look short).
        self.ewma_answer_ms: float | None = None


class StatsBook:
    """Counts requests, failures, in-flight calls and recent latencies for each agent."""

    __slots__ = ("_agents", "_clock", "tau")

    def __init__(self, *, clock: Clock = SYSTEM_CLOCK, tau_seconds: float = 2.0) -> None:
        self._agents: dict[str, _AgentStats] = {}
        self._clock = clock
        self.tau = tau_seconds

    def apply(self, tau_seconds: float) -> None:
        """Take a reloaded averaging time constant (routing.merit.ewma_tau_seconds)."""
        self.tau = tau_seconds

    def started(self, agent_id: str) -> None:
        stats = self._agents.get(agent_id)
        if stats is None:
            stats = self._agents[agent_id] = _AgentStats()
        stats.inflight += 1

    def finished(self, agent_id: str, *, ok: bool | None, latency_ms: float) -> None:
        """Book an attempt's end; ``ok`` None (a decline) leaves requests and success rate as
        they were: saying "not mine" is neither a success nor a failure of the agent."""
        stats = self._agents.get(agent_id)
        if stats is None:  # forgotten mid-flight: the agent left the registry
            return
        stats.inflight -= 1
        if ok is None:
            return
        if ok:
            stats.declines_in_a_row = 0
        stats.requests += 1
        if not ok:
            stats.failures += 1
        stats.latencies.append(latency_ms)
        now = self._clock.monotonic()
        if stats.ewma_latency_ms is None:
            alpha = 1.0
            stats.ewma_latency_ms = latency_ms
            stats.ewma_success = 1.0 if ok else 0.0
        else:
            # max() of each, as conditionals (no builtin calls): the same values.
            gap = now - stats.last_sample
            alpha = 1.0 - math.exp(-(gap if gap > 0.0 else 0.0) / self.tau)
            if alpha < 0.01:  # a burst of samples in one instant still counts a little
                alpha = 0.01
            stats.ewma_latency_ms += alpha * (latency_ms - stats.ewma_latency_ms)
            stats.ewma_success += alpha * ((1.0 if ok else 0.0) - stats.ewma_success)
        if ok:
            answer = stats.ewma_answer_ms
            stats.ewma_answer_ms = latency_ms if answer is None else answer + alpha * (latency_ms - answer)
        stats.last_sample = now

    def succeeded(self, agent_id: str, latency_ms: float) -> None:
        """:meth:`finished` of a success (``ok`` True), the common case, without its tests of
        ``ok``: the same booking."""
        stats = self._agents.get(agent_id)
        if stats is None:  # forgotten mid-flight: the agent left the registry
            return
        stats.inflight -= 1
        stats.declines_in_a_row = 0
        stats.requests += 1
        stats.latencies.append(latency_ms)
        now = self._clock.monotonic()
        if stats.ewma_latency_ms is None:
            stats.ewma_latency_ms = stats.ewma_answer_ms = latency_ms
            stats.ewma_success = 1.0
        else:
            gap = now - stats.last_sample
            alpha = 1.0 - math.exp(-(gap if gap > 0.0 else 0.0) / self.tau)
            if alpha < 0.01:  # a burst of samples in one instant still counts a little
                alpha = 0.01
            stats.ewma_latency_ms += alpha * (latency_ms - stats.ewma_latency_ms)
            stats.ewma_success += alpha * (1.0 - stats.ewma_success)
            answer = stats.ewma_answer_ms
            stats.ewma_answer_ms = latency_ms if answer is None else answer + alpha * (latency_ms - answer)
        stats.last_sample = now

    def declined(self, agent_id: str) -> int:
        """Book a decline: the agent's declines since its last success, this one included."""
        stats = self._agents.get(agent_id)
        if stats is None:
            return 1
        stats.declines_in_a_row += 1
        return stats.declines_in_a_row

    def merit(self, agent_id: str) -> tuple[float, float | None]:
        """``(EWMA success rate, EWMA latency in ms or None before any sample)``."""
        stats = self._agents.get(agent_id)
        if stats is None:
            return 1.0, None
        return stats.ewma_success, stats.ewma_latency_ms

    def usual_answer_ms(self, agent_id: str) -> float | None:
        """How long the agent usually takes to answer: the time-decayed average latency of its
        answers alone (an uncharged timeout is booked nowhere, a charged one is a failure), or
        None before it has answered once."""
        stats = self._agents.get(agent_id)
        return None if stats is None else stats.ewma_answer_ms

    def quick_latency_ms(self, agent_id: str, share: float) -> float | None:
        """The latency that ``share`` of the agent's recent attempts (the window; failures too)
        took at most, or None before any: how fast its quick answers are, for an agent whose
        answer times vary. A sort of the window: for rare paths only (a wait for a slot)."""
        stats = self._agents.get(agent_id)
        if stats is None or not stats.latencies:
            return None
        window = sorted(stats.latencies)
        return window[min(int(len(window) * share), len(window) - 1)]

    def forget(self, agent_id: str) -> None:
        self._agents.pop(agent_id, None)

    def snapshot(self, agent_id: str) -> dict[str, Any]:
        """``{"requests", "successRate", "p50LatencyMs", "inflight"}`` for one agent."""
        stats = self._agents.get(agent_id)
        if stats is None or stats.requests == 0:
            return {
                "requests": 0,
                "successRate": 1.0,
                "p50LatencyMs": None,
                "inflight": stats.inflight if stats else 0,
            }
        window = sorted(stats.latencies)
        return {
            "requests": stats.requests,
            "successRate": round(1 - stats.failures / stats.requests, 4),
            "p50LatencyMs": round(window[len(window) // 2], 2),
            "inflight": stats.inflight,
        }
