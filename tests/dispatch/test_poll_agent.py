"""While an attempt waits for an agent that answers fast, the loop keeps polling for the answer
(dispatch.attempts._KeepPolling) instead of sleeping: for a bounded time, and only then."""

from __future__ import annotations

import asyncio

from reachmesh.clock import ManualClock
from reachmesh.dispatch.attempts import POLL_AGENT_S, _KeepPolling, _poll_for
from reachmesh.routing.stats import StatsBook
from tests.helpers import until


async def _turns(count: int) -> None:
    """Return once the loop has run ``count`` more turns."""
    loop = asyncio.get_running_loop()
    for _ in range(count):
        done = loop.create_future()
        loop.call_soon(done.set_result, None)
        await done


class _Counted(_KeepPolling):
    __slots__ = ("calls",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
        super().__call__()


async def test_the_poll_runs_every_turn_until_the_attempt_is_done() -> None:
    loop = asyncio.get_running_loop()
    poll = _Counted(loop)
    poll._until = float("inf")  # only ``done`` stops it here
    loop.call_soon(poll)
    await until(lambda: poll.calls >= 3, "the poll scheduling itself again")
    poll.done = True
    seen = poll.calls
    await _turns(3)
    assert poll.calls <= seen + 1  # at most the one already due


async def test_the_poll_stops_by_itself_when_its_time_is_up() -> None:
    loop = asyncio.get_running_loop()
    poll = _Counted(loop)
    poll._until = 0.0  # POLL_AGENT_S already gone: an answer that is late costs no more
    loop.call_soon(poll)
    await _turns(3)
    assert (poll.calls, poll.done) == (1, False)


async def test_only_an_agent_that_answers_within_the_poll_is_polled_for() -> None:
    stats = StatsBook(clock=ManualClock())
    assert _poll_for(stats, "new") is None  # no latency known yet
    for agent_id, latency_ms in (("fast", POLL_AGENT_S * 1000 / 2), ("slow", 5.0)):
        stats.started(agent_id)
        stats.succeeded(agent_id, latency_ms)
    assert _poll_for(stats, "slow") is None
    poll = _poll_for(stats, "fast")
    assert poll is not None
    poll.done = True  # the attempt ended: the callback already due schedules nothing more
