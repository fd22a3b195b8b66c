"""The few-shot head: retrained in the background as the registry changes, never in a request's
way, and replaced whole (requests use the previous head meanwhile)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping

import httpx
import numpy as np

from reachmesh.config import RouterConfig
from reachmesh.semantic.head import Head, train
from reachmesh.semantic.index import SemanticIndex
from reachmesh.testing import FakeAgent, RouterServer
from tests.helpers import price_agent, scaled

REFUND = FakeAgent(
    "refund-agent",
    tasks=("refund_order",),
    descriptions={"refund_order": "refund an order that was paid"},
    examples={"refund_order": ["I want my money back", "退款", "refund my order please", "我要退钱"]},
)
TREND = FakeAgent(
    "trend-agent",
    tasks=("analyze_price_trend",),
    descriptions={"analyze_price_trend": "分析商品价格历史走势"},
    examples={"analyze_price_trend": ["过去一年价格怎么变化的", "price history of this product"]},
)


class HeldTrainer:
    """A trainer that waits, on its worker thread, until the test lets it go."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self, rows: Mapping[str, np.ndarray], generation: int, budget_s: float) -> Head | None:
        self.started.set()
        self.release.wait(scaled(30))
        return train(rows, generation, budget_s=budget_s)


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + scaled(30)
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def test_the_head_retrains_on_registration_and_deregistration_without_blocking() -> None:
    """While a retrain is held, requests by meaning are answered on the previous head; released,
    the new head covers the newcomer, and after its deregistration no longer does."""
    config = RouterConfig.from_mapping(
        {
            "health": {"enabled": False},
            "routing": {"semantic_tasks": ["*"]},
            "embedding": {"backend": "auto"},
            "limits": {"loop_lag_ms": 10_000},
        }
    )
    async with RouterServer(config) as server, httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        agents = [price_agent(), TREND, REFUND]
        for agent in agents[:2]:
            await agent.start()
            await agent.register(server.url)
        vectors = server.app.parts.vectors
        assert vectors is not None and vectors.head_state() == "current"
        before = vectors.head
        assert before is not None and set(before.tasks) == {"query_product_price", "analyze_price_trend"}

        held = HeldTrainer()
        vectors.trainer = held
        await REFUND.start()
        lease = await REFUND.register(server.url, vectors=False)
        await asyncio.to_thread(held.started.wait, scaled(30))
        assert vectors.head_state() == "training"
        answer = (await http.post("/reach", json={"targetTask": "how much does this cost"})).json()
        assert answer["status"] == "SUCCESS" and answer["route"]["task"] == "query_product_price"
        assert vectors.head is before  # routed on the previous head, whole
        held.release.set()
        await until(lambda: vectors.head_state() == "current", "the retrain")
        after = vectors.head
        assert after is not None and after.covers("refund_order")

        held = HeldTrainer()
        vectors.trainer = held
        gone = await http.delete(f"/agents/{REFUND.agent_id}", headers={"X-Reach-Lease": lease})
        assert gone.status_code == 204
        await asyncio.to_thread(held.started.wait, scaled(30))
        answer = (await http.post("/reach", json={"targetTask": "what is the price of this item"})).json()
        assert answer["status"] == "SUCCESS" and vectors.head is after
        held.release.set()
        await until(lambda: vectors.head_state() == "current", "the retrain after deregistration")
        assert vectors.head is not None and not vectors.head.covers("refund_order")
        for agent in agents:
            await agent.stop()


def test_the_head_chooses_among_the_nearest_tasks_only() -> None:
    """With a head, a text is routed to the task the head prefers among the tasks whose score
    is within reach of the nearest; a task far below the nearest is never the head's pick."""
    rng = np.random.default_rng(0)
    dim = 16
    centres = {name: rng.normal(size=dim) for name in ("a", "b", "c")}
    rows = {}
    index = SemanticIndex(dim=dim)
    for name, centre in centres.items():
        matrix = centre + 0.3 * rng.normal(size=(6, dim))
        matrix = (matrix / np.linalg.norm(matrix, axis=1, keepdims=True)).astype(np.float32)
        rows[name] = matrix
        index.add(f"agent-{name}", name, [f"{name}{i}" for i in range(6)], matrix)
    head = train(rows, index.generation)
    assert head is not None and head.steps > 0
    query = (centres["a"] / np.linalg.norm(centres["a"])).astype(np.float32)
    verdict = index.judge(query, threshold=-1.0, margin=0.0, head=(head, 0.0))
    assert verdict.task == "a"
