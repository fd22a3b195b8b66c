"""A point in time after which no new work starts, on an injectable clock.

The Router passes one down each request (no retry or failover starts after it); the SDK uses the
same type for the time an agent has left (``X-Reach-Deadline-Ms``). It lives at the bottom of
the package so that both can use it without the SDK depending on the Router's resilience layer.
"""

from __future__ import annotations

from reachmesh.clock import Clock


class Deadline:
    """A point in time on a :class:`Clock` after which no new work starts."""

    __slots__ = ("_at", "_clock")

    def __init__(self, clock: Clock, budget_ms: float) -> None:
        self._clock = clock
        self._at = clock.monotonic() + budget_ms / 1000.0

    def remaining_ms(self) -> float:
        """Milliseconds left; negative once the deadline has passed."""
        return (self._at - self._clock.monotonic()) * 1000.0

    def extend(self, ms: float) -> None:
        """Move the deadline ``ms`` later (time given back, as a decline's to the next agent)."""
        self._at += max(ms, 0.0) / 1000.0

    @property
    def expired(self) -> bool:
        return self._clock.monotonic() >= self._at
