"""The head's query rows: embedded after the passage rows, kept only beside them, and retried
when the embedder failed, so the head is never left training on half of them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np

from reachmesh.exceptions import EmbeddingError, EmbeddingUnavailable
from reachmesh.protocol import AgentProfile
from reachmesh.registry.base import AgentEntry
from reachmesh.semantic.embedders.base import Kind, Vectors, normalise
from reachmesh.semantic.head import query_rows
from reachmesh.semantic.headrows import HeadRows
from reachmesh.semantic.index import SemanticIndex, capability_texts
from tests.helpers import scaled


def entry(agent_id: str) -> AgentEntry:
    profile = AgentProfile.model_validate(
        {
            "id": agent_id,
            "network": {"endpoint": "http://127.0.0.1:9/reach"},
            "capabilities": [{"task": "refund_order", "description": "refund it", "examples": ["a", "b"]}],
        }
    )
    return AgentEntry(profile, "lease-" + agent_id, 30, 0.0, 0.0, 30.0)


def vector(text: str, kind: str) -> Vectors:
    seed = sum(map(ord, f"{kind}:{text}"))
    row: Vectors = normalise(np.random.default_rng(seed).normal(size=(1, 8)))[0]
    return row


class FailsFirst:
    """Fails its first query call (the embedder down), then answers; every call recorded."""

    model = "fake"
    dim = 8
    thresholds = (0.1, 0.0)

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str]]] = []

    async def embed(self, texts: list[str], kind: Kind) -> Vectors:
        self.calls.append((kind, texts))
        if len(self.calls) == 1:
            raise EmbeddingUnavailable("service down")
        return np.stack([vector(t, kind) for t in texts])

    async def close(self) -> None:
        pass


async def until(condition: Callable[[], object], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + scaled(30)
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def test_query_rows_fail_are_retried_and_only_then_the_head_may_train() -> None:
    agent = entry("refunds")
    texts = capability_texts("refund_order", "refund it", ["a", "b"])
    index = SemanticIndex(dim=8)
    index.add(agent.id, "refund_order", texts, np.stack([vector(t, "passage") for t in texts]))
    embedder = FailsFirst()
    failures: list[EmbeddingError] = []
    changes: list[int] = []
    rows = HeadRows(
        embedder,
        index,
        lambda e: [("refund_order", t) for t in texts],
        lambda e: True,
        lambda: changes.append(1),
        failures.append,
    )
    worker = asyncio.create_task(rows.run())
    try:
        rows.schedule(agent)
        await until(lambda: failures, "the failure")
        assert rows.pending() == 1 and not changes
        # The head would cover refund_order but its query rows are missing: no head yet.
        assert query_rows(index.task_matrices(), rows.task_matrices()) is None
        rows.retry()
        await until(lambda: changes, "the query rows")
        assert rows.pending() == 0
        trained = query_rows(index.task_matrices(), rows.task_matrices())
        assert trained is not None
        expected = np.stack([vector(t, "query") for t in texts])
        # Query vectors (float16 in the index), one per text, never the passage ones.
        assert np.allclose(np.sort((trained["refund_order"] @ expected.T).max(axis=1)), 1.0, atol=2e-3)
        assert all(kind == "query" for kind, _ in embedder.calls)
        # Gone with its agent, as the passage rows are.
        rows.forget(agent.id)
        index.remove_agent(agent.id)
        assert rows.task_matrices() == {} and query_rows(index.task_matrices(), rows.task_matrices()) == {}
    finally:
        worker.cancel()
