"""CapacityBoard: slots per agent, a FIFO queue with a bound, and a wake-up never lost."""

from __future__ import annotations

import asyncio

import pytest

from reachmesh.resilience.capacity import CapacityBoard, Displaced, QueueFull
from tests.helpers import scaled, until


async def queued(board: CapacityBoard, agent: str, n: int) -> None:
    await until(lambda: board.queued(agent) == n, f"{n} waiting")


async def test_slots_are_handed_over_first_come_first_served_within_the_queue_bound() -> None:
    board = CapacityBoard(max_queued=2)
    far = asyncio.get_running_loop().time() + scaled(30)
    assert await board.take("a", 1, far) == 0.0
    first = asyncio.ensure_future(board.take("a", 1, far))
    await queued(board, "a", 1)
    second = asyncio.ensure_future(board.take("a", 1, far))
    await queued(board, "a", 2)
    assert board.queue_full("a", 1)
    with pytest.raises(QueueFull):
        await board.take("a", 1, far)
    board.give("a")
    await first
    assert not second.done() and board.inflight("a") == 1
    board.give("a")
    await second
    board.give("a")
    assert board.inflight("a") == 0 and board.queued("a") == 0


async def test_a_waiter_cancelled_as_it_is_handed_the_slot_passes_it_on() -> None:
    """give() hands the slot to the first waiter, which is cancelled before it runs: the slot
    goes to the next waiter instead of being lost (both would sleep on a free slot)."""
    board = CapacityBoard()
    far = asyncio.get_running_loop().time() + scaled(30)
    await board.take("a", 1, far)
    first = asyncio.ensure_future(board.take("a", 1, far))
    await queued(board, "a", 1)
    second = asyncio.ensure_future(board.take("a", 1, far))
    await queued(board, "a", 2)
    board.give("a")  # the slot is first's now...
    first.cancel()  # ...but it leaves before it could use it
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(second, scaled(5))
    assert board.inflight("a") == 1


async def test_a_wait_ends_at_its_due_time_holding_nothing() -> None:
    board = CapacityBoard()
    loop = asyncio.get_running_loop()
    await board.take("a", 1, loop.time() + scaled(30))
    with pytest.raises(TimeoutError):
        await board.take("a", 1, loop.time() + 0.05)
    assert board.inflight("a") == 1 and board.queued("a") == 0


async def test_an_agent_without_a_capacity_is_counted_but_never_waits() -> None:
    board = CapacityBoard()
    far = asyncio.get_running_loop().time() + scaled(30)
    for _ in range(5):
        assert await board.take("free", None, far) == 0.0
    assert board.inflight("free") == 5 and board.has_room("free", None)


async def test_a_capacity_lowered_by_a_re_registration_is_kept_at_once() -> None:
    """Two in flight at capacity 2, one waiting; the agent re-registers with capacity 1. A slot
    given back then is not handed on (that kept 2 in flight to an agent that asked for 1): the
    waiter gets the next one, when only it is in flight."""
    board = CapacityBoard()
    far = asyncio.get_running_loop().time() + scaled(30)
    await board.take("a", 2, far)
    await board.take("a", 2, far)
    waiter = asyncio.ensure_future(board.take("a", 2, far))
    await queued(board, "a", 1)
    assert not board.take_now("a", 1)  # the new profile's first request: max_concurrency 1
    board.give("a")
    assert board.inflight("a") == 1 and board.queued("a") == 1  # the slot went, not to the waiter
    board.give("a")
    await asyncio.wait_for(waiter, scaled(5))
    assert board.inflight("a") == 1 and board.queued("a") == 0


async def test_a_capacity_raised_by_a_re_registration_wakes_the_waiters_it_has_room_for() -> None:
    """One in flight at capacity 1, two waiting; the agent re-registers with capacity 3: both
    waiters get a slot at once, not one each time a request ends."""
    board = CapacityBoard()
    far = asyncio.get_running_loop().time() + scaled(30)
    await board.take("a", 1, far)
    waiters = [asyncio.ensure_future(board.take("a", 1, far)) for _ in range(2)]
    await queued(board, "a", 2)
    assert not board.take_now("a", 3)  # behind the two already waiting: first come, first served
    await asyncio.wait_for(asyncio.gather(*waiters), scaled(5))
    assert board.inflight("a") == 3 and board.queued("a") == 0


async def test_a_held_slot_counts_until_its_time_then_goes_to_the_first_waiter() -> None:
    """hold() (a busy answer: the agent is full with another Router's requests) takes a slot
    for the Retry-After and then gives it back, to a waiter if one is queued."""
    board = CapacityBoard()
    far = asyncio.get_running_loop().time() + scaled(30)
    assert await board.take("a", 2, far) == 0.0
    board.hold("a", 2, 0.05)
    assert board.inflight("a") == 2 and not board.has_room("a", 2)
    waiter = asyncio.ensure_future(board.take("a", 2, far))
    await queued(board, "a", 1)
    await asyncio.wait_for(waiter, scaled(10))  # the hold ran out: its slot went to the waiter
    assert board.inflight("a") == 2
    board.give("a")
    board.give("a")
    assert board.inflight("a") == 0


async def _line_up(board: CapacityBoard, clients: list[str], far: float) -> list[asyncio.Future[float]]:
    """One waiter per entry of ``clients`` at the full agent "a", each queued before the next."""
    waiters: list[asyncio.Future[float]] = []
    for n, client in enumerate(clients, 1):
        waiters.append(asyncio.ensure_future(board.take("a", 1, far, client)))
        await queued(board, "a", n)
    return waiters


async def _served(board: CapacityBoard, waiters: list[asyncio.Future[float]]) -> list[int]:
    """The order the waiters are handed the slot in, one give() (the call in flight ending) each."""
    order: list[int] = []
    for _ in waiters:
        board.give("a")
        await until(lambda: sum(w.done() for w in waiters) == len(order) + 1, "the next one served")
        order.append(next(i for i, w in enumerate(waiters) if w.done() and i not in order))
    return order


async def test_clients_waiting_at_a_full_agent_take_turns_each_first_come_first_served() -> None:
    """Four of client A's calls wait, then two of B's, then one of C's: a slot that comes back
    goes to the oldest waiter of the client whose turn it is, and that client goes to the back
    of the turns. B's and C's calls are not served behind the whole of A's line."""
    board = CapacityBoard()
    far = asyncio.get_running_loop().time() + scaled(30)
    await board.take("a", 1, far, "A")
    waiters = await _line_up(board, ["A", "A", "A", "A", "B", "B", "C"], far)
    assert await _served(board, waiters) == [0, 4, 6, 1, 5, 2, 3]
    board.give("a")
    assert board.inflight("a") == 0 and board.waiting("a") == 0


async def test_one_client_alone_is_served_exactly_first_come_first_served() -> None:
    board = CapacityBoard()
    far = asyncio.get_running_loop().time() + scaled(30)
    await board.take("a", 1, far, "A")
    waiters = await _line_up(board, ["A"] * 6, far)
    assert await _served(board, waiters) == list(range(6))


async def test_a_client_whose_waiters_all_gave_up_loses_its_turn_and_nothing_is_kept() -> None:
    """B's only waiter gives up: B leaves the turns at once (its line held nothing to serve),
    and B waiting again later joins at the back, one turn, not two."""
    board = CapacityBoard()
    far = asyncio.get_running_loop().time() + scaled(30)
    await board.take("a", 1, far, "A")
    first = await _line_up(board, ["A", "B", "A"], far)
    first[1].cancel()
    with pytest.raises(asyncio.CancelledError):
        await first[1]
    assert board.waiting("a") == 2
    again = asyncio.ensure_future(board.take("a", 1, far, "B"))
    await queued(board, "a", 3)
    waiters = [first[0], again, first[2]]
    assert await _served(board, waiters) == [0, 1, 2]
    board.give("a")
    assert board.inflight("a") == 0 and board._agents == {}


async def test_a_raised_capacity_wakes_waiters_in_turn() -> None:
    board = CapacityBoard()
    far = asyncio.get_running_loop().time() + scaled(30)
    await board.take("a", 1, far, "A")
    waiters = await _line_up(board, ["A", "A", "B"], far)
    assert not board.take_now("a", 3)  # room for two: A's first and B's, not A's two
    await asyncio.wait_for(asyncio.gather(waiters[0], waiters[2]), scaled(5))
    assert not waiters[1].done() and board.inflight("a") == 3
    board.give("a")
    await asyncio.wait_for(waiters[1], scaled(5))


# -- a full queue: the client holding the most gives way (round 50) ---------------------------


def _outcome(waiter: asyncio.Future[float]) -> str:
    if not waiter.done():
        return "waiting"
    if waiter.cancelled():
        return "cancelled"
    exc = waiter.exception()
    return "served" if exc is None else type(exc).__name__


async def test_a_full_queue_makes_room_for_another_client_by_displacing_the_newest_of_the_most() -> None:
    """Client A stands the whole line (3 of 3). B's call is not refused: A's newest waiter is
    answered at once (Displaced, a QueueFull: nothing held), and B's call takes its place."""
    board = CapacityBoard(max_queued=3)
    far = asyncio.get_running_loop().time() + scaled(30)
    await board.take("a", 1, far, "A")
    a = await _line_up(board, ["A", "A", "A"], far)
    assert board.queue_full("a", 1, "A") and not board.queue_full("a", 1, "B")
    b = asyncio.ensure_future(board.take("a", 1, far, "B"))
    await until(lambda: a[2].done(), "A's newest displaced")
    with pytest.raises(Displaced) as caught:
        a[2].result()
    assert isinstance(caught.value, QueueFull) and caught.value.agent_id == "a"
    assert [_outcome(w) for w in a[:2]] == ["waiting", "waiting"]
    assert board.queued("a") == 3 and board.waiting("a") == 3 and board.inflight("a") == 1
    assert await _served(board, [a[0], b, a[1]]) == [0, 1, 2]  # B in its turn, A first come first
    board.give("a")
    assert board._agents == {}


async def test_a_client_holding_the_most_tied_or_one_fewer_is_refused_as_before() -> None:
    """A and B hold 2 each of 4: neither displaces the other (tied). With A 2 and B 1 of 3, B is
    refused too: taking A's place would only make B the one holding the most, and A's next call
    would take it back (a call answered 429 each time, no share made fairer)."""
    board = CapacityBoard(max_queued=4)
    far = asyncio.get_running_loop().time() + scaled(30)
    await board.take("a", 1, far, "A")
    waiters = await _line_up(board, ["A", "A", "B", "B"], far)
    for client in ("A", "B"):
        assert board.queue_full("a", 1, client)
        with pytest.raises(QueueFull) as caught:
            await board.take("a", 1, far, client)
        assert not isinstance(caught.value, Displaced)
    assert [_outcome(w) for w in waiters] == ["waiting"] * 4
    board.max_queued = 3
    waiters[3].cancel()
    await until(lambda: board.queued("a") == 3, "B's second gone")
    with pytest.raises(QueueFull):
        await board.take("a", 1, far, "B")
    assert [_outcome(w) for w in waiters[:3]] == ["waiting"] * 3


async def test_among_clients_tied_for_the_most_the_one_that_came_to_it_last_gives_way() -> None:
    """A and B hold 2 each of 4, B's second arriving last: C's call displaces B's newest, then
    D's call A's (now the only one holding 2); then each holds one, and E is refused."""
    board = CapacityBoard(max_queued=4)
    far = asyncio.get_running_loop().time() + scaled(30)
    await board.take("a", 1, far, "A")
    waiters = await _line_up(board, ["A", "B", "A", "B"], far)
    c = asyncio.ensure_future(board.take("a", 1, far, "C"))
    await until(lambda: waiters[3].done(), "B's newest displaced")
    d = asyncio.ensure_future(board.take("a", 1, far, "D"))
    await until(lambda: waiters[2].done(), "A's newest displaced")
    assert [_outcome(w) for w in waiters] == ["waiting", "waiting", "Displaced", "Displaced"]
    with pytest.raises(QueueFull):
        await board.take("a", 1, far, "E")
    assert await _served(board, [waiters[0], waiters[1], c, d]) == [0, 1, 2, 3]


async def test_a_displaced_waiter_cancelled_before_it_runs_holds_and_hands_on_nothing() -> None:
    """Displaced, then its caller goes before the waiter runs: it ends cancelled, gives back no
    slot it never had (in flight stays 1) and leaves the count once (queued stays at the bound)."""
    board = CapacityBoard(max_queued=2)
    far = asyncio.get_running_loop().time() + scaled(30)
    await board.take("a", 1, far, "A")
    a = await _line_up(board, ["A", "A"], far)
    b = asyncio.ensure_future(board.take("a", 1, far, "B"))
    # Run after B's call displaces A's newest and before that waiter wakes (callbacks in order).
    asyncio.get_running_loop().call_soon(a[1].cancel)
    with pytest.raises(asyncio.CancelledError):
        await a[1]
    assert board.inflight("a") == 1 and board.queued("a") == 2
    assert await _served(board, [a[0], b]) == [0, 1]
    board.give("a")
    assert board._agents == {}


async def test_a_queue_given_room_by_a_raised_capacity_displaces_nobody() -> None:
    """The call that finds the line full also brings a raised capacity (a re-registration): the
    slots that frees go to the first waiters in turn first, and the call joins the line without
    displacing anybody. A waiter is never both handed a slot and displaced."""
    board = CapacityBoard(max_queued=3)
    far = asyncio.get_running_loop().time() + scaled(30)
    await board.take("a", 1, far, "A")
    a = await _line_up(board, ["A", "A", "A"], far)
    b = asyncio.ensure_future(board.take("a", 2, far, "B"))
    await until(lambda: a[0].done(), "A's first handed the raised slot")
    await queued(board, "a", 3)
    assert [_outcome(w) for w in a] == ["served", "waiting", "waiting"] and not b.done()
    assert board.inflight("a") == 2


async def test_retry_after_counts_the_callers_place_in_the_turns_not_the_whole_line() -> None:
    """Capacity 1 and 1 s a call; A has 6 waiting, B 1. A new call of A's is served after all 7
    (8 s); B's after one more of A's and its own first (place 4, 4 s); a new client's after one
    of each (place 3, 3 s). The whole line, as before, said 8 s to all three."""
    board = CapacityBoard()
    far = asyncio.get_running_loop().time() + scaled(30)
    await board.take("a", 1, far, "A")
    await _line_up(board, ["A"] * 6 + ["B"], far)
    assert board.retry_after_s("a", 1000.0, 1, "A") == 8
    assert board.retry_after_s("a", 1000.0, 1, "B") == 4
    assert board.retry_after_s("a", 1000.0, 1, "C") == 3
    assert board.retry_after_s("idle", 1000.0, 1, "C") == 1
