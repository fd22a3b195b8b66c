"""Time as an explicit dependency.

Everything that decides by time (leases, breakers, health, budgets, deadlines) takes a
:class:`Clock`, so tests move time by hand with :class:`ManualClock` instead of sleeping; a wait
that is part of such a decision (a busy agent's Retry-After) sleeps on it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    """Two readings: a monotonic one to decide with, a wall one to show people."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back; only differences mean anything."""
        ...

    def time(self) -> float:
        """Seconds since the Unix epoch, for timestamps shown on the wire."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Until ``monotonic()`` has moved ``seconds`` on."""
        ...


class SystemClock:
    """The process clock."""

    __slots__ = ()

    # The C functions themselves, not a Python method around each: a /reach call reads the
    # clock about ten times, and each method was one more frame. (A builtin does not bind.)
    monotonic = staticmethod(time.monotonic)
    time = staticmethod(time.time)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class ManualClock:
    """A clock that only moves when told to: the test double for every timed decision."""

    def __init__(self, start: float = 1_000.0, wall: float = 1_767_225_600.0) -> None:
        self._mono = start
        self._offset = wall - start
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    @property
    def sleeping(self) -> int:
        """Coroutines in :meth:`sleep` now: a test advances the clock once they are there."""
        return len(self._sleepers)

    async def sleep(self, seconds: float) -> None:
        """Until :meth:`advance` has moved the clock ``seconds`` on (a turn of the loop for none)."""
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        entry = (self._mono + seconds, asyncio.get_running_loop().create_future())
        self._sleepers.append(entry)
        try:
            await entry[1]
        finally:
            with contextlib.suppress(ValueError):
                self._sleepers.remove(entry)

    def monotonic(self) -> float:
        return self._mono

    def time(self) -> float:
        return self._mono + self._offset

    def advance(self, seconds: float) -> None:
        """Move both readings forward by ``seconds``."""
        if seconds < 0:
            raise ValueError("a clock does not go back")
        self._mono += seconds
        for due, waker in self._sleepers:
            if due <= self._mono and not waker.done():
                waker.set_result(None)


SYSTEM_CLOCK = SystemClock()


def iso_utc(epoch_seconds: float) -> str:
    """ISO 8601 UTC with milliseconds and a ``Z``, the wire's one time format."""
    stamp = datetime.fromtimestamp(epoch_seconds, tz=UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z"
