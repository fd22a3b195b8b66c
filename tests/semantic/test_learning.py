"""Learning from confirmed routes, through a real Router with the bundled model and fake agents."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from reachmesh.config import LearningPolicy, RouterConfig
from reachmesh.semantic.queue import VectorState
from reachmesh.testing import FakeAgent, RouterServer
from tests.helpers import log_lines

# Idiom the bundled model does not tie to prices: refused below the threshold with these agents.
REFUSED = "what would a mango set me back"
ADMIN, ALICE, BOB = "admin-token-1", "caller-alice", "caller-bob"


def _token(role: str, secret: str, name: str) -> dict[str, str]:
    return {"role": role, "sha256": hashlib.sha256(secret.encode()).hexdigest(), "name": name}


def _agents(mode: str = "ok") -> list[FakeAgent]:
    return [
        FakeAgent(
            "price-agent",
            tasks=("query_product_price",),
            mode=mode,  # type: ignore[arg-type]
            descriptions={"query_product_price": "查询商品的当前价格"},
            examples={"query_product_price": ["这个多少钱", "how much is this", "现在卖多少钱"]},
        ),
        FakeAgent(
            "trend-agent",
            tasks=("analyze_price_trend",),
            descriptions={"analyze_price_trend": "分析商品价格历史走势"},
            examples={"analyze_price_trend": ["过去一年价格怎么变化的", "price history of this product"]},
        ),
    ]


async def _learning_router(
    *, mode: str = "ok", auth: bool = False
) -> AsyncIterator[tuple[RouterServer, httpx.AsyncClient, list[FakeAgent]]]:
    policy: dict[str, Any] = {
        "health": {"enabled": False},
        "limits": {"loop_lag_ms": 10_000},
        "embedding": {"backend": "auto"},
        "routing": {"semantic_tasks": ["*"], "learning": {"enabled": True}},
    }
    if auth:
        policy["auth"] = {
            "tokens": [
                _token("admin", ADMIN, "ops"),
                _token("caller", ALICE, "alice"),
                _token("caller", BOB, "bob"),
            ]
        }
    config = RouterConfig.model_validate(policy)
    headers = {"Authorization": f"Bearer {ADMIN}"} if auth else {}
    async with (
        RouterServer(config) as server,
        httpx.AsyncClient(base_url=server.url, timeout=30, headers=headers) as http,
    ):
        agents = _agents(mode)
        for agent in agents:
            await agent.start()
            (await http.post("/agents", json=agent.profile())).raise_for_status()
        vectors = server.app.parts.vectors
        assert vectors is not None
        for _ in range(3000):  # registered by POST, not FakeAgent.register: wait for the vectors here
            if all(vectors.state(a.agent_id) is VectorState.READY for a in agents):
                break
            await asyncio.sleep(0.02)
        yield server, http, agents
        for agent in agents:
            await agent.stop()


@pytest.fixture
async def learning_router() -> AsyncIterator[tuple[RouterServer, httpx.AsyncClient, list[FakeAgent]]]:
    """A Router with learning on, the bundled model, and a price and a trend agent."""
    async for made in _learning_router():
        yield made


@pytest.fixture
async def failing_router() -> AsyncIterator[tuple[RouterServer, httpx.AsyncClient, list[FakeAgent]]]:
    """As learning_router, with auth on (an admin and two callers) and the price agent failing."""
    async for made in _learning_router(mode="error", auth=True):
        yield made


async def reach(http: httpx.AsyncClient, task: str, token: str | None = None, **extra: Any) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    body: dict[str, Any] = (
        await http.post("/reach", json={"targetTask": task, **extra}, headers=headers)
    ).json()
    return body


async def learned_count(http: httpx.AsyncClient, count: int) -> dict[str, Any]:
    """GET /admin/learned once it lists ``count`` routes and every learned vector is in."""
    for _ in range(3000):  # bounded: a route that never arrives fails the test
        listing: dict[str, Any] = (await http.get("/admin/learned")).json()
        if listing["count"] == count and listing["pendingVectors"] == 0:
            return listing
        await asyncio.sleep(0.02)
    raise AssertionError(f"never reached {count} learned routes")


async def test_a_confirmed_retry_is_learned_and_routes_the_phrase(
    learning_router, caplog: pytest.LogCaptureFixture
) -> None:
    """Refused by meaning, then the same conversation names the task and succeeds: the phrase is
    learned, routes exactly (spelled loosely too) and is an example row of its task."""
    server, http, _ = learning_router
    caplog.set_level(logging.INFO, logger="reachmesh.trace")
    refused = await reach(http, REFUSED, conversationId="c1")
    assert refused["status"] == "NO_AVAILABLE_HANDLER", refused
    assert all("score" in c for c in refused["error"]["candidates"])  # the refusal still names them
    retry = await reach(http, "query_product_price", conversationId="c1")
    assert retry["status"] == "SUCCESS", retry
    listing = await learned_count(http, 1)
    route = listing["learned"][0]
    assert (route["phrase"], route["task"], route["source"], route["declared"]) == (
        REFUSED,
        "query_product_price",
        "caller",
        True,
    )
    vectors = server.app.parts.vectors
    assert vectors.index.has("query_product_price", REFUSED)
    again = await reach(http, f"  {REFUSED} ", traceId="learned-1")
    assert again["status"] == "SUCCESS", again
    assert again["handlerAgentId"] == "price-agent"
    assert again["route"] == {"task": "query_product_price", "by": "learned"}  # the caller is told
    hop = (await http.get("/admin/traces/learned-1")).json()["hops"][0]
    assert hop["decision"]["rule"] == "learned"
    lines = [line for line in log_lines(caplog) if line.startswith("[learned-1]")]
    assert "[learned-1] select price-agent by learned" in lines
    assert any(
        line.startswith("[learned-1] learned: ") and line.endswith(" -> query_product_price")
        for line in lines
    )
    assert server.app.parts.learner.learned == 1


async def test_no_learning_from_a_failed_call_or_another_caller(failing_router) -> None:
    """A failed retry, another caller's success and a retry outside the conversation teach
    nothing; the same caller's later success in the conversation still does."""
    server, http, agents = failing_router
    refused = await reach(http, REFUSED, ALICE, conversationId="c2")
    assert refused["status"] == "NO_AVAILABLE_HANDLER", refused
    failed = await reach(http, "query_product_price", ALICE, conversationId="c2")
    assert failed["status"] == "AGENT_ERROR", failed
    agents[0].mode = "ok"
    other_caller = await reach(http, "query_product_price", BOB, conversationId="c2")
    assert other_caller["status"] == "SUCCESS"
    other_conversation = await reach(http, "query_product_price", ALICE, conversationId="c3")
    assert other_conversation["status"] == "SUCCESS"
    semantic = await reach(http, "how much is this", ALICE, conversationId="c2")
    assert semantic["status"] == "SUCCESS"  # routed by meaning: not an explicit confirmation
    assert (await http.get("/admin/learned")).json()["count"] == 0
    confirmed = await reach(http, "query_product_price", ALICE, conversationId="c2")
    assert confirmed["status"] == "SUCCESS"
    listing = await learned_count(http, 1)
    assert [(r["phrase"], r["task"]) for r in listing["learned"]] == [(REFUSED, "query_product_price")]
    assert server.app.parts.learner.learned == 1


async def test_learned_rows_leave_the_index_when_learning_is_switched_off(learning_router) -> None:
    """An operator's route becomes an example row; switching learning off drops the row and the
    exact route, switching it on brings both back (a policy reload)."""
    server, http, _ = learning_router
    made = await http.post(
        "/admin/learned", json={"phrase": "mango price please", "task": "query_product_price"}
    )
    assert made.status_code == 201, made.text
    await learned_count(http, 1)
    parts = server.app.parts
    assert parts.vectors.index.has("query_product_price", "mango price please")
    server.app.apply(_learning(parts.config, enabled=False))
    assert not parts.vectors.index.has("query_product_price", "mango price please")
    assert parts.pipeline.learned_task("mango price please") is None
    assert (await http.get("/admin/learned")).json()["count"] == 1  # kept, unused while off
    server.app.apply(_learning(parts.config, enabled=True))
    await learned_count(http, 1)
    assert parts.vectors.index.has("query_product_price", "mango price please")
    assert parts.pipeline.learned_task("MANGO  price please") == "query_product_price"


def _learning(config: RouterConfig, *, enabled: bool) -> RouterConfig:
    routing = config.routing.model_copy(update={"learning": LearningPolicy(enabled=enabled)})
    return config.model_copy(update={"routing": routing})
