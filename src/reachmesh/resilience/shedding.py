"""Load shedding: refuse the excess at once instead of queueing without bound.

Two gates: a limit on requests in flight, and a global breaker that opens while the event loop
lags (the Router itself is saturated), measured by a small monitor task.
"""

from __future__ import annotations

import asyncio
import time

from reachmesh.config import LimitsPolicy
from reachmesh.lifecycle import Background


class LoadShedder:
    """Admits a request or says why not; :meth:`release` when an admitted request ends."""

    __slots__ = ("_by_client", "_monitor", "inflight", "lag_ms", "policy")

    _monitor: Background

    def __init__(self, policy: LimitsPolicy | None = None) -> None:
        self.policy = policy or LimitsPolicy()
        self.inflight = 0
        self.lag_ms = 0.0
        self._by_client: dict[str, int] = {}
        self._monitor = Background("reach-loop-lag")

    def admit(self, client: str = "-") -> str | None:
        """``None`` when admitted (and counted), else the reason to shed.

        One client (by address) may hold at most ``max_inflight_per_client`` of the slots, so its
        stalled or slow requests cannot take every slot from everyone else.
        """
        policy = self.policy
        if self.inflight >= policy.max_inflight:
            return f"{self.inflight} requests in flight (limit {policy.max_inflight})"
        mine = self._by_client.get(client, 0)
        if mine >= policy.max_inflight_per_client:
            return f"this client has {mine} requests in flight (limit {policy.max_inflight_per_client})"
        if self.lag_ms >= policy.loop_lag_ms:
            return f"event loop lag {self.lag_ms:.0f} ms (limit {policy.loop_lag_ms:g} ms)"
        self.inflight += 1
        self._by_client[client] = mine + 1
        return None

    def release(self, client: str = "-") -> None:
        self.inflight -= 1
        left = self._by_client.get(client, 1) - 1
        if left > 0:
            self._by_client[client] = left
        else:
            self._by_client.pop(client, None)

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
