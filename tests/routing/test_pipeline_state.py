"""The pipeline is shared by every request: a decision keeps nothing of its own on it."""

from __future__ import annotations

import httpx

from reachmesh.clock import ManualClock
from reachmesh.config import RegistryPolicy, RouterConfig
from reachmesh.protocol import ReachRequest
from reachmesh.registry import MemoryRegistry
from reachmesh.routing import Pipeline
from reachmesh.testing import RouterServer
from tests.helpers import scaled
from tests.routing.test_exact import agent, record
from tests.routing.test_semantic import semantic_router  # noqa: F401  (a fixture)


async def test_a_decision_leaves_the_shared_pipeline_as_it_found_it() -> None:
    """Per-request state (the runner-up tasks of a route by meaning) is returned, not kept on
    the pipeline: nothing on it is rebound by a decide()."""
    registry = MemoryRegistry(RegistryPolicy(lease_ttl_seconds=10), clock=ManualClock())
    await registry.register(agent("a"))
    pipeline = Pipeline(registry)
    before = dict(vars(pipeline))
    request = ReachRequest.model_validate({"targetTask": "echo", "payload": {}})
    assert [c.entry.id for c in pipeline.decide(request, record())] == ["a"]
    rebound = sorted(name for name, value in vars(pipeline).items() if before.get(name) is not value)
    assert rebound == []
    assert not hasattr(pipeline, "_alternates")


async def test_a_refusal_by_meaning_is_told_by_its_rule() -> None:
    """The trace of a request refused by meaning says semantic_route, not exact_match."""
    embedding = {"backend": "auto", "timeout_ms": int(scaled(10_000))}
    config = RouterConfig.model_validate({"health": {"enabled": False}, "embedding": embedding})
    async with (
        RouterServer(config) as server,
        httpx.AsyncClient(base_url=server.url, timeout=scaled(30)) as http,
    ):
        body = (
            await http.post(
                "/reach",
                json={"targetTask": "what is the weather", "preferences": {"strategy": "semantic_route"}},
            )
        ).json()
        assert body["status"] == "NO_AVAILABLE_HANDLER"
        hop = (await http.get(f"/admin/traces/{body['traceId']}")).json()["hops"][0]
    assert hop["decision"]["rule"] == "semantic_route"


async def test_a_route_by_meaning_records_its_score_rounded(semantic_router) -> None:  # noqa: F811
    """The trace (page, reach trace, JSON) carries the selected score to four places."""
    _server, http = semantic_router
    body = (await http.post("/reach", json={"targetTask": "how much does a mango cost now"})).json()
    assert body["handlerAgentId"] == "price-agent"
    hop = (await http.get(f"/admin/traces/{body['traceId']}")).json()["hops"][0]
    score = hop["decision"]["score"]
    assert hop["decision"]["rule"] == "semantic_route"
    assert isinstance(score, float) and score == round(score, 4)
