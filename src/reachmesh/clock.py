"""Time as an explicit dependency.

Everything that decides by time (leases, breakers, health, budgets, deadlines) takes a
:class:`Clock`, so tests move time by hand with :class:`ManualClock` instead of sleeping.
"""

from __future__ import annotations

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


class SystemClock:
    """The process clock."""

    __slots__ = ()

    # The C functions themselves, not a Python method around each: a /reach call reads the
    # clock about ten times, and each method was one more frame. (A builtin does not bind.)
    monotonic = staticmethod(time.monotonic)
    time = staticmethod(time.time)


class ManualClock:
    """A clock that only moves when told to: the test double for every timed decision."""

    def __init__(self, start: float = 1_000.0, wall: float = 1_767_225_600.0) -> None:
        self._mono = start
        self._offset = wall - start

    def monotonic(self) -> float:
        return self._mono

    def time(self) -> float:
        return self._mono + self._offset

    def advance(self, seconds: float) -> None:
        """Move both readings forward by ``seconds``."""
        if seconds < 0:
            raise ValueError("a clock does not go back")
        self._mono += seconds


SYSTEM_CLOCK = SystemClock()


def iso_utc(epoch_seconds: float) -> str:
    """ISO 8601 UTC with milliseconds and a ``Z``, the wire's one time format."""
    stamp = datetime.fromtimestamp(epoch_seconds, tz=UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z"
