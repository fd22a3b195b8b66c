"""Layered timeouts and the per-request deadline.

A request carries three limits: how long to wait for a connection, how long to wait for one
agent's answer, and the overall budget. The overall budget becomes a :class:`Deadline` that is
passed down, so that no retry or failover starts after it and the agent learns how much time is
left (``X-Reach-Deadline-Ms``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reachmesh.deadline import Deadline

__all__ = ["Deadline", "Timeout"]


@dataclass(frozen=True, slots=True)
class Timeout:
    """The three limits of one request, in milliseconds."""

    connect_ms: int
    read_ms: int
    overall_ms: int
    # (connect, read, whole attempt) in seconds, for an attempt the deadline does not cut: worked
    # out once per Timeout (the dispatcher keeps them), not on every attempt.
    seconds: tuple[float, float, float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        whole = (self.connect_ms + self.read_ms) / 1000.0
        object.__setattr__(self, "seconds", (self.connect_ms / 1000.0, self.read_ms / 1000.0, whole))

    def attempt_limits(self, remaining_ms: float) -> tuple[float, float, float]:
        """Connect, read and whole-attempt limits in seconds for one attempt, never past the deadline."""
        remaining = max(remaining_ms, 0.0) / 1000.0
        connect = min(self.connect_ms / 1000.0, remaining)
        read = min(self.read_ms / 1000.0, remaining)
        return connect, read, min((self.connect_ms + self.read_ms) / 1000.0, remaining)
