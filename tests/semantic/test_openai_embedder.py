"""The OpenAI-compatible embedder: the wire it speaks, its errors, and a Router routing through it."""

from __future__ import annotations

import asyncio
import email.utils
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from reachmesh.config import EmbeddingPolicy, RouterConfig
from reachmesh.embedserver.app import build_embed_app
from reachmesh.exceptions import ConfigError, EmbeddingDown, EmbeddingError, EmbeddingUnavailable
from reachmesh.semantic.embedders import build_embedder
from reachmesh.semantic.embedders.http import ApiKey, OpenAIEmbedder, _retry_after
from reachmesh.semantic.embedders.local import LocalEmbedder
from reachmesh.testing import AsgiServer, RouterServer, free_port, wait_vectors
from tests.helpers import price_agent, scaled, until

KEY = "sk-test-0123456789abcdef"


class FakeOpenAI:
    """An OpenAI-style /v1/embeddings that records requests and answers rows out of order."""

    def __init__(
        self,
        *,
        key: str | None = KEY,
        answer: Any = None,
        status: int = 200,
        body: bytes = b"{}",
        delay_s: float = 0.0,
        key_header: str = "authorization",
        busy: list[tuple[int, str | None]] | None = None,
    ) -> None:
        self.key = key
        self.key_header = key_header
        # Answers given first, one per request: (status, Retry-After or None).
        self.busy = list(busy or [])
        self.answer = answer
        self.status = status
        self.body = body
        self.delay_s = delay_s
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.app = Starlette(routes=[Route("/v1/embeddings", self.embeddings, methods=["POST"])])

    async def embeddings(self, request: Request) -> Response:
        wanted = f"Bearer {self.key}" if self.key_header == "authorization" else self.key
        if self.key is not None and request.headers.get(self.key_header) != wanted:
            return Response(b'{"error": "bad key"}', status_code=401)
        body = orjson.loads(await request.body())
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        if self.busy:
            status, retry_after = self.busy.pop(0)
            headers = {"Retry-After": retry_after} if retry_after is not None else {}
            return Response(b'{"error": "slow down"}', status_code=status, headers=headers)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.status != 200:
            return Response(self.body, status_code=self.status)
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


def _routing_through(embed: AsgiServer, **embedding: Any) -> RouterConfig:
    """A Router that routes every task by meaning through the fake service, any score accepted."""
    settings = {
        "backend": "openai",
        "url": f"{embed.url}/v1",
        "model": "fake",
        "threshold": 0.0,
        "margin": 0.0,
    }
    return RouterConfig.from_mapping(
        {
            "health": {"enabled": False},
            "routing": {"semantic_tasks": ["*"]},
            "embedding": {**settings, **embedding},
        }
    )


@asynccontextmanager
async def _price_agent_behind(config: RouterConfig) -> AsyncIterator[httpx.AsyncClient]:
    """A Router with the price agent registered and its vectors settled, and a client for it."""
    async with RouterServer(config) as router, httpx.AsyncClient(base_url=router.url, timeout=20) as http:
        agent = price_agent()
        await agent.start()
        try:
            await agent.register(router.url)
            await wait_vectors(router.url, "price-agent")
            yield http
        finally:
            await agent.stop()


async def test_prefixes_batches_key_and_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Texts go prefixed and in batches, with the key as a bearer token; rows come back in order."""
    monkeypatch.setenv("MY_EMBED_KEY", KEY)
    fake = FakeOpenAI()
    async with AsgiServer(fake.app) as server:
        embedder = OpenAIEmbedder(
            f"{server.url}/v1",
            model="e5-large",
            api_key=ApiKey("MY_EMBED_KEY"),
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
    assert embedder.model == "e5-large (query prefix 'query: ', passage prefix 'passage: ')"
    assert embedder.thresholds is None


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
        (FakeOpenAI(key=None, answer={"data": []}), EmbeddingError, "returned 0 embeddings for 1 texts"),
        (FakeOpenAI(key=None, answer=[1, 2]), EmbeddingError, "not embeddings"),
        (
            FakeOpenAI(key=None, answer={"data": [{"index": 0, "embedding": ["x"]}]}),
            EmbeddingError,
            "not embeddings",
        ),
        (
            FakeOpenAI(key=None, answer={"data": [{"index": 1, "embedding": [1.0]}]}),
            EmbeddingError,
            "indices",
        ),
        (FakeOpenAI(key=None, answer={"data": [{"index": 0, "embedding": []}]}), EmbeddingError, "shape"),
        (
            FakeOpenAI(key=None, status=400, body=b'{"error": "you must provide a model parameter"}'),
            EmbeddingUnavailable,
            "you must provide a model parameter",
        ),
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


async def test_one_query_and_a_batch_have_their_own_timeouts() -> None:
    """A service taking 0.5 s per answer: one query gives up after embedding.timeout_ms and
    says so; capability texts and several questions at once (batches, off the request path) wait
    embedding.batch_timeout_ms."""
    for backend in ("openai", "http"):
        if backend == "openai":
            fake = FakeOpenAI(key=None, delay_s=0.5)
            app, path = fake.app, "/v1"
        else:
            app, path = build_embed_app(LocalEmbedder()), ""
            app = _slowed(app, 0.5)
        async with AsgiServer(app) as server:
            policy = EmbeddingPolicy(
                backend=backend,
                url=f"{server.url}{path}",
                timeout_ms=100,
                batch_timeout_ms=20_000,
                batch_size=2,  # openai: three texts go as two requests, the second of one text
            )
            embedder = build_embedder(policy)
            try:
                with pytest.raises(EmbeddingUnavailable, match=r"no answer within embedding\.timeout_ms"):
                    await embedder.embed(["how much is it"], "query")
                vectors = await embedder.embed(["price: current price", "promotions"], "passage")
                assert vectors.shape[0] == 2
                # Three questions at once (as reach calibrate asks): a batch, its one-text remainder too.
                queries = await embedder.embed(["how much", "any discount", "where is it"], "query")
                assert queries.shape[0] == 3
            finally:
                await embedder.close()


def _slowed(app: Any, delay_s: float) -> Any:
    """``app`` answering every HTTP request ``delay_s`` late."""

    async def slow(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await asyncio.sleep(delay_s)
        await app(scope, receive, send)

    return slow


async def test_malformed_answers_and_awkward_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ragged or resized rows, duplicate indices, oversized answers and odd keys are clear errors."""
    ragged = {"data": [{"index": 0, "embedding": [1.0, 2.0]}, {"index": 1, "embedding": [1.0]}]}
    twice = {"data": [{"index": 0, "embedding": [1.0]}, {"index": 0, "embedding": [2.0]}]}
    for answer, needle in [(ragged, "not embeddings"), (twice, "indices")]:
        async with AsgiServer(FakeOpenAI(key=None, answer=answer).app) as server:
            embedder = OpenAIEmbedder(f"{server.url}/v1")
            with pytest.raises(EmbeddingError, match=needle):
                await embedder.embed(["a", "b"], "passage")
            await embedder.close()

    fake = FakeOpenAI(key=None)
    async with AsgiServer(fake.app) as server:
        embedder = OpenAIEmbedder(f"{server.url}/v1")
        await embedder.embed(["a"], "passage")  # 3 wide
        fake.answer = {"data": [{"index": 0, "embedding": [1.0, 2.0]}]}
        with pytest.raises(EmbeddingError, match="2-dimensional vectors; the index holds 3"):
            await embedder.embed(["a"], "query")
        fake.answer = None
        monkeypatch.setattr("reachmesh.semantic.embedders.http.MAX_ANSWER_BYTES", 50)
        with pytest.raises(EmbeddingError, match="over 50 bytes"):
            await embedder.embed(["a", "b", "c"], "passage")
        await embedder.close()
    monkeypatch.undo()

    # A key mounted from a file ends in a newline: it is stripped. One with a control character
    # inside is refused without being shown; an error answer that echoes secrets is masked.
    monkeypatch.setenv("REACH_EMBEDDING_API_KEY", KEY + "\n")
    echo = FakeOpenAI(
        status=400, body=f'{{"error": "bad key {KEY}", "auth": "Bearer sk-other-123456"}}'.encode()
    )
    async with AsgiServer(FakeOpenAI().app) as server, AsgiServer(echo.app) as echoing:
        embedder = OpenAIEmbedder(f"{server.url}/v1")
        assert (await embedder.embed(["a"], "query")).shape == (1, 3)
        await embedder.close()
        embedder = OpenAIEmbedder(f"{echoing.url}/v1")
        with pytest.raises(EmbeddingUnavailable) as echoed:
            await embedder.embed(["a"], "query")
        await embedder.close()
    assert "HTTP 400" in echoed.value.message and "***" in echoed.value.message
    assert KEY not in echoed.value.message and "sk-other" not in echoed.value.message
    monkeypatch.setenv("REACH_EMBEDDING_API_KEY", "sk-a\x01b")
    with pytest.raises(EmbeddingUnavailable, match="control characters") as bad:
        await OpenAIEmbedder("http://127.0.0.1:1/v1").embed(["a"], "query")
    assert "sk-a" not in bad.value.message


def test_the_policy_selects_it_and_checks_its_fields() -> None:
    """backend: openai needs a URL; the key's variable name must be a variable name."""
    embedder = build_embedder(EmbeddingPolicy(backend="openai", url="http://gpu:8000/v1", model="bge-m3"))
    assert isinstance(embedder, OpenAIEmbedder)
    assert embedder.endpoint == "http://gpu:8000/v1/embeddings" and embedder.model == "bge-m3"
    azure = OpenAIEmbedder("https://x.openai.azure.com/openai/deployments/e5/?api-version=2024-02-01")
    assert (
        azure.endpoint == "https://x.openai.azure.com/openai/deployments/e5/embeddings?api-version=2024-02-01"
    )
    # What changes the vectors is part of the name their shared copies are kept under.
    e5 = OpenAIEmbedder("http://gpu/v1", model="e5", query_prefix="query: ", send_input_type=True)
    assert e5.model == "e5 (query prefix 'query: ', input_type)"
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
                    # The bundled model's operating point, kept for the served model by its name
                    # (as `reach calibrate` prints it): the service runs that model.
                    "calibrations": {
                        "multilingual-e5-small (input_type)": {"threshold": 0.0830, "margin": 0.015}
                    },
                },
            }
        )
        async with _price_agent_behind(config) as http:
            answer = (await http.post("/reach", json={"targetTask": "当前芒果多少钱"})).json()
            assert answer["status"] == "SUCCESS", answer
            assert answer["handlerAgentId"] == "price-agent"
    assert all(secret not in record.getMessage() for record in caplog.records)


async def test_a_broken_service_delays_vectors_and_never_stops_them() -> None:
    """Rows of mixed widths mark the agent's vectors unavailable; once the service mends, they come."""
    fake = FakeOpenAI(key=None, answer={"data": [{"index": 0, "embedding": [1.0, 2.0]}, {"index": 1}]})
    async with AsgiServer(fake.app) as embed:
        config = _routing_through(embed, retry_seconds=0.2)
        async with _price_agent_behind(config) as http:

            async def vectors_are(state: str) -> bool:
                status = (await http.get("/admin/agents/price-agent")).json()
                return bool(status["vectors"] == state)

            # While broken the vectors go unavailable, then pending again at each retry (0.2 s).
            await until(lambda: vectors_are("unavailable"), "the vectors to be marked unavailable")
            fake.answer = None  # mended
            await until(lambda: vectors_are("ready"), "the vectors once the service is mended")


async def test_start_line_and_reload(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The Router names its embedder and operating point at start; a reload applies a calibration
    and says that a changed URL needs a restart."""
    caplog.set_level(logging.INFO)
    async with AsgiServer(FakeOpenAI(key=None).app) as embed:
        path = tmp_path / "router.yaml"
        embedding: dict[str, Any] = {"backend": "openai", "url": f"{embed.url}/v1", "model": "m"}
        policy = {"health": {"enabled": False}, "embedding": embedding}
        path.write_text(yaml.safe_dump(policy))
        async with (
            RouterServer(RouterConfig.load(path), config_path=path) as router,
            httpx.AsyncClient(base_url=router.url) as http,
        ):
            vectors = router.app.parts.vectors
            assert vectors is not None
            for _ in range(int(scaled(200))):
                if any("semantic routing: embedder m" in r.getMessage() for r in caplog.records):
                    break
                await asyncio.sleep(0.02)
            assert any(
                "embedder m has no calibration" in r.getMessage() and "holds none" in r.getMessage()
                for r in caplog.records
            )
            assert vectors.thresholds() is None
            embedding["calibrations"] = {"m": {"threshold": 0.3, "margin": 0.01}}
            embedding["url"] = "http://127.0.0.1:9/v1"
            path.write_text(yaml.safe_dump(policy))
            assert (await http.post("/admin/reload")).status_code == 200
            assert vectors.thresholds() == (0.3, 0.01)
            assert any(
                "embedding.url changed: the embedder is built at start; restart" in r.getMessage()
                for r in caplog.records
            )
    with pytest.raises(ConfigError, match="must start with http"):
        RouterConfig.from_mapping({"embedding": {"backend": "openai", "url": "127.0.0.1:7300/v1"}})
    with pytest.raises(EmbeddingUnavailable, match="unreachable: cannot connect"):
        await OpenAIEmbedder(f"http://127.0.0.1:{free_port()}/v1").embed(["a"], "query")


async def test_a_busy_service_is_asked_again_after_its_retry_after() -> None:
    """429 and 503 on a batch of capability texts: sent again after Retry-After, then embedded."""
    past = "Wed, 21 Oct 2015 07:28:00 GMT"  # an HTTP date already gone: no wait
    fake = FakeOpenAI(key=None, busy=[(429, "0"), (503, past)])
    async with AsgiServer(fake.app) as server:
        embedder = OpenAIEmbedder(f"{server.url}/v1")
        try:
            vectors = await embedder.embed(["a", "bb"], "passage")
        finally:
            await embedder.close()
    assert vectors.shape == (2, 3)
    assert len(fake.requests) == 3 and embedder.busy_retries == 2


async def test_a_query_is_not_retried_and_a_batch_gives_up_after_its_retries() -> None:
    """A caller's query fails at once, saying the service is busy; a batch stops after 5 tries."""
    fake = FakeOpenAI(key=None, busy=[(429, "7")])
    async with AsgiServer(fake.app) as server:
        embedder = OpenAIEmbedder(f"{server.url}/v1")
        try:
            with pytest.raises(
                EmbeddingUnavailable, match=r"HTTP 429 \(busy or rate limited\); it asked to retry after 7 s"
            ):
                await embedder.embed(["how much is it"], "query")
            assert len(fake.requests) == 1
            fake.busy = [(429, "0")] * 5
            with pytest.raises(EmbeddingUnavailable, match=r"HTTP 429 \(busy or rate limited\) 5 times"):
                await embedder.embed(["a", "b"], "passage")
        finally:
            await embedder.close()
    assert len(fake.requests) == 6


async def test_the_key_goes_in_the_header_the_policy_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """embedding.api_key_header: api-key (Azure) sends the key alone there, and no Authorization."""
    monkeypatch.setenv("REACH_EMBEDDING_API_KEY", KEY)
    fake = FakeOpenAI(key_header="api-key")
    policy = EmbeddingPolicy(backend="openai", url="http://127.0.0.1:9/v1", api_key_header="api-key")
    async with AsgiServer(fake.app) as server:
        embedder = build_embedder(policy.model_copy(update={"url": f"{server.url}/v1"}))
        try:
            await embedder.embed(["a"], "passage")
        finally:
            await embedder.close()
    assert fake.headers[0]["api-key"] == KEY
    assert "authorization" not in fake.headers[0]
    with pytest.raises(ValueError, match="api_key_header"):
        EmbeddingPolicy(api_key_header="Bad Header:")


def test_retry_after_reads_seconds_and_dates_and_ignores_nonsense() -> None:
    """Seconds or an HTTP date; a negative wait is none; unreadable or infinite is absent."""
    assert _retry_after("120") == 120.0
    assert _retry_after(" 1.5 ") == 1.5
    assert _retry_after("-3") == 0.0
    assert _retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0
    assert 3000 < (_retry_after(email.utils.formatdate(time.time() + 3600, usegmt=True)) or 0) <= 3600
    for bad in (None, "", "soon", "inf", "nan"):
        assert _retry_after(bad) is None


async def test_queries_wait_out_the_retry_after_without_asking_and_callers_are_told_when() -> None:
    """After a 429 with Retry-After, later queries fail at once without reaching the service,
    and the caller's answer carries retryAfterSeconds."""
    fake = FakeOpenAI(key=None, busy=[(429, "60")])
    async with AsgiServer(fake.app) as server:
        embedder = OpenAIEmbedder(f"{server.url}/v1")
        try:
            with pytest.raises(EmbeddingUnavailable) as first:
                await embedder.embed(["how much is it"], "query")
            with pytest.raises(EmbeddingUnavailable) as second:
                await embedder.embed(["and now?"], "query")
        finally:
            await embedder.close()
    assert len(fake.requests) == 1
    assert first.value.retry_after_s == 60
    # The Router holds back for at most RETRY_WAIT_CAP_S (30 s) whatever the service asked.
    assert second.value.retry_after_s is not None and 25 <= second.value.retry_after_s <= 30
    down = EmbeddingDown("semantic routing is unavailable", [], retry_after_s=second.value.retry_after_s)
    assert down.to_error()["retryAfterSeconds"] == second.value.retry_after_s
    assert "retryAfterSeconds" not in EmbeddingDown("down", []).to_error()


async def test_an_answer_ends_the_pause_and_a_paused_query_names_the_status_it_followed() -> None:
    """A 503 with Retry-After pauses queries (saying 503, not 429); the next answer ends it."""
    fake = FakeOpenAI(key=None, busy=[(503, "20")])
    async with AsgiServer(fake.app) as server:
        embedder = OpenAIEmbedder(f"{server.url}/v1")
        try:
            with pytest.raises(EmbeddingUnavailable):
                await embedder.embed(["q1"], "query")
            with pytest.raises(EmbeddingUnavailable, match=r"is busy \(it answered HTTP 503") as paused:
                await embedder.embed(["q2"], "query")
            assert paused.value.retry_after_s is not None and paused.value.retry_after_s <= 20
            await embedder.embed(["a capability text"], "passage")  # answered: the pause is over
            await embedder.embed(["q3"], "query")
        finally:
            await embedder.close()
    assert [r["input"] for r in fake.requests] == [["q1"], ["a capability text"], ["q3"]]


def test_credentials_in_the_service_url_are_never_shown() -> None:
    """user:password@ in embedding.url stays out of the model's name (logs, etcd keys, errors)."""
    embedder = OpenAIEmbedder("http://svc:hunter2@gpu-box:8000/v1")
    assert "hunter2" not in embedder.model and "hunter2" not in embedder.shown
    assert embedder.endpoint.startswith("http://svc:hunter2@")  # still used to call it


async def test_a_router_without_a_query_cache_still_routes_by_meaning() -> None:
    """embedding.cache_size 0 means no reuse between requests, not a refusal for every one."""
    fake = FakeOpenAI(key=None)
    async with AsgiServer(fake.app) as embed:
        config = _routing_through(embed, cache_size=0)
        async with _price_agent_behind(config) as http:
            for text in ("how much is a mango", "price of apples", "how much is a mango"):
                answer = (await http.post("/reach", json={"targetTask": text})).json()
                assert answer["status"] == "SUCCESS", answer
                assert answer["handlerAgentId"] == "price-agent"
    asked = [r["input"][0] for r in fake.requests if len(r["input"]) == 1 and r["input"][0] != "warm-up"]
    assert asked == ["how much is a mango", "price of apples", "how much is a mango"]  # one slot only
