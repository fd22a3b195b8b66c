"""While the embedder loads, the log says so, /admin/summary says so, and the Router routes the
rest; a shutdown abandons the load rather than finishing it while it drains.

Found by a stranger's walk: the Router logged "semantic routing: embedder ..." 2 to 7 s after it
listened, with nothing in between, and after a SIGTERM during that load it finished loading (and
said so) while it drained.
"""

from __future__ import annotations

import asyncio
import logging
import time

import httpx
import numpy as np
import pytest

from reachmesh.config import EmbeddingPolicy, RouterConfig
from reachmesh.registry.memory import MemoryRegistry
from reachmesh.semantic.embedders.base import Kind, Vectors, normalise
from reachmesh.semantic.vectors import CapabilityVectors
from reachmesh.testing import RouterServer
from tests.helpers import scaled, until

LOADED = "semantic routing: embedder held, threshold"


class HeldLoad:
    """An embedder whose first embedding (its load) waits for ``release``."""

    model = "held"
    dim = 3
    thresholds = (0.1, 0.0)

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def embed(self, texts: list[str], kind: Kind) -> Vectors:
        await self.release.wait()
        return normalise(np.ones((len(texts), 3), dtype=np.float32))

    async def close(self) -> None:
        pass


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "reachmesh.semantic"]


async def test_the_load_is_said_when_it_starts_and_when_it_ends(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    embedder = HeldLoad()
    vectors = CapabilityVectors(embedder, MemoryRegistry(), EmbeddingPolicy())
    await vectors.start()
    try:
        assert vectors.loading
        await until(lambda: any("loading embedder held" in line for line in _lines(caplog)), "the line")
        said = _lines(caplog)
        assert any("exact task names" in line and "meanwhile" in line for line in said), said
        assert not any(LOADED in line for line in said)
        embedder.release.set()
        await until(lambda: not vectors.loading, "the load over")
        await until(lambda: any(LOADED in line for line in _lines(caplog)), "the loaded line")
    finally:
        await vectors.close()


async def test_a_load_is_abandoned_when_the_router_stops(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    embedder = HeldLoad()
    vectors = CapabilityVectors(embedder, MemoryRegistry(), EmbeddingPolicy())
    await vectors.start()
    try:
        vectors.stop_loading()
        assert not vectors.loading
        embedder.release.set()
        for _ in range(20):
            await asyncio.sleep(0)
        said = _lines(caplog)
        assert any("load is abandoned" in line for line in said), said
        assert not any(LOADED in line for line in said), "a stopping Router finished the load"
    finally:
        await vectors.close()


async def test_a_caller_waiting_on_the_load_is_answered_when_the_load_is_abandoned() -> None:
    """The warm-up and a semantic caller wait on one background job: abandoning the warm-up at
    SIGTERM must not cancel the caller's wait (it got CancelledError, so no ReachResponse)."""
    embedder = HeldLoad()
    vectors = CapabilityVectors(embedder, MemoryRegistry(), EmbeddingPolicy(timeout_ms=60_000))
    await vectors.start()
    try:
        await until(lambda: vectors._background_job is not None, "the background job started")
        caller = asyncio.ensure_future(vectors.query_vector("where is my parcel"))
        for _ in range(5):
            await asyncio.sleep(0)
        vectors.stop_loading()
        embedder.release.set()
        vector = await asyncio.wait_for(caller, scaled(5))
        assert vector.shape == (3,)
    finally:
        await vectors.close()


async def test_the_summary_says_loading_and_readyz_is_ready_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    embedder = HeldLoad()
    monkeypatch.setattr("reachmesh.server.components.build_embedder", lambda policy: embedder)
    policy = {
        "health": {"enabled": False},
        "server": {"drain_timeout_seconds": 1},
        "embedding": {"backend": "local"},
    }
    config = RouterConfig.model_validate(policy)
    async with (
        RouterServer(config) as router,
        httpx.AsyncClient(base_url=router.url, timeout=scaled(10)) as http,
    ):
        summary = (await http.get("/admin/summary")).json()
        assert summary["embedding"] == {"up": True, "loading": True}
        assert (await http.get("/readyz")).json() == {"status": "ready"}, "exact routing works meanwhile"
        router.app.begin_drain(time.monotonic())
        vectors = router.app.parts.vectors
        assert vectors is not None
        await until(lambda: not vectors.loading, "the load abandoned at the drain")
        embedder.release.set()
