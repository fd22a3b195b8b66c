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


async def test_a_schema_violation_on_a_route_by_meaning_names_the_declared_task() -> None:
    """Free text routed by meaning to a task whose input_schema the payload fails: the 400 names
    the task whose schema it is, the caller's words only as where it was routed from."""
    config = RouterConfig.from_mapping({"health": {"enabled": False}, "embedding": {"backend": "auto"}})
    async with RouterServer(config) as router, httpx.AsyncClient(base_url=router.url, timeout=30) as http:
        agent = price_agent()
        agent.input_schema = {"product_id": "string"}
        await agent.start()
        try:
            await agent.register(router.url)
            words = "how much does this item cost"
            body = {"targetTask": words, "preferences": {"strategy": "semantic_route"}, "payload": {"sku": 1}}
            resp = await http.post("/reach", json=body)
            error = resp.json()["error"]
            assert resp.status_code == 400, resp.json()
            assert error["message"] == (
                "payload does not match the input_schema of task 'query_product_price', "
                f"routed from {words!r} (payload.product_id)"
            )
            plain = await http.post("/reach", json={"targetTask": "query_product_price", "payload": {}})
            message = plain.json()["error"]["message"]
            expected = "payload does not match the input_schema of task 'query_product_price'"
            assert message == expected + " (payload.product_id)"
        finally:
            await agent.stop()
