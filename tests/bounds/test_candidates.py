"""Many candidates: answers and traces list 20 by name and count the rest; tasks hold a bounded crowd."""

from __future__ import annotations

import httpx

from reachmesh.config import RouterConfig
from reachmesh.testing import FakeAgent, RouterServer
from tests.bounds.quota import TOKEN_A, TOKEN_B, tokens


def body(agent_id: str, task: str = "crowded") -> dict[str, object]:
    return {
        "id": agent_id,
        "network": {"endpoint": "http://127.0.0.1:9/reach"},
        "capabilities": [{"task": task}],
    }


def config(**registry: int) -> RouterConfig:
    return RouterConfig.model_validate(
        {
            "embedding": {"backend": "none"},
            "health": {"enabled": False},
            "limits": {"loop_lag_ms": 10_000},
            "registry": registry,
        }
    )


async def test_a_failed_call_over_many_candidates_lists_twenty_and_counts_the_rest() -> None:
    """120 agents on a task, none allowed by the caller's filter: the answer lists 20 candidates
    and says 100 more, stays under 4 KB, the stored trace likewise, and a healthy task is served."""
    async with RouterServer(config()) as router, httpx.AsyncClient(base_url=router.url, timeout=15) as http:
        echo = await FakeAgent("echo-agent").start()
        try:
            await echo.register(router.url, vectors=False)
            for i in range(120):
                assert (await http.post("/agents", json=body(f"crowd-{i}"))).status_code == 201
            call = {
                "traceId": "crowd-call",
                "targetTask": "crowded",
                "preferences": {"filterAgentIds": ["x"]},
            }
            resp = await http.post("/reach", json=call)
            error = resp.json()["error"]
            assert resp.json()["status"] == "NO_AVAILABLE_HANDLER"
            assert len(error["candidates"]) == 20 and error["candidatesOmitted"] == 100
            assert len(resp.content) < 4096, len(resp.content)
            trace = await http.get("/admin/traces/crowd-call")
            decision = trace.json()["hops"][0]["decision"]
            assert len(decision["candidates"]) == 20 and decision["candidatesOmitted"] == 100
            assert len(decision["rejected"]) == 20 and decision["rejectedOmitted"] == 100
            assert len(trace.content) < 8192, len(trace.content)
            ok = await http.post("/reach", json={"targetTask": "echo"})
            assert ok.json()["status"] == "SUCCESS"
        finally:
            await echo.stop()


async def test_a_task_holds_at_most_max_agents_per_task() -> None:
    """registry.max_agents_per_task: the next live agent for that task is 503 REGISTRY_FULL naming
    the key; re-registering one already there and another task are fine."""
    async with (
        RouterServer(config(max_agents_per_task=5)) as router,
        httpx.AsyncClient(base_url=router.url) as http,
    ):
        for i in range(5):
            assert (await http.post("/agents", json=body(f"c-{i}"))).status_code == 201
        resp = await http.post("/agents", json=body("c-5"))
        assert (resp.status_code, resp.json()["error"]["code"]) == (503, "REGISTRY_FULL")
        assert "registry.max_agents_per_task" in resp.json()["error"]["message"]
        assert (await http.post("/agents", json=body("c-5", task="other"))).status_code == 201


async def test_one_token_holds_at_most_its_share_of_a_task() -> None:
    """registry.max_agents_per_task_per_token: token A's fourth agent on the task is refused,
    token B's first is taken."""
    policy = config(max_agents_per_task_per_token=3).model_dump()
    policy["auth"] = tokens()
    async with (
        RouterServer(RouterConfig.model_validate(policy)) as router,
        httpx.AsyncClient(base_url=router.url) as http,
    ):
        a = {"Authorization": f"Bearer {TOKEN_A}"}
        for i in range(3):
            assert (await http.post("/agents", json=body(f"a-{i}"), headers=a)).status_code == 201
        resp = await http.post("/agents", json=body("a-3"), headers=a)
        assert (resp.status_code, resp.json()["error"]["code"]) == (503, "REGISTRY_FULL")
        assert "max_agents_per_task_per_token" in resp.json()["error"]["message"]
        b = {"Authorization": f"Bearer {TOKEN_B}"}
        assert (await http.post("/agents", json=body("b-0"), headers=b)).status_code == 201
