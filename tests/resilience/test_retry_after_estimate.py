"""The OVERLOADED Retry-After estimate (resilience.capacity.retry_after_estimate), figures in and
seconds out."""

from __future__ import annotations

from reachmesh.resilience.capacity import MAX_ESTIMATED_RETRY_AFTER_S, retry_after_estimate


def test_the_estimate_is_the_service_time_for_each_round_of_capacity_ahead() -> None:
    # 800 ms a request, 10 waiting and this one, 4 at a time: ceil(0.8 * 11 / 4) = 3 s.
    assert retry_after_estimate(10, 4, 800.0, 1) == 3
    assert retry_after_estimate(0, 1, 2500.0, 1) == 3


def test_the_estimate_is_at_least_a_second() -> None:
    assert retry_after_estimate(0, 8, 5.0, 1) == 1


def test_the_estimate_is_bounded_by_the_larger_of_the_policy_and_the_documented_max() -> None:
    assert retry_after_estimate(1024, 1, 30_000.0, 1) == MAX_ESTIMATED_RETRY_AFTER_S
    assert retry_after_estimate(1024, 1, 30_000.0, 600) == 600


def test_without_a_service_time_the_policy_value_stands() -> None:
    assert retry_after_estimate(5, 1, None, 7) == 7
    assert retry_after_estimate(5, None, 100.0, 7) == 7
