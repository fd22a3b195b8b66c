"""The /reach lane never asks asyncio for the running loop: on CPython 3.11 each ask is a
getpid() system call (asyncio checks for a fork), and the lane knows its loop already."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson
import pytest

from reachmesh.config import RouterConfig
from reachmesh.decision import DecisionRecord, ObserveAfterTurn
from reachmesh.testing import FakeAgent, RouterServer
from tests.helpers import until
from tests.server.test_response_writes import exchange, post_reach


@contextmanager
def counted_loop_asks(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Count calls to ``asyncio.get_running_loop`` (the name code reaches it by) meanwhile."""
    asks = [0]
    real = asyncio.get_running_loop

    def counting() -> asyncio.AbstractEventLoop:
        asks[0] += 1
        return real()

    with monkeypatch.context() as patch:
        patch.setattr(asyncio, "get_running_loop", counting)
        yield asks


async def test_lane_calls_are_observed_without_asking_for_the_running_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with RouterServer(RouterConfig()) as router:
        agent = await FakeAgent("a").start()
        try:
            await agent.register(router.url, vectors=False)
            await exchange(router.port, post_reach(), 1, close_wait_s=0)  # warm: connections made
            seen: list[str] = []
            router.app.parts.dispatcher.observers.append(lambda record: seen.append(record.trace_id))
            statuses = []
            with counted_loop_asks(monkeypatch) as asks:
                for _ in range(3):  # one call per connection: each takes the lane
                    answers, _ = await exchange(router.port, post_reach(), 1, close_wait_s=0)
                    statuses += [orjson.loads(body)["status"] for _, _, body in answers.done]
                    await asyncio.sleep(0)  # the end of the turn the answer was written in
            await until(lambda: len(seen) == 3, "the three calls observed after their answers")
        finally:
            await agent.stop()
    assert statuses == ["SUCCESS"] * 3
    assert asks[0] == 0


async def test_observe_on_a_given_loop_runs_at_the_end_of_the_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    observe = ObserveAfterTurn([seen.append], lambda _observer: None)
    loop = asyncio.get_running_loop()
    first, second = DecisionRecord.__new__(DecisionRecord), DecisionRecord.__new__(DecisionRecord)
    with counted_loop_asks(monkeypatch) as asks:
        observe.on_loop(first, loop)
        observe.on_loop(second, loop)
    assert seen == []  # not before the turn ends
    await until(lambda: len(seen) == 2, "both records observed at the end of the turn")
    assert seen == [first, second]
    assert asks[0] == 0
