"""A plain success is booked once its answer is written (dispatch.attempts._book_success): the
agent's slot, its stats, its breaker and the trace's "forward" line wait for the write, then are
in place before anything else runs; the next call sees them. Real Router, real agents on loopback."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import httpx
import pytest

from reachmesh.config import RouterConfig
from reachmesh.decision import DecisionRecord, ObserveAfterTurn
from reachmesh.resilience.breaker import BreakerState
from reachmesh.testing import FakeAgent, RouterServer
from tests.helpers import scaled

BODY = json.dumps({"targetTask": "echo", "payload": {"n": 1}}).encode()


@pytest.fixture
async def router() -> AsyncIterator[tuple[RouterServer, httpx.AsyncClient, FakeAgent]]:
    policy: dict[str, Any] = {"health": {"enabled": False}, "breaker": {"failure_threshold": 1}}
    async with RouterServer(RouterConfig.from_mapping(policy)) as server:
        agent = await FakeAgent("one", max_concurrency=1).start()
        try:
            await agent.register(server.url, vectors=False)
            async with httpx.AsyncClient(base_url=server.url, timeout=scaled(30)) as http:
                yield server, http, agent
        finally:
            await agent.stop()


def reach(http: httpx.AsyncClient) -> Awaitable[httpx.Response]:
    return http.post("/reach", content=BODY, headers={"content-type": "application/json"})


def _forwards(record: DecisionRecord) -> list[str]:
    return [text for kind, text in record.events if kind == "forward"]


async def test_a_held_success_books_its_slot_stats_and_trace_line_when_observed(router) -> None:
    """With ``hold`` (the lane's way), the answer is encoded with the attempt in it, but the slot
    stays taken and the stats unbooked until the record is handed on; then all of it at once,
    in the same step, before the end of the turn."""
    server, _http, _agent = router
    parts = server.app.parts
    forwarding = parts.dispatcher.forwarding
    held: list[DecisionRecord] = []
    status, body = await parts.dispatcher.handle(BODY, hold=held)
    answer = json.loads(body)
    assert (status, answer["status"], answer["handlerAgentId"]) == (200, "SUCCESS", "one")
    assert [a["outcome"] for a in answer["attempts"]] == ["SUCCESS"]
    (record,) = held
    assert forwarding.capacity.inflight("one") == 1  # the answer is not written yet
    assert forwarding.stats.snapshot("one")["inflight"] == 1
    assert _forwards(record) == []
    parts.observe_later(record)  # what the server calls right after the write
    assert forwarding.capacity.inflight("one") == 0
    stats = forwarding.stats.snapshot("one")
    assert (stats["requests"], stats["inflight"], stats["successRate"]) == (1, 0, 1.0)
    (line,) = _forwards(record)
    assert line.startswith("one, duration=")
    parts.observe_later(record)  # settled once: a second hand-over books nothing again
    assert forwarding.stats.snapshot("one")["requests"] == 1
    assert forwarding.capacity.inflight("one") == 0


async def test_without_hold_the_dispatcher_books_before_its_observers_read(router) -> None:
    server, _http, _agent = router
    dispatcher = server.app.parts.dispatcher
    seen: list[tuple[int, int, list[str]]] = []
    forwarding = dispatcher.forwarding

    def observer(record: DecisionRecord) -> None:
        stats = forwarding.stats.snapshot("one")
        seen.append((forwarding.capacity.inflight("one"), stats["requests"], _forwards(record)))

    dispatcher.observers.append(observer)
    try:
        status, _body = await dispatcher.handle(BODY)
    finally:
        dispatcher.observers.remove(observer)
    assert status == 200
    ((inflight, requests, forwards),) = seen
    assert (inflight, requests, len(forwards)) == (0, 1, 1)


async def test_each_call_through_the_lane_finds_the_last_ones_slot_free_and_booked(router) -> None:
    """max_concurrency 1 and calls one after another: none waits for the slot the one before
    held, and the agent's row counts every one as it ends."""
    server, http, agent = router
    forwarding = server.app.parts.dispatcher.forwarding
    for n in range(1, 6):
        answer = (await reach(http)).json()
        assert answer["status"] == "SUCCESS"
        assert forwarding.capacity.inflight("one") == 0
        row = (await http.get("/admin/agents/one")).json()
        assert (row["stats"]["requests"], row["stats"]["inflight"]) == (n, 0)
        trace = (await http.get(f"/admin/traces/{answer['traceId']}")).json()
        (hop,) = trace["hops"]
        assert "slot wait" not in json.dumps(hop)  # it never waited for the slot
        assert "one, duration=" in json.dumps(hop)  # the forward line of the attempt
    assert len(agent.received) == 5


async def test_a_half_open_probe_that_succeeds_closes_the_breaker_before_the_next_call(router) -> None:
    """A breaker's probe success is booked after its answer is written: the next call finds the
    breaker closed, and the probe's trace says so."""
    server, http, _agent = router
    forwarding = server.app.parts.dispatcher.forwarding
    breakers = forwarding.breakers
    assert breakers.record("one", "echo", ok=False) is BreakerState.OPEN  # threshold 1
    breaker = breakers._get("one", "echo")
    assert breaker is not None
    breaker.opened_at = -1e9  # long ago: the next call is the half-open probe
    answer = (await reach(http)).json()
    assert answer["status"] == "SUCCESS"
    assert breaker.state is BreakerState.CLOSED
    trace = (await http.get(f"/admin/traces/{answer['traceId']}")).json()
    assert "circuit closed" in json.dumps(trace)
    again = (await reach(http)).json()
    assert again["status"] == "SUCCESS"
    assert breaker.state is BreakerState.CLOSED


def test_the_record_is_settled_as_it_is_handed_over_and_observed_at_the_end_of_the_turn() -> None:
    """ObserveAfterTurn settles a record at once (its book-keeping must precede any other call's
    routing), and observes it later in the turn; a bug in the book-keeping is logged and costs
    the observers nothing."""
    order: list[str] = []
    observe = ObserveAfterTurn([lambda r: order.append(f"observed {r.trace_id}")], lambda _o: None)

    def broken() -> None:
        order.append("settled t2")
        raise RuntimeError("a bug in the book-keeping")

    async def main() -> None:
        first = DecisionRecord(trace_id="t1", task="echo", source="-", started=0.0)
        first.after_answer = lambda: order.append("settled t1")
        second = DecisionRecord(trace_id="t2", task="echo", source="-", started=0.0)
        second.after_answer = broken
        observe(first)
        observe(second)
        assert order == ["settled t1", "settled t2"]  # at once, in the caller's step
        assert [first.after_answer, second.after_answer] == [None, None]  # settled once
        done = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(done.set_result, None)
        await done
        assert order[2:] == ["observed t1", "observed t2"]

    asyncio.run(main())
