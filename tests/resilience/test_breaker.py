"""Circuit breakers on a manual clock."""

from __future__ import annotations

from reachmesh.clock import ManualClock
from reachmesh.config import BreakerPolicy, TaskOverride
from reachmesh.resilience.breaker import BreakerBoard, BreakerState, Permit


def board(**policy: object) -> tuple[BreakerBoard, ManualClock]:
    clock = ManualClock()
    return BreakerBoard(BreakerPolicy.model_validate(policy), clock=clock), clock


def test_opens_after_consecutive_failures() -> None:
    """Five consecutive failures open the breaker; a success in between resets the count."""
    b, _ = board()
    for _ in range(4):
        assert b.record("a", "t", ok=False) is None
    assert b.record("a", "t", ok=True) is None
    for _ in range(4):
        b.record("a", "t", ok=False)
    assert b.state("a") is BreakerState.CLOSED
    assert b.record("a", "t", ok=False) is BreakerState.OPEN
    assert b.state("a") is BreakerState.OPEN
    assert b.blocked("a", "t")
    assert b.acquire("a", "t") == (Permit.DENY, None)


def test_a_neutral_answer_neither_counts_nor_clears_but_closes_a_probe() -> None:
    """A decline or a 429 (ok None) between failures does not reset their run: an agent that
    alternates 5xx with 429 still trips. A half-open probe that gets one found the agent up."""
    b, clock = board(failure_threshold=3, open_seconds=10)
    for _ in range(2):
        assert b.record("a", "t", ok=False) is None
        assert b.record("a", "t", ok=None) is None
    assert b.record("a", "t", ok=False) is BreakerState.OPEN
    assert b.record("fresh", "t", ok=None) is None and b.state("fresh") is BreakerState.CLOSED
    clock.advance(10)
    assert b.acquire("a", "t") == (Permit.PROBE, BreakerState.HALF_OPEN)
    assert b.record("a", "t", ok=None) is BreakerState.CLOSED
    assert b.acquire("a", "t")[0] is not Permit.DENY


def test_one_probe_after_the_open_period() -> None:
    """After open_seconds one probe goes through; others wait; success closes, failure reopens."""
    b, clock = board(failure_threshold=1, open_seconds=10)
    b.record("a", "t", ok=False)
    clock.advance(9.9)
    assert b.acquire("a", "t")[0] is Permit.DENY
    clock.advance(0.1)
    assert not b.blocked("a", "t")
    assert b.acquire("a", "t") == (Permit.PROBE, BreakerState.HALF_OPEN)
    assert b.acquire("a", "t")[0] is Permit.DENY  # only one probe at a time
    assert b.record("a", "t", ok=False) is BreakerState.OPEN  # the probe failed
    clock.advance(10)
    assert b.acquire("a", "t")[0] is Permit.PROBE
    assert b.record("a", "t", ok=True) is BreakerState.CLOSED
    assert b.acquire("a", "t") == (Permit.GO, None)


def test_a_lost_probe_does_not_wedge_the_breaker() -> None:
    """A probe that never reports is replaced after another open period."""
    b, clock = board(failure_threshold=1, open_seconds=5)
    b.record("a", "t", ok=False)
    clock.advance(5)
    assert b.acquire("a", "t")[0] is Permit.PROBE
    clock.advance(4)
    assert b.acquire("a", "t")[0] is Permit.DENY
    clock.advance(1)
    assert b.acquire("a", "t")[0] is Permit.PROBE


def test_refused_opens_at_once() -> None:
    """A refused connection opens the breaker without waiting for the threshold."""
    b, _ = board()
    assert b.record("a", "t", ok=False, refused=True) is BreakerState.OPEN
    b2, _ = board(open_on_refused=False)
    assert b2.record("a", "t", ok=False, refused=True) is None


def test_agent_task_scope() -> None:
    """With scope agent_task, one failing task does not block the agent's other tasks."""
    clock = ManualClock()
    b = BreakerBoard(
        BreakerPolicy(failure_threshold=2),
        clock=clock,
        overrides={"fragile": TaskOverride(breaker_scope="agent_task")},
    )
    b.record("a", "fragile", ok=False)
    assert b.record("a", "fragile", ok=False) is BreakerState.OPEN
    assert b.blocked("a", "fragile")
    assert not b.blocked("a", "sturdy")
    assert b.state("a") is BreakerState.OPEN  # the worst of its breakers


def test_memory_is_per_agent_not_per_request() -> None:
    """Many requests to few agents keep few breakers; forget() drops an agent's."""
    b, _ = board()
    for i in range(10_000):
        b.record(f"agent-{i % 3}", "t", ok=i % 2 == 0)
    assert len(b) == 3
    b.forget("agent-0")
    assert len(b) == 2
