"""Which timeouts after a wait in the Router are charged to the agent (dispatch/attempts.py,
``wait_cut_short``): a pure function of what the attempt had, what it waited and how long the
agent usually takes to answer."""

from __future__ import annotations

import pytest

from reachmesh.dispatch.attempts import FAIR_WINDOW_MIN_MS, wait_cut_short

READ_MS = 3000.0


def test_a_timeout_without_a_wait_is_never_the_waits() -> None:
    assert not wait_cut_short(500.0, 0.0, 0.0, READ_MS)
    assert not wait_cut_short(500.0, 0.0, 0.0, READ_MS, usual_ms=1000.0)
    assert not wait_cut_short(5.0, 0.0, 0.0, READ_MS, usual_ms=1000.0)


def test_the_walks_queue_tail_is_not_charged_to_a_busy_agent() -> None:
    """Capacity 2, answers in 1 s, callers' deadline 2.5 s (short of the 3 s read timeout): a
    call that waited 1.5 s for a slot had 1 s. Without the wait it had 2.5 s, more than twice
    what the agent needs: the wait cut it. It was charged (the deadline short of the read
    timeout was taken for the caller's), and such calls opened the breaker."""
    assert wait_cut_short(1000.0, 1500.0, 0.0, READ_MS, usual_ms=1000.0)
    assert wait_cut_short(200.0, 2300.0, 0.0, READ_MS, usual_ms=1000.0)
    # The same with the wait for the Router's own pool, which is inside the attempt's time.
    assert wait_cut_short(2500.0, 0.0, 1500.0, READ_MS, usual_ms=1000.0)
    assert wait_cut_short(2500.0, 700.0, 800.0, READ_MS, usual_ms=1000.0)


def test_a_window_of_twice_the_usual_answer_time_is_fair_and_its_timeout_charged() -> None:
    """The wait left it 2 s or more of a 1 s agent: it had its chance; charged, though the read
    timeout (3 s) was not reached, so an agent that stops answering is found by its queue too."""
    assert not wait_cut_short(2000.0, 500.0, 0.0, READ_MS, usual_ms=1000.0)
    assert not wait_cut_short(2400.0, 100.0, 0.0, READ_MS, usual_ms=1000.0)
    assert wait_cut_short(1990.0, 510.0, 0.0, READ_MS, usual_ms=1000.0)


def test_the_read_timeout_is_always_a_fair_window() -> None:
    """An agent slower than half its read timeout is judged by the read timeout, as before."""
    assert not wait_cut_short(READ_MS, 2000.0, 0.0, READ_MS, usual_ms=2500.0)
    assert wait_cut_short(READ_MS - 100.0, 2000.0, 0.0, READ_MS, usual_ms=2500.0)
    assert not wait_cut_short(READ_MS + 500.0, 0.0, 500.0, READ_MS, usual_ms=2500.0)


def test_a_fast_agents_fair_window_has_a_floor() -> None:
    """Twice 3 ms is the loop's jitter, not a chance to answer: the floor is FAIR_WINDOW_MIN_MS."""
    assert wait_cut_short(FAIR_WINDOW_MIN_MS - 10, 900.0, 0.0, READ_MS, usual_ms=3.0)
    assert not wait_cut_short(FAIR_WINDOW_MIN_MS + 10, 900.0, 0.0, READ_MS, usual_ms=3.0)


def test_a_deadline_short_of_what_the_agent_usually_needs_is_the_callers() -> None:
    """Without the wait it had 800 ms, and it usually needs 1 s: the caller's deadline would have
    cut it anyway, so the timeout is charged as it is without a wait."""
    assert not wait_cut_short(300.0, 500.0, 0.0, READ_MS, usual_ms=1000.0)
    assert wait_cut_short(300.0, 700.0, 0.0, READ_MS, usual_ms=1000.0)


@pytest.mark.parametrize(
    ("took_ms", "slot_ms", "pool_ms", "cut"),
    [
        (1000.0, 2500.0, 0.0, True),  # a long deadline that the wait took below the read timeout
        (READ_MS, 0.0, 1500.0, True),  # the same by the pool's wait, within the attempt's time
        (1000.0, 1500.0, 0.0, False),  # a 2.5 s deadline: short of the read timeout anyway
        (READ_MS, 1000.0, 0.0, False),  # it had its whole read timeout
    ],
)
def test_before_an_agent_has_answered_the_read_timeout_is_the_measure(
    took_ms: float, slot_ms: float, pool_ms: float, cut: bool
) -> None:
    """No answer yet, so no usual time: only a wait that took the agent below its read timeout,
    which it would have had without the wait, spares it (a hung agent's queue is charged)."""
    assert wait_cut_short(took_ms, slot_ms, pool_ms, READ_MS) is cut
    assert wait_cut_short(took_ms, slot_ms, pool_ms, READ_MS, usual_ms=None) is cut
