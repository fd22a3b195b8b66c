"""CapacityBoard: a freed slot passes over a late waiter (too little of its deadline left) for
one that is not, and serves the turns as ever when every waiter is late (or none has a time)."""

from __future__ import annotations

import asyncio

from reachmesh.resilience.capacity import CapacityBoard
from tests.helpers import scaled, until


async def queued(board: CapacityBoard, n: int) -> None:
    await until(lambda: board.queued("a") == n, f"{n} waiting")


async def test_a_freed_slot_passes_over_a_late_waiter_for_one_with_time() -> None:
    board = CapacityBoard()
    now = asyncio.get_running_loop().time()
    far = now + scaled(30)
    await board.take("a", 1, far)
    late = asyncio.ensure_future(board.take("a", 1, far, "x", late_at=now - 1))
    await queued(board, 1)
    fresh = asyncio.ensure_future(board.take("a", 1, far, "y", late_at=far))
    await queued(board, 2)
    board.give("a")
    await fresh
    assert not late.done() and board.queued("a") == 1
    board.give("a")  # nobody with more time waits: the late one is served after all
    await late
    board.give("a")
    assert board.inflight("a") == 0 and board.queued("a") == 0


async def test_within_one_client_a_later_call_with_time_goes_before_a_late_one() -> None:
    board = CapacityBoard()
    now = asyncio.get_running_loop().time()
    far = now + scaled(30)
    await board.take("a", 1, far)
    late = asyncio.ensure_future(board.take("a", 1, far, "x", late_at=now - 1))
    await queued(board, 1)
    unknown = asyncio.ensure_future(board.take("a", 1, far, "x"))  # no time known: never late
    await queued(board, 2)
    board.give("a")
    await unknown
    assert not late.done()
    board.give("a")
    await late
    board.give("a")
    assert board.inflight("a") == 0 and board.queued("a") == 0


async def test_when_every_waiter_is_late_the_first_come_is_served_first() -> None:
    board = CapacityBoard()
    now = asyncio.get_running_loop().time()
    far = now + scaled(30)
    await board.take("a", 1, far)
    first = asyncio.ensure_future(board.take("a", 1, far, late_at=now - 2))
    await queued(board, 1)
    second = asyncio.ensure_future(board.take("a", 1, far, late_at=now - 1))
    await queued(board, 2)
    board.give("a")
    await first
    assert not second.done()
    board.give("a")
    await second
    board.give("a")
    assert board.inflight("a") == 0 and board.queued("a") == 0
