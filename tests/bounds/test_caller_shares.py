"""What one caller fills in the Router's shared stores pushes out its own entries, not another's.

Found by an attacker's probe: the async result store and the conversation affinity table were
bounded only in all, oldest first, so one caller token flooding them evicted every other caller's
unfetched answers and conversation bindings. Real Router and agents on loopback, auth on.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import httpx

from reachmesh.config import RouterConfig
from reachmesh.testing import FakeAgent, RouterServer
from tests.helpers import scaled, until

HOG = "share-hog-token-0123456789"
FAIR = "share-fair-token-0123456789"
AGENT = "share-agent-token-0123456789"


def spec(token: str, role: str) -> dict[str, str]:
    return {"role": role, "sha256": hashlib.sha256(token.encode()).hexdigest()}


def policy(**sections: Any) -> RouterConfig:
    base: dict[str, Any] = {
        "auth": {"tokens": [spec(HOG, "caller"), spec(FAIR, "caller"), spec(AGENT, "agent")]},
        "embedding": {"backend": "none"},
        "health": {"enabled": False},
        "limits": {"loop_lag_ms": 10_000},
    }
    return RouterConfig.model_validate({**base, **sections})


async def register(router: RouterServer, *agents: FakeAgent) -> None:
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {AGENT}"}) as http:
        for agent in agents:
            await agent.start()
            assert (await http.post(f"{router.url}/agents", json=agent.profile())).status_code == 201


def caller(router: RouterServer, token: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=router.url, timeout=scaled(30), headers={"Authorization": f"Bearer {token}"}
    )


async def finished(http: httpx.AsyncClient, trace_id: str) -> bool:
    answer = await http.get(f"/reach/{trace_id}")
    return answer.status_code == 200 and answer.json().get("status") == "SUCCESS"


async def test_one_callers_async_flood_keeps_another_callers_result() -> None:
    """40 results in all, 10 a client: the fair caller's finished result is still fetched after
    the hog's 60 async requests have finished (before, the hog's pushed it out: 404), and of
    the hog's only 10 are held."""
    config = policy(async_mode={"max_results": 40, "max_results_per_client": 10})
    async with RouterServer(config) as router:
        agent = FakeAgent("share-echo", tasks=("echo",), result={"ok": True})
        await register(router, agent)
        fair, hog = caller(router, FAIR), caller(router, HOG)
        try:
            accepted = await fair.post(
                "/reach", json={"targetTask": "echo", "preferences": {"mode": "async"}}
            )
            assert accepted.status_code == 202, accepted.text
            mine = accepted.json()["traceId"]
            await until(lambda: finished(fair, mine), "the fair caller's async result")
            hog_ids: list[str] = []
            for _ in range(60):
                sent = await hog.post("/reach", json={"targetTask": "echo", "preferences": {"mode": "async"}})
                assert sent.status_code == 202, sent.text
                hog_ids.append(sent.json()["traceId"])
            results = router.app.parts.results
            await until(lambda: results.pending == 0, "every hog request finished")
            assert await finished(fair, mine), "the fair caller's answer was pushed out by the hog's"
            # Its requests finish in whatever order they ran: ten of them are held, whichever.
            kept = [trace_id for trace_id in hog_ids if await finished(hog, trace_id)]
            assert len(kept) == 10, len(kept)
            gone = await hog.get(f"/reach/{next(t for t in hog_ids if t not in kept)}")
            assert gone.status_code == 404, gone.text
        finally:
            await fair.aclose()
            await hog.aclose()
            await agent.stop()


async def test_async_result_bytes_are_shared_per_client() -> None:
    """16 KiB of results a client: the hog's answers of about 3 KiB each keep only its newest few,
    and the fair caller's result stays."""
    config = policy(async_mode={"max_result_bytes": 64 * 1024, "max_result_bytes_per_client": 16 * 1024})
    async with RouterServer(config) as router:
        agent = FakeAgent("share-big", tasks=("echo",), result={"blob": "x" * 3000})
        await register(router, agent)
        fair, hog = caller(router, FAIR), caller(router, HOG)
        try:
            accepted = await fair.post(
                "/reach", json={"targetTask": "echo", "preferences": {"mode": "async"}}
            )
            mine = accepted.json()["traceId"]
            await until(lambda: finished(fair, mine), "the fair caller's async result")
            hog_ids = []
            for _ in range(40):
                sent = await hog.post("/reach", json={"targetTask": "echo", "preferences": {"mode": "async"}})
                hog_ids.append(sent.json()["traceId"])
            results = router.app.parts.results
            await until(lambda: results.pending == 0, "every hog request finished")
            assert await finished(fair, mine), "the fair caller's answer was pushed out by the hog's"
            count, held = results.held_for(router.app.parts.results.owner(hog_ids[-1]) or "")
            assert 1 <= count <= 5 and held <= 16 * 1024, (count, held)
        finally:
            await fair.aclose()
            await hog.aclose()
            await agent.stop()


async def test_one_callers_conversation_flood_keeps_another_callers_binding() -> None:
    """20 bindings in all, 5 a caller: after the hog's 30 conversations the fair caller's turn
    still goes to the agent that holds its conversation (before, its binding was pushed out and
    the turn went to the agent ranked first)."""
    config = policy(affinity={"max_conversations": 20, "max_conversations_per_caller": 5})
    async with RouterServer(config) as router:
        # "heavy" outranks "light" by weight: an unbound turn goes to heavy.
        light = FakeAgent("share-light", tasks=("chat",), weight=1.0)
        heavy = FakeAgent("share-heavy", tasks=("chat",), weight=50.0)
        await register(router, light, heavy)
        fair, hog = caller(router, FAIR), caller(router, HOG)
        try:
            first = await fair.post(
                "/reach",
                json={"targetTask": "chat", "targetAgent": "share-light", "conversationId": "c-fair"},
            )
            assert first.json()["handlerAgentId"] == "share-light", first.text
            # Whether targetAgent binds is not the point: the turn below shows the binding.
            turn = await fair.post("/reach", json={"targetTask": "chat", "conversationId": "c-fair"})
            bound = turn.json()["handlerAgentId"]
            await asyncio.gather(
                *(
                    hog.post("/reach", json={"targetTask": "chat", "conversationId": f"c-hog-{n}"})
                    for n in range(30)
                )
            )
            after = await fair.post("/reach", json={"targetTask": "chat", "conversationId": "c-fair"})
            assert after.json()["handlerAgentId"] == bound
            assert bound == "share-light", "the binding was not made by the first turn"
            affinity = router.app.parts.affinity
            assert len(affinity) <= 20
        finally:
            await fair.aclose()
            await hog.aclose()
            for agent in (light, heavy):
                await agent.stop()
