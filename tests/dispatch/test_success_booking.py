"""What a plain success books (the agent's slot back, its stats, its breaker, the trace's
"forward" line) is in place for the next call and for the record's observers: whatever moves
that book-keeping around the answer's write must keep these. Real Router, real agents on
loopback."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import httpx
import pytest

from reachmesh.config import RouterConfig
from reachmesh.decision import DecisionRecord
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


async def test_the_observers_find_the_success_booked(router) -> None:
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
    """The next call finds the breaker its probe closed, and the probe's trace says so."""
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
