"""The Router-wide retry budget: retries may be a bounded share of recent requests.

Per-request caps stop one request from hammering; the budget stops all of them together from
turning a slow agent into a retry storm. Counts live in one bucket per second over a sliding
window, so memory is fixed whatever the traffic.
"""

from __future__ import annotations

from reachmesh.clock import SYSTEM_CLOCK, Clock
from reachmesh.config import RetryBudgetPolicy


class RetryBudget:
    """``retries <= ratio * requests + min_per_second * window`` over the last window."""

    __slots__ = ("_clock", "_requests", "_retries", "_seconds", "denied", "policy")

    def __init__(self, policy: RetryBudgetPolicy | None = None, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.policy = policy or RetryBudgetPolicy()
        self._clock = clock
        # Retries refused since start: read at scrape time (an alert on a spent budget).
        self.denied = 0
        self._reset(self.policy.window_seconds)

    def _reset(self, size: int) -> None:
        self._seconds = [-1] * size
        self._requests = [0] * size
        self._retries = [0] * size

    def apply(self, policy: RetryBudgetPolicy) -> None:
        """Take a reloaded policy; a new window size starts the counts afresh."""
        if policy.window_seconds != len(self._seconds):
            self._reset(policy.window_seconds)
        self.policy = policy

    def _slot(self) -> int:
        second = int(self._clock.monotonic())
        size = len(self._seconds)
        index = second % size
        if self._seconds[index] != second:
            self._seconds[index] = second
            self._requests[index] = 0
            self._retries[index] = 0
        return index

    def _totals(self) -> tuple[int, int]:
        oldest = int(self._clock.monotonic()) - len(self._seconds) + 1
        requests = retries = 0
        for i, second in enumerate(self._seconds):
            if second >= oldest:
                requests += self._requests[i]
                retries += self._retries[i]
        return requests, retries

    def on_request(self) -> None:
        """Count a new request."""
        # _slot(), written out: every request counts here.
        second = int(self._clock.monotonic())
        seconds = self._seconds
        index = second % len(seconds)
        if seconds[index] != second:
            seconds[index] = second
            self._requests[index] = 0
            self._retries[index] = 0
        self._requests[index] += 1

    def try_spend(self) -> bool:
        """Take one retry from the budget; False (and nothing taken) when it is spent."""
        if not self.policy.enabled:
            return True
        index = self._slot()
        requests, retries = self._totals()
        allowance = self.policy.ratio * requests + self.policy.min_per_second * len(self._seconds)
        if retries + 1 > allowance:
            self.denied += 1
            return False
        self._retries[index] += 1
        return True

    def snapshot(self) -> dict[str, float]:
        """Requests, retries and the allowance over the current window."""
        requests, retries = self._totals()
        allowance = self.policy.ratio * requests + self.policy.min_per_second * len(self._seconds)
        return {"requests": requests, "retries": retries, "allowance": allowance}
