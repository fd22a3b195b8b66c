"""Load shedding: refuse the excess at once instead of queueing without bound.

Two gates: a limit on requests in flight, and a global breaker for the Router's own overload.
The breaker opens only when both hold:

- the event loop has lagged at least ``loop_lag_ms`` on every sample for ``loop_lag_window_seconds``
  (one slow tick, a garbage collection or a burst of large answers, is not overload);
- the Router holds real work: in flight at least ``loop_lag_inflight_share`` of ``max_inflight``,
  or the in-flight count has grown by a quarter of that within the window (a queue building).

Lag alone says the host is slow, not that this Router is overloaded: on a shared or busy host a
light load is served slower rather than refused.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable

from reachmesh.config import LimitsPolicy
from reachmesh.lifecycle import Background

LagSource = Callable[[], Awaitable[float]]

# How often the monitor samples the loop; lag is how late the sample's sleep ends.
LAG_INTERVAL_S = 0.05


async def measure_loop_lag() -> float:
    """Sleep one interval and return how late the loop woke us, in milliseconds."""
    started = time.perf_counter()
    await asyncio.sleep(LAG_INTERVAL_S)
    return max(0.0, (time.perf_counter() - started - LAG_INTERVAL_S) * 1000)


class LoadShedder:
    """Admits a request or says why not; :meth:`release` when an admitted request ends.

    ``lag_source`` is awaited in a loop and returns one lag sample in milliseconds (the default
    measures this event loop); a test injects its own, or feeds :meth:`observe` directly.
    """

    __slots__ = (
        "_by_client",
        "_lag_since",
        "_monitor",
        "_recent",
        "inflight",
        "lag_ms",
        "lag_source",
        "peak_lag_ms",
        "policy",
        "sustained_lag_s",
    )

    _monitor: Background

    def __init__(self, policy: LimitsPolicy | None = None, *, lag_source: LagSource | None = None) -> None:
        self.policy = policy or LimitsPolicy()
        self.lag_source: LagSource = lag_source or measure_loop_lag
        self.inflight = 0
        # The latest sample, the largest one seen, and how long lag has stayed over the limit.
        self.lag_ms = 0.0
        self.peak_lag_ms = 0.0
        self.sustained_lag_s = 0.0
        self._lag_since: float | None = None
        # (when, in flight) at each late sample of the last window, to see a queue building.
        self._recent: deque[tuple[float, int]] = deque()
        self._by_client: dict[str, int] = {}
        self._monitor = Background("reach-loop-lag")

    def apply(self, policy: LimitsPolicy) -> None:
        """Take reloaded limits; the requests in flight count against the new ones."""
        self.policy = policy

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
        # No lag sustained (the lag breaker's window is over 0 s): closed, without the call.
        if self.sustained_lag_s:
            overloaded = self.overload()
            if overloaded is not None:
                return overloaded
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

    def overload(self) -> str | None:
        """Why the lag breaker is open (sustained lag *and* real work), or ``None`` while closed."""
        policy = self.policy
        if not policy.loop_lag_shedding or self.sustained_lag_s < policy.loop_lag_window_seconds:
            return None
        floor = math.ceil(policy.loop_lag_inflight_share * policy.max_inflight)
        growth = self.inflight - min((n for _, n in self._recent), default=self.inflight)
        if self.inflight < floor and growth < max(1, math.ceil(floor / 4)):
            return None
        return (
            f"event loop lag {self.lag_ms:.0f} ms for {self.sustained_lag_s:.1f} s "
            f"(limit {policy.loop_lag_ms:g} ms) with {self.inflight} requests in flight"
        )

    def observe(self, lag_ms: float, now: float) -> None:
        """Take one lag sample measured at ``now`` (monotonic seconds)."""
        self.lag_ms = lag_ms
        self.peak_lag_ms = max(self.peak_lag_ms, lag_ms)
        if lag_ms < self.policy.loop_lag_ms:
            self._lag_since = None
            self.sustained_lag_s = 0.0
            self._recent.clear()
            return
        if self._lag_since is None:
            # From the first late sample on: one long stall, however long, is one sample.
            self._lag_since = now
        self.sustained_lag_s = now - self._lag_since
        recent = self._recent
        recent.append((now, self.inflight))
        while recent[0][0] < now - self.policy.loop_lag_window_seconds:
            recent.popleft()

    async def start(self) -> None:
        if not self._monitor:
            self._monitor.spawn(self._watch_lag())

    async def close(self) -> None:
        await self._monitor.close()

    async def _watch_lag(self) -> None:
        while True:
            lag = await self.lag_source()
            self.observe(lag, time.monotonic())
