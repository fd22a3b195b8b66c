"""The few-shot head: retrained in the background as the registry changes, never in a request's
way, and replaced whole (requests use the previous head meanwhile)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager

import httpx
import numpy as np

from reachmesh.config import RouterConfig
from reachmesh.semantic.embedders.base import Kind
from reachmesh.semantic.embedders.local import LocalEmbedder
from reachmesh.semantic.head import Head, train
from reachmesh.semantic.index import SemanticIndex, capability_texts
from reachmesh.semantic.queue import VectorState
from reachmesh.semantic.vectors import CapabilityVectors
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


@asynccontextmanager
async def a_router_with_a_head() -> AsyncIterator[
    tuple[RouterServer, httpx.AsyncClient, CapabilityVectors, Head]
]:
    """A Router routing by meaning with the price and trend agents registered and its head
    trained on them; REFUND is left for the test to register (and is stopped with the rest)."""
    config = RouterConfig.from_mapping(
        {
            "health": {"enabled": False},
            "routing": {"semantic_tasks": ["*"]},
            "embedding": {"backend": "auto"},
            "limits": {"loop_lag_ms": 10_000},
        }
    )
    agents = [price_agent(), TREND, REFUND]
    async with RouterServer(config) as server, httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        try:
            for agent in agents[:2]:
                await agent.start()
                await agent.register(server.url)
            vectors = server.app.parts.vectors
            assert vectors is not None and vectors.head_state() == "current"
            before = vectors.head
            assert before is not None and set(before.tasks) == {"query_product_price", "analyze_price_trend"}
            yield server, http, vectors, before
        finally:
            for agent in agents:
                await agent.stop()


async def test_the_head_retrains_on_registration_and_deregistration_without_blocking() -> None:
    """While a retrain is held, requests by meaning are answered on the previous head; released,
    the new head covers the newcomer, and after its deregistration no longer does."""
    async with a_router_with_a_head() as (server, http, vectors, before):
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
    verdict = index.judge(query, threshold=-1.0, margin=0.0, head=(head, 0.0, 0.0))
    assert verdict.task == "a"


class HeldBackground:
    """The bundled embedder, with its background work (the head's query rows) held until the
    test lets it go; a caller's queries and registrations' passages pass at once."""

    def __init__(self, inner: LocalEmbedder) -> None:
        self.inner = inner
        self.model = inner.model
        self.dim = inner.dim
        self.thresholds = inner.thresholds
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def embed(self, texts: list[str], kind: Kind) -> np.ndarray:
        return await self.inner.embed(texts, kind)

    async def embed_in_background(self, texts: list[str], kind: Kind) -> np.ndarray:
        self.started.set()
        await self.release.wait()
        return await self.inner.embed_in_background(texts, kind)

    async def close(self) -> None:
        pass


class RecordingTrainer:
    def __init__(self) -> None:
        self.rows: list[Mapping[str, np.ndarray]] = []

    def __call__(self, rows: Mapping[str, np.ndarray], generation: int, budget_s: float) -> Head | None:
        self.rows.append(rows)
        return train(rows, generation, budget_s=budget_s)


async def test_the_head_trains_on_the_texts_embedded_as_queries_after_the_agent_is_routable() -> None:
    """A newcomer is routable by meaning as soon as its passage rows are in; its texts are then
    embedded a second time, as queries, in the background; the head (the previous one until
    then) is retrained on those query rows, never on the passage rows."""
    async with a_router_with_a_head() as (server, http, vectors, before):
        local = LocalEmbedder()
        held = HeldBackground(local)
        vectors.head_rows.embedder = held
        recorder = RecordingTrainer()
        vectors.trainer = recorder
        await REFUND.start()
        await REFUND.register(server.url, vectors=False)
        await until(lambda: vectors.state(REFUND.agent_id) == VectorState.READY, "the passage rows")
        await asyncio.wait_for(held.started.wait(), scaled(30))
        answer = (await http.post("/reach", json={"targetTask": "I want my money back for this"})).json()
        assert answer["status"] == "SUCCESS" and answer["route"]["task"] == "refund_order", answer
        assert vectors.head_state() == "training" and vectors.head is before and not recorder.rows
        held.release.set()
        await until(lambda: vectors.head_state() == "current", "the retrain on query rows")
        assert vectors.head is not None and vectors.head.covers("refund_order")
        texts = capability_texts(
            "refund_order", REFUND.descriptions["refund_order"], REFUND.examples["refund_order"]
        )
        trained = recorder.rows[-1]["refund_order"]
        asked = local.embed_sync(texts, "query")
        assert trained.shape == asked.shape
        # Each row trained on is one of the query vectors (float16 in the index), and not the
        # passage vectors the similarity scores against.
        assert np.allclose((trained @ asked.T).max(axis=1), 1.0, atol=2e-3)
        passages = local.embed_sync(texts, "passage")
        assert not np.allclose((trained @ passages.T).max(axis=1), 1.0, atol=2e-3)
