"""The OpenAI-compatible embedder: the wire it speaks, its errors, and a Router routing through it."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from agent_reach.config import EmbeddingPolicy, RouterConfig
from agent_reach.exceptions import ConfigError, EmbeddingError, EmbeddingUnavailable
from agent_reach.semantic.embedders import build_embedder
from agent_reach.semantic.embedders.http import OpenAIEmbedder
from agent_reach.semantic.embedders.local import LocalEmbedder
from agent_reach.server.embedding import build_embed_app
from agent_reach.testing import AsgiServer, RouterServer, free_port, wait_vectors
from tests.helpers import price_agent

KEY = "sk-test-0123456789abcdef"


class FakeOpenAI:
    """An OpenAI-style /v1/embeddings that records requests and answers rows out of order."""

    def __init__(self, *, key: str | None = KEY, answer: Any = None, status: int = 200) -> None:
        self.key = key
        self.answer = answer
        self.status = status
        self.requests: list[dict[str, Any]] = []
        self.app = Starlette(routes=[Route("/v1/embeddings", self.embeddings, methods=["POST"])])

    async def embeddings(self, request: Request) -> Response:
        if self.key is not None and request.headers.get("authorization") != f"Bearer {self.key}":
            return Response(b'{"error": "bad key"}', status_code=401)
        body = orjson.loads(await request.body())
        self.requests.append(body)
        if self.status != 200:
            return Response(b"{}", status_code=self.status)
        if self.answer is not None:
            return Response(orjson.dumps(self.answer), media_type="application/json")
        # Row i is [len(text), i + 1, 0]: the test can tell which text a row belongs to.
        data = [
            {"object": "embedding", "index": i, "embedding": [float(len(text)), float(i + 1), 0.0]}
            for i, text in enumerate(body["input"])
        ]
        return Response(
            orjson.dumps({"object": "list", "data": data[::-1], "model": body.get("model", "m")}),
            media_type="application/json",
        )


async def test_prefixes_batches_key_and_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Texts go prefixed and in batches, with the key as a bearer token; rows come back in order."""
    monkeypatch.setenv("MY_EMBED_KEY", KEY)
    fake = FakeOpenAI()
    async with AsgiServer(fake.app) as server:
        embedder = OpenAIEmbedder(
            f"{server.url}/v1",
            model="e5-large",
            api_key_env="MY_EMBED_KEY",
            query_prefix="query: ",
            passage_prefix="passage: ",
            batch_size=2,
        )
        try:
            vectors = await embedder.embed(["a", "bb", "ccc", "dddd", "e"], "query")
            passages = await embedder.embed(["x"], "passage")
        finally:
            await embedder.close()
    assert [r["input"] for r in fake.requests] == [
        ["query: a", "query: bb"],
        ["query: ccc", "query: dddd"],
        ["query: e"],
        ["passage: x"],
    ]
    assert all(r["model"] == "e5-large" and "input_type" not in r for r in fake.requests)
    assert vectors.shape == (5, 3) and embedder.dim == 3
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0)
    # Unit rows of [len(text), index in batch + 1, 0], in the order the texts were given.
    expected = np.array([[8, 1, 0], [9, 2, 0], [10, 1, 0], [11, 2, 0], [8, 1, 0]], dtype=np.float32)
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    assert np.allclose(vectors, expected)
    assert passages.shape == (1, 3)
    assert embedder.model == "e5-large" and embedder.thresholds is None


async def test_errors_are_clear_and_never_show_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrong key, a failing service, a malformed answer or a short one are clear errors, key-free."""
    monkeypatch.setenv("REACH_EMBEDDING_API_KEY", "sk-wrong-key-987")
    async with AsgiServer(FakeOpenAI().app) as server:
        embedder = OpenAIEmbedder(f"{server.url}/v1/embeddings")
        with pytest.raises(EmbeddingUnavailable) as denied:
            await embedder.embed(["a"], "query")
        await embedder.close()
    assert "HTTP 401" in denied.value.message and "$REACH_EMBEDDING_API_KEY" in denied.value.message
    assert "sk-wrong" not in denied.value.message

    cases: list[tuple[FakeOpenAI, type[Exception], str]] = [
        (FakeOpenAI(key=None, status=500), EmbeddingUnavailable, "HTTP 500"),
        (FakeOpenAI(key=None, answer={"data": [{"index": 0}]}), EmbeddingError, "not embeddings"),
        (FakeOpenAI(key=None, answer={"data": []}), EmbeddingError, "0 embeddings for 1 texts"),
        (FakeOpenAI(key=None, answer=[1, 2]), EmbeddingError, "not embeddings"),
    ]
    for fake, error, needle in cases:
        async with AsgiServer(fake.app) as server:
            embedder = OpenAIEmbedder(f"{server.url}/v1")
            with pytest.raises(error) as raised:
                await embedder.embed(["a"], "query")
            await embedder.close()
        assert needle in str(raised.value)
    with pytest.raises(EmbeddingUnavailable, match="unreachable"):
        await OpenAIEmbedder(f"http://127.0.0.1:{free_port()}/v1").embed(["a"], "query")


def test_the_policy_selects_it_and_checks_its_fields() -> None:
    """backend: openai needs a URL; the key's variable name must be a variable name."""
    embedder = build_embedder(EmbeddingPolicy(backend="openai", url="http://gpu:8000/v1", model="bge-m3"))
    assert isinstance(embedder, OpenAIEmbedder)
    assert embedder.endpoint == "http://gpu:8000/v1/embeddings" and embedder.model == "bge-m3"
    with pytest.raises(ConfigError, match="no URL"):
        build_embedder(EmbeddingPolicy(backend="openai"))
    with pytest.raises(ConfigError, match="api_key_env"):
        RouterConfig.from_mapping({"embedding": {"backend": "openai", "api_key_env": "$(rm -rf)"}})


async def test_a_router_routes_by_meaning_through_an_openai_compatible_service(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """reach embed-server's /v1/embeddings, keyed, behind backend: openai: a question finds its agent."""
    caplog.set_level(logging.DEBUG)
    secret = "sk-live-route-5151"
    monkeypatch.setenv("REACH_EMBEDDING_API_KEY", secret)
    service = build_embed_app(LocalEmbedder())

    async def keyed(scope: Any, receive: Any, send: Any) -> None:
        # The real service behind a key check, as a hosted endpoint would have one.
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            if headers.get(b"authorization") != f"Bearer {secret}".encode():
                await Response(b"{}", status_code=401)(scope, receive, send)
                return
        await service(scope, receive, send)

    async with AsgiServer(keyed) as embed:
        config = RouterConfig.from_mapping(
            {
                "health": {"enabled": False},
                "limits": {"loop_lag_ms": 10000},
                "routing": {"semantic_tasks": ["*"]},
                "embedding": {
                    "backend": "openai",
                    "url": f"{embed.url}/v1",
                    "model": "multilingual-e5-small",
                    "send_input_type": True,
                    "timeout_ms": 15000,
                    # The bundled model's calibrated operating point: the service runs that model.
                    "threshold": 0.0830,
                    "margin": 0.015,
                },
            }
        )
        async with RouterServer(config) as router, httpx.AsyncClient(base_url=router.url, timeout=20) as http:
            agent = price_agent()
            await agent.start()
            try:
                await agent.register(router.url)
                await wait_vectors(router.url, "price-agent")
                answer = (await http.post("/reach", json={"targetTask": "当前芒果多少钱"})).json()
                assert answer["status"] == "SUCCESS", answer
                assert answer["handlerAgentId"] == "price-agent"
            finally:
                await agent.stop()
    assert all(secret not in record.getMessage() for record in caplog.records)
