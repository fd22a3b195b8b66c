"""The Router-wide retry budget."""

from __future__ import annotations

from reachmesh.clock import ManualClock
from reachmesh.config import RetryBudgetPolicy
from reachmesh.resilience.retry import RetryBudget


def test_allowance_is_ratio_of_requests_plus_minimum() -> None:
    """Retries are capped at ratio x requests + min_per_second x window."""
    clock = ManualClock()
    budget = RetryBudget(RetryBudgetPolicy(ratio=0.2, min_per_second=1, window_seconds=10), clock=clock)
    for _ in range(100):
        budget.on_request()
    granted = sum(budget.try_spend() for _ in range(100))
    assert granted == 30  # 0.2 * 100 + 1 * 10


def test_window_slides() -> None:
    """Retries spent more than a window ago no longer count."""
    clock = ManualClock()
    budget = RetryBudget(RetryBudgetPolicy(ratio=0, min_per_second=1, window_seconds=5), clock=clock)
    assert sum(budget.try_spend() for _ in range(10)) == 5
    clock.advance(6)
    assert sum(budget.try_spend() for _ in range(10)) == 5


def test_disabled_budget_always_grants() -> None:
    """enabled: false never refuses a retry."""
    budget = RetryBudget(RetryBudgetPolicy(enabled=False, ratio=0, min_per_second=0))
    assert all(budget.try_spend() for _ in range(100))


def test_memory_is_fixed() -> None:
    """The budget keeps one bucket per second of the window, whatever the traffic."""
    clock = ManualClock()
    budget = RetryBudget(RetryBudgetPolicy(window_seconds=10), clock=clock)
    for _ in range(1000):
        budget.on_request()
        budget.try_spend()
        clock.advance(0.37)
    assert len(budget._seconds) == 10
