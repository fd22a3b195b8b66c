"""A caller never waits longer than embedding.timeout_ms for the texts every score is measured
against, and those texts are embedded once, off the request path, whoever asks first."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from reachmesh.config import EmbeddingPolicy
from reachmesh.exceptions import EmbeddingUnavailable
from reachmesh.registry.memory import MemoryRegistry
from reachmesh.semantic.embedders.base import Kind, Vectors, normalise
from reachmesh.semantic.vectors import CapabilityVectors


class HeldPassages:
    """Queries answer at once; passages (the background texts among them) wait for ``release``."""

    model = "held"
    dim = 3
    thresholds = (0.1, 0.0)

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.passage_calls = 0

    async def embed(self, texts: list[str], kind: Kind) -> Vectors:
        if kind == "passage":
            self.passage_calls += 1
            await self.release.wait()
        return normalise(np.ones((len(texts), 3), dtype=np.float32))

    async def close(self) -> None:
        pass


async def test_a_query_waits_at_most_timeout_ms_for_the_background_and_it_is_embedded_once() -> None:
    """Three callers while the background batch hangs: each is refused after embedding.timeout_ms
    (not the 60 s a batch may take), naming that setting; the batch was started once; once it
    answers, the next caller gets its vector."""
    embedder = HeldPassages()
    vectors = CapabilityVectors(embedder, MemoryRegistry(), EmbeddingPolicy(timeout_ms=100))
    started = asyncio.get_running_loop().time()
    results = await asyncio.wait_for(
        asyncio.gather(*(vectors.query_vector(f"q{i}") for i in range(3)), return_exceptions=True), 10
    )
    waited = asyncio.get_running_loop().time() - started
    assert all(isinstance(r, EmbeddingUnavailable) for r in results)
    assert "embedding.timeout_ms" in str(results[0])
    assert waited < 5  # far below batch_timeout_ms (60 s): the caller's own limit applied
    assert embedder.passage_calls == 1
    assert vectors.last_error is not None  # the embedder is reported down meanwhile
    embedder.release.set()
    vector = await asyncio.wait_for(vectors.query_vector("q0"), 10)
    assert vector.shape == (3,)
    assert vectors.background is not None and vectors.up
    assert embedder.passage_calls == 1
    await vectors.close()


async def test_a_failed_background_is_embedded_again_by_the_retry_not_by_a_caller() -> None:
    """The background batch failed; the periodic retry starts it again, so the next caller finds
    it embedded instead of paying for it."""

    class FailsOnce(HeldPassages):
        def __init__(self) -> None:
            super().__init__()
            self.release.set()

        async def embed(self, texts: list[str], kind: Kind) -> Vectors:
            if kind == "passage" and self.passage_calls == 0:
                self.passage_calls += 1
                raise EmbeddingUnavailable("service down")
            return await super().embed(texts, kind)

    embedder = FailsOnce()
    vectors = CapabilityVectors(embedder, MemoryRegistry(), EmbeddingPolicy(timeout_ms=100))
    with pytest.raises(EmbeddingUnavailable, match="service down"):
        await vectors.query_vector("q")
    await vectors._retry_pending()
    await asyncio.wait_for(vectors.ensure_background(), 10)
    assert vectors.background is not None
    assert embedder.passage_calls == 2
    await vectors.close()
