"""Helpful refusals: unknown tasks get the nearest declared ones, and candidates name their task."""

from __future__ import annotations

import httpx

from reachmesh.config import RouterConfig
from reachmesh.testing import FakeAgent, RouterServer
from tests.helpers import price_agent


async def test_a_phrase_gets_the_task_it_means_and_how_to_route_by_meaning() -> None:
    """With the default strategy, a Chinese price question is refused with a suggestion by meaning."""
    config = RouterConfig.from_mapping({"health": {"enabled": False}, "embedding": {"backend": "auto"}})
    async with RouterServer(config) as router, httpx.AsyncClient(base_url=router.url, timeout=30) as http:
        agent = await price_agent().start()
        try:
            await agent.register(router.url)
            body = (await http.post("/reach", json={"targetTask": "这个商品现在多少钱"})).json()
            error = body["error"]
            assert body["status"] == "NO_AVAILABLE_HANDLER"
            assert {"task": "query_product_price", "by": "meaning"}.items() <= error["suggestions"][0].items()
            assert "semantic_route" in error["message"]
            typo = (await http.post("/reach", json={"targetTask": "query_prodcut_price"})).json()
            assert typo["error"]["suggestions"][0] == {"task": "query_product_price", "by": "spelling"}
        finally:
            await agent.stop()


async def test_unrelated_text_gets_no_made_up_suggestion() -> None:
    """A task name far from everything declared is refused without suggestions by spelling."""
    config = RouterConfig.from_mapping({"health": {"enabled": False}, "embedding": {"backend": "none"}})
    async with RouterServer(config) as router, httpx.AsyncClient(base_url=router.url) as http:
        agent = await FakeAgent("a", tasks=("query_product_price",)).start()
        try:
            await agent.register(router.url)
            body = (await http.post("/reach", json={"targetTask": "zzz"})).json()
            assert "suggestions" not in body["error"]
            assert body["error"]["message"] == "no agent declares task 'zzz'"
        finally:
            await agent.stop()


async def test_candidates_name_the_task_they_were_considered_for(http, make_agent) -> None:
    """Each candidate of a refusal carries its task, so one agent listed twice is not ambiguous."""
    await make_agent("a")
    body = (
        await http.post("/reach", json={"targetTask": "echo", "preferences": {"filterAgentIds": ["x"]}})
    ).json()
    assert body["error"]["candidates"] == [{"agentId": "a", "reason": "filtered", "task": "echo"}]
