"""Per-agent request statistics (routing/stats.py)."""

from __future__ import annotations

from reachmesh.clock import ManualClock
from reachmesh.routing.stats import StatsBook


def _book() -> tuple[StatsBook, ManualClock]:
    clock = ManualClock()
    return StatsBook(clock=clock, tau_seconds=2.0), clock


def test_a_success_booked_by_succeeded_is_booked_as_finished_books_it() -> None:
    """succeeded() is finished(ok=True) without its tests of ``ok``, on every successful call:
    the same counts, window, averages and in-flight count, a decline streak ended too."""
    books = [_book(), _book()]
    for book, clock in books:
        book.started("a")
        book.finished("a", ok=False, latency_ms=40.0)
        book.declined("a")
        for latency in (12.0, 30.0, 7.5):
            clock.advance(0.7)
            book.started("a")
            if book is books[0][0]:
                book.finished("a", ok=True, latency_ms=latency)
            else:
                book.succeeded("a", latency)
    (fin, _), (succ, _) = books
    assert fin.snapshot("a") == succ.snapshot("a")
    assert fin.merit("a") == succ.merit("a")
    assert fin.usual_answer_ms("a") == succ.usual_answer_ms("a")
    assert fin.declined("a") == succ.declined("a") == 1  # the streak began again at the success
    fresh = StatsBook(clock=ManualClock())
    fresh.started("b")
    fresh.succeeded("b", 5.0)
    assert fresh.merit("b") == (1.0, 5.0) and fresh.snapshot("b")["inflight"] == 0
    fresh.succeeded("gone", 5.0)  # an agent forgotten mid-flight: nothing to book
    assert fresh.snapshot("gone")["requests"] == 0


def test_the_usual_answer_time_follows_answers_alone() -> None:
    """usual_answer_ms (what a timeout after a wait in the Router is weighed against) averages the
    latency of answers only: a failure (a charged timeout at its full time) does not stretch it,
    an attempt booked for nobody (ok None) does not move it; the latency average takes both."""
    book, clock = _book()
    assert book.usual_answer_ms("a") is None
    book.started("a")
    book.finished("a", ok=False, latency_ms=2500.0)  # a timeout before any answer
    assert book.usual_answer_ms("a") is None
    for latency in (100.0, 100.0):
        clock.advance(1.0)
        book.started("a")
        book.succeeded("a", latency)
    usual = book.usual_answer_ms("a")
    assert usual == 100.0
    clock.advance(1.0)
    book.started("a")
    book.finished("a", ok=False, latency_ms=2500.0)
    clock.advance(1.0)
    book.started("a")
    book.finished("a", ok=None, latency_ms=2500.0)
    assert book.usual_answer_ms("a") == usual
    average = book.merit("a")[1]
    assert average is not None and average > usual  # the failure's time, for routing by merit
    clock.advance(1.0)
    book.started("a")
    book.finished("a", ok=True, latency_ms=300.0)  # an answer booked by finished() counts too
    moved = book.usual_answer_ms("a")
    assert moved is not None and 100.0 < moved < 300.0
    book.forget("a")
    assert book.usual_answer_ms("a") is None


def test_the_quick_latency_is_that_of_the_fastest_share_of_recent_attempts() -> None:
    """An agent that answers nine calls in 100 ms and one in 10 s "usually" takes about a second,
    yet a tenth of its attempts took 100 ms at most."""
    book = StatsBook(clock=ManualClock())
    assert book.quick_latency_ms("a", 0.1) is None
    for latency in [100.0] * 9 + [10_000.0]:
        book.started("a")
        book.succeeded("a", latency)
    assert book.quick_latency_ms("a", 0.1) == 100.0
    assert book.quick_latency_ms("a", 0.95) == 10_000.0
