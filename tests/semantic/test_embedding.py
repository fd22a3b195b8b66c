"""The embedding layer: the local model, the embedding service, and the Router without it."""

from __future__ import annotations

import asyncio
import logging

import httpx
import numpy as np
import pytest
import uvicorn

from reachmesh.config import EmbeddingPolicy, RouterConfig
from reachmesh.embedserver.app import build_embed_app
from reachmesh.exceptions import EmbeddingUnavailable
from reachmesh.semantic.embedders import build_embedder
from reachmesh.semantic.embedders.http import HttpEmbedder
from reachmesh.semantic.embedders.local import LocalEmbedder
from reachmesh.testing import FakeAgent, RouterServer, free_port
from tests.helpers import price_agent


async def test_local_vectors_are_unit_and_multilingual() -> None:
    """The local model returns unit vectors, and a Chinese and an English price question are close."""
    embedder = LocalEmbedder()
    vectors = await embedder.embed(["当前芒果多少钱", "how much does a mango cost now", "写一首诗"], "query")
    assert vectors.shape == (3, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]


async def test_embed_service_endpoints() -> None:
    """/embed and /v1/embeddings answer vectors; bad input is a clear 400."""
    app = build_embed_app(LocalEmbedder())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://embed") as http:
        body = (await http.post("/embed", json={"texts": ["a", "b"], "kind": "query"})).json()
        assert body["dim"] == 384 and len(body["vectors"]) == 2
        openai = (await http.post("/v1/embeddings", json={"input": "hello", "model": "x"})).json()
        assert openai["object"] == "list" and len(openai["data"][0]["embedding"]) == 384
        assert (await http.get("/healthz")).json()["status"] == "ok"
        for bad, needle in [
            ({"texts": []}, "non-empty"),
            ({"texts": ["a"], "kind": "doc"}, "kind"),
            ({"texts": ["a", 3]}, "texts[1]"),
            ({"texts": ["x" * 9000]}, "characters"),
            ({"texts": ["a"] * 300}, "at most 256"),
        ]:
            resp = await http.post("/embed", json=bad)
            assert resp.status_code == 400
            assert needle in resp.json()["error"]["message"]
        assert (await http.post("/embed", content=b"{nope")).status_code == 400


def test_factory_picks_http_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """REACH_EMBEDDING_URL selects the HTTP client; otherwise the local model."""
    monkeypatch.setenv("REACH_EMBEDDING_URL", "http://127.0.0.1:1")
    assert isinstance(build_embedder(EmbeddingPolicy()), HttpEmbedder)
    monkeypatch.delenv("REACH_EMBEDDING_URL")
    assert isinstance(build_embedder(EmbeddingPolicy()), LocalEmbedder)


async def test_http_embedder_down_raises_unavailable() -> None:
    """An unreachable service is EmbeddingUnavailable, not a library error."""
    with pytest.raises(EmbeddingUnavailable):
        await HttpEmbedder(f"http://127.0.0.1:{free_port()}").embed(["x"], "query")


async def test_router_degrades_to_exact_match_when_the_service_is_down(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Service down: exact names still route, semantic requests get a clear error, log and metric say why."""
    caplog.set_level(logging.INFO, logger="reachmesh.semantic")
    port = free_port()
    service = uvicorn.Server(
        uvicorn.Config(build_embed_app(LocalEmbedder()), host="127.0.0.1", port=port, log_level="warning")
    )
    serving = asyncio.create_task(service.serve())
    while not service.started:  # noqa: ASYNC110 - uvicorn exposes a flag, not an event
        await asyncio.sleep(0.01)
    config = RouterConfig.from_mapping(
        {
            "health": {"enabled": False},
            "routing": {"semantic_tasks": ["*"]},
            "embedding": {
                "backend": "http",
                "url": f"http://127.0.0.1:{port}",
                # The service runs in this test's own event loop beside the Router, and its first
                # answers include the model load: a generous timeout keeps a loaded machine from
                # looking like a dead service.
                "timeout_ms": 15000,
                "threshold": 0.0830,
                "margin": 0.015,
            },
        }
    )
    async with RouterServer(config) as server, httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        agent = price_agent()
        await agent.start()
        await agent.register(server.url)
        ok = (await http.post("/reach", json={"targetTask": "当前芒果多少钱"})).json()
        assert ok["handlerAgentId"] == "price-agent"

        service.should_exit = True
        await serving
        exact = (await http.post("/reach", json={"targetTask": "query_product_price"})).json()
        assert exact["status"] == "SUCCESS"
        semantic = (await http.post("/reach", json={"targetTask": "how much is a mango"})).json()
        assert semantic["status"] == "NO_AVAILABLE_HANDLER"
        assert semantic["error"]["code"] == "EMBEDDING_UNAVAILABLE"
        assert "exact task names still work" in semantic["error"]["message"]
        assert f"127.0.0.1:{port}" not in semantic["error"]["message"]  # no address for callers
        metrics = (await http.get("/metrics")).text
        assert "reach_embedding_up 0.0" in metrics
        assert any(
            "semantic routes are refused, exact match goes on" in r.getMessage() for r in caplog.records
        )
        # An agent registering while the service is down is still routed by its exact task.
        late = FakeAgent("late-agent", tasks=("late_task",))
        await late.start()
        await late.register(server.url)
        assert (await http.post("/reach", json={"targetTask": "late_task"})).json()["status"] == "SUCCESS"
        for a in (agent, late):
            await a.stop()
