"""Bounded work per registration: limits at the door, embedding off the request path and in turns."""

from __future__ import annotations

import time

import httpx

from reachmesh.config import RouterConfig
from reachmesh.protocol import MAX_CAPABILITIES, MAX_EXAMPLE_CHARS, MAX_PROFILE_EXAMPLES
from reachmesh.testing import FakeAgent, RouterServer, wait_vectors
from tests.helpers import scaled


def big_profile(agent_id: str, capabilities: int, examples: int, chars: int) -> dict:
    """A profile with many long examples, spread over ``capabilities`` tasks."""
    per = examples // capabilities
    filler = "这是一个关于订单、物流、价格和售后服务的很长的例子 with some English words too. "
    text = (filler * (chars // len(filler) + 1))[: chars - 8]
    return {
        "id": agent_id,
        "network": {"endpoint": "http://127.0.0.1:9/reach"},
        "capabilities": [
            {
                "task": f"big_task_{c}",
                "description": f"大型任务 {c}",
                "examples": [f"{i:04d} {c:02d} {text}" for i in range(per)],
            }
            for c in range(capabilities)
        ],
    }


async def test_a_megabyte_profile_is_refused_at_once() -> None:
    """16 capabilities with 1,040 long examples: refused with a clear error, well within a second."""
    async with RouterServer(RouterConfig()) as router, httpx.AsyncClient(base_url=router.url) as http:
        profile = big_profile("huge", 16, 1040, 900)
        started = time.perf_counter()
        resp = await http.post("/agents", json=profile)
        took = time.perf_counter() - started
        assert resp.status_code in (413, 422), resp.text[:300]
        assert resp.json()["error"]["code"] in ("INVALID_PROFILE", "PAYLOAD_TOO_LARGE")
        assert took < scaled(1.0)
        assert router.app.parts.registry.get("huge") is None


async def test_limits_name_the_field() -> None:
    """Too many examples in a profile is a 422 that says how many are allowed."""
    async with RouterServer(RouterConfig()) as router, httpx.AsyncClient(base_url=router.url) as http:
        over = big_profile("over", 20, (MAX_PROFILE_EXAMPLES // 20 + 1) * 20, 40)
        resp = await http.post("/agents", json=over)
        assert resp.status_code == 422
        assert str(MAX_PROFILE_EXAMPLES) in resp.json()["error"]["details"][0]["message"]
        long_example = big_profile("long", 1, 1, MAX_EXAMPLE_CHARS + 50)
        resp = await http.post("/agents", json=long_example)
        assert resp.status_code == 422
        assert "examples" in resp.json()["error"]["details"][0]["field"]


async def test_registration_answers_at_once_and_embedding_takes_turns() -> None:
    """While the largest legal profile is embedded, a small agent registers, becomes routable by
    meaning first, and questions are answered; the big agent is routable by exact task meanwhile."""
    config = RouterConfig.from_mapping(
        {"health": {"enabled": False}, "routing": {"semantic_tasks": ["*"]}, "embedding": {"backend": "auto"}}
    )
    async with RouterServer(config) as router, httpx.AsyncClient(base_url=router.url, timeout=30) as http:
        big = await FakeAgent("big", tasks=("big_task_0",)).start()
        small = await FakeAgent(
            "weather",
            tasks=("get_weather_forecast",),
            descriptions={"get_weather_forecast": "查询城市未来几天的天气预报"},
            examples={"get_weather_forecast": ["明天北京会下雨吗", "what's the weather tomorrow in Paris"]},
        ).start()
        try:
            profile = big_profile("big", MAX_CAPABILITIES // 4, MAX_PROFILE_EXAMPLES, MAX_EXAMPLE_CHARS)
            profile["network"]["endpoint"] = big.endpoint
            started = time.perf_counter()
            assert (await http.post("/agents", json=profile)).status_code == 201
            big_took = time.perf_counter() - started
            started = time.perf_counter()
            await small.register(router.url, vectors=False)
            small_took = time.perf_counter() - started
            states = {r["id"]: r["vectors"] for r in (await http.get("/admin/agents")).json()}
            assert states["big"] == "pending"
            # Exact task names route at once, vectors or not.
            exact = (await http.post("/reach", json={"targetTask": "big_task_0"})).json()
            assert exact["status"] == "SUCCESS" and exact["handlerAgentId"] == "big"
            await wait_vectors(router.url, "weather")
            states = {r["id"]: r["vectors"] for r in (await http.get("/admin/agents")).json()}
            assert states["weather"] == "ready"
            assert states["big"] == "pending", "the small agent waited for the whole big profile"
            started = time.perf_counter()
            routed = (await http.post("/reach", json={"targetTask": "明天北京会不会下雨"})).json()
            query_took = time.perf_counter() - started
            assert routed["status"] == "SUCCESS", routed
            assert routed["handlerAgentId"] == "weather"
            print(
                f"\nregistration of the big profile {big_took * 1000:.0f} ms, of a small one "
                f"{small_took * 1000:.0f} ms; a question by meaning meanwhile {query_took * 1000:.0f} ms"
            )
            # Generous bounds: the figures themselves are printed above and measured in bench/.
            assert big_took < scaled(1.0) and small_took < scaled(1.0) and query_took < scaled(2.0)
        finally:
            await big.stop()
            await small.stop()
