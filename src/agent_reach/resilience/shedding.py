"""Load shedding: refuse the excess at once instead of queueing without bound.

Two gates: a limit on requests in flight, and a global breaker that opens while the event loop
lags (the Router itself is saturated), measured by a small monitor task.
"""

from __future__ import annotations

import asyncio
import time

from agent_reach.config import LimitsPolicy
from agent_reach.lifecycle import Background


class LoadShedder:
    """Admits a request or says why not; :meth:`release` when an admitted request ends."""

    __slots__ = ("_monitor", "inflight", "lag_ms", "policy")

    _monitor: Background

    def __init__(self, policy: LimitsPolicy | None = None) -> None:
        self.policy = policy or LimitsPolicy()
        self.inflight = 0
        self.lag_ms = 0.0
        self._monitor = Background("reach-loop-lag")

    def admit(self) -> str | None:
        """``None`` when admitted (and counted), else the reason to shed."""
        if self.inflight >= self.policy.max_inflight:
            return f"{self.inflight} requests in flight (limit {self.policy.max_inflight})"
        if self.lag_ms >= self.policy.loop_lag_ms:
            return f"event loop lag {self.lag_ms:.0f} ms (limit {self.policy.loop_lag_ms:g} ms)"
        self.inflight += 1
        return None

    def release(self) -> None:
        self.inflight -= 1

    async def start(self) -> None:
        if not self._monitor:
            self._monitor.spawn(self._watch_lag())

    async def close(self) -> None:
        await self._monitor.close()

    async def _watch_lag(self) -> None:
        interval = 0.05
        while True:
            started = time.perf_counter()
            await asyncio.sleep(interval)
            lag = (time.perf_counter() - started - interval) * 1000
            # Decay rather than jump to zero, so one quiet tick does not reopen the gate.
            self.lag_ms = max(lag, self.lag_ms * 0.5)
