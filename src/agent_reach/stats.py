"""Per-agent request statistics, as shown in ``AgentStatus.stats``.

Memory is O(agents): a fixed window of recent latencies per agent, dropped when the agent
leaves the registry.
"""

from __future__ import annotations

from collections import deque
from typing import Any

LATENCY_WINDOW = 256


class _AgentStats:
    __slots__ = ("failures", "inflight", "latencies", "requests")

    def __init__(self) -> None:
        self.requests = 0
        self.failures = 0
        self.inflight = 0
        self.latencies: deque[float] = deque(maxlen=LATENCY_WINDOW)


class StatsBook:
    """Counts requests, failures, in-flight calls and recent latencies for each agent."""

    __slots__ = ("_agents",)

    def __init__(self) -> None:
        self._agents: dict[str, _AgentStats] = {}

    def started(self, agent_id: str) -> None:
        stats = self._agents.get(agent_id)
        if stats is None:
            stats = self._agents[agent_id] = _AgentStats()
        stats.inflight += 1

    def finished(self, agent_id: str, *, ok: bool, latency_ms: float) -> None:
        stats = self._agents.get(agent_id)
        if stats is None:  # forgotten mid-flight: the agent left the registry
            return
        stats.inflight -= 1
        stats.requests += 1
        if not ok:
            stats.failures += 1
        stats.latencies.append(latency_ms)

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
